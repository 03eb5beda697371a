"""Numerical solution of the gLV (Eq. 32) in log variables, with switch-on times (Thm 8)."""

from __future__ import annotations

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array, Bool, Float

from ._errors import LvflowError, SolverError
from ._lv import LotkaVolterra, LowRankLotkaVolterra, equilibrium_is_unique, saturated_equilibrium, saturated_equilibrium_jax
from ._crossing import _hermite_root
from ._interaction import _U_CLIP, _Interaction
from ._rosenbrock import _DENSE_ROSENBROCK_MAX_K, _rosenbrock_core
from ._solution import LVSolution, finish_solution, switch_on_target
from ._validate import _is_concrete, as_array, check_in_open_interval, check_positive

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
    system: LotkaVolterra,
    z0,
    t1,
    *,
    ts=None,
    rho=0.5,
    rtol: float = 1e-8,
    atol: float = 1e-10,
    solver: dfx.AbstractSolver | None = None,
    max_steps: int = _DEFAULT_MAX_STEPS,
    throw: bool = True,
    progress: bool = False,
    z_inf=None,
    method: str = "auto",
) -> LVSolution:
    """Integrate the gLV `ż_k = z_k (r_k − Σ_j C_kj z_j)` (Eq. 32) from `z(0) = z0` to `t1`.

    The flow is integrated in `u = ln z`, `u̇ = r − C e^u`: tiny initial values (`z0` down to
    `1e-300`) are then an ordinary offset rather than a stiffness, and the error control is on
    `ln z`, i.e. *relative* in `z` for every mode, whatever its size. `rtol`/`atol` are the
    step-size tolerances on `u` (so `atol` is an absolute error in `ln z`, a relative error in `z`).

    **Method.** A diagonal `C` (orthogonal features) is solved exactly (Thm 6): `method="auto"`
    (default) uses the closed form when `C` is concrete (not traced) and diagonal and no `solver=`
    is given, and the ODE otherwise; `"closed_form"` and `"ode"` force either. The closed form
    evaluates Thm 6 (as `orthogonal_features`, in two transcendentals per entry) at `ts` and inverts Thm 6 for the
    switch-on times: with target `T_k = ρ z_k(∞)` and `z_k0 < T_k < r_k/C_kk`,

    `t*_k = (1/r_k) [ ln(T_k/z_k0) + ln(1 + C_kk (T_k − z_k0)/(r_k − C_kk T_k)) ]`,

    which is Eq. 158 (`a = 1`) with its exact `ε`-dependence at `T_k = ρ r_k/C_kk`, written as two
    non-negative terms (no cancellation). It costs `O(K n)`, is exact to rounding, needs no
    tolerances, and its solver statistics are zero; `rtol`, `atol`, `max_steps` and `progress`
    do not apply to it (it is over in microseconds: no progress bar). A traced `C` with
    `method="closed_form"` is checked for off-diagonal entries through `equinox.error_if`.

    **Solver** (the ODE path). Default: RODAS5P (Steinebach 2023; 8 stages, order 5(4), L-stable,
    stiffly accurate, dense output of order 4), written as one `lax.while_loop`, with the exact
    Jacobian `J = −C Diag(z)` of `u̇ = r − C e^u`. Each stage solves `(1/(hγ)) I − J`, factorised
    once per step in `C`'s structure: `Diag(d)` in `O(K)`; `LowRankLotkaVolterra`
    (`Diag(d) + UUᵀ`) by Woodbury in `O(K q²)` (the `q × q` capacitance is `I` + PSD); a dense `C`
    by LU, `O(K³)`, only for `K ≤ 100` (above that, Dopri5 below). Error control: max norm over
    modes of `|err_k| / (atol + rtol max(|u_k|, |u_k'|))` (an RMS norm lets single modes of a
    1000-mode system drift), Gustafsson's predictive step-size controller. Why: in `ln z` the flow
    is stiff over the long horizons of the gLV (eigenvalues of `J` up to about `max r`, horizons of
    `10⁴/max r`), so explicit solvers are step-limited by stability. Measured (2 cores, float64,
    rtol 1e-8, atol 1e-10, warm; `python -m benchmarks --only glv`, see `benchmarks/README.md`):
    the 1000-mode rank-4 coupled benchmark takes 840 steps (8 rejected), 66–94 ms, vs Dopri5
    (diffrax, same norm) 6690 steps, and scipy LSODA (dense Jacobian) 0.9–1.2 s; its switch-on
    times are within 8e-9 of a rtol 1e-12 solve (LSODA at the same tolerance: 1.2e-7). On the
    Fig 3-right system with `method="ode"` they are within 3.2e-9 of Eq. 158 (LSODA: 1.1e-7).
    The cost is the step itself (~80 µs at K = 1000: ~140 small XLA kernels — 8 stages of exp,
    two `K × q` passes for `C e^u`, two for the solve — each dominated by dispatch on the CPU).
    A variable-order NDF with the same Woodbury solves was measured as fast and 50x less
    accurate. RODAS5 (Di Marzo) was tried first: its embedded estimate vanishes like `h⁷` in the
    growth phase `u̇ ≈ r` and let the global error reach 1e-6 at rtol 1e-10; RODAS4 took 2.3x
    the steps.

    With `solver=` (any diffrax solver) the solve goes through `diffrax.diffeqsolve` with a PID
    controller on the same max norm, saving every accepted step for the switch-on search
    (`max_steps × K` floats: 131 MB for `K = 1000` at the default `max_steps`); that path is also
    used for a dense `C` with `K > 100`, with `diffrax.Dopri5()`.

    **Switch-on times** (Thm 8): with RODAS5P, after every accepted step each mode not yet
    switched on is tested for `u_k ≥ ln(ρ z_k(∞))`; the first step where it holds is kept (its
    start, length, end values and dense-output coefficients, `O(K)` memory, no step history) and
    the crossing is found after the loop by bisection on that step's order-4 dense output. Saved
    values at `ts` come from the same dense output. On the diffrax path the crossing step is
    located in the stored steps and the crossing found on the cubic Hermite interpolant through
    the step's end values and slopes. Either way the accuracy follows the solver tolerance, not a
    grid.

    **`z(∞)`.** The saturated equilibrium (`LotkaVolterra.equilibrium`: `z ≥ 0`, `r − Cz ≤ 0`,
    complementary), which is the flow's limit from any positive `z0` when it is unique (`C` positive
    definite on the active and marginal modes). When it is not unique (singular `C`, e.g. two
    identical features: the flow conserves `ln z` along the null space of `C`, so the limit depends
    on `z0`), `z(t1)` is used instead: choose `t1` past the last transition. For traced systems
    (`jax.vmap` over systems) it is computed in JAX by block principal pivoting, falling back to
    `z(t1)` if that does not converge (uniqueness is not checked there: pass `z_inf=` for singular
    `C` under `vmap`). `z_inf=` overrides it everywhere.

    **Arguments:**

    - `system`: a `LotkaVolterra` or a `LowRankLotkaVolterra`.
    - `z0`: initial mode strengths, shape `(K,)`, all `> 0` (a mode at exactly 0 stays there).
    - `t1`: final time, `> 0`.
    - `ts`: save times in `[0, t1]`, increasing (default: `default_ts(t1)`, 0 and 399
      log-spaced). Only switch-on times wanted: pass `ts=[0, t1]` (the closed form's cost is then
      `O(K)` instead of `O(400 K)`: 0.9 ms instead of 3–4.6 ms for Fig 3's 1000 modes).
    - `rho`: switch-on fraction in `(0, 1)` (Eq. 158; the paper's figures use `ρ = ½`).
    - `rtol`, `atol`: step-size tolerances on `u = ln z`.
    - `solver`: a diffrax solver; given, the ODE goes through diffrax (default: RODAS5P, above).
    - `max_steps`: step budget (accepted + rejected); on the diffrax path all accepted steps are
      stored (`max_steps × K` floats).
    - `throw`: raise `SolverError` on failure (default); with `False`, return `success = False`.
    - `progress`: show a tqdm progress bar (`diffrax.TqdmProgressMeter`, on stderr) tracking
      `t/t1` on either ODE path: RODAS5P's loop drives the same meter as `diffrax.diffeqsolve`
      (a throttled callback every 20 steps; under `vmap`, one bar following the slowest element).
      `False` (default) compiles the loop without callbacks. The closed form (diagonal `C`) has no
      steps to show and shows no bar.
    - `z_inf`: the limit `z(∞)` to measure switch-on against (default: see above).
    - `method`: `"auto"`, `"closed_form"` (Thm 6; diagonal `C` only) or `"ode"` (see above).

    Works under `jax.jit`/`jax.vmap` over `z0`, `t1` and the system's arrays; input checks then
    apply to the concrete arguments only, and `throw=True` raises through `equinox.error_if`.
    """
    if not (isinstance(system, LotkaVolterra) or _is_low_rank(system)):
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
    if _is_concrete(rho):
        rho = check_in_open_interval("rho", rho, 0.0, 1.0)
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
    solver = dfx.Dopri5() if solver is None else solver
    if not isinstance(solver, dfx.AbstractSolver):
        raise LvflowError(f"solver: expected a diffrax solver, got {type(solver).__name__}")

    if method not in ("auto", "closed_form", "ode"):
        raise LvflowError(f"method: must be 'auto', 'closed_form' or 'ode', got {method!r}")

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
    if low_rank and diagonal is None:
        op = _Interaction(d=system.d, U=system.U if system.U.shape[1] else None, dense=None)
    elif diagonal is not None:
        op = _Interaction(d=diagonal, U=None, dense=None)
    else:
        op = _Interaction(d=None, U=None, dense=system.C)
    if z_inf is not None:
        z_inf = as_array("z_inf", z_inf, ndim=1)
        if np.shape(z_inf) != (K,):
            raise LvflowError(f"z_inf: shape {np.shape(z_inf)} does not match the system's {K} modes")
        if _is_concrete(z_inf) and np.any(np.asarray(z_inf) < 0):
            raise LvflowError("z_inf: must be >= 0")
        z_eq, eq_ok = jnp.asarray(z_inf, dtype=float), jnp.asarray(True)
    elif concrete_system:
        z_eq, eq_ok = _concrete_equilibrium(system, low_rank, diagonal)
    elif diagonal is not None:  # Thm 6: z*_k = r_k/C_kk or 0, in JAX for a traced r
        z_eq = jnp.where((r > 0) & (diagonal > 0), r / jnp.where(diagonal > 0, diagonal, 1.0), 0.0)
        eq_ok = jnp.all((diagonal > 0) | (r < 0))
    else:
        z_eq, eq_ok = saturated_equilibrium_jax(r, system.C)

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
        args = (
            r,
            op,
            jnp.log(jnp.asarray(z0, dtype=float)),
            jnp.asarray(t1, dtype=float),
            jnp.asarray(ts, dtype=float),
            z_eq,
            eq_ok,
            jnp.asarray(rho, dtype=float),
            system.y2,
            jnp.asarray(rtol),
            jnp.asarray(atol),
        )
        if not solver_given and (op.dense is None or K <= _DENSE_ROSENBROCK_MAX_K):
            sol = _rosenbrock_core(*args, max_steps=max_steps, progress=progress)
        else:
            sol = _solve_core(*args, solver=solver, max_steps=max_steps, progress=progress)
    if throw:
        if _is_concrete(sol.success):
            if not bool(sol.success):
                raise SolverError(_failure_message(sol))
        else:
            sol = eqx.error_if(sol, ~sol.success, "solve_lv: the gLV solve failed (see diffrax.RESULTS)")
    return sol


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
    if not _is_concrete(system.C) or not _is_diagonal(np.asarray(system.C)):
        return None
    return np.diagonal(np.asarray(system.C))


