"""`train`: the chunked scan equals a plain per-step optax loop; records; minibatches; errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lvflow
from lvflow import NQFModel, architectures as arch, minibatch_indices, mse_loss, teacher_student_stream, train

# internal on purpose: the key of train's stream evaluation set (documented in train, not exported)

KEY = jax.random.PRNGKey(0)
NET = arch.MLP(3, 6, 2, key=KEY, init_scale=0.4)
X = jax.random.normal(jax.random.PRNGKey(1), (24, 3))
Y = jnp.stack([jnp.tanh(X[:, 0] - X[:, 1]), X[:, 2] ** 2 - 1], axis=1)


def plain_loop(model, opt, steps, batch=None):
    """The same optax update, one Python iteration per step; the loss written out in numpy terms."""
    W, state = model.W, opt.init(model.W)

    def loss(W, Xb, Yb):
        f = jax.vmap(eqx.tree_at(lambda m: m.W, model, W))(Xb)
        return jnp.mean(jnp.sum((f - Yb) ** 2, axis=1))

    grad, Ws = jax.jit(jax.grad(loss)), [W]
    for t in range(steps):
        Xb, Yb = (X, Y) if batch is None else (X[batch[t]], Y[batch[t]])
        with jax.numpy_dtype_promotion("standard"):  # optax mixes its int32 count with floats
            upd, state = opt.update(grad(W, Xb, Yb), state, W)
        W = optax.apply_updates(W, upd)
        Ws.append(W)
    return Ws, lambda W: float(loss(W, X, Y))


@pytest.mark.parametrize("opt, batch_size", [(optax.sgd(0.05, momentum=0.9), None), (optax.adam(0.02), 5)])
def test_chunked_scan_equals_a_plain_loop(opt, batch_size):
    steps, every = 23, 5  # a remainder chunk too
    h = train(NET, (X, Y), opt, steps, record_every=every, batch_size=batch_size, key=KEY)
    batch = None if batch_size is None else np.asarray(minibatch_indices(KEY, steps=steps, m=24, batch_size=5))
    Ws, loss = plain_loop(NET, opt, steps, batch)
    assert list(np.asarray(h.steps)) == [0, 5, 10, 15, 20, 23]
    for i, t in enumerate(np.asarray(h.steps)):
        W = np.asarray(Ws[t])
        assert np.max(np.abs(np.asarray(h.M[i]) - W @ W.T)) < 1e-12
        assert np.max(np.abs(np.asarray(h.mu[i]) - W.sum(1))) < 1e-12
        assert abs(float(h.loss[i]) - loss(Ws[t])) < 1e-12
    assert np.max(np.abs(np.asarray(h.model.W) - np.asarray(Ws[-1]))) < 1e-12
    if batch is not None:  # distinct samples within each minibatch
        assert all(len(set(b)) == 5 for b in batch)


def test_small_lr_gd_never_raises_the_loss_and_records_extras():
    h = train(NET, (X, Y), optax.sgd(0.01), 300, record_every=3, record={"out0": lambda m: m(X[0])})
    L = np.asarray(h.loss)
    assert np.all(np.diff(L) <= 1e-15) and L[-1] < 0.5 * L[0]
    assert h.extras["out0"].shape == (101, 2)
    assert np.allclose(h.extras["out0"][-1], h.model(X[0]), atol=1e-14, rtol=0)
    assert abs(float(mse_loss(h.model, X, Y)) - L[-1]) < 1e-14


def test_online_sgd_draws_fresh_batches_from_a_stream():
    stream = teacher_student_stream(4, 10, seed=1)
    net = arch.MLP(4, 8, key=KEY, init_scale=0.3)
    h = train(net, stream, optax.sgd(0.05), 40, record_every=10, batch_size=8, key=KEY, eval_size=256)
    # Independent re-run: step t uses stream(fold_in(key, t), 8).
    W, opt = net.W, optax.sgd(0.05)
    state = opt.init(W)
    loss = lambda W, Xb, Yb: jnp.mean((jax.vmap(eqx.tree_at(lambda m: m.W, net, W))(Xb) - Yb) ** 2)
    g = jax.jit(jax.grad(loss))
    for t in range(40):
        Xb, Yb = stream(jax.random.fold_in(KEY, t), 8)
        upd, state = opt.update(g(W, Xb, Yb), state, W)
        W = optax.apply_updates(W, upd)
    assert np.max(np.abs(np.asarray(h.model.W) - np.asarray(W))) < 1e-12
    Xe, Ye = stream(jax.random.split(KEY)[1], 256)  # the evaluation set train draws (its documented key)
    assert abs(float(h.loss[-1]) - float(loss(W, Xe, Ye))) < 1e-12


def test_train_errors():
    sgd = optax.sgd(0.1)
    with pytest.raises(lvflow.LvflowError, match="steps"):
        train(NET, (X, Y), sgd, -1)
    with pytest.raises(lvflow.LvflowError, match="record_every"):
        train(NET, (X, Y), sgd, 10, record_every=0)
    with pytest.raises(lvflow.LvflowError, match="batch_size"):
        train(NET, (X, Y), sgd, 10, batch_size=25, key=KEY)
    with pytest.raises(lvflow.LvflowError, match="key"):
        train(NET, (X, Y), sgd, 10, batch_size=4)
    with pytest.raises(lvflow.LvflowError, match="batch_size"):
        train(NET, teacher_student_stream(3, 4), sgd, 10, key=KEY)
    with pytest.raises(lvflow.LvflowError, match="data.y"):
        train(NET, (X, Y[:, 0]), sgd, 10)
    with pytest.raises(lvflow.LvflowError, match="data.X"):
        train(NET, (X[:, :2], Y), sgd, 10)
    with pytest.raises(lvflow.LvflowError, match="data"):
        train(NET, (X, Y[:5]), sgd, 10)
    with pytest.raises(lvflow.LvflowError, match="non-finite"):
        train(NET, (X.at[0, 0].set(jnp.nan), Y), sgd, 10)
    quadratic = NQFModel(NET, "structure")  # its NQF: GD with a large step diverges
    with pytest.raises(lvflow.SolverError, match="non-finite by step"):
        train(quadratic, (X, Y), optax.sgd(5.0), 100, record_every=10)
    h = train(quadratic, (X, Y), optax.sgd(5.0), 100, record_every=10, throw=False)
    assert not np.isfinite(float(h.loss[-1]))


class Weighted(lvflow.AbstractDataset):
    """A user's dataset: the inputs and targets, plus a field `train` does not read."""

    X: jax.Array
    y: jax.Array
    note: str = eqx.field(static=True, default="")


