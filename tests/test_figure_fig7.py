"""Fig 7 (real data): the paper's architectures on the digits upsampled to 28×28, the NQF twins
against `lvflow.nqf_twin`, and the paper's claim (indistinguishable training loss and test
accuracy) checked at a reduced size."""

import json

import numpy as np
import pytest

from lvflow import architectures as arch
from lvflow._figures import fig7


def test_upsampling_is_linear_interpolation():
    R = fig7.upsample_matrix(8, 28)
    assert R.shape == (28, 8) and np.allclose(R.sum(1), 1.0) and np.all(R >= 0)
    v = np.random.default_rng(0).standard_normal(8)
    # against numpy's own interpolation on the same grid, end points aligned
    assert np.allclose(R @ v, np.interp(np.linspace(0, 7, 28), np.arange(8), v), atol=1e-14)
    (Xtr, ytr), (Xte, yte) = fig7.digits_28(n_train=50, n_test=20)
    assert Xtr.shape == (50, 28, 28) and Xte.shape == (20, 28, 28) and set(np.unique(ytr)) <= {-1.0, 1.0}


def test_the_papers_architectures():
    m = fig7._models()
    assert isinstance(m["mlp"], arch.MLP) and (m["mlp"].in_size, m["mlp"].d, m["mlp"].out_size) == (784, 20, None)
    cnn = m["cnn"]
    assert (cnn.input_shape, cnn.kernel_shape, cnn.d, cnn.out_size) == ((28, 28), (15, 15), 50, None)
    att = m["attention"]  # a fixed readout vector, 10 heads, d_k = 32, 28 tokens of dimension 28
    assert isinstance(att, arch.QKAttention) and (att.in_size, att.key_size, att.d) == (28, 32, 10)
    assert att.readout.shape == (28,)
    for net in m.values():  # N(0, ε²), ε = 0.01
        assert abs(float(np.std(np.asarray(net.W))) / fig7.EPS - 1) < 0.05


def test_cnn_on_originals_is_the_cnn_on_the_upsampled_images():
    # the figure's CNN reads the 8×8 originals through its pulled-back kernels; against the CNN
    # written out in numpy (correlation over every 15×15 patch of R X Rᵀ, tanh, sum pool, readout)
    # at a generic W of scale 0.05 (tanh curved), and against the architecture itself
    cnn = fig7._models()["cnn"]
    W = 0.05 * np.random.default_rng(1).standard_normal(np.shape(cnn.W))
    (X8, _), _ = fig7.digits_28(n_train=3, n_test=1, originals=True)
    (X28, _), _ = fig7.digits_28(n_train=3, n_test=1)
    R = fig7.upsample_matrix(8, 28)
    assert np.allclose(np.einsum("ia,mab,jb->mij", R, X8, R), X28, rtol=0, atol=1e-14)
    K, v = W[:225].T.reshape(50, 15, 15), W[225]
    h = np.array(
        [
            [[[np.sum(K[c] * X[i : i + 15, j : j + 15]) for j in range(14)] for i in range(14)] for c in range(50)]
            for X in X28
        ]
    )
    want = np.tanh(h).sum(axis=(2, 3)) @ v
    got = np.asarray(fig7.cnn_on_originals(cnn, W, X8, R))
    assert np.max(np.abs(got - want)) < 1e-12 * np.max(np.abs(want))
    arch_out = np.asarray([fig7.with_W(cnn, W)(X) for X in X28])
    assert np.max(np.abs(got - arch_out)) < 1e-12 * np.max(np.abs(want))


def test_mlp_nqf_is_a_linear_model_bounded_by_least_squares():
    (Xtr, ytr), _ = fig7.digits_28(n_train=120, n_test=40)
    R = fig7.run_model("mlp", fig7._models()["mlp"], n_train=120, n_test=40, steps=80, every=4)
    assert R["checks"]["nqf"] < 1e-12 and R["checks"]["network"] < 1e-12
    # the MLP's NQF is x ↦ xᵀ U v, a linear model: its training loss never goes below the
    # least-squares linear fit (numpy), whatever Adam does
    X = Xtr.reshape(120, -1)
    w = np.linalg.lstsq(X, ytr, rcond=None)[0]
    floor = float(np.mean((X @ w - ytr) ** 2))
    assert np.all(R["loss_train"][:, 1] >= floor - 1e-9)
    assert R["loss_train"][0, 0] == pytest.approx(R["loss_train"][0, 1], rel=1e-3)  # same weights at step 0


