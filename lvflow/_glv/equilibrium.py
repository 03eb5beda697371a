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
    `z ≥ 0` (PSD `C`, singular or not), the limit of the flow from any positive `z0` when unique.
    Found by a primal active-set method (Lawson & Hanson 1974, ch. 23, for a PSD quadratic): `z`
    stays feasible and its support `F` keeps `C_FF` nonsingular. While some mode `k ∉ F` has
    `w_k > 0`, the one with the largest `w_k` enters; if it is linearly dependent on `F` (the Schur
    complement `C_kk − C_kF C_FF⁻¹ C_Fk` vanishes), `z` moves along `v = e_k − C_FF⁻¹ C_Fk` (`Cv = 0`,
    `rᵀv = w_k > 0`) until a mode of `F` reaches 0 and leaves, so `F` stays nonsingular. Then
    `z_F → C_FF⁻¹ r_F`, stopping where a mode of `F` reaches 0 (it leaves). For a diagonal `C` the
    start is Thm 6's `z*_k = max(r_k, 0)/C_kk`; for `C = Diag(d) + UUᵀ` each solve is Woodbury's,
    `O(K q²)`.

    Concrete inputs are solved in numpy; traced ones in JAX (the support is found with gradients
    stopped, then `z_F = C_FF⁻¹ r_F` is recomputed, so the derivative is the implicit-function one,
    `dz_F = C_FF⁻¹(dr_F − dC_FF z_F)`, wherever the support does not change).

    **Arguments:**

    - `r`: growth rates, shape `(K,)`.
    - `C`: a dense PSD interaction matrix; or instead
    - `d`, `U`: `C = Diag(d) + UUᵀ` (`U` omitted: `C = Diag(d)`; traced: `d > 0`).
    - `active`: optional mask; modes outside it are held at 0.
    - `tol`: violations below `tol · max|r|` are not violations.

    **Returns:** `(z*, unique)`. `unique` is `False` when `C` is singular on the modes that are
    active or marginal (`z_k > 0` or `w_k ≈ 0`), which it is whenever the minimiser is not unique
    (the limit of the flow then depends on `z0`; the minimum loss does not); under `jit` also when
    the loss is unbounded below or the method did not converge.

    **Raises:** `LvflowError` (concrete inputs) when the loss is unbounded below (a direction
    `v ≥ 0` with `Cv = 0` and `rᵀv > 0`, e.g. a mode with `r_k > 0` but `C_kk ≤ 0`: it grows without
    bound); `SolverError` when the method does not converge.
    """
    if (C is None) == (d is None):
        raise TypeError("saturated_equilibrium: give C, or d (and optionally U)")
    arrays = [x for x in (r, C, d, U, active) if x is not None]
    if all(_is_concrete(x) for x in arrays):
        return _numpy_face(r, C, d, U, active, tol)
    return _jax_face(r, C, d, U, active, tol)


#: a mode whose Schur complement against the support is below this fraction of `C_kk` is dependent
_DEPENDENT = 1e-10


def _numpy_face(r, C, d, U, active, tol):
    r = np.asarray(r, dtype=float)
    K = r.shape[0]
    allowed = np.ones(K, bool) if active is None else np.asarray(active, bool)
    if C is not None:
        C = np.asarray(C, dtype=float)
        diag = np.diagonal(C).copy()
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

    def column(k):
        if C is not None:
            return C[:, k]
        c = np.zeros(K) if U is None else U @ U[k]
        c[k] += d[k]
        return c

    def solve(F, b):
        x = np.zeros(K)
        if not np.any(F):
            return x
        if C is None and U is None:
            x[F] = b[F] / d[F]
        elif C is None and np.all(d[F] > 0):
            x[F] = interior_point(b[F], d[F], U[F], xp=np)
        else:
            CFF = C[np.ix_(F, F)] if C is not None else np.diag(d[F]) + U[F] @ U[F].T
            try:
                x[F] = np.linalg.solve(CFF, b[F])
            except np.linalg.LinAlgError:  # C_FF is nonsingular by construction, up to rounding
                x[F] = np.linalg.lstsq(CFF, b[F], rcond=None)[0]
        return x

    F0 = allowed & (r > 0)
    start = None
    if C is not None:
        C0 = C[np.ix_(F0, F0)]
    elif U is not None and not np.all(d[F0] > 0):
        C0 = np.diag(d[F0]) + U[F0] @ U[F0].T
    else:
        C0 = None  # Diag(d) (+ UUᵀ) with d > 0: positive definite
    if C0 is None or _positive_definite(C0, np.max(diag, initial=0.0)):
        z0 = solve(F0, r)
        if np.all(z0[F0] > 0):
            start = (F0, z0)
    F, z, status = _active_set(r, Cz, column, solve, diag, allowed, tol, start, np, _python_while, _python_cond)
    if status == _UNBOUNDED:
        raise LvflowError("system: the loss is unbounded below (a direction v ≥ 0 with Cv = 0 and rᵀv > 0)")
    if status != _OPTIMAL:
        raise SolverError("saturated equilibrium: the active-set method did not converge")
    return z, np.asarray(_is_unique(r, C, d, U, diag, z, np))


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

        def column(k):
            if C is not None:
                return C[:, k]
            c = jnp.zeros(K, dtype=d.dtype) if U is None else U @ U[k]
            return c.at[k].add(d[k])

        def solve(F, b):
            b = jnp.where(F, b, 0.0)
            if C is None and U is None:
                x = b / jnp.where(F, d, 1.0)
            elif C is None:
                x = interior_point(b, jnp.where(F, d, 1.0), jnp.where(F[:, None], U, 0.0))
            else:
                x = jnp.linalg.solve(jnp.where(F[:, None] & F[None, :], C, jnp.eye(K, dtype=C.dtype)), b)
            return jnp.where(F, x, 0.0)

        return Cz, column, solve

    stopped = jax.lax.stop_gradient((r, C, d, U))
    Cz, column, solve = make(*stopped)
    F, _, status = _active_set(
        stopped[0],
        Cz,
        column,
        solve,
        jax.lax.stop_gradient(diag),
        allowed,
        tol,
        None,
        jnp,
        jax.lax.while_loop,
        jax.lax.cond,
    )
    z = jnp.maximum(make(r, C, d, U)[2](F, r), 0.0)  # the same z, now with its derivative
    ok = (status == _OPTIMAL) & jnp.all(jnp.isfinite(z))
    return z, ok & _is_unique(r, C, d, U, diag, jax.lax.stop_gradient(z), jnp)


def _python_while(cond, body, state):
    while cond(state):
        state = body(state)
    return state


def _python_cond(pred, true_fn, false_fn):
    return true_fn() if pred else false_fn()


def _positive_definite(A, top, rtol=1e-10):
    """Whether the symmetric PSD `A` has `λ_min(A) > rtol · top` (Cholesky of the shifted `A`)."""
    if A.shape[0] == 0:
        return True
    try:
        np.linalg.cholesky((A + A.T) / 2 - rtol * max(top, np.finfo(float).tiny) * np.eye(A.shape[0]))
    except np.linalg.LinAlgError:
        return False
    return True


_RUNNING, _OPTIMAL, _UNBOUNDED = 0, 1, 2


def _active_set(r, Cz, column, solve, diag, allowed, tol, start, xp, while_loop, cond):
    """The primal active-set method of `saturated_equilibrium`; returns `(F, z, status)`.

    `column(k)` is `C[:, k]`, `solve(F, b)` is `C_FF⁻¹ b_F` (0 off `F`); `start`, when given, is a
    feasible `(F, z)` with `C_FF` nonsingular and `z_F = C_FF⁻¹ r_F > 0`.
    """
    K = r.shape[0]
    idx = xp.arange(K)
    tiny = np.finfo(float).tiny
    scale = xp.maximum(xp.max(xp.abs(r)), tiny) if K else 1.0
    atol = tol * scale
    if start is None:
        F0, z0, add0 = xp.zeros(K, bool), xp.zeros(K, dtype=r.dtype), True
    else:
        (F0, z0), add0 = start, True

    def enter(F, z):
        """A mode with `w_k > 0` enters the support, or the loss is minimal (or unbounded)."""
        w = r - Cz(z)
        candidate = ~F & allowed & (w > atol)
        optimal = lambda: (F, z, xp.asarray(_OPTIMAL, dtype=xp.int32))  # noqa: E731
        return cond(xp.any(candidate), lambda: step(F, z, w, candidate), optimal)  # no column when none enters

    def step(F, z, w, candidate):
        """Mode `k` (the largest `w_k`) enters; if it depends on `F`, `z` moves along `C v = 0`
        until a mode of `F` reaches 0 (it leaves), or without bound (the loss is unbounded)."""
        k = xp.argmax(xp.where(candidate, w, -xp.inf))
        c = column(k)
        x = solve(F, c)
        schur = diag[k] - c @ x
        dependent = schur <= _DEPENDENT * xp.maximum(diag[k], tiny)
        v = xp.where(idx == k, 1.0, -x)  # C v = 0 when k is dependent
        falls = F & (v < 0)
        ratio = xp.where(falls, z / xp.where(falls, -v, 1.0), xp.inf)
        j = xp.argmin(ratio)
        moving = dependent & xp.any(falls)
        length = xp.where(moving, ratio[j], 0.0)
        z = xp.where(moving, xp.where(idx == j, 0.0, xp.maximum(z + length * v, 0.0)), z)
        F = F | (idx == k)
        F = xp.where(moving, F & (idx != j), F)
        unbounded = dependent & ~xp.any(falls)
        return F, z, xp.asarray(xp.where(unbounded, _UNBOUNDED, _RUNNING), dtype=xp.int32)

    def descend(F, z):
        """`z_F` moves towards `C_FF⁻¹ r_F`, stopping where a mode of `F` reaches 0 (it leaves)."""
        p = solve(F, r)
        below = F & (p <= 0)
        ratio = xp.where(below, z / xp.where(below, xp.maximum(z - p, tiny), 1.0), xp.inf)
        j = xp.argmin(ratio)
        alpha = xp.where(xp.any(below), ratio[j], 1.0)
        z_new = xp.where(F, z + alpha * (p - z), 0.0)
        z_new = xp.where(xp.any(below) & (idx == j), 0.0, z_new)
        F_new = F & (z_new > 0)
        return F_new, xp.where(F_new, z_new, 0.0), ~xp.any(below)

    def body(state):
        it, F, z, add, status = state

        def entering():
            F1, z1, s1 = enter(F, z)
            return F1, z1, xp.asarray(False), s1

        def descending():
            F1, z1, done = descend(F, z)
            return F1, z1, done, xp.asarray(_RUNNING, dtype=xp.int32)

        F, z, add, status = cond(add, entering, descending)
        return it + 1, F, z, add, status

    def keep_going(state):
        it, _, _, _, status = state
        return (it < 10 * K + 20) & (status == _RUNNING)

    state = (0, F0, z0, xp.asarray(add0), xp.asarray(_RUNNING, dtype=xp.int32))
    _, F, z, _, status = while_loop(keep_going, body, state)
    return F, xp.maximum(z, 0.0), status


def _is_unique(r, C, d, U, diag, z, xp, rtol=1e-10):
    """Whether `z` is the only minimiser: `C` positive definite on the modes that are active or
    marginal (`z_k > 0` or `r_k − (Cz)_k ≈ 0`), so no feasible direction leaves the loss flat."""
    K = r.shape[0]
    if K == 0:
        return True if xp is np else jnp.asarray(True)
    scale = xp.maximum(xp.max(xp.abs(r)), np.finfo(float).tiny)
    top = xp.maximum(xp.max(diag), np.finfo(float).tiny)  # within K of λ_max
    if C is not None:
        Cz = C @ z
    else:
        Cz = d * z if U is None else d * z + U @ (U.T @ z)
    T = (z > 0) | (r - Cz > -1e-9 * scale)
    if C is None and U is None:
        return xp.all(~T | (diag > rtol * top))
    if C is None:
        if xp is jnp:
            return jnp.all(d > 0)  # Diag(d) + UUᵀ with d > 0
        if np.all(d[T] > 0):
            return True
        return _positive_definite(np.diag(d[T]) + U[T] @ U[T].T, top, rtol)
    if xp is np:
        return _positive_definite(C[np.ix_(T, T)], top, rtol)
    A = jnp.where(T[:, None] & T[None, :], (C + C.T) / 2, (1 + rtol) * top * jnp.eye(K, dtype=C.dtype))
    return jnp.all(jnp.isfinite(jnp.linalg.cholesky(A - rtol * top * jnp.eye(K, dtype=C.dtype))))
