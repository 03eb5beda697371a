"""The interaction matrix `C` of the gLV (Eq. 32) in the structure its solvers exploit: diagonal,
diagonal plus low rank, or dense."""

from __future__ import annotations

import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

_U_CLIP = 300.0  # ln z: far above any saturated z (r/C), far below float64 overflow of C e^u


def exp_clipped(u):
    """`e^u` with `u` clipped at 300: trial stages of an overshooting step must not overflow."""
    return jnp.exp(jnp.minimum(u, _U_CLIP))


def _scale(d: Float[ArrayLike, " K"], z: Float[ArrayLike, "*b K"]) -> Float[Array, "*b K"]:
    """`d ⊙ z` over any leading batch axes of `z` (broadcast made explicit)."""
    return jnp.broadcast_to(d, z.shape) * z


_UNROLL_Q = 8  # up to this rank the Woodbury solve's small products and factorisation are unrolled


def _vecmat(x: Float[ArrayLike, " K"], AT: Float[ArrayLike, "q K"]) -> Float[Array, " q"]:
    """`Aᵀ x` from `Aᵀ` (rows of length `K`): a matrix-vector product contracting the contiguous
    axis (under `vmap` one batched product, not a multiply followed by a reduction)."""
    return AT @ x


def _matvec(AT: Float[ArrayLike, "q K"], y: Float[ArrayLike, " q"]) -> Float[Array, " K"]:
    """`A y` from `Aᵀ`: for a small rank a sum of `q` scaled rows (elementwise, vectorised along `K`;
    under `vmap` no reduction over a short trailing axis and no batched dot), else a dot."""
    q = AT.shape[0]
    if q > _UNROLL_Q or q == 0:  # q = 0: a diagonal C, `A y` is the zero vector
        return y @ AT
    return sum(AT[p] * y[p] for p in range(q))


def _spd_inverse(S: Float[ArrayLike, "q q"]) -> Float[Array, "q q"]:
    """Inverse of a small SPD matrix via its Cholesky factor `S = L Lᵀ`, `S⁻¹ = L⁻ᵀ L⁻¹`.

    Up to rank `_UNROLL_Q` the factorisation is written out entry by entry: elementwise
    arithmetic that XLA fuses, and that `vmap` turns into arithmetic on batch vectors rather than a
    batched LAPACK call per step.
    """
    q = S.shape[0]
    if q > _UNROLL_Q:
        L = jnp.linalg.cholesky(S)
        Linv = jax.scipy.linalg.solve_triangular(L, jnp.eye(q, dtype=S.dtype), lower=True)
        return Linv.T @ Linv
    L = [[None] * q for _ in range(q)]  # L[i][j], j ≤ i
    inv_diag = [None] * q
    for j in range(q):
        inv_diag[j] = jax.lax.rsqrt(S[j, j] - sum(L[j][m] * L[j][m] for m in range(j)))
        L[j][j] = 1.0 / inv_diag[j]
        for i in range(j + 1, q):
            L[i][j] = (S[i, j] - sum(L[i][m] * L[j][m] for m in range(j))) * inv_diag[j]
    Li = [[None] * q for _ in range(q)]  # L⁻¹, lower triangular
    for i in range(q):
        Li[i][i] = inv_diag[i]
        for j in range(i):
            Li[i][j] = -sum(L[i][m] * Li[m][j] for m in range(j, i)) * inv_diag[i]
    rows = [[sum(Li[m][i] * Li[m][j] for m in range(max(i, j), q)) for j in range(q)] for i in range(q)]
    return jnp.stack([jnp.stack(row) for row in rows])


class AbstractInteraction(eqx.Module):
    """`C` as the gLV's solvers apply it: products `C z` and solves with `α I + C Diag(z)`."""

    @abc.abstractmethod
    def Cz(self, z: Float[ArrayLike, "*b K"]) -> Float[Array, "*b K"]:
        """`C z` (over a leading batch of states too)."""

    @abc.abstractmethod
    def shifted_solver(
        self, alpha: Float[ArrayLike, ""], z: Float[ArrayLike, " K"]
    ) -> Callable[[Float[Array, " K"]], Float[Array, " K"]]:
        """`b ↦ (α I + C Diag(z))⁻¹ b`: `α I − J` for the Jacobian `J = −C Diag(e^u)` of
        `u̇ = r − C e^u`, factorised once and applied to many right-hand sides."""


class DiagonalInteraction(AbstractInteraction):
    """`C = Diag(d)`: products and solves in `O(K)`."""

    d: Float[Array, " K"]

    def Cz(self, z):
        return _scale(self.d, z)

    def shifted_solver(self, alpha, z):
        inv = 1.0 / (alpha + self.d * z)
        return lambda b: inv * b


class LowRankInteraction(AbstractInteraction):
    """`C = Diag(d) + U Uᵀ`: products in `O(K q)`, solves by Woodbury in `O(K q²)`.

    `U` is kept as `Uᵀ` (`UT`, rows of length `K`): every product then runs along the contiguous
    axis, also under `vmap`.

    **Arguments:** `d`, shape `(K,)`; `U`, shape `(K, q)`.
    """

    d: Float[Array, " K"]
    UT: Float[Array, "q K"]

    def __init__(self, d: Float[ArrayLike, " K"], U: Float[ArrayLike, "K q"]):
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


class DenseInteraction(AbstractInteraction):
    """A general `C`: products in `O(K²)`, solves by LU in `O(K³)`."""

    C: Float[Array, "K K"]

    def Cz(self, z):
        return z @ self.C.T

    def shifted_solver(self, alpha, z):
        lu = jax.scipy.linalg.lu_factor(alpha * jnp.eye(z.shape[-1], dtype=z.dtype) + self.C * z[None, :])
        return lambda b: jax.scipy.linalg.lu_solve(lu, b)


def is_diagonal(C: np.ndarray) -> bool:
    """Whether the concrete square matrix `C` has no non-zero off-diagonal entry."""
    K = C.shape[0]
    # The off-diagonal entries, as a strided view: flat[1:] in rows of K + 1, minus the last column.
    return K < 2 or not np.any(np.ascontiguousarray(C).ravel()[1:].reshape(K - 1, K + 1)[:, :-1])
