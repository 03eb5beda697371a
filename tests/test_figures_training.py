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
        with jax.numpy_dtype_promotion("standard"):  # optax mixes its int32 count with floats
            u, state = opt.update(jax.grad(loss)(W), state, W)
        W = W + u
    for j, o in enumerate(opts):  # each pair of slices alone, by its own optimiser
        sl = slice(2 * j, 2 * j + 2)
        Wj, sj = W0[sl], o.init(W0[sl])
        lj = lambda V: jnp.sum((jnp.tanh(jnp.einsum("nij,nj->ni", A[sl], V)) - target[sl]) ** 2)
        for _ in range(steps):
            with jax.numpy_dtype_promotion("standard"):
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_fig2_single_qk_head_under_the_other_reading_of_s():
    # The paper's teacher "singular values s" read two ways: the figure's (Θ*'s singular values, so
    # M* = Z Zᵀ has eigenvalues 2s) and the other (M*'s eigenvalues s, Θ*'s singular values s/2),
    # checked here on the teacher's own neurons Z by numpy
    from lvflow import low_rank_teacher

    a = fig2._archs()["qk"]
    net = a.build(0.01, KEY)
    for r, factor in (("theta", 2.0), ("M", 1.0)):
        Z = np.asarray(low_rank_teacher(net, 100, s=fig2.READINGS[r], seq_len=fig2.N_TOKENS, seed=1).Z)
        top = np.sort(np.linalg.eigvalsh(Z @ Z.T))[::-1][: len(fig2.S)]
        assert np.allclose(top, factor * np.asarray(fig2.S), rtol=1e-10), (r, top)
    # under the other reading the teacher is half as large, and the gap (0.127–0.133 at this size under
    # the figure's reading, test above) is more than halved
    R = fig2.run_architecture(a, m=100, records=20, s=fig2.READINGS["M"])
    assert np.all(R["gap"][:, 0] < 0.065), R["gap"]
    # a claim holds where it holds under at least one reading, and its verdict names which
    v = fig2._reading_verdict({"theta": 0.158, "M": 0.048}, {"theta": False, "M": True}, "max", 0.05)
    assert v.startswith("holds only under the reading s = eigenvalues of M*") and "theta: 0.158, M: 0.048" in v


@pytest.mark.slow
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
        # "at about step 100" as a function of our 10 % gap: the step from which the gap stays above a
        # threshold cannot come earlier for a larger threshold (staying above 20 % implies above 10 %)
        about = claims[f"{label}: the departure comes at about step 100"]
        d = about["measured"]["departure_step_by_threshold"]
        assert d["0.1"] == about["measured"]["departure_step"]
        found = [d[k] for k in ("0.05", "0.1", "0.2") if d[k] is not None]
        assert found == sorted(found)
        assert "at our 10% gap and window [50, 200]" in about["verdict"] and f"5%: {d['0.05']}" in about["verdict"]
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
    one, mismatch = fig8.matched_one_layer("attention", deep, Xtr)
    assert mismatch < 1e-12  # the one-layer NQF starts on the network's end-to-end linear map
    # ... which, independently, is Θ₁Θ₂ of the blocks' learned maps (Wᴠᵀ v of each head)
    theta = np.asarray(deep.blocks[0].learned_map() @ deep.blocks[1].learned_map())[:, 0]
    assert np.allclose(np.asarray(one.network.learned_map())[:, 0], theta, rtol=1e-10, atol=1e-14)


def _taylor2(block, x):
    """The second-order term of `block(x)` in its own weights about `W = 0`, `½ d²/dt² block(tW)(x)`
    at `t = 0`, by nested `jax.jvp` (the zeroth and first orders vanish: ZGZ)."""
    g = lambda t: eqx.tree_at(lambda b: b.W, block, t * block.W)(x)
    dg = lambda t: jax.jvp(g, (t,), (1.0,))[1]
    return 0.5 * jax.jvp(dg, (0.0,), (1.0,))[1]


def test_fig8_two_layer_nqf_keeps_tanh_between_the_blocks():
    # Def 2: block 2's structure matrix reads φ(h) of block 1. The 2-layer NQF is then the composition
    # of the blocks' second-order Taylor terms through tanh, computed here by jax.jvp on the real blocks.
    fig8 = importlib.import_module("lvflow._figures.fig8")
    (Xtr, _), _ = fig8.data("mlp", n_test=1)
    X = Xtr[:6]
    deep = fig8._arch("mlp", 0.05, KEY)
    two, _ = fig8.two_layer_nqf(deep, X)
    lin, _ = fig8.two_layer_nqf(deep, X, keep_activation=False)
    b1, b2 = deep.blocks
    by_jvp = jax.vmap(lambda x: _taylor2(b2, jnp.tanh(_taylor2(b1, x))))(X)
    assert _rel(jax.vmap(two)(X), by_jvp) < 1e-12
    # the linearised link is a linear map of x (the 1-layer NQF's function class); the Def 2 one is not
    assert _rel(jax.vmap(lin)(2 * X), 2 * jax.vmap(lin)(X)) < 1e-12
    assert _rel(jax.vmap(two)(2 * X), 2 * jax.vmap(two)(X)) > 0.05
    # at small weights the real network approaches it: error/|f| = O(t²) as all weights scale by t
    small = lambda m, t: jax.tree_util.tree_map(lambda a: a * t if eqx.is_inexact_array(a) else a, m)
    errs = [_rel(jax.vmap(small(deep, t))(X), jax.vmap(small(two, t))(X)) for t in (0.1, 0.01)]
    assert 80 < errs[0] / errs[1] < 120, errs
    # the step-0 offset at the paper's variance 0.05 is the init scale, not a mismatch of the twin:
    # block 1's pre-activations W₁x have RMS ≈ 0.61 (σ √8 for unit inputs), where tanh is ~10 % off linear
    off = fig8.initial_offset(deep, two, X)
    u = np.asarray(X) @ np.asarray(b1.W[:8])
    assert off["rms_first_preactivation"] == pytest.approx(np.sqrt(np.mean(u**2)), rel=1e-12)
    h_net = np.asarray(jax.vmap(b1)(X))
    h_two = np.asarray(jax.vmap(lambda x: _taylor2(b1, x))(X))
    assert off["block1_rel_diff"] == pytest.approx(np.linalg.norm(h_net - h_two) / np.linalg.norm(h_net), rel=1e-9)
    assert (
        off["block1_rel_diff"] > 0.2
        and fig8.initial_offset(small(deep, 0.1), small(two, 0.1), X)["block1_rel_diff"] < 0.01
    )


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.slow
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
    # the MLP at the paper's variance 0.05 is not in its NQF regime: the 2-layer claim does not hold at
    # our 10 % bound, and the verdict says so, with the gap's value at step 0 (before any training):
    # |L_net(0) − L_2NQF(0)| / L_net(0), recomputed here from the initial losses
    assert not two["mlp"]["holds"] and claims[f"{mlp}: ... but not by the 1-layer NQF"]["holds"]
    L0 = S["models"]["mlp"]["initial_train_loss"]["variance=0.05"]
    step0 = abs(L0["network"] - L0["two_layer_nqf"]) / L0["network"]
    assert two["mlp"]["measured"]["gap_at_step0"] == pytest.approx(step0, rel=1e-9)
    g = max(two["mlp"]["measured"]["train_gap"].values())
    assert two["mlp"]["verdict"] == (
        f"fails at our 10% bound (max gap {g:.3f}, of which {step0:.3f} at step 0); holds for any bound ≥ {g:.3f}"
    )
    for m in S["models"].values():
        for k, v in m["checks"].items():
            assert v < 1e-12, k
