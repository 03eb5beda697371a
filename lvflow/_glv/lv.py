"""The generalized Lotka–Volterra system of the NQF in a shared eigenbasis (Eq. 31–32)."""

import abc

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from equinox import AbstractVar
from jaxtyping import Array, ArrayLike, Float

from .._core.errors import LvflowError
from .._core.validate import as_array, check_psd, is_diagonal
from .equilibrium import saturated_equilibrium
from .interaction import AbstractInteraction, DenseInteraction, DiagonalInteraction, LowRankInteraction


class AbstractLotkaVolterra(eqx.Module):
    """A gLV `ż_k = z_k (r_k − Σ_j C_kj z_j)` (Eq. 32) with `C` held in some structure.

    Final subclasses: `LotkaVolterra` (a dense PSD `C`) and `LowRankLotkaVolterra`
    (`C = Diag(d) + UUᵀ`); everything that takes a system takes either. Not meant to be subclassed
    outside lvflow: the solvers know these two structures. Subclasses provide `r`,
    `y2`, `Cz`, `C_diagonal`, `interaction` (`C` as the solvers apply it) and `C`, the dense
    `(K, K)` matrix (a field of `LotkaVolterra`; formed on demand, for small systems, by the others).
    """

    r: AbstractVar[Float[Array, " K"]]
    C: AbstractVar[Float[Array, "K K"]]
    y2: AbstractVar[Float[Array, ""]]

    @property
    def K(self) -> int:
        """Number of modes."""
        return self.r.shape[-1]

    @abc.abstractmethod
    def Cz(self, z: Float[ArrayLike, "*b K"]) -> Float[Array, "*b K"]:
        """`C z` in the structure's cost."""

    @property
    @abc.abstractmethod
    def C_diagonal(self) -> Float[Array, " K"]:
        """The diagonal `C_kk`."""

    @abc.abstractmethod
    def interaction(self) -> AbstractInteraction:
        """`C` as the solvers apply it, in the structure fixed when the system was built: the same
        for an eager call and for the system passed into `jax.jit` (Thm 6 for a diagonal `C`)."""

    def vector_field(self, t, z: Float[ArrayLike, " K"], args=None) -> Float[Array, " K"]:
        """`ż = z ⊙ (r − C z)` (Eq. 32), in diffrax's `(t, y, args)` signature."""
        z = jnp.asarray(z)
        return z * (self.r - self.Cz(z))

    def log_vector_field(self, t, u: Float[ArrayLike, " K"], args=None) -> Float[Array, " K"]:
        """The same flow in `u = ln z`: `u̇ = r − C e^u`. Removes the stiffness of tiny `z`."""
        return self.r - self.Cz(jnp.exp(u))

    def loss(self, z: Float[ArrayLike, "*b K"]) -> Float[Array, "*b"]:
        """`L(z) = zᵀCz/8 − rᵀz/4 + y2`, the paper's loss (Eq. 26) in modes."""
        return jnp.sum(z * self.Cz(z), axis=-1) / 8 - z @ self.r / 4 + self.y2

    def excess_loss(self, z: Float[ArrayLike, "*b K"]) -> Float[Array, "*b"]:
        """`L(z) − L(z*)`, with `z*` the saturated equilibrium."""
        return self.loss(z) - self.loss(self.equilibrium())

    @property
    def is_diagonal(self) -> bool:
        """Whether `C` is (concretely) diagonal: the modes do not interact (Thm 6)."""
        return isinstance(self.interaction(), DiagonalInteraction)

    @property
    def zeta(self) -> Float[Array, " K"]:
        """Ignition rates `ζ_k = r_k` (Thm 8 with `a = 1`)."""
        return self.r

    @property
    def V(self) -> Float[Array, " K"]:
        """Loss drop of each isolated mode, `V_k = r_k² / (8 C_kk)` (Thm 9; the isolated-mode case of Thm 6)."""
        return jnp.where(self.r > 0, self.r**2 / (8 * self.C_diagonal), 0.0)

    def equilibrium(self, active=None, *, tol: float = 1e-12) -> Float[Array, " K"]:
        """The saturated equilibrium `z* ≥ 0`: `r − C z* ≤ 0`, with equality where `z* > 0`.

        For PSD `C` it minimises `½ zᵀCz − rᵀz` over `z ≥ 0`; it is the limit of the flow from any
        positive `z0` when unique. A primal active-set method (Lawson–Hanson; right for singular `C`)
        in `C`'s structure (`interaction()`; diagonal: Thm 6; `Diag(d) + UUᵀ`: Woodbury solves),
        differentiable, the same eagerly and under `jit`. With `active` (a boolean mask), modes
        outside it are held at 0.

        **Raises:** `LvflowError` if a mode with `r_k > 0` has `C_kk ≤ 0` (unbounded growth).
        """
        z, _ = saturated_equilibrium(self.r, self.interaction(), active=active, tol=tol)
        return z


