"""One configuration of `predict`, as a function of arrays: the single implementation behind
`lvflow.predict` (one call) and `lvflow.sweep` (vmapped over a batch, compiled once per group),
and the host-side facts about a system it needs.

For each configuration it computes, per mode in the system's own order:

- the horizon `t1` (`predict`'s default where not given) and the curve's time grid;
- `t_star`: the finite-ε switch-on time `t*_k`, the first time `z_k = ρ z_k(∞)` (Thm 8,
  Eq. 158): for a diagonal `C` Thm 6 inverted exactly, otherwise the ODE (`solve_lv`); `inf` for a
  mode that does not grow (`z_k(∞) ≤ z_k0`) or does not switch on by `t1`; a mode that switches on
  and is later switched off by a competitor (`z_k(∞) = 0`) is measured against `ρ` × the plateau it
  switches on to (from the ε → 0 schedule), in the same solve;
- `z_inf`, the loss and the excess loss `L(z(t)) − min L` on the grid (never negative: the floor is
  the loss's true minimum over `z ≥ 0`, the saturated equilibrium, which holds for a singular `C`
  too);
- `success` (a finite solve within the step budget) and `valid` (`predict` would accept it).

A subnormal `z0` (ε below float64's normal range, which compiled code reads as 0) is solved as the
same flow rescaled, `z = s z'`, `C' = s C` (Eq. 32 is invariant), with `s` a power of two.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._curve.drops import loss_drops
from .._glv.equilibrium import saturated_equilibrium
from .._glv.lv import AbstractLotkaVolterra, LotkaVolterra, LowRankLotkaVolterra
from .._glv.solve import _closed_form_core, solve_lv
from .base import Init, Schedule

if TYPE_CHECKING:
    from .families import Group

_LN2 = math.log(2.0)
_LOG2_TINY = math.log2(np.finfo(np.float64).tiny)


# --------------------------------------------------------------------------------------------
# Host-side facts about a system (once per system)
# --------------------------------------------------------------------------------------------


def loss_floor(system: AbstractLotkaVolterra) -> tuple[np.ndarray, bool]:
    """The minimiser `z*` of the loss over `z ≥ 0` (the saturated equilibrium, the flow's limit:
    `r − Cz* ≤ 0`, `= 0` where `z* > 0`; `saturated_equilibrium`) and whether it is unique (`C`
    positive definite on the modes active or marginal at `z*`; otherwise the flow's limit depends on
    `z0`, but the minimum `L(z*)` does not)."""
    # through the class: equinox builds a module (`BoundMethod`) for each `system.interaction` read
    z, unique = saturated_equilibrium(system.r, type(system).interaction(system))
    return np.asarray(z, dtype=float), bool(unique)


def switch_off_levels(system: AbstractLotkaVolterra, sched, z_floor: np.ndarray) -> np.ndarray:
    """Per mode that ignites in the ε → 0 schedule but ends at 0 (`z*_k = 0`: a competitor
    switches it off), `z_k` on the plateau it ignites into (just after `τ*_k`); 0 elsewhere."""
    tau = np.asarray(sched.tau_star, dtype=float)
    level = np.zeros(tau.shape[0])
    for k in np.flatnonzero(np.isfinite(tau) & (z_floor <= 0)):
        level[k] = float(system.equilibrium(np.asarray(sched.active_at(float(tau[k]))))[k])
    return level


# --------------------------------------------------------------------------------------------
# One configuration, traced
# --------------------------------------------------------------------------------------------


def horizon(
    r: Float[Array, " K"], Ckk: Float[Array, " K"], log_z0: Float[Array, " K"], tau: Float[Array, " K"], log_eps
) -> Float[Array, ""]:
    """`predict`'s default horizon: 1.2× the latest estimated ignition (isolated-mode Eq. 158,
    `ln(r_k/(C_kk z_k0))/r_k`, at least `1/r_k`, and `τ*_k ln(1/ε)`) plus eight e-folding times of
    the slowest growing mode. Logs of each factor: `z_k0` may be subnormal."""
    grow = (r > 0) & (Ckk > 0)
    safe_r = jnp.where(grow, r, 1.0)
    log_ratio = jnp.log(safe_r) - jnp.log(jnp.where(grow, Ckk, 1.0)) - log_z0
    t_iso = jnp.where(grow, jnp.maximum(log_ratio, 1.0) / safe_r, 0.0)
    t_sched = jnp.where(jnp.isfinite(tau), tau, 0.0) * -log_eps
    rmin = jnp.min(jnp.where(r > 0, r, jnp.inf))
    return 1.2 * jnp.maximum(jnp.max(t_iso), jnp.max(t_sched)) + 8.0 / rmin


def time_grid(t1, n: int, t_dyn) -> Float[Array, " T"]:
    """The curve's `2n − 1` times: `n` linear and `n − 1` log-spaced samples of `[0, t1]`, merged.
    With the dynamics over by `t_dyn` well inside `t1` (`t_dyn < t1/2`), half the linear samples
    fall in `[0, t_dyn]`, and the log samples start at `10⁻⁴ t_dyn` (else `10⁻⁴ t1`), so a long
    `t1` does not leave the switch-ons unsampled."""
    t_dyn = jnp.minimum(t_dyn, t1)
    h = n // 2
    split = jnp.concatenate([jnp.linspace(0.0, t_dyn, h, endpoint=False), jnp.linspace(t_dyn, t1, n - h)])
    lin = jnp.where(t_dyn < 0.5 * t1, split, jnp.linspace(0.0, t1, n))
    ts = jnp.sort(jnp.concatenate([lin, jnp.geomspace(t_dyn * 1e-4, t1, n)[:-1]]))
    return jnp.minimum(ts, t1)


def _scale(r, Ckk, log_z0):
    """`m` with `s = 2^m`: 0, or (some `z_k0` subnormal) the even power of two that puts
    `[min z0, max r_k/C_kk]` well inside float64's range (as `solve_lv` does for a concrete `z0`)."""
    grow = (r > 0) & (Ckk > 0)
    top = jnp.max(jnp.where(grow, jnp.log2(jnp.where(grow, r, 1.0)) - jnp.log2(jnp.where(grow, Ckk, 1.0)), -jnp.inf))
    lo = jnp.min(log_z0) / _LN2
    top = jnp.maximum(top, jnp.max(log_z0) / _LN2)
    return jnp.where(lo < _LOG2_TINY, 2 * jnp.round((top + lo + 600) / 4), 0.0)


