"""Training an equinox model (a real network or its NQF twin) with an optax optimiser.

The loop is one `jax.lax.scan` over chunks of `record_every` steps, each chunk itself a
`lax.scan` over steps: no Python loop per step. Between *groups* of chunks control returns
to Python only to advance a tqdm progress bar (long runs); without a bar the whole run is
one compiled call.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._core.errors import LvflowError, SolverError
from .._core.validate import as_array
from .data import AbstractDataset

_MAX_GROUPS = 25  # progress-bar updates per run
_AUTO_PROGRESS_STEPS = 20_000


class TrainHistory(eqx.Module):
    """What `train` records, at the steps `steps` (0 = before the first update).

    - `steps`: recorded step numbers, shape `(n,)`.
    - `loss`: the paper's loss `L = (1/m) Σ_μ |f(x_μ) − y_μ|²` (Eq. 26) on the evaluation set
      (the whole dataset unless `eval_data` is given), shape `(n,)`.
    - `M`: the order parameter `M = W Wᵀ`, shape `(n, p, p)`; a tuple of those for a model with
      several neuron arrays `W` (deep models); `None` when not recorded or the model has no `W`.
    - `mu`: `μ = W 1`, shape `(n, p)` (or a tuple; or `None`), the extra order parameter of
      non-ZGZ modules (Thm 12).
    - `extras`: whatever `record=` asked for, each leaf stacked over the `n` records.
    - `model`: the trained model at the last step.
    """

    steps: Int[Array, " n"]
    loss: Float[Array, " n"]
    M: Any
    mu: Any
    extras: Any
    model: Any


def mse_loss(model: Callable, X, y) -> Float[Array, ""]:
    """The paper's loss `L = (1/m) Σ_μ |f(x_μ) − y_μ|²` (Eq. 26), summed over output components."""
    pred = jax.vmap(model)(X)
    return jnp.sum((pred - y) ** 2) / y.shape[0]


def _batch_indices(key, t, m: int, b: int):
    return jax.random.choice(jax.random.fold_in(key, t), m, (b,), replace=False)


def minibatch_indices(key: PRNGKeyArray, *, steps: int, m: int, batch_size: int) -> Int[Array, "steps b"]:
    """The sample indices `train` uses at each step for minibatch SGD on an `m`-sample dataset.

    Step `t` draws `batch_size` distinct samples with `jax.random.fold_in(key, t)`; pass the
    result as `batches=` to `lvflow.gd_recursion` to run the exact (M, μ) recursion (Thm 2) on
    the same minibatches.
    """
    _check_int("steps", steps)
    _check_int("m", m)
    _check_int("batch_size", batch_size)
    if batch_size > m:
        raise LvflowError(f"batch_size: {batch_size} exceeds the number of samples m = {m}")
    return jax.vmap(lambda t: _batch_indices(key, t, m, batch_size))(jnp.arange(steps))


def eval_key(key: PRNGKeyArray) -> PRNGKeyArray:
    """The key of the evaluation set `train` draws once from a stream: `jax.random.split(key)[1]`
    (step `t` uses `fold_in(key, t)`)."""
    return jax.random.split(key)[1]


def _check_int(name, v, *, allow_zero=False):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0 or (v == 0 and not allow_zero):
        raise LvflowError(f"{name}: must be a {'non-negative' if allow_zero else 'positive'} integer, got {v!r}")
    return int(v)


def neuron_arrays(model) -> list[Array]:
    """Every array field named `W` in `model` (the neuron arrays, columns are neurons)."""
    leaves = jax.tree_util.tree_flatten_with_path(model)[0]
    return [leaf for path, leaf in leaves if _is_W(path) and eqx.is_inexact_array(leaf)]


def _is_W(path) -> bool:
    return bool(path) and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "W"


def default_trainable(model):
    """Filter spec: the neuron arrays `W` when the model has any (fixed readouts and other
    buffers stay frozen), otherwise every floating-point array."""
    if not neuron_arrays(model):
        return jax.tree_util.tree_map(eqx.is_inexact_array, model)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(model)
    return jax.tree_util.tree_unflatten(treedef, [_is_W(path) and eqx.is_inexact_array(leaf) for path, leaf in leaves])


def order_parameters(model):
    """`(M, μ) = (W Wᵀ, W 1)` of the model's neuron array (tuples when it has several)."""
    Ws = neuron_arrays(model)
    if not Ws:
        return None, None
    Ms = tuple(W @ W.T for W in Ws)
    mus = tuple(jnp.sum(W, axis=1) for W in Ws)
    return (Ms[0], mus[0]) if len(Ws) == 1 else (Ms, mus)


def _as_data(name, data):
    if isinstance(data, tuple) and len(data) == 2:
        X, y = data
    elif isinstance(data, AbstractDataset):
        X, y = data.X, data.y
    else:
        raise LvflowError(
            f"{name}: expected an (X, y) pair, a Dataset (lvflow.AbstractDataset), or a stream callable "
            f"(key, n) -> (X, y); got a {type(data).__name__}"
        )
    X = jnp.asarray(as_array(f"{name}.X", X))
    y = jnp.asarray(as_array(f"{name}.y", y, ndim=(1, 2)))
    if X.shape[0] != y.shape[0]:
        raise LvflowError(f"{name}: X has {X.shape[0]} samples but y has {y.shape[0]}")
    if X.shape[0] == 0:
        raise LvflowError(f"{name}: has no samples")
    return X, y