def _is_diagonal(C: np.ndarray) -> bool:
    K = C.shape[0]
    # The off-diagonal entries, as a strided view: flat[1:] in rows of K + 1, minus the last column.
    return K < 2 or not np.any(np.ascontiguousarray(C).ravel()[1:].reshape(K - 1, K + 1)[:, :-1])


def _is_low_rank(system) -> bool:
    return isinstance(system, LowRankLotkaVolterra)


def _concrete_equilibrium(system, low_rank: bool, diagonal=None):
    """`(z*, unique)` in numpy. Low rank `C = Diag(d) + UUᵀ` (`d > 0`, so `C` is positive definite
    and `z*` unique): try the interior point `C⁻¹r` by Woodbury in `O(K q²)` first."""
    rn = np.asarray(system.r, dtype=float)
    if diagonal is not None:
        return _diagonal_equilibrium(rn, np.asarray(diagonal, dtype=float))
    if low_rank:
        d, U = np.asarray(system.d, dtype=float), np.asarray(system.U, dtype=float)
        Dr, DU = rn / d, U / d[:, None]
        z = Dr - DU @ np.linalg.solve(np.eye(U.shape[1]) + U.T @ DU, U.T @ Dr)
        if np.all(z > 0):
            return jnp.asarray(z), jnp.asarray(True)
        return jnp.asarray(saturated_equilibrium(np.asarray(system.C), rn)), jnp.asarray(True)
    Cn = np.asarray(system.C, dtype=float)
    d = np.diagonal(Cn)
    _check_bounded(rn, d)
    z = saturated_equilibrium(Cn, rn)
    if not np.all(np.isfinite(z)):
        raise LvflowError("system: no finite saturated equilibrium (the loss is unbounded below)")
    return jnp.asarray(z), jnp.asarray(equilibrium_is_unique(Cn, rn, z))


