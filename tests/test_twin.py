"""NQF twins: same W, output Tr[Wᵀ A(x) W]; exact agreement with the (M, μ) recursion (Thm 2),
width independence (Thm 3), ZGZ errors, and the two-layer NQF of deep networks (App. B.4)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lvflow
from lvflow import (
    DeepAttention,
    DeepMLP,
    DeepNQF,
    NQFModel,
    architectures as arch,
    low_rank_teacher,
    minibatch_indices,
    nqf_twin,
    train,
)

KEY = jax.random.PRNGKey(3)


ev = eqx.filter_jit(lambda model, x: model(x))  # one compile per model structure, not per op


def scaled(model, t):
    """Every weight array times `t`."""
    return jax.tree_util.tree_map(lambda a: a * t if eqx.is_inexact_array(a) else a, model)


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize(
    "net, x",
    [
        (arch.MLP(3, 5, 2, key=KEY, init_scale=0.7), np.array([0.3, -1.2, 0.8])),
        (arch.QKAttention(3, 2, 4, 2, key=KEY, init_scale=0.7), np.linspace(-1, 1, 12).reshape(3, 4) ** 3),
        (arch.MultiHeadAttention(3, 2, 2, 3, key=KEY, init_scale=0.7), np.cos(np.arange(12.0)).reshape(3, 4)),
    ],
)
def test_twin_output_is_the_quadratic_form_of_the_structure_matrix(net, x):
    twin = nqf_twin(net, x=x)
    A = np.asarray(net.structure(x))
    W = np.asarray(net.W)
    direct = np.einsum("...ij,id,jd->...", A, W, W)  # Tr[Wᵀ A W]
    assert twin.W is net.W
    assert _rel(ev(twin, x), direct) < 1e-12
    assert _rel(ev(NQFModel(net, "structure"), x), direct) < 1e-12


@pytest.fixture(scope="module")
def small():
    net = arch.MLP(4, 16, 2, key=KEY, init_scale=0.3)
    teacher = low_rank_teacher(net, 20, s=(1.0, 0.5), seed=2)
    twin = nqf_twin(net)
    return twin, teacher, twin.nqf(teacher.X, teacher.y)


@pytest.mark.parametrize("mode", ["gd", "sgd", "momentum"])
def test_twin_trained_by_optax_equals_the_exact_recursion(small, mode):
    twin, teacher, nqf = small
    steps, lr, key = 200, 0.05, jax.random.PRNGKey(7)
    opt = optax.sgd(lr, momentum=0.9 if mode == "momentum" else None)
    batch = 6 if mode == "sgd" else None
    h = train(twin, teacher, opt, steps, record_every=10, batch_size=batch, key=key)
    W0 = twin.W
    rec = lvflow.gd_recursion(
        nqf,
        W0 @ W0.T,
        steps=steps,
        lr=lr,
        record_every=10,
        momentum=0.9 if mode == "momentum" else 0.0,
        batches=None if batch is None else minibatch_indices(key, steps=steps, m=nqf.m, batch_size=batch),
    )
    assert np.array_equal(h.steps, rec.steps)
    assert _rel(h.M, rec.M) < 1e-8
    assert _rel(h.loss, rec.loss) < 1e-8
    assert np.asarray(h.loss)[-1] < 0.05 * np.asarray(h.loss)[0]  # it learned something


class IndexedNQF(eqx.Module):
    """Output `Tr[Wᵀ A_i W]` on sample index `i`: an NQF given by its stacked matrices."""

    W: jax.Array
    A: jax.Array

    def __call__(self, i):
        return jnp.einsum("...ij,id,jd->...", self.A[i], self.W, self.W)


def test_width_64_twin_and_its_compressed_model_have_the_same_loss_curve(small):
    _, teacher, _ = small
    net = arch.MLP(4, 64, 2, key=KEY, init_scale=0.05)
    twin = nqf_twin(net)
    nqf = twin.nqf(teacher.X, teacher.y)
    lr = 0.05
    comp = lvflow.compress(nqf, twin.W @ twin.W.T, d=64, lr=lr)
    assert comp.W.shape[1] == comp.k_V + 1 < 64
    h64 = train(twin, teacher, optax.sgd(lr), 300, record_every=20)
    hc = train(IndexedNQF(comp.W, comp.nqf.A), (jnp.arange(nqf.m), teacher.y), optax.sgd(comp.lr), 300, record_every=20)
    assert np.asarray(h64.loss)[-1] < 0.1 * np.asarray(h64.loss)[0]
    assert _rel(hc.loss, h64.loss) < 1e-9


class BiasUnit(arch.AbstractSumForm):
    """A user's sum-form module (no closed-form structure): `v φ(uᵀx + b)`, ZGZ only when `φ(b) = 0`."""

    W: jax.Array
    bias: float = 0.0
    act: object = eqx.field(static=True, default=jnp.tanh)

    def unit(self, w, x):
        return w[-1] * self.act(w[:-1] @ x + self.bias)

    def __call__(self, x):
        return sum(self.unit(w, x) for w in self.W.T)


