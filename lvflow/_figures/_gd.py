"""Full-batch gradient descent on the weights `W` of an NQF, the "network" side of the figures.

The NQF output `Tr[W Wᵀ A_μ]` is the network itself at the order the paper keeps (Thm 1), so
GD on `W` is the training the figures compare the theory with; the gLV and closed forms never
see these trajectories.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


@eqx.filter_jit
def _run(nqf, W0, lr, n_records: int, every: int):
    loss = lambda W: nqf.loss(W @ W.T)
    grad = jax.grad(loss)

    def block(W, _):
        W = jax.lax.fori_loop(0, every, lambda _, W: W - lr * grad(W), W)
        return W, W @ W.T

    _, Ms = jax.lax.scan(block, W0, None, length=n_records)
    return Ms


def gd_trajectory(nqf, W0, *, lr: float, steps: int, every: int = 1):
    """Run `steps` steps of `W ← W − lr ∇L(W)` (Eq. 26) from `W0`, recording `M = W Wᵀ` every
    `every` steps. Returns `(t, M)` with `t = lr · step` the gradient-flow time of each record
    (the initial point included) and `M` of shape `(records, p, p)`."""
    n = steps // every
    W0 = jnp.asarray(W0)
    Ms = np.asarray(_run(nqf, W0, lr, n, every))
    M0 = np.asarray(W0 @ W0.T)[None]
    t = lr * every * np.arange(n + 1, dtype=float)
    return t, np.concatenate([M0, Ms])


@eqx.filter_jit
def _run_losses(losses, params, lr, n_records: int, every: int):
    # Independent runs share no parameters, so the sum's gradient is each run's own; for a scalar
    # loss the sum is the loss itself.
    grad = jax.grad(lambda p: jnp.sum(losses(p)))
    step = lambda _, p: jax.tree_util.tree_map(lambda a, g: a - lr * g, p, grad(p))

    def block(p, _):
        p = jax.lax.fori_loop(0, every, step, p)
        return p, losses(p)

    return jax.lax.scan(block, params, None, length=n_records)


def gd_losses(loss, params, *, lr: float, steps: int, every: int = 1):
    """Full-batch GD `p ← p − lr ∇loss(p)` on a pytree of arrays, recording the loss every
    `every` steps. Returns `(t, losses, final params)` with `t = lr · step` (initial point included)."""
    n = steps // every
    params = jax.tree_util.tree_map(jnp.asarray, params)
    final, Ls = _run_losses(loss, params, lr, n, every)
    t = lr * every * np.arange(n + 1, dtype=float)
    return t, np.concatenate([np.asarray(loss(params))[None], np.asarray(Ls)]), final


def gd_losses_vector(losses, params, *, lr: float, steps: int, every: int = 1):
    """`gd_losses` for a batch of independent runs: `losses(params)` returns one loss per run
    (the runs share no parameters), each descended with `lr`; records `(records, runs)`."""
    return gd_losses(losses, params, lr=lr, steps=steps, every=every)


@eqx.filter_jit
def _run_losses_at(loss, params, lr, increments):
    grad = jax.grad(loss)
    step = lambda _, p: jax.tree_util.tree_map(lambda a, g: a - lr * g, p, grad(p))

    def block(p, n):
        p = jax.lax.fori_loop(0, n, step, p)
        return p, loss(p)

    return jax.lax.scan(block, params, increments)


def gd_losses_at_steps(loss, params, *, lr: float, record_steps):
    """Full-batch GD `p ← p − lr ∇loss(p)` on a pytree of arrays, recording the scalar loss after
    each step count in `record_steps` (increasing, ≥ 0: a geometric grid of a long run).

    Args:
        loss: the scalar loss of the parameters.
        params: the initial parameters (a pytree of arrays).
        lr: the learning rate.
        record_steps: the step counts at which to record, increasing.

    Returns:
        `(t, losses, final params)` with `t = lr · record_steps`.
    """
    record_steps = np.asarray(record_steps, dtype=np.int64)
    increments = np.diff(record_steps, prepend=0)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    final, Ls = _run_losses_at(loss, params, lr, jnp.asarray(increments, dtype=jnp.int32))
    return lr * record_steps.astype(float), np.asarray(Ls), final
