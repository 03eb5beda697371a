"""The drops table against the network it describes (issue: "the drop table tells the truth"):
plain gradient descent on a two-layer student of a rank-3 teacher with vector outputs, written here
in numpy, on a one-layer CNN and on multi-head attention, written here in JAX, and its drops found
on its own loss curve the same way (`loss_drops`). Every real drop must have a row of
`lvflow predict` with levels within 10 % and a step within 5 % (linear students, where the NQF is
exact); for nonlinear ones, within the NQF curve's own measured error, reported."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lvflow

M, N_IN, WIDTH, N_OUT = 200, 20, 64, 8
SIGMA, LR = 1e-3, 0.01


def _teacher(seed=0):
    """Inputs `x ~ N(0, I)`, targets `y = x Θ*` with `Θ*` of rank 3 (singular values 3, 1.5, 0.75):
    three directions of the learned map, apart enough in strength to drop one after another."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(M, N_IN))
    U, _ = np.linalg.qr(rng.normal(size=(N_IN, 3)))
    V, _ = np.linalg.qr(rng.normal(size=(N_OUT, 3)))
    return X, X @ (U * np.array([3.0, 1.5, 0.75])) @ V.T


def _gd_losses(X, Y, phi, dphi, steps, seed):
    """Full-batch GD on `f(x) = Σ_i v_i φ(u_iᵀ x)`, loss `(1/m) Σ_μ |f − y|²` (Eq. 26)."""
    rng = np.random.default_rng(seed)
    U = SIGMA * rng.normal(size=(N_IN, WIDTH))
    V = SIGMA * rng.normal(size=(WIDTH, N_OUT))
    out = np.empty(steps + 1)
    for s in range(steps + 1):
        H = X @ U
        A = phi(H)
        R = A @ V - Y
        out[s] = np.sum(R**2) / M
        G = 2 / M * R
        gV = A.T @ G
        gU = X.T @ ((G @ V.T) * dphi(H))
        U -= LR * gU
        V -= LR * gV
    return out


def test_rows_are_a_linear_students_drops():
    """Linear student: every real drop has its row, step within 5 % and levels within 10 %, and no
    row is a drop the network does not make (measured: 87.1/148.5/304 against 84.0/145.6/303.2)."""
    X, Y = _teacher()
    pred = lvflow.predict(lvflow.nqf_from_data("mlp", {"x": X, "y": Y}), init_std=SIGMA, width=WIDTH, learning_rate=LR)
    rows = pred.drop_rows()
    steps = int(np.ceil(pred.t1 / LR))
    L = _gd_losses(X, Y, lambda h: h, np.ones_like, steps, seed=1)
    real = lvflow.loss_drops(np.arange(steps + 1.0), L)
    assert len(real) == len(rows) == 3  # the teacher's three directions, one drop each
    for i, row in enumerate(rows):
        assert row["steps"] == pytest.approx(real.t_mid[i], rel=0.05), (i, row, real.t_mid[i])
        assert row["loss_before"] == pytest.approx(real.loss_before[i], rel=0.10)
        assert row["loss_after"] == pytest.approx(real.loss_after[i], rel=0.10, abs=0.01 * real.loss_before[0])
        assert row["directions"] == [i + 1]


def test_a_tanh_students_drops_are_at_rows():
    """tanh student: its NQF is the linear model above, and the network departs from it where the
    weights grow. Measured: the network merges the teacher's first two directions into one drop
    (11.96 → 0.559 at step 89.4) where the NQF has two (87.1 and 148.5), and its second drop (317)
    comes 4 % after the NQF's third (304); it ends at 0.052 against the NQF's 0.012. What holds,
    and is asserted: each real drop's midpoint is within 5 % of a row's step."""
    X, Y = _teacher()
    pred = lvflow.predict(lvflow.nqf_from_data("mlp", {"x": X, "y": Y}), init_std=SIGMA, width=WIDTH, learning_rate=LR)
    steps = int(np.ceil(pred.t1 / LR))
    L = _gd_losses(X, Y, np.tanh, lambda h: 1 - np.tanh(h) ** 2, steps, seed=1)
    real = lvflow.loss_drops(np.arange(steps + 1.0), L)
    at = np.array([r["steps"] for r in pred.drop_rows()])
    assert len(real) >= 1
    for t in real.t_mid:
        assert np.min(np.abs(at / t - 1)) <= 0.05, (t, at)


def _rank3(rng, n_in, n_out):
    """A rank-3 map `n_in → n_out` with singular values 3, 1.5, 0.75."""
    U, _ = np.linalg.qr(rng.normal(size=(n_in, 3)))
    V, _ = np.linalg.qr(rng.normal(size=(n_out, 3)))
    return (U * np.array([3.0, 1.5, 0.75])) @ V.T


def _gd_jax(loss, params, steps):
    """Full-batch GD `w ← w − η ∇L(w)` from `params`; the loss before each step and after the last."""
    grad = jax.value_and_grad(loss)

    def step(p, _):
        value, g = grad(p)
        return jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g), value

    _, out = jax.lax.scan(step, params, None, length=steps + 1)
    return np.asarray(out)


def _assert_rows_are_drops(rows, real):
    """One row per real drop: step within 5 %, levels within 10 % (the level after a last drop
    also within 1 % of the initial loss: the floor), and no row the network does not make."""
    assert len(rows) == len(real) >= 2, ([r["steps"] for r in rows], real.t_mid)
    for i, row in enumerate(rows):
        assert row["steps"] == pytest.approx(real.t_mid[i], rel=0.05), (i, row, real.t_mid[i])
        assert row["loss_before"] == pytest.approx(real.loss_before[i], rel=0.10)
        assert row["loss_after"] == pytest.approx(real.loss_after[i], rel=0.10, abs=0.01 * real.loss_before[0])


