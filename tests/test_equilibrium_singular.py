"""The saturated equilibrium (Eq. 32) for a singular PSD `C`: KKT conditions checked directly and
the minimum loss against scipy (NNLS on a factor of `C`, `linprog` for unboundedness)."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.optimize import linprog, minimize, nnls

import lvflow
from lvflow import DenseInteraction, LowRankInteraction, LvflowError, saturated_equilibrium

# internal on purpose: the uniqueness flag and the low-rank face with d = 0 are not public

R3 = np.array([1.0, 0.5, 0.25])
ONES3 = np.ones((3, 3))


def _loss(z, r, C):
    return float(z @ C @ z / 8 - r @ z / 4)


def _kkt_residual(z, r, C):
    """max of `z⁻`, `(r − Cz)⁺` and `|r − Cz|` on the support, relative to `max|r|`."""
    w = r - C @ z
    res = max(
        float(np.max(-z, initial=0.0)), float(np.max(w, initial=0.0)), float(np.max(np.abs(w[z > 0]), initial=0.0))
    )
    return res / max(float(np.max(np.abs(r))), 1e-300)


def _nnls_min(B, b):
    """`min zᵀCz/8 − rᵀz/4` over `z ≥ 0` for `C = BBᵀ`, `r = Bb`: `(‖Bᵀz − b‖² − ‖b‖²)/8`."""
    z, res = nnls(B.T, b, maxiter=50 * B.shape[0])
    return (res**2 - b @ b) / 8, z


def _unbounded(B, r):
    """Whether a ray `v ≥ 0`, `Bᵀv = 0` (so `Cv = 0`) has `rᵀv > 0` (scipy `linprog`)."""
    K, m = B.shape
    out = linprog(-r, A_eq=B.T, b_eq=np.zeros(m), A_ub=np.ones((1, K)), b_ub=[1.0], bounds=(0, None))
    assert out.status == 0
    return -out.fun > 1e-9 * np.max(np.abs(r))


@jax.jit
def _traced(r, C):
    return saturated_equilibrium(r, DenseInteraction(C))


def _eager(r, C):
    return saturated_equilibrium(r, DenseInteraction(C))


def test_all_ones_matrix():
    z = np.asarray(lvflow.LotkaVolterra(R3, ONES3).equilibrium())
    np.testing.assert_allclose(z, [1.0, 0.0, 0.0], atol=1e-14)
    assert _loss(z, R3, ONES3) == pytest.approx(-1 / 8, abs=1e-14)
    ref, _ = _nnls_min(np.ones((3, 1)), np.array([1.0]))  # r ∉ range(C): nnls does not apply
    assert _loss(z, R3, ONES3) < ref + 1e-12
    for face in (_eager, _traced):
        z, unique = face(R3, ONES3)
        np.testing.assert_allclose(np.asarray(z), [1.0, 0.0, 0.0], atol=1e-14)
        assert bool(unique)  # loss ½s² − rᵀz at fixed s = Σz is least with all of s on mode 0
    z, unique = _system_floor(lvflow.LotkaVolterra(R3, ONES3))
    np.testing.assert_allclose(z, [1.0, 0.0, 0.0], atol=1e-14)
    assert unique


def test_all_ones_matrix_low_rank():
    U = np.ones((3, 1))
    z, unique = saturated_equilibrium(R3, LowRankInteraction(np.zeros(3), U))  # C = UUᵀ, the same singular C
    np.testing.assert_allclose(z, [1.0, 0.0, 0.0], atol=1e-14)
    assert unique
    eta = 1e-6
    sys = lvflow.LowRankLotkaVolterra(R3, np.full(3, eta), U)  # nearly singular, d > 0
    z = np.asarray(sys.equilibrium())
    assert _kkt_residual(z, R3, np.asarray(sys.C)) < 1e-9
    assert _loss(z, R3, np.asarray(sys.C)) == pytest.approx(-1 / (8 * (1 + eta)), abs=1e-12)
    zf, _ = _system_floor(sys)
    np.testing.assert_allclose(zf, z, atol=1e-12)
    zt = jax.jit(lambda r, d, U: lvflow.LowRankLotkaVolterra(r, d, U).equilibrium())(R3, np.full(3, eta), U)
    np.testing.assert_allclose(np.asarray(zt), z, atol=1e-9)


def test_duplicate_features_not_unique():
    B = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # modes 0 and 1 identical
    C, r = B @ B.T, np.array([1.0, 1.0, -0.5])
    for z, unique in (_eager(r, C), _traced(r, C)):
        z = np.asarray(z)
        assert _kkt_residual(z, r, C) < 1e-12
        assert z[0] + z[1] == pytest.approx(1.0, abs=1e-12)
        assert not bool(unique)  # any split of z0 + z1 = 1 is a minimiser
    assert _system_floor(lvflow.LotkaVolterra(r, C))[1] is False


def test_plateau_schedule_ends_at_the_minimum():
    system = lvflow.LotkaVolterra(R3, ONES3)
    sched = lvflow.plateau_schedule(system, 1e-6)
    z = np.asarray(sched.z_at(1e6))
    np.testing.assert_allclose(z, [1.0, 0.0, 0.0], atol=1e-12)
    assert float(sched.loss[-1]) == pytest.approx(float(system.loss(z)), abs=1e-12)
    assert float(system.loss(z)) == pytest.approx(float(system.loss(np.zeros(3))) - 1 / 8, abs=1e-12)


def test_unbounded_raises():
    C = np.array([[1.0, -1.0], [-1.0, 1.0]])  # v = (1, 1): Cv = 0, rᵀv = 2 > 0
    with pytest.raises(LvflowError, match="unbounded"):
        _eager(np.array([1.0, 1.0]), C)
    _, ok = _traced(np.array([1.0, 1.0]), C)
    assert not bool(ok)


def _singular(seed, K, rank, duplicate):
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(K, rank))
    if duplicate:  # exactly dependent modes as well as a rank-deficient C
        B[rng.integers(K)] = B[rng.integers(K)] * rng.uniform(0.5, 2.0)
    return rng, B


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    K=st.integers(2, 8),
    data=st.data(),
    duplicate=st.booleans(),
)
def test_random_singular_r_in_range(seed, K, data, duplicate):
    rank = data.draw(st.integers(1, K - 1))
    rng, B = _singular(seed, K, rank, duplicate)
    b = rng.normal(size=rank)
    C, r = B @ B.T, B @ b  # r ∈ range(C): bounded, and NNLS on the factor is the reference
    ref, _ = _nnls_min(B, b)
    scale = max(1.0, abs(ref))
    for face in ("numpy", "jit"):
        z, unique = _eager(r, C) if face == "numpy" else _traced(r, C)
        z = np.asarray(z)
        assert _kkt_residual(z, r, C) < 1e-9, face
        assert abs(_loss(z, r, C) - ref) < 1e-9 * scale, face
        if not bool(unique):  # a second minimiser exists only where C is singular on the support
            T = (z > 0) | (r - C @ z > -1e-9 * np.max(np.abs(r)))
            assert np.linalg.eigvalsh(C[np.ix_(T, T)])[0] < 1e-8 * np.max(np.diag(C))
    z = np.asarray(lvflow.LotkaVolterra(r, C).equilibrium())
    assert abs(_loss(z, r, C) - ref) < 1e-9 * scale
    d = np.zeros(K)  # the low-rank face on the same C = Diag(0) + BBᵀ
    zl, _ = saturated_equilibrium(r, LowRankInteraction(d, B))
    assert _kkt_residual(zl, r, C) < 1e-9
    assert abs(_loss(zl, r, C) - ref) < 1e-9 * scale


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), K=st.integers(2, 8), data=st.data(), duplicate=st.booleans())
def test_random_singular_general_r(seed, K, data, duplicate):
    rank = data.draw(st.integers(1, K - 1))
    rng, B = _singular(seed, K, rank, duplicate)
    C, r = B @ B.T, rng.normal(size=K)  # mixed signs, generally ∉ range(C)
    if _unbounded(B, r):
        with pytest.raises(LvflowError, match="unbounded"):
            _eager(r, C)
        assert not bool(_traced(r, C)[1])
        return
    bound = minimize(
        lambda z: _loss(z, r, C),
        np.full(K, 0.1),
        jac=lambda z: C @ z / 4 - r / 4,
        bounds=[(0, None)] * K,
        method="L-BFGS-B",
        options={"ftol": 1e-15, "gtol": 1e-13, "maxiter": 10_000},
    )
    for face in ("numpy", "jit"):
        z = np.asarray((_eager(r, C) if face == "numpy" else _traced(r, C))[0])
        assert _kkt_residual(z, r, C) < 1e-9, face  # KKT: the minimum, C being PSD
        assert _loss(z, r, C) <= bound.fun + 1e-9 * max(1.0, abs(bound.fun)), face


def _system_floor(system):
    """The saturated equilibrium of a built system, in the structure it declares (`interaction()`)."""
    z, unique = saturated_equilibrium(system.r, system.interaction())
    return np.asarray(z), bool(unique)
