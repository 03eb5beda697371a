"""Built-in architectures: closed-form structure matrices (Table 3) vs autodiff (Eq. 2), the
forward pass vs the sum of units and vs independent implementations, the O(|W|³)/O(|W|⁴)
rate of the NQF approximation (Thm 1), and input errors."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.signal import correlate2d

import lvflow
import lvflow.architectures as la

KEY = jax.random.key(0)


def _vec(shape):
    return lambda key: jax.random.normal(key, shape)


def _quad_act(z):  # smooth, φ(0) = 0, φ'(0) = 1, φ''(0) ≠ 0: not odd, so the NQF error is O(|W|³)
    return z + 0.5 * z**2


# name -> (model with O(1) weights, input sampler, order of the NQF error: 3, 4 or None = exact)
CASES = {
    "mlp": (la.MLP(4, 3, 2, key=KEY, init_scale=1.0), _vec((4,)), 4),
    "mlp_scalar_nonodd": (la.MLP(4, 3, activation=_quad_act, key=KEY, init_scale=1.0), _vec((4,)), 3),
    "cnn": (la.CNN((4, 5), (2, 3), 3, 2, key=KEY, init_scale=1.0), _vec((4, 5)), 4),
    "mha": (la.MultiHeadAttention(4, 2, 3, 2, 2, key=KEY, init_scale=1.0), _vec((4, 5)), 4),
    "mha_scalar": (la.MultiHeadAttention(4, 2, 3, 2, key=KEY, init_scale=1.0), _vec((4, 5)), 4),
    "qk": (la.QKAttention(4, 2, 3, 2, key=KEY, init_scale=1.0), _vec((4, 5)), 4),
    "qk_scalar": (la.QKAttention(4, 2, 3, key=KEY, init_scale=1.0), _vec((4, 5)), 4),
    "logits": (la.AttentionLogits(4, 3, 5, key=KEY, init_scale=1.0), _vec((4, 5)), None),
    "moe": (la.MixtureOfExperts(4, 3, 2, key=KEY, init_scale=1.0), _vec((4,)), 4),
    "moe_scalar": (la.MixtureOfExperts(4, 3, key=KEY, init_scale=1.0), _vec((4,)), 4),
    "quadratic": (la.QuadraticNet(4, 3, key=KEY, init_scale=1.0), _vec((4,)), None),
    "diagonal": (la.DiagonalLinear(4, 2, key=KEY, init_scale=1.0), _vec((4,)), None),
    "signed_diagonal": (la.SignedDiagonal(4, 2, key=KEY, init_scale=1.0), _vec((4,)), None),
    "psd_sensing": (la.MatrixSensing(4, 2, key=KEY, init_scale=1.0), _vec((4, 4)), None),
    "rect_sensing": (la.RectangularSensing(4, 3, 2, key=KEY, init_scale=1.0), _vec((4, 3)), None),
    "fourier": (la.FourierMLP(6, theta=0.5, width=2, key=KEY, init_scale=1.0), lambda k: jax.random.uniform(k), 4),
}
IDS = list(CASES)


def _inputs(name, n, seed=1):
    sample = CASES[name][1]
    return [sample(k) for k in jax.random.split(jax.random.key(seed), n)]


@pytest.mark.parametrize("name", IDS)
def test_structure_matches_autodiff(name):
    model = CASES[name][0]
    xs = _inputs(name, 3)
    k = model.out_size
    shape = (model.p, model.p) if k is None else (k, model.p, model.p)
    X = jnp.stack(xs)
    auto = lvflow.structure_matrix(model.unit, X, model.p, batched=True)
    closed = jax.jit(jax.vmap(model.structure))(X)
    assert auto.shape == closed.shape == (3,) + shape
    for a, A in zip(auto, closed):
        scale = float(jnp.max(jnp.abs(A)))
        assert scale > 0.05  # the closed form is not trivially zero
        assert float(jnp.max(jnp.abs(a - A))) <= 1e-12 * scale


@pytest.mark.parametrize("name", IDS)
def test_forward_is_sum_of_units(name):
    model, _, _ = CASES[name]
    X = jnp.stack(_inputs(name, 2, seed=2))

    @jax.jit
    def both(X):  # the network (batched over samples, as users call it) and Σ_i unit(w_i, x)
        units = jax.vmap(jax.vmap(model.unit, in_axes=(1, None)), in_axes=(None, 0))(model.W, X)
        return jax.vmap(model)(X), units

    out, units = both(X)
    assert units.shape[:2] == (2, model.d)
    np.testing.assert_allclose(out, jnp.sum(units, axis=1), rtol=1e-12, atol=1e-12)
    assert float(jnp.max(jnp.abs(out))) > 0.1  # O(1) weights: not a trivial 0 = 0


@pytest.mark.parametrize("name", IDS)
def test_nqf_error_rate(name):
    """`model(x) − Tr[W Wᵀ A(x)] = O(t³)` for `W = t W₁` (Thm 1), `O(t⁴)` with sign symmetry."""
    model, _, order = CASES[name]
    x = _inputs(name, 1, seed=4)[0]

    @jax.jit
    @jax.vmap
    def err(t):
        m = eqx.tree_at(lambda m: m.W, model, t * model.W)
        return jnp.max(jnp.abs(m(x) - jnp.einsum("...ij,ij->...", model.structure(x), m.W @ m.W.T)))

    if order is None:  # exactly quadratic: f = Tr[W Wᵀ A] at any scale
        assert float(err(jnp.ones(1))[0]) <= 1e-12 * max(1.0, float(jnp.max(jnp.abs(jax.jit(lambda x: model(x))(x)))))
        return
    ts = [0.08, 0.04, 0.02]
    e = [float(v) for v in err(jnp.array(ts))]
    slopes = [math.log2(e[i] / e[i + 1]) for i in range(2)]
    assert e[-1] / ts[-1] ** 2 < 0.5 * e[0] / ts[0] ** 2  # the remainder vanishes faster than t²
    assert all(abs(s - order) < 0.25 for s in slopes), (e, slopes)


def test_independent_forward_passes():
    """Forward passes against plain numpy / scipy implementations of the paper's formulas."""
    x4, X45 = np.asarray(_inputs("mlp", 1)[0]), np.asarray(_inputs("mha", 1)[0])
    # MLP: Σ_i v_i tanh(u_iᵀ x)
    m = CASES["mlp"][0]
    W = np.asarray(m.W)
    np.testing.assert_allclose(
        jax.jit(lambda x: m(x))(x4), sum(W[4:, i] * np.tanh(W[:4, i] @ x4) for i in range(3)), rtol=1e-12
    )
    # CNN: correlation with each kernel (scipy), tanh, global sum, read out
    m = CASES["cnn"][0]
    W, X = np.asarray(m.W), np.asarray(_inputs("cnn", 1)[0])
    ref = sum(W[6:, i] * np.tanh(correlate2d(X, W[:6, i].reshape(2, 3), mode="valid")).sum() for i in range(3))
    np.testing.assert_allclose(jax.jit(lambda x: m(x))(X), ref, rtol=1e-12)

    # attention, with query = last token
    def softmax(s):
        e = np.exp(s - s.max())
        return e / e.sum()

    m = CASES["mha"][0]
    W, ref = np.asarray(m.W), 0.0
    for h in range(2):
        Wq, Wk, Wv, v = (
            W[:8, h].reshape(2, 4),
            W[8:16, h].reshape(2, 4),
            W[16:28, h].reshape(3, 4),
            W[28:, h].reshape(3, 2),
        )
        ref = ref + v.T @ Wv @ X45 @ softmax(X45.T @ Wk.T @ Wq @ X45[:, -1] / np.sqrt(2))
    np.testing.assert_allclose(jax.jit(lambda x: m(x))(X45), ref, rtol=1e-12)
    m = CASES["qk"][0]
    W, c, ref = np.asarray(m.W), np.asarray(m.readout), 0.0
    for h in range(3):
        Wq, Wk = W[:8, h].reshape(2, 4), W[8:, h].reshape(2, 4)
        ref = ref + c.T @ X45 @ softmax(X45.T @ Wk.T @ Wq @ X45[:, -1] / np.sqrt(2))
    np.testing.assert_allclose(jax.jit(lambda X: m(X) + m.f0(X))(X45), ref, rtol=1e-12)
    np.testing.assert_allclose(m.f0(X45), 3 * c.T @ X45.mean(axis=1), rtol=1e-12)
    # Fourier MLP (Fig 5): (1/√P) Σ_k W_k tanh(k^{-θ} a_k √2 cos 2πkx), summed over the 2 neurons
    m, x = CASES["fourier"][0], 0.37
    W, k = np.asarray(m.W), np.arange(1, 7)
    ref = sum(
        W[6:, i] @ np.tanh(k**-0.5 * W[:6, i] * np.sqrt(2) * np.cos(2 * np.pi * k * x)) for i in range(2)
    ) / np.sqrt(6)
    np.testing.assert_allclose(jax.jit(lambda x: m(x))(x), ref, rtol=1e-12)


