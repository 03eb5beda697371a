"""Exactly quadratic modules: phase retrieval, diagonal linear nets, matrix sensing (Table 3).

Each is a quadratic form in every neuron, so `f_x(W) = Tr[W Wᵀ A(x)]` holds exactly, not only
to second order.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from ._base import AbstractArchitecture, AbstractVectorInput, bilinear, check_input, check_size, init_W, unpack


class _AbstractScalarOutput(AbstractArchitecture):
    """An architecture with a scalar output."""

    @property
    def out_size(self) -> None:
        return None


class _AbstractInputSpace(AbstractVectorInput, _AbstractScalarOutput):
    """Neurons that live in the input space, `w ∈ R^n` (`p = n`), with a scalar output."""

    @property
    def in_size(self) -> int:
        """Input dimension `n` (= `p`)."""
        return self.p


class QuadraticNet(_AbstractInputSpace):
    """Quadratic network / phase retrieval `f(x) = Σ_r (w_rᵀ x)²`; `A(x) = x xᵀ`.

    **Arguments:** `in_size` `n`, `width` `d`; `key`, `init_scale`: `W ~ N(0, init_scale²)`.
    """

    W: Float[Array, "n d"]

    def __init__(self, in_size, width, *, key: PRNGKeyArray, init_scale=0.01):
        self.W = init_W(key, check_size("in_size", in_size), check_size("width", width), init_scale)

    def unit(self, w: Float[ArrayLike, " n"], x: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        return (jnp.asarray(w) @ jnp.asarray(x)) ** 2

    def __call__(self, x: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        x = self._check(x)
        return jnp.sum((x @ self.W) ** 2)

    def structure(self, x: Float[ArrayLike, " n"]) -> Float[Array, "n n"]:
        x = self._check(x, dtype=self.W.dtype)
        return jnp.outer(x, x)


class DiagonalLinear(_AbstractInputSpace):
    """Diagonal linear network `f(x) = Σ_i Σ_k x_k u_{ik}² / 4`; `A(x) = ¼ Diag(x)`.

    The effective linear predictor is `β = Σ_i u_i ⊙ u_i / 4`, `f(x) = βᵀ x`.

    **Arguments:** `in_size` `n`, `width` `d` (default 1); `key`, `init_scale`.
    """

    W: Float[Array, "n d"]

    def __init__(self, in_size, width=1, *, key: PRNGKeyArray, init_scale=0.01):
        self.W = init_W(key, check_size("in_size", in_size), check_size("width", width), init_scale)

    def unit(self, w: Float[ArrayLike, " n"], x: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        w = jnp.asarray(w)
        return jnp.asarray(x) @ (w * w) / 4

    def __call__(self, x: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        x = self._check(x)
        return x @ jnp.sum(self.W * self.W, axis=1) / 4

    def structure(self, x: Float[ArrayLike, " n"]) -> Float[Array, "n n"]:
        x = self._check(x, dtype=self.W.dtype)
        return jnp.diag(x) / 4


class SignedDiagonal(AbstractVectorInput, _AbstractScalarOutput):
    """Signed diagonal network `f(x) = Σ_i u_iᵀ Diag(x) v_i`; neuron `[u, v]`,

    `A(x) = ½ [[0, Diag x], [Diag x, 0]]`.

    **Arguments:** `in_size` `n`, `width` `d` (default 1); `key`, `init_scale`.
    """

    W: Float[Array, "p d"]
    in_size: int = eqx.field(static=True)

    def __init__(self, in_size, width=1, *, key: PRNGKeyArray, init_scale=0.01):
        self.in_size = check_size("in_size", in_size)
        self.W = init_W(key, 2 * self.in_size, check_size("width", width), init_scale)

    def unit(self, w: Float[ArrayLike, " p"], x: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        u, v = unpack(w, [(self.in_size,)] * 2)
        return jnp.sum(u * x * v)

    def __call__(self, x: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        x = self._check(x)
        U, V = unpack(self.W, [(self.in_size,)] * 2)
        return jnp.sum(U * x[:, None] * V)

    def structure(self, x: Float[ArrayLike, " n"]) -> Float[Array, "p p"]:
        x = self._check(x, dtype=self.W.dtype)
        n = self.in_size
        return bilinear(self.p, (0, n), (n, 2 * n), jnp.diag(x))


class MatrixSensing(_AbstractScalarOutput):
    """Symmetric (PSD) matrix sensing `f(S) = ⟨S, W Wᵀ⟩ = Tr[Sᵀ W Wᵀ]`; `A(S) = Sym(S) = (S + Sᵀ)/2`.

    `W ∈ R^{n×r}`: the `r` columns (rows of the paper's factor) are the neurons; the input is a
    sensing matrix `S ∈ R^{n×n}`.

    **Arguments:** `size` `n`, `rank` `r`; `key`, `init_scale`.
    """

    W: Float[Array, "n r"]

    def __init__(self, size, rank, *, key: PRNGKeyArray, init_scale=0.01):
        self.W = init_W(key, check_size("size", size), check_size("rank", rank), init_scale)

    def sample_shape(self, *, seq_len: int | None = None) -> tuple[int, int]:
        return (self.p, self.p)

    def unit(self, w: Float[ArrayLike, " n"], S: Float[ArrayLike, "n n"]) -> Float[Array, ""]:
        w = jnp.asarray(w)
        return w @ jnp.asarray(S) @ w

    def __call__(self, S: Float[ArrayLike, "n n"]) -> Float[Array, ""]:
        S = check_input("S", S, (self.p, self.p), "one sensing matrix")
        return jnp.sum(S * (self.W @ self.W.T))

    def structure(self, S: Float[ArrayLike, "n n"]) -> Float[Array, "n n"]:
        S = check_input("S", S, (self.p, self.p), "one sensing matrix", dtype=self.W.dtype)
        return (S + S.T) / 2


class RectangularSensing(_AbstractScalarOutput):
    """Rectangular matrix sensing `f(S) = ⟨S, U Vᵀ⟩`, `U ∈ R^{n₁×r}`, `V ∈ R^{n₂×r}`.

    A neuron is a pair of columns `[u, v] ∈ R^{n₁+n₂}`, and `A(S) = ½ [[0, S], [Sᵀ, 0]]`.
    Special cases (Table 3): a bilinear sequence model `x_sᵀ U Vᵀ x_t` is `S = x_s x_tᵀ`; matrix
    completion of entry `(i, j)` is `S = e_i e_jᵀ`.

    **Arguments:** `rows` `n₁`, `cols` `n₂`, `rank` `r`; `key`, `init_scale`.
    """

    W: Float[Array, "p r"]
    shape: tuple[int, int] = eqx.field(static=True)

    def __init__(self, rows, cols, rank, *, key: PRNGKeyArray, init_scale=0.01):
        self.shape = (check_size("rows", rows), check_size("cols", cols))
        self.W = init_W(key, sum(self.shape), check_size("rank", rank), init_scale)

    def sample_shape(self, *, seq_len: int | None = None) -> tuple[int, int]:
        return self.shape

    def _split(self, w):
        return unpack(w, [(self.shape[0],), (self.shape[1],)])

    def unit(self, w: Float[ArrayLike, " p"], S: Float[ArrayLike, "n1 n2"]) -> Float[Array, ""]:
        u, v = self._split(w)
        return u @ S @ v

    def __call__(self, S: Float[ArrayLike, "n1 n2"]) -> Float[Array, ""]:
        S = check_input("S", S, self.shape, "one sensing matrix")
        U, V = self._split(self.W)
        return jnp.sum(S * (U @ V.T))

    def structure(self, S: Float[ArrayLike, "n1 n2"]) -> Float[Array, "p p"]:
        S = check_input("S", S, self.shape, "one sensing matrix", dtype=self.W.dtype)
        n1 = self.shape[0]
        return bilinear(self.p, (0, n1), (n1, self.p), S)
