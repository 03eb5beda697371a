"""The factored NQF (Eq. 17), the M-flow run to convergence and its drop table (`matrix_drops`),
and `predict` on data whose structure matrices do not commute."""

import json
import math
import subprocess
import sys

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
import scipy.integrate
from hypothesis import given, settings

import lvflow
from lvflow import architectures as arch


def _sym(a):
    return a + np.swapaxes(a, -1, -2)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 6),
    k=st.sampled_from([None, 1, 3]),
    D=st.integers(1, 4),
    p=st.integers(1, 5),
    shared=st.booleans(),
    sparse=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_factored_nqf_equals_its_dense_form(m, k, D, p, shared, sparse, seed):
    """Every operator of `NQF(features=Φ, basis=E)` equals that of `NQF(A)` with `A_μ = Σ_d Φ_μd E_d`
    formed by numpy, for per-output features or a per-output basis, dense or sparse `E`."""
    rng = np.random.default_rng(seed)
    if k is None:
        F, E = rng.normal(size=(m, D)), _sym(rng.normal(size=(D, p, p)))
        A = np.einsum("md,dij->mij", F, E)
    elif shared:
        F, E = rng.normal(size=(m, D)), _sym(rng.normal(size=(k, D, p, p)))
        A = np.einsum("md,cdij->mcij", F, E)
    else:
        F, E = rng.normal(size=(m, k, D)), _sym(rng.normal(size=(D, p, p)))
        A = np.einsum("mcd,dij->mcij", F, E)
    if sparse:  # one entry pair per basis matrix: the sparse (gather/scatter) path
        mask = np.zeros(E.shape[-2:])
        mask[0, -1] = mask[-1, 0] = 1.0
        E = E * mask
        A = A * mask
    y = rng.normal(size=A.shape[:-2])
    fac, dense = lvflow.NQF(features=F, basis=E, y=y), lvflow.NQF(A, y)
    assert fac.is_factored and not dense.is_factored
    M = rng.normal(size=(p, p))
    M = M @ M.T
    np.testing.assert_allclose(fac.A, A, atol=1e-12)
    for f in ("predict", "H", "K", "loss"):
        np.testing.assert_allclose(getattr(fac, f)(M), getattr(dense, f)(M), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(fac.Y, dense.Y, rtol=1e-10, atol=1e-12)
    w = rng.normal(size=y.shape)
    expected = np.einsum("n,nij->ij", w.reshape(-1), A.reshape(-1, p, p))
    np.testing.assert_allclose(fac.weighted_sum(w), expected, rtol=1e-10, atol=1e-12)
    idx = np.arange(m)[::2]
    np.testing.assert_allclose(fac.subset(idx).A, A[idx], atol=1e-12)


@pytest.mark.parametrize(
    "model",
    [
        arch.MLP(5, 3, key=jax.random.PRNGKey(0)),
        arch.MLP(5, 3, 4, key=jax.random.PRNGKey(0)),
        arch.CNN((6, 6), (3, 3), 2, 3, key=jax.random.PRNGKey(0)),
        arch.MultiHeadAttention(4, 3, 2, 2, 3, key=jax.random.PRNGKey(0)),
        arch.QKAttention(4, 3, 2, 3, key=jax.random.PRNGKey(0)),
        arch.MixtureOfExperts(4, 3, 2, key=jax.random.PRNGKey(0)),
    ],
    ids=lambda m: type(m).__name__,
)
def test_map_basis_rebuilds_the_closed_form_structure(model):
    """`A_c(x) = Σ_ab Φ_c(x)_ab E_ab` (Eq. 17) with `E = map_basis()` equals the closed-form
    structure matrix of Table 3 (`model.structure`) on random inputs."""
    E = np.asarray(model.map_basis())
    for s in range(3):
        x = jax.random.normal(jax.random.PRNGKey(s + 1), model.sample_shape(seq_len=5))
        A = np.einsum("cab,abij->cij", np.asarray(model.map_features(x)), E)
        S = np.asarray(model.structure(x))
        np.testing.assert_allclose(A.reshape(S.shape), S, atol=1e-12)


@pytest.mark.parametrize("k", [None, 3])
def test_nqf_from_data_is_factored_and_matches_the_architecture(k):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 6))
    y = rng.normal(size=(20,) if k is None else (20, k))
    nqf = lvflow.nqf_from_data("mlp", {"x": x, "y": y})
    assert nqf.is_factored
    model = arch.MLP(6, 1, k, key=jax.random.PRNGKey(0))
    np.testing.assert_allclose(nqf.A, jax.vmap(model.structure)(x), atol=1e-12)


