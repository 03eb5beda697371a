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


def _vecmat(x: Float[ArrayLike, " K"], A: Float[ArrayLike, "K q"]) -> Float[Array, " q"]:
    return jnp.sum(x[:, None] * A, axis=0)


def _matvec(A: Float[ArrayLike, "K q"], y: Float[ArrayLike, " q"]) -> Float[Array, " K"]:
    return jnp.sum(A * y[None, :], axis=1)


def _spd_inverse(S: Float[ArrayLike, "q q"]) -> Float[Array, "q q"]:
    """Inverse of a small SPD matrix via its Cholesky factor."""
    L = jnp.linalg.cholesky(S)
    Linv = jax.scipy.linalg.solve_triangular(L, jnp.eye(S.shape[0], dtype=S.dtype), lower=True)
    return Linv.T @ Linv


_UNROLL_Q = 16  # up to this rank W S⁻¹ is formed by broadcast products, not a dot


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
    """`C = Diag(d) + U Uᵀ`: products in `O(K q)`, solves by Woodbury in `O(K q²)`."""

    d: Float[Array, " K"]
    U: Float[Array, "K q"]

    def Cz(self, z):
        if z.ndim == 1:  # a skinny (K, q) product as multiply-and-reduce: XLA fuses it, a dot it does not
            return self.d * z + _matvec(self.U, _vecmat(z, self.U))
        return _scale(self.d, z) + (z @ self.U) @ self.U.T

    def shifted_solver(self, alpha, z):
        # (Δ + U (ZU)ᵀ)⁻¹ b = x − W S⁻¹ (ZU)ᵀ x with Δ = Diag(α + d z), x = Δ⁻¹ b, W = Δ⁻¹ U and the
        # capacitance S = I + (ZU)ᵀ W (I plus a PSD matrix: Cholesky, well conditioned). S⁻¹ is
        # folded into W once, so each solve is two fused (K, q) multiply-and-reduce passes.
        inv = 1.0 / (alpha + self.d * z)
        W = inv[:, None] * self.U
        ZU = z[:, None] * self.U
        q = self.U.shape[1]
        S_inv = _spd_inverse(jnp.eye(q, dtype=z.dtype) + jnp.einsum("kp,kq->pq", ZU, W))
        # W S⁻¹ as q broadcast products (a batched dot under vmap is slow on XLA's CPU backend).
        WS = sum(W[:, p, None] * S_inv[p][None, :] for p in range(q)) if q <= _UNROLL_Q else W @ S_inv

        def solve(b):
            x = inv * b
            return x - _matvec(WS, _vecmat(x, ZU))

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