#: `_closed_form_core`'s curve at `t ∈ {0, t1}` is finite when every argument lies within these
#: powers of ten (`_bounded`)
_BOUND = 1e100


def _bounded(
    r: Float[Array, " K"], c: Float[Array, " K"], z0: Float[Array, " K"], t1: Float[Array, ""]
) -> Bool[Array, ""]:
    """Whether Thm 6's `z_k(t)` (`_thm6`, Eq. 32 with a diagonal `C = Diag(c)`) is finite at
    `t = 0` and `t = t1`, read off the arguments without evaluating it: `|r_k|` (or 0), `c_k`, `z_k0`
    in `[10⁻¹⁰⁰, 10¹⁰⁰]` and `t1` in `[0, 10¹⁰⁰]` (NaN: not bounded). Then `ln(c_k z_k0) ≥ −461`, so
    `_thm6` takes no power-of-two rescaling; `e = e^{−|r_k| t} ≤ 1` and `φ = (1 − e)/|r_k| ≤ 10¹⁰⁰`
    (`t` at `r_k = 0`); a mode that does not grow has `z = z_k0 e/(1 + c_k z_k0 φ) ≤ z_k0`, and a
    growing one `z = z_k0/(e + c_k z_k0 φ)`, whose denominator is at least 1/2 (`e ≥ 1/2`) or at
    least `c_k z_k0/(2 r_k) ≥ 5·10⁻³⁰¹`, a normal number (`e < 1/2`), so `z ≤ max(2 z_k0, 2 r_k/c_k)
    ≤ 2·10²⁰⁰`."""
    a = jnp.abs(r)
    inside = lambda x: (x >= 1 / _BOUND) & (x <= _BOUND)  # noqa: E731
    return (t1 >= 0.0) & (t1 <= _BOUND) & jnp.all(((a == 0) | inside(a)) & inside(c) & inside(z0))


