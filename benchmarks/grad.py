"""Row 7: the reverse-mode gradient of all switch-on times against the forward solve.

Problem: the coupled 1000-mode rank-4 gLV of row 1 (`problems.coupled`). Forward: `solve_lv`'s
switch-on times as a function of the system's arrays and `z0` (`jax.jit`, the system built inside,
so `z(∞)` and every step are traced as under differentiation). Gradient: `jax.grad` of
`Σ_k w_k t*_k` (one vector–Jacobian product of all K switch-on times, random weights `w`) with
respect to `r`, `d`, `U` and `z0`, through diffrax's `RecursiveCheckpointAdjoint` and the
implicit-function derivative of each crossing. Target: the gradient costs at most 5× the forward
solve (ratio `5 · forward / gradient ≥ 1`). The forward time of `solve_lv` on a concrete system
(as row 1 times it) is recorded beside it.
"""

from __future__ import annotations

import numpy as np

from . import problems
from ._harness import Row, best_of
from .config import Config

NAME = "grad"
MAX_COST = 5.0


def run(cfg: Config) -> list[Row]:
    import jax
    import jax.numpy as jnp

    import lvflow

    p = problems.coupled(cfg.size(1000, 30))
    ts = np.array([0.0, p.t1])
    w = jnp.asarray(np.random.default_rng(0).standard_normal(p.K))
    args = tuple(jnp.asarray(a) for a in (p.r, p.d, p.U, p.z0))

    def switch_on(r, d, U, z0):
        system = lvflow.LowRankLotkaVolterra(r, d, U)
        return lvflow.solve_lv(system, z0, p.t1, ts=ts, rho=p.rho, rtol=cfg.rtol, atol=cfg.atol).switch_on_times

    forward = jax.jit(switch_on)
    gradient = jax.jit(jax.grad(lambda *a: jnp.sum(w * switch_on(*a)), argnums=(0, 1, 2, 3)))
    forward(*args), gradient(*args)  # compile, untimed
    t_fwd, fwd_all, t_star = best_of(lambda: forward(*args), cfg.repeats)
    t_grad, grad_all, g = best_of(lambda: gradient(*args), cfg.repeats)
    system, _ = p.solver_system()
    concrete = lambda: lvflow.solve_lv(system, p.z0, p.t1, ts=ts, rho=p.rho, rtol=cfg.rtol, atol=cfg.atol)  # noqa: E731
    concrete()
    t_concrete = best_of(concrete, cfg.repeats)[0]
    finite = bool(all(np.all(np.isfinite(np.asarray(x))) for x in g))
    data = {
        "K": p.K,
        "rank": int(p.U.shape[1]),
        "forward_traced_s_all": fwd_all,
        "gradient_s_all": grad_all,
        "forward_concrete_s": t_concrete,
        "gradient_over_forward": t_grad / t_fwd,
        "gradient_over_concrete_forward": t_grad / t_concrete,
        "n_switch_on": int(np.isfinite(np.asarray(t_star)).sum()),
        "gradient_finite": finite,
    }
    note = (
        f"gradient = {t_grad / t_fwd:.2f}× the traced forward solve, {t_grad / t_concrete:.2f}× solve_lv on the "
        f"concrete system ({t_concrete * 1e3:.3g} ms); finite: {finite}"
    )
    return [
        Row(
            NAME,
            f"∇ of all {p.K} t* (rank {p.U.shape[1]}), reverse mode",
            t_grad,
            "forward solve × 5",
            MAX_COST * t_fwd,
            MAX_COST * t_fwd / t_grad,
            1.0,
            note,
            data,
        )
    ]
