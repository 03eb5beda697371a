"""The interaction matrix `C` (Eq. 32) as the solvers see it: its structure is fixed when the system
is built, and each structured operation agrees with dense numpy algebra."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lvflow

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


@pytest.mark.xfail(
    strict=True,
    reason="solve.py's _diagonal_part still decides the path from C's values (not owned here): "
    "it should read system.interaction()",
)
def test_diagonal_solve_lv_same_path_under_jit():
    system, z0, t1 = _diagonal_system(), np.full(4, 1e-3), 20.0
    ts = np.array([0.0, 1.0, 5.0, 20.0])
    eager = np.asarray(lvflow.solve_lv(system, z0, t1, ts=ts).zs)  # the closed form (Thm 6)
    traced = np.asarray(jax.jit(lambda s: lvflow.solve_lv(s, z0, t1, ts=ts).zs)(system))
    np.testing.assert_allclose(traced, eager, rtol=1e-13)  # the closed form again, not the ODE