def configuration(
    r: Float[ArrayLike, " K"],
    Ckk: Float[ArrayLike, " K"],
    lv: AbstractLotkaVolterra | None,
    *,
    c: Float[ArrayLike, " K"],
    eps: Float[ArrayLike, ""],
    log_eps: Float[ArrayLike, ""],
    rho: Float[ArrayLike, ""],
    t1: Float[ArrayLike, ""],
    tau: Float[ArrayLike, " K"],
    z_on: Float[ArrayLike, " K"],
    z_floor: Float[ArrayLike, " K"] | None,
    y2: Float[ArrayLike, ""] = 0.0,
    points: int,
    rtol: float,
    atol: float,
    max_steps: int,
    z_inf_known: bool = True,
    progress: bool = False,
    check_curve: bool = True,
    keep_zs: bool = False,
) -> dict[str, Array]:
    """`predict` for one configuration of the gLV `ż_k = z_k (r_k − Σ_j C_kj z_j)` (Eq. 32) from
    `z_k0 = ε c_k`. Traceable (`jit`, `vmap`).

    **Arguments:**

    - `r`, `Ckk`: growth rates and `C`'s diagonal.
    - `lv`: the system for the ODE, or `None` for a diagonal `C` (Thm 6's closed form).
    - `c`, `eps`, `log_eps`: the initial scale (`log_eps = ln ε`, given apart: a subnormal ε reads
      as 0 in compiled code).
    - `rho`: the switch-on fraction.
    - `t1`: the horizon, NaN for `predict`'s default (`horizon`).
    - `tau`: the ε → 0 ignition times `τ*_k` (inf: never; NaN: not computed).
    - `z_on`: per mode switched off later by a competitor, `z_k` on the plateau it ignites into
      (`switch_off_levels`), else 0.
    - `z_floor`: the loss's minimiser over `z ≥ 0` (`loss_floor`); `None` for a diagonal `C`
      (`max(r_k, 0)/C_kk`).
    - `y2`: the loss's constant `(1/m) Σ y_μ²`.
    - `points`: `n`, the curve has `2n − 1` samples (`time_grid`); 0: only `[0, t1]`.
    - `rtol`, `atol`, `max_steps`: the ODE solver's.
    - `z_inf_known`: `z_floor` is the flow's limit (unique); otherwise `z(∞)` is `z(t1)` of a first solve.
    - `progress`: a progress bar during the ODE solve.
    - `check_curve`: `success` includes the curve's being finite. With `False`, for a diagonal `C`
      without `points`, it does not: where `bounded` (`_bounded`: the curve at `[0, t1]` is finite
      for these arguments) the check is redundant, elsewhere the caller evaluates again with
      `True` (`batched`, once per batch: the curve is not computed for a batch all `bounded`).
    - `keep_zs`: with `points`, also return `z` at `ts` (`predict`'s validity horizon).

    **Returns:** a dict of arrays: `valid`, `success`, `t1`, `ts`, `num_steps`, `t_star`,
    `z_inf`, `later_off` (per mode: measured against `z_on`), with `points` also `loss` and
    `excess_loss` at `ts` (and with `keep_zs` `zs`, shape `(T, K)`), and with `check_curve=False`
    for a diagonal `C` without `points` also `bounded`.
    """
    r, Ckk, c = jnp.asarray(r, float), jnp.asarray(Ckk, float), jnp.asarray(c, float)
    K = r.shape[0]
    grow = r > 0
    Ck = jnp.where(Ckk > 0, Ckk, 1.0)
    log_z0 = jnp.asarray(log_eps, float) + jnp.log(c)
    m = _scale(r, Ckk, log_z0)
    s = jnp.ldexp(jnp.ones(()), m.astype(jnp.int32))  # exact: a power of two
    z0 = jnp.where(m == 0, eps * c, jnp.exp(log_z0 - m * _LN2))  # z0/s
    valid = jnp.all(Ckk > 0) & jnp.any(grow) & ~jnp.any(grow & (Ckk * s * z0 >= r))
    tau = jnp.asarray(tau, float)
    t_dyn = horizon(r, Ckk, log_z0, tau, log_eps)
    t1 = jnp.where(jnp.isnan(t1), t_dyn, t1)
    ts = time_grid(t1, points, t_dyn) if points else jnp.stack([jnp.zeros(()), t1])
    zf = jnp.where(grow, r / Ck, 0.0) if z_floor is None else jnp.asarray(z_floor, float)
    zf = zf / s
    z_on = jnp.asarray(z_on, float) / s
    bounded = None  # only for check_curve=False (the closed form, no curve)
    if lv is None:
        sol = _closed_form_core(r, Ck * s, z0, t1, ts, zf, jnp.asarray(True), rho, 0.0)
        z_lim, later_off, steps = zf, jnp.zeros(K, bool), jnp.zeros((), jnp.int64)
        Cz = lambda z: jnp.broadcast_to(Ck * s, z.shape) * z  # noqa: E731
        t_star = sol.switch_on_times
        success = ~jnp.any(jnp.isnan(t_star))
        if points or check_curve:
            success &= jnp.all(jnp.isfinite(sol.zs))
        else:  # the curve is [0, t1]: finite where bounded; the caller checks the rest (`batched`)
            bounded = _bounded(r, Ck * s, z0, t1)
    else:
        lv_s: AbstractLotkaVolterra
        if isinstance(lv, LowRankLotkaVolterra):
            lv_s = LowRankLotkaVolterra(r, lv.d * s, lv.U * jnp.sqrt(s))
        else:
            lv_s = LotkaVolterra(r, lv.C * s, check=False)
        # `solve_lv(rho=0.5)` is unannotated, read as `float`; a traced ρ (under `vmap`) is what it takes here
        solve = functools.partial(
            solve_lv,
            rho=rho,  # pyright: ignore[reportArgumentType]
            rtol=rtol,
            atol=atol,
            max_steps=max_steps,
            throw=False,
        )
        steps = jnp.zeros((), jnp.int64)
        ok = jnp.asarray(True)
        if z_inf_known:
            z_lim = zf
        else:  # the flow's limit depends on z0: z(t1)
            first = solve(lv_s, z0, t1, ts=jnp.stack([jnp.zeros(()), t1]), z_inf=jnp.ones(K))
            z_lim, steps = first.zs[-1], first.num_steps.astype(jnp.int64)
            ok = (first.num_steps < max_steps) & jnp.all(jnp.isfinite(z_lim))
        later_off = (z_lim <= z0) & jnp.isfinite(tau) & (rho * z_on > z0)
        sol = solve(lv_s, z0, t1, ts=ts, z_inf=jnp.where(later_off, z_on, z_lim), progress=progress)
        # `sol.success` reads diffrax's result code, which under vmap sends XLA's algebraic
        # simplifier into a loop: the step budget not exhausted and finite values instead (RODAS5P
        # has no Newton iteration, the PID controller no dtmin: no other failure applies)
        success = ok & (sol.num_steps < max_steps) & jnp.all(jnp.isfinite(sol.zs))
        steps = steps + sol.num_steps.astype(jnp.int64)
        Cz = lv_s.Cz
        # a mode that does not grow (z_k(∞) ≤ z_k0) never switches on, unless later switched off
        t_star = jnp.where((z_lim > z0) | later_off, sol.switch_on_times, jnp.inf)
    out = {
        "valid": valid,
        "success": success & jnp.all(jnp.isfinite(z_lim)),
        "t1": t1,
        "ts": ts,
        "num_steps": steps,
        "t_star": jnp.where(jnp.isfinite(t_star), t_star, jnp.inf),
        "z_inf": z_lim * s,
        "later_off": later_off,
    }
    if bounded is not None:
        out["bounded"] = bounded
    if points:
        zs = sol.zs
        loss = jnp.sum(zs * Cz(zs), axis=-1) / 8 - zs @ r / 4  # Eq. 26 in modes, of z/s: times s
        floor = jnp.sum(zf * Cz(zf)) / 8 - zf @ r / 4
        out["loss"] = s * loss + y2
        out["excess_loss"] = jnp.maximum(s * (loss - floor), 0.0)
        if keep_zs:
            out["zs"] = s * zs
    return out


