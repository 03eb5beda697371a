"""The neural quadratic form of a dataset: predictions, loss and the operators Y, K, H."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._errors import LvflowError
from .._validate import as_array, check_symmetric


class NQF(eqx.Module):
    """A neural quadratic form fitted to `m` samples by squared loss (Eq. 26).

    The model's output on sample `μ` (Thm 1; with the μ-terms of Thm 12, Eq. 196) is

    `f_μ = f0_μ + g_μᵀ μ + Tr[M A_μ] + μᵀ B_μ μ`,   `M = W Wᵀ`, `μ = W 1`,

    and the loss is `L = (1/m) Σ_μ |f_μ − y_μ|²` (summed over output components for vector
    outputs, Cor. 1).

    **Arguments:**

    - `A`: structure matrices, shape `(m, p, p)`, or `(m, k, p, p)` for `k` outputs; symmetric.
    - `y`: targets, shape `(m,)` or `(m, k)`.
    - `f0`: outputs at `W = 0` (default 0), shaped like `y`.
    - `g`, `B`: the non-ZGZ terms of Thm 12, shapes `(m, [k,] p)` and `(m, [k,] p, p)`;
      `None` (the default) for ZGZ modules.
    """

    A: Float[Array, "m *k p p"]
    y: Float[Array, "m *k"]  # noqa: F821 (jaxtyping's variadic dims)
    f0: Float[Array, "m *k"]  # noqa: F821 (jaxtyping's variadic dims)
    g: Float[Array, "m *k p"] | None
    B: Float[Array, "m *k p p"] | None

    def __init__(self, A, y, *, f0=None, g=None, B=None):
        A = as_array("A", A, ndim=(3, 4))
        y = as_array("y", y, ndim=(1, 2))
        out = np.shape(A)[:-2]
        if np.shape(A)[-1] != np.shape(A)[-2]:
            raise LvflowError(f"A: the last two axes must be square (p, p), got shape {np.shape(A)}")
        if tuple(np.shape(y)) != tuple(out):
            raise LvflowError(f"y: shape {np.shape(y)} does not match A's sample/output axes {tuple(out)}")
        if 0 in np.shape(A):
            raise LvflowError(f"A: needs at least one sample and p ≥ 1, got shape {np.shape(A)}")
        check_symmetric("A", A)
        p = np.shape(A)[-1]
        if f0 is not None:
            f0 = as_array("f0", f0)
            if tuple(np.shape(f0)) != tuple(out):
                raise LvflowError(f"f0: shape {np.shape(f0)}, expected {tuple(out)}")
        if g is not None:
            g = as_array("g", g)
            if tuple(np.shape(g)) != tuple(out) + (p,):
                raise LvflowError(f"g: shape {np.shape(g)}, expected {tuple(out) + (p,)}")
        if B is not None:
            B = as_array("B", B)
            if tuple(np.shape(B)) != tuple(out) + (p, p):
                raise LvflowError(f"B: shape {np.shape(B)}, expected {tuple(out) + (p, p)}")
            check_symmetric("B", B)
        self.A = jnp.asarray(A)
        self.y = jnp.asarray(y)
        self.f0 = jnp.zeros_like(self.y) if f0 is None else jnp.asarray(f0)
        self.g = None if g is None else jnp.asarray(g)
        self.B = None if B is None else jnp.asarray(B)

    @property
    def m(self) -> int:
        """Number of samples."""
        return self.A.shape[0]

    @property
    def p(self) -> int:
        """Neuron size."""
        return self.A.shape[-1]

    @property
    def has_mu_terms(self) -> bool:
        """Whether the module breaks ZGZ (Thm 12), so that `μ = W 1` enters the dynamics."""
        return self.g is not None or self.B is not None

    def predict(self, M: Float[ArrayLike, "p p"], mu: Float[ArrayLike, " p"] | None = None) -> Float[Array, "m *k"]:  # noqa: F821 (jaxtyping's variadic dims)
        """`f_μ = f0_μ + g_μᵀμ + Tr[M A_μ] + μᵀ B_μ μ` for every sample (Eq. 2, Eq. 196)."""
        self._need_mu(mu)
        out = self.f0 + jnp.einsum("...ij,ij->...", self.A, M)
        if mu is not None:
            if self.g is not None:
                out = out + self.g @ mu
            if self.B is not None:
                out = out + jnp.einsum("...ij,i,j->...", self.B, mu, mu)
        return out

    def residual(self, M, mu=None) -> Float[Array, "m *k"]:  # noqa: F821 (jaxtyping's variadic dims)
        """`Δ_μ = f_μ − y_μ`."""
        return self.predict(M, mu) - self.y

    def loss(self, M, mu=None) -> Float[Array, ""]:
        """The paper's loss `L = (1/m) Σ_μ |f_μ − y_μ|²` (Eq. 26)."""
        return jnp.sum(self.residual(M, mu) ** 2) / self.m

    @property
    def Y(self) -> Float[Array, "p p"]:
        """`Y = (4/m) Σ_μ (y_μ − f0_μ) A_μ` (Eq. 252)."""
        return 4.0 / self.m * jnp.einsum("...,...ij->ij", self.y - self.f0, self.A)

    def K(self, X: Float[ArrayLike, "p p"]) -> Float[Array, "p p"]:
        """`K(X) = (4/m) Σ_μ ⟨A_μ, X⟩_F A_μ` (Eq. 252)."""
        return 4.0 / self.m * jnp.einsum("...kl,kl,...ij->ij", self.A, X, self.A)

    def H(self, M, mu=None) -> Float[Array, "p p"]:
        """`H = (4/m) Σ_μ Δ_μ A_μ` (Eq. 27), so that `Ẇ = −H W` for a ZGZ module."""
        return 4.0 / self.m * jnp.einsum("...,...ij->ij", self.residual(M, mu), self.A)

    def v(self, M, mu) -> Float[Array, " p"]:
        """`v = Σ_x ℓ'_x (g_x + 2 B_x μ)` with `ℓ' = 2Δ/m` (Thm 2); zero for ZGZ modules."""
        if not self.has_mu_terms:
            return jnp.zeros(self.p, dtype=self.A.dtype)
        self._need_mu(mu)
        return self._v(self.residual(M, mu), mu)

    def _need_mu(self, mu):
        # Dropping the μ-terms silently would give a wrong prediction, not an error.
        if mu is None and self.has_mu_terms:
            raise LvflowError("mu: required, this NQF has μ-terms (g or B, Thm 12)")

    def _v(self, res, mu):
        lp = 2.0 / self.m * res
        acc = jnp.zeros(self.p, dtype=self.A.dtype)
        if self.g is not None:
            acc = acc + jnp.einsum("...,...i->i", lp, self.g)
        if self.B is not None:
            acc = acc + 2.0 * jnp.einsum("...,...ij,j->i", lp, self.B, mu)
        return acc

    def subset(self, idx) -> "NQF":
        """The NQF of the samples `idx` (a minibatch)."""
        take = lambda a: None if a is None else a[idx]
        return NQF(self.A[idx], self.y[idx], f0=self.f0[idx], g=take(self.g), B=take(self.B))

    def scaled(self, factor) -> "NQF":
        """The same data with `A → factor · A` (used by compression, Thm 3)."""
        return NQF(self.A * factor, self.y, f0=self.f0, g=self.g, B=self.B)