@pytest.mark.parametrize("module", [BiasUnit(jnp.ones((4, 2)), 0.5), BiasUnit(jnp.ones((4, 2)), 0.0, jax.nn.sigmoid)])
def test_units_violating_zgz_raise(module):
    with pytest.raises(lvflow.ZGZError, match="ZGZ"):
        nqf_twin(module, x=jnp.array([1.0, -0.5, 2.0]))
    nqf_twin(BiasUnit(jnp.ones((4, 2))), x=jnp.array([1.0, -0.5, 2.0]))  # tanh, no bias: fine


def test_twin_input_errors():
    with pytest.raises(lvflow.LvflowError, match="network"):
        nqf_twin(object())
    with pytest.raises(lvflow.LvflowError, match="method"):
        nqf_twin(arch.MLP(2, 2, key=KEY), method="hessian")
    with pytest.raises(lvflow.LvflowError, match="x: pass a sample input"):
        nqf_twin(BiasUnit(jnp.ones((4, 2))))


def test_deep_mlp_is_a_4_layer_mlp_and_its_twin_the_composed_quadratic_forms():
    deep = DeepMLP(3, (5, 4, 6), 2, key=KEY, init_scale=0.5)
    twin = nqf_twin(deep)
    assert isinstance(twin, DeepNQF)
    x = np.array([0.4, -1.0, 0.7])
    (U1, V1), (U2, V2) = [(np.asarray(b.W[: b.in_size]), np.asarray(b.W[b.in_size :])) for b in deep.blocks]
    W1, W2, W3, W4 = U1.T, V1, U2.T, V2  # f = W4 φ(W3 φ(W2 φ(W1 x)))
    assert _rel(ev(deep, x), W4 @ np.tanh(W3 @ np.tanh(W2 @ np.tanh(W1 @ x)))) < 1e-13
    assert _rel(ev(twin, x), W4 @ W3 @ W2 @ W1 @ x) < 1e-13  # φ'(0) = 1 for tanh
    # Near zero the network is its two-layer NQF: error/|f| = O(t²) as all weights scale by t.
    errs = [_rel(ev(scaled(deep, t), x), ev(scaled(twin, t), x)) for t in (0.1, 0.01)]
    assert 80 < errs[0] / errs[1] < 120, errs
    assert _rel(ev(scaled(twin, 0.1), x), 1e-4 * np.asarray(ev(twin, x))) < 1e-12  # degree 4 exactly


def test_deep_attention_twin_is_its_small_weight_limit():
    deep = DeepAttention(3, 2, 2, 4, 2, key=KEY, init_scale=0.5)
    X = np.sin(np.arange(15.0)).reshape(3, 5)
    # Token n as the query equals rolling it to the last position (keys are permutation invariant).
    mha = deep.blocks[0]
    Xp = np.asarray(X)[:, [0, 2, 1, 3, 4]]
    assert _rel(ev(mha, Xp), ev(mha, X)) < 1e-13
    twin = nqf_twin(deep, seq_len=5)
    errs = [_rel(ev(scaled(deep, t), X), ev(scaled(twin, t), X)) for t in (0.1, 0.01)]
    assert errs[1] < 1e-3 and errs[0] / errs[1] > 80, errs
    # The twin: Q₂ reads the mean of block 1's outputs, all equal to Q₁(X) = L₁ x̄.
    L = [np.einsum("abh,ach->bc", *[np.asarray(t) for t in _wv_v(b)]) for b in deep.blocks]
    assert _rel(ev(twin, X), (L[0] @ L[1]).T @ np.asarray(X).mean(1)) < 1e-12