def test_run_length_verdict_by_hand():
    # a gap growing linearly to 0.1 over 1000 steps, against a bound of 0.05: it holds up to step 500
    # (over 200 and 500 steps, not over 1000), at twice the bound over the whole run, and over the
    # whole run for a bound ≥ 0.1
    steps = np.arange(0, 1001, 10)
    line, by = fig7.run_length_verdict(steps, 0.1 * steps / 1000, 0.05)
    assert by == {200: True, 500: True, 1000: False}
    assert line == (
        "fails over our 1000 steps: holds up to step 500 at our bound 0.05; at 2× that bound (0.1) up to "
        "step 1000 (the whole run); over the whole run for a bound ≥ 0.1"
    )
    # a gap of 0.3 from step 10 on: at 0.05 it holds only at step 0, at 0.1 too
    line, _ = fig7.run_length_verdict(steps, np.where(steps > 0, 0.3, 0.0), 0.05, unit=" × L(0)")
    assert "holds up to step 0 at our bound 0.05 × L(0); at 2× that bound (0.1 × L(0)) up to step 0;" in line
    line, _ = fig7.run_length_verdict(steps, np.full(steps.shape, 0.3), 0.05)
    assert "fails from step 0 at our bound 0.05; at 2× that bound (0.1) fails from step 0;" in line


def test_performance_verdict_by_hand():
    # final accuracies 96.3 % and 89.9 % (6.4 points): fails at 5 points, holds at 10
    ok, line = fig7.performance_verdict((0.963, 0.899), (0.02, 0.3), 0.05)
    assert not ok
    assert line == (
        "fails at our bound of 5 points: final test accuracy 96.3 % (network) vs 89.9 % (NQF), 6.4 points apart; "
        "final training loss 0.02 vs 0.3 (NQF/network 15×); at 2× that bound (10 points) holds; "
        "holds for a bound ≥ 6.4 points"
    )
    assert fig7.performance_verdict((0.80, 0.78), (0.3, 0.6), 0.05)[0]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig7")
    return out, fig7.make(out, quick=True)


@pytest.mark.slow
def test_quick_files_and_claims(quick):
    out, S = quick
    for ext in ("png", "pdf", "json"):
        assert (out / f"fig7.{ext}").stat().st_size > 1000
    assert json.loads((out / "fig7.json").read_text())["figure"] == "fig7"
    assert len(S["claims"]) == 9 and "MNIST" in S["deviations"]["data"]
    for name, c in zip(S["models"], S["claims"][2::3]):  # "similar performance": the final accuracies, recomputed
        m, M = c["measured"], S["models"][name]
        assert "similar performance" in c["claim"] and m["final_test_accuracy"] == M["final_test_accuracy"]
        d = abs(M["final_test_accuracy"]["network"] - M["final_test_accuracy"]["nqf"])
        assert m["final_test_accuracy_gap"] == pytest.approx(d) and c["holds"] == (d <= fig7.PERF_GAP)
        assert (
            c["verdict"].startswith("holds" if c["holds"] else "fails")
            and f"{100 * d:.1f} points apart" in c["verdict"]
        )
    for c in S["claims"][0::3] + S["claims"][1::3]:
        m = c["measured"]
        bound = fig7.LOSS_GAP if "training-loss" in c["claim"] else fig7.ACC_GAP
        gap = m["max_gap_rel_to_initial_loss"] if "training-loss" in c["claim"] else m["max_gap"]
        assert c["holds"] == (gap <= bound)
        # the verdict as a function of our run length: over the first N steps it holds exactly when the
        # step up to which it holds (found from the first failing record) is at least N
        until = m["holds_until_step"]
        assert sorted(m["holds_by_run_length"]) == [24, 60, 120]
        for n, ok in m["holds_by_run_length"].items():
            assert ok == (until is not None and until >= n), (c["claim"], n)
        assert c["verdict"].startswith(("holds" if c["holds"] else "fails") + " over our 120 steps: ")
        # at twice the bound it holds at least as long
        twice = m["holds_until_step_at_twice_the_bound"]
        assert until is None or (twice is not None and twice >= until)
    for name, M in S["models"].items():
        for k, v in M["max_rel_err_fast_vs_architecture"].items():
            assert v < 1e-12, (name, k)
    # by the end of the reduced run the MLP has left its NQF behind in training loss (the network
    # is no longer the linear model its NQF is): the paper's claim does not hold at this length
    mlp = S["models"]["mlp"]
    assert mlp["final_train_loss"]["network"] < 0.5 * mlp["final_train_loss"]["nqf"]
