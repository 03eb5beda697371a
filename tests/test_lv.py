"""LotkaVolterra (Eq. 31–32) and its saturated equilibrium, against scipy NNLS and identities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.optimize import nnls

import lvflow
from lvflow._glv.lv import equilibrium_is_unique, saturated_equilibrium, saturated_equilibrium_jax

_bpp = jax.jit(saturated_equilibrium_jax)


def _random_problem(seed, K, rank=None):
    rng = np.random.default_rng(seed)
    L = rng.normal(size=(K, K if rank is None else rank))
    C = L @ L.T / K + (0.05 * np.eye(K) if rank is None else 0)
    r = rng.normal(size=K)
    return C, r


def _nnls_equilibrium(C, r):
    # min ½zᵀCz − rᵀz, z ≥ 0  ⇔  min ½|Lᵀz − b|², z ≥ 0, with C = LLᵀ, L b = r (scipy's NNLS).
    L = np.linalg.cholesky(C)
    return nnls(L.T, np.linalg.solve(L, r))[0]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), K=st.sampled_from([6]))
def test_equilibrium_vs_scipy_nnls(seed, K):
    C, r = _random_problem(seed, K)
    ref = _nnls_equilibrium(C, r)
    np.testing.assert_allclose(saturated_equilibrium(C, r), ref, atol=1e-9)
    z, ok = _bpp(jnp.asarray(r), jnp.asarray(C))
    assert bool(ok)
    np.testing.assert_allclose(np.asarray(z), ref, atol=1e-9)
    system = lvflow.LotkaVolterra(r, C)
    np.testing.assert_allclose(np.asarray(system.equilibrium()), ref, atol=1e-9)
    assert equilibrium_is_unique(C, r, ref)


def test_equilibrium_fast_paths_and_active_mask():
    c = np.array([2.0, 1.0, 0.5])
    r = np.array([1.0, -1.0, 0.0])
    np.testing.assert_array_equal(saturated_equilibrium(np.diag(c), r), [0.5, 0.0, 0.0])
    C, r = _random_problem(1, 5)
    z_true = np.array([0.5, 1.0, 2.0, 0.1, 0.3])
    r = C @ z_true  # interior: every mode survives
    np.testing.assert_allclose(saturated_equilibrium(C, r), z_true, rtol=1e-10)
    active = np.array([True, False, True, True, False])
    z = saturated_equilibrium(C, r, active)
    assert np.all(z[~active] == 0)
    idx = np.flatnonzero(active)
    np.testing.assert_allclose(z[idx], _nnls_equilibrium(C[np.ix_(idx, idx)], r[idx]), atol=1e-10)


def test_equilibrium_uniqueness():
    twins = np.ones((2, 2))
    assert not equilibrium_is_unique(twins, np.ones(2), saturated_equilibrium(twins, np.ones(2)))
    C, r = _random_problem(2, 6, rank=3)  # singular C, generic r: a unique active face or not
    z = saturated_equilibrium(C, r)
    w = r - C @ z
    assert np.all(z >= 0) and np.all(w <= 1e-9) and abs(z @ w) < 1e-9


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_loss_in_modes_and_equilibrium_minimises_it(seed):
    # r_k = (8/m) Σ y_μ λ_μk, C = (8/m) Σ λ_μk λ_μj (Eq. 32) and L = (1/m) Σ (λ_μ·z − y_μ)² (Eq. 26).
    rng = np.random.default_rng(seed)
    m, K = 7, 4
    lam, y = rng.normal(size=(m, K)), rng.normal(size=m)
    r, C = 8 / m * lam.T @ y, 8 / m * lam.T @ lam
    system = lvflow.LotkaVolterra(r, C, y2=np.mean(y**2))
    z = rng.exponential(size=(3, K))
    np.testing.assert_allclose(np.asarray(system.loss(z)), np.mean((z @ lam.T - y) ** 2, axis=1), rtol=1e-12)
    # The saturated equilibrium minimises the loss over z ≥ 0: excess loss is never negative.
    assert np.all(np.asarray(system.excess_loss(z)) >= -1e-12)
    # Eq. 32 is the gradient flow seen in modes: ż_k = −4 z_k ∂L/∂z_k (∂L/∂z = (Cz − r)/4).
    grad = jax.vmap(jax.grad(system.loss))(jnp.asarray(z))
    vf = jax.vmap(lambda zz: system.vector_field(0.0, zz))(jnp.asarray(z))
    np.testing.assert_allclose(np.asarray(vf), -4 * z * np.asarray(grad), rtol=1e-10, atol=1e-12)


def test_log_vector_field_and_V():
    C, r = _random_problem(3, 4)
    system = lvflow.LotkaVolterra(r, C)
    z = np.array([0.1, 1e-200, 2.0, 0.5])
    np.testing.assert_allclose(
        np.asarray(system.log_vector_field(0.0, jnp.log(z))), np.asarray(system.vector_field(0.0, z)) / z, rtol=1e-12
    )
    # V_k: the loss drop when mode k alone saturates at r_k/C_kk (Thm 6, §4).
    for k in np.flatnonzero(r > 0):
        zk = np.zeros(4)
        zk[k] = r[k] / C[k, k]
        assert float(system.loss(np.zeros(4)) - system.loss(zk)) == pytest.approx(float(system.V[k]), rel=1e-12)
    assert np.all(np.asarray(system.V)[r <= 0] == 0)
    np.testing.assert_array_equal(np.asarray(system.zeta), r)


def test_errors():
    with pytest.raises(lvflow.LvflowError, match="C: shape"):
        lvflow.LotkaVolterra([1.0, 2.0], np.eye(3))
    with pytest.raises(lvflow.NotPSDError, match="C"):
        lvflow.LotkaVolterra([1.0, 2.0], np.diag([1.0, -1.0]))
    with pytest.raises(lvflow.LvflowError, match="r"):
        lvflow.LotkaVolterra([1.0, np.inf], np.eye(2))
    with pytest.raises(lvflow.LvflowError, match="C"):
        lvflow.LotkaVolterra([1.0, 1.0], [[1.0, np.nan], [np.nan, 1.0]])