def test_any_abstract_dataset_is_data_and_other_objects_are_not():
    sgd = optax.sgd(0.05)
    ref = train(NET, (X, Y), sgd, 20, record_every=5)
    for data in (lvflow.Dataset(X, Y), Weighted(X, Y, note="mine")):
        h = train(NET, data, sgd, 20, record_every=5)
        np.testing.assert_array_equal(h.loss, ref.loss)
    X2, Y2 = Weighted(X, Y)
    assert X2 is X and Y2 is Y and Weighted(X, Y).m == 24

    class Duck:  # looks like a dataset, but is not one
        def __init__(self):
            self.X, self.y = X, Y

    with pytest.raises(lvflow.LvflowError, match=r"data: expected an \(X, y\) pair, a Dataset .* got a Duck"):
        train(NET, Duck(), sgd, 10)
    with pytest.raises(lvflow.LvflowError, match="eval_data: .* got a list"):
        train(NET, (X, Y), sgd, 10, eval_data=[X, Y])


@pytest.mark.bad_input
def test_optimizer_must_be_an_optax_transformation():
    model = arch.DiagonalLinear(3, key=jax.random.PRNGKey(0))
    with pytest.raises(lvflow.LvflowError, match="optimizer: expected an optax transformation"):
        train(model, (np.ones((4, 3)), np.ones(4)), "sgd", 3)
