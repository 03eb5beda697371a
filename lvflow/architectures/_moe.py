"""Mixture of linear experts `f(x) = Σ_i ψ(r_iᵀ x) Θ_i x` (Prop 5, Table 3)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from ._base import (
    AbstractSeparableMap,
    AbstractVectorInput,
    AbstractVectorOutput,
    Activation,
    bilinear,
    check_activation,
    check_out_size,
    check_size,
    init_W,
    orthonormal,
    teacher_neurons,
    unpack,
)


class MixtureOfExperts(AbstractVectorInput, AbstractVectorOutput, AbstractSeparableMap):
    """Mixture of experts with gates `ψ(r_iᵀ x)` and linear experts `E(x; Θ_i) = Θ_i x`.

    `f(x) = Σ_i ψ(r_iᵀ x) Θ_i x`, `Θ_i ∈ R^{k×n}` (`R^n` for a scalar output, `E = Θᵀx`); an
    expert is a neuron, `w_i = [r_i (n), vec Θ_i (row-major)]`. Since `ψ(0) = 0` and
    `E(x; 0) = 0` the module is ZGZ, and (Prop 5)

    `A⁽ᶜ⁾ = ψ'(0)/2 [[0, x G_c(x)ᵀ], [G_c(x) xᵀ, 0]]`,  `G_c = ∇_Θ E_c(x; 0) = e_c ⊗ x`.

    For odd `ψ` the sign flip `(r, Θ) → (−r, −Θ)` is a symmetry and the NQF error is `O(|W|⁴)`.

    The learned map is `R = Σ_i r_i vec(Θ_i)ᵀ` (`n × kn`), read by `Φ_c(x) = ψ'(0) x (e_c ⊗ x)ᵀ`:
    to second order `f_c = ψ'(0) xᵀ Q_c x` with `Q_c = Σ_i r_i Θ_i[c]ᵀ`, so outputs see only the
    symmetric part of each `Q_c`. A low-rank teacher's right singular vectors are therefore
    `β_j ⊗ u_j` (unit `β_j ∈ R^k`), making every `Q_c = Σ_j s_j β_{c,j} u_j u_jᵀ` symmetric,
    so that the `s_j` are identifiable from outputs (`draw_teacher`).

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

    def unit(self, w: Float[ArrayLike, " p"], x: Float[ArrayLike, " n"]) -> Float[Array, "*k"]:
        r, Theta = unpack(w, self._shapes)
        return self.gate(r @ x) * (Theta @ x)

    def __call__(self, x: Float[ArrayLike, " n"]) -> Float[Array, "*k"]:
        x = self._check(x)
        R, Theta = unpack(self.W, self._shapes)  # (n, d), (n, d) or (k, n, d)
        return jnp.einsum("...bh,b,h->...", Theta, x, self.gate(x @ R))

    def structure(self, x: Float[ArrayLike, " n"]) -> Float[Array, "*k p p"]:
        x = self._check(x, dtype=self.W.dtype)
        n, k = self.in_size, self._out_size
        if k is None:
            C = jnp.outer(x, x)
        else:  # C⁽ᶜ⁾ = x (e_c ⊗ x)ᵀ
            C = jnp.einsum("a,oc,b->oacb", x, jnp.eye(k, dtype=x.dtype), x).reshape(k, n, k * n)
        return bilinear(self.p, (0, n), (n, self.p), self.dpsi0 * C)

    def learned_map(self) -> Float[Array, "n kn"]:
        return self.W[: self.in_size] @ self.W[self.in_size :].T

    def map_features(self, x: Float[ArrayLike, " n"]) -> Float[Array, "k n kn"]:
        n, k = self.in_size, self._k
        return self.dpsi0 * jnp.einsum("a,cd,b->cadb", x, np.eye(k), x).reshape(k, n, k * n)

    def shared_features(self, x: Float[ArrayLike, " n"]) -> Float[Array, " nn"]:
        x = jnp.asarray(x)
        return self.dpsi0 * jnp.outer(x, x).reshape(self.in_size**2)

    def output_slices(self, R: Float[ArrayLike, "n kn"]) -> Float[Array, "k nn"]:
        n, k = self.in_size, self._k  # R[a, c·n + b] -> [c, a·n + b]
        return jnp.asarray(R).reshape(n, k, n).transpose(1, 0, 2).reshape(k, n * n)

    def draw_teacher(self, rng: np.random.Generator, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, k, r = self.in_size, self._k, len(s)
        U = orthonormal(rng, n, r)
        beta = rng.standard_normal((k, r))
        beta = beta / np.linalg.norm(beta, axis=0)
        V = np.einsum("cj,bj->cbj", beta, U).reshape(k * n, r)
        return U, V, teacher_neurons(self.p, [(0, U * np.sqrt(s)), (n, V * np.sqrt(s))], r)
