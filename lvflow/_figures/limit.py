"""The ε → 0 limit (beyond the paper, THEORY §4): plateaus become a step function in
`τ = t / ln(1/ε)`, for a coupled `C` in which a mode switches off.

System: three features `g_1 = e_1`, `g_2 = e_2`, `g_3 = (e_1 + e_2 + 0.3 e_3)/|·|` and target
`ỹ = (1, 0.8, −0.2)`, so `C = G Gᵀ` (PSD, coupled) and `r = G ỹ` (Eq. 32 with
`λ_{μ,k} = √(m/8) G_{kμ}`). Mode 3, the best single feature, ignites first; modes 1 and 2 then
ignite and make it redundant, so it switches off when mode 2 ignites. The gLV is solved at
`ε = 10⁻², …, 10⁻³²` (down to `10⁻¹²⁸` in the full run; `z_k0 = ε`, `solve_lv`, in `ln z`) and
compared with the limit of `plateau_schedule`; the ignition times converge like `1/ln(1/ε)`.

The summary's `claims` are the figure's own (it has no counterpart in the paper): the ignition
times converge onto the limit like `1/ln(1/ε)`; mode 3 switches off when mode 2 ignites; and the
finite-ε corrected schedule (`plateau_schedule(corrected=True)`) against the plain limit, ignition
by ignition (docs/howto/figures.md gives the measured numbers).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.ticker
import numpy as np

from .._core.errors import LvflowError
from .._glv.lv import LotkaVolterra
from .._glv.solve import solve_lv
from .._schedule.schedule import PlateauSchedule, plateau_schedule
from . import _style

TITLE = "ε → 0: loss vs τ = t/ln(1/ε) converging to the saddle-to-saddle step function"

_G = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.3]])
_G[2] /= np.linalg.norm(_G[2])
_Y = np.array([1.0, 0.8, -0.2])
TAU_MAX = 7.0


def system() -> LotkaVolterra:
    """The coupled 3-mode gLV of this figure, with `y2` so that `L = |Gᵀz − ỹ|²/8 ≥ 0`."""
    return LotkaVolterra(_G @ _Y, _G @ _G.T, y2=float(_Y @ _Y) / 8)


def _equilibria(sched) -> np.ndarray:
    """`z*` on every plateau of the schedule: row 0 before the first event, row `i+1` after event
    `i` (what `PlateauSchedule.equilibria` returns; formed here through `z_at`)."""
    return np.stack([np.asarray(sched.z_at(t)) for t in [-1.0, *(float(t) for t in np.asarray(sched.tau))]])


def _s_limit(sched, tau):
    """The limit's `s_k(τ) = ln z_k / ln(1/ε)`: piecewise linear, `ds/dτ = r − C z*` with `z*`
    the plateau equilibrium between events (from `s_k(0) = −1`)."""
    lv = sched.system
    r, C = np.asarray(lv.r), np.asarray(lv.C)
    ev = np.asarray(sched.tau)
    Z = _equilibria(sched)  # row i: plateau after i events
    bounds = np.r_[0.0, np.unique(ev)]
    s = np.full(r.size, -1.0)
    out = np.empty((tau.size, r.size))
    for i, (a, b) in enumerate(zip(bounds, np.r_[bounds[1:], np.inf])):
        z = Z[np.searchsorted(ev, a, side="right")]
        slope = r - C @ z
        sel = (tau >= a) & (tau < b)
        out[sel] = np.minimum(s + slope * (tau[sel, None] - a), 0.0)
        if np.isfinite(b):
            s = np.minimum(s + slope * (b - a), 0.0)
    return out


def _schedule(lv: LotkaVolterra, eps: float, *, corrected: bool = False) -> PlateauSchedule:
    """`plateau_schedule` of the gLV `lv` (a `PlateauSchedule`: a gLV's, not an NQF's)."""
    sched = plateau_schedule(lv, eps, corrected=corrected)
    if not isinstance(sched, PlateauSchedule):
        raise LvflowError(f"lv: a {type(lv).__name__} has no gLV plateau schedule")
    return sched


def make(out: Path, *, quick: bool = False) -> dict:
    lv = system()
    lim = _schedule(lv, 1e-8)
    L_inf = float(np.asarray(lim.loss)[-1])
    ev_tau = np.asarray(lim.tau)
    ev_mode = np.asarray(lim.mode)
    ev_ign = np.asarray(lim.ignites)
    # ignitions: mode k reaches half of its value on the plateau it ignites into
    ign = np.flatnonzero(ev_ign)
    Z = _equilibria(lim)
    half = np.array([0.5 * Z[i + 1, ev_mode[i]] for i in ign])
    shown = [1e-2, 1e-4, 1e-8, 1e-16, 1e-32]
    conv = [1e-2, 1e-3, 1e-4, 1e-6, 1e-8, 1e-12, 1e-16, 1e-24, 1e-32] + ([] if quick else [1e-64, 1e-128])
    eps_all = sorted(set(shown) | set(conv), reverse=True)
    n_ts = 600 if quick else 2000
    tau_grid = np.linspace(0.0, TAU_MAX, n_ts)
    runs = {}
    for eps in eps_all:
        Lg = math.log(1 / eps)
        sol = solve_lv(lv, np.full(lv.K, eps), TAU_MAX * Lg, ts=tau_grid * Lg)
        loss = np.asarray(sol.loss) - L_inf
        z = np.asarray(sol.zs)
        meas = np.array([_style.crossing_time(tau_grid, z[:, ev_mode[i]], h) for i, h in zip(ign, half)])
        corr = _schedule(lv, eps, corrected=True)
        tau_corr = np.array([float(np.asarray(corr.tau_star)[ev_mode[i]]) for i in ign])
        runs[eps] = dict(loss=loss, z=z, tau_meas=meas, tau_corr=tau_corr)

    tau_lim = ev_tau[ign]
    cols = _style.mode_colors(len(shown))
    mcols = ["tab:blue", "tab:orange", "tab:green"]
    with _style.style():
        fig, axs = _style.subplots(3, width=3.5, height=2.9)
        ax = axs[0]
        for c, eps in zip(cols, shown):
            ax.semilogy(tau_grid, runs[eps]["loss"], color=c, label=f"ε = 1e{round(math.log10(eps))}")
        step = np.asarray(lim.loss_at(tau_grid)) - L_inf
        ax.semilogy(tau_grid, np.maximum(step, 1e-30), color="black", ls="--", lw=1.3, label="ε → 0 (plateau_schedule)")
        ax.set(
            xlabel=r"rescaled time $\tau = t/\ln(1/\varepsilon)$",
            ylabel=r"excess loss $L - L_\infty$",
            title="gLV at finite ε vs its ε → 0 limit",
        )
        ax.set_ylim(1e-4, 1.0)
        ax.legend(loc="lower left")
        _style.panel_label(ax, "a")

        ax = axs[1]
        eps = shown[-1]
        Lg = math.log(1 / eps)
        s_fin = np.log(runs[eps]["z"]) / Lg
        s_lim = _s_limit(lim, tau_grid)
        for k in range(lv.K):
            ax.plot(tau_grid, s_fin[:, k], color=mcols[k], label=f"mode {k + 1}")
            ax.plot(tau_grid, s_lim[:, k], color="black", ls="--", lw=1.0)
        ax.plot([], [], color="black", ls="--", lw=1.0, label="ε → 0 limit")
        for t_, m_, ig in zip(ev_tau, ev_mode, ev_ign):
            if not ig:
                ax.annotate(
                    f"mode {m_ + 1} switches off",
                    xy=(t_, 0.0),
                    xytext=(t_ - 2.6, -0.6),
                    arrowprops=dict(arrowstyle="->", lw=0.8),
                    fontsize=7.5,
                )
        ax.set(
            xlabel=r"rescaled time $\tau = t/\ln(1/\varepsilon)$",
            ylabel=r"$s_k = \ln z_k / \ln(1/\varepsilon)$",
            title=f"modes at ε = 1e{round(math.log10(eps))}",
        )
        ax.set_ylim(-1.1, 0.15)
        ax.legend(loc="lower right")
        _style.panel_label(ax, "b")

        ax = axs[2]
        x = np.array([math.log(1 / e) for e in conv])
        for j, i in enumerate(ign):
            err = np.array([abs(runs[e]["tau_meas"][j] - tau_lim[j]) for e in conv])
            errc = np.array([abs(runs[e]["tau_meas"][j] - runs[e]["tau_corr"][j]) for e in conv])
            c = mcols[ev_mode[i]]
            ax.loglog(x, err, "o-", color=c, ms=3.5, label=f"mode {ev_mode[i] + 1} ignites")
            ax.loglog(x, np.where(errc > 0, errc, np.nan), "s:", color=c, ms=3.0, mfc="none")
        ax.loglog(x, 3.0 / x, **_style.THEORY, label=r"$\propto 1/\ln(1/\varepsilon)$")
        ax.plot([], [], "o-", color="0.5", ms=3.5, label="vs the ε → 0 limit")
        ax.plot([], [], "s:", color="0.5", ms=3.0, mfc="none", label="vs the corrected schedule")
        ax.set(
            xlabel=r"$\ln(1/\varepsilon)$",
            ylabel=r"$|\tau^*_{\rm gLV} - \tau^*_{\rm predicted}|$",
            title="ignition times converge like 1/ln(1/ε)",
        )
        ax.set_xticks([5, 10, 20, 50] + ([] if quick else [100, 200]))
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.legend(loc="lower left", fontsize=6.5)
        _style.panel_label(ax, "c")
        _style.save(fig, out, "limit")

    summary = {
        "figure": "limit",
        "quick": quick,
        "r": np.asarray(lv.r),
        "C": np.asarray(lv.C),
        "limit_event_tau": ev_tau,
        "limit_event_mode": ev_mode,
        "limit_event_ignites": ev_ign,
        "limit_plateau_loss": np.asarray(lim.loss),
        "switch_offs": [int(m) for m, ig in zip(ev_mode, ev_ign) if not ig],
        "eps": conv,
        "ignition_modes": ev_mode[ign],
        "tau_predicted_limit": tau_lim,
        "tau_measured": {f"{e:g}": runs[e]["tau_meas"] for e in conv},
        "tau_predicted_corrected": {f"{e:g}": runs[e]["tau_corr"] for e in conv},
        "max_abs_err_limit": {f"{e:g}": float(np.max(np.abs(runs[e]["tau_meas"] - tau_lim))) for e in conv},
        "max_abs_err_corrected": {
            f"{e:g}": float(np.max(np.abs(runs[e]["tau_meas"] - runs[e]["tau_corr"]))) for e in conv
        },
    }
    summary["claims"] = _claims(summary, runs[shown[-1]]["z"], _s_limit(lim, tau_grid), tau_grid, shown[-1])
    _style.write_summary(out, "limit", summary)
    return summary


def _convergence_rate(eps, err) -> float:
    """The exponent `p` of `err ∝ ln(1/ε)^{−p}`, fitted over ε ≤ 1e-8 (log–log least squares)."""
    x = np.log([math.log(1 / e) for e in eps])
    y = np.log(np.asarray(err, float))
    sel = np.asarray(eps) <= 1e-8
    return float(-np.polyfit(x[sel], y[sel], 1)[0])


def _claims(summary: dict, z, s_limit, tau_grid, eps_shown: float) -> list[dict]:
    """This figure's own claims (it has no counterpart in the paper; docs/howto/figures.md): the
    convergence onto the limit, the switch-off, and the corrected schedule against the plain limit.

    Args:
        summary: the figure's summary so far (the measured and predicted ignition times).
        z: the gLV's `z(τ)` at `eps_shown`, shape `(len(tau_grid), 3)`.
        s_limit: the limit's `s_k(τ)` on `tau_grid`, the same shape.
        tau_grid: the rescaled times of `z`.
        eps_shown: the ε of `z`.

    Returns:
        The claims, as `_style.claim` builds them.
    """
    eps = summary["eps"]
    err = [summary["max_abs_err_limit"][f"{e:g}"] for e in eps]
    p = _convergence_rate(eps, err)
    conv = _style.claim(
        "the gLV's ignition times converge onto plateau_schedule's ε → 0 limit like 1/ln(1/ε)",
        abs(p - 1) <= 0.2,
        "the largest |τ*_gLV − τ*_limit| over the ignitions falls like ln(1/ε)^(−p) with p within 0.2 of 1 "
        "(fitted over ε ≤ 1e-8; the 0.2 is ours)",
        verdict=(
            f"{'holds' if abs(p - 1) <= 0.2 else 'fails'}: p = {p:.3f}; the largest error is {err[0]:.3g} "
            f"at ε = {eps[0]:g} "
            f"and {err[-1]:.3g} at ε = {eps[-1]:g}"
        ),
        convergence_exponent=p,
        max_abs_err_limit_first=err[0],
        max_abs_err_limit_last=err[-1],
    )
    # the switch-off: the limit removes mode 3 at mode 2's ignition; the gLV's mode 3 after it
    off = summary["switch_offs"]
    ev_tau, ev_mode, ev_ign = (
        np.asarray(summary[k]) for k in ("limit_event_tau", "limit_event_mode", "limit_event_ignites")
    )
    tau_off = float(ev_tau[~ev_ign][0]) if off else float("nan")
    tau_ign2 = float(ev_tau[ev_ign & (ev_mode == 1)][0])
    s_fin = float(np.log(z[-1, 2]) / math.log(1 / eps_shown))
    s_lim = float(s_limit[-1, 2])
    ok_off = bool(off == [2] and abs(tau_off - tau_ign2) < 1e-12 and s_lim < 0 and abs(s_fin - s_lim) <= 0.1)
    switch = _style.claim(
        "mode 3, the first to ignite, switches off when mode 2 ignites",
        ok_off,
        "the limit's switch-off event of mode 3 is at mode 2's ignition, and at the smallest ε shown the gLV's "
        f"s_3 = ln z_3/ln(1/ε) at τ = {tau_grid[-1]:g} is within 0.1 of the limit's (the 0.1 is ours)",
        verdict=(
            f"{'holds' if ok_off else 'fails'}: in the limit mode 3 switches off at τ = {tau_off:.4f}, where mode 2 "
            f"ignites (τ = {tau_ign2:.4f}); at ε = {eps_shown:g} and τ = {tau_grid[-1]:g} the gLV's s_3 is "
            f"{s_fin:.3f}, the "
            f"limit's {s_lim:.3f}"
        ),
        tau_switch_off=tau_off,
        tau_mode2_ignites=tau_ign2,
        s3_gLV_at_end=s_fin,
        s3_limit_at_end=s_lim,
        eps=eps_shown,
    )
    # the corrected schedule against the plain limit, ignition by ignition
    modes = [int(m) for m in summary["ignition_modes"]]
    lim = np.asarray(summary["tau_predicted_limit"])
    ratios = {}
    for j, m in enumerate(modes):
        r = []
        for e in eps:
            meas = summary["tau_measured"][f"{e:g}"][j]
            r.append(abs(meas - summary["tau_predicted_corrected"][f"{e:g}"][j]) / abs(meas - lim[j]))
        ratios[f"mode {m + 1}"] = r
    better = {k: [x < 1 for x in v] for k, v in ratios.items()}
    worse = [k for k, v in better.items() if not any(v)]
    ok_corr = all(all(v) for v in better.values())
    parts = [
        f"{k}: {min(v):.2g}–{max(v):.2g}× the plain limit's error ({sum(better[k])} of {len(eps)} ε better)"
        for k, v in ratios.items()
    ]
    corr = _style.claim(
        "the finite-ε corrected schedule (plateau_schedule(corrected=True)) is closer to the gLV than the ε → 0 limit",
        ok_corr,
        "|τ*_gLV − τ*_corrected| < |τ*_gLV − τ*_limit| for every ignition and every ε",
        verdict=(
            f"{'holds' if ok_corr else 'fails'}: corrected error / plain error, over ε = {eps[0]:g} … {eps[-1]:g}: "
            + "; ".join(parts)
            + (f"; worse at every ε for {', '.join(worse)}" if worse else "")
        ),
        error_ratio_corrected_to_limit=ratios,
    )
    return [conv, switch, corr]
