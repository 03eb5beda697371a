"""The interaction matrix `C` (Eq. 32) as the solvers see it: its structure is fixed when the system
is built, and each structured operation agrees with dense numpy algebra."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lvflow

# internal on purpose: the interaction classes (how the solvers see C) and the uniqueness flag are not public
from lvflow import DenseInteraction, DiagonalInteraction, LowRankInteraction, saturated_equilibrium

_R = np.array([1.0, -0.5, 2.0, 0.3])
_D = np.array([2.0, 1.0, 0.5, 3.0])


def _diagonal_system(r=_R, d=_D):
    return lvflow.LotkaVolterra(r, np.diag(d))


def test_structure_is_fixed_at_construction():
    diagonal, dense = _diagonal_system(), lvflow.LotkaVolterra(_R, np.diag(_D) + 0.1)
    assert diagonal.is_diagonal and not dense.is_diagonal
    # passed into jit as an argument, each keeps the structure it was built with
    kinds = jax.jit(lambda s: jnp.asarray(s.is_diagonal))
    assert bool(kinds(diagonal)) and not bool(kinds(dense))
    # a C traced at construction is dense; a zero or empty U is diagonal, a non-zero one low rank
    assert not bool(jax.jit(lambda C: jnp.asarray(lvflow.LotkaVolterra(_R, C, check=False).is_diagonal))(np.diag(_D)))
    assert lvflow.LowRankLotkaVolterra(_R, _D, np.zeros((4, 2))).is_diagonal
    assert lvflow.LowRankLotkaVolterra(_R, _D, np.zeros((4, 0))).is_diagonal
    assert not lvflow.LowRankLotkaVolterra(_R, _D, np.ones((4, 1))).is_diagonal


def _fd(f, x, h=1e-6):
    """Central finite differences of the vector function `f` at `x`, one column per entry of `x`."""
    cols = []
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        cols.append((np.asarray(f(x + e)) - np.asarray(f(x - e))) / (2 * h))
    return np.stack(cols, axis=-1)


def test_diagonal_equilibrium_same_eagerly_and_under_jit_with_fd_derivatives():
    system = _diagonal_system()
    eager = np.asarray(system.equilibrium())
    np.testing.assert_allclose(eager, np.maximum(_R, 0) / _D, rtol=1e-14)  # Thm 6
    traced = np.asarray(jax.jit(lambda s: s.equilibrium())(system))
    np.testing.assert_allclose(traced, eager, rtol=1e-14)
    # d z*/d r and d z*/d C_kk, through the system passed into jit, against finite differences of
    # freshly built (concrete, diagonal) systems
    jac = jax.jit(jax.jacfwd(lambda s: s.equilibrium()))(system)
    assert isinstance(jac.C, jax.Array)
    fd_r = _fd(lambda r: _diagonal_system(r=r).equilibrium(), _R)
    fd_d = _fd(lambda d: _diagonal_system(d=d).equilibrium(), _D)
    np.testing.assert_allclose(np.asarray(jac.r), fd_r, atol=1e-8)
    np.testing.assert_allclose(np.diagonal(np.asarray(jac.C), axis1=1, axis2=2), fd_d, atol=1e-8)
    eager_jac = jax.jacfwd(lambda s: s.equilibrium())(system)  # the same path without jit
    np.testing.assert_allclose(np.asarray(eager_jac.C), np.asarray(jac.C), atol=1e-14)


def test_diagonal_solve_lv_derivatives_eagerly_and_under_jit():
    system, z0, t1 = _diagonal_system(), np.full(4, 1e-3), 20.0
    ts = np.array([0.0, 1.0, 5.0, 20.0])

    def final(s):
        sol = lvflow.solve_lv(s, z0, t1, ts=ts)
        return jnp.concatenate([sol.zs[-1], sol.switch_on_times[jnp.asarray([0, 2])]])

    eager = np.asarray(final(system))
    traced = np.asarray(jax.jit(final)(system))
    np.testing.assert_allclose(traced, eager, rtol=1e-6)
    grad_r = np.asarray(jax.jit(jax.jacrev(final))(system).r)
    np.testing.assert_allclose(grad_r, _fd(lambda r: final(_diagonal_system(r=r)), _R), rtol=1e-5, atol=1e-7)


def test_diagonal_solve_lv_same_path_under_jit():
    system, z0, t1 = _diagonal_system(), np.full(4, 1e-3), 20.0
    ts = np.array([0.0, 1.0, 5.0, 20.0])
    eager = np.asarray(lvflow.solve_lv(system, z0, t1, ts=ts).zs)  # the closed form (Thm 6)
    traced = np.asarray(jax.jit(lambda s: lvflow.solve_lv(s, z0, t1, ts=ts).zs)(system))
    np.testing.assert_allclose(traced, eager, rtol=1e-13)  # the closed form again, not the ODE


def _interactions(seed, K=7, q=2):
    """The three structures with their dense `C` (numpy): diagonal, Diag(d) + UUᵀ, dense PSD."""
    rng = np.random.default_rng(seed)
    d, U = rng.uniform(0.2, 2.0, K), rng.normal(size=(K, q))
    L = rng.normal(size=(K, K - 2))  # singular PSD: rank K − 2
    return [
        (DiagonalInteraction(d), np.diag(d)),
        (LowRankInteraction(d, U), np.diag(d) + U @ U.T),
        (LowRankInteraction(np.zeros(K), U), U @ U.T),  # d = 0: the dense fallback
        (DenseInteraction(L @ L.T), L @ L.T),
    ]


@pytest.mark.parametrize("seed", [0, 1])
def test_interaction_methods_vs_dense_numpy(seed):
    rng = np.random.default_rng(100 + seed)
    for interaction, C in _interactions(seed):
        K = C.shape[0]
        z = rng.normal(size=K)
        np.testing.assert_allclose(interaction.Cz(jnp.asarray(z)), C @ z, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(interaction.diagonal(), np.diagonal(C), rtol=1e-14)
        for k in (0, K - 1):
            np.testing.assert_allclose(interaction.column(k), C[:, k], rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(jax.jit(type(interaction).column)(interaction, 3), C[:, 3], rtol=1e-14, atol=1e-15)
        b = rng.normal(size=K)
        top = np.max(np.diagonal(C))
        for F in (np.arange(K) % 2 == 0, np.arange(K) < 2, np.zeros(K, bool)):
            idx = np.flatnonzero(F)
            CFF = C[np.ix_(idx, idx)]
            pd = idx.size == 0 or np.linalg.eigvalsh(CFF)[0] > 1e-8 * top
            assert bool(interaction.positive_definite_on(jnp.asarray(F), 1e-10)) == pd, (type(interaction), F)
            if pd:
                x = np.zeros(K)
                x[idx] = np.linalg.solve(CFF, b[idx]) if idx.size else []
                got = interaction.solve_on(jnp.asarray(F), jnp.asarray(b))
                np.testing.assert_allclose(got, x, rtol=1e-9, atol=1e-12)
        assert not bool(DenseInteraction(np.ones((3, 3))).positive_definite_on(jnp.ones(3, bool), 1e-10))


def _qp_equilibrium(C, r):
    """`min ½zᵀCz − rᵀz` over `z ≥ 0` by scipy (L-BFGS-B with bounds), an independent reference."""
    from scipy.optimize import minimize

    out = minimize(
        lambda z: 0.5 * z @ C @ z - r @ z,
        np.zeros_like(r),
        jac=lambda z: C @ z - r,
        bounds=[(0, None)] * r.size,
        method="L-BFGS-B",
        options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000},
    )
    return out.x, out.fun


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_saturated_equilibrium_of_each_structure_vs_scipy_qp(seed):
    rng = np.random.default_rng(200 + seed)
    for interaction, C in _interactions(seed):
        r = rng.normal(size=C.shape[0])
        if np.linalg.eigvalsh(C)[0] < 1e-8:  # singular: r ∈ range(C) keeps the loss bounded below
            r = C @ r
        z, _ = saturated_equilibrium(r, interaction)
        zt, _ = jax.jit(saturated_equilibrium)(r, interaction)  # the same program, traced
        np.testing.assert_array_equal(np.asarray(z), np.asarray(zt))
        z = np.asarray(z)
        ref, fun = _qp_equilibrium(C, r)
        w = r - C @ z
        assert np.all(z >= 0) and np.all(w <= 1e-10) and abs(z @ w) < 1e-10  # KKT
        assert 0.5 * z @ C @ z - r @ z <= fun + 1e-9
        if np.linalg.eigvalsh(C)[0] > 1e-8:  # unique minimiser
            np.testing.assert_allclose(z, ref, atol=1e-6)


def test_low_rank_equilibrium_derivative_vs_finite_differences():
    """`dz*_F = C_FF⁻¹(dr_F − dC_FF z*_F)` through the Woodbury solves, against central differences."""
    rng = np.random.default_rng(7)
    K, q = 6, 2
    d, U, r = rng.uniform(0.5, 2.0, K), rng.normal(size=(K, q)), rng.normal(size=K) + 0.3
    weights = np.sin(np.arange(1.0, K + 1))

    def f(r, d, U):
        return jnp.sum(weights * saturated_equilibrium(r, LowRankInteraction(d, U))[0])

    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(r, d, U)
    h = 1e-6
    for i, x in enumerate((r, d, U)):
        for j in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[j] = h
            plus = [r, d, U]
            minus = [r, d, U]
            plus[i], minus[i] = x + e, x - e
            fd = (float(f(*plus)) - float(f(*minus))) / (2 * h)
            assert float(grads[i][j]) == pytest.approx(fd, rel=1e-6, abs=1e-9), (i, j)


def test_saturated_equilibrium_refuses_a_matrix_for_an_interaction():
    with pytest.raises(lvflow.LvflowError, match="interaction: expected an AbstractInteraction, got ndarray"):
        saturated_equilibrium(_R, np.diag(_D))
