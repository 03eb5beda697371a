"""Datasets: the low-rank NQF teacher of each architecture, Fourier task, digits, teacher stream."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lvflow
from lvflow import (
    NQFModel,
    architectures as arch,
    digits_parity,
    fourier_task,
    gaussian_inputs,
    low_rank_teacher,
    teacher_student_stream,
)

KEY = jax.random.PRNGKey(0)
ARCHS = {
    "mlp": arch.MLP(5, 3, 4, key=KEY),
    "cnn": arch.CNN((3, 4), (2, 2), 3, 4, key=KEY),
    "mha": arch.MultiHeadAttention(5, 2, 3, 2, 4, key=KEY),
    "qk": arch.QKAttention(5, 2, 2, 4, key=KEY),
    "moe": arch.MixtureOfExperts(4, 3, 3, key=KEY),
}
S = np.array([1.0, 0.5, 0.25, 0.125])


@eqx.filter_jit
def outputs(model, X):
    return jax.vmap(model)(X)


@eqx.filter_jit
def structures(model, X):
    return jax.vmap(model.structure)(X)


@pytest.mark.parametrize("name", list(ARCHS))
def test_low_rank_teacher_is_an_nqf_with_the_chosen_singular_values(name):
    net = ARCHS[name]
    T = low_rank_teacher(net, 60, seed=3, seq_len=3)
    # Θ* has the singular values s (independent SVD).
    assert np.allclose(np.linalg.svd(np.asarray(T.Theta), compute_uv=False)[:4], S, rtol=1e-12)
    # Labels are Tr[M* A_c(x)], M* = Z Zᵀ, on every sample (closed-form A, numpy contraction).
    A = np.asarray(structures(net, T.X))
    Z = np.asarray(T.Z)
    assert np.allclose(np.einsum("mcij,ij->mc", A, Z @ Z.T), T.y, rtol=0, atol=1e-12)
    # The network with W = t·Z outputs t²·y up to O(t⁴): the teacher lives in the NQF regime.
    t = 1e-3
    f = outputs(eqx.tree_at(lambda m: m.W, net, t * T.Z), T.X) / t**2
    assert np.max(np.abs(f - T.y)) < 1e-4 * np.max(np.abs(T.y))
    # ŝ measured from outputs: s on the teacher's labels, and on its NQF twin.
    assert np.allclose(lvflow.recovered_singular_values(T, T.y), S, rtol=1e-9)
    assert np.allclose(T.recovered(NQFModel(eqx.tree_at(lambda m: m.W, net, T.Z), "jvp")), S, rtol=1e-9)
    # Time axes are carried along.
    assert lvflow.recovered_singular_values(T, jnp.stack([T.y, 2 * T.y])).shape == (2, 4)


def test_moe_teacher_singular_vectors_make_each_output_a_symmetric_quadratic_form():
    net = ARCHS["moe"]
    T = low_rank_teacher(net, 40, seed=1)
    R = np.asarray(T.Theta).reshape(4, 3, 4)  # R[a, c, b] = Q_c[a, b]
    assert np.allclose(R, R.transpose(2, 1, 0), atol=1e-13)


def test_datasets_are_deterministic_from_the_seed():
    net = ARCHS["mlp"]
    a, b, c = (low_rank_teacher(net, 10, seed=s) for s in (4, 4, 5))
    assert np.array_equal(a.X, b.X) and np.array_equal(a.y, b.y) and not np.allclose(a.y, c.y)
    X = gaussian_inputs(ARCHS["mha"], 2000, seed=0, seq_len=3)
    assert X.shape == (2000, 5, 3) and abs(float(X.std()) - 1) < 0.02


def test_fourier_task_projects_onto_the_power_law_coefficients():
    D = fourier_task(M=256, P=64, beta=1.5)
    assert D.X.shape == (256,) and np.allclose(np.diff(D.X), 1 / 256)
    k = np.arange(1, 80)
    psi = np.sqrt(2) * np.cos(2 * np.pi * k[:, None] * np.asarray(D.X)[None, :])
    coeff = psi @ np.asarray(D.y) / 256  # (1/M) Σ_x ψ_k ψ_l = δ_kl on the grid, k + l < M
    expect = np.where(k <= 64, k**-1.5, 0.0)
    assert np.allclose(coeff, expect, atol=1e-12)


def test_digits_parity_is_standardised_odd_vs_even():
    from sklearn.datasets import load_digits

    D = digits_parity()
    d = load_digits()
    assert D.X.shape == (1797, 64)
    assert np.array_equal(np.asarray(D.y) > 0, d.target % 2 == 1)
    std = np.asarray(D.X).std(0)
    assert np.allclose(np.asarray(D.X).mean(0), 0, atol=1e-12) and np.allclose(std[std > 0], 1)
    img, seq = digits_parity(layout="image", m=100, seed=1), digits_parity(layout="sequence", m=100, seed=1)
    assert img.X.shape == (100, 8, 8) and np.array_equal(seq.X[:, :, 2], img.X[:, 2, :])  # token n = row n


def test_teacher_stream_labels_by_the_teacher():
    stream = teacher_student_stream(seed=0)
    X, y = stream(KEY, 500)
    assert X.shape == (500, 20) and y.shape == (500,)
    assert np.allclose(y, outputs(stream.teacher, X), atol=0, rtol=0)
    pre = np.asarray(X) @ np.asarray(stream.teacher.W[:20])
    assert 0.5 < pre.std() < 2  # LeCun scale: O(1) pre-activations
    X2, _ = stream(KEY, 500)
    assert np.array_equal(X, X2)


def test_teacher_stream_readout_scale():
    base, wide = teacher_student_stream(20, 100, seed=3), teacher_student_stream(20, 100, seed=3, readout_scale=1.0)
    Wb, Ww = np.asarray(base.teacher.W), np.asarray(wide.teacher.W)
    np.testing.assert_array_equal(Ww[:20], Wb[:20])  # input weights untouched
    np.testing.assert_allclose(Ww[20:], Wb[20:] * 10.0, rtol=1e-14)  # readout: 1/√100 → 1
    with pytest.raises(lvflow.LvflowError, match="readout_scale"):
        teacher_student_stream(readout_scale=-1.0)


@pytest.mark.bad_input
def test_data_errors():
    net = ARCHS["mlp"]
    with pytest.raises(lvflow.LvflowError, match="s: singular values must be positive"):
        low_rank_teacher(net, 20, s=(1.0, 0.0))
    with pytest.raises(lvflow.LvflowError, match="rank 5 exceeds"):
        low_rank_teacher(net, 20, s=(1, 1, 1, 1, 1))
    with pytest.raises(lvflow.LvflowError, match="m: 3 samples do not identify"):
        low_rank_teacher(net, 3)
    with pytest.raises(lvflow.LvflowError, match="no low-rank teacher"):
        low_rank_teacher(arch.QuadraticNet(3, 2, key=KEY), 20, s=(1.0,))
    with pytest.raises(lvflow.LvflowError, match="seq_len"):
        low_rank_teacher(ARCHS["qk"], 20)
    with pytest.raises(lvflow.LvflowError, match="seed"):
        gaussian_inputs(net, 5, seed=-1)
    with pytest.raises(lvflow.LvflowError, match="m:"):
        gaussian_inputs(net, 0)
    with pytest.raises(lvflow.LvflowError, match="layout"):
        digits_parity(layout="grid")
    with pytest.raises(lvflow.LvflowError, match="M:"):
        fourier_task(M=0)


def test_gaussian_inputs_of_deep_models_and_twins():
    """Deep models and NQF twins draw the inputs of their (first) network: its `sample_shape`."""
    deep_mlp = lvflow.DeepMLP(5, (3, 4, 2), 2, key=KEY)
    deep_att = lvflow.DeepAttention(5, 2, 3, 2, 4, key=KEY)
    assert gaussian_inputs(deep_mlp, 7).shape == (7, 5)
    assert gaussian_inputs(deep_att, 7, seq_len=3).shape == (7, 5, 3)
    assert gaussian_inputs(lvflow.nqf_twin(deep_att, seq_len=3), 7, seq_len=3).shape == (7, 5, 3)
    assert gaussian_inputs(NQFModel(ARCHS["cnn"], "structure"), 2).shape == (2, 3, 4)
    np.testing.assert_array_equal(gaussian_inputs(deep_mlp, 4, seed=1), gaussian_inputs(ARCHS["mlp"], 4, seed=1))
    with pytest.raises(lvflow.LvflowError, match="seq_len: required"):
        gaussian_inputs(deep_att, 7)
    with pytest.raises(lvflow.LvflowError, match="model: cannot infer the input shape of a TeacherStream"):
        gaussian_inputs(teacher_student_stream(), 3)