def test_centered_softmax_keeps_tiny_scores():
    """At `|W| ~ 1e-6` the scores are ~1e-12: a naive `softmax − 1/N` would lose most digits."""
    m = CASES["qk_scalar"][0]
    X = _inputs("qk_scalar", 1)[0]
    small = eqx.tree_at(lambda m: m.W, m, 1e-6 * m.W)
    out, nqf = jax.jit(lambda X: (small(X), jnp.einsum("ij,ij->", m.structure(X), small.W @ small.W.T)))(X)
    assert abs(float(out - nqf)) <= 1e-9 * abs(float(nqf))


def test_paper_sizes():
    """Fig 2 and Fig 5 configurations have the neuron sizes of the paper's parametrisation."""
    mk = dict(key=KEY)
    assert (la.MLP(20, 64, 8, **mk).p, la.MLP(20, 64, 8, **mk).d) == (28, 64)
    assert (la.CNN((5, 7), (4, 5), 64, 8, **mk).p, la.CNN((5, 7), (4, 5), 64, 8, **mk).d) == (28, 64)
    mha = la.MultiHeadAttention(20, 8, 20, 4, 8, **mk)
    assert (mha.p, mha.d, mha.out_size) == (2 * 8 * 20 + 20 * 20 + 20 * 8, 4, 8)
    qk = la.QKAttention(20, 8, 4, 8, **mk)
    assert (qk.p, qk.d, qk.readout.shape) == (320, 4, (20, 8))
    f = la.FourierMLP(64, theta=1.0, key=KEY, init_scale=1e-4)
    assert (f.p, f.d) == (128, 1) and 0 < float(jnp.std(f.W)) < 2e-4


