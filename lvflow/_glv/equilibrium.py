"""The saturated equilibrium of the gLV (Eq. 32): a primal active-set method written once against
`AbstractInteraction`, compiled by JAX (eager calls and traced ones run the same program)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .._core.errors import LvflowError, SolverError
from .interaction import AbstractInteraction

#: a mode whose Schur complement against the support is below this fraction of `C_kk` is dependent
_DEPENDENT = 1e-10
#: `C_FF` of the start (the modes with `r_k > 0`) counts as nonsingular above this fraction of `max C_kk`
_START_RTOL = 1e-10
_TINY = np.finfo(float).tiny

_RUNNING, _OPTIMAL, _UNBOUNDED, _GROWS = 0, 1, 2, 3


def saturated_equilibrium(
    r: Float[ArrayLike, " K"],
    interaction: AbstractInteraction,
    *,
    active: Bool[ArrayLike, " K"] | None = None,
    tol: float = 1e-12,
) -> tuple[Float[Array, " K"], Bool[Array, ""]]:
    """The saturated equilibrium `z*` of `ż = z ⊙ (r − C z)` (Eq. 32) and whether it is unique.

    `z* ≥ 0`, `w = r − C z* ≤ 0` and `z*·w = 0`: the KKT conditions of `min ½zᵀCz − rᵀz` over
    `z ≥ 0` (PSD `C`, singular or not), the limit of the flow from any positive `z0` when unique.
    Found by a primal active-set method (Lawson & Hanson 1974, ch. 23, for a PSD quadratic): `z`
    stays feasible and its support `F` keeps `C_FF` nonsingular. It starts from `z_F = C_FF⁻¹ r_F`
    on the modes with `r_k > 0` when that is positive (for a diagonal `C`, Thm 6's
    `z*_k = max(r_k, 0)/C_kk`), else from `z = 0`. While some mode `k ∉ F` has `w_k > 0`, the one
    with the largest `w_k` enters; if it is linearly dependent on `F` (the Schur complement
    `C_kk − C_kF C_FF⁻¹ C_Fk` vanishes), `z` moves along `v = e_k − C_FF⁻¹ C_Fk` (`Cv = 0`,
    `rᵀv = w_k > 0`) until a mode of `F` reaches 0 and leaves, so `F` stays nonsingular. Then
    `z_F → C_FF⁻¹ r_F`, stopping where a mode of `F` reaches 0 (it leaves). Every product and solve
    is `interaction`'s, in `C`'s structure (`Diag(d) + UUᵀ`: Woodbury's, `O(K q²)`).

    The support is found with gradients stopped, then `z_F = C_FF⁻¹ r_F` is recomputed, so the
    derivative is the implicit-function one, `dz_F = C_FF⁻¹(dr_F − dC_FF z_F)`, wherever the
    support does not change. The same compiled program runs eagerly and under `jit`/`vmap`.

    **Arguments:**

    - `r`: growth rates, shape `(K,)`.
    - `interaction`: `C` (PSD) in its structure, an `AbstractInteraction`.
    - `active`: optional mask; modes outside it are held at 0.
    - `tol`: violations below `tol · max|r|` are not violations.

    **Returns:** `(z*, unique)`. `unique` is `False` when `C` is singular on the modes that are
    active or marginal (`z_k > 0` or `w_k ≈ 0`), which it is whenever the minimiser is not unique
    (the limit of the flow then depends on `z0`; the minimum loss does not); under `jit` also when
    the loss is unbounded below or the method did not converge.

    **Raises:** (eager calls; under `jit` these are reported by `unique = False`) `LvflowError`
    when the loss is unbounded below (a direction `v ≥ 0` with `Cv = 0` and `rᵀv > 0`, e.g. a mode
    with `r_k > 0` but `C_kk ≤ 0`: it grows without bound); `SolverError` when the method does not
    converge. `LvflowError` when `interaction` is not an `AbstractInteraction`.
    """
    if not isinstance(interaction, AbstractInteraction):
        raise LvflowError(f"interaction: expected an AbstractInteraction, got {type(interaction).__name__}")
    r = jnp.asarray(r, dtype=float)
    K = r.shape[0]
    if K == 0:
        return jnp.zeros(0), jnp.asarray(True)
    allowed = jnp.ones(K, bool) if active is None else jnp.asarray(active, bool)
    z, unique, status, k = _equilibrium(r, interaction, allowed, tol)
    if not isinstance(status, Tracer):  # an eager call: a failure is an error
        _raise_on(int(status), int(k), r, interaction)
    return z, unique


def _raise_on(status: int, k: int, r: Float[Array, " K"], interaction: AbstractInteraction) -> None:
    """The error of an eager call that ended with `status`; `k` the first mode that grows without bound."""
    if status == _GROWS:
        ckk = float(interaction.diagonal()[k])
        raise LvflowError(
            f"system: mode {k} has r_k = {float(r[k]):g} > 0 but C_kk = {ckk:g}, so z_k grows without bound"
        )
    if status == _UNBOUNDED:
        raise LvflowError("system: the loss is unbounded below (a direction v ≥ 0 with Cv = 0 and rᵀv > 0)")
    if status != _OPTIMAL:
        raise SolverError("saturated equilibrium: the active-set method did not converge")


@eqx.filter_jit
def _equilibrium(
    r: Float[Array, " K"], interaction: AbstractInteraction, allowed: Bool[Array, " K"], tol: float
) -> tuple[Float[Array, " K"], Bool[Array, ""], Int[Array, ""], Int[Array, ""]]:
    """`(z*, unique, status, k)`: `saturated_equilibrium`'s result, its `_OPTIMAL`/... status and the
    first mode that grows without bound (`r_k > 0`, `C_kk ≤ 0`; status `_GROWS`)."""
    grows = allowed & (interaction.diagonal() <= 0) & (r > 0)
    r_s, interaction_s = jax.lax.stop_gradient((r, interaction))
    F, status = _active_set(r_s, interaction_s, allowed, tol)
    status = jnp.where(jnp.any(grows), _GROWS, status)
    z = jnp.maximum(interaction.solve_on(F, r), 0.0)  # the support's z, now with its derivative
    ok = (status == _OPTIMAL) & jnp.all(jnp.isfinite(z))
    unique = ok & _is_unique(r_s, interaction_s, jax.lax.stop_gradient(z))
    return z, unique, status, jnp.argmax(grows)


def _active_set(
    r: Float[Array, " K"], C: AbstractInteraction, allowed: Bool[Array, " K"], tol: float
) -> tuple[Bool[Array, " K"], Int[Array, ""]]:
    """The primal active-set method of `saturated_equilibrium`; returns the support `F` and the
    status (`_OPTIMAL`, `_UNBOUNDED`, or `_RUNNING` when out of iterations)."""
    K = r.shape[0]
    idx = jnp.arange(K)
    atol = tol * jnp.maximum(jnp.max(jnp.abs(r)), _TINY)
    diag = C.diagonal()

    # the start: z_F = C_FF⁻¹ r_F on F = {r_k > 0} if C_FF is nonsingular and z_F > 0
    F0 = allowed & (r > 0)
    z0 = C.solve_on(F0, r)
    start = C.positive_definite_on(F0, _START_RTOL) & jnp.all(~F0 | (z0 > 0))
    F0 = F0 & start
    z0 = jnp.where(F0, z0, 0.0)

    def enter(F, z):
        """A mode with `w_k > 0` enters the support, or the loss is minimal (or unbounded)."""
        w = r - C.Cz(z)
        candidate = ~F & allowed & (w > atol)
        optimal = lambda: (F, z, jnp.asarray(_OPTIMAL, dtype=jnp.int32))  # noqa: E731
        return jax.lax.cond(jnp.any(candidate), lambda: step(F, z, w, candidate), optimal)

    def step(F, z, w, candidate):
        """Mode `k` (the largest `w_k`) enters; if it depends on `F`, `z` moves along `C v = 0`
        until a mode of `F` reaches 0 (it leaves), or without bound (the loss is unbounded)."""
        k = jnp.argmax(jnp.where(candidate, w, -jnp.inf))
        c = C.column(k)
        x = C.solve_on(F, c)
        schur = diag[k] - c @ x
        dependent = schur <= _DEPENDENT * jnp.maximum(diag[k], _TINY)
        v = jnp.where(idx == k, 1.0, -x)  # C v = 0 when k is dependent
        falls = F & (v < 0)
        ratio = jnp.where(falls, z / jnp.where(falls, -v, 1.0), jnp.inf)
        j = jnp.argmin(ratio)
        moving = dependent & jnp.any(falls)
        length = jnp.where(moving, ratio[j], 0.0)
        z = jnp.where(moving, jnp.where(idx == j, 0.0, jnp.maximum(z + length * v, 0.0)), z)
        F = F | (idx == k)
        F = jnp.where(moving, F & (idx != j), F)
        unbounded = dependent & ~jnp.any(falls)
        return F, z, jnp.where(unbounded, _UNBOUNDED, _RUNNING).astype(jnp.int32)

    def descend(F, z):
        """`z_F` moves towards `C_FF⁻¹ r_F`, stopping where a mode of `F` reaches 0 (it leaves)."""
        p = C.solve_on(F, r)
        below = F & (p <= 0)
        ratio = jnp.where(below, z / jnp.where(below, jnp.maximum(z - p, _TINY), 1.0), jnp.inf)
        j = jnp.argmin(ratio)
        alpha = jnp.where(jnp.any(below), ratio[j], 1.0)
        z_new = jnp.where(F, z + alpha * (p - z), 0.0)
        z_new = jnp.where(jnp.any(below) & (idx == j), 0.0, z_new)
        F_new = F & (z_new > 0)
        return F_new, jnp.where(F_new, z_new, 0.0), ~jnp.any(below)

    def body(state):
        it, F, z, add, status = state

        def entering():
            F1, z1, s1 = enter(F, z)
            return F1, z1, jnp.asarray(False), s1

        def descending():
            F1, z1, done = descend(F, z)
            return F1, z1, done, jnp.asarray(_RUNNING, dtype=jnp.int32)

        F, z, add, status = jax.lax.cond(add, entering, descending)
        return it + 1, F, z, add, status

    def keep_going(state):
        it, _, _, _, status = state
        return (it < 10 * K + 20) & (status == _RUNNING)

    state = (jnp.asarray(0), F0, z0, jnp.asarray(True), jnp.asarray(_RUNNING, dtype=jnp.int32))
    _, F, _, _, status = jax.lax.while_loop(keep_going, body, state)
    return F, status


def _is_unique(
    r: Float[Array, " K"], C: AbstractInteraction, z: Float[Array, " K"], rtol: float = 1e-10
) -> Bool[Array, ""]:
    """Whether `z` is the only minimiser: `C` positive definite on the modes that are active or
    marginal (`z_k > 0` or `r_k − (Cz)_k ≈ 0`), so no feasible direction leaves the loss flat."""
    scale = jnp.maximum(jnp.max(jnp.abs(r)), _TINY)
    T = (z > 0) | (r - C.Cz(z) > -1e-9 * scale)
    return C.positive_definite_on(T, rtol)
