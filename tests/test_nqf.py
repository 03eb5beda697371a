"""NQF (Eq. 2, 26, 27, 252, Thm 12) against direct evaluation on W and autodiff."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lvflow
from lvflow import NQF


def _sym(a):
    return (a + np.swapaxes(a, -1, -2)) / 2


def _random(rng, m, p, k=None, mu_terms=False):
    out = (m,) if k is None else (m, k)
    kw = dict(f0=rng.normal(size=out))
    if mu_terms:
        kw.update(g=rng.normal(size=out + (p,)), B=_sym(rng.normal(size=out + (p, p))))
    return NQF(_sym(rng.normal(size=out + (p, p))), rng.normal(size=out), **kw)


def direct_loss(W, A, y, f0, g=None, B=None):
    """L(W) = (1/m) Σ_μ |f_μ(W) − y_μ|² with f = f0 + Σ_i w_iᵀ A w_i + gᵀ(W1) + (W1)ᵀB(W1), neuron by neuron."""
    f = f0 + jnp.einsum("...ij,ia,ja->...", A, W, W)
    mu = W.sum(axis=1)
    if g is not None:
        f = f + jnp.einsum("...i,i->...", g, mu)
    if B is not None:
        f = f + jnp.einsum("...ij,i,j->...", B, mu, mu)
    return jnp.sum((f - y) ** 2) / A.shape[0]


@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("mu_terms", [False, True])
def test_loss_and_gradient_match_direct_evaluation(k, mu_terms):
    rng = np.random.default_rng(1 + 2 * (k or 0) + mu_terms)
    m, p, d = 5, 4, 3
    nqf = _random(rng, m, p, k, mu_terms)
    W = rng.normal(size=(p, d))
    M, mu = W @ W.T, W.sum(axis=1)
    args = (nqf.A, nqf.y, nqf.f0, nqf.g, nqf.B)

    # loss: an independent numpy loop over samples, outputs and neurons
    A, y, f0 = map(np.asarray, (nqf.A, nqf.y, nqf.f0))
    f = f0.copy()
    for idx in np.ndindex(*y.shape):
        f[idx] += sum(W[:, i] @ A[idx] @ W[:, i] for i in range(d))
        if mu_terms:
            f[idx] += np.asarray(nqf.g)[idx] @ mu + mu @ np.asarray(nqf.B)[idx] @ mu
    want = np.sum((f - y) ** 2) / m
    assert float(nqf.loss(M, mu if mu_terms else None)) == pytest.approx(want, rel=1e-13)

    # ∇_W L = v 1ᵀ + H W (Eq. 27, Thm 2), against autodiff of the neuron-wise loss
    grad = jax.grad(direct_loss)(jnp.asarray(W), *args)
    H = nqf.H(M, mu if mu_terms else None)
    v = nqf.v(M, mu)
    np.testing.assert_allclose(np.asarray(jnp.outer(v, jnp.ones(d)) + H @ W), grad, rtol=1e-12, atol=1e-12)
    if not mu_terms:
        assert np.all(np.asarray(v) == 0)
        # H = K(M) − Y (Eq. 252), and Y is H at M = 0 with the sign flipped
        np.testing.assert_allclose(nqf.K(M) - nqf.Y, H, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(-nqf.Y, nqf.H(np.zeros((p, p))), rtol=1e-13, atol=1e-13)


def test_K_is_the_linear_operator_of_eq_252():
    rng = np.random.default_rng(7)
    nqf = _random(rng, 6, 3)
    X = _sym(rng.normal(size=(3, 3)))
    A = np.asarray(nqf.A)
    want = 4 / 6 * sum(np.sum(A[i] * X) * A[i] for i in range(6))
    np.testing.assert_allclose(nqf.K(X), want, rtol=1e-13)


def test_subset_and_scaled():
    rng = np.random.default_rng(3)
    nqf = _random(rng, 6, 3, mu_terms=True)
    W = rng.normal(size=(3, 2))
    idx = np.array([4, 1, 1])
    sub = nqf.subset(idx)
    want = direct_loss(W, nqf.A[idx], nqf.y[idx], nqf.f0[idx], nqf.g[idx], nqf.B[idx])
    assert float(sub.loss(W @ W.T, W.sum(1))) == pytest.approx(float(want), rel=1e-13)
    sc = nqf.scaled(2.5)
    np.testing.assert_allclose(sc.A, 2.5 * nqf.A)
    np.testing.assert_array_equal(sc.B, nqf.B)


def test_constructor_errors():
    A = np.eye(2)[None].repeat(3, 0)
    y = np.zeros(3)
    with pytest.raises(lvflow.LvflowError, match="y: shape"):
        NQF(A, np.zeros(4))
    with pytest.raises(lvflow.LvflowError, match="A: the last two axes"):
        NQF(np.zeros((3, 2, 3)), y)
    with pytest.raises(lvflow.LvflowError, match="A: expected 3 or 4 dimensions"):
        NQF(np.eye(2), y)
    bad = A.copy()
    bad[0, 0, 1] = 1.0
    with pytest.raises(lvflow.SymmetryError, match="A: not symmetric"):
        NQF(bad, y)
    with pytest.raises(lvflow.SymmetryError, match="B: not symmetric"):
        NQF(A, y, B=bad)
    nan = A.copy()
    nan[1, 0, 0] = np.nan
    with pytest.raises(lvflow.LvflowError, match="A: contains 1 non-finite"):
        NQF(nan, y)
    with pytest.raises(lvflow.LvflowError, match="y: contains"):
        NQF(A, np.array([0.0, np.inf, 0.0]))
    with pytest.raises(lvflow.LvflowError, match="g: shape"):
        NQF(A, y, g=np.zeros((3, 3)))
    with pytest.raises(lvflow.LvflowError, match="f0: shape"):
        NQF(A, y, f0=np.zeros(2))


def test_mu_required_when_nqf_has_mu_terms():
    rng = np.random.default_rng(3)
    A = rng.normal(size=(4, 3, 3))
    A = A + A.transpose(0, 2, 1)
    nqf = lvflow.NQF(A, rng.normal(size=4), g=rng.normal(size=(4, 3)))
    with pytest.raises(lvflow.LvflowError, match="mu: required"):
        nqf.loss(np.eye(3))


@pytest.mark.parametrize(
    "A, y, match",
    [
        (np.zeros((0, 2, 2)), np.zeros(0), "at least one sample"),
        (np.eye(2)[None] * (1 + 1j), np.zeros(1), "complex"),
        (np.array([[["a", "b"], ["b", "a"]]]), np.zeros(1), "not a numeric array"),
    ],
)
def test_nqf_refuses_empty_complex_and_non_numeric(A, y, match):
    with pytest.raises(lvflow.LvflowError, match=match):
        lvflow.NQF(A, y)