def test_random_commutator_check_refuses_non_commuting_data_fast():
    """Two random combinations decide commutation: a 2000-sample non-commuting NQF is refused
    (one line, the relative commutator), a commuting one with the same shapes is reduced."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 8))
    nqf = lvflow.nqf_from_data("mlp", {"x": x, "y": rng.normal(size=2000)})
    with pytest.raises(lvflow.NotCommutingError, match="random combinations") as info:
        lvflow.reduce_to_lv(nqf)
    assert info.value.commutator_norm > 0.01
    lam = rng.normal(size=(2000, 5))
    commuting = lvflow.NQF(np.einsum("mk,kl->mkl", lam, np.eye(5)), rng.normal(size=2000))
    assert lvflow.reduce_to_lv(commuting).K == 5


def _diagonal_problem():
    """A commuting NQF with diagonal `C` (orthogonal columns of `λ`): `A_μ = diag(λ_μ)`."""
    rng = np.random.default_rng(2)
    Q, _ = np.linalg.qr(rng.normal(size=(12, 3)))
    lam = Q * np.sqrt(12) * np.array([1.0, 0.8, 0.6])
    beta = np.array([1.5, 1.0, 0.5])
    y = lam @ beta
    return lvflow.NQF(np.einsum("mk,kl->mkl", lam, np.eye(3)), y), lam, y


def test_drops_on_commuting_data_match_the_logistic_closed_form():
    """Diagonal `C` (Thm 6): `z_k(t) = z_k∞ / (1 + (z_k∞/ε − 1) e^{−r_k t})`, so `t*_k =
    ln((z_k∞/ε − 1) ρ/(1 − ρ)) / r_k`; the directions are the coordinate axes."""
    nqf, lam, y = _diagonal_problem()
    m, eps, rho = lam.shape[0], 1e-4, 0.5
    r = 8 / m * y @ lam
    Ckk = 8 / m * np.sum(lam**2, axis=0)
    z_inf = r / Ckk
    d = lvflow.matrix_drops(nqf, eps * np.eye(3), rho=rho, rtol=1e-9, tol=1e-6)
    # the flow stops within tol of convergence, so the slowest mode's final strength is a little short
    # of z_k∞; t* is where z_k = ρ × its final strength λ_k
    lam_end = np.asarray(d.strength)[np.argsort(np.argmax(np.abs(d.directions), axis=1))]
    np.testing.assert_allclose(lam_end, z_inf, rtol=5e-3)
    q = rho * lam_end / z_inf
    exact = np.sort(np.log((z_inf / eps - 1) * q / (1 - q)) / r)
    np.testing.assert_allclose(d.t_star, exact, rtol=1e-5)
    # the directions are the coordinate axes, the fastest mode's first
    np.testing.assert_allclose(np.max(np.abs(d.directions), axis=1), 1.0, atol=1e-6)
    assert int(np.argmax(np.abs(d.directions[0]))) == int(np.argmax(r / np.log(z_inf / eps)))
    assert d.converged
    # the loss is non-increasing, drops in order, and ends within tol of the least-squares floor
    L = np.asarray(d.loss)
    assert np.all(np.diff(L) <= 1e-12)
    floor = np.sum((y - lam @ np.linalg.lstsq(lam, y, rcond=None)[0]) ** 2) / m
    assert L[-1] - floor <= 1e-6 * (L[0] - floor) * 1.01


def _quadratic_net(seed=3):
    """A non-commuting NQF: `A(x) = x xᵀ` (QuadraticNet) on correlated Gaussian inputs."""
    rng = np.random.default_rng(seed)
    L = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.3, -0.2, 0.9]])
    x = rng.normal(size=(40, 3)) @ L.T
    y = (x @ np.array([1.0, -0.5, 0.3])) ** 2
    return lvflow.nqf_from_data("quadratic", {"x": x, "y": y}), x, y


def test_matrix_drops_curve_matches_scipy_on_non_commuting_data():
    """The loss curve equals an independent integration of `Ẇ = −H W` (`W W ᵀ = M`, Eq. 27) by
    scipy's Radau, on a quadratic network with correlated inputs."""
    nqf, x, y = _quadratic_net()
    eps, m = 1e-3, x.shape[0]
    d = lvflow.matrix_drops(nqf, eps * np.eye(3), rtol=1e-9)
    assert d.converged and d.t_star.shape[0] >= 1

    def f(t, w):
        W = w.reshape(3, 3)
        res = np.einsum("mi,ij,mj->m", x, W @ W.T, x) - y
        H = 4 / m * np.einsum("m,mi,mj->ij", res, x, x)
        return (-H @ W).ravel()

    ts = np.asarray(d.ts)
    W0 = math.sqrt(eps) * np.eye(3).ravel()
    sol = scipy.integrate.solve_ivp(f, (0, ts[-1]), W0, "Radau", t_eval=ts, rtol=1e-10, atol=1e-14)
    Ws = sol.y.T.reshape(-1, 3, 3)
    loss = np.mean((np.einsum("mi,tij,mj->tm", x, Ws @ np.swapaxes(Ws, 1, 2), x) - y) ** 2, axis=1)
    np.testing.assert_allclose(d.loss, loss, rtol=1e-5, atol=1e-8 * loss[0])


