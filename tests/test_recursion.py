"""gd_recursion (Thm 2, Cor. 2) against gradient descent run on W itself, by autodiff."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import lvflow
from lvflow import NQF, gd_recursion

# internal on purpose: one GD step and one momentum step must agree at zero momentum

M_SAMPLES, P, D, STEPS, LR = 6, 4, 3, 1000, 0.01


def _sym(a):
    return (a + np.swapaxes(a, -1, -2)) / 2


def _nqf(mu_terms, seed=0, k=()):
    """A random NQF with m samples, k = () or (outputs,), and optionally μ-terms (non-ZGZ, Thm 12)."""
    rng = np.random.default_rng(seed)
    out = (M_SAMPLES,) + k
    kw = dict(f0=0.1 * rng.normal(size=out))
    if mu_terms:
        kw.update(g=0.5 * rng.normal(size=out + (P,)), B=0.3 * _sym(rng.normal(size=out + (P, P))))
    return NQF(_sym(rng.normal(size=out + (P, P))), rng.normal(size=out), **kw)


def direct_loss(W, A, y, f0, g, B):
    """(1/b) Σ_μ |f0 + Σ_i w_iᵀ A w_i + gᵀW1 + (W1)ᵀB(W1) − y|², neuron by neuron."""
    mu = W.sum(axis=1)
    f = f0 + jnp.einsum("...ij,ia,ja->...", A, W, W) + g @ mu + jnp.einsum("...ij,i,j->...", B, mu, mu)
    return jnp.sum((f - y) ** 2) / A.shape[0]


@functools.partial(jax.jit, static_argnames="steps")
def gd_on_W(W0, A, y, f0, g, B, batches, lr, gamma, beta, *, steps):
    """W_{t+1} = W_t − η(∇L_b(W_t) + γW_t) + β(W_t − W_{t−1}), W_{−1} = W_0, by autodiff."""
    grad = jax.grad(direct_loss)

    def step(carry, idx):
        W, W_prev = carry
        G = grad(W, A[idx], y[idx], f0[idx], g[idx], B[idx]) + gamma * W
        return (W - lr * G + beta * (W - W_prev), W), W

    (W, _), Ws = jax.lax.scan(step, (W0, W0), batches, length=steps)
    return jnp.concatenate([Ws, W[None]])


CASES = {  # (μ-terms, minibatch, weight decay, momentum, outputs): every option, each path twice
    "zgz-full-2outputs": (False, False, 0.0, 0.0, (2,)),
    "mu-minibatch-wd": (True, True, 0.05, 0.0, ()),
    "mu-momentum-wd": (True, False, 0.05, 0.9, ()),
    "zgz-momentum-minibatch": (False, True, 0.0, 0.9, ()),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_gradient_descent_on_W(case):
    mu_terms, minibatch, gamma, beta, k = CASES[case]
    nqf = _nqf(mu_terms, k=k)
    rng = np.random.default_rng(1)
    W0 = 0.4 * rng.normal(size=(P, D))
    batches = rng.integers(0, M_SAMPLES, size=(STEPS, 3)) if minibatch else None
    lr = LR * (1 - beta)  # keep the effective step η/(1−β) the same
    res = gd_recursion(
        nqf,
        W0 @ W0.T,
        steps=STEPS,
        lr=lr,
        mu0=W0.sum(1) if mu_terms else None,
        d=D if mu_terms else None,
        batches=batches,
        weight_decay=gamma,
        momentum=beta,
        record_every=100,
    )
    zeros = lambda *s: jnp.zeros((M_SAMPLES,) + k + s)
    g = nqf.g if mu_terms else zeros(P)
    B = nqf.B if mu_terms else zeros(P, P)
    idx = jnp.asarray(batches) if minibatch else jnp.broadcast_to(jnp.arange(M_SAMPLES), (STEPS, M_SAMPLES))
    Ws = gd_on_W(jnp.asarray(W0), nqf.A, nqf.y, nqf.f0, g, B, idx, lr, gamma, beta, steps=STEPS)[::100]
    M_ref = jnp.einsum("tia,tja->tij", Ws, Ws)
    np.testing.assert_array_equal(res.steps, np.arange(0, STEPS + 1, 100))
    scale = float(jnp.max(jnp.abs(M_ref[-1])))
    assert float(jnp.max(jnp.abs(res.M - M_ref))) < 1e-10 * scale
    if mu_terms:
        assert float(jnp.max(jnp.abs(res.mu - Ws.sum(2)))) < 1e-10 * float(jnp.max(jnp.abs(Ws.sum(2))))
    else:
        assert res.mu is None
    loss_ref = jax.vmap(lambda W: direct_loss(W, nqf.A, nqf.y, nqf.f0, g, B))(Ws)
    np.testing.assert_allclose(res.loss, loss_ref, rtol=1e-9)
    assert float(loss_ref[-1]) < 0.5 * float(loss_ref[0])  # it trained: the comparison is not vacuous


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), lr=st.floats(1e-3, 0.5), d=st.integers(1, 5))
def test_first_step_is_thm2(seed, lr, d):
    """One step of `gd_recursion` is the Thm 2 polynomial, written out: plain GD, and Polyak's
    momentum through the Gram-of-[W, V] update (Cor. 2), whose first step is GD's
    (`V_0 = W_0 − W_{−1} = 0`)."""
    nqf = _nqf(True, seed=seed % 7)
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(P, d))
    M, mu = W @ W.T, W.sum(1)
    steps = [lvflow.gd_recursion(nqf, M, steps=1, lr=lr, mu0=mu, d=d, momentum=beta) for beta in (0.0, 0.5)]
    (M1, mu1), (M2, mu2) = ((np.asarray(r.M[-1]), np.asarray(r.mu[-1])) for r in steps)
    H, v = np.asarray(nqf.H(M, mu)), np.asarray(nqf.v(M, mu))
    want_M = (
        M
        - lr * (np.outer(v, mu) + np.outer(mu, v) + H @ M + M @ H)
        + lr**2 * (d * np.outer(v, v) + np.outer(v, mu) @ H + H @ np.outer(mu, v) + H @ M @ H)
    )
    want_mu = mu - lr * (d * v + H @ mu)
    for got_M, got_mu in ((M1, mu1), (M2, mu2)):
        np.testing.assert_allclose(got_M, want_M, rtol=1e-11, atol=1e-11 * np.abs(want_M).max())
        np.testing.assert_allclose(got_mu, want_mu, rtol=1e-11, atol=1e-11 * np.abs(want_mu).max())


@pytest.mark.bad_input
def test_errors():
    nqf, zgz = _nqf(True), _nqf(False)
    M0, mu0 = np.eye(P), 0.5 * np.ones(P)
    ok = dict(steps=10, lr=0.1, mu0=mu0, d=D)
    Err = lvflow.LvflowError
    with pytest.raises(lvflow.NotPSDError, match="M0: not positive semi-definite"):
        gd_recursion(nqf, -M0, **ok)
    with pytest.raises(Err, match=r"M0: shape \(3, 3\)"):
        gd_recursion(nqf, np.eye(3), **ok)
    with pytest.raises(Err, match="M0: contains 1 non-finite"):
        gd_recursion(nqf, np.diag([1.0, np.nan, 1.0, 1.0]), **ok)
    with pytest.raises(Err, match="lr: must be positive"):
        gd_recursion(nqf, M0, **{**ok, "lr": -0.1})
    with pytest.raises(Err, match=r"batches: expected shape \(steps=10, b\)"):
        gd_recursion(nqf, M0, **ok, batches=np.zeros((9, 2), int))
    with pytest.raises(Err, match="batches: expected integer"):
        gd_recursion(nqf, M0, **ok, batches=np.zeros((10, 2)))
    with pytest.raises(Err, match=r"batches: indices must lie in \[0, 6\)"):
        gd_recursion(nqf, M0, **ok, batches=np.full((10, 2), 6))
    with pytest.raises(Err, match="d: required"):
        gd_recursion(nqf, M0, **{**ok, "d": None})
    with pytest.raises(Err, match="mu0: required"):
        gd_recursion(nqf, M0, **{**ok, "mu0": None})
    with pytest.raises(lvflow.NotPSDError, match="no W with d columns"):
        gd_recursion(nqf, M0, **{**ok, "mu0": 4 * mu0})
    with pytest.raises(Err, match="momentum: must lie in"):
        gd_recursion(nqf, M0, **ok, momentum=1.0)
    with pytest.raises(Err, match="record_every: must be a positive integer dividing"):
        gd_recursion(nqf, M0, **ok, record_every=3)
    with pytest.raises(Err, match="steps: must be a positive integer"):
        gd_recursion(zgz, M0, steps=0, lr=0.1)
    with pytest.raises(Err, match="weight_decay: must be non-negative"):
        gd_recursion(zgz, M0, steps=10, lr=0.1, weight_decay=-1.0)
    with pytest.raises(lvflow.SolverError, match="diverged"):
        gd_recursion(zgz, 100 * M0, steps=10, lr=10.0)
