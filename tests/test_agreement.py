"""Networks against their NQF twins (Fig 2), and the agreement measures."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lvflow
from lvflow import (
    TrainHistory,
    architectures as arch,
    compare_histories,
    low_rank_teacher,
    nqf_twin,
    recovered_singular_values,
    train,
)

KEY = jax.random.PRNGKey(0)
N_TOK = 4
STEPS, EVERY = 600, 12
OPTS = ("gd", "momentum", "adam")

# Small versions of Fig 2's models. Width matters: the network departs from its NQF by
# O(|w_i|²) per neuron, and the learned map U S Vᵀ is shared by d neurons, so the gap ∝ 1/d
# (measured: MLP 0.03–0.05 at d = 64, 0.02 at d = 128; MoE 0.045 at d = 256, 0.02 at d = 512).
# Attention's NQF error is O(|W|⁴) (sign symmetry of a head), so fewer heads suffice.
ARCHS = {
    "mlp": (lambda s: arch.MLP(8, 128, 4, key=KEY, init_scale=s), 0.1),
    "cnn": (lambda s: arch.CNN((4, 5), (3, 3), 128, 4, key=KEY, init_scale=s), 0.02),
    "mha": (lambda s: arch.MultiHeadAttention(6, 2, 2, 32, 4, key=KEY, init_scale=s), 0.1),
    "qk": (lambda s: arch.QKAttention(6, 2, 64, 4, key=KEY, init_scale=s), 0.1),
    "moe": (lambda s: arch.MixtureOfExperts(5, 512, 3, key=KEY, init_scale=s), 0.05),
}


class Bundle(eqx.Module):
    """Six models trained in ONE compiled run: (network, twin) × (GD, momentum, Adam).

    The loss is the sum of their losses and their parameters are disjoint, so each gets exactly
    the gradient of its own loss and its own optimiser state (optax.multi_transform): the same
    as six separate `train` calls (checked against one below), at a sixth of the compile time.
    """

    models: tuple

    def __call__(self, x):
        return jnp.stack([m(x) for m in self.models])


def bundle_loss(b, X, y):
    pred = jax.vmap(b)(X)  # (m, 6, *k)
    return jnp.sum((pred - y[:, None]) ** 2) / y.shape[0]


def labels(params):
    names = [o for o in OPTS for _ in (0, 1)]
    return Bundle(tuple(jax.tree_util.tree_map(lambda _: n, m) for m, n in zip(params.models, names)))


def optimisers(lr):
    return {"gd": optax.sgd(lr), "momentum": optax.sgd(lr / 10, momentum=0.9), "adam": optax.adam(0.01)}


@pytest.mark.parametrize("name", list(ARCHS))
def test_network_tracks_its_nqf_at_small_init_only(name):
    make, lr = ARCHS[name]
    net = make(0.01)
    teacher = low_rank_teacher(net, 64, seq_len=N_TOK, seed=1)
    twin = nqf_twin(net, seq_len=N_TOK, method="structure")  # p ≤ 44 here: A(x) is small
    opt = optax.multi_transform(optimisers(lr), labels)
    record = lambda b: jnp.stack([teacher.recovered(m) for m in b.models])  # (6, r)
    gaps = {}
    for sigma in (0.01, 0.2):
        W = make(sigma).W
        models = []
        for _ in OPTS:
            models += [eqx.tree_at(lambda m: m.W, net, W), eqx.tree_at(lambda t: t.network.W, twin, W)]
        h = train(
            Bundle(tuple(models)),
            teacher,
            opt,
            STEPS,
            record_every=EVERY,
            loss=bundle_loss,
            record=record,
            record_M=False,
            throw=False,
        )
        s_hat = np.asarray(h.extras) / np.asarray(teacher.s)  # (n, 6, r)
        for j, o in enumerate(OPTS):
            gaps[sigma, o] = float(np.max(np.abs(s_hat[:, 2 * j] - s_hat[:, 2 * j + 1])))
            if sigma == 0.01:  # learned: the NQF recovers the teacher
                assert np.allclose(s_hat[-1, 2 * j + 1], 1.0, atol=0.05), (o, s_hat[-1, 2 * j + 1])
    print(name, {k: round(v, 4) for k, v in gaps.items()})
    for o in OPTS:
        assert gaps[0.01, o] <= 0.05, (name, o, gaps[0.01, o])
    # At σ = 0.2 plain GD at the small-init learning rate may diverge (NaN gap, not counted).
    assert any(gaps[0.2, o] >= 2 * gaps[0.01, o] for o in OPTS), gaps


def _history(loss, s_hat, steps=None):
    loss = jnp.asarray(loss)
    steps = jnp.arange(loss.shape[0]) if steps is None else jnp.asarray(steps)
    return TrainHistory(steps=steps, loss=loss, M=None, mu=None, extras=s_hat, model=None)


def test_compare_histories_closed_form():
    s = np.array([1.0, 0.5])
    h1 = _history([4.0, 2.0, 1.0], {"s_hat": jnp.array([[0.0, 0.0], [0.5, 0.1], [1.0, 0.5]])})
    h2 = _history([3.0, 2.5, 1.0], {"s_hat": jnp.array([[0.0, 0.0], [0.4, 0.2], [1.0, 0.45]])})
    a = compare_histories(h1, h2, s=s)
    assert np.allclose(a.sv_gap_per_mode, [0.1, 0.2]) and np.isclose(a.sv_gap, 0.2)
    assert np.allclose(a.sv_gap_t, [0.0, 0.2, 0.1])
    assert np.allclose(a.loss_gap_t, [0.25, 0.125, 0.0]) and np.isclose(a.loss_gap, 0.25)
    assert np.isnan(compare_histories(h1, h2).sv_gap)  # losses only
    with pytest.raises(lvflow.LvflowError, match="different steps"):
        compare_histories(h1, _history([1.0, 1.0, 1.0], None, steps=[0, 2, 4]))
    with pytest.raises(lvflow.LvflowError, match="extra"):
        compare_histories(h1, h2, s=s, extra="other")
    with pytest.raises(lvflow.LvflowError, match="no ŝ recorded"):
        compare_histories(_history([1.0], None), _history([1.0], None), s=s)
    with pytest.raises(lvflow.LvflowError, match="s: 3 singular values"):
        compare_histories(h1, h2, s=np.ones(3))


@pytest.mark.bad_input
def test_recovered_singular_values_errors():
    T = low_rank_teacher(arch.MLP(3, 2, 2, key=KEY), 10, s=(1.0, 0.5))
    with pytest.raises(lvflow.LvflowError, match="source"):
        recovered_singular_values(T, jnp.ones((10, 3)))


def test_bundle_equals_separate_training():
    """The six-model bundle above is exact: one member equals its own `train` run."""
    net = arch.MLP(3, 8, 2, key=KEY, init_scale=0.1)
    T = low_rank_teacher(net, 12, s=(1.0, 0.5))
    twin = nqf_twin(net)
    opt = optax.multi_transform(optimisers(0.1), labels)
    hb = train(Bundle((net, twin) * 3), T, opt, 20, record_every=10, loss=bundle_loss, record_M=False)
    for j, o in enumerate(OPTS):
        h = train(twin, T, optimisers(0.1)[o], 20, record_every=10, record_M=False)
        assert np.max(np.abs(np.asarray(hb.model.models[2 * j + 1].W - h.model.W))) < 1e-13
