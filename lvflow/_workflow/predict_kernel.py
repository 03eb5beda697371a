"""The predict kernel: one configuration of `predict` as a function of arrays (`configuration`),
the single implementation behind `lvflow.predict` (one call) and `lvflow.sweep` (vmapped over a
batch, compiled once per group, `_sweep/evaluate.py`), and the host-side facts about a system it
needs.

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

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._glv.equilibrium import saturated_equilibrium
from .._glv.lv import AbstractLotkaVolterra, LotkaVolterra, LowRankLotkaVolterra
from .._glv.solve import _closed_form_core, solve_lv

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
        sol = _closed_form_core(r, Ck * s, z0, t1, ts, zf, jnp.asarray(True), rho, 0.0, thm6_limit=True)
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
