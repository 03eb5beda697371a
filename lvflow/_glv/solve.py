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
from .._core.validate import as_array, check_positive
from .closed_forms import host_log, switch_on_time, thm6
from .equilibrium import saturated_equilibrium
from .interaction import DiagonalInteraction
from .lv import AbstractLotkaVolterra
from .solution import SUCCESSFUL, LVSolution, finish_solution, switch_on_target

if TYPE_CHECKING:
    import diffrax as dfx

# The ODE path (diffrax, optimistix, lineax; `solve_ode.py`) is imported on first use: a diagonal C
# takes the closed form (Thm 6), and `lvflow predict` of one does not pay diffrax's import.

_DEFAULT_MAX_STEPS = 16384
_N_DEFAULT_TS = 400


def _ode_module():
    """`solve_ode.py`, imported on first use: a diagonal `C` takes the closed form (Thm 6), and
    `lvflow predict` of one does not pay the import of diffrax, optimistix and lineax."""
    from . import solve_ode

    return solve_ode


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
    z0: ArrayLike,
    t1: ArrayLike,
    *,
    ts: ArrayLike | None = None,
    rho: ArrayLike = 0.5,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    solver: ClosedForm | dfx.AbstractSolver | None = None,
    stepsize_controller: dfx.AbstractStepSizeController | None = None,
    adjoint: dfx.AbstractAdjoint | None = None,
    max_steps: int = _DEFAULT_MAX_STEPS,
    throw: bool = True,
    progress: bool = False,
    z_inf: ArrayLike | None = None,
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
    diagonal = isinstance(interaction, DiagonalInteraction)
    closed = isinstance(solver, ClosedForm) or (solver is None and diagonal)
    if closed and not diagonal:
        raise LvflowError(
            f"solver: ClosedForm() needs a diagonal C (Thm 6), the system's C is a {type(interaction).__name__}"
        )
    ode = None if closed else _ode_module()
    ode_solver = None if ode is None else ode.check_ode_options(solver, stepsize_controller, adjoint)
    # ln z0 goes into the compiled solve: a subnormal z_k0 (compiled code reads it as 0) keeps its log
    log_z0 = host_log(z0)

    r = system.r
    given = z_inf is not None
    if given:
        z_inf = as_array("z_inf", z_inf, ndim=1)
        if np.shape(z_inf) != (K,):
            raise LvflowError(f"z_inf: shape {np.shape(z_inf)} does not match the system's {K} modes")
        z_eq, eq_ok = z_inf, True
    else:
        z_eq, eq_ok = saturated_equilibrium(r, interaction)

    if ode is None:  # the closed form
        assert isinstance(interaction, DiagonalInteraction)  # `closed` requires it (checked above)
        c = interaction.d
        return _closed_form_solve(r, c, z0, log_z0, t1, ts, z_eq, eq_ok, rho, system.y2, given=given, throw=throw)
    u0, t1, ts, z_eq, rho = _checked_inputs(log_z0, t1, ts, z_eq, rho, given=given)
    return ode.solve_ode(
        system,
        u0,
        t1,
        ts,
        z_eq,
        eq_ok,
        rho,
        rtol=rtol,
        atol=atol,
        solver=ode_solver,
        stepsize_controller=stepsize_controller,
        adjoint=adjoint,
        max_steps=max_steps,
        progress=progress,
        first_pass=_may_not_be_the_limit(given, eq_ok),
        throw=throw,
    )


def _may_not_be_the_limit(given: bool, eq_ok: Bool[ArrayLike, ""]) -> bool:
    """Whether the ODE solve needs its first pass (`z(t1)` where the equilibrium is not unique):
    not when `z_inf` was given, nor when `eq_ok` is a concrete `True` (an eager call, differentiated
    or not, with a unique equilibrium), where the first pass would have horizon 0. Only the compiled
    program depends on it (one `diffrax.diffeqsolve` instead of two), not the solution or its
    derivatives.

    **Arguments:** `given`, whether the caller gave `z_inf`; `eq_ok`, whether the saturated
    equilibrium is unique (concrete or traced).

    **Returns:** `True` where the first pass must be compiled.
    """
    if given:
        return False
    try:
        return not bool(eq_ok)  # concrete eagerly, and under `jax.grad`/`jax.jvp` of an eager call
    except jax.errors.ConcretizationTypeError:  # traced under `jit`/`vmap`: either may hold
        return True


