"""Incremental restricted equilibria: both backends against numpy solves on the support
(`C_SS z_S = r_S`, growth rates `σ = r − Cz`, Schur complements, responses) after random
sequences of updates, the Lawson–Hanson repair against scipy's NNLS, and each other."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.optimize import nnls

import lvflow
from lvflow import LowRankLotkaVolterra

# internal on purpose: the incremental active-set backends and the Lawson–Hanson repair are what this file tests
from lvflow._schedule.active_set import _backend, _DenseBackend, _LowRankBackend, _repair

Q_RANK = 3


def low_rank(rng, K):
    """`C = diag(d) + UUᵀ` with `q = 3`, and `r` of both signs."""
    d = rng.uniform(0.2, 1.5, K)
    U = rng.normal(size=(K, Q_RANK)) / np.sqrt(Q_RANK)
    return d, U, rng.normal(size=K)


def dense(rng, K):
    """A random PSD `C` (Gram matrix plus a small ridge, so every `C_SS` is invertible)."""
    B = rng.normal(size=(K, K))
    return B @ B.T / K + 0.05 * np.eye(K), rng.normal(size=K)


def random_backend(rng, K, structure):
    """`(backend, C, r)` for a random dense or low-rank system (`corrected` off)."""
    if structure == "dense":
        C, r = dense(rng, K)
        return _DenseBackend(C, r, False), C, r
    d, U, r = low_rank(rng, K)
    return _LowRankBackend(d, U, r, False), np.diag(d) + U @ U.T, r


def reference(C, r, S):
    """The restricted equilibrium on support `S` from scratch, and what follows from it."""
    K = r.size
    z = np.zeros(K)
    z[S] = np.linalg.solve(C[np.ix_(S, S)], r[S])
    off = ~S
    CSS_inv_CS = np.linalg.solve(C[np.ix_(S, S)], C[S]) if S.any() else np.zeros((0, K))
    gamma = np.diagonal(C) - np.einsum("sk,sk->k", C[S], CSS_inv_CS)  # γ_k = C_kk − C_kS C_SS⁻¹ C_Sk
    return z, r - C @ z, gamma, off


def check(be, C, r, S, *, rtol=1e-9):
    """`be` (after `solve`/`commit`) against `reference` on support `S`."""
    z, sigma, gamma, off = reference(C, r, S)
    atol = rtol * max(1.0, np.max(np.abs(z)))
    np.testing.assert_array_equal(be.supp, S)
    np.testing.assert_allclose(be.z_full(), z, rtol=rtol, atol=atol)
    np.testing.assert_allclose(be.sigma()[off], sigma[off], rtol=rtol, atol=atol)
    assert be.rz() == pytest.approx(r @ z, rel=rtol, abs=atol)
    np.testing.assert_allclose(be.schur()[off], gamma[off], rtol=rtol, atol=atol)
    for k in np.flatnonzero(off)[:3]:
        x = np.zeros(r.size)  # x = e_k − C_SS⁻¹ C_Sk
        x[k] = 1.0
        if S.any():
            x[S] = -np.linalg.solve(C[np.ix_(S, S)], C[S, k])
        rest = off.copy()
        rest[k] = False
        np.testing.assert_allclose(be.response(k)[rest], (C @ x)[rest], rtol=rtol, atol=atol)


def drive(backends, C, r, rng, n_updates):
    """Random adds and removes (one mode at a time), each followed by `solve`/`commit` as
    `_repair` does; every backend is checked against numpy after every update."""
    K = r.size
    S = np.zeros(K, bool)
    for _ in range(n_updates):
        grow = not S.any() or (not S.all() and rng.random() < 0.6)
        k = int(rng.choice(np.flatnonzero(~S if grow else S)))
        S[k] = grow
        zS = np.linalg.solve(C[np.ix_(S, S)], r[S]) if S.any() else np.zeros(0)
        for be in backends:
            if grow:
                assert be.add(k)
            else:
                be.remove(k)
            neg = be.solve()
            np.testing.assert_array_equal(neg, np.flatnonzero(S)[zS <= 0])  # trial point's z ≤ 0 on S
            np.testing.assert_allclose(be.trial_z()[S], zS, rtol=1e-9, atol=1e-9)
            be.commit()
            check(be, C, r, S)
    return S


@pytest.mark.parametrize("seed", [0, 1])
def test_dense_backend_random_updates(seed):
    rng = np.random.default_rng(seed)
    C, r = dense(rng, 25)
    be = _DenseBackend(C, r, True)
    drive([be], C, r, rng, 140)  # past two refreshes from scratch (every 64 updates)
    # φ = r − Cz is kept everywhere: zero on the support
    np.testing.assert_allclose(be.sigma()[be.supp], 0.0, atol=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_low_rank_backend_random_updates_agree_with_dense(seed):
    rng = np.random.default_rng(seed)
    d, U, r = low_rank(rng, 30)
    C = np.diag(d) + U @ U.T
    lr, de = _LowRankBackend(d, U, r, False), _DenseBackend(C, r, True)
    S = drive([lr, de], C, r, rng, 140)
    off = ~S
    np.testing.assert_allclose(lr.z_full(), de.z_full(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(lr.sigma()[off], de.sigma()[off], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(lr.schur()[off], de.schur()[off], rtol=1e-10)
    assert lr.rz() == pytest.approx(de.rz(), rel=1e-10)


def test_backend_picks_the_structure():
    rng = np.random.default_rng(3)
    d, U, r = low_rank(rng, 6)
    lr = LowRankLotkaVolterra(r, d, U)
    assert isinstance(_backend(lr, False), _LowRankBackend)
    assert isinstance(_backend(lr.to_dense(), True), _DenseBackend)


def test_dense_dependent_mode_is_refused_and_negative_schur_raises():
    # C = BᵀB of rank 2: a third mode is a combination of the first two (Schur complement 0)
    B = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    C, r = B.T @ B, np.array([1.0, 0.5, 1.5])
    be = _DenseBackend(C, r, False)
    assert be.add(0) and be.add(1)
    be.solve()
    be.commit()
    z = be.z_full().copy()
    assert not be.add(2)
    np.testing.assert_array_equal(be.supp, [True, True, False])
    be.solve()
    be.commit()
    np.testing.assert_allclose(be.z_full(), z, rtol=1e-14)
    np.testing.assert_allclose(be.sigma()[2], 0.0, atol=1e-12)  # r = Bᵀ(1, 0.5) is in range C
    # not PSD: C_11 − C_10² / C_00 = 1 − 4 < 0
    be = _DenseBackend(np.array([[1.0, 2.0], [2.0, 1.0]]), np.ones(2), False)
    assert be.add(0)
    with pytest.raises(lvflow.NotPSDError, match="Schur complement"):
        be.add(1)


def nnls_equilibrium(C, r, A):
    """min ½zᵀCz − rᵀz over z ≥ 0 on the active set `A` (z = 0 off it) by scipy NNLS:
    with C_AA = LLᵀ it is min ‖Lᵀz − L⁻¹r‖²."""
    z = np.zeros(r.size)
    if A.any():
        L = np.linalg.cholesky(C[np.ix_(A, A)])
        z[A] = nnls(L.T, np.linalg.solve(L, r[A]), maxiter=50 * r.size)[0]
    return z


@pytest.mark.parametrize("structure", ["dense", "low_rank"])
def test_repair_is_nnls_warm_started(structure):
    rng = np.random.default_rng(7)
    K = 40
    be, C, r = random_backend(rng, K, structure)
    tol = 1e-10 * np.max(np.abs(r))
    A = np.zeros(K, bool)
    bound = 0
    for step in range(4):  # grow the active set, as ignitions do, and re-repair from the last state
        new = rng.choice(np.flatnonzero(~A), 10, replace=False)
        A[new] = True
        pend = set(np.flatnonzero(A & ~be.supp).tolist())
        _repair(be, pend, tol, 3 * K + 10)
        z = nnls_equilibrium(C, r, A)
        np.testing.assert_allclose(be.z_full(), z, rtol=1e-8, atol=1e-10)
        # KKT: the support is where z* > 0, `pend` the active rest, none of which could grow
        np.testing.assert_array_equal(be.supp, z > 0)
        assert pend == set(np.flatnonzero(A & (z == 0)).tolist())
        assert np.all((r - C @ z)[sorted(pend)] <= tol)
        bound += len(pend)
    assert bound > 0  # the constraint z ≥ 0 was active somewhere


def test_repair_failures():
    # r has a component along C's null space on the active set: no saturated equilibrium
    be = _DenseBackend(np.diag([1.0, 0.0]), np.ones(2), False)
    with pytest.raises(lvflow.LvflowError, match="singular"):
        _repair(be, {0, 1}, 1e-10, 10)
    be = _DenseBackend(np.eye(3), np.ones(3), False)
    with pytest.raises(lvflow.SolverError, match="Lawson–Hanson"):
        _repair(be, {0, 1, 2}, 1e-10, 2)


def snapshot(be):
    off = ~be.supp
    return be.supp.copy(), be.z_full().copy(), be.sigma()[off].copy(), be.rz()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_support=st.integers(0, 8), structure=st.sampled_from(["dense", "low_rank"]))
def test_add_then_remove_restores_the_equilibrium(seed, n_support, structure):
    rng = np.random.default_rng(seed)
    K = 10
    be, _, r = random_backend(rng, K, structure)
    for k in rng.permutation(K)[:n_support]:
        assert be.add(int(k))
    be.solve()
    be.commit()
    supp, z, sigma, rz = snapshot(be)
    k = int(rng.choice(np.flatnonzero(~supp)))
    assert be.add(k)
    be.solve()
    be.commit()
    be.remove(k)
    be.solve()
    be.commit()
    supp2, z2, sigma2, rz2 = snapshot(be)
    np.testing.assert_array_equal(supp2, supp)
    np.testing.assert_allclose(z2, z, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(sigma2, sigma, rtol=1e-9, atol=1e-11)
    assert rz2 == pytest.approx(rz, rel=1e-9, abs=1e-11)
