"""Mixture of linear experts `f(x) = Σ_i ψ(r_iᵀ x) Θ_i x` (Prop 5, Table 3)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ._base import (
    AbstractVectorOutput,
    Activation,
    bilinear,
    check_activation,
    check_input,
    check_out_size,
    check_size,
    init_W,
    unpack,
)


class MixtureOfExperts(AbstractVectorOutput):
    """Mixture of experts with gates `ψ(r_iᵀ x)` and linear experts `E(x; Θ_i) = Θ_i x`.

    `f(x) = Σ_i ψ(r_iᵀ x) Θ_i x`, `Θ_i ∈ R^{k×n}` (`R^n` for a scalar output, `E = Θᵀx`); an
    expert is a neuron, `w_i = [r_i (n), vec Θ_i (row-major)]`. Since `ψ(0) = 0` and
    `E(x; 0) = 0` the module is ZGZ, and (Prop 5)

    `A⁽ᶜ⁾ = ψ'(0)/2 [[0, x G_c(x)ᵀ], [G_c(x) xᵀ, 0]]`,  `G_c = ∇_Θ E_c(x; 0) = e_c ⊗ x`.

    For odd `ψ` the sign flip `(r, Θ) → (−r, −Θ)` is a symmetry and the NQF error is `O(|W|⁴)`.

    **Arguments:**

    - `in_size` `n`, `num_experts` `d`, `out_size` `k` (`None`: scalar).
    - `gate`: smooth `ψ` with `ψ(0) = 0` (default `tanh`).
    - `key`, `init_scale`: `W ~ N(0, init_scale²)`.

    **Raises:** `ZGZError` when `ψ(0) ≠ 0` (e.g. a sigmoid or softmax gate).
    """

    W: Float[Array, "p d"]
    in_size: int = eqx.field(static=True)
    _out_size: int | None = eqx.field(static=True)
    gate: Activation = eqx.field(static=True)
    dpsi0: float = eqx.field(static=True)

    def __init__(self, in_size, num_experts, out_size=None, *, gate=jnp.tanh, key: PRNGKeyArray, init_scale=0.01):
        self.in_size = check_size("in_size", in_size)
        d = check_size("num_experts", num_experts)
        self._out_size = check_out_size(out_size)
        self.dpsi0 = check_activation("gate", gate)
        self.gate = gate
        self.W = init_W(key, self.in_size * (1 + self._k), d, init_scale)

    @property
    def _shapes(self):
        n, k = self.in_size, self._out_size
        return [(n,), (n,) if k is None else (k, n)]

    def unit(self, w: Float[Array, " p"], x: Float[Array, " n"]) -> Float[Array, "*k"]:
        r, Theta = unpack(w, self._shapes)
        return self.gate(r @ x) * (Theta @ x)

    def __call__(self, x: Float[Array, " n"]) -> Float[Array, "*k"]:
        x = check_input("x", x, (self.in_size,), "one input vector")
        R, Theta = unpack(self.W, self._shapes)  # (n, d), (n, d) or (k, n, d)
        return jnp.einsum("...bh,b,h->...", Theta, x, self.gate(x @ R))

    def structure(self, x: Float[Array, " n"]) -> Float[Array, "*k p p"]:
        x = check_input("x", x, (self.in_size,), "one input vector", dtype=self.W.dtype)
        n, k = self.in_size, self._out_size
        if k is None:
            C = jnp.outer(x, x)
        else:  # C⁽ᶜ⁾ = x (e_c ⊗ x)ᵀ
            C = jnp.einsum("a,oc,b->oacb", x, jnp.eye(k, dtype=x.dtype), x).reshape(k, n, k * n)
        return bilinear(self.p, (0, n), (n, self.p), self.dpsi0 * C)
