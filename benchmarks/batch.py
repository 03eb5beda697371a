"""Row 3: throughput — many small gLVs in one vmapped `solve_lv` call vs a Python loop over scipy.

1024 coupled systems of 100 modes (`problems.batch`: the Fig 3-right rates with an independent
random rank-4 PSD coupling each), one common horizon. lvflow: `jax.jit(jax.vmap(solve_lv))`
over the systems and initial states, switch-on times and `z(∞)` computed inside (traced systems
use lvflow's JAX equilibrium solver). scipy: LSODA per system (the faster method of row 1 at
this size), the same tolerances, switch-on times by the same dense-output root finding; its cost
is linear in the number of systems, so it is timed on `n_loop` of them and scaled.
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


def batched_solver(probs: list[problems.Problem], cfg: Config, *, max_steps: int):
    """A zero-argument call solving every problem in one vmapped `solve_lv`; returns `(t*, steps)`."""
    import lvflow

    systems = jax.tree.map(lambda *xs: jnp.stack(xs), *[p.solver_system()[0] for p in probs])
    z0s = jnp.stack([jnp.asarray(p.z0) for p in probs])
    t1 = probs[0].t1
    ts = jnp.array([0.0, t1])  # the benchmark wants switch-on times, not trajectories

    @jax.jit
    def solve_all(systems, z0s):
        def one(system, z0):
            sol = lvflow.solve_lv(system, z0, t1, ts=ts, rho=probs[0].rho, rtol=cfg.rtol, atol=cfg.atol,
                                  max_steps=max_steps)
            return sol.switch_on_times, sol.num_steps

        return jax.vmap(one)(systems, z0s)

    return lambda: solve_all(systems, z0s)


def run(cfg: Config) -> list[Row]:
    n = cfg.size(1024, 8)
    K = cfg.size(100, 10)
    n_loop = cfg.size(256, 4)
    probs = problems.batch(n, K)
    call = batched_solver(probs, cfg, max_steps=cfg.size(2048, 1024))
    t_cold = float("nan")
    if cfg.cold:
        t_cold = cold(call)[0]
    else:
        call()  # compile, untimed
    # each call of the full batch takes a minute or more: one warm run after the cold one
    t_lv, all_lv, (t_on, steps) = best_of(call, 1 if cfg.cold else min(cfg.repeats, 2))
    t_on = np.asarray(t_on)

    loop = [solve_scipy(p, method="LSODA", rtol=cfg.rtol, atol=cfg.atol) for p in probs[:n_loop]]
    t_loop_measured = sum(res.seconds for res in loop)
    t_loop = t_loop_measured * n / n_loop
    diff = max(max_rel_diff(t_on[i], res.switch_on_times) for i, res in enumerate(loop))
    data = {"lvflow_C_as": probs[0].solver_system()[1], "n_systems": n, "K": K, "t1": probs[0].t1, "lvflow_s_all": all_lv, "lvflow_cold_s": t_cold,
            "lvflow_steps_min_max": [int(np.min(steps)), int(np.max(steps))],
            "scipy_loop_measured_systems": n_loop, "scipy_loop_measured_s": t_loop_measured,
            "scipy_steps_mean": float(np.mean([res.n_steps for res in loop])),
            "switch_on_max_rel_diff_vs_scipy": diff}
    note = (f"scipy timed on {n_loop} systems, ×{n / n_loop:g}; t* max rel diff {diff:.1e}; "
            f"vmapped steps {int(np.min(steps))}–{int(np.max(steps))} (lock-step: the batch runs to the max)")
    rows = [Row(NAME, f"{n} systems × {K} modes, warm", t_lv, "Python loop, scipy LSODA", t_loop, t_loop / t_lv,
                TARGET_SPEEDUP, note, data)]
    if cfg.cold:
        rows.append(Row(NAME, f"{n} systems × {K} modes, cold (compile incl.)", t_cold, "Python loop, scipy LSODA",
                        t_loop, t_loop / t_cold, None, "", {}))
    return rows