def _gd_on_W(x, y, W, lr, steps):
    """Plain numpy GD on `W` of the quadratic net `f(x) = |Wᵀx|²`, loss `(1/m) Σ (f − y)²`:
    the `W` at steps 0..steps."""
    m, Ws = x.shape[0], [W]
    for _ in range(steps):
        res = np.einsum("mi,ij,mj->m", x, W @ W.T, x) - y
        W = W - lr * 4 / m * np.einsum("m,mi,mj->ij", res, x, x) @ W
        Ws.append(W)
    return np.asarray(Ws)


def test_gd_map_is_gradient_descent_on_W():
    """With a learning rate, `matrix_drops` iterates `M' = (I − ηH) M (I − ηH)` (Thm 2): the loss
    at every recorded step equals plain GD on `W` (`W₀ = √ε I`, so `W₀W₀ᵀ = M0`), and each
    direction's switch-on step is where GD's `u_iᵀ W Wᵀ u_i` first reaches `ρ λ_i`."""
    nqf, x, y = _quadratic_net()
    eps, lr, rho = 1e-3, 0.01, 0.5
    d = lvflow.matrix_drops(nqf, eps * np.eye(3), learning_rate=lr, rho=rho)
    assert d.converged and d.learning_rate == lr and d.t_star.shape[0] >= 1
    steps = np.rint(np.asarray(d.ts) / lr).astype(int)
    np.testing.assert_allclose(np.asarray(d.ts) / lr, steps, atol=1e-9)  # records at whole steps
    Ws = _gd_on_W(x, y, math.sqrt(eps) * np.eye(3), lr, int(steps[-1]))
    Ms = Ws @ np.swapaxes(Ws, 1, 2)
    loss = np.mean((np.einsum("mi,tij,mj->tm", x, Ms, x) - y) ** 2, axis=1)
    np.testing.assert_allclose(d.loss, loss[steps], rtol=1e-10)
    for u, lam, t in zip(np.asarray(d.directions), np.asarray(d.strength), np.asarray(d.t_star)):
        s = np.einsum("i,tij,j->t", u, Ms, u)
        n = int(np.argmax(s >= rho * lam))
        assert n - 1 <= t / lr <= n


