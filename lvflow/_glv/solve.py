"""Numerical solution of the gLV (Eq. 32) in log variables, with switch-on times (Thm 8)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._core.errors import LvflowError, SolverError
from .._core.validate import _is_concrete, as_array, check_in_open_interval, check_positive, is_diagonal
from .equilibrium import saturated_equilibrium
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


def _default_ts_np(t1: float) -> np.ndarray:
    """`default_ts` in numpy for a concrete `t1` (no device dispatch)."""
    return np.concatenate([np.zeros(1), t1 * np.logspace(-4.0, 0.0, _N_DEFAULT_TS - 1)])


def solve_lv(
    system: AbstractLotkaVolterra,
    z0,
    t1,
    *,
    ts=None,
    rho=0.5,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    solver: dfx.AbstractSolver | None = None,
    stepsize_controller: dfx.AbstractStepSizeController | None = None,
    adjoint: dfx.AbstractAdjoint | None = None,
    max_steps: int = _DEFAULT_MAX_STEPS,
    throw: bool = True,
    progress: bool = False,
    z_inf=None,
    method: str = "auto",
) -> LVSolution:
    """Integrate the gLV `ż_k = z_k (r_k − Σ_j C_kj z_j)` (Eq. 32) from `z(0) = z0` to `t1` and
    locate every mode's switch-on time `t*_k`, the first time `z_k(t) = ρ z_k(∞)` (Thm 8, Eq. 158).

    **Method.** `method="auto"` (default) solves a concrete diagonal `C` (orthogonal features) in
    closed form (Thm 6) when no `solver=` is given, and integrates the ODE otherwise; `"closed_form"`
    and `"ode"` force either (`"closed_form"` on a traced `C` checks it for off-diagonal entries
    through `equinox.error_if`). The closed form evaluates Thm 6 at `ts` and inverts it for
    `t*_k = (1/r_k) [ln(T_k/z_k0) + ln(1 + C_kk (T_k − z_k0)/(r_k − C_kk T_k))]`, `T_k = ρ z_k(∞)`
    (Eq. 158 with `a = 1`); the solver options do not apply to it.

    The ODE is integrated in `u = ln z`, `u̇ = r − C e^u` (`lvflow.LogLotkaVolterraTerm`), by
    `diffrax.diffeqsolve` with `lvflow.Rodas5P` (stage solves in `C`'s structure; a dense `C` with
    more than 100 modes gets `diffrax.Dopri5`), a `diffrax.PIDController` on the max norm over
    modes, and `lvflow.SwitchOnTracker` recording each mode's crossing step; each crossing is then
    root-found on that step's dense output. `rtol`/`atol` are tolerances on `ln z`: relative
    errors in `z` for every mode, whatever its size.

    **`z(∞)`** is the saturated equilibrium (`system.equilibrium()`), the flow's limit when it
    is unique. When it is not (a singular `C`), `z(t1)` from a first solve is used: choose `t1`
    past the last transition. `z_inf=` overrides both.

    **Derivatives.** Everything returned is differentiable with respect to `z0` and the system's
    arrays (`r`, `C` or `d`, `U`). The ODE path goes through diffrax's `adjoint`
    (discretise-then-optimise), with `t*_k` differentiated by the implicit-function theorem at the
    crossing (`lvflow.SwitchOnTracker.crossing_times`); the default adjoint,
    `diffrax.RecursiveCheckpointAdjoint()`, serves `jax.grad`/`jax.vjp`, and
    `adjoint=diffrax.ForwardMode()` serves `jax.jvp`/`jax.jacfwd`. The closed form is exact with
    respect to `r`, `diag(C)` and `z0`; it sees only `C`'s diagonal, so its derivative along an
    off-diagonal entry of `C` is 0 (`method="auto"` takes the ODE path for a traced `C`).

    **Arguments:**

    - `system`: a `LotkaVolterra` or a `LowRankLotkaVolterra`.
    - `z0`: initial mode strengths, shape `(K,)`, all `> 0`.
    - `t1`: final time, `> 0`.
    - `ts`: save times in `[0, t1]`, non-decreasing (default: `default_ts(t1)`, 0 and 399
      log-spaced times). For switch-on times only, pass `ts=[0, t1]`.
    - `rho`: switch-on fraction in `(0, 1)` (the paper's figures use `ρ = ½`).
    - `rtol`, `atol`: step-size tolerances on `u = ln z` (used by the default controller).
    - `solver`: a diffrax solver for the ODE (default `lvflow.Rodas5P()`, above).
    - `stepsize_controller`: a diffrax step-size controller (default
      `diffrax.PIDController(rtol, atol, norm=optimistix.max_norm)`).
    - `adjoint`: `diffrax.RecursiveCheckpointAdjoint()` (default), `diffrax.ForwardMode()` or
      `diffrax.DirectAdjoint()`.
    - `max_steps`: step budget (accepted + rejected).
    - `throw`: raise `SolverError` with diffrax's message on failure (under `jit`, through
      `equinox.error_if`); with `False`, return `success = False` and the `result` flag.
    - `progress`: a `diffrax.TqdmProgressMeter` bar (stderr) on the ODE path.
    - `z_inf`: the limit `z(∞)` to measure switch-on against (default: see above).
    - `method`: `"auto"`, `"closed_form"` (Thm 6; diagonal `C` only) or `"ode"`.

    **Returns:** an `LVSolution`.

    **Raises:** `LvflowError` for bad input; `SolverError` for a failed solve (with `throw=True`).

    Works under `jax.jit`/`jax.vmap` over `z0`, `t1` and the system's arrays.
    """
    if not isinstance(system, AbstractLotkaVolterra):
        raise LvflowError(f"system: expected a LotkaVolterra or LowRankLotkaVolterra, got {type(system).__name__}")
    K = system.K
    z0 = as_array("z0", z0, ndim=1)
    if np.shape(z0) != (K,):
        raise LvflowError(f"z0: shape {np.shape(z0)} does not match the system's {K} modes")
    if _is_concrete(z0) and np.any(np.asarray(z0) <= 0):
        k = int(np.flatnonzero(np.asarray(z0) <= 0)[0])
        raise LvflowError(
            f"z0: must be > 0 in every mode (entry {k} is {float(np.asarray(z0)[k]):g}; "
            "a mode at 0 never grows — drop it from the system instead)"
        )
    if _is_concrete(t1):
        t1 = check_positive("t1", t1)
    else:
        t1 = eqx.error_if(t1, t1 <= 0, "t1: must be > 0")
    if _is_concrete(rho):
        rho = check_in_open_interval("rho", rho, 0.0, 1.0)
    else:
        rho = eqx.error_if(rho, (rho <= 0) | (rho >= 1), "rho: must lie in (0, 1)")
    rtol = check_positive("rtol", rtol)
    atol = check_positive("atol", atol)
    if not isinstance(max_steps, int) or max_steps < 1:
        raise LvflowError(f"max_steps: must be a positive integer, got {max_steps!r}")
    if not isinstance(progress, (bool, np.bool_)):
        raise LvflowError(f"progress: must be True or False, got {progress!r}")
    progress = bool(progress)  # static in the compiled solve
    if ts is None:
        ts = _default_ts_np(t1) if _is_concrete(t1) else default_ts(t1)
    else:
        ts = as_array("ts", ts, ndim=1)
        if _is_concrete(ts) and _is_concrete(t1):
            a = np.asarray(ts, dtype=float)
            if a.size == 0:
                raise LvflowError("ts: is empty")
            if a[0] < 0 or a[-1] > t1:
                raise LvflowError(f"ts: must lie in [0, t1 = {t1:g}], got [{a[0]:g}, {a[-1]:g}]")
            if np.any(np.diff(a) < 0):
                raise LvflowError("ts: must be non-decreasing")
    solver_given = solver is not None
    if solver_given or stepsize_controller is not None or adjoint is not None:
        from .solve_ode import check_ode_options

        check_ode_options(solver, stepsize_controller, adjoint)

    if method not in ("auto", "closed_form", "ode"):
        raise LvflowError(f"method: must be 'auto', 'closed_form' or 'ode', got {method!r}")

    scale = _float64_scale(system, z0)
    if scale != 1.0:  # some z_k0 below the smallest normal double: the same flow, rescaled (see there)
        sol = solve_lv(
            _rescaled(system, scale),
            np.asarray(z0, dtype=float) / scale,
            t1,
            **dict(ts=ts, rho=rho, rtol=rtol, atol=atol, solver=solver, stepsize_controller=stepsize_controller),
            **dict(adjoint=adjoint, max_steps=max_steps, throw=throw, progress=progress, method=method),
            z_inf=None if z_inf is None else np.asarray(z_inf, dtype=float) / scale,
        )
        scaled = (sol.zs * scale, sol.loss * scale + system.y2, sol.z_inf * scale)  # z = s z', L = s L' + y2
        return eqx.tree_at(lambda s: (s.zs, s.loss, s.z_inf), sol, scaled)

    r = system.r
    low_rank = _is_low_rank(system)
    concrete_system = all(_is_concrete(x) for x in ((r, system.d, system.U) if low_rank else (r, system.C)))
    diagonal = _diagonal_part(system, low_rank)  # C's diagonal if C is concrete and diagonal, else None
    if method == "closed_form" and diagonal is None:
        if _is_concrete(system.U if low_rank else system.C):
            raise LvflowError("method: 'closed_form' needs a diagonal C (Thm 6); use method='ode' for a coupled C")
        C = system.C
        off = C - jnp.diag(jnp.diagonal(C))
        diagonal = eqx.error_if(jnp.diagonal(C), jnp.any(off != 0), "method: 'closed_form' needs a diagonal C (Thm 6)")
    closed = diagonal is not None and (method == "closed_form" or (method == "auto" and not solver_given))
    if z_inf is not None:
        z_inf = as_array("z_inf", z_inf, ndim=1)
        if np.shape(z_inf) != (K,):
            raise LvflowError(f"z_inf: shape {np.shape(z_inf)} does not match the system's {K} modes")
        if _is_concrete(z_inf) and np.any(np.asarray(z_inf) < 0):
            raise LvflowError("z_inf: must be >= 0")
        z_eq, eq_ok = jnp.asarray(z_inf, dtype=float), jnp.asarray(True)
    else:
        z_eq, eq_ok = saturated_equilibrium(r, system.interaction())
        if concrete_system and not np.all(np.isfinite(z_eq)):
            raise LvflowError("system: no finite saturated equilibrium (the loss is unbounded below)")

    if closed:
        sol = _closed_form_core(
            r,
            diagonal,
            _host(z0),
            _host(t1),
            _host(ts),
            z_eq,
            eq_ok,
            _host(rho),
            system.y2,
        )
    else:
        from .solve_ode import check_result, solve_ode

        sol = solve_ode(
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
        )
    if throw:
        if _is_concrete(sol.success):
            if not bool(sol.success):
                raise SolverError(_failure_message(sol))
        else:
            if not closed:  # the closed form's result is `successful`: it fails only by non-finite values
                sol = check_result(sol)
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


def _host(x):
    """`x` as a float64 numpy array when concrete (a jitted call takes it without an eager device
    dispatch per argument), else as a JAX array."""
    return np.asarray(x, dtype=float) if _is_concrete(x) else jnp.asarray(x, dtype=float)


def _diagonal_part(system, low_rank: bool):
    """`C`'s diagonal when `C` is concrete and diagonal (Thm 6 applies), else `None`."""
    if low_rank:
        if not (_is_concrete(system.U) and _is_concrete(system.d)):
            return None
        return system.d if not np.any(np.asarray(system.U)) else None
    if not _is_concrete(system.C) or not is_diagonal(np.asarray(system.C)):
        return None
    return np.diagonal(np.asarray(system.C))


