"""The training figures (Fig 2, 6, 7, 8): their fast NQF twin against `nqf_twin` and the closed-form
structure matrices, the per-slice optimiser against separate optimisers and a numpy heavy-ball
loop, and the figures' summaries (network vs NQF at small and large init)."""

import importlib
import json

import equinox as eqx
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
    X = jnp.asarray(np.random.default_rng(1).standard_normal((3,) + shape))
    W = np.asarray(net.W)
    structure = eqx.filter_jit(lambda n, x: n.structure(x))  # compiled once per model (eager ops compile one by one)
    twin = eqx.filter_jit(lambda n, x: _bilinear.BilinearTwin(n)(x))
    for x in X:
        direct = np.einsum("...ij,id,jd->...", np.asarray(structure(net, x)), W, W)  # Tr[Wᵀ A(x) W] (Eq. 2)
        fast = np.asarray(twin(net, x))
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
    assert np.all(gap[:, 0] <= fig2.SMALL_INIT_BOUND), gap  # the paper: "tracks almost exactly"
    assert np.all(gap[:, 1] >= fig2.LARGE_INIT_DEPARTS), gap  # ... "visibly departs" at σ = 0.2
    # the NQF learns the teacher: ŝ_k/s_k → 1 for every optimiser from small init
    assert np.allclose(R["s_hat_nqf"][-1, :, 0], 1.0, atol=0.12), R["s_hat_nqf"][-1, :, 0]  # m = 100: s_4 is slow


def test_fig2_single_qk_head_stalls_outside_its_nqf():
    # App. C: a single query–key-only head (Prop 3), not four
    a = fig2._archs()["qk"]
    net = a.build(0.01, KEY)
    assert isinstance(net, arch.QKAttention) and net.d == 1 and (net.in_size, net.key_size, net.out_size) == (20, 8, 8)
    R = fig2.run_architecture(a, m=100, records=30)
    # the network stalls short of the teacher while its NQF reaches it: the paper's "tracks almost
    # exactly" does not hold for one head, and the reason is measured independently: the network
    # evaluated at the NQF's final weights is > 10 % off the NQF's outputs (the teacher lies outside
    # one head's quadratic regime)
    assert np.all(R["gap"][:, 0] > fig2.SMALL_INIT_BOUND), R["gap"]
    assert np.all(R["net_at_nqf_end"][:, 0] > 0.10), R["net_at_nqf_end"]
    assert np.all(R["s_hat_net"][-1, :, 0, 0] < 0.95) and np.all(R["s_hat_nqf"][-1, :, 0, 0] > 0.97)


def test_fig6_quick_summary(tmp_path):
    fig6 = importlib.import_module("lvflow._figures.fig6")
    # App. C: standard-Gaussian teachers, students from N(0, ε²), ε = 1e-3
    for name in ("mlp", "qk"):
        P = fig6.problem(name, 0)
        W_t = np.asarray(P["stream"].teacher.W)
        assert abs(W_t.std() - 1.0) < 0.1 and abs(np.asarray(P["net"].W).std() - 1e-3) < 2e-4
    assert abs(np.asarray(fig6.problem("qk", 0)["net"].readout).std() - 1.0) < 0.5  # c ~ N(0, I_D), D = 16
    S = fig6.make(tmp_path, quick=True)
    assert (tmp_path / "fig6.png").exists() and (tmp_path / "fig6.pdf").exists()
    assert json.loads((tmp_path / "fig6.json").read_text())["figure"] == "fig6"
    assert S["runs"] == 5
    claims = {c["claim"]: c for c in S["claims"]}
    for name, M in S["models"].items():
        assert M["twin_vs_nqf_twin_rel_err"] < 1e-12
        assert len(M["departure_steps"]) == 5
        # every run departs, and not before the paper's 100 steps ...
        assert all(d is not None and d > 100 for d in M["departure_steps"]), (name, M)
        # ... and the NQF falls behind: it can only learn the part of the teacher it represents
        assert np.mean(M["loss_final_network"]) < np.mean(M["loss_final_nqf"])
        label = fig6.LABELS[name]
        departs = claims[f"{label}: ... and then they become different (within the 1000 steps)"]
        assert departs["holds"] and departs["measured"]["departure_step"] is not None
    # the attention student matches its NQF to < 10 % over the first 100 steps (the paper's claim)
    assert claims[f"{fig6.LABELS['qk']}: network and NQF match for the first 100 steps"]["holds"]


def test_fig8_two_layer_nqf_and_the_matched_one_layer_nqf():
    fig8 = importlib.import_module("lvflow._figures.fig8")
    (Xtr, ytr), (Xte, _) = fig8.data("attention", n_test=10)
    assert Xtr.shape == (200, 8, 10) and Xte.shape == (10, 8, 10)  # App. C: 200 training samples, N = 10
    for name, variances in fig8.VARIANCES.items():
        for v, var in enumerate(variances):
            deep = fig8._arch(name, var, jax.random.PRNGKey(v))
            W = np.concatenate([np.ravel(b.W) for b in deep.blocks])
            assert abs(W.var() / var - 1) < 0.2, (name, var)  # the paper's numbers are variances
    deep = fig8._arch("attention", 0.1, KEY)
    two, err = fig8.two_layer_nqf(deep, Xtr[:8])
    assert err < 1e-12  # the fast two-layer NQF is the composition of the blocks' Tr[Wᵀ A(x) W]
    one, mismatch = fig8.matched_one_layer("attention", two, Xtr)
    assert mismatch < 1e-12  # the one-layer NQF starts on the network's end-to-end linear map
    # ... which, independently, is Θ₁Θ₂ of the blocks' learned maps (Wᴠᵀ v of each head)
    theta = np.asarray(deep.blocks[0].learned_map() @ deep.blocks[1].learned_map())[:, 0]
    assert np.allclose(np.asarray(one.network.learned_map())[:, 0], theta, rtol=1e-10, atol=1e-14)


def test_fig8_quick_claims(tmp_path):
    fig8 = importlib.import_module("lvflow._figures.fig8")
    S = fig8.make(tmp_path, quick=True)
    assert (tmp_path / "fig8.png").exists()
    claims = {c["claim"]: c for c in S["claims"]}
    att, mlp = fig8.LABELS["attention"], fig8.LABELS["mlp"]
    small = lambda name: f"{fig8.LABELS[name]}: under small init (variance {fig8.VARIANCES[name][0]:g}) the training "
    two = {n: [c for k, c in claims.items() if k.startswith(small(n))][0] for n in fig8.VARIANCES}
    # attention: the 2-layer NQF follows the network (the paper's claim), the 1-layer NQF does not
    assert two["attention"]["holds"] and claims[f"{att}: ... but not by the 1-layer NQF"]["holds"]
    for o in fig8.OPTIMISERS:
        g2 = two["attention"]["measured"]["train_gap"][o]
        g1 = claims[f"{att}: ... but not by the 1-layer NQF"]["measured"]["train_gap"][o]
        assert g2 < 0.5 * g1, (o, g2, g1)
    # the MLP at the paper's variance 0.05 is not in its NQF regime: the 2-layer claim does not hold
    assert not two["mlp"]["holds"] and claims[f"{mlp}: ... but not by the 1-layer NQF"]["holds"]
    for m in S["models"].values():
        for k, v in m["checks"].items():
            assert v < 1e-12, k
