"""The generalized Lotka–Volterra system of the NQF in a shared eigenbasis (Eq. 31–32)."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from equinox import AbstractVar
from jaxtyping import Array, Bool, Float

from .._errors import LvflowError
from .._validate import _is_concrete, as_array, check_psd
from .interaction import AbstractInteraction, DenseInteraction, DiagonalInteraction, LowRankInteraction, is_diagonal


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
    def Cz(self, z: Float[Array, "*b K"]) -> Float[Array, "*b K"]:
        """`C z` in the structure's cost."""

    @property
    @abc.abstractmethod
    def C_diagonal(self) -> Float[Array, " K"]:
        """The diagonal `C_kk`."""

    @abc.abstractmethod
    def interaction(self) -> AbstractInteraction:
        """`C` as `solve_lv`'s solvers apply it (diagonal when it is concretely diagonal)."""

    def vector_field(self, t, z: Float[Array, " K"], args=None) -> Float[Array, " K"]:
        """`ż = z ⊙ (r − C z)` (Eq. 32), in diffrax's `(t, y, args)` signature."""
        return z * (self.r - self.Cz(z))

    def log_vector_field(self, t, u: Float[Array, " K"], args=None) -> Float[Array, " K"]:
        """The same flow in `u = ln z`: `u̇ = r − C e^u`. Removes the stiffness of tiny `z`."""
        return self.r - self.Cz(jnp.exp(u))

    def loss(self, z: Float[Array, "*b K"]) -> Float[Array, "*b"]:
        """`L(z) = zᵀCz/8 − rᵀz/4 + y2`, the paper's loss (Eq. 26) in modes."""
        return jnp.sum(z * self.Cz(z), axis=-1) / 8 - z @ self.r / 4 + self.y2

    def excess_loss(self, z: Float[Array, "*b K"]) -> Float[Array, "*b"]:
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
        """Loss drop of each isolated mode, `V_k = r_k² / (8 C_kk)` (Thm 6, §4)."""
        return jnp.where(self.r > 0, self.r**2 / (8 * self.C_diagonal), 0.0)

    def equilibrium(self, active=None, *, tol: float = 1e-12) -> Float[Array, " K"]:
        """The saturated equilibrium `z* ≥ 0`: `r − C z* ≤ 0`, with equality where `z* > 0`.

        For PSD `C` it minimises `½ zᵀCz − rᵀz` over `z ≥ 0` (a convex QP, solved by
        Lawson–Hanson active sets); it is the limit of the flow from any positive `z0` when unique.
        With `active` (a boolean mask), modes outside it are held at 0.
        """
        return jnp.asarray(saturated_equilibrium(np.asarray(self.C), np.asarray(self.r), active, tol=tol))


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
    """

    r: Float[Array, " K"]
    C: Float[Array, "K K"]
    y2: Float[Array, ""]
    P: Float[Array, "p K"] | None

    def __init__(self, r, C, *, y2=0.0, P=None, check: bool = True):
        r = as_array("r", r, ndim=1)
        C = as_array("C", C, ndim=2)
        if np.shape(C) != (np.shape(r)[0],) * 2:
            raise LvflowError(f"C: shape {np.shape(C)} does not match r of shape {np.shape(r)} (need (K, K))")
        if check:
            check_psd("C", C)
        self.r = jnp.asarray(r)
        self.C = jnp.asarray(C)
        self.y2 = jnp.asarray(as_array("y2", y2, ndim=0), dtype=self.r.dtype)
        self.P = None if P is None else jnp.asarray(P)

    def Cz(self, z):
        return z @ self.C.T

    @property
    def C_diagonal(self):
        return jnp.diagonal(self.C)

    def interaction(self) -> AbstractInteraction:
        C = self.C
        if _is_concrete(C):
            Cn = np.asarray(C)  # host view: no device dispatch for the check and the diagonal
            if is_diagonal(Cn):
                return DiagonalInteraction(jnp.asarray(np.diagonal(Cn)))
        return DenseInteraction(C)


class LowRankLotkaVolterra(AbstractLotkaVolterra):
    """A gLV `ż = z ⊙ (r − C z)` (Eq. 32) with `C = diag(d) + U Uᵀ`, never formed densely.

    This is the structure of many modes weakly coupled through a few shared directions; it lets
    `plateau_schedule` handle 10⁴–10⁵ modes. With `q = 0` columns `C` is diagonal (Thm 6).

    **Arguments:**

    - `r`: growth rates, shape `(K,)`.
    - `d`: diagonal part, shape `(K,)`, positive (so `C` is positive definite).
    - `U`: low-rank factor, shape `(K, q)`.
    - `y2`: the loss at `z = 0`.
    """

    r: Float[Array, " K"]
    d: Float[Array, " K"]
    U: Float[Array, "K q"]
    y2: Float[Array, ""]

    def __init__(self, r, d, U, *, y2=0.0):
        r = as_array("r", r, ndim=1)
        d = as_array("d", d, ndim=1)
        U = as_array("U", U, ndim=2)
        if np.shape(d) != np.shape(r) or np.shape(U)[0] != np.shape(r)[0]:
            raise LvflowError(f"d, U: shapes {np.shape(d)}, {np.shape(U)} do not match r of shape {np.shape(r)}")
        if _is_concrete(d):
            if np.size(d) and float(np.min(d)) <= 0:
                raise LvflowError(
                    f"d: must be positive (C = diag(d) + UUᵀ positive definite), min is {float(np.min(d)):g}"
                )
        else:  # built under jit/vmap: checked when the values are known
            d = eqx.error_if(d, jnp.any(d <= 0), "d: must be positive (C = diag(d) + UUᵀ positive definite)")
        self.r = jnp.asarray(r, dtype=float)
        self.d = jnp.asarray(d, dtype=float)
        self.U = jnp.asarray(U, dtype=float)
        self.y2 = jnp.asarray(as_array("y2", y2, ndim=0), dtype=float)

    @property
    def C(self) -> Float[Array, "K K"]:
        """The dense interaction matrix (`K²` memory: for small systems and tests)."""
        return jnp.diag(self.d) + self.U @ self.U.T

    def Cz(self, z: Float[Array, "*b K"]) -> Float[Array, "*b K"]:
        """`C z` in `O(K q)`."""
        return self.d * z + (z @ self.U) @ self.U.T

    @property
    def C_diagonal(self):
        return self.d + jnp.sum(self.U**2, axis=-1)

    def interaction(self) -> AbstractInteraction:
        U = self.U
        if U.shape[1] == 0 or (_is_concrete(U) and not np.any(np.asarray(U))):
            return DiagonalInteraction(self.d)
        return LowRankInteraction(self.d, U)

    def equilibrium(self, active=None, *, tol: float = 1e-12) -> Float[Array, " K"]:
        """The saturated equilibrium (as `AbstractLotkaVolterra.equilibrium`): the interior point
        `C⁻¹r` by Woodbury in `O(K q²)` when it is positive and no `active` mask is given, else
        the dense active-set solve."""
        if active is None:
            z = interior_point(*(np.asarray(x, dtype=float) for x in (self.r, self.d, self.U)), xp=np)
            if np.all(z > 0):
                return jnp.asarray(z)
        return super().equilibrium(active, tol=tol)

    def to_dense(self) -> LotkaVolterra:
        """The same system with `C` formed densely."""
        return LotkaVolterra(self.r, self.C, y2=self.y2, check=False)


def interior_point(r: Float[Array, " K"], d: Float[Array, " K"], U: Float[Array, "K q"], xp=jnp) -> Float[Array, " K"]:
    """`C⁻¹r` for `C = Diag(d) + UUᵀ` by Woodbury in `O(K q²)`: the saturated equilibrium when all
    its entries are positive. `xp`: `jax.numpy` (traced or not, differentiable) or `numpy` (concrete
    inputs, no device dispatch); the same operations in both."""
    Dr, DU = r / d, U / d[:, None]
    return Dr - DU @ xp.linalg.solve(xp.eye(U.shape[1], dtype=U.dtype) + U.T @ DU, U.T @ Dr)


def saturated_equilibrium(C: np.ndarray, r: np.ndarray, active=None, *, tol: float = 1e-12) -> np.ndarray:
    """Lawson–Hanson active-set solution of `min ½zᵀCz − rᵀz, z ≥ 0` (numpy; `C` PSD).

    The KKT conditions are the gLV's saturation conditions: `z ≥ 0`, `w = r − Cz ≤ 0`, `z·w = 0`.
    """
    C = np.asarray(C, dtype=float)
    r = np.asarray(r, dtype=float)
    K = r.shape[0]
    allowed = np.ones(K, bool) if active is None else np.asarray(active, bool)
    scale = max(float(np.max(np.abs(r))) if K else 1.0, np.finfo(float).tiny)
    fast = _equilibrium_fast_path(C, r, allowed, tol * scale)
    if fast is not None:
        return fast
    z = np.zeros(K)
    P = np.zeros(K, bool)
    for _ in range(3 * K + 10):
        w = r - C @ z
        cand = np.where(allowed & ~P, w, -np.inf)
        k = int(np.argmax(cand)) if K else 0
        if K == 0 or cand[k] <= tol * scale:
            break
        P[k] = True
        while True:
            idx = np.flatnonzero(P)
            s = np.zeros(K)
            s[idx] = np.linalg.lstsq(C[np.ix_(idx, idx)], r[idx], rcond=None)[0]
            if np.all(s[idx] > 0):
                z = s
                break
            neg = idx[s[idx] <= 0]
            alpha = np.min(z[neg] / (z[neg] - s[neg] + 1e-300))
            z = z + alpha * (s - z)
            P &= z > tol * scale
            z[~P] = 0.0
    return z


def _equilibrium_fast_path(C: np.ndarray, r: np.ndarray, allowed: np.ndarray, tol: float) -> np.ndarray | None:
    """Closed forms that skip the O(K⁴) active-set loop: diagonal `C` (`z*_k = max(r_k, 0)/C_kk`,
    Thm 6), or an interior solution `C z = r` with every `z_k > 0` (checked against KKT)."""
    K = r.shape[0]
    if K == 0:
        return np.zeros(0)
    d = np.diagonal(C)
    if np.count_nonzero(C - np.diag(d)) == 0:
        if np.any(allowed & (d <= 0) & (r > tol)):
            return None  # unbounded growth: let the general path report what it finds
        return np.where(allowed & (r > 0) & (d > 0), np.maximum(r, 0) / np.where(d > 0, d, 1.0), 0.0)
    idx = np.flatnonzero(allowed)
    try:
        zi = np.linalg.solve(C[np.ix_(idx, idx)], r[idx])
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(zi)) or np.any(zi <= 0):
        return None
    z = np.zeros(K)
    z[idx] = zi
    w = r - C @ z
    if np.max(np.abs(w[idx])) > 1e3 * tol or np.any(w[~allowed] > tol):
        return None
    return z


def equilibrium_is_unique(C, r, z, *, rtol: float = 1e-10) -> bool:
    """Whether the saturated equilibrium `z` is the only minimiser of `½zᵀCz − rᵀz` on `z ≥ 0`.

    Sufficient test: `C` is positive definite on every mode that is active (`z_k > 0`) or
    marginal (`r_k − (Cz)_k ≈ 0`), so no direction within the constraints leaves the loss flat.
    When it fails (a singular `C`, e.g. two identical features) the limit of the flow depends on
    `z0` (the flow conserves `ln z` along the null space of `C`).
    """
    C = np.asarray(C, dtype=float)
    r = np.asarray(r, dtype=float)
    z = np.asarray(z, dtype=float)
    if r.size == 0:
        return True
    scale = max(float(np.max(np.abs(r))), np.finfo(float).tiny)
    w = r - C @ z
    T = (z > 0) | (w > -1e-9 * scale)
    if not np.any(T):
        return True
    CT = C[np.ix_(T, T)]
    d = np.diagonal(C)
    top = max(float(np.max(d)), np.finfo(float).tiny)  # within a factor K of the top eigenvalue
    if np.count_nonzero(CT - np.diag(np.diagonal(CT))) == 0:
        return bool(np.min(np.diagonal(CT)) > rtol * top)
    try:  # Cholesky of C_TT − δI succeeds iff λ_min(C_TT) > δ; cheaper than an eigensolve
        np.linalg.cholesky((CT + CT.T) / 2 - rtol * top * np.eye(CT.shape[0]))
    except np.linalg.LinAlgError:
        return False
    return True


def saturated_equilibrium_jax(
    r: Float[Array, " K"], C: Float[Array, "K K"], *, max_iter: int | None = None
) -> tuple[Float[Array, " K"], Bool[Array, ""]]:
    """`saturated_equilibrium` for traced inputs (under `jit`/`vmap` over systems).

    Block principal pivoting (Júdice & Pires 1994; Kim & Park 2011) on the KKT conditions
    `z ≥ 0, w = r − Cz ≤ 0, z·w = 0`: guess the support `F`, solve `C_FF z_F = r_F`, and swap every
    index that violates the conditions; after three swaps that do not reduce the number of
    violations, swap only the largest violating index (Murty's rule, which terminates). Every
    iteration is one masked `K × K` solve. Returns `(z, converged)`; not converged (or a singular
    `C_FF`) is reported, never silently returned as a solution.

    Differentiable: the support `F` is found on `r`, `C` with their gradients stopped, and `z` is
    then `C_FF⁻¹ r_F` on it, whose derivative is the implicit-function one of the equilibrium
    (`dz_F = C_FF⁻¹ (dr_F − dC_FF z_F)`, `dz = 0` off `F`) wherever the support does not change.
    """
    r_diff, C_diff = r, C
    r, C = jax.lax.stop_gradient(r), jax.lax.stop_gradient(C)
    K = r.shape[-1]
    max_iter = 3 * K + 10 if max_iter is None else max_iter
    scale = jnp.maximum(jnp.max(jnp.abs(r)), jnp.finfo(r.dtype).tiny)
    tol = 1e-11 * scale
    eye = jnp.eye(K, dtype=C.dtype)
    idx = jnp.arange(K)

    def solve(F, r=r, C=C):
        FF = F[:, None] & F[None, :]
        A = jnp.where(FF, C, eye)
        z = jnp.linalg.solve(A, jnp.where(F, r, 0.0))
        return jnp.where(F, z, 0.0)

    def infeasible(F, z):
        w = r - C @ z
        return (F & (z < -tol)) | (~F & (w > tol))

    def cond(state):
        it, F, z, bad, best, strikes = state
        return (it < max_iter) & jnp.any(bad)

    def body(state):
        it, F, z, bad, best, strikes = state
        n = jnp.sum(bad)
        improved = n < best
        strikes = jnp.where(improved, 0, strikes + 1)
        best = jnp.minimum(best, n)
        single = (idx == jnp.max(jnp.where(bad, idx, -1))) & bad
        swap = jnp.where(strikes >= 3, single, bad)
        F = F ^ swap
        z = solve(F)
        return it + 1, F, z, infeasible(F, z), best, strikes

    F0 = r > 0
    z0 = solve(F0)
    state = (0, F0, z0, infeasible(F0, z0), K + 1, 0)
    it, F, z, bad, _, _ = jax.lax.while_loop(cond, body, state)
    ok = ~jnp.any(bad) & jnp.all(jnp.isfinite(z))
    z = solve(F, r_diff, C_diff)  # the same z, now with its derivative
    return jnp.maximum(z, 0.0), ok
