"""`predict`'s validity horizon (issue 31): Thm 13's next term over the NQF's output along the
predicted `M(t)`, against `lvflow.nqf_horizon` on an `M` path computed here by gradient descent's
exact map of `M` (Thm 2) in numpy."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _cli import main
from scipy.integrate import solve_ivp

import lvflow
from lvflow.architectures import MLP, AbstractSumForm

M_SAMPLES, N_IN, WIDTH, STD, LR = 40, 3, 8, 0.1, 0.1


def _data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((M_SAMPLES, N_IN))
    y = np.tanh(2 * X[:, 0] - X[:, 1]) + 0.3 * X[:, 2]
    return X, y


def _structure(X):
    """The MLP's `A(x) = ½ [[0, x], [xᵀ, 0]]` in the neuron `w = (u, v)` (Table 3, `φ'(0) = 1`)."""
    p = X.shape[1] + 1
    A = np.zeros((X.shape[0], p, p))
    A[:, :-1, -1] = A[:, -1, :-1] = X / 2
    return A


def _gd_path(A, y, M0, lr, steps):
    """`M` after each of `steps` (sorted) steps of `M ← (I − ηH) M (I − ηH)`, `H = (4/m) Σ Δ_μ A_μ`."""
    M, out, n = M0.copy(), [], 0
    for target in steps:
        while n < target:
            delta = np.einsum("ij,mij->m", M, A) - y
            P = np.eye(len(M)) - lr * 4 / len(y) * np.einsum("m,mij->ij", delta, A)
            M, n = P @ M @ P, n + 1
        out.append(M.copy())
    return np.asarray(out)


def _predict(X, y, activation=jnp.tanh, **kw):
    net = MLP(N_IN, WIDTH, activation=activation, key=jax.random.PRNGKey(0))
    nqf = lvflow.nqf_from_data("mlp", {"x": X, "y": y})
    return lvflow.predict(nqf, init_std=STD, width=WIDTH, learning_rate=LR, network=net, inputs=X, **kw), net


@pytest.fixture(scope="module")
def tanh_prediction():
    """One prediction shared by the tests (its compilations are most of their time)."""
    return _predict(*_data())


def test_horizon_equals_nqf_horizon_on_the_gd_path(tanh_prediction):
    X, y = _data()
    pred, net = tanh_prediction
    h = pred.horizon
    assert h is not None and h.order == 4 and h.width == WIDTH and h.fraction == 0.1
    A = _structure(X)
    np.testing.assert_allclose(jax.vmap(net.structure)(jnp.asarray(X)), A, atol=1e-15)
    steps = np.round(np.asarray(h.times) / LR).astype(int)
    np.testing.assert_allclose(steps * LR, h.times, rtol=1e-12)  # GD's own steps
    Ms = _gd_path(A, y, WIDTH * STD**2 * np.eye(N_IN + 1), LR, steps)
    ref = lvflow.nqf_horizon(net, X, M=Ms, times=h.times, width=WIDTH)
    np.testing.assert_allclose(h.ratio, ref.ratio, rtol=1e-6)
    assert math.isfinite(h.t) and h.t == pytest.approx(ref.time, rel=1e-6)
    # the probed times start where the loss has fallen by 1 % of its fall, and reach the end
    loss, ts = np.asarray(pred.loss), np.asarray(pred.ts)
    start = np.interp(h.times[0], ts, loss)
    assert loss[0] - start >= 0.01 * (loss[0] - loss.min()) and h.times[-1] == ts[-1]
    assert 2 <= len(h.times) <= 24
    # the report, the JSON and the plot
    text = pred.summary()
    assert f"the NQF describes this network up to about step {h.t / LR:.4g}" in text
    assert "reaches 10 % of the NQF's output" in text
    d = json.loads(pred.to_json())["horizon"]
    assert d["step"] == pytest.approx(h.t / LR) and d["order"] == 4 and d["fraction"] == 0.1
    assert d["first"] in ("floor", "horizon")


def test_plot_shades_beyond_the_horizon(tmp_path, tanh_prediction):
    pred, _ = tanh_prediction
    assert math.isfinite(pred.horizon.t)
    assert pred.plot(tmp_path / "h.png").stat().st_size > 0


def test_linear_mlp_and_gLV_have_no_horizon():
    X, y = _data()
    pred, _ = _predict(X, y, activation=lambda z: z)
    assert pred.horizon is None
    assert "describes this network" not in pred.summary()
    assert json.loads(pred.to_json())["horizon"] is None
    lv = lvflow.LotkaVolterra(np.array([1.0, 0.5]), np.diag([1.0, 2.0]), y2=1.0)  # a gLV has no network
    with pytest.raises(lvflow.LvflowError, match="network"):
        lvflow.predict(lv, eps=1e-4, network=MLP(N_IN, 2, key=jax.random.PRNGKey(0)), inputs=X)


def test_network_must_match_the_nqf():
    X, y = _data()
    nqf = lvflow.nqf_from_data("mlp", {"x": X, "y": y})
    net = MLP(N_IN, 4, key=jax.random.PRNGKey(0))
    with pytest.raises(lvflow.LvflowError, match="inputs"):
        lvflow.predict(nqf, eps=1e-3, network=net)
    with pytest.raises(lvflow.LvflowError, match="inputs: 39 samples"):
        lvflow.predict(nqf, eps=1e-3, network=net, inputs=X[:-1])
    with pytest.raises(lvflow.LvflowError, match="differs from the NQF's"):
        lvflow.predict(nqf, eps=1e-3, network=net, inputs=2 * X)
    with pytest.raises(lvflow.LvflowError, match="horizon_fraction"):
        lvflow.predict(nqf, eps=1e-3, network=net, inputs=X, horizon_fraction=0.0)


def test_cli_prints_the_horizon(tmp_path, capsys, tanh_prediction):
    X, y = _data()
    np.savez(tmp_path / "xy.npz", x=X, y=y)
    args = ["predict", "--architecture", "mlp", "--data", tmp_path / "xy.npz", "--init-std", STD]
    args += ["--width", WIDTH, "--lr", LR, "--quiet", "--save", tmp_path / "out.json"]
    assert main(list(map(str, args))) == 0
    out = capsys.readouterr().out
    assert "the NQF describes this network up to about step" in out and "of order 4" in out
    pred, _ = tanh_prediction
    saved = json.loads((tmp_path / "out.json").read_text())["horizon"]
    assert saved["step"] == pytest.approx(pred.horizon.t / LR, rel=1e-9)
    assert main(list(map(str, [*args, "--no-horizon"]))) == 0
    assert "describes this network" not in capsys.readouterr().out


class _SquashedDiagonal(AbstractSumForm):
    """`f_x(W) = Σ_i Σ_j x_j tanh(W_ji)²`: `A(x) = diag(x)` (commuting), next term `−(2/3) Σ x_j w_j⁴`."""

    W: jax.Array

    def unit(self, w, x):
        return jnp.sum(x * jnp.tanh(w) ** 2)

    def __call__(self, x):
        return jnp.sum(jax.vmap(lambda w: self.unit(w, x), in_axes=1)(self.W))


def test_horizon_on_commuting_data_follows_the_flow_of_M():
    """Structure matrices `diag(x_μ)` (they commute; orthogonal inputs make `C` diagonal): `predict`
    reduces to the gLV (Assumption 1), and its horizon is `nqf_horizon` on the flow
    `Ṁ = −(HM + MH)` (Eq. 28), integrated here by scipy."""
    p = 3
    X = np.kron(np.eye(p), np.array([[1.0], [0.5], [2.0]]))  # 9 samples, one coordinate each
    y = X @ np.array([3.0, 2.0, 1.0]) * 0.4
    nqf = lvflow.NQF(np.stack([np.diag(x) for x in X]), y)
    net = _SquashedDiagonal(jnp.zeros((p, WIDTH)))
    pred = lvflow.predict(nqf, init_std=STD, width=WIDTH, learning_rate=LR, network=net, inputs=X)
    assert pred.method == "lv"
    h = pred.horizon
    assert h.order == 4

    def flow(t, m):
        M = m.reshape(p, p)
        H = np.diag(4 / len(y) * X.T @ (X @ np.diag(M) - y))
        return (-(H @ M + M @ H)).ravel()

    M0 = WIDTH * STD**2 * np.eye(p)
    sol = solve_ivp(flow, (0, float(h.times[-1])), M0.ravel(), t_eval=np.asarray(h.times), rtol=1e-11, atol=1e-14)
    ref = lvflow.nqf_horizon(net, X, M=sol.y.T.reshape(-1, p, p), times=h.times, width=WIDTH)
    np.testing.assert_allclose(h.ratio, ref.ratio, rtol=1e-5)
    assert math.isfinite(h.t) and h.t == pytest.approx(ref.time, rel=1e-5)


def test_the_horizon_adds_two_compiled_programs():
    """The horizon costs `lvflow predict` two programs (the network check, the ratio along the
    trajectory), however many probe times: no program per eager slice or array conversion (each
    one's tracing and lowering is paid in every fresh process)."""
    lowered = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            lowered.append(duration)

    rng = np.random.default_rng(5)
    X = rng.standard_normal((29, 5))  # shapes no other test uses
    y = np.tanh(X @ rng.standard_normal(5))
    net = MLP(5, WIDTH, key=jax.random.PRNGKey(0))
    nqf = lvflow.nqf_from_data("mlp", {"x": X, "y": y})
    counts = []
    for kw in ({}, {"network": net, "inputs": X}):
        jax.monitoring.register_event_duration_secs_listener(listen)
        try:
            pred = lvflow.predict(nqf, init_std=STD, width=WIDTH, learning_rate=LR, **kw)
            pred.summary()
        finally:
            jax.monitoring.unregister_event_duration_listener(listen)
        counts.append(len(lowered))
    assert pred.horizon is not None and pred.horizon.ratio.shape[0] > 1
    assert counts[1] - counts[0] <= 2, counts