def test_mlp_nqf_and_its_gd_map_compile_a_few_programs():
    """`nqf_from_data` and `matrix_drops` with a learning rate lower at most 4 programs (φ's Taylor
    coefficients, the features, `Y` with `L(M0)`, GD's chunk), however many chunks GD runs: no small
    program per array conversion or eager operation (`lvflow predict` pays each one's tracing and
    lowering in every process, the persistent cache notwithstanding)."""
    lowered = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered.append(duration)

    rng = np.random.default_rng(3)
    x = rng.normal(size=(23, 4))  # shapes no other test uses
    y = np.tanh(x @ rng.normal(size=4))
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        nqf = lvflow.nqf_from_data("mlp", {"x": x, "y": y})
        d = lvflow.matrix_drops(nqf, 1e-4 * np.eye(nqf.p), learning_rate=0.05)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert d.converged and d.t_star.shape[0] >= 1
    assert len(lowered) <= 4, len(lowered)


def test_gd_map_tends_to_the_flow_as_the_learning_rate_shrinks():
    """GD is the flow's Euler discretisation: its switch-on times differ from the flow's by
    `O(η)`, so halving `η` halves the difference."""
    nqf, _, _ = _quadratic_net()
    M0 = 1e-3 * np.eye(3)
    flow = np.asarray(lvflow.matrix_drops(nqf, M0, rtol=1e-10).t_star)
    gd = [np.asarray(lvflow.matrix_drops(nqf, M0, learning_rate=lr).t_star) for lr in (4e-3, 2e-3)]
    gap = [np.max(np.abs(t - flow)) for t in gd]
    assert 1.6 <= gap[0] / gap[1] <= 2.4, gap


def test_gd_map_fixed_horizon_and_divergence():
    nqf, _, _ = _quadratic_net()
    d = lvflow.matrix_drops(nqf, 1e-3 * np.eye(3), learning_rate=0.01, t1=0.5)
    assert float(d.ts[-1]) == pytest.approx(0.5) and not d.converged
    lam = np.max(np.linalg.eigvalsh(np.asarray(nqf.Y)))
    with pytest.raises(lvflow.DivergenceError, match="diverged.*learning_rate=.* is too large") as err:
        lvflow.matrix_drops(nqf, 1e-3 * np.eye(3), learning_rate=50.0 / lam)
    assert err.value.step > 0
    # predict says so and falls back to the flow (GD's η → 0 limit), in steps t/η
    pred = lvflow.predict(nqf, eps=1e-3, learning_rate=50.0 / lam)
    flow = lvflow.matrix_drops(nqf, 1e-3 * np.eye(3))
    assert pred.method == "matrix_flow" and any(f"by step {err.value.step})" in n for n in pred.notes)
    np.testing.assert_allclose(pred.matrix.t_star, flow.t_star, rtol=1e-12)
    assert "gradient descent's exact map" in lvflow.predict(nqf, eps=1e-3, learning_rate=0.01).notes[0]
    with pytest.raises(lvflow.LvflowError, match="learning_rate"):
        lvflow.matrix_drops(nqf, 1e-3 * np.eye(3), learning_rate=-1.0)


def test_fixed_horizon_and_bad_input():
    nqf, _, _ = _diagonal_problem()
    d = lvflow.matrix_drops(nqf, 1e-4 * np.eye(3), t1=1.0)
    assert float(d.ts[-1]) == pytest.approx(1.0) and not d.converged
    with pytest.raises(lvflow.LvflowError, match="M0: must be positive definite"):
        lvflow.matrix_drops(nqf, np.diag([1e-4, 1e-4, 0.0]))
    with pytest.raises(lvflow.LvflowError, match="rho"):
        lvflow.matrix_drops(nqf, 1e-4 * np.eye(3), rho=1.5)
    with pytest.raises(lvflow.LvflowError, match="not both"):
        lvflow.NQF(np.asarray(nqf.A), nqf.y, features=np.ones((12, 1)), basis=np.ones((1, 3, 3)))


def _digits(m, classes=False):
    from sklearn.datasets import load_digits

    d = load_digits()
    X = d.data.astype(float)
    X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    y = np.eye(10)[d.target] if classes else np.where(d.target % 2 == 1, 1.0, -1.0)
    return X[:m].reshape(-1, 8, 8), y[:m]