def _check_bounded(r: np.ndarray, d: np.ndarray) -> None:
    grow = (d <= 0) & (r > 0)
    if np.any(grow):
        k = int(np.flatnonzero(grow)[0])
        raise LvflowError(f"system: mode {k} has r_k = {r[k]:g} > 0 but C_kk = {d[k]:g}, so z_k grows without bound")


def _diagonal_equilibrium(r: np.ndarray, d: np.ndarray):
    """Thm 6: `z*_k = r_k/C_kk` or 0; unique unless a mode has `C_kk = r_k = 0`."""
    _check_bounded(r, d)
    z = np.where(r > 0, r / np.where(d > 0, d, 1.0), 0.0)
    return z, np.asarray(bool(np.all((d > 0) | (r < 0))))


def _failure_message(sol: LVSolution) -> str:
    if sol.result == dfx.RESULTS.successful:
        why = "non-finite values in the solution"
    else:
        why = str(sol.result).split("<", 1)[-1].rstrip(">")
    return f"solve_lv: {why} (after {int(sol.num_steps)} steps)"


@eqx.filter_jit
def _solve_core(
    r: Float[Array, " K"],
    op: _Interaction,
    u0: Float[Array, " K"],
    t1: Float[Array, ""],
    ts: Float[Array, " n"],
    z_eq: Float[Array, " K"],
    eq_ok: Bool[Array, ""],
    rho: Float[Array, ""],
    y2: Float[Array, ""],
    rtol: Float[Array, ""],
    atol: Float[Array, ""],
    *,
    solver: dfx.AbstractSolver,
    max_steps: int,
    progress: bool,
) -> LVSolution:
    """Arrays in, `LVSolution` out: jittable and vmappable; `C` enters only through `op`'s
    structured products."""

    def field(t, u, args):
        # u̇ = r − C e^u: Eq. 32 divided by z. The clip only acts on trial stages of a step that
        # overshoots (a mode igniting within one long step): without it e^u overflows, the error
        # estimate is NaN and the controller proposes a NaN step instead of a shorter one.
        return r - op.Cz(jnp.exp(jnp.minimum(u, _U_CLIP)))

    meter = dfx.TqdmProgressMeter() if progress else dfx.NoProgressMeter()
    out = dfx.diffeqsolve(
        dfx.ODETerm(field),
        solver,
        t0=0.0,
        t1=t1,
        dt0=None,
        y0=u0,
        saveat=dfx.SaveAt(subs=[dfx.SubSaveAt(ts=ts), dfx.SubSaveAt(t0=True, steps=True)]),
        stepsize_controller=dfx.PIDController(rtol=rtol, atol=atol, norm=optx.max_norm),
        max_steps=max_steps,
        throw=False,
        progress_meter=meter,
    )
    us = out.ys[0]
    step_ts, step_us = out.ts[1], out.ys[1]
    n_saved = out.stats["num_accepted_steps"] + 1
    u_end = step_us[n_saved - 1]
    z_inf = jnp.where(eq_ok, z_eq, jnp.exp(u_end))

    switch = _switch_on_times(step_ts, step_us, n_saved, z_inf, rho, r, op)
    zs = jnp.exp(us)
    return finish_solution(
        ts=ts,
        zs=zs,
        Czs=op.Cz(zs),
        r=r,
        y2=y2,
        switch_on_times=switch,
        z_inf=z_inf,
        rho=rho,
        z_end=u_end,
        num_steps=out.stats["num_steps"],
        num_accepted=out.stats["num_accepted_steps"],
        num_rejected=out.stats["num_rejected_steps"],
        result=out.result,
    )


