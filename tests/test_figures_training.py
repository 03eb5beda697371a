"""The training figures (Fig 2, 6, 7, 8): their fast NQF twin against `nqf_twin` and the closed-form
structure matrices, the per-slice optimiser against separate optimisers and a numpy heavy-ball
loop, and the figures' summaries (network vs NQF at small and large init)."""

import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lvflow import architectures as arch
from lvflow._figures import _bilinear, _bundle, fig2

KEY = jax.random.PRNGKey(0)


@pytest.mark.parametrize(
    "net, shape",
    [
        (arch.MLP(5, 7, 3, key=KEY, init_scale=0.4), (5,)),
        (arch.MLP(5, 7, None, key=KEY, init_scale=0.4), (5,)),
        (arch.CNN((4, 5), (2, 3), 6, 2, key=KEY, init_scale=0.4), (4, 5)),
        (arch.MultiHeadAttention(4, 2, 3, 3, 2, key=KEY, init_scale=0.4), (4, 6)),
        (arch.MultiHeadAttention(4, 2, 3, 3, None, key=KEY, init_scale=0.4), (4, 6)),
        (arch.QKAttention(4, 2, 3, 2, key=KEY, init_scale=0.4), (4, 6)),
        (arch.QKAttention(4, 2, 3, None, key=KEY, init_scale=0.4), (4, 6)),
    ],
)
def test_bilinear_twin_is_the_quadratic_form_of_the_structure_matrix(net, shape):
    X = np.random.default_rng(1).standard_normal((3,) + shape)
    W = np.asarray(net.W)
    for x in X:
        direct = np.einsum("...ij,id,jd->...", np.asarray(net.structure(x)), W, W)  # Tr[Wᵀ A(x) W] (Eq. 2)
        fast = np.asarray(_bilinear.BilinearTwin(net)(x))
        assert fast.shape == direct.shape
        assert np.max(np.abs(fast - direct)) <= 1e-12 * np.max(np.abs(direct))
    assert _bilinear.twin_check(net, X) < 1e-12  # against lvflow.nqf_twin at another W


def test_sliced_optimiser_equals_separate_runs_and_numpy_heavy_ball():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((6, 4, 4))
    target = rng.standard_normal((6, 4))
    loss = lambda W: jnp.sum((jnp.tanh(jnp.einsum("nij,nj->ni", A, W)) - target) ** 2)  # separable over slices
    W0 = jnp.asarray(0.3 * rng.standard_normal((6, 4)))
    lr, beta, steps = 0.01, 0.9, 25
    opts = [optax.sgd(lr), optax.sgd(lr, momentum=beta), optax.adam(0.02)]
    opt = _bundle.sliced(opts, reps=2)
    W, state = W0, opt.init(W0)
    for _ in range(steps):
        u, state = opt.update(jax.grad(loss)(W), state, W)
        W = W + u
    for j, o in enumerate(opts):  # each pair of slices alone, by its own optimiser
        sl = slice(2 * j, 2 * j + 2)
        Wj, sj = W0[sl], o.init(W0[sl])
        lj = lambda V: jnp.sum((jnp.tanh(jnp.einsum("nij,nj->ni", A[sl], V)) - target[sl]) ** 2)
        for _ in range(steps):
            u, sj = o.update(jax.grad(lj)(Wj), sj, Wj)
            Wj = Wj + u
        assert np.max(np.abs(np.asarray(W[sl] - Wj))) < 1e-14
    # heavy ball by hand: W_{t+1} = W_t − lr g_t + β (W_t − W_{t−1})
    g = jax.grad(loss)
    Wp, Wc = np.asarray(W0), np.asarray(W0)
    for _ in range(steps):
        Wp, Wc = Wc, Wc - lr * np.asarray(g(jnp.asarray(Wc))) + beta * (Wc - Wp)
    assert np.max(np.abs(Wc[2:4] - np.asarray(W[2:4]))) < 1e-12


def test_fig2_mlp_tracks_its_nqf_at_small_init_and_departs_at_large():
    a = fig2._archs()["mlp"]
    R = fig2.run_architecture(a, m=100, records=40)
    gap = R["gap"]  # (optimiser, init)
    assert np.all(gap[:, 0] <= fig2.SMALL_INIT_BOUND), gap
    assert np.all(gap[:, 1] >= 5 * gap[:, 0]), gap
    # the NQF learns the teacher: ŝ_k/s_k → 1 for every optimiser from small init
    assert np.allclose(R["s_hat_nqf"][-1, :, 0], 1.0, atol=0.12), R["s_hat_nqf"][-1, :, 0]  # m = 100: s_4 is slow


def test_fig6_quick_summary(tmp_path):
    S = importlib.import_module("lvflow._figures.fig6").make(tmp_path, quick=True)
    assert (tmp_path / "fig6.png").exists() and (tmp_path / "fig6.pdf").exists()
    assert json.loads((tmp_path / "fig6.json").read_text())["figure"] == "fig6"
    for name, M in S["models"].items():
        assert M["twin_vs_nqf_twin_rel_err"] < 1e-12
        assert M["max_rel_gap_first_100_steps"] < 0.5, (name, M)  # tracks at first ...
        assert M["departure_step"] is not None and M["departure_step"] > 100, (name, M)  # ... departs later
        assert M["loss_final_network"] < M["loss_final_nqf"] < M["loss_initial"]


def test_fig8_deep_attention_follows_the_two_layer_nqf_not_the_one_layer():
    fig8 = importlib.import_module("lvflow._figures.fig8")
    R = fig8._run(fig8._problems()["attention"], m=96, steps=300, every=10)
    assert R["twin_check"] < 1e-12  # the fast two-layer NQF is lvflow's DeepNQF
    L = R["loss"]  # (n, network / 2-layer NQF / 1-layer NQF)
    two, one = (np.max(np.abs(L[:, 0] - L[:, i])) / L[0, 0] for i in (1, 2))
    assert two < 0.05 < 0.3 < one, (two, one)
