"""The saturated equilibrium of the gLV (Eq. 32): one algorithm, with a numpy face for concrete
systems and a JAX face for traced ones (under `jit`/`vmap`, differentiable)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Bool, Float

from .._core.errors import LvflowError, SolverError
from .._core.validate import _is_concrete


def interior_point(
    r: Float[ArrayLike, " K"], d: Float[ArrayLike, " K"], U: Float[ArrayLike, "K q"], xp=jnp
) -> Float[ArrayLike, " K"]:
    """`C⁻¹r` for `C = Diag(d) + UUᵀ` by Woodbury in `O(K q²)`: the saturated equilibrium when all
    its entries are positive. `xp`: `jax.numpy` (traced or not, differentiable) or `numpy` (concrete
    inputs, no device dispatch); the same operations in both."""
    Dr, DU = r / d, U / d[:, None]
    return Dr - DU @ xp.linalg.solve(xp.eye(U.shape[1], dtype=U.dtype) + U.T @ DU, U.T @ Dr)


def saturated_equilibrium(
    r: Float[ArrayLike, " K"],
    *,
    C: Float[ArrayLike, "K K"] | None = None,
    d: Float[ArrayLike, " K"] | None = None,
    U: Float[ArrayLike, "K q"] | None = None,
    active: Bool[ArrayLike, " K"] | None = None,
    tol: float = 1e-12,
) -> tuple[Float[ArrayLike, " K"], Bool[ArrayLike, ""]]:
    """The saturated equilibrium `z*` of `ż = z ⊙ (r − C z)` (Eq. 32) and whether it is unique.

    `z* ≥ 0`, `w = r − C z* ≤ 0` and `z*·w = 0`: the KKT conditions of `min ½zᵀCz − rᵀz` over
    `z ≥ 0` (PSD `C`), the limit of the flow from any positive `z0` when unique. Found by block
    principal pivoting (Júdice & Pires 1994; Kim & Park 2011): guess the support `F` (start:
    `r_k > 0`), solve `C_FF z_F = r_F`, swap every index that violates the conditions; after three
    swaps that do not reduce the number of violations, swap only the last violating index (Murty's
    rule, which terminates for positive definite `C`). For a diagonal `C` the first guess is Thm 6's
    `z*_k = max(r_k, 0)/C_kk`; for `C = Diag(d) + UUᵀ` each solve is Woodbury's, `O(K q²)`.

    Concrete inputs are solved in numpy; traced ones in JAX (the support is found with gradients
    stopped, then `z_F = C_FF⁻¹ r_F` is recomputed, so the derivative is the implicit-function one,
    `dz_F = C_FF⁻¹(dr_F − dC_FF z_F)`, wherever the support does not change).

    **Arguments:**

    - `r`: growth rates, shape `(K,)`.
    - `C`: a dense PSD interaction matrix; or instead
    - `d`, `U`: `C = Diag(d) + UUᵀ` (`U` omitted: `C = Diag(d)`).
    - `active`: optional mask; modes outside it are held at 0.
    - `tol`: violations below `tol · max|r|` are not violations.

    **Returns:** `(z*, unique)`. `unique` is `False` when `C` is singular on the modes that are
    active or marginal (`z_k > 0` or `w_k ≈ 0`; the limit of the flow then depends on `z0`), and
    under `jit` also when the pivoting did not converge or met a singular `C_FF`.

    **Raises:** `LvflowError` (concrete inputs) when a mode has `r_k > 0` but `C_kk ≤ 0` (it grows
    without bound); `SolverError` when the pivoting does not converge.
    """
    if (C is None) == (d is None):
        raise TypeError("saturated_equilibrium: give C, or d (and optionally U)")
    arrays = [x for x in (r, C, d, U, active) if x is not None]
    if all(_is_concrete(x) for x in arrays):
        return _numpy_face(r, C, d, U, active, tol)
    return _jax_face(r, C, d, U, active, tol)


def _numpy_face(r, C, d, U, active, tol):
    r = np.asarray(r, dtype=float)
    K = r.shape[0]
    allowed = np.ones(K, bool) if active is None else np.asarray(active, bool)
    if C is not None:
        C = np.asarray(C, dtype=float)
        diag = np.diagonal(C)
    else:
        d = np.asarray(d, dtype=float)
        U = None if U is None or U.shape[1] == 0 else np.asarray(U, dtype=float)
        diag = d if U is None else d + np.sum(U**2, axis=1)
    grow = allowed & (diag <= 0) & (r > 0)
    if np.any(grow):
        k = int(np.flatnonzero(grow)[0])
        raise LvflowError(f"system: mode {k} has r_k = {r[k]:g} > 0 but C_kk = {diag[k]:g}, so z_k grows without bound")

    def Cz(z):
        if C is not None:
            return C @ z
        return d * z if U is None else d * z + U @ (U.T @ z)

    def solve_on(F):
        z = np.zeros(K)
        if not np.any(F):
            return z
        if C is None and U is None:
            z[F] = r[F] / d[F]
        elif C is None:
            z[F] = interior_point(r[F], d[F], U[F], xp=np)
        else:
            CFF = C[np.ix_(F, F)]
            try:
                z[F] = np.linalg.solve(CFF, r[F])
            except np.linalg.LinAlgError:  # singular C_FF (e.g. two identical features): least norm
                z[F] = np.linalg.lstsq(CFF, r[F], rcond=None)[0]
        return z

    z, converged = _pivot(r, Cz, solve_on, allowed, tol, np, _python_while)
    if not converged:
        raise SolverError("saturated equilibrium: block principal pivoting did not converge")
    return z, np.asarray(_is_unique(r, C, diag, U is not None, z, np))


def _jax_face(r, C, d, U, active, tol):
    r = jnp.asarray(r, dtype=float)
    K = r.shape[0]
    allowed = jnp.ones(K, bool) if active is None else jnp.asarray(active, bool)
    low_rank = C is None and U is not None and U.shape[1] > 0
    if C is not None:
        C = jnp.asarray(C, dtype=float)
        diag = jnp.diagonal(C)
    else:
        d = jnp.asarray(d, dtype=float)
        U = jnp.asarray(U, dtype=float) if low_rank else None
        diag = d if U is None else d + jnp.sum(U**2, axis=1)

    def make(r, C, d, U):
        def Cz(z):
            if C is not None:
                return C @ z
            return d * z if U is None else d * z + U @ (U.T @ z)

        def solve_on(F):
            b = jnp.where(F, r, 0.0)
            if C is None and U is None:
                z = b / jnp.where(F, d, 1.0)
            elif C is None:
                z = interior_point(b, jnp.where(F, d, 1.0), jnp.where(F[:, None], U, 0.0))
            else:
                A = jnp.where(F[:, None] & F[None, :], C, jnp.eye(K, dtype=C.dtype))
                z = jnp.linalg.solve(A, b)
                # singular C_FF (e.g. two identical features): the least-norm solution, as numpy's
                z = jax.lax.cond(jnp.all(jnp.isfinite(z)), lambda: z, lambda: jnp.linalg.lstsq(A, b)[0])
            return jnp.where(F, z, 0.0)

        return Cz, solve_on

    stopped = jax.lax.stop_gradient((r, C, d, U))
    Cz, solve_on = make(*stopped)
    F, converged = _pivot(stopped[0], Cz, solve_on, allowed, tol, jnp, jax.lax.while_loop, support=True)
    z = jnp.maximum(make(r, C, d, U)[1](F), 0.0)  # the same z, now with its derivative
    bounded = ~jnp.any(allowed & (diag <= 0) & (r > 0))
    ok = converged & bounded & jnp.all(jnp.isfinite(z))
    return z, ok & _is_unique(r, C, diag, low_rank, jax.lax.stop_gradient(z), jnp)


def _python_while(cond, body, state):
    while cond(state):
        state = body(state)
    return state


def _pivot(r, Cz, solve_on, allowed, tol, xp, while_loop, *, support=False):
    """Block principal pivoting on the KKT conditions; returns `(z, converged)`, or with `support`
    the final support mask in place of `z`."""
    K = r.shape[0]
    idx = xp.arange(K)
    scale = xp.maximum(xp.max(xp.abs(r)), np.finfo(float).tiny) if K else 1.0
    atol = tol * scale

    def infeasible(F, z):
        return (F & (z < -atol)) | (~F & allowed & (r - Cz(z) > atol))

    def cond(state):
        it, F, z, bad, best, strikes = state
        return (it < 3 * K + 10) & xp.any(bad)

    def body(state):
        it, F, z, bad, best, strikes = state
        n = xp.sum(bad)
        strikes = xp.where(n < best, 0, strikes + 1)
        best = xp.minimum(best, n)
        single = (idx == xp.max(xp.where(bad, idx, -1))) & bad
        F = F ^ xp.where(strikes >= 3, single, bad)
        z = solve_on(F)
        return it + 1, F, z, infeasible(F, z), best, strikes

    F0 = allowed & (r > 0)
    z0 = solve_on(F0)
    _, F, z, bad, _, _ = while_loop(cond, body, (0, F0, z0, infeasible(F0, z0), K + 1, 0))
    return (F if support else xp.maximum(z, 0.0)), ~xp.any(bad)


def _is_unique(r, C, diag, low_rank, z, xp, rtol=1e-10):
    """Whether `z` is the only minimiser: `C` positive definite on the modes that are active or
    marginal (`z_k > 0` or `r_k − (Cz)_k ≈ 0`), so no feasible direction leaves the loss flat."""
    if low_rank:
        return xp.all(diag > 0) if xp is jnp else True  # Diag(d) + UUᵀ with d > 0
    scale = xp.maximum(xp.max(xp.abs(r)), np.finfo(float).tiny) if r.shape[0] else 1.0
    top = xp.maximum(xp.max(diag), np.finfo(float).tiny) if r.shape[0] else 1.0  # within K of λ_max
    Cz = C @ z if C is not None else diag * z
    T = (z > 0) | (r - Cz > -1e-9 * scale)
    if C is None:
        return xp.all(~T | (diag > rtol * top))
    if xp is np:
        if not np.any(T):
            return True
        CT = C[np.ix_(T, T)]
        try:  # Cholesky of C_TT − δI succeeds iff λ_min(C_TT) > δ; cheaper than an eigensolve
            np.linalg.cholesky((CT + CT.T) / 2 - rtol * top * np.eye(CT.shape[0]))
        except np.linalg.LinAlgError:
            return False
        return True
    K = r.shape[0]
    A = jnp.where(T[:, None] & T[None, :], (C + C.T) / 2, (1 + rtol) * top * jnp.eye(K, dtype=C.dtype))
    return jnp.all(jnp.isfinite(jnp.linalg.cholesky(A - rtol * top * jnp.eye(K, dtype=C.dtype))))
