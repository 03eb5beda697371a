"""The generalized Lotka–Volterra system of the NQF in a shared eigenbasis (Eq. 31–32)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._errors import LvflowError
from ._validate import as_array, check_psd


class LotkaVolterra(eqx.Module):
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

    @property
    def K(self) -> int:
        """Number of modes."""
        return self.r.shape[-1]

    def vector_field(self, t, z: Float[Array, " K"], args=None) -> Float[Array, " K"]:
        """`ż = z ⊙ (r − C z)` (Eq. 32), in diffrax's `(t, y, args)` signature."""
        return z * (self.r - self.C @ z)

    def log_vector_field(self, t, u: Float[Array, " K"], args=None) -> Float[Array, " K"]:
        """The same flow in `u = ln z`: `u̇ = r − C e^u`. Removes the stiffness of tiny `z`."""
        return self.r - self.C @ jnp.exp(u)

    def loss(self, z: Float[Array, "*b K"]) -> Float[Array, "*b"]:
        """`L(z) = zᵀCz/8 − rᵀz/4 + y2`, the paper's loss (Eq. 26) in modes."""
        return jnp.einsum("...i,ij,...j->...", z, self.C, z) / 8 - z @ self.r / 4 + self.y2

    def excess_loss(self, z: Float[Array, "*b K"]) -> Float[Array, "*b"]:
        """`L(z) − L(z*)`, with `z*` the saturated equilibrium."""
        zs = self.equilibrium()
        return self.loss(z) - self.loss(zs)

    @property
    def zeta(self) -> Float[Array, " K"]:
        """Ignition rates `ζ_k = r_k` (Thm 8 with `a = 1`)."""
        return self.r

    @property
    def V(self) -> Float[Array, " K"]:
        """Loss drop of each isolated mode, `V_k = r_k² / (8 C_kk)` (Thm 6, §4)."""
        return jnp.where(self.r > 0, self.r**2 / (8 * jnp.diagonal(self.C)), 0.0)

    def equilibrium(self, active=None, *, tol: float = 1e-12) -> Float[Array, " K"]:
        """The saturated equilibrium `z* ≥ 0`: `r − C z* ≤ 0`, with equality where `z* > 0`.

        For PSD `C` it minimises `½ zᵀCz − rᵀz` over `z ≥ 0` (a convex QP, solved by
        Lawson–Hanson active sets); it is the limit of the flow from any positive `z0` when unique.
        With `active` (a boolean mask), modes outside it are held at 0.
        """
        return jnp.asarray(saturated_equilibrium(np.asarray(self.C), np.asarray(self.r), active, tol=tol))


def saturated_equilibrium(C: np.ndarray, r: np.ndarray, active=None, *, tol: float = 1e-12) -> np.ndarray:
    """Lawson–Hanson active-set solution of `min ½zᵀCz − rᵀz, z ≥ 0` (numpy; `C` PSD).

    The KKT conditions are the gLV's saturation conditions: `z ≥ 0`, `w = r − Cz ≤ 0`, `z·w = 0`.
    """
    C = np.asarray(C, dtype=float)
    r = np.asarray(r, dtype=float)
    K = r.shape[0]
    allowed = np.ones(K, bool) if active is None else np.asarray(active, bool)
    scale = max(float(np.max(np.abs(r))) if K else 1.0, np.finfo(float).tiny)
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