IMG, KER, CHANNELS, K_CNN = (6, 6), (3, 3), 32, 4


@pytest.fixture(scope="module")
def cnn_problem():
    """Single-channel 6×6 images `x ~ N(0, 1/16)`, targets a rank-3 map of the pooled patches
    `Σ_p x_p` (the CNN's learned map reads them, Prop 6), and `predict`'s table for 32 channels."""
    rng = np.random.default_rng(0)
    X = 0.25 * rng.normal(size=(M, *IMG))
    (h, w), (kh, kw) = IMG, KER
    patches = np.stack(
        [X[:, i : i + kh, j : j + kw].reshape(M, -1) for i in range(h - kh + 1) for j in range(w - kw + 1)], axis=1
    )
    Y = patches.sum(axis=1) @ _rank3(rng, kh * kw, K_CNN)
    nqf = lvflow.nqf_from_data("cnn", {"x": X, "y": Y}, kernel=KER)
    pred = lvflow.predict(nqf, init_std=SIGMA, width=CHANNELS, learning_rate=LR)
    return patches, Y, pred


def _cnn_losses(patches, Y, phi, steps, seed=1):
    """GD on `f(X) = Σ_i v_i Σ_p φ(k_iᵀ x_p)` (stride 1, no padding, global sum pooling), loss
    `(1/m) Σ_μ |f − y|²`, from `k, v ~ N(0, σ²)`."""
    rng = np.random.default_rng(seed)
    k = jnp.asarray(SIGMA * rng.normal(size=(patches.shape[2], CHANNELS)))
    v = jnp.asarray(SIGMA * rng.normal(size=(CHANNELS, K_CNN)))
    P, Yj = jnp.asarray(patches), jnp.asarray(Y)

    def loss(params):
        k, v = params
        f = jnp.einsum("mpc,cj->mj", phi(P @ k), v)
        return jnp.sum((f - Yj) ** 2) / M

    return _gd_jax(loss, (k, v), steps)


@pytest.mark.parametrize("name", ["linear", "tanh"])
def test_rows_are_a_cnns_drops(cnn_problem, name):
    """CNN: the NQF (a linear model of the pooled patches) is exact for a linear activation and
    holds to fourth order for tanh. Measured (steps; levels): the table 43.3, 199.9 (9.421 → 3.024
    → 0.0094; the teacher's first two directions make one drop); linear CNN 43.9, 205.3 (9.421 →
    3.023 → 0.0095); tanh CNN 43.9, 205.6 (9.421 → 3.023 → 0.0110): steps 1.3 % and 2.6–2.8 % early."""
    patches, Y, pred = cnn_problem
    phi = (lambda h: h) if name == "linear" else jnp.tanh
    steps = int(np.ceil(pred.t1 / LR))
    L = _cnn_losses(patches, Y, phi, steps)
    _assert_rows_are_drops(pred.drop_rows(), lvflow.loss_drops(np.arange(steps + 1.0), L))


D_ATT, TOKENS, HEADS, KEY, K_ATT = 8, 6, 16, 4, 4


def test_rows_are_attentions_drops():
    """Multi-head attention read out at the last token, `f(X) = Σ_i v_i W_iᴠ X softmax(s_i)`
    (`d_v = 1`, 16 heads, `d_k = 4`), on sequences of 6 tokens `~ N(0, I)`, targets a rank-3 map
    of the mean token (×2). The NQF is the uniform-softmax linear model (Prop 2), exact to fourth
    order. Measured (steps; levels): the table 316.8, 582.4, 1235.8 (7.805 → 1.832 → 0.336 →
    0.0077); the network 308.9, 592.9, 1260.3 (7.805 → 1.844 → 0.337 → 0.0112): steps +2.6 %,
    −1.8 %, −1.9 %; the network ends at 1.5× the NQF's floor (0.05 % of the initial loss)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(M, D_ATT, TOKENS))
    Y = 2.0 * X.mean(axis=2) @ _rank3(rng, D_ATT, K_ATT)
    pred = lvflow.predict(
        lvflow.nqf_from_data("attention", {"x": X, "y": Y}), init_std=SIGMA, width=HEADS, learning_rate=LR
    )
    steps = int(np.ceil(pred.t1 / LR))
    r = np.random.default_rng(1)
    shapes = [(HEADS, KEY, D_ATT), (HEADS, KEY, D_ATT), (HEADS, 1, D_ATT), (HEADS, 1, K_ATT)]
    params = tuple(jnp.asarray(SIGMA * r.normal(size=s)) for s in shapes)
    Xj, Yj = jnp.asarray(X), jnp.asarray(Y)

    def f(params, x):
        Wq, Wk, Wv, v = params
        q = jnp.einsum("hkd,d->hk", Wq, x[:, -1])
        a = jax.nn.softmax(jnp.einsum("hk,hkd,dn->hn", q, Wk, x) / np.sqrt(KEY), axis=1)
        return jnp.einsum("hed,dn,hn,hej->j", Wv, x, a, v)

    L = _gd_jax(lambda p: jnp.sum((jax.vmap(lambda x: f(p, x))(Xj) - Yj) ** 2) / M, params, steps)
    _assert_rows_are_drops(pred.drop_rows(), lvflow.loss_drops(np.arange(steps + 1.0), L))
