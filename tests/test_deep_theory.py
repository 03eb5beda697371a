"""Thm 14 (deep master theorem: the two-layer NQF closes on the per-layer order parameters
`M⁽ˡ⁾ = W_ℓ W_ℓᵀ`) and Thm 15 (deep compressibility: `p_ℓ` neurons per layer realise the same
dynamics) for `lvflow.DeepMLP`'s two-layer NQF (App. B.4, Def 2), against plain gradient descent
on the neurons written here, and the deep NQF against gradient descent on the real deep network
at small init."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lvflow

KEY = jax.random.PRNGKey(0)
IN, HIDDEN = 4, (6, 3, 5)  # block 1: neurons [row of W₁, column of W₂], p₁ = 4 + 3; block 2: p₂ = 3 + 1


def _data(m=12):
    X = jax.random.normal(jax.random.PRNGKey(1), (m, IN))
    y = jnp.sin(X[:, 0]) + 0.5 * X[:, 1] * X[:, 2]
    return X, y


def _blocks_W(model):
    """The neuron arrays of both blocks (a network's blocks, or the twins' networks)."""
    if isinstance(model, lvflow.DeepNQF):
        return lambda m: (m.blocks[0].network.W, m.blocks[1].network.W)
    return lambda m: (m.blocks[0].W, m.blocks[1].W)


def _gd_M(model, Ws, X, y, lr, steps):
    """Full-batch GD on `(1/m) Σ (f(W)_μ − y_μ)²` over both blocks' neurons; `(M⁽¹⁾, M⁽²⁾)` per step."""
    where = _blocks_W(model)
    f = lambda Ws: jax.vmap(eqx.tree_at(where, model, Ws))(X)
    loss = lambda Ws: jnp.mean((f(Ws) - y) ** 2)

    def body(Ws, _):
        G = jax.grad(loss)(Ws)
        Ms = tuple(W @ W.T for W in Ws)
        return tuple(W - lr * g for W, g in zip(Ws, G)), (Ms, f(Ws))

    _, (Ms, out) = jax.lax.scan(body, tuple(Ws), None, length=steps)
    return tuple(np.asarray(M) for M in Ms), np.asarray(out)


def _sqrt_psd(M):
    lam, V = np.linalg.eigh(M)
    return (V * np.sqrt(np.clip(lam, 0, None))) @ V.T


def _orthogonal(d, seed):
    Q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return Q


@pytest.mark.parametrize("activation", [None, jnp.tanh], ids=["linear-link", "tanh-link"])
def test_deep_nqf_closes_on_M_and_compresses_to_p_neurons(activation):
    # Thm 14: the deep NQF depends on W_ℓ only through M⁽ˡ⁾, so GD moves M⁽ˡ⁾ by a map of (M⁽¹⁾, M⁽²⁾)
    # alone. Thm 15: any neurons with the same M⁽ˡ⁾ — rotated (W_ℓ O_ℓ), or p_ℓ of them (M^{1/2}),
    # fewer than the d_ℓ of the network — give the same M-trajectory and outputs.
    net = lvflow.DeepMLP(IN, HIDDEN, key=KEY, init_scale=0.3)
    twin = lvflow.nqf_twin(net)
    assert isinstance(twin, lvflow.DeepNQF)
    if activation is not None:
        twin = lvflow.DeepNQF(blocks=twin.blocks, chain=twin.chain, dphi0=twin.dphi0, activation=activation)
    X, y = _data()
    W = [np.asarray(b.W) for b in net.blocks]
    rotated = [w @ _orthogonal(w.shape[1], s) for s, w in enumerate(W)]
    roots = [_sqrt_psd(w @ w.T) for w in W]
    assert [r.shape[1] for r in roots] == [7, 4] and [w.shape[1] for w in W] == [6, 5]
    lr, steps = 0.2, 40
    ref, out = _gd_M(twin, W, X, y, lr, steps)
    for Ws in (rotated, roots):
        got, got_out = _gd_M(twin, Ws, X, y, lr, steps)
        for M, M_ref in zip(got, ref):
            np.testing.assert_allclose(M, M_ref, rtol=1e-9, atol=1e-12 * np.max(np.abs(M_ref)))
        np.testing.assert_allclose(got_out, out, rtol=1e-9, atol=1e-12 * np.max(np.abs(out)))
    assert np.max(np.abs(ref[0][-1] - ref[0][0])) > 1e-2 * np.max(np.abs(ref[0][0]))  # M moved
    # not vacuous: the real network is not a function of M alone (rotating its neurons changes it)
    _, net_out = _gd_M(net, W, X, y, lr, 1)
    _, rot_out = _gd_M(net, rotated, X, y, lr, 1)
    assert np.max(np.abs(net_out - rot_out)) > 1e-3 * np.max(np.abs(net_out))


def test_deep_nqf_follows_the_real_deep_network_at_small_init():
    # GD on the real 4-layer tanh MLP and on its two-layer NQF (Fig 8's form, tanh kept between the
    # blocks) from the same weights σ·W⁰: the change of each M⁽ˡ⁾ agrees up to a relative error
    # O(σ²) (tanh is odd: each block's NQF error is O(|W|⁴) against O(|W|²)). Learning rate ∝ 1/σ²
    # so that M moves by the same relative amount at each σ.
    net1 = lvflow.DeepMLP(IN, HIDDEN, key=KEY, init_scale=1.0)
    X, y = _data()
    W1 = [np.asarray(b.W) for b in net1.blocks]
    errs = []
    for sigma in (0.1, 0.05, 0.025):
        net = eqx.tree_at(_blocks_W(net1), net1, tuple(sigma * w for w in W1))
        twin = lvflow.nqf_twin(net)
        twin = lvflow.DeepNQF(blocks=twin.blocks, chain=twin.chain, dphi0=twin.dphi0, activation=jnp.tanh)
        Ws = [sigma * w for w in W1]
        lr, steps = 5e-4 / sigma**2, 30
        M_net, _ = _gd_M(net, Ws, X, y, lr, steps)
        M_nqf, _ = _gd_M(twin, Ws, X, y, lr, steps)
        err = 0.0
        for a, b in zip(M_net, M_nqf):
            dM = b[-1] - b[0]
            assert np.linalg.norm(dM) > 0.03 * np.linalg.norm(b[0])  # the NQF's M moved
            err = max(err, np.linalg.norm((a[-1] - a[0]) - dM) / np.linalg.norm(dM))
        errs.append(err)
    slopes = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert errs[-1] < 0.01, errs
    np.testing.assert_allclose(slopes, 2.0, atol=0.3)