# --------------------------------------------------------------------------------------------
# A sweep's member: one row of a batch
# --------------------------------------------------------------------------------------------


def _staircase(tau, V):
    """Eq. 168 per mode for modes that ignite one at a time in index order (`τ*` strictly
    increasing): the excess loss just before mode `k` ignites, `Σ_{j ≥ k} V_j`."""
    return jnp.where(jnp.isfinite(tau), jnp.cumsum(V[::-1])[::-1], jnp.nan)


def make_member(group: Group, *, schedule: Schedule, host_schedule: bool, max_steps: int):
    """The evaluation of one configuration of `group` (a dict of arrays, one row of the batch):
    `configuration` plus the ε → 0 schedule's `tau_star` and `plateau_loss` (Eq. 168) and `r`,
    `V = r²/(8 C_kk)`; with the group's `horizon_points`, the curve at those points with its `loss`
    and `zs` (`configuration`'s `keep_zs`: the validity horizon's trajectory, `horizon.horizon_columns`)."""
    fam = group.family
    K = fam.K

    def member(x, *, check_curve: bool = True):
        r, Ckk, lv = fam.system(x)
        k = jnp.arange(1, K + 1, dtype=float)
        if group.init is Init.ARRAY:
            c = x["c"]
        elif group.init is Init.BETA:
            c = jnp.exp(-x["beta"] * jnp.log(k))  # k^{−β}
        else:
            c = jnp.ones(K)
        grow = r > 0
        V = jnp.where(grow, r**2 / (8 * jnp.where(Ckk > 0, Ckk, 1.0)), 0.0)
        if host_schedule:
            tau, plateau = x["tau_star"], x["plateau_loss"]
        elif schedule is not Schedule.NONE:  # a power-law spectrum: τ*_k = 1/r_k, increasing (Eq. 168)
            tau = jnp.where(grow, 1 / jnp.where(grow, r, 1.0), jnp.inf)
            plateau = _staircase(tau, V)
        else:
            tau = plateau = jnp.full(K, jnp.nan)
        res = configuration(
            r,
            Ckk,
            lv,
            c=c,
            eps=x["eps"],
            log_eps=x["log_eps"],
            rho=x["rho"],
            t1=x["t1"],
            tau=tau,
            z_on=x["z_on"] if "z_on" in x else jnp.zeros(K),
            z_floor=x.get("z_floor"),
            points=group.points or group.horizon_points,
            rtol=group.rtol,
            atol=group.atol,
            max_steps=max_steps,
            z_inf_known=fam.z_inf_known,
            check_curve=check_curve,
            keep_zs=bool(group.horizon_points),
        )
        out = {k: res[k] for k in ("valid", "success", "t1", "num_steps", "t_star", "z_inf", "bounded") if k in res}
        out.update(r=r, V=V)
        if schedule is not Schedule.NONE:
            out["tau_star"], out["plateau_loss"] = tau, plateau
        if group.points or group.horizon_points:
            out["ts"], out["excess_loss"] = res["ts"], res["excess_loss"]
        if group.horizon_points:
            out["loss"], out["zs"] = res["loss"], res["zs"]
        return out

    return member


