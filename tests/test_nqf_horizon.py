"""Thm 13's next term beyond the NQF (`lvflow.next_order`) against the network's own Taylor series,
and the validity horizon (`lvflow.nqf_horizon`) against the measured departure of a trained network
from its NQF twin. Every reference is computed here: nested `jax.jvp` of the network's forward pass
along `W`, and gradient descent written in the test."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lvflow
from lvflow.architectures import CNN, MLP, AttentionLogits, MultiHeadAttention, QKAttention, QuadraticNet

KEY = jax.random.PRNGKey(0)
STEPS_DIGITS = 3200


def shifted_softplus(z):
    return jax.nn.softplus(z) - jnp.log(2.0)


def network_taylor(net, x, k):
    """`(1/k!) dᵏ/dsᵏ net_{sW}(x)` at `s = 0`: nested forward-mode derivatives of the whole forward pass."""
    W = net.W
    f = lambda s: eqx.tree_at(lambda m: m.W, net, s * W)(x)
    for _ in range(k):
        f = (lambda g: lambda s: jax.jvp(g, (s,), (jnp.ones_like(s),))[1])(f)
    return f(jnp.zeros((), dtype=W.dtype)) / math.factorial(k)


def cases():
    # (name, network at O(1) weights, batch of inputs, expected order, order of the first term after it;
    # silu and the shifted softplus have a zero third derivative at 0, so order 5 follows their order 3)
    X_vec = jax.random.normal(jax.random.PRNGKey(1), (4, 5))
    return [
        ("mlp-tanh", MLP(5, 7, key=KEY, init_scale=0.5), X_vec, 4, 6),
        ("mlp-silu", MLP(5, 7, 2, activation=jax.nn.silu, key=KEY, init_scale=0.5), X_vec, 3, 5),
        ("mlp-softplus", MLP(5, 6, activation=shifted_softplus, key=KEY, init_scale=0.5), X_vec, 3, 5),
        ("cnn-tanh", CNN((6, 6), (3, 3), 4, key=KEY, init_scale=0.3), jax.random.normal(KEY, (3, 6, 6)), 4, 6),
        (
            "attention",
            MultiHeadAttention(4, 3, 3, 3, 2, key=KEY, init_scale=0.5),
            jax.random.normal(KEY, (3, 4, 5)),
            4,
            6,
        ),
        ("qk-attention", QKAttention(4, 2, 3, key=KEY, init_scale=0.5), jax.random.normal(KEY, (3, 4, 5)), 4, 6),
    ]


CASES = cases()


@pytest.mark.parametrize("name,net,X,order,after", CASES, ids=[c[0] for c in CASES])
def test_next_order_is_the_networks_taylor_coefficient(name, net, X, order, after):
    got = lvflow.next_order(net, X)
    assert got.order == order
    for j in range(3, order):  # every order between the NQF and the next term vanishes for the network
        low = jnp.stack([network_taylor(net, x, j) for x in X])
        assert float(jnp.max(jnp.abs(low))) < 1e-12
    ref = jnp.stack([network_taylor(net, x, order) for x in X])
    ref2 = jnp.stack([network_taylor(net, x, 2) for x in X])
    assert float(jnp.max(jnp.abs(ref))) > 1e-3  # not a vacuous comparison
    np.testing.assert_allclose(got.term, ref, rtol=1e-10, atol=1e-12 * float(jnp.max(jnp.abs(ref))))
    np.testing.assert_allclose(got.nqf, ref2, rtol=1e-10, atol=1e-12 * float(jnp.max(jnp.abs(ref2))))


@pytest.mark.parametrize("name,net,X,order,after", CASES, ids=[c[0] for c in CASES])
def test_residual_after_the_next_term_is_higher_order(name, net, X, order, after):
    # f(sW) − f(0) − NQF(sW) − next(sW) = O(s^{after}); without the next term it is O(s^{order}).
    got = lvflow.next_order(net, X)
    W = net.W
    s = np.logspace(-2.0, -1.0, 7)
    f0 = jnp.stack([eqx.tree_at(lambda m: m.W, net, 0 * W)(x) for x in X])
    with_next, without = [], []
    for si in s:
        f = jnp.stack([eqx.tree_at(lambda m: m.W, net, si * W)(x) for x in X])
        r2 = f - f0 - si**2 * got.nqf
        without.append(float(jnp.sqrt(jnp.mean(r2**2))))
        with_next.append(float(jnp.sqrt(jnp.mean((r2 - si**order * got.term) ** 2))))
    slope = lambda r: np.polyfit(np.log(s), np.log(r), 1)[0]
    assert abs(slope(without) - order) < 0.1, (name, slope(without))
    assert abs(slope(with_next) - after) < 0.3, (name, slope(with_next))


def test_exactly_quadratic_modules_have_no_next_term_and_no_horizon():
    X = jax.random.normal(KEY, (3, 4))
    net = QuadraticNet(4, 3, key=KEY, init_scale=0.5)
    got = lvflow.next_order(net, X)
    assert got.order is None and float(jnp.max(jnp.abs(got.term))) == 0.0
    Ms = np.stack([np.eye(4) * e for e in (1e-3, 1.0, 10.0)])
    h = lvflow.nqf_horizon(net, X, M=Ms)
    assert h.order is None and h.time == math.inf and h.index is None and np.all(h.ratio == 0)
    h = lvflow.nqf_horizon(net, X, jnp.ones(3), M=Ms)
    assert h.departure == math.inf and np.all(h.loss_gap == 0)
    logits = AttentionLogits(3, 2, 4, key=KEY, init_scale=0.5)
    assert lvflow.next_order(logits, jax.random.normal(KEY, (2, 3, 4))).order is None


def test_generic_sum_form_is_probed():
    # A sum form without closed forms: the default `next_order`/`expansion_term` differentiate `unit`.
    class Cubic(lvflow.architectures.AbstractSumForm):
        W: jax.Array

        def unit(self, w, x):
            return (w[0] * (w[1:] @ x)) + jnp.sin(w[1:] @ x) ** 3 - (w[1:] @ x) ** 3

        def __call__(self, x):
            return jnp.sum(jax.vmap(lambda w: self.unit(w, x))(self.W.T))

    net = Cubic(W=0.5 * jax.random.normal(KEY, (4, 5)))
    X = jax.random.normal(jax.random.PRNGKey(2), (3, 3))
    got = lvflow.next_order(net, X)
    assert got.order == 5  # sin(a)³ − a³ = −a⁵/2 + O(a⁷)
    ref = jnp.stack([network_taylor(net, x, 5) for x in X])
    np.testing.assert_allclose(got.term, ref, rtol=1e-9)


def test_representative_neurons_realise_M():
    rng = np.random.default_rng(0)
    G = rng.standard_normal((5, 3))
    M = G @ G.T
    W = np.asarray(lvflow.representative_neurons(M, 8, seed=1))
    np.testing.assert_allclose(W @ W.T, M, atol=1e-10)
    W_small = np.asarray(lvflow.representative_neurons(M, 2, seed=1))
    assert W_small.shape == (5, 2)


def test_horizon_bad_input():
    net = MLP(3, 4, key=KEY)
    X = jnp.ones((2, 3))
    Ms = np.stack([np.eye(4)] * 2)
    with pytest.raises(lvflow.LvflowError, match="M, W"):
        lvflow.nqf_horizon(net, X)
    with pytest.raises(lvflow.LvflowError, match="M:"):
        lvflow.nqf_horizon(net, X, M=np.stack([np.eye(3)] * 2))
    with pytest.raises(lvflow.LvflowError, match="W:"):
        lvflow.nqf_horizon(net, X, W=np.ones((2, 5, 4)))
    with pytest.raises(lvflow.LvflowError, match="fraction"):
        lvflow.nqf_horizon(net, X, M=Ms, fraction=0.0)
    with pytest.raises(lvflow.LvflowError, match="times"):
        lvflow.nqf_horizon(net, X, M=Ms, times=[1.0, 0.0])
    with pytest.raises(lvflow.LvflowError, match="loss_fraction"):
        lvflow.nqf_horizon(net, X, jnp.ones(2), M=Ms, loss_fraction=-1.0)
    with pytest.raises(lvflow.LvflowError, match="y:"):
        lvflow.nqf_horizon(net, X, jnp.ones(3), M=Ms)
    with pytest.raises(lvflow.LvflowError, match="f0:"):
        lvflow.nqf_horizon(net, X, jnp.ones(2), M=Ms, f0=jnp.ones((2, 1)))
    with pytest.raises(lvflow.LvflowError, match="network"):
        lvflow.next_order(object(), X)


# ---------------------------------------------------------------------------------------------
# The horizon against the measured departure of a tanh MLP from its NQF twin (plain GD, written here).


def wine():
    from sklearn.datasets import load_wine

    d = load_wine()
    X = (d.data - d.data.mean(0)) / d.data.std(0)
    return jnp.asarray(X), jnp.asarray(np.where(d.target == 1, 1.0, -1.0))  # cultivar 2 vs the rest


def digits():
    ds = lvflow.digits_parity(m=500)  # a subset: the loss gap needs a (m, p·d) Jacobian per time
    return ds.X, ds.y


def gd(f, W0, y, lr, steps):
    """Full-batch GD on `L = (1/m) Σ (f(W)_μ − y_μ)²`; the loss and `W` before each step."""

    def body(W, _):
        L, G = jax.value_and_grad(lambda W: jnp.mean((f(W) - y) ** 2))(W)
        return W - lr * G, (L, W)

    _, (L, Ws) = jax.lax.scan(body, W0, None, length=steps)
    return np.asarray(L), np.asarray(Ws)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,data,lr,steps,stride,gap_from_M",
    [("wine", wine, 0.05, 800, 20, True), ("digits-parity", digits, 0.01, STEPS_DIGITS, 200, False)],
)
def test_horizon_against_measured_departure(name, data, lr, steps, stride, gap_from_M):
    X, y = data()
    n, width = X.shape[1], 20
    net = MLP(n, width, key=jax.random.PRNGKey(1), init_scale=0.01)
    W0 = net.W
    L_net, _ = gd(lambda W: jnp.tanh(X @ W[:n]) @ W[n], W0, y, lr, steps)
    L_nqf, W_nqf = gd(lambda W: (X @ W[:n]) @ W[n], W0, y, lr, steps)  # the twin: φ'(0) uᵀx v, Prop 1
    gap = np.abs(L_net - L_nqf) / L_net[0]
    assert np.any(gap >= 0.1), "the network never leaves its NQF in this run; lengthen it"
    departure = int(np.argmax(gap >= 0.1))
    idx = np.arange(0, steps, stride)
    t = lr * idx  # gradient-flow time
    from_W = lvflow.nqf_horizon(net, X, y, W=W_nqf[idx], times=t)
    M = np.einsum("tpd,tqd->tpq", W_nqf[idx], W_nqf[idx])
    # digits: from M, the output ratio only (the loss gap costs an (m, p·d) Jacobian per time)
    from_M = lvflow.nqf_horizon(net, X, y if gap_from_M else None, M=M, times=t)
    print(
        f"\n{name}: measured departure (|ΔL| ≥ 0.1 L(0)) at step {departure}; "
        f"ratio ≥ 0.1 at step {from_W.time / lr:.0f} (W) / {from_M.time / lr:.0f} (M); "
        f"estimated loss-gap departure at step {from_W.departure / lr:.0f} (W) / {from_M.departure / lr:.0f} (M); "
        f"ratio at departure {from_W.ratio[departure // stride]:.3f}"
    )
    assert from_W.order == 4 and from_M.order == 4
    # Measured, both cases: the ratio reaches 10 % while the NQF fits, long before the loss parts,
    # so the output-ratio horizon is an early warning, never later than the departure.
    assert from_W.time <= departure * lr and from_M.time <= departure * lr
    # The estimated loss gap has the measured sign (the network goes below its NQF's floor) and
    # reaches 0.1 L(0) within a factor 2 of the measured step, from the twin's own neurons.
    measured = (L_net[idx] - L_nqf[idx]) / L_net[0]
    late = idx >= departure
    assert np.all(np.sign(from_W.loss_gap[late]) == np.sign(measured[late]))
    assert 0.5 <= from_W.departure / (departure * lr) <= 2.0
