"""Row 6: the physical limit — how far a solve is from the arithmetic it has to do.

Work of one solve = steps taken (accepted + rejected, solver statistics) × the arithmetic of one
RODAS5P step (`lvflow.Rodas5P`, solve_lv's integrator): 8 vector-field evaluations (one per
stage), 8 structured linear solves and the stages' linear combinations (28 `a_ij` and 28 `c_ij`
terms, 24 dense-output terms: 160 K flops).
`u̇ = r − C e^u` costs `2K² + 2K` flops with a dense `C` (a matrix–vector product), `(3 + 4R) K`
as `Diag(d) + UUᵀ` of rank `R`, `3K` with a diagonal one, counting `exp` as one flop (it is
~10–20: generous to the ideal); a solve costs `K` (diagonal) or `(2 + 4R) K` (Woodbury, its
per-step `O(K R²)` factorisation not counted). The ideal time is
that work at the float64 rate measured here, in-process: a `2000 × 2000` matmul (compute bound)
and, closer to what a matrix–vector product reaches, chained `1000 × 1000` matvecs.
`ratio = ideal / measured` is the fraction of the machine a solve uses; its inverse is the
overhead (step control, while-loop dispatch, the switch-on tracker and root finding). A diagonal
`C` is timed on solve_lv's ODE path (`solver=lvflow.Rodas5P()`; row 1 times its closed form). A bare diffrax
`Dopri5` `diffeqsolve` of the same flow, saving only the end state, is given for reference.
"""

from __future__ import annotations

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np

from . import problems
from ._harness import Row, best_of
from .config import Config
from .glv import measured_lvflow

NAME = "limit"


def matmul_gflops(n: int, repeats: int) -> float:
    """float64 GFLOP/s of an `n × n` matmul (`2n³` flops), best of `repeats`."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype=jnp.float64)
    f = jax.jit(lambda a: a @ a)
    f(a).block_until_ready()
    t, _, _ = best_of(lambda: f(a), repeats)
    return 2 * n**3 / t / 1e9


def matvec_gflops(n: int, repeats: int, *, inner: int = 100) -> float:
    """float64 GFLOP/s of `n × n` matrix–vector products (`2n²` flops each), `inner` chained in one
    compiled loop so dispatch is not measured."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype=jnp.float64) / n
    x = jnp.ones(n)
    f = jax.jit(lambda a, x: jax.lax.fori_loop(0, inner, lambda i, x: jnp.tanh(a @ x), x))
    f(a, x).block_until_ready()
    t, _, _ = best_of(lambda: f(a, x), repeats)
    return 2 * n**2 * inner / t / 1e9


def bare_diffrax(p: problems.Problem, cfg: Config) -> tuple[float, int]:
    """Best warm time and steps of a bare `diffrax.diffeqsolve` of `u̇ = r − C e^u` with solve_lv's
    pre-Rosenbrock solver and controller (Dopri5, PID on the max norm) saving only `u(t1)`: an
    explicit method's cost for reference, without the switch-on tracker and outputs."""
    import optimistix as optx

    r, d, U, u0 = (jnp.asarray(x) for x in (p.r, p.d, p.U, np.log(p.z0)))

    @jax.jit
    def solve(r, d, U, u0):
        def field(t, u, args):
            z = jnp.exp(u)
            return r - d * z - (U @ (U.T @ z) if U.shape[1] else 0.0)

        out = dfx.diffeqsolve(
            dfx.ODETerm(field),
            dfx.Dopri5(),
            0.0,
            p.t1,
            None,
            u0,
            saveat=dfx.SaveAt(t1=True),
            stepsize_controller=dfx.PIDController(rtol=cfg.rtol, atol=cfg.atol, norm=optx.max_norm),
            max_steps=1 << 16,
        )
        return out.ys, out.stats["num_steps"]

    solve(r, d, U, u0)
    t, _, (_, steps) = best_of(lambda: solve(r, d, U, u0), cfg.repeats)
    return t, int(steps)