#: configurations per vmapped slice where `batched` checks a batch's curves
_CHECK_SLICE = 64


def batched(member, *, per_member: bool):
    """`member` over a batch: `vmap`, or one after another (`lax.map`) where a vmapped batch would
    run batched LAPACK factorisations (a dense `C` under RODAS5P; a first pass for `z(∞)`), which
    deadlock on a CPU split into several devices (jaxlib's batched LU runs its batch on the thread
    pool the devices' programs occupy).

    Vmapped, `member` runs with `check_curve=False`: a diagonal group without a curve then does not
    evaluate Thm 6 at `[0, t1]` only to check it is finite (`configuration`), unless some member
    of the batch is not `bounded`, when the batch's `success` comes from `member` as is."""
    if per_member:
        return lambda x: jax.lax.map(member, x)

    def run(x):
        out = jax.vmap(functools.partial(member, check_curve=False))(x)
        if "bounded" in out:
            bounded, success = out.pop("bounded"), out["success"]
            # in slices: vmapped over the whole batch, the check's temporaries would enlarge the
            # working memory every call allocates (shared with the untaken branch), taken or not
            checked = lambda: jax.lax.map(member, x, batch_size=_CHECK_SLICE)["success"]  # noqa: E731
            out["success"] = jax.lax.cond(jnp.all(bounded), lambda: success, checked)
        return out

    return run


