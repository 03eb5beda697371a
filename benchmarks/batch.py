"""Row 3: throughput — many small gLVs in one vmapped `solve_lv` call vs a Python loop over scipy.

Two families of 1024 systems × 100 modes, each on one common horizon:

- *diagonal* (`problems.batch_diagonal`): a sweep over the rate exponent and the initial scale ε
  of Fig 3-type systems, the sweep a researcher runs to map plateau lengths against ε. lvflow:
  the closed form (`lvflow.ClosedForm()`, Thm 6: `LowRankLotkaVolterra` systems without columns) under `jax.vmap`.
- *coupled* (`problems.batch`): the Fig 3-right rates with an independent random rank-4 PSD
  coupling each. lvflow integrates (RODAS5P) under `jax.vmap`, in lock-step; besides one vmap over
  all 1024 we time `jax.lax.map(..., batch_size=chunk)` (vmapped chunks run one after another),
  which keeps the per-step arrays of a chunk in cache.

Switch-on times and `z(∞)` are computed inside (traced systems use lvflow's JAX equilibrium
solver). scipy: LSODA per system (the faster method of row 1 at this size), the same tolerances,
switch-on times by the same dense-output root finding; its cost is linear in the number of
systems, so it is timed on `n_loop` of them and scaled.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import problems
from ._harness import Row, best_of, cold, max_rel_diff
from .config import Config
from .scipy_glv import solve_scipy

NAME = "batch"
TARGET_SPEEDUP = 50.0
CHUNK = 128


def batched_solver(
    probs: list[problems.Problem], cfg: Config, *, max_steps: int, method: str = "auto", chunk: int | None = None
):
    """A zero-argument call solving every problem in one jitted, vmapped `solve_lv`; returns
    `(t*, steps)`. `chunk`: vmap over chunks of this many systems inside `jax.lax.map`."""
    import lvflow

    systems = jax.tree.map(lambda *xs: jnp.stack(xs), *[_system(p, method) for p in probs])
    z0s = jnp.stack([jnp.asarray(p.z0) for p in probs])
    t1 = probs[0].t1
    ts = jnp.array([0.0, t1])  # the benchmark wants switch-on times, not trajectories

    def one(args):
        system, z0 = args
        sol = lvflow.solve_lv(
            system, z0, t1, ts=ts, rho=probs[0].rho, rtol=cfg.rtol, atol=cfg.atol, max_steps=max_steps
        )
        return sol.switch_on_times, sol.num_steps

    @jax.jit
    def solve_all(systems, z0s):
        if chunk is None:
            return jax.vmap(one)((systems, z0s))
        return jax.lax.map(one, (systems, z0s), batch_size=chunk)

    return lambda: solve_all(systems, z0s)


def _system(p: problems.Problem, method: str):
    # `Diag(d) + UUᵀ`: a diagonal problem's U has no columns, so its systems declare a diagonal C and
    # solve_lv takes the closed form (Thm 6) also when they are stacked and vmapped
    import lvflow

    return lvflow.LowRankLotkaVolterra(p.r, p.d, p.U)


def _family(name, probs, cfg: Config, *, method: str, n_loop: int, chunk: int | None) -> list[Row]:
    n, K = len(probs), probs[0].K
    calls = {"vmap": batched_solver(probs, cfg, max_steps=cfg.size(2048, 1024), method=method)}
    if chunk is not None and chunk < n:
        calls[f"lax.map, vmapped chunks of {chunk}"] = batched_solver(
            probs, cfg, max_steps=cfg.size(2048, 1024), method=method, chunk=chunk
        )
    times, t_cold = {}, float("nan")
    for label, call in calls.items():
        if cfg.cold and label == "vmap":
            t_cold = cold(call)[0]
        else:
            call()  # compile, untimed
        # a coupled batch takes 10 s or more per call: fewer repeats there
        reps = cfg.repeats if method == "closed_form" else (1 if cfg.cold else min(cfg.repeats, 2))
        t, all_t, (t_on, steps) = best_of(call, reps)
        times[label] = (t, all_t, np.asarray(t_on), np.asarray(steps))
    best_label = min(times, key=lambda k: times[k][0])
    t_lv, _, t_on, steps = times[best_label]

    loop = [solve_scipy(p, method="LSODA", rtol=cfg.rtol, atol=cfg.atol) for p in probs[:n_loop]]
    t_loop_measured = sum(res.seconds for res in loop)
    t_loop = t_loop_measured * n / n_loop
    diff = max(max_rel_diff(t_on[i], res.switch_on_times) for i, res in enumerate(loop))
    data = {
        "family": name,
        "lvflow_method": method,
        "n_systems": n,
        "K": K,
        "t1": probs[0].t1,
        "lvflow_s": {k: v[0] for k, v in times.items()},
        "lvflow_s_all": {k: v[1] for k, v in times.items()},
        "lvflow_best": best_label,
        "lvflow_cold_s": t_cold,
        "lvflow_steps_min_max": [int(np.min(steps)), int(np.max(steps))],
        "scipy_loop_measured_systems": n_loop,
        "scipy_loop_measured_s": t_loop_measured,
        "scipy_steps_mean": float(np.mean([res.n_steps for res in loop])),
        "switch_on_max_rel_diff_vs_scipy": diff,
    }
    others = "; ".join(f"{k}: {v[0]:.3g} s" for k, v in times.items() if k != best_label)
    note = f"scipy timed on {n_loop} systems, ×{n / n_loop:g}; t* max rel diff {diff:.1e}"
    if method == "closed_form":
        note += "; Thm 6 closed form under vmap (no steps)"
    else:
        note += (
            f"; {best_label}; {others}; steps {int(np.min(steps))}–{int(np.max(steps))} "
            "(lock-step: a vmapped group runs to its slowest member)"
        )
    rows = [
        Row(
            NAME,
            f"{n} {name} systems × {K} modes, warm",
            t_lv,
            "Python loop, scipy LSODA",
            t_loop,
            t_loop / t_lv,
            TARGET_SPEEDUP,
            note,
            data,
        )
    ]
    if cfg.cold:
        rows.append(
            Row(
                NAME,
                f"{n} {name} systems × {K} modes, cold (compile incl., one vmap)",
                t_cold,
                "Python loop, scipy LSODA",
                t_loop,
                t_loop / t_cold,
                None,
                "",
                {},
            )
        )
    return rows


def run(cfg: Config) -> list[Row]:
    n = cfg.size(1024, 8)
    K = cfg.size(100, 10)
    n_loop = cfg.size(256, 4)
    return _family(
        "diagonal", problems.batch_diagonal(n, K), cfg, method="closed_form", n_loop=n_loop, chunk=None
    ) + _family("coupled", problems.batch(n, K), cfg, method="auto", n_loop=n_loop, chunk=cfg.size(CHUNK, 4))
