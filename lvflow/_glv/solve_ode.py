"""The ODE path of `solve_lv`: the gLV (Eq. 32) in `u = ln z` integrated by diffrax, with every
mode's switch-on crossing tracked (Thm 8). Imported by `solve_lv` on first use, so that the closed
form (a diagonal `C`, Thm 6) does not import diffrax, optimistix or lineax."""

from __future__ import annotations

import diffrax as dfx
import equinox as eqx
import jax.numpy as jnp
import optimistix as optx
from jaxtyping import Array, ArrayLike, Bool, Float

from .._core.errors import LvflowError
from .interaction import DenseInteraction
from .lv import AbstractLotkaVolterra
from .rodas5p import Rodas5P
from .solution import LVSolution, finish_solution, switch_on_target
from .switch_on import SwitchOnState, SwitchOnTracker
from .term import LogLotkaVolterraTerm

_ADJOINTS = (dfx.RecursiveCheckpointAdjoint, dfx.DirectAdjoint, dfx.ForwardMode)
_DENSE_RODAS_MAX_K = 100  # above this a dense C's O(K³) LU per step costs more than Dopri5's extra steps


def check_ode_options(solver: object, stepsize_controller: object, adjoint: object) -> dfx.AbstractSolver | None:
    """`solve_lv`'s checks of the diffrax options it was given (`None`: not given).

    **Returns:** `solver`, checked.

    **Raises:** `LvflowError` for an option of the wrong kind.
    """
    if solver is not None and not isinstance(solver, dfx.AbstractSolver):
        raise LvflowError(f"solver: expected lvflow.ClosedForm() or a diffrax solver, got {type(solver).__name__}")
    if stepsize_controller is not None and not isinstance(stepsize_controller, dfx.AbstractStepSizeController):
        raise LvflowError(
            f"stepsize_controller: expected a diffrax step-size controller, got {type(stepsize_controller).__name__}"
        )
    if adjoint is not None and not isinstance(adjoint, _ADJOINTS):
        raise LvflowError(
            "adjoint: expected diffrax.RecursiveCheckpointAdjoint, DirectAdjoint or ForwardMode "
            "(the solve saves the tracker's state, which the others cannot differentiate), "
            f"got {type(adjoint).__name__}"
        )
    return solver


def solve_ode(
    system: AbstractLotkaVolterra,
    u0: Float[Array, " K"],
    t1,
    ts,
    z_eq,
    eq_ok,
    rho,
    *,
    rtol: float,
    atol: float,
    solver: dfx.AbstractSolver | None,
    stepsize_controller: dfx.AbstractStepSizeController | None,
    adjoint: dfx.AbstractAdjoint | None,
    max_steps: int,
    progress: bool,
    first_pass: bool,
    throw: bool,
) -> LVSolution:
    """`solve_lv`'s ODE path on validated input (see there; `u0 = ln z0`): the default solver (`Rodas5P`, or
    `diffrax.Dopri5` for a dense `C` with more than 100 modes), controller and adjoint, then
    `_ode_core`. `first_pass`: `z_eq` may not be `z(∞)` (where `eq_ok` is false, `z(t1)` of a
    first solve is used); `throw`: a run-time error for a failed solve or a non-finite value."""
    term = LogLotkaVolterraTerm.from_system(system)
    if solver is None:
        dense_large = isinstance(term.interaction, DenseInteraction) and system.K > _DENSE_RODAS_MAX_K
        solver = dfx.Dopri5() if dense_large else Rodas5P()
    if stepsize_controller is None:
        # tolerances as arrays: a new value is then not a new compilation
        stepsize_controller = dfx.PIDController(rtol=jnp.asarray(rtol), atol=jnp.asarray(atol), norm=optx.max_norm)
    return _ode_core(
        term,
        u0,
        jnp.asarray(t1, dtype=float),
        jnp.asarray(ts, dtype=float),
        z_eq,
        eq_ok,
        jnp.asarray(rho, dtype=float),
        system.y2,
        solver=solver,
        controller=stepsize_controller,
        adjoint=dfx.RecursiveCheckpointAdjoint() if adjoint is None else adjoint,
        max_steps=max_steps,
        progress=progress,
        first_pass=first_pass,
        throw=throw,
    )


@eqx.filter_jit
def _ode_core(
    term: LogLotkaVolterraTerm,
    u0: Float[Array, " K"],
    t1: Float[Array, ""],
    ts: Float[Array, " n"],
    z_eq: Float[Array, " K"],
    eq_ok: Bool[ArrayLike, ""],
    rho: Float[Array, ""],
    y2: Float[Array, ""],
    *,
    solver: dfx.AbstractSolver,
    controller: dfx.AbstractStepSizeController,
    adjoint: dfx.AbstractAdjoint,
    max_steps: int,
    progress: bool,
    first_pass: bool,
    throw: bool,
) -> LVSolution:
    """The ODE path of `solve_lv`: `diffrax.diffeqsolve` of `u̇ = r − C e^u` with every mode's
    switch-on crossing tracked (`SwitchOnTracker`) and root-found on its step's dense output; with
    `throw`, diffrax's message or a non-finite value as a run-time error (`equinox.error_if`)."""

    def solve(solver, horizon, saveat, meter):
        return dfx.diffeqsolve(
            term,
            solver,
            t0=0.0,
            t1=horizon,
            dt0=None,
            y0=u0,
            saveat=saveat,
            stepsize_controller=controller,
            adjoint=adjoint,
            max_steps=max_steps,
            throw=False,
            progress_meter=meter,
        )

    if first_pass:
        # z(∞) not unique where eq_ok is false: z(t1) from a first solve. Its horizon is 0 where
        # z(∞) is unique, so that it costs nothing for those systems (also under vmap).
        first = solve(solver, jnp.where(eq_ok, 0.0, t1), dfx.SaveAt(t1=True), dfx.NoProgressMeter())
        assert first.ys is not None  # SaveAt(t1=True)
        z_inf = jnp.where(eq_ok, z_eq, jnp.exp(first.ys[-1]))
        first_result = first.result
    else:
        z_inf = z_eq
        first_result = dfx.RESULTS.successful
    live = z_inf > 0
    threshold = jnp.where(live, switch_on_target(z_inf, rho), jnp.inf)  # a dead mode never crosses
    tracker = SwitchOnTracker(solver, threshold)
    meter = dfx.TqdmProgressMeter() if progress else dfx.NoProgressMeter()
    saveat = dfx.SaveAt(subs=[dfx.SubSaveAt(ts=ts), dfx.SubSaveAt(t1=True)], solver_state=True)
    out = solve(tracker, t1, saveat, meter)
    assert out.ys is not None and isinstance(out.solver_state, SwitchOnState)  # saveat's subs, solver_state=True
    zs = jnp.exp(out.ys[0])
    u_end = out.ys[1][-1]
    switch_on_times = jnp.where(live, tracker.crossing_times(out.solver_state), jnp.inf)
    stats = (out.stats["num_steps"], out.stats["num_accepted_steps"], out.stats["num_rejected_steps"])
    result = dfx.RESULTS.where(first_result == dfx.RESULTS.successful, out.result, first_result)
    Czs = term.interaction.Cz(zs)
    sol = finish_solution(ts, zs, Czs, term.r, y2, switch_on_times, z_inf, rho, u_end, stats, result)
    if throw:
        sol = result.error_if(sol, result != dfx.RESULTS.successful)
        sol = eqx.error_if(sol, ~sol.success, "solve_lv: non-finite values in the solution")
    return sol