class LotkaVolterra(AbstractLotkaVolterra):
    """`ż_k = z_k (r_k − Σ_j C_kj z_j)` (Eq. 32), with `r_k = (8/m) Σ_μ y_μ λ_{μ,k}` and
    `C_kj = (8/m) Σ_μ λ_{μ,k} λ_{μ,j}` a Gram matrix (PSD; positive entries are competition).

    **Arguments:**

    - `r`: growth rates, shape `(K,)`.
    - `C`: interaction matrix, shape `(K, K)`, symmetric PSD (checked).
    - `y2`: `(1/m) Σ_μ y_μ²`, the loss at `z = 0` (default 0: the loss is then defined up to a
      constant; `excess_loss` does not depend on it).
    - `P`: optionally the common eigenbasis `(p, K)` the modes come from (set by `reduce_to_lv`).
    - `check`: validate `C` (skip only for arrays already checked).

    Whether `C` is diagonal is decided here, once, from its values (a `C` traced under `jit`/`vmap`
    is taken as dense) and kept with the system (the static field `diagonal_C`; `is_diagonal`,
    `interaction`): a system passed
    into `jax.jit` takes the same path as the same system called eagerly. A diagonal system is
    differentiated within its structure (with respect to `r` and `C`'s diagonal); for derivatives
    with respect to off-diagonal entries of `C`, build the system from a traced `C`.
    """

    r: Float[Array, " K"]
    C: Float[Array, "K K"]
    y2: Float[Array, ""]
    P: Float[Array, "p K"] | None
    diagonal_C: bool = eqx.field(static=True)

    def __init__(self, r, C, *, y2: ArrayLike = 0.0, P=None, check: bool = True):
        r = as_array("r", r, ndim=1, allow_bool=False)
        C = as_array("C", C, ndim=2, allow_bool=False)
        if np.shape(C) != (np.shape(r)[0],) * 2:
            raise LvflowError(f"C: shape {np.shape(C)} does not match r of shape {np.shape(r)} (need (K, K))")
        if check:
            check_psd("C", C)
        self.r = jnp.asarray(r)
        self.C = jnp.asarray(C)
        self.y2 = jnp.asarray(as_array("y2", y2, ndim=0, allow_bool=False), dtype=self.r.dtype)
        self.P = None if P is None else jnp.asarray(P)
        self.diagonal_C = isinstance(C, np.ndarray) and is_diagonal(C)

    def Cz(self, z: Float[ArrayLike, "*b K"]) -> Float[Array, "*b K"]:
        return jnp.asarray(z) @ self.C.T

    @property
    def C_diagonal(self):
        return jnp.diagonal(self.C)

    def interaction(self) -> AbstractInteraction:
        if self.diagonal_C:
            return DiagonalInteraction(jnp.diagonal(self.C))
        return DenseInteraction(self.C)


class LowRankLotkaVolterra(AbstractLotkaVolterra):
    """A gLV `ż = z ⊙ (r − C z)` (Eq. 32) with `C = diag(d) + U Uᵀ`, never formed densely.

    This is the structure of many modes weakly coupled through a few shared directions; it lets
    `plateau_schedule` handle 10⁴–10⁵ modes. With `q = 0` columns `C` is diagonal (Thm 6).

    **Arguments:**

    - `r`: growth rates, shape `(K,)`.
    - `d`: diagonal part, shape `(K,)`, positive (so `C` is positive definite).
    - `U`: low-rank factor, shape `(K, q)`.
    - `y2`: the loss at `z = 0`.

    `C` is taken as diagonal when `U` has no columns or (concrete) is zero, decided here once and
    kept with the system (the static field `diagonal_C`; `interaction`), eagerly and under
    `jax.jit` alike.
    """

    r: Float[Array, " K"]
    d: Float[Array, " K"]
    U: Float[Array, "K q"]
    y2: Float[Array, ""]
    diagonal_C: bool = eqx.field(static=True)

    def __init__(self, r, d, U, *, y2: ArrayLike = 0.0):
        r = as_array("r", r, ndim=1, allow_bool=False)
        d = as_array("d", d, ndim=1, allow_bool=False)
        U = as_array("U", U, ndim=2, allow_bool=False)
        if np.shape(d) != np.shape(r) or np.shape(U)[0] != np.shape(r)[0]:
            raise LvflowError(f"d, U: shapes {np.shape(d)}, {np.shape(U)} do not match r of shape {np.shape(r)}")
        if isinstance(d, np.ndarray):  # as_array gives numpy for concrete values
            if np.size(d) and float(np.min(d)) <= 0:
                raise LvflowError(
                    f"d: must be positive (C = diag(d) + UUᵀ positive definite), min is {float(np.min(d)):g}"
                )
        else:  # built under jit/vmap: checked when the values are known
            d = eqx.error_if(d, jnp.any(d <= 0), "d: must be positive (C = diag(d) + UUᵀ positive definite)")
        self.r = jnp.asarray(r, dtype=float)
        self.d = jnp.asarray(d, dtype=float)
        self.U = jnp.asarray(U, dtype=float)
        self.y2 = jnp.asarray(as_array("y2", y2, ndim=0, allow_bool=False), dtype=float)
        self.diagonal_C = np.shape(U)[1] == 0 or (isinstance(U, np.ndarray) and not np.any(U))

    @property
    def C(self) -> Float[Array, "K K"]:
        """The dense interaction matrix (`K²` memory: for small systems and tests)."""
        return jnp.diag(self.d) + self.U @ self.U.T

    def Cz(self, z: Float[ArrayLike, "*b K"]) -> Float[Array, "*b K"]:
        """`C z` in `O(K q)`."""
        return LowRankInteraction(self.d, self.U).Cz(jnp.asarray(z))

    @property
    def C_diagonal(self):
        return self.d + jnp.sum(self.U**2, axis=-1)

    def interaction(self) -> AbstractInteraction:
        if self.diagonal_C:
            return DiagonalInteraction(self.d)
        return LowRankInteraction(self.d, self.U)

    def to_dense(self) -> LotkaVolterra:
        """The same system with `C` formed densely."""
        return LotkaVolterra(self.r, self.C, y2=self.y2, check=False)