def _thm6(r, c, z0, t):
    """Thm 6, `z_k(t) = z_k0 / (e^{−r_k t} + C_kk z_k0 (1 − e^{−r_k t})/r_k)` for `r_k > 0` and
    `z_k0 e^{r_k t} / (1 + C_kk z_k0 (1 − e^{r_k t})/(−r_k))` otherwise (`z_k0/(1 + C_kk z_k0 t)` at
    `r_k = 0`): the algebraically equal form of each sign that never overflows, in two
    transcendentals per entry (`lvflow.orthogonal_features` evaluates both forms everywhere)."""
    a = jnp.abs(r)
    e = jnp.exp(-a * t)  # ≤ 1
    phi = jnp.where(a > 0, -jnp.expm1(-a * t) / jnp.where(a > 0, a, 1.0), t)  # ∫₀ᵗ e^{−aτ}dτ, exact near a = 0
    grow = r > 0
    # z0 multiplies last: a subnormal z0 (ln z0 < −708) is scaled by one well-rounded factor.
    return z0 * (jnp.where(grow, 1.0, e) / (jnp.where(grow, e, 1.0) + c * z0 * phi))


@jax.jit
def _closed_form_core(
    r: Float[Array, " K"],
    c: Float[Array, " K"],
    z0: Float[Array, " K"],
    t1: Float[Array, ""],
    ts: Float[Array, " n"],
    z_eq: Float[Array, " K"],
    eq_ok: Bool[Array, ""],
    rho: Float[Array, ""],
    y2: Float[Array, ""],
) -> LVSolution:
    """Thm 6 at `ts` and its inversion for the switch-on times (diagonal `C = Diag(c)`)."""
    u0 = jnp.log(z0)
    zs = _thm6(r, c, z0, ts[:, None])
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
    zero = jnp.asarray(0)  # the dtype diffrax's statistics have
    return finish_solution(
        ts=ts,
        zs=zs,
        Czs=c * zs,
        r=r,
        y2=y2,
        switch_on_times=t_star,
        z_inf=z_inf,
        rho=rho,
        z_end=z_end,
        num_steps=zero,
        num_accepted=zero,
        num_rejected=zero,
        result=dfx.RESULTS.successful,
    )


