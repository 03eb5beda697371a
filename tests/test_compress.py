"""compress (Thm 3): the k_V + 1 neuron model trained by GD on W has the original's outputs at every step."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lvflow
from lvflow import NQF, compress

m, p, k, kV, d = 5, 7, 2, 3, 10


def _sym(a):
    return (a + np.swapaxes(a, -1, -2)) / 2


def outputs(W, A, f0, g, B):
    """f_μc(W) = f0 + Σ_i w_iᵀ A w_i + gᵀ(W1) + (W1)ᵀ B (W1), neuron by neuron."""
    mu = W.sum(axis=1)
    return f0 + jnp.einsum("...ij,ia,ja->...", A, W, W) + g @ mu + jnp.einsum("...ij,i,j->...", B, mu, mu)


@functools.partial(jax.jit, static_argnames="steps")
def gd_outputs(W0, A, y, f0, g, B, lr, *, steps):
    """Plain GD on W by autodiff; the outputs at steps 0..steps."""
    loss = lambda W: jnp.sum((outputs(W, A, f0, g, B) - y) ** 2) / A.shape[0]

    def step(W, _):
        return W - lr * jax.grad(loss)(W), outputs(W, A, f0, g, B)

    W, fs = jax.lax.scan(step, W0, None, length=steps)
    return jnp.concatenate([fs, outputs(W, A, f0, g, B)[None]])


def _problem(mu_terms, seed):
    """Vector-output NQF (m, k, p, p) whose A, B, g all live in a k_V-dimensional subspace E of R^p."""
    rng = np.random.default_rng(seed)
    E = np.linalg.qr(rng.normal(size=(p, kV)))[0]
    lift = lambda S: np.einsum("ia,...ab,jb->...ij", E, S, E)
    A = lift(_sym(rng.normal(size=(m, k, kV, kV))))
    kw = dict(f0=0.1 * rng.normal(size=(m, k)))
    if mu_terms:
        kw.update(g=0.5 * rng.normal(size=(m, k, kV)) @ E.T, B=0.3 * lift(_sym(rng.normal(size=(m, k, kV, kV)))))
    return NQF(A, rng.normal(size=(m, k)), **kw), E


@pytest.mark.parametrize("mu_terms", [False, True])
def test_compressed_outputs_equal_original_along_gd(mu_terms):
    nqf, E = _problem(mu_terms, seed=3 + mu_terms)
    W0 = 0.3 * np.random.default_rng(0).normal(size=(p, d))  # μ = W1 has a component outside V
    M, mu, lr = W0 @ W0.T, W0.sum(1), 0.01
    c = compress(nqf, M, d=d, lr=lr, mu=mu if mu_terms else None)
    assert (c.k_V, c.d, c.W.shape) == (kV, kV + 1, (p, kV + 1))
    assert c.lr == pytest.approx(d / (kV + 1) * lr, rel=1e-15)
    np.testing.assert_allclose(c.basis @ c.basis.T, E @ E.T, atol=1e-12)  # the projector on V
    np.testing.assert_allclose(c.W @ c.W.T, c.M, atol=1e-12)
    if mu_terms:
        np.testing.assert_allclose(c.W.sum(1), c.mu, atol=1e-12)
    else:
        assert c.mu is None
        np.testing.assert_allclose(c.W.sum(1), 0.0, atol=1e-12)

    zeros = lambda *s: jnp.zeros((m, k) + s)
    g = nqf.g if mu_terms else zeros(p)
    B = nqf.B if mu_terms else zeros(p, p)
    f = gd_outputs(jnp.asarray(W0), nqf.A, nqf.y, nqf.f0, g, B, lr, steps=500)
    f_c = gd_outputs(c.W, c.nqf.A, c.nqf.y, c.nqf.f0, g, B, c.lr, steps=500)
    assert float(jnp.max(jnp.abs(f_c - f))) < 1e-10 * float(jnp.max(jnp.abs(f)))
    loss = jnp.sum((f - nqf.y[None]) ** 2, axis=(1, 2))
    assert float(loss[-1]) < 0.5 * float(loss[0])  # it trained: agreement along a real trajectory


def test_rank_tolerance():
    nqf, _ = _problem(False, seed=0)
    A = np.asarray(nqf.A).copy()
    A[0, 0] += 1e-9 * np.eye(p)  # a perturbation leaving V, far below a loose tolerance
    noisy = NQF(A, nqf.y)
    assert compress(noisy, np.eye(p), d=d, lr=0.1).k_V == p
    assert compress(noisy, np.eye(p), d=d, lr=0.1, rtol=1e-6).k_V == kV


@pytest.mark.bad_input
def test_errors():
    nqf, _ = _problem(True, seed=0)
    Err = lvflow.LvflowError
    with pytest.raises(Err, match="d: must be a positive integer"):
        compress(nqf, np.eye(p), d=2.5, lr=0.1, mu=np.zeros(p))
    with pytest.raises(Err, match="lr: must be positive"):
        compress(nqf, np.eye(p), d=d, lr=0.0, mu=np.zeros(p))
    with pytest.raises(Err, match=r"M: shape \(3, 3\)"):
        compress(nqf, np.eye(3), d=d, lr=0.1, mu=np.zeros(p))
    with pytest.raises(Err, match="mu: required"):
        compress(nqf, np.eye(p), d=d, lr=0.1)
    with pytest.raises(lvflow.NotPSDError, match="M: not positive semi-definite"):
        compress(nqf, -np.eye(p), d=d, lr=0.1, mu=np.zeros(p))
