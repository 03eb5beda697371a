"""reduce_to_lv (Assumption 1, Eq. 31–32) and reduce_to_projectors (Thm 16) against direct numpy
evaluation of the matrix flow Ṁ = −HM − MH (Eq. 27–28) and the loss (Eq. 26)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import lvflow
from lvflow import ProjectorForm, reduce_to_lv, reduce_to_projectors


def commuting_nqf(rng, m, p, k=None, *, degenerate=True, idle=True):
    """A_μ = P Λ_μ Pᵀ for a random orthogonal P, with joint-degenerate modes (two identical λ
    columns), repeated eigenvalues inside single A_μ, and an idle mode (λ = 0 for every μ)."""
    P, _ = np.linalg.qr(rng.standard_normal((p, p)))
    shape = (m, p) if k is None else (m, k, p)
    lam = rng.standard_normal(shape)
    if degenerate:
        lam[..., 1] = lam[..., 0]
        lam[0, ..., 4] = lam[0, ..., 5]
        lam[-1, ..., 2] = lam[-1, ..., 3]
    if idle:
        lam[..., -1] = 0.0
    A = np.einsum("ik,...k,jk->...ij", P, lam, P)
    y = rng.standard_normal(shape[:-1])
    f0 = rng.standard_normal(shape[:-1])
    return lvflow.NQF(A, y, f0=f0), P, lam, y - f0


def direct_flow(nqf, M):
    """Ṁ = −H M − M H with H = (4/m) Σ_μ (Tr[M A_μ] + f0_μ − y_μ) A_μ, in plain numpy."""
    A = np.asarray(nqf.A).reshape(-1, nqf.p, nqf.p)
    res = np.einsum("nij,ij->n", A, M) + np.asarray(nqf.f0).ravel() - np.asarray(nqf.y).ravel()
    H = 4.0 / nqf.m * np.einsum("n,nij->ij", res, A)
    return -H @ M - M @ H


def direct_loss(nqf, M):
    """L = (1/m) Σ_μ |Tr[M A_μ] + f0_μ − y_μ|² (Eq. 26), in plain numpy."""
    A = np.asarray(nqf.A).reshape(-1, nqf.p, nqf.p)
    res = np.einsum("nij,ij->n", A, M) + np.asarray(nqf.f0).ravel() - np.asarray(nqf.y).ravel()
    return float(res @ res) / nqf.m


def check_reduction(nqf, P_true, lam, t, rng):
    lv = reduce_to_lv(nqf)
    P = np.asarray(lv.P)
    m = nqf.m
    lam2 = lam.reshape(-1, lam.shape[-1])
    used = np.max(np.abs(lam2), axis=0) > 0
    assert lv.K == int(used.sum())
    np.testing.assert_allclose(P.T @ P, np.eye(lv.K), atol=1e-12)
    # Eq. 32 from the known Λ, carried to the recovered basis by Q∘Q (Q = Pᵀ P_true: a signed
    # permutation, rotated only inside joint-degenerate blocks where r, C entries are equal)
    Q = P.T @ P_true[:, used]
    W = Q**2
    r_true = 8.0 / m * t.ravel() @ lam2[:, used]
    C_true = 8.0 / m * lam2[:, used].T @ lam2[:, used]
    np.testing.assert_allclose(lv.r, W @ r_true, atol=1e-10)
    np.testing.assert_allclose(lv.C, W @ C_true @ W.T, atol=1e-10)
    assert float(lv.y2) == pytest.approx(float(np.sum(t**2)) / m, rel=1e-12)
    # gLV vector field z ⊙ (r − Cz) = diagonal of Pᵀ Ṁ P, whose off-diagonal part stays zero
    # (Prop 7); and L(M) = zᵀCz/8 − rᵀz/4 + y2 for M = P diag(z) Pᵀ
    r, C, y2 = np.asarray(lv.r), np.asarray(lv.C), float(lv.y2)
    for _ in range(3):
        z = rng.uniform(0.0, 2.0, lv.K)
        M = P @ np.diag(z) @ P.T
        Md = P.T @ direct_flow(nqf, M) @ P
        np.testing.assert_allclose(np.diag(Md), z * (r - C @ z), atol=1e-10)
        np.testing.assert_allclose(Md - np.diag(np.diag(Md)), 0.0, atol=1e-10)
        assert z @ C @ z / 8 - r @ z / 4 + y2 == pytest.approx(direct_loss(nqf, M), rel=1e-12)
    return lv


def test_scalar_output_with_degeneracies_and_idle_mode():
    rng = np.random.default_rng(0)
    nqf, P, lam, t = commuting_nqf(rng, m=7, p=8)
    lv = check_reduction(nqf, P, lam, t, rng)
    assert lv.K == 7  # the idle mode is dropped
    assert np.all(np.diff(np.asarray(lv.r)) <= 0)  # ordered by decreasing r


def test_vector_output():
    rng = np.random.default_rng(1)
    nqf, P, lam, t = commuting_nqf(rng, m=5, p=7, k=3)
    check_reduction(nqf, P, lam, t, rng)


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 9), st.integers(2, 7))
def test_random_commuting(seed, m, p):
    rng = np.random.default_rng(seed)
    nqf, P, lam, t = commuting_nqf(rng, m=m, p=p, degenerate=p >= 6, idle=bool(seed % 2))
    check_reduction(nqf, P, lam, t, rng)


def test_nearly_degenerate_combination_is_refined():
    # Every A_μ shares eigenvectors, but two joint eigenvalue tuples differ only by 1e-9:
    # the random combination's eigenvectors mix there and the cluster refinement must split them.
    rng = np.random.default_rng(2)
    P, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    lam = rng.standard_normal((4, 5))
    lam[:, 1] = lam[:, 0] + 1e-9 * np.array([1.0, -1.0, 0.5, 0.0])
    nqf = lvflow.NQF(np.einsum("ik,nk,jk->nij", P, lam, P), rng.standard_normal(4))
    check_reduction(nqf, P, lam, np.asarray(nqf.y), rng)


def test_not_commuting_reports_the_largest_commutator():
    rng = np.random.default_rng(3)
    B = rng.standard_normal((4, 5, 5))
    A = B + B.transpose(0, 2, 1)
    expected = max(np.linalg.norm(A[i] @ A[j] - A[j] @ A[i]) for i in range(4) for j in range(4))
    with pytest.raises(lvflow.NotCommutingError, match=r"‖\[A_μ, A_ν\]‖_F = ") as info:
        reduce_to_lv(lvflow.NQF(A, rng.standard_normal(4)))
    assert info.value.commutator_norm == pytest.approx(expected, rel=1e-12)
    assert f"{expected:.3g}" in str(info.value)


def test_mu_terms_rejected():
    A = np.eye(2)[None].repeat(3, 0)
    with pytest.raises(lvflow.LvflowError, match="μ-terms"):
        reduce_to_lv(lvflow.NQF(A, np.ones(3), g=np.ones((3, 2))))
    with pytest.raises(lvflow.LvflowError, match="nqf"):
        reduce_to_lv(A)


def saxe_nqf(rng, n_in, k, m, s, *, whiten):
    """Two-layer linear net f(x) = V U x; neuron w = [u (n_in), v (k)], A^c(x) = ½[[0, x e_cᵀ],[e_c xᵀ, 0]]
    (Table 3, Cor. 1). Targets y = T x with T = Σ_a s_a v_a u_aᵀ; inputs whitened or not."""
    X = rng.standard_normal((m, n_in))
    if whiten:  # (1/m) XᵀX = I exactly
        Qx, _ = np.linalg.qr(X)
        X = np.sqrt(m) * Qx
    Uo, _ = np.linalg.qr(rng.standard_normal((n_in, len(s))))
    Vo, _ = np.linalg.qr(rng.standard_normal((k, len(s))))
    T = Vo @ np.diag(s) @ Uo.T
    p = n_in + k
    A = np.zeros((m, k, p, p))
    for c in range(k):
        A[:, c, :n_in, n_in + c] = X / 2
        A[:, c, n_in + c, :n_in] = X / 2
    return lvflow.NQF(A, X @ T.T), Uo, Vo


def test_projectors_saxe_two_layer_linear():
    rng = np.random.default_rng(4)
    s = np.array([3.0, 2.0, 1.0])
    nqf, Uo, Vo = saxe_nqf(rng, n_in=5, k=4, m=40, s=s, whiten=True)
    pf = reduce_to_projectors(nqf)
    assert isinstance(pf, ProjectorForm) and pf.holds
    # Y = 2[[0, Σ_xy],[Σ_yx, 0]] has eigenvalues ±2 s_a on (u_a, ±v_a)/√2; K(Π_a) acts as κ_a = 1
    np.testing.assert_allclose(np.sort(np.asarray(pf.gamma)), np.sort(2 * s), rtol=1e-10)
    np.testing.assert_allclose(pf.kappa, 1.0, rtol=1e-10)
    assert np.asarray(pf.rank).tolist() == [1, 1, 1]
    # ż_a = 2 z_a (γ_a − κ_a z_a) equals the projection of Ṁ = −HM − MH at M = Σ z_a Π_a,
    # and Ṁ stays in the span of the Π_a (an invariant family)
    Pi = np.asarray(pf.Pi)
    z = rng.uniform(0.1, 3.0, len(s))
    M = np.einsum("a,aij->ij", z, Pi)
    Md = direct_flow(nqf, M)
    zdot = np.einsum("aij,ij->a", Pi, Md) / np.asarray(pf.rank)
    np.testing.assert_allclose(zdot, pf.vector_field(0.0, z), atol=1e-10)
    np.testing.assert_allclose(Md, np.einsum("a,aij->ij", zdot, Pi), atol=1e-10)
    assert float(pf.loss(z)) == pytest.approx(direct_loss(nqf, M), rel=1e-12)
    lv = pf.lotka_volterra()  # in z'_a = Tr[Π_a M] = z_a (rank 1)
    r, C = np.asarray(lv.r), np.asarray(lv.C)
    np.testing.assert_allclose(z * (r - C @ z), zdot, atol=1e-10)
    assert z @ C @ z / 8 - r @ z / 4 + float(lv.y2) == pytest.approx(direct_loss(nqf, M), rel=1e-12)


def test_projectors_fail_without_whitening():
    rng = np.random.default_rng(5)
    nqf, _, _ = saxe_nqf(rng, n_in=5, k=4, m=40, s=np.array([3.0, 2.0, 1.0]), whiten=False)
    pf = reduce_to_projectors(nqf)
    assert not pf.holds and float(np.max(pf.k_residual)) > 1e-3
    with pytest.raises(lvflow.LvflowError, match="Thm 16"):
        pf.lotka_volterra()


def test_projectors_match_lv_for_diagonal_C():
    # Orthogonal features (Fig 3 left): Σ_μ λ_μk λ_μj ∝ δ_kj makes C diagonal, so the P-modes
    # with r_k > 0 are Thm 16 projectors with 2γ = r and 2κ = C_kk.
    rng = np.random.default_rng(6)
    m = p = 5
    O, _ = np.linalg.qr(rng.standard_normal((m, m)))
    Pb, _ = np.linalg.qr(rng.standard_normal((p, p)))
    A = np.einsum("ik,nk,jk->nij", Pb, O, Pb)
    nqf = lvflow.NQF(A, rng.standard_normal(m))
    lv = reduce_to_lv(nqf)
    pf = reduce_to_projectors(nqf)
    assert pf.holds
    pos = np.asarray(lv.r) > 0
    np.testing.assert_allclose(np.sort(2 * np.asarray(pf.gamma)), np.sort(np.asarray(lv.r)[pos]), rtol=1e-10)
    np.testing.assert_allclose(2 * np.asarray(pf.kappa), np.diag(np.asarray(lv.C))[pos], rtol=1e-10)


def test_projectors_merge_degenerate_singular_values():
    # s = (2, 2, 1): the two equal singular values give one rank-2 projector; in z'_a = Tr[Π_a M]
    # the diagonal gLV r = 2γ, C = 2κ/n_a reproduces both the flow and the loss.
    rng = np.random.default_rng(7)
    nqf, _, _ = saxe_nqf(rng, n_in=5, k=4, m=40, s=np.array([2.0, 2.0, 1.0]), whiten=True)
    pf = reduce_to_projectors(nqf)
    assert pf.holds and sorted(np.asarray(pf.rank).tolist()) == [1, 2]
    Pi = np.asarray(pf.Pi)
    z = rng.uniform(0.1, 3.0, len(Pi))
    M = np.einsum("a,aij->ij", z, Pi)
    zp = np.einsum("aij,ij->a", Pi, M)
    zpdot = np.einsum("aij,ij->a", Pi, direct_flow(nqf, M))
    lv = pf.lotka_volterra()
    r, C = np.asarray(lv.r), np.asarray(lv.C)
    np.testing.assert_allclose(zp * (r - C @ zp), zpdot, atol=1e-10)
    assert zp @ C @ zp / 8 - r @ zp / 4 + float(lv.y2) == pytest.approx(direct_loss(nqf, M), rel=1e-12)
    assert lv.P is None