@eqx.filter_jit
def _run_group(params, opt_state, static, data, eval_data, key, t0, cfg):
    optimizer, loss_fn, record_fn, record_M, every, n_chunks, batch_size, stream = cfg

    def batch(t):
        if stream is not None:
            return stream(jax.random.fold_in(key, t), batch_size)
        X, y = data
        if batch_size is None:
            return X, y
        idx = _batch_indices(key, t, X.shape[0], batch_size)
        return X[idx], y[idx]

    def objective(p, X, y):
        return loss_fn(eqx.combine(p, static), X, y)

    def one_step(carry, t):
        p, s = carry
        X, y = batch(t)
        grads = jax.grad(objective)(p, X, y)
        # optax's own arithmetic mixes its int32 step count with floats (Adam's bias correction):
        # standard promotion for it even where a caller (lvflow's tests) asks JAX for strict promotion
        with jax.numpy_dtype_promotion("standard"):
            updates, s = optimizer.update(grads, s, p)
        return (eqx.apply_updates(p, updates), s), None

    def record(p):
        return _record(eqx.combine(p, static), eval_data, loss_fn, record_fn, record_M)

    def chunk(carry, c):
        ts = t0 + c * every + jnp.arange(every)
        carry, _ = jax.lax.scan(one_step, carry, ts)
        return carry, record(carry[0])

    (params, opt_state), recs = jax.lax.scan(chunk, (params, opt_state), jnp.arange(n_chunks))
    return params, opt_state, recs


def _record_fn(record):
    if record is None or callable(record):
        return record
    if isinstance(record, dict) and all(callable(v) for v in record.values()):
        items = tuple(record.items())
        return _DictRecord(items)
    raise LvflowError("record: expected a callable model -> pytree, or a dict of such callables")


class _DictRecord:
    """Hashable by its items, so repeated `train` calls with the same dict reuse compiled code."""

    def __init__(self, items):
        self.items = items

    def __call__(self, model):
        return {k: f(model) for k, f in self.items}

    def __hash__(self):
        return hash(self.items)

    def __eq__(self, other):
        return isinstance(other, _DictRecord) and self.items == other.items