# One RODAS5P step: 8 field evaluations and 8 stage solves, plus 2 flops per mode for each of the
# 80 stage-combination and dense-output terms.
EVALS_PER_STEP = 8
SOLVES_PER_STEP = 8
COMBINATION_FLOPS_PER_MODE = 160


def integrated(p: problems.Problem, cfg: Config):
    """`(best warm seconds, solution)` of `solve_lv` *integrating* `p`: a diagonal `C` is otherwise
    answered by the closed form (Thm 6, no steps), which row 1 already times."""
    import inspect

    import lvflow

    if not (p.diagonal and "solver" in inspect.signature(lvflow.solve_lv).parameters):
        return measured_lvflow(p, cfg)
    system, _ = p.solver_system()

    def call():
        return lvflow.solve_lv(
            system,
            p.z0,
            p.t1,
            ts=np.array([0.0, p.t1]),
            rho=p.rho,
            rtol=cfg.rtol,
            atol=cfg.atol,
            solver=lvflow.Rodas5P(),
        )

    call()
    t, _, sol = best_of(call, cfg.repeats)
    return t, sol


def run(cfg: Config) -> list[Row]:
    n_mm = cfg.size(2000, 200)
    mm = matmul_gflops(n_mm, cfg.repeats)
    mv = matvec_gflops(cfg.size(1000, 100), cfg.repeats)
    per_step = EVALS_PER_STEP
    rows = []
    for p in problems.row_problems(cfg.smoke):
        K = p.K
        t, sol = integrated(p, cfg)
        steps = max(int(sol.num_steps), 1)
        kind = p.solver_system()[1]
        R = p.U.shape[1]
        flops_eval = {"diagonal": 3 * K, "low-rank": (3 + 4 * R) * K, "dense": 2 * K * K + 2 * K}[kind]
        flops_solve = {"diagonal": K, "low-rank": (2 + 4 * R) * K, "dense": 2 * K * K}[kind]
        n_eval = int(sol.num_steps) * per_step
        flops_step = per_step * flops_eval + SOLVES_PER_STEP * flops_solve + COMBINATION_FLOPS_PER_MODE * K
        flops = flops_step * int(sol.num_steps)
        t_bare, steps_bare = bare_diffrax(p, cfg)
        ideal_mm = flops / (mm * 1e9)
        ideal_mv = flops / (mv * 1e9)
        data = {
            "K": K,
            "lvflow_C_as": kind,
            "flops_per_eval": flops_eval,
            "flops_per_solve": flops_solve,
            "flops_per_step": flops_step,
            "steps": int(sol.num_steps),
            "evals": n_eval,
            "flops": flops,
            "matmul_gflops": mm,
            "matmul_n": n_mm,
            "matvec_gflops": mv,
            "ideal_s_at_matmul_rate": ideal_mm,
            "ideal_s_at_matvec_rate": ideal_mv,
            "lvflow_s": t,
            "achieved_gflops": flops / t / 1e9,
            "bare_diffeqsolve_s": t_bare,
            "bare_diffeqsolve_steps": steps_bare,
            "us_per_step": t / steps * 1e6,
        }
        note = (
            f"{int(sol.num_steps)} steps × {flops_step:.3g} flop (8 evals, 8 solves, stage sums) = {flops:.3g} flop; "
            f"achieved {flops / t / 1e9:.3g} GFLOP/s of {mm:.3g} (matmul) / {mv:.3g} (matvec); "
            f"{t / steps * 1e6:.0f} µs/step; bare diffrax Dopri5 (end state only) "
            f"{t_bare:.3g} s, {steps_bare} steps"
        )
        rows.append(
            Row(
                NAME,
                f"{p.name} K={K}, ODE path, fraction of peak",
                t,
                "ideal at matmul rate",
                ideal_mm,
                ideal_mm / t,
                None,
                note,
                data,
            )
        )
    return rows
