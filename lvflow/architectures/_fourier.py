"""The Fourier-feature MLP of the scaling-law experiment (Fig 5)."""

from __future__ import annotations

import math

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._core.validate import as_array
from ._base import AbstractArchitecture, bilinear, check_input, check_size, init_W, unpack


class FourierMLP(AbstractArchitecture):
    """`f(x) = (1/√P) Σ_k W_k tanh(s_k a_k ψ_k(x))`, `ψ_k(x) = √2 cos(2πkx)`, `s_k = k^{−θ}`.

    `k = 1..P`. The whole parameter vector `[a (P), W (P)]` is one neuron of size `2P` (the
    paper's model is `width=1`; a larger width sums independent copies). Each term is
    `W_k a_k s_k ψ_k(x)/√P` to second order, so (Fig 5)

    `A(x) = ½ [[0, D(x)], [D(x), 0]]`,  `D(x) = diag(s_k ψ_k(x) / √P)`:

    mode `k` couples only `a_k` and `W_k`, and the structure matrices of all inputs commute
    (Assumption 1) with eigenvalues `±s_k ψ_k(x)/(2√P)`. tanh is odd, so the NQF error is `O(|W|⁴)`.

    **Arguments:**

    - `num_modes` `P` (Fig 5: 64); `theta` `θ ≥ 0`, the spectral decay of `s_k` (Fig 5: 0, ½, 1).
    - `width`: number of neurons `d` (default 1).
    - `key`, `init_scale`: `W ~ N(0, init_scale²)` (Fig 5: `1e-4`).

    The input is a scalar `x` (Fig 5: the grid `x ∈ {0, 1/M, …, (M−1)/M}`).
    """

    W: Float[Array, "p d"]
    num_modes: int = eqx.field(static=True)
    theta: float = eqx.field(static=True)

    def __init__(self, num_modes, *, theta=0.0, width=1, key: PRNGKeyArray, init_scale=0.01):
        self.num_modes = check_size("num_modes", num_modes)
        self.theta = float(as_array("theta", theta, ndim=0))
        self.W = init_W(key, 2 * self.num_modes, check_size("width", width), init_scale)

    @property
    def out_size(self) -> None:
        return None

    def sample_shape(self, *, seq_len: int | None = None) -> tuple[()]:
        return ()

    def features(self, x: Float[Array, ""]) -> Float[Array, " P"]:
        """`s_k ψ_k(x) / √P`, `k = 1..P`: the diagonal of `D(x)`."""
        k = jnp.arange(1, self.num_modes + 1, dtype=jnp.result_type(float))
        return k ** (-self.theta) * math.sqrt(2.0) * jnp.cos(2 * jnp.pi * k * x) / math.sqrt(self.num_modes)

    def unit(self, w: Float[ArrayLike, " p"], x: Float[ArrayLike, ""]) -> Float[Array, ""]:
        a, v = unpack(w, [(self.num_modes,)] * 2)
        k = jnp.arange(1, self.num_modes + 1, dtype=a.dtype)
        s_psi = k ** (-self.theta) * math.sqrt(2.0) * jnp.cos(2 * jnp.pi * k * x)
        return v @ jnp.tanh(s_psi * a) / math.sqrt(self.num_modes)

    def __call__(self, x: Float[ArrayLike, "..."]) -> Float[Array, ""]:  # a scalar (checked: LvflowError)
        x = check_input("x", x, (), "a scalar input")
        a, v = unpack(self.W, [(self.num_modes,)] * 2)  # (P, d) each
        s_psi = self.features(x) * math.sqrt(self.num_modes)
        return jnp.sum(v * jnp.tanh(s_psi[:, None] * a)) / math.sqrt(self.num_modes)

    def structure(self, x: Float[ArrayLike, "..."]) -> Float[Array, "p p"]:  # a scalar (checked)
        x = check_input("x", x, (), "a scalar input", dtype=self.W.dtype)
        P = self.num_modes
        return bilinear(self.p, (0, P), (P, 2 * P), jnp.diag(self.features(x)))