# --------------------------------------------------------------------------------------------
# Per-configuration numbers, on the host
# --------------------------------------------------------------------------------------------


def derived(out: dict[str, np.ndarray], eps: np.ndarray, lr: np.ndarray, alpha: tuple | None) -> dict:
    """Scalars per configuration from the per-mode results:

    - `ln_inv_eps` = ln(1/ε);
    - `n_on`: modes that switch on by `t1`; `t_first`, `t_last`: the first and last switch-on (the
      times `t*` a mode reaches `ρ` of its final strength: not when the loss drops, see
      `SweepResult.drops`); `steps_first = t_first/η`;
    - `tau_first`: the first ε → 0 ignition (`t_first ≈ tau_first · ln(1/ε)`);
    - `exponent`: Thm 9's `(α₁ − 1)/α₂` for a power-law spectrum with `α₁ > 1` (else NaN);
    - `exponent_fit`: the decay exponent the finite-ε staircase shows, the least-squares slope of
      −ln(plateau loss before each switch-on) against ln t*, over the 2nd to the ⌈K/10⌉-th
      switch-on (at least 4; NaN with fewer than 3 points). It tends to `exponent` as ε → 0,
      slowly (App. C).
    """
    t = out["t_star"]
    B, K = t.shape
    finite = np.isfinite(t)
    n_on = finite.sum(axis=1)
    with np.errstate(invalid="ignore"):
        t_first = np.min(t, axis=1) if K else np.full(B, np.inf)
        t_last = np.max(np.where(finite, t, -np.inf), axis=1)
    t_last = np.where(n_on > 0, t_last, np.nan)
    res = {
        "ln_inv_eps": -np.log(eps),
        "n_on": n_on.astype(np.int64),
        "t_first": t_first,
        "t_last": t_last,
        "steps_first": t_first / lr,
    }
    if "tau_star" in out:
        tau = out["tau_star"]
        res["tau_first"] = np.min(np.where(np.isnan(tau), np.inf, tau), axis=1)
    if alpha is not None:
        a1, a2 = alpha
        with np.errstate(invalid="ignore", divide="ignore"):
            res["exponent"] = np.where(a1 > 1, (a1 - 1) / a2, np.nan)
    else:
        res["exponent"] = np.full(B, np.nan)
    res["exponent_fit"] = _staircase_exponent(t, out.get("plateau_loss"))
    return res