def train(
    model,
    data,
    optimizer: optax.GradientTransformation,
    steps: int,
    *,
    record_every: int = 1,
    batch_size: int | None = None,
    key: PRNGKeyArray | None = None,
    loss: Callable | None = None,
    record: Callable | dict | None = None,
    record_M: bool = True,
    eval_data=None,
    eval_size: int = 1024,
    trainable=None,
    progress: bool | None = None,
    throw: bool = True,
) -> TrainHistory:
    """Train `model` for `steps` optimiser updates and record the loss and `(M, μ)`.

    Full-batch gradient descent is `optax.sgd(lr)`; Polyak (heavy-ball) momentum
    `W_{t+1} = W_t − η∇L_t + β(W_t − W_{t−1})` is `optax.sgd(lr, momentum=β)`; Adam is
    `optax.adam(lr)`. The loss is the paper's `L = (1/m) Σ_μ |f(x_μ) − y_μ|²` (Eq. 26), summed
    over output components, averaged over the batch.

    **Arguments:**

    - `model`: an equinox model mapping ONE input to a scalar or `(k,)` output (an
      `lvflow.architectures` network, its `lvflow.nqf_twin`, or any module).
    - `data`: an `(X, y)` pair or a dataset (`lvflow.AbstractDataset`: a `Dataset`, a
      `LowRankTeacher`; full batch, or minibatches with `batch_size`),
      or a stream `data(key, n) -> (X, y)` drawing `n` fresh samples (online SGD; needs
      `batch_size` and `key`).
    - `optimizer`: an optax transformation. Compiled code is cached per optimiser object:
      reuse the same object across calls to avoid recompiling.
    - `steps`: number of updates.
    - `record_every`: record after every this many steps (and at step 0 and at `steps`).
    - `batch_size`: minibatch size (samples drawn without replacement each step, see
      `minibatch_indices`); `None` for full batch.
    - `key`: PRNG key for minibatches or the stream.
    - `loss`: `loss(model, X, y) -> scalar`; default `mse_loss` (Eq. 26).
    - `record`: `record(model) -> pytree`, or a dict of such, evaluated at each record.
    - `record_M`: record `M = W Wᵀ` and `μ = W 1` of the model's neuron arrays `W`.
    - `eval_data`: `(X, y)` on which the recorded loss is measured; default the dataset, or
      for a stream `eval_size` samples drawn once from it (with `eval_key(key)`).
    - `trainable`: an equinox filter spec of the trained arrays; default `default_trainable`
      (the neuron arrays `W`, so fixed readouts stay fixed).
    - `progress`: show a tqdm bar across chunks; `None` = only for runs of ≥ 20000 steps.
    - `throw`: raise `lvflow.SolverError` when the loss becomes non-finite (diverged); with
      `False` the history is returned as is.

    **Returns:** a `TrainHistory`.
    """
    if not isinstance(optimizer, optax.GradientTransformation):
        raise LvflowError(
            f"optimizer: expected an optax transformation (optax.sgd(0.01), optax.adam(1e-3), …), got {optimizer!r}"
        )
    steps = _check_int("steps", steps, allow_zero=True)
    every = _check_int("record_every", record_every)
    stream = None
    if callable(data) and not isinstance(data, AbstractDataset):
        stream = data
        if batch_size is None:
            raise LvflowError("batch_size: required when data is a stream (the samples drawn per step)")
        if key is None:
            raise LvflowError("key: required when data is a stream")
        Xd = yd = None
    else:
        Xd, yd = _as_data("data", data)
    if batch_size is not None:
        batch_size = _check_int("batch_size", batch_size)
        if Xd is not None and batch_size > Xd.shape[0]:
            raise LvflowError(f"batch_size: {batch_size} exceeds the number of samples m = {Xd.shape[0]}")
        if key is None:
            raise LvflowError("key: required for minibatch SGD (batch_size given)")
    if key is None:
        key = jax.random.PRNGKey(0)
    if eval_data is not None:
        ev = _as_data("eval_data", eval_data)
    elif stream is not None:
        ev = _as_data("data (stream)", stream(eval_key(key), _check_int("eval_size", eval_size)))
    else:
        ev = (Xd, yd)
    loss_fn = mse_loss if loss is None else loss
    if not callable(loss_fn):
        raise LvflowError("loss: must be a callable loss(model, X, y) -> scalar")
    record_fn = _record_fn(record)
    if loss is None:
        _check_output_shape(model, ev)

    spec = default_trainable(model) if trainable is None else trainable
    params, static = eqx.partition(model, spec)
    opt_state = optimizer.init(params)
    data_arrays = None if stream is not None else (Xd, yd)

    def cfg(e, n):
        return (optimizer, loss_fn, record_fn, bool(record_M), e, n, batch_size, stream)

    rec0 = _record0(params, static, ev, loss_fn, record_fn, bool(record_M))
    records = [jax.tree_util.tree_map(lambda a: a[None], rec0)]
    step_list = [0]

    n_full, rem = divmod(steps, every)
    show = (steps >= _AUTO_PROGRESS_STEPS) if progress is None else bool(progress)
    group = max(1, math.ceil(n_full / _MAX_GROUPS)) if show else max(n_full, 1)
    plan = [group] * (n_full // group) + ([n_full % group] if n_full % group else [])
    bar = None
    if show:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc="train", unit="step")
    t = 0
    try:
        for n in plan:
            params, opt_state, rec = _run_group(
                params, opt_state, static, data_arrays, ev, key, jnp.asarray(t), cfg(every, n)
            )
            records.append(rec)
            step_list.extend(t + every * (i + 1) for i in range(n))
            t += every * n
            if bar is not None:
                bar.update(every * n)
        if rem:
            params, opt_state, rec = _run_group(
                params, opt_state, static, data_arrays, ev, key, jnp.asarray(t), cfg(rem, 1)
            )
            records.append(rec)
            t += rem
            step_list.append(t)
            if bar is not None:
                bar.update(rem)
    finally:
        if bar is not None:
            bar.close()

    recs = jax.tree_util.tree_map(lambda *a: jnp.concatenate(a), *records)
    losses = recs["loss"]
    if throw:
        bad = np.flatnonzero(~np.isfinite(np.asarray(losses)))
        if bad.size:
            raise SolverError(
                f"train: the loss became non-finite by step {step_list[bad[0]]} (diverged; lower the learning "
                "rate), pass throw=False to get the history"
            )
    return TrainHistory(
        steps=jnp.asarray(step_list),
        loss=losses,
        M=recs.get("M"),
        mu=recs.get("mu"),
        extras=recs.get("extras"),
        model=eqx.combine(params, static),
    )


def _record(model, ev, loss_fn, record_fn, record_M):
    out = {"loss": loss_fn(model, *ev)}
    if record_M:
        out["M"], out["mu"] = order_parameters(model)
    if record_fn is not None:
        out["extras"] = record_fn(model)
    return out


def _check_output_shape(model, ev):
    X, y = ev
    try:
        out = jax.eval_shape(jax.vmap(model), jax.ShapeDtypeStruct(X.shape, X.dtype))
    except Exception as e:  # a shape error inside the model
        why = str(e).split("\n")[0]
        raise LvflowError(f"data.X: the model cannot be applied to inputs of shape {X.shape[1:]} ({why})") from None
    if tuple(out.shape) != tuple(y.shape):
        raise LvflowError(f"data.y: shape {tuple(y.shape)} does not match the model's outputs {tuple(out.shape)}")


@eqx.filter_jit
def _record0(params, static, ev, loss_fn, record_fn, record_M):
    return _record(eqx.combine(params, static), ev, loss_fn, record_fn, record_M)