def _checks(u0, t1, ts, z_eq, rho, *, given: bool):
    """`solve_lv`'s value checks (`equinox.error_if`: eagerly and under `jit`), with the default
    `ts` filled in: `(u0, t1, ts, z_eq, rho)` as float arrays, `u0 = ln z0`."""
    u0, t1, z_eq, rho = (jnp.asarray(x, dtype=float) for x in (u0, t1, z_eq, rho))
    u0 = eqx.error_if(  # ln z0 is −inf at z0 = 0 and NaN below
        u0,
        jnp.any(~(u0 > -jnp.inf)),
        "z0: must be > 0 in every mode (a mode at 0 never grows: drop it from the system)",
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
    return u0, t1, ts, z_eq, rho


_checked_inputs = jax.jit(_checks, static_argnames="given")


@functools.partial(jax.jit, static_argnames=("given", "throw"))
def _closed_form_solve(r, c, z0, log_z0, t1, ts, z_eq, eq_ok, rho, y2, *, given: bool, throw: bool) -> LVSolution:
    """`solve_lv` by Thm 6 (`ClosedForm`): the checked inputs, `_closed_form_core`, and with
    `throw` a run-time error for a non-finite solution."""
    u0, t1, ts, z_eq, rho = _checks(log_z0, t1, ts, z_eq, rho, given=given)
    sol = _closed_form_core(r, c, jnp.asarray(z0, dtype=float), t1, ts, z_eq, eq_ok, rho, y2, u0, thm6_limit=not given)
    if throw:  # the closed form's result is `successful`: it fails only by non-finite values
        sol = eqx.error_if(sol, ~sol.success, "solve_lv: non-finite values in the solution")
    return sol


@functools.partial(jax.jit, static_argnames="thm6_limit")
def _closed_form_core(
    r: Float[Array, " K"],
    c: Float[Array, " K"],
    z0: Float[Array, " K"],
    t1: Float[Array, ""],
    ts: Float[Array, " n"],
    z_eq: Float[Array, " K"],
    eq_ok: Bool[ArrayLike, ""],
    rho: Float[Array, ""],
    y2: Float[ArrayLike, ""],
    log_z0: Float[Array, " K"] | None = None,
    *,
    thm6_limit: bool = False,
) -> LVSolution:
    """Thm 6 at `ts` and its inversion for the switch-on times (diagonal `C = Diag(c)`);
    `log_z0 = ln z0` (default `jnp.log(z0)`), exact where `z0` is subnormal (read as 0 here).
    `thm6_limit`: where `eq_ok`, `z_eq` is Thm 6's limit `r/c` (not a `z_inf` of the caller's), so
    the target's gap `1 − c T/r` is `1 − ρ` exactly (Eq. 158 then stays exact as `ρ → 1`)."""
    u0 = jnp.log(z0) if log_z0 is None else log_z0
    zs = thm6(r[None], c[None], z0[None], ts[:, None], u0[None])
    z_end = thm6(r, c, z0, t1, u0)
    z_inf = jnp.where(eq_ok, z_eq, z_end)
    live = z_inf > 0
    target = switch_on_target(z_inf, rho)  # ln T_k, T_k = ρ z_k(∞)
    log_c = jnp.where(c > 0, jnp.log(jnp.where(c > 0, c, 1.0)), -jnp.inf)
    t_star = switch_on_time(r, log_c, u0, target)  # Eq. 158
    if thm6_limit:
        t_star = jnp.where(eq_ok, switch_on_time(r, log_c, u0, target, log_gap_T=jnp.log1p(-rho)), t_star)
    t_star = jnp.where(live, t_star, jnp.inf)
    t_star = jnp.where(t_star <= t1, t_star, jnp.inf)  # as the ODE path: not reached by t1
    no_steps = (jnp.asarray(0),) * 3  # the dtype diffrax's statistics have
    return finish_solution(ts, zs, c[None] * zs, r, y2, t_star, z_inf, rho, z_end, no_steps, SUCCESSFUL)
