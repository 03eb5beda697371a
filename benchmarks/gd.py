"""Row 2: the gLV prediction against running gradient descent on the NQF to the same final time.

The paper's way (Fig 3, App. C): full-batch GD on `W` with learning rate `η = 0.01` for
`t1/η` steps. The NQF of these problems has diagonal structure matrices `A_μ` (a shared
eigenbasis, Assumption 1), `M = WWᵀ`, and in that basis the loss (Eq. 26) depends on `W` only
through the row norms `q_k = ‖W_k‖² = M_kk`:

    L(W) = (q − z∞)ᵀ C (q − z∞) / 8   (+ const),

which is `(1/m) Σ_μ (Tr[WWᵀA_μ] − y_μ)²` for `A_μ = Diag(λ_μ)`, `C = (8/m) ΛᵀΛ` and the least-norm
targets `y = Λ z∞` (so `r = (8/m) Λᵀ y = C z∞`). Its gradient is `∇_W L = H W` with
`H = Diag(C(q − z∞)/2) = Diag((Cq − r)/2)`, Eq. 27 in the eigenbasis. Two GD baselines, both one
jit-compiled `lax.scan` with the gradient by `jax.grad` and `C` applied in `O(K R)`:

- **mode space** (the fair, fast one): `W` diagonal, stored as its `K` diagonal entries (GD keeps
  a diagonal `W` diagonal), run to `t1` in full;
- **dense W** (`K × K`, `W(0) = Diag(√z0)`, as the paper trains it): timed over a few hundred
  steps and extrapolated linearly to `t1/η` steps.

GD's switch-on times (first step with `q_k ≥ ρ z_k(∞)`, interpolated within the step) are compared with
lvflow's: they differ at `O(η r_k)` (GD is the Euler map of the flow).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import problems
from ._harness import Row, best_of, max_rel_diff
from .config import Config
from .glv import measured_lvflow

NAME = "gd"
TARGET_SPEEDUP = 1000.0
LR = 0.01


def nqf_loss(W, d, U, z_inf):
    """`L(W) = (q − z∞)ᵀ(Diag(d) + UUᵀ)(q − z∞)/8`, `q_k = ‖W_k‖²` (Eq. 26 in the shared eigenbasis)."""
    e = jnp.sum(W**2, axis=-1) - z_inf
    return (jnp.sum(d * e**2) + jnp.sum((U.T @ e) ** 2)) / 8


@functools.partial(jax.jit, static_argnames=("steps",))
def gd(W0, d, U, z_inf, thr, *, steps: int, lr: float = LR):
    """`steps` GD steps `W ← W − η ∇L(W)` in one `lax.scan`; returns the final `W` and each mode's
    switch-on time: the first step with `q_k ≥ thr_k = ρ z_k(∞)`, placed within the step by linear
    interpolation in `q` (no logarithms in the loop: the baseline stays as cheap as plain GD)."""
    grad = jax.grad(nqf_loss)

    def step(carry, i):
        W, q0, t_on = carry
        W = W - lr * grad(W, d, U, z_inf)
        q1 = jnp.sum(W**2, axis=-1)
        new = jnp.isinf(t_on) & (q1 >= thr)
        t_on = jnp.where(new, (i + (thr - q0) / (q1 - q0)) * lr, t_on)
        return (W, q1, t_on), None

    q0 = jnp.sum(W0**2, axis=-1)
    t_on0 = jnp.where(q0 >= thr, 0.0, jnp.inf)
    (W, _, t_on), _ = jax.lax.scan(step, (W0, q0, t_on0), jnp.arange(steps, dtype=W0.dtype))
    return W, t_on


def _args(p: problems.Problem):
    z_inf = p.z_inf
    thr = np.where(z_inf > 0, p.rho * z_inf, np.inf)  # a mode driven extinct never switches on
    return jnp.asarray(p.d), jnp.asarray(p.U), jnp.asarray(z_inf), jnp.asarray(thr)


def compare(p: problems.Problem, cfg: Config, *, dense_steps: int) -> list[Row]:
    t_lv, sol = measured_lvflow(p, cfg)
    t_lv_on = np.asarray(sol.switch_on_times)

    args = _args(p)
    steps = int(round(p.t1 / LR))
    W_modes = jnp.sqrt(jnp.asarray(p.z0))[:, None]
    gd(W_modes, *args, steps=steps)  # compile
    t_gd, _, (W, t_gd_on) = best_of(lambda: gd(W_modes, *args, steps=steps), 1)
    gd_diff = max_rel_diff(np.asarray(t_gd_on), t_lv_on)
    q_end = np.asarray(jnp.sum(W**2, axis=-1))

    W_dense = jnp.diag(jnp.sqrt(jnp.asarray(p.z0)))
    gd(W_dense, *args, steps=dense_steps)  # compile
    t_dense, _, _ = best_of(lambda: gd(W_dense, *args, steps=dense_steps), 1)
    t_dense_full = t_dense * steps / dense_steps

    data = {
        "K": p.K,
        "t1": p.t1,
        "lr": LR,
        "gd_steps": steps,
        "gd_mode_space_s": t_gd,
        "gd_dense_measured_steps": dense_steps,
        "gd_dense_measured_s": t_dense,
        "gd_dense_extrapolated_s": t_dense_full,
        "switch_on_max_rel_diff_gd_vs_lvflow": gd_diff,
        "gd_final_q_max_rel_diff_vs_z_inf": max_rel_diff(q_end, p.z_inf),
    }
    note = f"{steps} GD steps (η = {LR}); GD t* vs lvflow max rel diff {gd_diff:.1e} (O(η r))"
    return [
        Row(
            NAME,
            f"{p.name} K={p.K}, GD in mode space (diagonal W)",
            t_lv,
            "GD lax.scan, K params",
            t_gd,
            t_gd / t_lv,
            TARGET_SPEEDUP,
            note,
            data,
        ),
        Row(
            NAME,
            f"{p.name} K={p.K}, GD on dense W (K×K)",
            t_lv,
            f"GD lax.scan, K² params (×{steps // dense_steps} extrap.)",
            t_dense_full,
            t_dense_full / t_lv,
            TARGET_SPEEDUP,
            f"measured {dense_steps} steps: {t_dense:.3g} s",
            {},
        ),
    ]


def run(cfg: Config) -> list[Row]:
    dense_steps = cfg.size(500, 20)
    return [row for p in problems.row_problems(cfg.smoke) for row in compare(p, cfg, dense_steps=dense_steps)]