def _wv_v(block):
    D, dk, dv, k = block.in_size, block.key_size, block.value_size, block.out_size
    start = 2 * dk * D
    Wv = block.W[start : start + dv * D].reshape(dv, D, -1)
    v = block.W[start + dv * D :].reshape(dv, k, -1)
    return Wv, v


class Compose(lvflow.AbstractChain):
    """A user's chain: block 2 reads block 1's output as is."""

    def __call__(self, block, x):
        return block(x)


def _twice_tanh(z):  # φ(0) = 0, φ'(0) = 2
    return 2 * jnp.tanh(z)


class UserDeep(lvflow.AbstractDeepModel):
    """A user's deep model: two MLP blocks with φ = 2 tanh, joined by the link 3 sin."""

    blocks: tuple
    chain: lvflow.AbstractChain = Compose()

    @property
    def link_slope(self):
        return 3.0

    def link(self, h):
        return 3 * jnp.sin(h)


def test_a_user_deep_model_gets_the_two_layer_nqf():
    k1, k2 = jax.random.split(KEY)
    deep = UserDeep(
        (
            arch.MLP(3, 5, 4, activation=_twice_tanh, key=k1, init_scale=0.5),
            arch.MLP(4, 6, 2, activation=_twice_tanh, key=k2, init_scale=0.5),
        )
    )
    x = np.array([0.4, -1.0, 0.7])
    (U1, V1), (U2, V2) = [(np.asarray(b.W[: b.in_size]), np.asarray(b.W[b.in_size :])) for b in deep.blocks]
    W1, W2, W3, W4 = U1.T, V1, U2.T, V2
    assert _rel(ev(deep, x), W4 @ (2 * np.tanh(W3 @ (3 * np.sin(W2 @ (2 * np.tanh(W1 @ x))))))) < 1e-13
    assert deep.sample_shape() == (3,) and deep.out_size == 2
    twin = nqf_twin(deep)
    assert isinstance(twin, DeepNQF) and isinstance(twin.chain, Compose) and twin.link_slope == 3.0
    # Q₂(3 · Q₁(x)), Q_ℓ the block NQFs: φ'(0) W_{2ℓ} W_{2ℓ−1} (φ'(0) = 2 inside each block)
    assert _rel(ev(twin, x), 2 * W4 @ W3 @ (3 * 2 * W2 @ W1 @ x)) < 1e-13
    assert twin.blocks[0].W is deep.blocks[0].W  # trains the network's own neurons


def test_deep_model_and_twin_errors():
    with pytest.raises(lvflow.LvflowError, match="blocks: block 1 is a BiasUnit"):
        UserDeep((arch.MLP(3, 5, 4, key=KEY), BiasUnit(jnp.ones((5, 2)))))
    with pytest.raises(lvflow.LvflowError, match="blocks: expected a pair"):
        UserDeep((arch.MLP(3, 5, 4, key=KEY),))
    with pytest.raises(lvflow.LvflowError, match="method: expected 'jvp' or 'structure'"):
        NQFModel(arch.MLP(2, 2, key=KEY), "hessian")
    with pytest.raises(lvflow.LvflowError, match="method: a BiasUnit has no closed-form structure"):
        nqf_twin(BiasUnit(jnp.ones((4, 2))), x=jnp.ones(3), method="structure")
    twin = nqf_twin(BiasUnit(jnp.ones((4, 2))), x=jnp.array([1.0, -0.5, 2.0]))  # jvp needs only W and unit
    with pytest.raises(lvflow.LvflowError, match="network: a BiasUnit has no closed-form structure"):
        twin.structure(jnp.ones(3))
    with pytest.raises(lvflow.LvflowError, match="network: a BiasUnit has no input shape"):
        lvflow.gaussian_inputs(twin, 2)
    with pytest.raises(lvflow.LvflowError, match="network: expected a sum-form module .* got a str"):
        nqf_twin("MLP")
