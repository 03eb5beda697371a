"""The neural quadratic form of a dataset: predictions, loss and the operators Y, K, H."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._core.errors import LvflowError
from .._core.validate import as_array, check_symmetric, to_jax


class NQF(eqx.Module):
    """A neural quadratic form fitted to `m` samples by squared loss (Eq. 26).

    The model's output on sample `μ` (Thm 1; with the μ-terms of Thm 12, in the form of Eq. 20) is

    `f_μ = f0_μ + g_μᵀ μ + Tr[M A_μ] + μᵀ B_μ μ`,   `M = W Wᵀ`, `μ = W 1`,

    and the loss is `L = (1/m) Σ_μ |f_μ − y_μ|²` (summed over output components for vector
    outputs, Cor. 1).

    The structure matrices are stored densely, or factored as `A_μ = Σ_d Φ_μd E_d` over `D`
    symmetric matrices `E_d` (for a learned-map architecture, Eq. 17, `Φ` are the map features
    and `E` the adjoint of the block `M ↦ Θ`; see `nqf_from_data`). The factored form costs
    `O(m D + D p²)` per evaluation instead of `O(m p²)` and never forms the `(m, p, p)` array.

    **Arguments:**

    - `A`: structure matrices, shape `(m, p, p)`, or `(m, k, p, p)` for `k` outputs; symmetric.
      `None` when `features` and `basis` are given.
    - `y`: targets, shape `(m,)` or `(m, k)`.
    - `f0`: outputs at `W = 0` (default 0), shaped like `y`.
    - `g`, `B`: the non-ZGZ terms of Thm 12, shapes `(m, [k,] p)` and `(m, [k,] p, p)`;
      `None` (the default) for ZGZ modules.
    - `features`, `basis`: the factored form instead of `A`: `Φ` of shape `(m, [k,] D)` and the
      symmetric `E` of shape `([k,] D, p, p)` (the output axis `k` on one of them: per-output
      features with one basis, or shared features with a basis per output). `basis` must be
      concrete (not traced): its sparsity pattern is read once, here.

    Under a JAX transformation the value checks (finite, symmetric) run through `equinox.error_if`.

    **Raises:** `LvflowError` for shapes that do not match, non-finite entries, or a traced `basis`;
    `SymmetryError` for non-symmetric matrices.
    """

    dense_A: Float[Array, "m *k p p"] | None
    features: Float[Array, "m *k D"] | None
    basis: Float[Array, "*k D p p"] | None
    _coo: tuple[Int[Array, " nnz"], Int[Array, " nnz"], Float[Array, " nnz"], Int[Array, " nnz"]] | None
    y: Float[Array, "m *k"]  # noqa: F821 (jaxtyping's variadic dims)
    f0: Float[Array, "m *k"]  # noqa: F821 (jaxtyping's variadic dims)
    g: Float[Array, "m *k p"] | None
    B: Float[Array, "m *k p p"] | None

    def __init__(self, A=None, y=None, *, f0=None, g=None, B=None, features=None, basis=None):
        if y is None:
            raise LvflowError("y: required (the targets)")
        y = as_array("y", y, ndim=(1, 2))
        if (A is None) == (features is None and basis is None):
            raise LvflowError("A: give either A, or features and basis (the factored form), not both")
        if A is not None:
            A = as_array("A", A, ndim=(3, 4))
            out = np.shape(A)[:-2]
            if np.shape(A)[-1] != np.shape(A)[-2]:
                raise LvflowError(f"A: the last two axes must be square (p, p), got shape {np.shape(A)}")
            if 0 in np.shape(A):
                raise LvflowError(f"A: needs at least one sample and p ≥ 1, got shape {np.shape(A)}")
            A = check_symmetric("A", A)
            p = np.shape(A)[-1]
        else:
            if features is None or basis is None:
                raise LvflowError("features, basis: the factored form needs both")
            features = as_array("features", features, ndim=(2, 3))
            basis = as_array("basis", basis, ndim=(3, 4))
            D, p = np.shape(features)[-1], np.shape(basis)[-1]
            if np.shape(basis)[-3:] != (D, p, p) or 0 in np.shape(basis) or np.shape(features)[0] == 0:
                raise LvflowError(
                    f"basis: expected shape ([k,] D, p, p) with D = {D} (features' last axis), p ≥ 1 and "
                    f"at least one sample, got basis {np.shape(basis)} and features {np.shape(features)}"
                )
            if np.ndim(features) == 3 and np.ndim(basis) == 4:
                raise LvflowError("features, basis: the output axis k goes on one of them, not both")
            basis = check_symmetric("basis", basis)
            out = np.shape(features)[:-1] + np.shape(basis)[:-3]
        if tuple(np.shape(y)) != tuple(out):
            raise LvflowError(f"y: shape {np.shape(y)} does not match A's sample/output axes {tuple(out)}")
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
            B = check_symmetric("B", B)
        # `to_jax`: the checked numpy arrays are copied to the device without a compiled program each
        self.dense_A = None if A is None else to_jax(A)
        self.features = None if features is None else to_jax(features)
        self.basis = None if basis is None else to_jax(basis)
        self._coo = None if basis is None else _sparse(basis)
        self.y = to_jax(y)
        if f0 is None:
            f0 = np.zeros(y.shape, y.dtype) if isinstance(y, np.ndarray) else jnp.zeros_like(y)
        self.f0 = to_jax(f0)
        self.g = None if g is None else to_jax(g)
        self.B = None if B is None else to_jax(B)

    @property
    def A(self) -> Float[Array, "m *k p p"]:
        """The structure matrices `A_μ`, shape `(m, [k,] p, p)` (formed from the factors when factored)."""
        if self.dense_A is not None:
            return self.dense_A
        features, basis = self._factors()
        if basis.ndim == 4:
            return jnp.einsum("md,cdij->mcij", features, basis)
        return jnp.einsum("...d,dij->...ij", features, basis)

    def _factors(self) -> tuple[Float[Array, "m *kf D"], Float[Array, "*kb D p p"]]:
        """`(Φ, E)` of a factored NQF (`__init__` sets both exactly when `dense_A` is `None`); the output
        axis `k` is on one of them (`kf` or `kb`), not both."""
        if self.features is None or self.basis is None:
            raise LvflowError("NQF: A is stored densely, not as features and basis")
        return self.features, self.basis

    @property
    def is_factored(self) -> bool:
        """Whether `A` is stored as `Σ_d Φ_μd E_d`."""
        return self.dense_A is None

    @property
    def m(self) -> int:
        """Number of samples."""
        return self.y.shape[0]

    @property
    def p(self) -> int:
        """Neuron size."""
        return (self._factors()[1] if self.dense_A is None else self.dense_A).shape[-1]

    def _theta(self, M) -> Array:
        """`θ_d = ⟨E_d, M⟩_F` (per output when `basis` has an output axis), shape `([k,] D)`."""
        basis = self._factors()[1]
        if self._coo is None:
            return jnp.einsum("...dij,ij->...d", basis, M)
        rows, cols, vals, seg = self._coo
        return jax.ops.segment_sum(vals * M[rows, cols], seg, num_segments=math.prod(basis.shape[:-2])).reshape(
            basis.shape[:-2]
        )

    def _pair(self, M) -> Array:
        """`⟨A_μ, M⟩_F` for every sample (and output)."""
        if self.dense_A is not None:
            return jnp.einsum("...ij,ij->...", self.dense_A, M)
        theta = self._theta(M)
        features = self._factors()[0]
        if theta.ndim == 2:  # (k, D): one feature vector per sample, a basis per output
            return features @ theta.T
        return features @ theta

    def weighted_sum(self, w: Float[ArrayLike, "m *k"]) -> Float[Array, "p p"]:  # noqa: F821 (jaxtyping's variadic dims)
        """`Σ_μ w_μ A_μ` (summed over outputs too) for weights `w` shaped like `y`."""
        if self.dense_A is not None:
            return jnp.einsum("...,...ij->ij", w, self.dense_A)
        features, basis = self._factors()
        if basis.ndim == 4:
            coef = jnp.asarray(w).T @ features  # (k, D)
        else:
            coef = jnp.einsum("...,...d->d", w, features)
        if self._coo is None:
            return jnp.einsum("...d,...dij->ij", coef, basis)
        rows, cols, vals, seg = self._coo
        p = basis.shape[-1]
        return jnp.zeros((p, p), coef.dtype).at[rows, cols].add(vals * coef.reshape(-1)[seg])

    @property
    def has_mu_terms(self) -> bool:
        """Whether the module breaks ZGZ (Thm 12), so that `μ = W 1` enters the dynamics."""
        return self.g is not None or self.B is not None

    def predict(self, M: Float[ArrayLike, "p p"], mu: Float[ArrayLike, " p"] | None = None) -> Float[Array, "m *k"]:  # noqa: F821 (jaxtyping's variadic dims)
        """`f_μ = f0_μ + g_μᵀμ + Tr[M A_μ] + μᵀ B_μ μ` for every sample (Eq. 2, Eq. 20)."""
        self._need_mu(mu)
        out = self.f0 + self._pair(jnp.asarray(M))
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
        return 4.0 / self.m * self.weighted_sum(self.y - self.f0)

    def K(self, X: Float[ArrayLike, "p p"]) -> Float[Array, "p p"]:
        """`K(X) = (4/m) Σ_μ ⟨A_μ, X⟩_F A_μ` (Eq. 252)."""
        return 4.0 / self.m * self.weighted_sum(self._pair(jnp.asarray(X)))

    def H(self, M, mu=None) -> Float[Array, "p p"]:
        """`H = (4/m) Σ_μ Δ_μ A_μ` (Eq. 27), so that `Ẇ = −H W` for a ZGZ module."""
        return 4.0 / self.m * self.weighted_sum(self.residual(M, mu))

    def v(self, M, mu) -> Float[Array, " p"]:
        """`v = Σ_x ℓ'_x (g_x + 2 B_x μ)` with `ℓ' = 2Δ/m` (Thm 2); zero for ZGZ modules."""
        if not self.has_mu_terms:
            return jnp.zeros(self.p, dtype=self.y.dtype)
        self._need_mu(mu)
        return self._v(self.residual(M, mu), mu)

    def _need_mu(self, mu):
        # Dropping the μ-terms silently would give a wrong prediction, not an error.
        if mu is None and self.has_mu_terms:
            raise LvflowError("mu: required, this NQF has μ-terms (g or B, Thm 12)")

    def _v(self, res, mu):
        lp = 2.0 / self.m * res
        acc = jnp.zeros(self.p, dtype=self.y.dtype)
        if self.g is not None:
            acc = acc + jnp.einsum("...,...i->i", lp, self.g)
        if self.B is not None:
            acc = acc + 2.0 * jnp.einsum("...,...ij,j->i", lp, self.B, mu)
        return acc

    def subset(self, idx) -> "NQF":
        """The NQF of the samples `idx` (a minibatch). Cut from arrays checked when this NQF was built,
        without checking again (`idx` may be traced, inside a jitted loop); the basis is kept."""
        where = lambda n: _per_sample(n, mu_terms=True)  # noqa: E731
        return eqx.tree_at(where, self, [a[idx] for a in where(self)])

    def scaled(self, factor) -> "NQF":
        """The same data with `A → factor · A` (used by compression, Thm 3)."""
        where = lambda n: _per_sample(n, mu_terms=False)[:1]  # noqa: E731
        return eqx.tree_at(where, self, [a * factor for a in where(self)])


def _per_sample(nqf, *, mu_terms):
    """The arrays of `nqf` with a sample axis: `A` (`dense_A`, or `features` when factored), `y`, `f0`,
    and with `mu_terms` the `g` and `B` that are given. Unannotated: `equinox.tree_at` calls it on a
    tree of placeholders."""
    A = nqf.dense_A if nqf.dense_A is not None else nqf.features
    return [a for a in (A, nqf.y, nqf.f0, *((nqf.g, nqf.B) if mu_terms else ())) if a is not None]


def _sparse(basis):
    """The nonzero entries of `basis` as `(rows, cols, values, d)` (flattened over `[k,] D`), when they
    are under a tenth of it; otherwise `None`.

    **Raises:** `LvflowError` when `basis` is traced (its sparsity pattern cannot be read).
    """
    try:
        E = np.asarray(basis)
    except jax.errors.TracerArrayConversionError:
        raise LvflowError(
            "basis: must be a concrete array, not traced by jax.jit/vmap/grad (its sparsity pattern is read "
            "once, when the NQF is built); build the NQF outside the transformation"
        ) from None
    flat = E.reshape(-1, E.shape[-2], E.shape[-1])
    seg, rows, cols = np.nonzero(flat)
    if rows.size > 0.1 * flat.size:
        return None
    return (to_jax(rows), to_jax(cols), to_jax(flat[seg, rows, cols]), to_jax(seg))