def _switch_on_times(step_ts, step_us, n_saved, z_inf, rho, r, op):
    """First `t` with `u_k(t) = ln(ρ z_k(∞))`, by bisection on the cubic Hermite interpolant of the
    accepted step that brackets the first upward crossing (Thm 8's `t*_k`)."""
    K = step_us.shape[-1]
    modes = jnp.arange(K)
    target = switch_on_target(z_inf, rho)
    n = step_ts.shape[0]

    # First saved step at or above the target, by a loop over the accepted steps only that stops
    # once every mode is found: a reduction over the whole (max_steps, K) buffer costs ~10x more.
    def scan_cond(carry):
        i, first = carry
        return (i < n_saved) & jnp.any(first == n)

    def scan_body(carry):
        i, first = carry
        row = jax.lax.dynamic_index_in_dim(step_us, i, keepdims=False)
        return i + 1, jnp.where((first == n) & (row >= target), i, first)

    _, i1 = jax.lax.while_loop(scan_cond, scan_body, (jnp.asarray(0), jnp.full(K, n)))
    reached = (i1 < n) & (z_inf > 0)
    i1 = jnp.minimum(i1, n_saved - 1)
    i0 = jnp.maximum(i1 - 1, 0)
    ta, tb = step_ts[i0], step_ts[i1]
    h = tb - ta
    ga, gb = step_us[i0, modes] - target, step_us[i1, modes] - target

    # Slopes u̇_k = r_k − (C e^u)_k at the bracket's ends: one row of C per mode. A diagonal C
    # needs only u_k itself; otherwise mode k's whole state at its own bracket (K × K).
    def slope(i):
        if op.dense is None and op.U is None:
            return r - op.d * jnp.exp(step_us[i, modes])
        return r - op.rows_dot(jnp.exp(step_us[i]))

    da, db = slope(i0) * h, slope(i1) * h
    t_cross = ta + _hermite_root(ga, gb, da, db) * h
    t_star = jnp.where(i1 == 0, 0.0, t_cross)
    return jnp.where(reached, t_star, jnp.inf)