_mlp_structure = jax.jit(lambda x: CASES["mlp_scalar_nonodd"][0].structure(x))


@settings(max_examples=10, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=4, max_size=4))
def test_mlp_spectrum(x):
    """`φ'(0)/2 [[0, x],[xᵀ, 0]]` has eigenvalues `±φ'(0)|x|/2` and zeros (Prop 1)."""
    x = np.array(x)
    eig = np.sort(np.linalg.eigvalsh(np.asarray(_mlp_structure(x))))
    r = np.linalg.norm(x) / 2
    np.testing.assert_allclose(eig, [-r, 0, 0, 0, r], atol=1e-12)


def test_zgz_violations_raise():
    with pytest.raises(lvflow.ZGZError, match="activation: φ\\(0\\) = 0.5"):
        la.MLP(4, 3, activation=jax.nn.sigmoid, key=KEY)
    with pytest.raises(lvflow.ZGZError, match="activation"):
        la.CNN((4, 5), (2, 3), 3, activation=jax.nn.softplus, key=KEY)
    with pytest.raises(lvflow.ZGZError, match="gate"):
        la.MixtureOfExperts(4, 3, gate=jax.nn.sigmoid, key=KEY)
    # a (fixed, nonzero) hidden bias b: ∂unit/∂v = tanh(b) ≠ 0 at w = 0
    biased = lambda w, x: w[-1] * jnp.tanh(w[:-1] @ x + 0.3)
    with pytest.raises(lvflow.ZGZError, match="ZGZ"):
        lvflow.structure_matrix(biased, jnp.ones(4), 5)


