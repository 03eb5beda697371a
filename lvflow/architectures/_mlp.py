"""Two-layer perceptron `f(x) = Σ_i v_i φ(u_iᵀ x)` (Prop 1, Table 3)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from ._base import (
    AbstractPooledPerceptron,
    AbstractVectorInput,
    AbstractVectorOutput,
    Activation,
    activation_next_order,
    check_activation,
    check_out_size,
    check_size,
    init_W,
    pooled_expansion_term,
)


class MLP(AbstractVectorInput, AbstractVectorOutput, AbstractPooledPerceptron):
    """Two-layer MLP without bias, `f(x) = Σ_i v_i φ(u_iᵀ x)` (`v_i ∈ R^k` for vector output).

    Neuron `w_i = [u_i (n), v_i (k, or 1 for a scalar output)]`, so `p = n + k`. Its structure
    matrix (Prop 1, Table 3) is, per output `c`,

    `A⁽ᶜ⁾(x) = φ'(0)/2 · [[0, x e_cᵀ], [e_c xᵀ, 0]]`

    (for a scalar output, `φ'(0)/2 · [[0, x], [xᵀ, 0]]`). The error of the NQF is `O(|W|³)`, and
    `O(|W|⁴)` for odd `φ` (per-neuron sign symmetry `(u, v) → (−u, −v)`). The next term (Thm 13,
    `expansion_term`) is `Σ_i v_i φ⁽ʲ⁾(0)/j! (u_iᵀx)ʲ` of order `j + 1` for the first `j ≥ 2` with
    `φ⁽ʲ⁾(0) ≠ 0`: `v φ''(0)/2 (uᵀx)²` (order 3) in general, `v φ'''(0)/6 (uᵀx)³` (order 4) for tanh. The learned map is
    `Θ = Σ_i u_i v_iᵀ` (`n × k`), read by `Φ_c(x) = φ'(0) x e_cᵀ`.

    **Arguments:**

    - `in_size`, `width`, `out_size`: `n`, `d` and `k` (`None`: scalar output). Paper, Fig 2:
      `MLP(20, 64, 8)`.
    - `activation`: smooth `φ` with `φ(0) = 0` (default `tanh`).
    - `key`, `init_scale`: `W ~ N(0, init_scale²)`.

    **Raises:** `ZGZError` when `φ(0) ≠ 0` (e.g. `jax.nn.sigmoid`).
    """

    W: Float[Array, "p d"]
    in_size: int = eqx.field(static=True)
    _out_size: int | None = eqx.field(static=True)
    activation: Activation = eqx.field(static=True)
    dphi0: float = eqx.field(static=True)

    def __init__(self, in_size, width, out_size=None, *, activation=jnp.tanh, key: PRNGKeyArray, init_scale=0.01):
        self.in_size = check_size("in_size", in_size)
        width = check_size("width", width)
        self._out_size = check_out_size(out_size)
        self.dphi0 = check_activation("activation", activation)
        self.activation = activation
        self.W = init_W(key, self.in_size + self._k, width, init_scale)

    @property
    def _n(self) -> int:
        return self.in_size

    def pooled_input(self, x: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
        return jnp.asarray(x)

    def unit(self, w: Float[ArrayLike, " p"], x: Float[ArrayLike, " n"]) -> Float[Array, "*k"]:
        u, v = self._split(w)
        return v * self.activation(u @ x)

    def __call__(self, x: Float[ArrayLike, " n"]) -> Float[Array, "*k"]:
        U, V = self._split(self.W)  # (n, d), (d,) or (k, d)
        return V @ self.activation(self._check(x) @ U)

    def next_order(self, x=None) -> int | None:
        """`j + 1` for the first `j ≥ 2` with `φ⁽ʲ⁾(0) ≠ 0` (Thm 13): 3 in general, 4 for an odd `φ`."""
        return activation_next_order(self.activation)

    def expansion_term(self, x: Float[ArrayLike, " n"], order: int) -> Float[Array, "*k"]:
        """Thm 13's order-`k` term, `Σ_i v_i φ⁽ᵏ⁻¹⁾(0)/(k−1)! (u_iᵀx)^{k−1}` (Eq. 203, `λ = (k)`)."""
        U, V = self._split(self.W)
        return pooled_expansion_term(self.activation, self._check(x)[None, :], U, V, order)
