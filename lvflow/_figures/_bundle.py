"""Many models trained in one compiled run: the bundling shared by the training figures (Fig 2, 6, 7, 8).

Each training figure trains several models — a network, its NQF twin, copies from other inits
or under other optimisers — on the same data. Compiling one training loop per model would
dominate the figures' cost, so they are trained together:

- `Bundle` holds the models; `bundle_loss` sums their losses (Eq. 26). No parameter is shared,
  so each model gets exactly the gradient of its own loss; `bundle_losses` reads them apart.
- `Stacked` runs `n` copies of one model that differ only in their neuron array `W` under
  `jax.vmap`; `only_stacked_W` trains those arrays and not the template's own `W`.
- `sliced` applies a different optimiser to each block of stacked copies — exact because SGD,
  heavy-ball momentum and Adam act entrywise.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, ArrayLike, Float

from .._training.twin import AbstractTwin
from ..architectures import AbstractSumForm

_Model = TypeVar("_Model", bound=eqx.Module)


def with_W(model: _Model, W: Float[ArrayLike, "p d"]) -> _Model:
    """`model` with its neuron array replaced by `W`.

    A twin's `W` is its network's (`AbstractTwin`: `NQFModel`, `BilinearTwin`), so the network's
    is replaced; any other sum-form module holds `W` as a field.
    """
    if isinstance(model, AbstractTwin):
        return eqx.tree_at(lambda m: m.network, model, with_W(model.network, W))
    return eqx.tree_at(lambda m: m.W, model, W)


class Stacked(eqx.Module):
    """`n` copies of one model that differ only in their neuron array, run with `jax.vmap`.

    `W` has shape `(n, p, d)`; the output on one input is `(n, *k)`. The template's own `W` is
    never used (`trainable` below excludes it).
    """

    model: AbstractSumForm
    W: Float[Array, "n p d"]

    def __call__(self, x):
        return jax.vmap(lambda W: with_W(self.model, W)(x))(self.W)


class Bundle(eqx.Module):
    """Several models trained in ONE compiled run; output: the tuple of their outputs.

    With `bundle_loss` (the sum of the models' losses, Eq. 26, and no shared parameters) each
    model gets exactly the gradient of its own loss.
    """

    models: tuple

    def __call__(self, x):
        return tuple(m(x) for m in self.models)


def bundle_loss(bundle, X, y):
    """`Σ_models Σ_copies (1/m) Σ_μ |f(x_μ) − y_μ|²`: the paper's loss (Eq. 26) of every model."""
    preds = jax.vmap(bundle)(X)  # tuple of (m, [n,] *k)
    total = 0.0
    for pred in preds:
        yb = y.reshape(y.shape[:1] + (1,) * (pred.ndim - y.ndim) + y.shape[1:]) if pred.ndim > y.ndim else y
        total = total + jnp.sum((pred - yb) ** 2) / y.shape[0]
    return total


def bundle_losses(bundle, X, y):
    """Per model (and per stacked copy) losses (Eq. 26): a tuple of `()` or `(n,)` arrays."""
    preds = jax.vmap(bundle)(X)
    out = []
    for pred in preds:
        if pred.ndim > y.ndim:  # stacked copies on axis 1
            yb = y.reshape(y.shape[:1] + (1,) + y.shape[1:])
            out.append(jnp.sum((pred - yb) ** 2, axis=tuple(i for i in range(pred.ndim) if i != 1)) / y.shape[0])
        else:
            out.append(jnp.sum((pred - y) ** 2) / y.shape[0])
    return tuple(out)


def only_stacked_W(bundle):
    """Filter spec training exactly the `Stacked.W` arrays (not the templates' own `W`)."""
    spec = jax.tree_util.tree_map(lambda _: False, bundle)
    for i, m in enumerate(bundle.models):
        if isinstance(m, Stacked):
            spec = eqx.tree_at(lambda s, i=i: s.models[i].W, spec, True)
    return spec


def sliced(optimisers: Sequence[optax.GradientTransformation], reps: int) -> optax.GradientTransformation:
    """Optimiser `j` on slices `[j·reps, (j+1)·reps)` of the leading axis of every parameter.

    Exact for entrywise optimisers (SGD, heavy-ball momentum, Adam): each runs on the whole
    array, and its state on a slice depends only on that slice's gradients.
    """
    optimisers = tuple(optimisers)

    def init(params):
        return tuple(o.init(params) for o in optimisers)

    def update(updates, state, params=None):
        with jax.numpy_dtype_promotion("standard"):  # optax mixes its int32 count with floats
            outs = [o.update(updates, s, params) for o, s in zip(optimisers, state)]

        def pick(*ups):
            owner = jnp.repeat(jnp.arange(len(ups)), reps)  # which optimiser owns each slice
            owner = owner.reshape((-1,) + (1,) * (ups[0].ndim - 1))
            res = jnp.zeros_like(ups[0])
            for j, u in enumerate(ups):
                res = jnp.where(owner == j, u, res)
            return res

        return jax.tree_util.tree_map(pick, *[u for u, _ in outs]), tuple(s for _, s in outs)

    return optax.GradientTransformation(init, update)


@eqx.filter_jit
def outputs(model, X):
    """`model` on every input of `X` (`jax.vmap`), compiled once per model kind (an eager `vmap`
    compiles op by op).

    **Arguments:** `model`, a network or its twin (an equinox module); `X`, inputs stacked on the
    first axis.

    **Returns:** the outputs stacked on the first axis.
    """
    return jax.vmap(model)(X)
