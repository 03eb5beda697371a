"""Row 5: training throughput — `lvflow.train`'s compiled loop vs a plain per-step Python loop.

The Fig 2 setting: `lvflow.architectures.MLP(20, 64, 8)` (tanh, no bias, init scale 0.01), full
batch of 600 Gaussian inputs, labels from a random tanh teacher of the same shape, full-batch GD
`optax.sgd(0.05)` on the paper's loss (Eq. 26). The baseline is the usual equinox/optax loop:
one `eqx.filter_jit`-compiled step called from Python per update, no host sync inside the loop
(its strongest form). Both start from the same model, so their final weights must agree to
rounding — checked, so the two loops are known to do the same work.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._harness import Row, best_of
from .config import Config

NAME = "train"
LR = 0.05


def _setup(m: int):
    import lvflow

    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.standard_normal((m, 20)))
    teacher = lvflow.architectures.MLP(20, 64, 8, key=jax.random.PRNGKey(1), init_scale=0.3)
    y = jax.vmap(teacher)(X)
    model = lvflow.architectures.MLP(20, 64, 8, key=jax.random.PRNGKey(0), init_scale=0.01)
    return model, X, y


def run(cfg: Config) -> list[Row]:
    import lvflow

    steps = cfg.size(2000, 20)
    every = cfg.size(100, 10)
    model, X, y = _setup(600)
    opt = optax.sgd(LR)

    def lv():
        return lvflow.train(model, (X, y), opt, steps, record_every=every).model.W

    lv()  # compile
    t_lv, all_lv, W_lv = best_of(lv, cfg.repeats)

    def loss(model, X, y):  # Eq. 26, as train's default
        return jnp.sum((jax.vmap(model)(X) - y) ** 2) / y.shape[0]

    @eqx.filter_jit
    def step(model, state):
        value, grads = eqx.filter_value_and_grad(loss)(model, X, y)
        updates, state = opt.update(grads, state, model)
        return eqx.apply_updates(model, updates), state, value

    def plain():
        mdl, state = model, opt.init(eqx.filter(model, eqx.is_inexact_array))
        for _ in range(steps):
            mdl, state, _ = step(mdl, state)
        return mdl.W

    plain()  # compile
    t_py, all_py, W_py = best_of(plain, cfg.repeats)
    diff = float(jnp.max(jnp.abs(W_lv - W_py)) / jnp.max(jnp.abs(W_py)))
    data = {
        "steps": steps,
        "record_every": every,
        "m": 600,
        "lvflow_s_all": all_lv,
        "python_loop_s_all": all_py,
        "lvflow_steps_per_s": steps / t_lv,
        "python_loop_steps_per_s": steps / t_py,
        "final_W_max_rel_diff": diff,
    }
    note = (
        f"{steps / t_lv:.0f} vs {steps / t_py:.0f} steps/s; {steps} steps, recording loss and M every {every}; "
        f"final W agree to {diff:.1e}"
    )
    return [
        Row(
            NAME,
            "Fig 2 MLP 20→64→8, full batch 600, GD",
            t_lv,
            "Python loop of jitted steps",
            t_py,
            t_py / t_lv,
            None,
            note,
            data,
        )
    ]
