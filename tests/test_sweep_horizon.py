"""`lvflow sweep`'s validity horizon (issue 31): per configuration of an architecture on data, the
horizon `predict` reports for the same configuration (the sweep reads it off its own batched
solve; the reference here is one `predict` call per configuration); NaN for other systems."""

import json

import jax
import numpy as np

import lvflow
from lvflow import architectures


def test_sweep_horizon_is_predicts(tmp_path):
    # one-feature data: the MLP's A_μ = x_μ [[0, 1], [1, 0]]/2 commute, so its NQF reduces to a gLV
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 1))
    y = np.tanh(2 * x[:, 0])
    np.savez(tmp_path / "xy.npz", x=x, y=y)
    res = lvflow.sweep(
        [
            {"architecture": "mlp", "data": str(tmp_path / "xy.npz"), "eps": [1e-4, 1e-6], "lr": 0.1},
            {"alpha1": 2.0, "alpha2": 0.8, "modes": 3, "eps": 1e-4},
        ],
        out=tmp_path / "sweep",
        progress=False,
    )
    nqf = lvflow.nqf_from_data("mlp", {"x": x, "y": y})
    network = architectures.MLP(1, nqf.p, key=jax.random.PRNGKey(0))
    rows = json.loads((tmp_path / "sweep" / "summary.json").read_text())["rows"]
    for i, eps in enumerate((1e-4, 1e-6)):
        h = lvflow.predict(nqf, eps=eps, learning_rate=0.1, network=network, inputs=x).horizon
        assert np.isfinite(h.t) and h.t > 0
        np.testing.assert_allclose(res["horizon_t"][i], h.t, rtol=1e-12)
        np.testing.assert_allclose(res["horizon_step"][i], h.t / 0.1, rtol=1e-12)
        np.testing.assert_allclose(res["horizon_floor_t"][i], h.floor_t, rtol=1e-12)
        assert rows[i]["horizon_t"] == res["horizon_t"][i]  # the JSON key
    assert np.isnan(res["horizon_t"][2]) and np.isnan(res["horizon_step"][2])  # a power law has no network
    # the curve the horizon is read from stays out of a sweep without curves
    assert not {"ts", "excess_loss", "loss", "zs", "n_drops"} & set(res.columns)
    again = lvflow.sweep(
        {"architecture": "mlp", "data": str(tmp_path / "xy.npz"), "eps": 1e-4}, horizon=False, curve=True
    )
    assert "horizon_t" not in again.columns and "ts" in again.columns
