"""LotkaVolterra (Eq. 31–32) and its saturated equilibrium, against scipy NNLS and identities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.optimize import nnls

import lvflow

# internal on purpose: the uniqueness flag (solve_lv's second pass for non-unique z∞) is not public
from lvflow import saturated_equilibrium


@jax.jit
def _traced_dense(r, C):  # the JAX face: the same system, traced
    return lvflow.LotkaVolterra(r, C, check=False).equilibrium()


@jax.jit
def _traced_low_rank(r, d, U):
    return lvflow.LowRankLotkaVolterra(r, d, U).equilibrium()


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


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), K=st.sampled_from([1, 6, 9]), q=st.sampled_from([0, 1, 3]))
def test_equilibrium_vs_scipy_nnls(seed, K, q):
    """Both faces (numpy for a concrete system, JAX under jit) and every structure of C (dense,
    Diag(d) + UUᵀ, diagonal) agree with scipy's NNLS and satisfy the KKT conditions."""
    rng = np.random.default_rng(seed)
    d, U, r = rng.uniform(0.1, 2.0, K), rng.normal(size=(K, q)) / np.sqrt(K), rng.normal(size=K)
    C = np.diag(d) + U @ U.T
    ref = _nnls_equilibrium(C, r)
    dense, low_rank = lvflow.LotkaVolterra(r, C), lvflow.LowRankLotkaVolterra(r, d, U)
    for z in (
        dense.equilibrium(),
        low_rank.equilibrium(),
        _traced_dense(jnp.asarray(r), jnp.asarray(C)),
        _traced_low_rank(jnp.asarray(r), jnp.asarray(d), jnp.asarray(U)),
    ):
        z = np.asarray(z)
        np.testing.assert_allclose(z, ref, atol=1e-9)
        w = r - C @ z
        assert np.all(z >= 0) and np.all(w <= 1e-10) and abs(z @ w) < 1e-10
    for face in (saturated_equilibrium, jax.jit(saturated_equilibrium)):  # C positive definite: unique
        assert bool(face(r, lvflow.LotkaVolterra(r, C).interaction())[1])


def test_equilibrium_diagonal_interior_and_active_mask():
    c = np.array([2.0, 1.0, 0.5])
    r = np.array([1.0, -1.0, 0.0])
    np.testing.assert_array_equal(lvflow.LotkaVolterra(r, np.diag(c)).equilibrium(), [0.5, 0.0, 0.0])  # Thm 6
    C, r = _random_problem(1, 5)
    z_true = np.array([0.5, 1.0, 2.0, 0.1, 0.3])
    r = C @ z_true  # interior: every mode survives
    np.testing.assert_allclose(lvflow.LotkaVolterra(r, C).equilibrium(), z_true, rtol=1e-10)
    active = np.array([True, False, True, True, False])
    idx = np.flatnonzero(active)
    ref = _nnls_equilibrium(C[np.ix_(idx, idx)], r[idx])
    for z in (
        lvflow.LotkaVolterra(r, C).equilibrium(active),
        saturated_equilibrium(jnp.asarray(r), lvflow.LotkaVolterra(r, C).interaction(), active=active)[0],
    ):
        z = np.asarray(z)
        assert np.all(z[~active] == 0)
        np.testing.assert_allclose(z[idx], ref, atol=1e-10)


def test_equilibrium_derivative_matches_finite_differences():
    """The JAX face's derivative is the implicit-function one: central differences agree."""
    C, r = _random_problem(4, 6)
    r = r + 0.3  # some modes on, some off
    f = jax.jit(lambda r, C: jnp.sum(jnp.sin(jnp.arange(1.0, 7.0)) * _traced_dense(r, C)))
    g_r, g_C = jax.grad(f, argnums=(0, 1))(jnp.asarray(r), jnp.asarray(C))
    h = 1e-6
    for k in range(6):
        e = np.zeros(6)
        e[k] = h
        fd = (f(r + e, C) - f(r - e, C)) / (2 * h)
        assert float(g_r[k]) == pytest.approx(float(fd), rel=1e-6, abs=1e-9)
    E = np.zeros((6, 6))
    E[1, 2] = E[2, 1] = h
    fd = (f(r, C + E) - f(r, C - E)) / (2 * h)
    assert float(g_C[1, 2] + g_C[2, 1]) == pytest.approx(float(fd), rel=1e-6, abs=1e-9)


def test_equilibrium_uniqueness_and_unbounded_modes():
    twins = np.ones((2, 2))  # two identical features: a line of minimisers
    for face in (
        lambda r, C: saturated_equilibrium(r, lvflow.LotkaVolterra(r, C, check=False).interaction()),
        jax.jit(lambda r, C: saturated_equilibrium(r, lvflow.LotkaVolterra(r, C, check=False).interaction())),
    ):
        z, unique = face(np.ones(2), twins)
        assert not bool(unique)
        np.testing.assert_allclose(twins @ np.asarray(z), [1.0, 1.0], rtol=1e-12)
    C, r = _random_problem(2, 6, rank=3)  # singular C, generic r
    z = np.asarray(lvflow.LotkaVolterra(r, C).equilibrium())
    w = r - C @ z
    assert np.all(z >= 0) and np.all(w <= 1e-9) and abs(z @ w) < 1e-9
    with pytest.raises(lvflow.LvflowError, match="mode 1 has r_k = 1 > 0 but C_kk = 0"):
        lvflow.LotkaVolterra([1.0, 1.0], np.diag([1.0, 0.0])).equilibrium()
    # under jit: reported, not raised
    traced = jax.jit(
        lambda r, d: saturated_equilibrium(r, lvflow.LotkaVolterra(r, jnp.diag(d), check=False).interaction())
    )
    assert not bool(traced(jnp.asarray([1.0, 1.0]), jnp.asarray([1.0, 0.0]))[1])


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
