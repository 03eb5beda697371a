"""The interaction matrix `C` of the gLV (Eq. 32) in the structure its solvers exploit: diagonal,
diagonal plus low rank, or dense."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array, ArrayLike, Bool, Float, Int

_U_CLIP = 300.0  # ln z: far above any saturated z (r/C), far below float64 overflow of C e^u


def exp_clipped(u):
    """`e^u` with `u` clipped at 300: trial stages of an overshooting step must not overflow."""
    return jnp.exp(jnp.minimum(u, _U_CLIP))


def _scale(d: Float[Array, " K"], z: Float[Array, "*b K"]) -> Float[Array, "*b K"]:
    """`d ⊙ z` over any leading batch axes of `z` (broadcast made explicit)."""
    return jnp.broadcast_to(d, z.shape) * z


_UNROLL_Q = 8  # up to this rank the Woodbury solve's small products and factorisation are unrolled


def _vecmat(x: Float[Array, " K"], AT: Float[Array, "q K"]) -> Float[Array, " q"]:
    """`Aᵀ x` from `Aᵀ` (rows of length `K`): a matrix-vector product contracting the contiguous
    axis (under `vmap` one batched product, not a multiply followed by a reduction)."""
    return AT @ x


def _matvec(AT: Float[Array, "q K"], y: Float[Array, " q"]) -> Float[Array, " K"]:
    """`A y` from `Aᵀ`: for a small rank a sum of `q` scaled rows (elementwise, vectorised along `K`;
    under `vmap` no reduction over a short trailing axis and no batched dot), else a dot."""
    q = AT.shape[0]
    if q > _UNROLL_Q or q == 0:  # q = 0: a diagonal C, `A y` is the zero vector
        return y @ AT
    return _sum(AT[p] * y[p] for p in range(q))


def _sum(terms: Iterable[Array]) -> Array:
    """`0 + t₀ + t₁ + …` over at least one term, each computed when added: the program Python's
    `sum` traces, typed as an array (`sum`'s type is `Array | int`)."""
    it = iter(terms)
    total = 0 + next(it)
    for term in it:
        total = total + term
    return total


def _minus(x: Array, terms: Iterable[Array]) -> Array:
    """`x − (0 + t₀ + t₁ + …)`, `x − 0` for no terms (Python's `sum` of the terms subtracted)."""
    total: Array | int = 0
    for term in terms:
        total = total + term
    return x - total


def _spd_inverse(S: Float[Array, "q q"]) -> Float[Array, "q q"]:
    """Inverse of a small SPD matrix via its Cholesky factor `S = L Lᵀ`, `S⁻¹ = L⁻ᵀ L⁻¹`.

    Up to rank `_UNROLL_Q` the factorisation is written out entry by entry: elementwise
    arithmetic that XLA fuses, and that `vmap` turns into arithmetic on batch vectors rather than a
    batched LAPACK call per step.
    """
    q = S.shape[0]
    if q > _UNROLL_Q:
        factor = jnp.linalg.cholesky(S)
        Linv = jax.scipy.linalg.solve_triangular(factor, jnp.eye(q, dtype=S.dtype), lower=True)
        return Linv.T @ Linv
    L: dict[tuple[int, int], Array] = {}  # L[i, j], j ≤ i
    inv_diag: list[Array] = []
    for j in range(q):
        inv_diag.append(jax.lax.rsqrt(_minus(S[j, j], (L[j, m] * L[j, m] for m in range(j)))))
        L[j, j] = 1.0 / inv_diag[j]
        for i in range(j + 1, q):
            L[i, j] = _minus(S[i, j], (L[i, m] * L[j, m] for m in range(j))) * inv_diag[j]
    Li: dict[tuple[int, int], Array] = {}  # L⁻¹, lower triangular
    for i in range(q):
        Li[i, i] = inv_diag[i]
        for j in range(i):
            Li[i, j] = -_sum(L[i, m] * Li[m, j] for m in range(j, i)) * inv_diag[i]
    rows = [[_sum(Li[m, i] * Li[m, j] for m in range(max(i, j), q)) for j in range(q)] for i in range(q)]
    return jnp.stack([jnp.stack(row) for row in rows])


_TINY = np.finfo(float).tiny


def _masked_solve(C: Float[Array, "K K"], F: Bool[Array, " K"], b: Float[Array, " K"]) -> Float[Array, " K"]:
    """`x` with `x_F = C_FF⁻¹ b_F` and `x = 0` off `F` (one `K × K` solve: `C_FF` bordered by `I`)."""
    K = C.shape[0]
    A = jnp.where(F[:, None] & F[None, :], C, jnp.eye(K, dtype=C.dtype))
    return jnp.where(F, jnp.linalg.solve(A, jnp.where(F, b, 0.0)), 0.0)


def _masked_positive_definite(C: Float[Array, "K K"], T: Bool[Array, " K"], rtol: float) -> Bool[Array, ""]:
    """Whether `λ_min(C_TT) > rtol · max_k C_kk` for a symmetric `C` (Cholesky of the shifted block,
    bordered by a multiple of `I`; NaN entries when it fails)."""
    K = C.shape[0]
    if K == 0:
        return jnp.asarray(True)
    top = jnp.maximum(jnp.max(jnp.diagonal(C)), _TINY)
    eye = jnp.eye(K, dtype=C.dtype)
    A = jnp.where(T[:, None] & T[None, :], (C + C.T) / 2, (1 + rtol) * top * eye)
    return jnp.all(jnp.isfinite(jnp.linalg.cholesky(A - rtol * top * eye)))


class AbstractInteraction(eqx.Module):
    """`C` as the gLV's solvers apply it: products `C z`, solves with `α I + C Diag(z)` (the ODE),
    and the diagonal, columns and solves on a support that the saturated equilibrium's active-set
    method (`saturated_equilibrium`, Eq. 32) needs.

    Final subclasses: `DiagonalInteraction`, `LowRankInteraction`, `DenseInteraction`.
    """

    @abc.abstractmethod
    def Cz(self, z: Float[Array, "*b K"]) -> Float[Array, "*b K"]:
        """`C z` (over a leading batch of states too)."""

    @abc.abstractmethod
    def shifted_solver(
        self, alpha: Float[ArrayLike, ""], z: Float[Array, " K"]
    ) -> Callable[[Float[Array, " K"]], Float[Array, " K"]]:
        """`b ↦ (α I + C Diag(z))⁻¹ b`: `α I − J` for the Jacobian `J = −C Diag(e^u)` of
        `u̇ = r − C e^u`, factorised once and applied to many right-hand sides."""

    @abc.abstractmethod
    def diagonal(self) -> Float[Array, " K"]:
        """The diagonal `C_kk`."""

    @abc.abstractmethod
    def column(self, k: Int[Array, ""] | int) -> Float[Array, " K"]:
        """The column `C[:, k]` (`k` may be traced)."""

    @abc.abstractmethod
    def solve_on(self, F: Bool[Array, " K"], b: Float[Array, " K"]) -> Float[Array, " K"]:
        """`x` with `x_F = C_FF⁻¹ b_F` on the support `F` (a mask; `C_FF` nonsingular) and 0 off it."""

    @abc.abstractmethod
    def positive_definite_on(self, T: Bool[Array, " K"], rtol: float) -> Bool[Array, ""]:
        """Whether `C_TT` is positive definite: `λ_min(C_TT) > rtol · max_k C_kk`."""


class DiagonalInteraction(AbstractInteraction):
    """`C = Diag(d)`: products and solves in `O(K)`."""

    d: Float[Array, " K"]

    def __init__(self, d: Float[ArrayLike, " K"]):
        self.d = jnp.asarray(d)

    def Cz(self, z):
        return _scale(self.d, z)

    def shifted_solver(self, alpha, z):
        inv = 1.0 / (alpha + self.d * z)
        return lambda b: inv * b

    def diagonal(self):
        return self.d

    def column(self, k):
        return jnp.where(jnp.arange(self.d.shape[0]) == k, self.d[k], 0.0)

    def solve_on(self, F, b):
        return jnp.where(F, b / jnp.where(F, self.d, 1.0), 0.0)

    def positive_definite_on(self, T, rtol):
        top = jnp.maximum(jnp.max(self.d, initial=0.0), _TINY)
        return jnp.all(~T | (self.d > rtol * top))


class LowRankInteraction(AbstractInteraction):
    """`C = Diag(d) + U Uᵀ`: products in `O(K q)`, solves by Woodbury in `O(K q²)`.

    `U` is kept as `Uᵀ` (`UT`, rows of length `K`): every product then runs along the contiguous
    axis, also under `vmap`. Solves on a support are Woodbury's, `O(K q²)`, when `d > 0`; a
    concrete `d` with an entry `≤ 0` (a singular `C = UUᵀ`, say) is solved densely instead
    (`K²` memory), decided here once (a traced `d` is taken as positive, as
    `LowRankLotkaVolterra` requires).

    **Arguments:** `d`, shape `(K,)`; `U`, shape `(K, q)`.
    """

    d: Float[Array, " K"]
    UT: Float[Array, "q K"]
    woodbury: bool = eqx.field(static=True)

    def __init__(self, d: Float[ArrayLike, " K"], U: Float[ArrayLike, "K q"]):
        self.woodbury = isinstance(d, Tracer) or bool(np.all(np.asarray(d) > 0))
        self.d = jnp.asarray(d)
        self.UT = jnp.asarray(U).T

    def Cz(self, z):
        if z.ndim == 1:
            return self.d * z + _matvec(self.UT, _vecmat(z, self.UT))
        return _scale(self.d, z) + (z @ self.UT.T) @ self.UT

    def shifted_solver(self, alpha, z):
        # (Δ + U (ZU)ᵀ)⁻¹ b = x − W S⁻¹ (ZU)ᵀ x with Δ = Diag(α + d z), x = Δ⁻¹ b, W = Δ⁻¹ U and the
        # capacitance S = I + (ZU)ᵀ W (I plus a PSD matrix: Cholesky, well conditioned). S⁻¹ is
        # folded into W once, so each solve is two passes over (q, K) rows. Everything is laid out
        # as rows of length K (Uᵀ), so that the reductions run along the contiguous axis.
        inv = 1.0 / (alpha + self.d * z)
        UT = self.UT
        ZUT = UT * z[None, :]
        q = UT.shape[0]
        WT = UT * inv[None, :]
        # S's columns as q matrix-vector products (under vmap a batched product of q × q blocks
        # is much slower on a CPU than q batched matrix-vector products)
        ZUW = jnp.stack([ZUT @ WT[p] for p in range(q)], axis=1) if 0 < q <= _UNROLL_Q else ZUT @ WT.T
        S = jnp.eye(q, dtype=z.dtype) + ZUW
        S_inv = _spd_inverse(S)
        # (W S⁻¹)ᵀ = S⁻¹ Wᵀ (S symmetric), row by row for a small rank
        WST = jnp.stack([_matvec(WT, S_inv[p]) for p in range(q)]) if q <= _UNROLL_Q else S_inv @ WT

        def solve(b):
            x = inv * b
            return x - _matvec(WST, _vecmat(x, ZUT))

        return solve

    def diagonal(self):
        return self.d + jnp.sum(self.UT**2, axis=0)

    def column(self, k):
        return self.UT.T @ self.UT[:, k] + jnp.where(jnp.arange(self.d.shape[0]) == k, self.d[k], 0.0)

    def _dense(self) -> Float[Array, "K K"]:
        return jnp.diag(self.d) + self.UT.T @ self.UT

    def solve_on(self, F, b):
        if not self.woodbury:
            return _masked_solve(self._dense(), F, b)
        # C_FF⁻¹ b_F = D⁻¹b − D⁻¹U (I + UᵀD⁻¹U)⁻¹ UᵀD⁻¹b on F (Woodbury), with U's rows off F zeroed
        dF = jnp.where(F, self.d, 1.0)
        x = jnp.where(F, b, 0.0) / dF
        UT = jnp.where(F[None, :], self.UT, 0.0)
        q = UT.shape[0]
        if q == 0:
            return x
        DUT = UT / dF[None, :]
        S = jnp.eye(q, dtype=UT.dtype) + UT @ DUT.T
        return x - jnp.linalg.solve(S, UT @ x) @ DUT

    def positive_definite_on(self, T, rtol):
        positive = jnp.all(~T | (self.d > 0))  # Diag(d_T) + U_T U_Tᵀ with d_T > 0
        if self.woodbury:
            return positive
        return positive | _masked_positive_definite(self._dense(), T, rtol)


class DenseInteraction(AbstractInteraction):
    """A general `C`: products in `O(K²)`, solves by LU in `O(K³)`."""

    C: Float[Array, "K K"]

    def __init__(self, C: Float[ArrayLike, "K K"]):
        self.C = jnp.asarray(C)

    def Cz(self, z):
        return z @ self.C.T

    def shifted_solver(self, alpha, z):
        lu = jax.scipy.linalg.lu_factor(alpha * jnp.eye(z.shape[-1], dtype=z.dtype) + self.C * z[None, :])
        return lambda b: jax.scipy.linalg.lu_solve(lu, b)

    def diagonal(self):
        return jnp.diagonal(self.C)

    def column(self, k):
        return self.C[:, k]

    def solve_on(self, F, b):
        return _masked_solve(self.C, F, b)

    def positive_definite_on(self, T, rtol):
        return _masked_positive_definite(self.C, T, rtol)
