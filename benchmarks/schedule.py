"""Row 4: `plateau_schedule` (the ε → 0 saddle-to-saddle limit) — time against the number of modes.

Diagonal `C` (Fig 3 right) for K = 10 … 10⁵ and the rank-4 coupled family for K = 10 … 10⁴, both
as `LowRankLotkaVolterra` (`C = Diag(d) + UUᵀ`, never formed), `ε = 10⁻⁶` and the problems'
`z0`. The observed complexity is the slope of `log time` against `log K` fitted over K ≥ 10³
(below that fixed overheads dominate). The diagonal schedule is checked against its closed
form: mode `k` ignites at `τ*_k = −s_k(0)/r_k`, `s_k(0) = ln z_k0 / ln(1/ε)` (Thm 8, `a = 1`).
"""

from __future__ import annotations

import numpy as np

from . import problems
from ._harness import Row, best_of, max_rel_diff
from .config import Config

NAME = "schedule"
EPS = 1e-6
BUDGET_S = 1.0  # target: 10⁴ coupled modes in under a second


def _system(p: problems.Problem):
    import lvflow

    return lvflow.LowRankLotkaVolterra(p.r, p.d, p.U)


def _sweep(build, Ks, cfg: Config):
    import lvflow

    p = build(10)
    lvflow.plateau_schedule(_system(p), EPS, z0=p.z0)  # first-call dispatch warm-up, not timed
    times, scheds = [], []
    for K in Ks:
        p = build(K)
        system = _system(p)
        t, _, sched = best_of(
            lambda: lvflow.plateau_schedule(system, EPS, z0=p.z0), max(2, cfg.repeats) if K <= 10**4 else 2
        )
        times.append(t)
        scheds.append((p, sched))
    return np.asarray(times), scheds


def _slope(Ks, times, *, K_min: int = 1000) -> tuple[float, float]:
    """Least-squares slope of log time vs log K over K ≥ K_min (the last two sizes if fewer), and
    the smallest K used."""
    Ks = np.asarray(Ks, float)
    keep = Ks >= K_min
    if keep.sum() < 2:
        keep = Ks >= Ks[-2]
    return float(np.polyfit(np.log(Ks[keep]), np.log(times[keep]), 1)[0]), float(Ks[keep][0])


def run(cfg: Config) -> list[Row]:
    Kd = cfg.size([10, 100, 1000, 10**4, 10**5], [10, 100])
    Kc = cfg.size([10, 100, 1000, 10**4], [10, 100])
    td, sd = _sweep(problems.fig3_right, Kd, cfg)
    tc, sc = _sweep(problems.coupled, Kc, cfg)
    p, sched = sd[-1]
    exact = -(np.log(p.z0) / np.log(1 / EPS)) / p.r
    err = max_rel_diff(np.asarray(sched.tau_star), exact)
    (bd, kd), (bc, kc) = _slope(Kd, td), _slope(Kc, tc)
    per_k = lambda Ks, ts: ", ".join(f"{K:g}: {t * 1e3:.3g} ms" for K, t in zip(Ks, ts))  # noqa: E731
    rows = [
        Row(
            NAME,
            f"diagonal, K = {Kd[0]:g} … {Kd[-1]:g}",
            float(td[-1]),
            "—",
            float("nan"),
            float("nan"),
            None,
            f"time ∝ K^{bd:.2f} (fit K ≥ {kd:g}); τ* vs closed form max rel err {err:.1e}; {per_k(Kd, td)}",
            {
                "K": Kd,
                "seconds": td,
                "fitted_exponent": bd,
                "tau_star_err_vs_closed_form": err,
                "n_events_largest": int(sched.n_events),
            },
        ),
        Row(
            NAME,
            f"coupled rank 4, K = {Kc[0]:g} … {Kc[-1]:g}",
            float(tc[-1]),
            f"budget {BUDGET_S:g} s",
            BUDGET_S,
            BUDGET_S / float(tc[-1]),
            1.0 if not cfg.smoke else None,
            f"time ∝ K^{bc:.2f} (fit K ≥ {kc:g}); {per_k(Kc, tc)}",
            {"K": Kc, "seconds": tc, "fitted_exponent": bc, "n_events_largest": int(sc[-1][1].n_events)},
        ),
    ]
    return rows