def test_predict_on_digits_matches_gradient_descent_and_prints_a_drop_table(tmp_path):
    """`lvflow predict --architecture mlp --lr` on odd/even digits: a drop table, and a half-drop
    step that plain gradient descent on the NQF `(1/m) Σ (xᵀ U v − y)²` (Prop 1) reproduces to one
    step (the prediction is GD's exact map of M), started at `W₀ = √ε I` so that `W₀W₀ᵀ = ε I =
    d σ² I` exactly (d = p = 65)."""
    X, y = _digits(300)
    path = tmp_path / "digits.npz"
    np.savez(path, x=X, y=y)
    cmd = [sys.executable, "-m", "lvflow", "predict", "--architecture", "mlp", "--data", str(path)]
    cmd += ["--init-std", "1e-3", "--width", "65", "--lr", "0.01", "--quiet", "--save", str(tmp_path / "res.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "drops of the predicted loss" in out.stdout and "directions of M" in out.stdout
    assert "loss at the end" in out.stdout
    # a tanh MLP is its NQF only to second order (Thm 13: next term of order 4): the validity horizon. At width 65
    # the next term stays below 10 % of the NQF's output to the end (its ratio peaks near 3 %), and the line says so
    res = json.loads((tmp_path / "res.json").read_text())
    h = res["horizon"]
    assert h["order"] == 4 and h["fraction"] == 0.1 and "Thm 13's next term, of order 4" in out.stdout
    assert (h["step"] is None) == (max(h["ratio"]) < 0.1)
    assert ("no validity horizon within the prediction" in out.stdout) == (h["step"] is None)
    assert res["method"] == "matrix_gd" and len(res["drops"]) >= 1 and len(res["directions"]) >= 1
    first = res["drops"][0]
    assert first["directions"] == [1]
    direction = res["directions"][0]
    assert np.shape(direction["input_direction"]) == (8, 8) and len(direction["output_direction"]) == 1
    # independent: GD on the NQF of the linearised network, lr 0.01
    Xf = X.reshape(len(X), -1)
    W = math.sqrt(65 * 1e-6) * np.eye(65)
    steps, losses = int(first["steps"] * 2), []
    for _ in range(steps):
        U, v = W[:64], W[64]
        res_ = Xf @ U @ v - y
        losses.append(np.mean(res_**2))
        gU = 2 / len(y) * np.outer(Xf.T @ res_, v)
        gv = 2 / len(y) * (Xf @ U).T @ res_
        W = W - 0.01 * np.vstack([gU, gv[None]])
    losses = np.asarray(losses)
    level = (first["loss_before"] + first["loss_after"]) / 2
    gd_half = int(np.argmax(losses <= level))
    assert gd_half - 1 <= first["steps"] <= gd_half


def test_attention_value_copies_are_one_drop(tmp_path):
    """The `d_v` value units of a head start equal (`M0 = ε I`) and feel the same `H`, so their
    directions form one eigenspace: one drop of multiplicity `d_v`, not `d_v` drops at one time."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(60, 4, 5))
    y = x[:, :, -1] @ np.array([1.0, -0.5, 0.2, 0.0]) + 0.1 * rng.normal(size=60)
    nqf = lvflow.nqf_from_data("attention", {"x": x, "y": y}, value_size=3)
    pred = lvflow.predict(nqf, eps=1e-4, learning_rate=0.01)
    assert pred.method == "matrix_gd"
    assert np.asarray(pred.matrix.multiplicity).tolist() == [3]
    assert "dim" in pred.direction_table()
    assert pred.drop_members() == [[1]]  # one drop, of that one three-dimensional direction
    # two neurons cannot hold three directions: said in a note
    narrow = lvflow.predict(nqf, init_std=1e-2, width=2, learning_rate=0.01)
    assert any("rank ≤ 2" in n for n in narrow.notes)
    png = tmp_path / "p.png"
    pred.plot(png)
    assert png.stat().st_size > 0