def _is_low_rank(system) -> bool:
    return isinstance(system, LowRankLotkaVolterra)


def _failure_message(sol: LVSolution) -> str:
    import diffrax as dfx  # a failed solve only

    why = "non-finite values in the solution" if sol.result == dfx.RESULTS.successful else dfx.RESULTS[sol.result]
    return f"solve_lv: {why} (after {int(sol.num_steps)} steps)"


def _thm6(r, c, z0, t):
    """Thm 6, `z_k(t) = z_k0 / (e^{−r_k t} + C_kk z_k0 (1 − e^{−r_k t})/r_k)` for `r_k > 0` and
    `z_k0 e^{r_k t} / (1 + C_kk z_k0 (1 − e^{r_k t})/(−r_k))` otherwise (`z_k0/(1 + C_kk z_k0 t)` at
    `r_k = 0`): the algebraically equal form of each sign that never overflows, in two
    transcendentals per entry (`lvflow.orthogonal_features` evaluates both forms everywhere)."""
    a = jnp.abs(r)
    e = jnp.exp(-a * t)  # ≤ 1
    phi = jnp.where(a > 0, -jnp.expm1(-a * t) / jnp.where(a > 0, a, 1.0), t)  # ∫₀ᵗ e^{−aτ}dτ, exact near a = 0
    grow = r > 0
    # A growing mode with C_kk z_k0 below the normal range (the flow of a rescaled subnormal z0,
    # `_float64_scale`) has numerator and denominator multiplied by 2^m, m from ln(C_kk z_k0).
    lcz = jnp.log(c) + jnp.log(z0)
    m = jnp.where(grow & (lcz < -690.0), jnp.floor(-lcz / np.log(2.0)), 0.0)
    e = jnp.where(m > 0, jnp.exp(-a * t + m * np.log(2.0)), e)
    cz = jnp.where(m > 0, jnp.exp(lcz + m * np.log(2.0)), c * z0)
    return jnp.ldexp(z0, m.astype(int)) * (jnp.where(grow, 1.0, e) / (jnp.where(grow, e, 1.0) + cz * phi))


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
    zs = _thm6(r[None], c[None], z0[None], ts[:, None])
    z_end = _thm6(r, c, z0, t1)
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
