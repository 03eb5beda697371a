"""`lvflow.predict` on real (non-commuting) data against the real network trained by gradient descent.

A reduced version of `benchmarks/realdata.py`: 300 standardised digits (odd/even), init
σ = 1e-3, learning rate 0.01. The prediction is the M-flow (Eq. 28) of the architecture's factored
NQF from `M0 = d σ² I`; the reference is the nonlinear network itself (tanh MLP, softmax attention)
trained here by full-batch GD on `(1/m) Σ_μ (f(x_μ) − y_μ)²` (Eq. 26) for the steps the prediction
covers. The first drop is the first step the loss is halfway between its value at step 0 and at
the horizon, read the same way off both curves.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lvflow
from lvflow import architectures

SIGMA, LR, M = 1e-3, 0.01, 300


def _halfway_step(loss: np.ndarray) -> float:
    """The first step the loss falls to the mean of its first and last values (linear interpolation)."""
    level = 0.5 * (loss[0] + loss[-1])
    j = int(np.flatnonzero(loss <= level)[0])
    return j - 1 + (loss[j - 1] - level) / (loss[j - 1] - loss[j])


def _gd_losses(model, X, y, steps: int) -> np.ndarray:
    """Full-batch GD on the network's `W`: the loss at steps 0..steps."""

    def loss(W):
        f = jax.vmap(eqx.tree_at(lambda mdl: mdl.W, model, W))(X)
        return jnp.sum((f - y) ** 2) / y.shape[0]

    def step(W, _):
        value, g = jax.value_and_grad(loss)(W)
        return W - LR * g, value

    W, losses = jax.jit(lambda W0: jax.lax.scan(step, W0, None, length=steps))(model.W)
    return np.append(np.asarray(losses), float(loss(W)))


@pytest.mark.parametrize(
    "layout, build, width, tol",
    [
        ("flat", lambda key: architectures.MLP(64, 16, key=key, init_scale=SIGMA), 16, 0.10),
        ("sequence", lambda key: architectures.MultiHeadAttention(8, 2, 2, 8, key=key, init_scale=SIGMA), 8, 0.05),
    ],
    ids=["mlp", "attention"],
)
def test_first_drop_matches_gd(layout, build, width, tol):
    data = lvflow.digits_parity(layout=layout, m=M)
    X, y = jnp.asarray(data.X), jnp.asarray(data.y)
    model = build(jax.random.PRNGKey(0))
    features, basis = model.factors(X)
    pred = lvflow.predict(
        lvflow.NQF(features=features, basis=basis, y=y), init_std=SIGMA, width=width, learning_rate=LR
    )
    drops = pred.matrix
    assert drops.converged
    horizon = int(math.ceil(drops.t_end / LR))
    steps = np.arange(horizon + 1)
    L_pred = np.interp(steps * LR, np.asarray(drops.ts), np.asarray(drops.loss))
    assert L_pred[-1] < 0.9 * L_pred[0]  # there is a drop to time
    step_pred = _halfway_step(L_pred)
    step_gd = np.mean([_halfway_step(_gd_losses(build(jax.random.PRNGKey(s)), X, y, horizon)) for s in (1, 2)])
    assert abs(step_pred / step_gd - 1) <= tol, (step_pred, step_gd)