@pytest.mark.bad_input
def test_bad_input_raises():
    m = CASES["mlp"][0]
    with pytest.raises(lvflow.LvflowError, match=r"x: expected shape \(4,\)"):
        m(jnp.ones(5))
    with pytest.raises(lvflow.LvflowError, match="x: contains 1 non-finite"):
        m.structure(jnp.array([1.0, jnp.nan, 0.0, 0.0]))
    with pytest.raises(lvflow.LvflowError, match=r"X: expected a sequence of shape \(4, N\)"):
        CASES["mha"][0](jnp.ones((5, 3)))
    with pytest.raises(lvflow.LvflowError, match="X: expected 5 tokens"):
        CASES["logits"][0].structure(jnp.ones((4, 3)))
    with pytest.raises(lvflow.LvflowError, match="S: expected shape"):
        CASES["rect_sensing"][0](jnp.ones((3, 4)))
    with pytest.raises(lvflow.LvflowError, match="x: expected shape \\(\\)"):
        CASES["fourier"][0](jnp.ones(2))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(lvflow.LvflowError, match="width: must be a positive integer"):
            la.MLP(4, bad, key=KEY)
    with pytest.raises(lvflow.LvflowError, match="out_size"):
        la.MultiHeadAttention(4, 2, 3, 2, 0, key=KEY)
    with pytest.raises(lvflow.LvflowError, match="kernel_shape"):
        la.CNN((4, 5), (5, 3), 3, key=KEY)
    with pytest.raises(lvflow.LvflowError, match="init_scale: must be non-negative"):
        la.QuadraticNet(4, 3, key=KEY, init_scale=-1.0)
    with pytest.raises(lvflow.LvflowError, match=r"readout: expected shape \(4, 2\)"):
        la.QKAttention(4, 2, 3, 2, readout=jnp.ones(4), key=KEY)
    with pytest.raises(lvflow.LvflowError, match="theta"):
        la.FourierMLP(4, theta=float("nan"), key=KEY)


def test_init_is_gaussian_and_vmappable():
    """`W ~ N(0, init_scale²)` (KS test), reproducible per key, and buildable under `filter_vmap`."""
    from scipy.stats import kstest

    W = np.asarray(la.QuadraticNet(100, 50, key=KEY, init_scale=0.3).W)
    assert kstest(W.ravel() / 0.3, "norm").pvalue > 1e-3
    np.testing.assert_array_equal(W, la.QuadraticNet(100, 50, key=KEY, init_scale=0.3).W)
    ens = eqx.filter_vmap(lambda k: la.MLP(3, 2, key=k, init_scale=1.0))(jax.random.split(KEY, 3))
    assert ens.W.shape == (3, 4, 2) and float(jnp.min(jnp.abs(ens.W[0] - ens.W[1]))) > 0


@pytest.mark.parametrize("name", IDS)
def test_sample_shape_is_the_shape_of_one_input(name):
    """`sample_shape` (what `gaussian_inputs` draws) is the shape every input of the case has."""
    model = CASES[name][0]
    x = _inputs(name, 1)[0]
    assert model.sample_shape(seq_len=x.shape[-1] if x.ndim == 2 else None) == tuple(x.shape)
    assert lvflow.gaussian_inputs(model, 3, seq_len=5).shape[1:] == tuple(x.shape)


LEARNED_MAP = [n for n in IDS if isinstance(CASES[n][0], la.AbstractLearnedMap)]


def test_learned_map_architectures():
    assert set(LEARNED_MAP) == {
        "mlp",
        "mlp_scalar_nonodd",
        "cnn",
        "mha",
        "mha_scalar",
        "qk",
        "qk_scalar",
        "moe",
        "moe_scalar",
    }
    assert all(isinstance(CASES[n][0], la.AbstractSeparableMap) for n in LEARNED_MAP if not n.startswith("qk"))


