"""Numerical solution of the gLV (Eq. 32) in log variables, with switch-on times (Thm 8)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._core.errors import LvflowError
from .._core.validate import _is_concrete, as_array, check_positive
from .closed_forms import thm6
from .equilibrium import saturated_equilibrium
from .interaction import DiagonalInteraction
from .lv import AbstractLotkaVolterra, LotkaVolterra, LowRankLotkaVolterra
from .solution import SUCCESSFUL, LVSolution, finish_solution, switch_on_target

if TYPE_CHECKING:
    import diffrax as dfx

# The ODE path (diffrax, optimistix, lineax; `solve_ode.py`) is imported on first use: a diagonal C
# takes the closed form (Thm 6), and `lvflow predict` of one does not pay diffrax's import.

_DEFAULT_MAX_STEPS = 16384
_N_DEFAULT_TS = 400


def default_ts(t1, n: int = _N_DEFAULT_TS) -> Float[Array, " n"]:
    """`0` followed by `n − 1` log-spaced times from `t1·10⁻⁴` to `t1`.

    The gLV's events are spread over decades of time (ignitions at `ln(1/ε)/ζ_k`, Eq. 158), so a
    log-spaced grid resolves the early transitions as well as the late ones.
    """
    t1 = jnp.asarray(t1, dtype=float)
    return jnp.concatenate([jnp.zeros(1), t1 * jnp.logspace(-4.0, 0.0, n - 1)])


class ClosedForm(eqx.Module):
    """Thm 6 as `solve_lv`'s solver: the gLV with a diagonal `C` (orthogonal features) solved mode by
    mode, `z_k(t) = r_k z_k0 / (C_kk z_k0 + (r_k − C_kk z_k0) e^{−r_k t})`, with each switch-on time
    `t*_k = (1/r_k) [ln(T_k/z_k0) + ln(1 + C_kk (T_k − z_k0)/(r_k − C_kk T_k))]`, `T_k = ρ z_k(∞)`
    (Eq. 158 with `a = 1`): exact, no time steps.

    Only for a system whose `interaction()` is a `DiagonalInteraction` (a `LotkaVolterra` with a
    concrete diagonal `C`, a `LowRankLotkaVolterra` with no or zero columns in `U`); `solve_lv`
    raises `LvflowError` for any other. No fields.
    """


def solve_lv(
    system: AbstractLotkaVolterra,
    z0,
    t1,
    *,
    ts=None,
    rho=0.5,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    solver: ClosedForm | dfx.AbstractSolver | None = None,
    stepsize_controller: dfx.AbstractStepSizeController | None = None,
    adjoint: dfx.AbstractAdjoint | None = None,
    max_steps: int = _DEFAULT_MAX_STEPS,
    throw: bool = True,
    progress: bool = False,
    z_inf=None,
) -> LVSolution:
    """Integrate the gLV `ż_k = z_k (r_k − Σ_j C_kj z_j)` (Eq. 32) from `z(0) = z0` to `t1` and
    locate every mode's switch-on time `t*_k`, the first time `z_k(t) = ρ z_k(∞)` (Thm 8, Eq. 158).

    **Solver.** `solver=None` (default) takes `lvflow.ClosedForm()` (Thm 6, exact) when the system
    declares a diagonal `C` (`system.interaction()` is a `DiagonalInteraction`: a `LotkaVolterra`
    with a concrete diagonal `C`, a `LowRankLotkaVolterra` whose `U` has no or only zero columns),
    and integrates the ODE otherwise; `solver=lvflow.ClosedForm()`, `lvflow.Rodas5P()` or any diffrax
    solver forces either. The step-size options (`rtol`, `atol`, `stepsize_controller`, `adjoint`,
    `max_steps`, `progress`) do not apply to the closed form.

    The ODE is integrated in `u = ln z`, `u̇ = r − C e^u` (`lvflow.LogLotkaVolterraTerm`), by
    `diffrax.diffeqsolve` with `solver` (default `lvflow.Rodas5P`, stage solves in `C`'s structure;
    a dense `C` with more than 100 modes gets `diffrax.Dopri5`), a `diffrax.PIDController` on the
    max norm over modes, and `lvflow.SwitchOnTracker` recording each mode's crossing step; each
    crossing is then root-found on that step's dense output. `rtol`/`atol` are tolerances on
    `ln z`: relative errors in `z` for every mode, whatever its size.

    **`z(∞)`** is the saturated equilibrium (`system.equilibrium()`), the flow's limit when it
    is unique. When it is not (a singular `C`), `z(t1)` from a first solve is used: choose `t1`
    past the last transition. `z_inf=` overrides both.

    **Derivatives.** Everything returned is differentiable with respect to `z0` and the system's
    arrays (`r`, `C` or `d`, `U`). The ODE path goes through diffrax's `adjoint`
    (discretise-then-optimise), with `t*_k` differentiated by the implicit-function theorem at the
    crossing (`lvflow.SwitchOnTracker.crossing_times`); the default adjoint,
    `diffrax.RecursiveCheckpointAdjoint()`, serves `jax.grad`/`jax.vjp`, and
    `adjoint=diffrax.ForwardMode()` serves `jax.jvp`/`jax.jacfwd`. The closed form is exact with
    respect to `r`, `diag(C)` and `z0` (a `C` traced under `jit` declares no structure: the ODE path).

    **Arguments:**

    - `system`: a `LotkaVolterra` or a `LowRankLotkaVolterra`.
    - `z0`: initial mode strengths, shape `(K,)`, all `> 0`.
    - `t1`: final time, `> 0`.
    - `ts`: save times in `[0, t1]`, non-decreasing (default: `default_ts(t1)`, 0 and 399
      log-spaced times). For switch-on times only, pass `ts=[0, t1]`.
    - `rho`: switch-on fraction in `(0, 1)` (the paper's figures use `ρ = ½`).
    - `rtol`, `atol`: step-size tolerances on `u = ln z` (used by the default controller).
    - `solver`: `lvflow.ClosedForm()`, a diffrax solver, or `None` (above).
    - `stepsize_controller`: a diffrax step-size controller (default
      `diffrax.PIDController(rtol, atol, norm=optimistix.max_norm)`).
    - `adjoint`: `diffrax.RecursiveCheckpointAdjoint()` (default), `diffrax.ForwardMode()` or
      `diffrax.DirectAdjoint()`.
    - `max_steps`: step budget (accepted + rejected).
    - `throw`: raise a run-time error (`equinox.error_if`, eagerly and under `jit`) with diffrax's
      message when the solve fails or a value is not finite; with `False`, return
      `success = False` and the `result` flag.
    - `progress`: a `diffrax.TqdmProgressMeter` bar (stderr) on the ODE path.
    - `z_inf`: the limit `z(∞)` to measure switch-on against (default: see above).

    **Returns:** an `LVSolution`.

    **Raises:** `LvflowError` for input of the wrong kind or shape (and `ClosedForm()` on a system
    without a diagonal `C`); a run-time error (`equinox.error_if`, whose message names the input)
    for values out of range: `z0 ≤ 0`, `t1 ≤ 0`, `rho` outside `(0, 1)`, `ts` outside `[0, t1]` or
    decreasing, `z_inf < 0`, no finite saturated equilibrium; and, with `throw=True`, for a failed
    solve.

    Works under `jax.jit`/`jax.vmap` over `z0`, `t1` and the system's arrays.
    """
    if not isinstance(system, AbstractLotkaVolterra):
        raise LvflowError(f"system: expected a LotkaVolterra or LowRankLotkaVolterra, got {type(system).__name__}")
    K = system.K
    z0 = as_array("z0", z0, ndim=1)
    if np.shape(z0) != (K,):
        raise LvflowError(f"z0: shape {np.shape(z0)} does not match the system's {K} modes")
    t1 = as_array("t1", t1, ndim=0)
    rho = as_array("rho", rho, ndim=0)
    rtol = check_positive("rtol", rtol)
    atol = check_positive("atol", atol)
    if not isinstance(max_steps, int) or max_steps < 1:
        raise LvflowError(f"max_steps: must be a positive integer, got {max_steps!r}")
    if not isinstance(progress, (bool, np.bool_)):
        raise LvflowError(f"progress: must be True or False, got {progress!r}")
    progress = bool(progress)  # static in the compiled solve
    if ts is not None:
        ts = as_array("ts", ts, ndim=1)
        if np.size(ts) == 0:
            raise LvflowError("ts: is empty")
    interaction = system.interaction()
    diagonal = interaction.d if isinstance(interaction, DiagonalInteraction) else None
    closed = isinstance(solver, ClosedForm) or (solver is None and diagonal is not None)
    if closed and diagonal is None:
        raise LvflowError(
            f"solver: ClosedForm() needs a diagonal C (Thm 6), the system's C is a {type(interaction).__name__}"
        )
    if not closed:
        from .solve_ode import check_ode_options, solve_ode

        check_ode_options(solver, stepsize_controller, adjoint)

    scale = _float64_scale(system, z0)
    if scale != 1.0:  # some z_k0 below the smallest normal double: the same flow, rescaled (see there)
        sol = solve_lv(
            _rescaled(system, scale),
            np.asarray(z0, dtype=float) / scale,
            t1,
            **dict(ts=ts, rho=rho, rtol=rtol, atol=atol, solver=solver, stepsize_controller=stepsize_controller),
            **dict(adjoint=adjoint, max_steps=max_steps, throw=throw, progress=progress),
            z_inf=None if z_inf is None else np.asarray(z_inf, dtype=float) / scale,
        )
        scaled = (sol.zs * scale, sol.loss * scale + system.y2, sol.z_inf * scale)  # z = s z', L = s L' + y2
        return eqx.tree_at(lambda s: (s.zs, s.loss, s.z_inf), sol, scaled)

    r = system.r
    given = z_inf is not None
    if given:
        z_inf = as_array("z_inf", z_inf, ndim=1)
        if np.shape(z_inf) != (K,):
            raise LvflowError(f"z_inf: shape {np.shape(z_inf)} does not match the system's {K} modes")
        z_eq, eq_ok = z_inf, True
    else:
        z_eq, eq_ok = saturated_equilibrium(r, interaction)

    if closed:
        return _closed_form_solve(r, diagonal, z0, t1, ts, z_eq, eq_ok, rho, system.y2, given=given, throw=throw)
    z0, t1, ts, z_eq, rho = _checked_inputs(z0, t1, ts, z_eq, rho, given=given)
    return solve_ode(
        system,
        z0,
        t1,
        ts,
        z_eq,
        eq_ok,
        rho,
        rtol=rtol,
        atol=atol,
        solver=solver,
        stepsize_controller=stepsize_controller,
        adjoint=adjoint,
        max_steps=max_steps,
        progress=progress,
        first_pass=not given,
        throw=throw,
    )


def _checks(z0, t1, ts, z_eq, rho, *, given: bool):
    """`solve_lv`'s value checks (`equinox.error_if`: eagerly and under `jit`), with the default
    `ts` filled in: `(z0, t1, ts, z_eq, rho)` as float arrays."""
    z0, t1, z_eq, rho = (jnp.asarray(x, dtype=float) for x in (z0, t1, z_eq, rho))
    z0 = eqx.error_if(
        z0, jnp.any(z0 <= 0), "z0: must be > 0 in every mode (a mode at 0 never grows: drop it from the system)"
    )
    t1 = eqx.error_if(t1, t1 <= 0, "t1: must be > 0")
    rho = eqx.error_if(rho, (rho <= 0) | (rho >= 1), "rho: must lie in (0, 1)")
    if ts is None:
        ts = default_ts(t1)
    else:
        ts = jnp.asarray(ts, dtype=float)
        ts = eqx.error_if(ts, (ts[0] < 0) | (ts[-1] > t1), "ts: must lie in [0, t1]")
        ts = eqx.error_if(ts, jnp.any(jnp.diff(ts) < 0), "ts: must be non-decreasing")
    if given:
        z_eq = eqx.error_if(z_eq, jnp.any(z_eq < 0), "z_inf: must be >= 0")
    else:
        bad = ~jnp.all(jnp.isfinite(z_eq))
        z_eq = eqx.error_if(z_eq, bad, "system: no finite saturated equilibrium (the loss is unbounded below)")
    return z0, t1, ts, z_eq, rho


_checked_inputs = jax.jit(_checks, static_argnames="given")


@functools.partial(jax.jit, static_argnames=("given", "throw"))
def _closed_form_solve(r, c, z0, t1, ts, z_eq, eq_ok, rho, y2, *, given: bool, throw: bool) -> LVSolution:
    """`solve_lv` by Thm 6 (`ClosedForm`): the checked inputs, `_closed_form_core`, and with
    `throw` a run-time error for a non-finite solution."""
    z0, t1, ts, z_eq, rho = _checks(z0, t1, ts, z_eq, rho, given=given)
    sol = _closed_form_core(r, c, z0, t1, ts, z_eq, eq_ok, rho, y2)
    if throw:  # the closed form's result is `successful`: it fails only by non-finite values
        sol = eqx.error_if(sol, ~sol.success, "solve_lv: non-finite values in the solution")
    return sol


_TINY = np.finfo(np.float64).tiny  # 2.2e-308: XLA on CPU flushes anything smaller to 0


def _float64_scale(system: AbstractLotkaVolterra, z0) -> float:
    """1, or a power of two `s` when some `z_k0` is subnormal (compiled code reads it as 0).

    The gLV is invariant under `z = s z'`, `C = C'/s` (Eq. 32: `ż' = z' (r − (sC) z')`), so the flow
    from a subnormal `z0` is the flow of `sC` from `z0/s`, with the same switch-on times. `s` puts
    `[min z0, max r_k/C_kk]` inside `[2^-1000, 2^400]` (a power of two: exact).

    **Raises:** `LvflowError` naming `z0` when that range does not fit in float64.
    """
    if not (_is_concrete(z0) and _is_concrete(system.r) and _is_concrete(system.C_diagonal)):
        return 1.0
    z0 = np.asarray(z0, dtype=float)
    z0 = z0[z0 > 0]  # a z_k0 ≤ 0 is refused by solve_lv's value checks
    if not z0.size or float(np.min(z0)) >= _TINY:
        return 1.0
    r, Ckk = np.asarray(system.r, dtype=float), np.asarray(system.C_diagonal, dtype=float)
    grow = (r > 0) & (Ckk > 0)
    with np.errstate(divide="ignore", over="ignore"):
        top = float(np.max(np.log2(r[grow]) - np.log2(Ckk[grow]))) if np.any(grow) else 0.0
    lo = float(np.log2(np.min(z0)))
    top = max(top, float(np.log2(np.max(z0))))
    # z0/s ≥ 2^-1000 (normal) and z(∞)/s ≤ 2^400 (below the ODE's clip of ln z at 300, `exp_clipped`).
    if top - lo > 1400:
        raise LvflowError(
            f"z0: the state runs from z_k(0) = {np.min(z0):.3g} to z_k(∞) ≈ 2^{top:.0f}, more than float64 "
            "can hold in one solve; use a larger eps (the switch-on times grow only as ln(1/eps))"
        )
    return float(2.0 ** (2 * round((top + lo + 600) / 4)))  # an even power of two: √s exact for U


def _rescaled(system: AbstractLotkaVolterra, s: float) -> AbstractLotkaVolterra:
    """The gLV with `C → s C` and `y2 = 0` (the flow of `z/s`, `_float64_scale`)."""
    if _is_low_rank(system):
        return LowRankLotkaVolterra(system.r, system.d * s, system.U * np.sqrt(s))
    return LotkaVolterra(system.r, system.C * s, check=False)


def _is_low_rank(system) -> bool:
    return isinstance(system, LowRankLotkaVolterra)


@jax.jit
def _closed_form_core(
    r: Float[ArrayLike, " K"],
    c: Float[ArrayLike, " K"],
    z0: Float[ArrayLike, " K"],
    t1: Float[ArrayLike, ""],
    ts: Float[ArrayLike, " n"],
    z_eq: Float[ArrayLike, " K"],
    eq_ok: Bool[ArrayLike, ""],
    rho: Float[ArrayLike, ""],
    y2: Float[ArrayLike, ""],
) -> LVSolution:
    """Thm 6 at `ts` and its inversion for the switch-on times (diagonal `C = Diag(c)`)."""
    u0 = jnp.log(z0)
    zs = thm6(r[None], c[None], z0[None], ts[:, None])
    z_end = thm6(r, c, z0, t1)
    z_inf = jnp.where(eq_ok, z_eq, z_end)
    live = z_inf > 0
    target = switch_on_target(z_inf, rho)  # ln T_k, T_k = ρ z_k(∞)
    T = jnp.exp(target)
    above = u0 >= target
    # z_k increases monotonically to r_k/C_kk from below, so it crosses T_k iff z0 < T_k < r_k/C_kk.
    gap = r - c * T
    crosses = live & ~above & (gap > 0)
    safe_r = jnp.where(crosses, r, 1.0)
    safe_gap = jnp.where(crosses, gap, 1.0)
    # t* = (1/r) [ln(T/z0) + ln((r − C z0)/(r − C T))], both terms ≥ 0 for z0 < T < r/C.
    t_cross = ((target - u0) + jnp.log1p(c * (T - z0) / safe_gap)) / safe_r
    t_star = jnp.where(live & above, 0.0, jnp.where(crosses, t_cross, jnp.inf))
    t_star = jnp.where(t_star <= t1, t_star, jnp.inf)  # as the ODE path: not reached by t1
    no_steps = (jnp.asarray(0),) * 3  # the dtype diffrax's statistics have
    return finish_solution(ts, zs, c[None] * zs, r, y2, t_star, z_inf, rho, z_end, no_steps, SUCCESSFUL)
