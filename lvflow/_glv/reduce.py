"""Reduce a neural quadratic form to Lotka–Volterra modes (Assumption 1, Eq. 31–32; Thm 16)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._core.errors import LvflowError, NotCommutingError
from .._form.nqf import NQF
from .lv import LotkaVolterra

# Eigenvalues of a random combination closer than this (relative) are refined by a second
# random combination restricted to their span: eigenvectors of nearly equal eigenvalues are
# ill-determined (error ~ 1e-16 / gap), but the span is accurate.
_CLUSTER_GAP = 1e-6


def _targets_checked(nqf: NQF, name: str) -> None:
    """Raise unless `nqf` is a ZGZ `NQF`."""
    if not isinstance(nqf, NQF):
        raise LvflowError(f"{name}: expected an lvflow.NQF, got {type(nqf).__name__}")
    if nqf.has_mu_terms:
        raise LvflowError(
            f"{name}: the NQF has μ-terms (g or B of Thm 12); the Lotka–Volterra reduction needs a "
            "ZGZ module, whose flow closes on M alone (Eq. 28)"
        )


def _targets(nqf: NQF, name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """`A` flattened to `(n, p, p)` over samples and output components, targets `y − f0` and `m`."""
    _targets_checked(nqf, name)
    p = nqf.p
    A = np.asarray(nqf.A, dtype=float).reshape(-1, p, p)
    t = (np.asarray(nqf.y, dtype=float) - np.asarray(nqf.f0, dtype=float)).reshape(-1)
    return A, t, nqf.m


def _joint_eigenbasis(A: np.ndarray, rng: np.random.Generator, depth: int = 0) -> np.ndarray:
    """An orthonormal basis that diagonalises every `A[i]` if they commute.

    Eigenvectors of a random combination `Σ c_i A_i` separate every pair of joint eigenvectors
    with different eigenvalue tuples (almost surely); a joint-degenerate space, on which every
    `A_i` is a multiple of the identity, may take any basis. Clusters of nearly equal
    eigenvalues are split again with a fresh combination restricted to their span.
    """
    n, p, _ = A.shape
    S = np.einsum("n,nij->ij", rng.standard_normal(n), A)
    w, P = np.linalg.eigh((S + S.T) / 2)
    if depth >= 4 or p == 1:
        return P
    scale = max(float(np.max(np.abs(w))), np.finfo(float).tiny)
    cuts = np.flatnonzero(np.diff(w) > _CLUSTER_GAP * scale) + 1
    for idx in np.split(np.arange(p), cuts):
        if idx.size > 1:
            Pc = P[:, idx]
            sub = np.einsum("ia,nij,jb->nab", Pc, A, Pc)
            P[:, idx] = Pc @ _joint_eigenbasis(sub, rng, depth + 1)
    return P


# Below this many structure matrices a failure reports the exact largest pairwise commutator.
_PAIRWISE = 256


def _not_commuting(A, scale: float, detail: str) -> NotCommutingError:
    norm = max_commutator_norm(A)
    err = NotCommutingError(
        f"A: the structure matrices share no eigenbasis (Assumption 1 fails): "
        f"max ‖[A_μ, A_ν]‖_F = {norm:.3g} (max|A| = {scale:.3g}); {detail}"
    )
    err.commutator_norm = norm
    return err


def _sums_np(nqf: NQF, w: np.ndarray) -> np.ndarray:
    """`Σ_μ w_iμ A_μ` (summed over outputs too) for each `w[i]` shaped like `y`, in numpy: the
    sums of `NQF.weighted_sum`, without compiling a program for a check that runs once."""
    if nqf.dense_A is not None:
        A = np.asarray(nqf.dense_A)
        return np.einsum("in,npq->ipq", w.reshape(len(w), -1), A.reshape(-1, *A.shape[-2:]))
    F, E = np.asarray(nqf.features), np.asarray(nqf.basis)
    if E.ndim == 4:  # shared features (m, D), a basis per output (k, D, p, p)
        return np.einsum("ikd,kdpq->ipq", np.einsum("imk,md->ikd", w, F), E)
    return np.einsum("id,dpq->ipq", w.reshape(len(w), -1) @ F.reshape(-1, F.shape[-1]), E)


def _dense_np(nqf: NQF) -> np.ndarray:
    """`A` of shape `(n, p, p)` (samples and outputs flattened), formed in numpy (as `NQF.A`)."""
    if nqf.dense_A is not None:
        A = np.asarray(nqf.dense_A, dtype=float)
    else:
        F, E = np.asarray(nqf.features, dtype=float), np.asarray(nqf.basis, dtype=float)
        A = np.einsum("md,cdij->mcij", F, E) if E.ndim == 4 else np.einsum("nd,dij->nij", F.reshape(-1, F.shape[-1]), E)
    return A.reshape(-1, A.shape[-1], A.shape[-1])


def _random_commutator(nqf: NQF, atol: float, rng: np.random.Generator) -> None:
    """Raise `NotCommutingError` when two random combinations `B = Σ_μ w_μ A_μ` do not commute.

    If every pair commutes so do all combinations; if some `[A_μ, A_ν] ≠ 0`, then `[B₁, B₂]`,
    a nonzero bilinear form in the Gaussian weights, is nonzero with probability one. Costs two
    weighted sums and one product instead of all `m²` pairs.
    """
    B1, B2 = _sums_np(nqf, rng.standard_normal((2,) + tuple(nqf.y.shape)))
    comm = np.linalg.norm(B1 @ B2 - B2 @ B1)
    bound = np.linalg.norm(B1) * np.linalg.norm(B2)
    if comm > atol * max(bound, np.finfo(float).tiny):
        n = int(np.prod(nqf.y.shape))
        detail = f"two random combinations B₁, B₂ of the A_μ have ‖[B₁, B₂]‖_F/(‖B₁‖‖B₂‖) = {comm / bound:.3g}"
        if n <= _PAIRWISE:
            A = _dense_np(nqf)
            raise _not_commuting(A, max(float(np.max(np.abs(A))), np.finfo(float).tiny), detail)
        err = NotCommutingError(f"A: the structure matrices share no eigenbasis (Assumption 1 fails): {detail}")
        err.commutator_norm = float(comm / bound)
        raise err


def max_commutator_norm(A) -> float:
    """`max_{μ,ν} ‖[A_μ, A_ν]‖_F` over a stack `(n, p, p)` (O(n² p³), chunked over μ; each pair
    once, `ν > μ`: `[A_ν, A_μ] = −[A_μ, A_ν]`)."""
    A = np.asarray(A, dtype=float)
    best = 0.0
    for i in range(len(A) - 1):
        a, rest = A[i], A[i + 1 :]
        comm = a @ rest - rest @ a
        best = max(best, float(np.max(np.sqrt(np.einsum("nij,nij->n", comm, comm)))))
    return best


def _canonical_signs(P: np.ndarray) -> np.ndarray:
    """Flip each column so its largest-magnitude entry is positive (a deterministic basis)."""
    i = np.argmax(np.abs(P), axis=0)
    return P * np.where(P[i, np.arange(P.shape[1])] < 0, -1.0, 1.0)


def reduce_to_lv(nqf: NQF, *, atol: float = 1e-10, seed: int = 0) -> LotkaVolterra:
    """The generalized Lotka–Volterra system of an NQF whose structure matrices commute.

    Under Assumption 1, `A(x_μ) = P Λ_μ Pᵀ` with `Λ_μ = diag(λ_{μ,k})` for one orthogonal `P`.
    Then `z_k = (Pᵀ M P)_kk` obeys (Eq. 31–32)

    `ż_k = z_k (r_k − Σ_j C_kj z_j)`,  `r_k = (8/m) Σ_μ (y_μ − f0_μ) λ_{μ,k}`,
    `C_kj = (8/m) Σ_μ λ_{μ,k} λ_{μ,j}`,

    with the sums running over output components too for vector outputs (`A` of shape
    `(m, k, p, p)`, Cor. 1), and the loss is `L = zᵀCz/8 − rᵀz/4 + y2`, `y2 = (1/m) Σ (y − f0)²`.

    The common eigenbasis comes from a random combination `Σ c_μ A_μ` (clusters of nearly equal
    eigenvalues are split again), then every `Pᵀ A_μ P` is checked to be diagonal. Modes that
    no sample touches (`λ_{μ,k} = 0` for all `μ`: the common null space) are **dropped**: their
    `z_k` never moves and never enters the loss. The returned modes are ordered by decreasing
    `r_k` (then decreasing `C_kk`), and `P` (shape `(p, K)`) is stored on the system, so that
    `M = P diag(z) Pᵀ` is the NQF state of mode vector `z`.

    **Arguments:**

    - `nqf`: a ZGZ `lvflow.NQF` (no `g`, `B`).
    - `atol`: off-diagonal entries of `Pᵀ A_μ P`, and `λ`'s counted as zero, are bounded by
      `atol · max|A|`.
    - `seed`: seed of the random combination (the result does not depend on it beyond the
      arbitrary basis of joint-degenerate spaces).

    **Raises:** `NotCommutingError` with the largest `‖[A_μ, A_ν]‖_F` when no common eigenbasis
    exists (its `commutator_norm` attribute holds the number); `LvflowError` for an NQF with
    μ-terms.
    """
    _targets_checked(nqf, "nqf")
    _random_commutator(nqf, atol, np.random.default_rng(seed))
    A, t, m = _targets(nqf, "nqf")
    scale = max(float(np.max(np.abs(A))), np.finfo(float).tiny) if A.size else 1.0
    P = _joint_eigenbasis(A, np.random.default_rng(seed))
    Lam = np.einsum("ik,nij,jl->nkl", P, A, P)
    lam = np.einsum("nkk->nk", Lam)
    off = float(np.max(np.abs(Lam - lam[:, :, None] * np.eye(A.shape[-1])))) if A.size else 0.0
    if off > atol * scale:
        raise _not_commuting(A, scale, f"best common basis leaves off-diagonal entries up to {off:.3g}")
    used = np.max(np.abs(lam), axis=0) > atol * scale
    P, lam = P[:, used], lam[:, used]
    r = 8.0 / m * t @ lam
    C = 8.0 / m * lam.T @ lam
    order = np.lexsort((-np.diag(C), -r))
    P, r, C = _canonical_signs(P[:, order]), r[order], C[np.ix_(order, order)]
    return LotkaVolterra(r, (C + C.T) / 2, y2=float(t @ t) / m, P=P, check=False)


class ProjectorForm(eqx.Module):
    """The projector reduction of Thm 16 and how well its conditions hold.

    Orthogonal projectors `Π_a` with `Y Π_a + Π_a Y = 2 γ_a Π_a` and
    `K(Π_b) Π_a + Π_a K(Π_b) = 2 κ_a δ_ab Π_a` make `M = Σ_a z_a Π_a` an invariant family with
    `ż_a = 2 z_a (γ_a − κ_a z_a)` (Thm 16; Saxe's `ρ̇_a = 4ρ_a(τ_a − c_aρ_a)`, Cor. 4).

    **Fields:**

    - `Pi`: the projectors, shape `(n, p, p)`; `rank`: their ranks `n_a`.
    - `gamma`, `kappa`: `γ_a`, and `κ_a = ⟨Π_a, K(Π_a)⟩ / n_a`.
    - `y_residual[a]`: `‖Y Π_a + Π_a Y − 2 γ_a Π_a‖_F`.
    - `k_residual[a, b]`: `‖K(Π_b) Π_a + Π_a K(Π_b) − 2 κ_a δ_ab Π_a‖_F`.
    - `holds`: whether every residual is below `atol · ‖Y‖ or ‖K‖` (then Thm 16 applies).
    - `y2`: `(1/m) Σ (y − f0)²`.
    """

    Pi: Float[Array, "n p p"]
    rank: Int[Array, " n"]
    gamma: Float[Array, " n"]
    kappa: Float[Array, " n"]
    y_residual: Float[Array, " n"]
    k_residual: Float[Array, "n n"]
    y2: Float[Array, ""]
    holds: bool = eqx.field(static=True)

    def vector_field(self, t, z: Float[ArrayLike, " n"], args=None) -> Float[Array, " n"]:
        """`ż_a = 2 z_a (γ_a − κ_a z_a)` (Thm 16)."""
        z = jnp.asarray(z)
        return 2 * z * (self.gamma - self.kappa * z)

    def loss(self, z: Float[ArrayLike, "*b n"]) -> Float[Array, "*b"]:
        """`L(Σ z_a Π_a) = Σ_a n_a (κ_a z_a²/4 − γ_a z_a/2) + y2` (cross terms vanish under Thm 16)."""
        z = jnp.asarray(z)
        n = self.rank.astype(z.dtype)
        return (n * (self.kappa * z**2 / 4 - self.gamma * z / 2)).sum(-1) + self.y2

    def lotka_volterra(self) -> LotkaVolterra:
        """The same flow as a diagonal gLV in `z'_a = Tr[Π_a M] = n_a z_a`:
        `r_a = 2γ_a`, `C_aa = 2κ_a / n_a`, whose loss `z'ᵀCz'/8 − rᵀz'/4 + y2` is `L` as well.
        `P` is set (to the unit vectors) only when every projector has rank 1.

        **Raises:** `LvflowError` when the conditions of Thm 16 do not hold.
        """
        if not self.holds:
            raise LvflowError(
                "projectors: the conditions of Thm 16 do not hold "
                f"(max Y residual {float(jnp.max(self.y_residual)):.3g}, "
                f"max K residual {float(jnp.max(self.k_residual)):.3g}); no diagonal gLV"
            )
        P = None
        if bool(jnp.all(self.rank == 1)):
            w, V = np.linalg.eigh(np.asarray(self.Pi))
            P = _canonical_signs(V[:, :, -1].T)
        return LotkaVolterra(
            2 * self.gamma, jnp.diag(2 * self.kappa / self.rank.astype(self.kappa.dtype)), y2=self.y2, P=P, check=False
        )


def reduce_to_projectors(nqf: NQF, *, atol: float = 1e-8) -> ProjectorForm:
    """Look for the projector form of Thm 16 and verify its conditions numerically.

    The candidates are the eigenspaces of `Y = (4/m) Σ_μ (y_μ − f0_μ) A_μ` (Eq. 252) with
    `γ_a > 0` — the directions that grow from small initialisation; directions with `γ ≤ 0`
    stay at `z = 0` on the invariant family and are left out (in the two-layer / Saxe case
    `A = ½[[0, C],[Cᵀ, 0]]` the `P`-modes come in `±` pairs, and the `−` partner of each
    mode would violate the `a ≠ b` condition). Degenerate eigenvalues of `Y` (relative gap
    below `atol`) are merged into one projector of rank `n_a > 1`. Every condition is then
    evaluated with `K(X) = (4/m) Σ_μ ⟨A_μ, X⟩ A_μ`; `holds` says whether all are met.

    For a two-layer linear network on whitened inputs (Saxe), `γ_a = 2 s_a` for the singular
    values `s_a` of `Σ_yx` and `κ_a = 1`. With commuting `A_μ` and diagonal `C`, the projectors
    are the `P`-modes of `reduce_to_lv` with `2γ = r`, `2κ = C_kk`.
    """
    A, t, m = _targets(nqf, "nqf")
    p = A.shape[-1]
    Y = 4.0 / m * np.einsum("n,nij->ij", t, A)
    w, V = np.linalg.eigh((Y + Y.T) / 2)
    yscale = max(float(np.max(np.abs(w))), np.finfo(float).tiny)
    cuts = np.flatnonzero(np.diff(w) > atol * yscale) + 1
    groups = [g for g in np.split(np.arange(p), cuts) if np.mean(w[g]) > atol * yscale]
    Pi = np.stack([V[:, g] @ V[:, g].T for g in groups]) if groups else np.zeros((0, p, p))
    rank = np.array([len(g) for g in groups], dtype=int)
    gamma = np.array([np.mean(w[g]) for g in groups])
    # K(Π_b) for every b: coefficients ⟨A_μ, Π_b⟩ then one contraction.
    coef = np.einsum("nij,bij->nb", A, Pi)
    KPi = 4.0 / m * np.einsum("nb,nij->bij", coef, A)
    kappa = np.einsum("aij,aij->a", Pi, KPi) / np.maximum(rank, 1)
    eye = np.eye(len(groups))
    sym = lambda X, Q: X @ Q + Q @ X
    y_res = np.array([np.linalg.norm(sym(Y, Pi[a]) - 2 * gamma[a] * Pi[a]) for a in range(len(groups))])
    k_res = np.array(
        [
            [np.linalg.norm(sym(KPi[b], Pi[a]) - 2 * kappa[a] * eye[a, b] * Pi[a]) for b in range(len(groups))]
            for a in range(len(groups))
        ]
    ).reshape(len(groups), len(groups))
    kscale = max(float(np.max(np.abs(KPi))) if KPi.size else 0.0, np.finfo(float).tiny)
    holds = bool(np.all(y_res <= atol * yscale * np.sqrt(p)) and np.all(k_res <= atol * kscale * np.sqrt(p)))
    return ProjectorForm(
        Pi=jnp.asarray(Pi),
        rank=jnp.asarray(rank),
        gamma=jnp.asarray(gamma),
        kappa=jnp.asarray(kappa),
        y_residual=jnp.asarray(y_res),
        k_residual=jnp.asarray(k_res),
        y2=jnp.asarray(float(t @ t) / m),
        holds=holds,
    )