@pytest.mark.parametrize("name", LEARNED_MAP)
def test_learned_map_reads_the_quadratic_form(name):
    """`Tr[Wᵀ A_c(x) W] = ⟨Θ(W), Φ_c(x)⟩` (Eq. 17), `ψ(x)ᵀ output_slices(Θ)[c]` for separable
    maps, and a drawn teacher's neurons give `Tr[Z Zᵀ A_c(x)] = ⟨U S Vᵀ, Φ_c(x)⟩`."""
    model = CASES[name][0]
    W = np.asarray(model.W)
    Theta = np.asarray(model.learned_map())
    assert model.map_shape == Theta.shape
    s = np.array([1.0, 0.5])[: min(Theta.shape)]  # rank at most that of Θ (1 for a scalar MLP)
    r = len(s)
    U, V, Z = model.draw_teacher(np.random.default_rng(0), s)
    np.testing.assert_allclose(U.T @ U, np.eye(r), atol=1e-12)
    np.testing.assert_allclose(V.T @ V, np.eye(r), atol=1e-12)
    assert (U.shape[0], V.shape[0]) == Theta.shape and Z.shape == (model.p, r)
    for x in _inputs(name, 2, seed=5):
        A = np.asarray(model.structure(x)).reshape(-1, model.p, model.p)  # (k, p, p)
        Phi = np.asarray(model.map_features(x))
        assert Phi.shape == (A.shape[0],) + Theta.shape
        direct = np.einsum("cij,id,jd->c", A, W, W)
        np.testing.assert_allclose(np.einsum("cab,ab->c", Phi, Theta), direct, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(
            np.einsum("cij,ir,jr->c", A, Z, Z), np.einsum("cab,ab->c", Phi, (U * s) @ V.T), rtol=1e-12, atol=1e-12
        )
        if isinstance(model, la.AbstractSeparableMap):
            sliced = np.asarray(model.output_slices(Theta)) @ np.asarray(model.shared_features(x))
            np.testing.assert_allclose(sliced, direct, rtol=1e-12, atol=1e-12)


class _OuterProduct(la.AbstractArchitecture):
    """A user's architecture: `f(x) = Σ_i (u_iᵀ x)(v_iᵀ x)`, neuron `[u, v]`, `A = ½ [[0, x xᵀ], [x xᵀ, 0]]`."""

    W: jax.Array
    n: int = eqx.field(static=True)

    @property
    def out_size(self):
        return None

    def sample_shape(self, *, seq_len=None):
        return (self.n,)

    def unit(self, w, x):
        return (w[: self.n] @ x) * (w[self.n :] @ x)

    def __call__(self, x):
        return jnp.sum((x @ self.W[: self.n]) * (x @ self.W[self.n :]))

    def structure(self, x):
        xx = jnp.outer(x, x) / 2
        return jnp.block([[jnp.zeros_like(xx), xx], [xx, jnp.zeros_like(xx)]])


def test_a_user_architecture_gets_inputs_and_a_twin():
    model = _OuterProduct(jax.random.normal(KEY, (6, 2)), 3)
    X = lvflow.gaussian_inputs(model, 4, seed=1)
    assert X.shape == (4, 3)
    twin = lvflow.nqf_twin(model)  # ZGZ checked at a Gaussian input drawn from sample_shape
    assert twin.sample_shape() == (3,) and twin.out_size is None
    np.testing.assert_allclose(jax.vmap(twin)(X), jax.vmap(model)(X), rtol=1e-12)  # exactly quadratic
    with pytest.raises(lvflow.LvflowError, match="model: no low-rank teacher is defined for a _OuterProduct"):
        lvflow.low_rank_teacher(model, 10, s=(1.0,))
    with pytest.raises(TypeError, match="abstract"):  # the interface is enforced at construction

        class Incomplete(la.AbstractArchitecture):
            W: jax.Array

            @property
            def out_size(self):
                return None

        Incomplete(jnp.ones((2, 2)))


def test_not_a_model_raises():
    with pytest.raises(lvflow.LvflowError, match="model: cannot infer the input shape of a dict"):
        lvflow.gaussian_inputs({"W": jnp.ones((2, 2))}, 3)
    with pytest.raises(lvflow.LvflowError, match="seq_len: required"):
        lvflow.gaussian_inputs(CASES["mha"][0], 3)
