"""One-layer convolutional network with global sum pooling (Prop 6, Table 3)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._core.errors import LvflowError
from ._base import (
    AbstractPooledPerceptron,
    AbstractVectorOutput,
    Activation,
    activation_next_order,
    check_activation,
    check_input,
    check_out_size,
    check_size,
    init_W,
    pooled_expansion_term,
)


def _patch_index(input_shape, kernel_shape) -> tuple[np.ndarray, np.ndarray]:
    """Row/column indices of every stride-1, unpadded patch: two `(P, kh·kw)` integer arrays.

    Patch `p` (positions in row-major order) flattened row-major matches a kernel flattened
    row-major, so `X[rows, cols] @ vec(k)` is the correlation `k ⋆ X` at every position.
    """
    (h, w), (kh, kw) = input_shape, kernel_shape
    oi, oj = np.meshgrid(np.arange(h - kh + 1), np.arange(w - kw + 1), indexing="ij")
    di, dj = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    rows = oi.reshape(-1, 1) + di.reshape(1, -1)
    cols = oj.reshape(-1, 1) + dj.reshape(1, -1)
    return rows, cols


class CNN(AbstractVectorOutput, AbstractPooledPerceptron):
    """One-layer CNN on a single-channel 2-D input: `f(X) = Σ_i v_i Σ_p φ(k_iᵀ x_p)`.

    `x_p` runs over the `P` patches of size `kh × kw` (stride 1, no padding, each flattened
    row-major); the `d` channels (kernels `k_i`) are globally sum-pooled and read out by
    `v_i ∈ R^k`. Neuron `w_i = [vec k_i (kh·kw), v_i (k, or 1)]`. Structure matrix (Prop 6, Eq. 16):

    `A⁽ᶜ⁾(X) = φ'(0)/2 · [[0, (Σ_p x_p) e_cᵀ], [e_c (Σ_p x_p)ᵀ, 0]]`.

    The learned map is `Θ = Σ_i k_i v_iᵀ` (`kh·kw × k`), read by `Φ_c(X) = φ'(0) (Σ_p x_p) e_cᵀ`.
    The next term (Thm 13, `expansion_term`) is `Σ_i v_i φ⁽ʲ⁾(0)/j! Σ_p (k_iᵀx_p)ʲ`, of order `j + 1`
    for the first `j ≥ 2` with `φ⁽ʲ⁾(0) ≠ 0` (order 4 for tanh).

    **Arguments:**

    - `input_shape`, `kernel_shape`: `(H, W)` and `(kh, kw)`, `kh ≤ H`, `kw ≤ W`.
    - `channels`, `out_size`: `d` and `k` (`None`: scalar output). Paper, Fig 2:
      `CNN((5, 7), (4, 5), 64, 8)`.
    - `activation`: smooth `φ` with `φ(0) = 0` (default `tanh`).
    - `key`, `init_scale`: `W ~ N(0, init_scale²)`.

    **Raises:** `ZGZError` when `φ(0) ≠ 0`.
    """

    W: Float[Array, "p d"]
    input_shape: tuple[int, int] = eqx.field(static=True)
    kernel_shape: tuple[int, int] = eqx.field(static=True)
    _out_size: int | None = eqx.field(static=True)
    activation: Activation = eqx.field(static=True)
    dphi0: float = eqx.field(static=True)

    def __init__(
        self,
        input_shape,
        kernel_shape,
        channels,
        out_size=None,
        *,
        activation=jnp.tanh,
        key: PRNGKeyArray,
        init_scale=0.01,
    ):
        if len(tuple(input_shape)) != 2 or len(tuple(kernel_shape)) != 2:
            raise LvflowError(
                f"input_shape, kernel_shape: expected two (height, width) pairs, got {input_shape!r}, {kernel_shape!r}"
            )
        (h, w), (kh, kw) = tuple(input_shape), tuple(kernel_shape)
        self.input_shape = (check_size("input_shape", h), check_size("input_shape", w))
        self.kernel_shape = (check_size("kernel_shape", kh), check_size("kernel_shape", kw))
        if any(k > s for k, s in zip(self.kernel_shape, self.input_shape)):
            raise LvflowError(f"kernel_shape: {self.kernel_shape} does not fit in input_shape {self.input_shape}")
        channels = check_size("channels", channels)
        self._out_size = check_out_size(out_size)
        self.dphi0 = check_activation("activation", activation)
        self.activation = activation
        self.W = init_W(key, self._n + self._k, channels, init_scale)

    @property
    def _n(self) -> int:
        return self.kernel_shape[0] * self.kernel_shape[1]

    def sample_shape(self, *, seq_len: int | None = None) -> tuple[int, int]:
        return self.input_shape

    def _check(self, X, *, dtype=None) -> Float[Array, "H W"]:
        return check_input("X", X, self.input_shape, "one single-channel image", dtype=dtype)

    def patches(self, X: Float[ArrayLike, "H W"]) -> Float[Array, "P m"]:
        """All `P` patches `x_p` of `X`, flattened row-major: shape `(P, kh·kw)`."""
        rows, cols = _patch_index(self.input_shape, self.kernel_shape)
        return jnp.asarray(X)[rows, cols]

    def pooled_input(self, X: Float[ArrayLike, "H W"]) -> Float[Array, " m"]:
        return jnp.sum(self.patches(X), axis=0)  # Σ_p x_p

    def unit(self, w: Float[ArrayLike, " p"], X: Float[ArrayLike, "H W"]) -> Float[Array, "*k"]:
        kern, v = self._split(w)
        return v * jnp.sum(self.activation(self.patches(X) @ kern))

    def __call__(self, X: Float[ArrayLike, "H W"]) -> Float[Array, "*k"]:
        K, V = self._split(self.W)  # (m, d), (d,) or (k, d)
        return V @ jnp.sum(self.activation(self.patches(self._check(X)) @ K), axis=0)

    def next_order(self, X=None) -> int | None:
        """`j + 1` for the first `j ≥ 2` with `φ⁽ʲ⁾(0) ≠ 0` (Thm 13): 3 in general, 4 for an odd `φ`."""
        return activation_next_order(self.activation)

    def expansion_term(self, X: Float[ArrayLike, "H W"], order: int) -> Float[Array, "*k"]:
        """Thm 13's order-`k` term, `Σ_i v_i φ⁽ᵏ⁻¹⁾(0)/(k−1)! Σ_p (k_iᵀx_p)^{k−1}` (Eq. 203, `λ = (k)`)."""
        K, V = self._split(self.W)
        return pooled_expansion_term(self.activation, self.patches(self._check(X)), K, V, order)