#: drops of each configuration's curve given their own columns (`drop_columns`)
DROPS_SHOWN = 3
_PER_DROP = ("t", "step", "excess_loss_before", "excess_loss_after", "complete")
_READ = ("t", "excess_loss_before", "excess_loss_after")  # read off `LossDrops` (the rest derived)
#: the columns `drop_columns` returns, in order
DROP_COLUMNS = ("n_drops",) + tuple(f"drop{j + 1}_{k}" for j in range(DROPS_SHOWN) for k in _PER_DROP)


def drop_columns(ts: np.ndarray, excess: np.ndarray, lr: np.ndarray) -> dict[str, np.ndarray]:
    """Per configuration, the drops of its excess-loss curve as `predict`'s drops table reads them
    (`loss_drops`: plateau to plateau, timed where the loss crosses the midpoint between them):

    - `n_drops`: how many drops the curve has;
    - for the first `DROPS_SHOWN` drops `j = 1, 2, 3` (NaN, or False, where the curve has fewer):
      `drop{j}_t` (the time the loss crosses the midpoint between the plateaus on either side),
      `drop{j}_step` (`drop{j}_t/η`), `drop{j}_excess_loss_before`, `drop{j}_excess_loss_after`
      (the plateau levels of the excess loss `L − min L`) and `drop{j}_complete` (False: still
      falling at the horizon).

    **Arguments:** `ts`, `excess` of shape `(B, T)` (NaN-free: one group's curves), `lr` of shape
    `(B,)` (NaN where not given).

    **Returns:** the columns, each of shape `(B,)`.
    """
    B = ts.shape[0]
    n = np.zeros(B, dtype=np.int64)
    cols = {k: np.full((B, DROPS_SHOWN), np.nan) for k in _READ}
    complete = np.zeros((B, DROPS_SHOWN), dtype=bool)
    for b in range(B):
        d = loss_drops(ts[b], excess[b])
        n[b] = len(d)
        m = min(len(d), DROPS_SHOWN)
        cols["t"][b, :m] = d.t_mid[:m]
        cols["excess_loss_before"][b, :m] = d.loss_before[:m]
        cols["excess_loss_after"][b, :m] = d.loss_after[:m]
        complete[b, :m] = d.complete[:m]
    out: dict[str, np.ndarray] = {"n_drops": n}
    for j in range(DROPS_SHOWN):
        out[f"drop{j + 1}_t"] = cols["t"][:, j]
        out[f"drop{j + 1}_step"] = cols["t"][:, j] / lr  # NaN where no learning rate is given
        out[f"drop{j + 1}_excess_loss_before"] = cols["excess_loss_before"][:, j]
        out[f"drop{j + 1}_excess_loss_after"] = cols["excess_loss_after"][:, j]
        out[f"drop{j + 1}_complete"] = complete[:, j]
    return out


def _staircase_exponent(t: np.ndarray, plateau: np.ndarray | None) -> np.ndarray:
    B, K = t.shape
    if plateau is None or K < 4:
        return np.full(B, np.nan)
    hi = max(4, math.ceil(K / 10))
    order = np.argsort(t, axis=1, kind="stable")[:, 1:hi]
    x = np.take_along_axis(t, order, axis=1)
    y = np.take_along_axis(plateau, order, axis=1)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lx = np.where(ok, np.log(np.where(ok, x, 1.0)), 0.0)
        ly = np.where(ok, np.log(np.where(ok, y, 1.0)), 0.0)
        n = ok.sum(axis=1)
        mx = lx.sum(axis=1) / n
        my = ly.sum(axis=1) / n
        dx = np.where(ok, lx - mx[:, None], 0.0)
        slope = (dx * (ly - my[:, None])).sum(axis=1) / (dx * dx).sum(axis=1)
    return np.where(n >= 3, -slope, np.nan)
