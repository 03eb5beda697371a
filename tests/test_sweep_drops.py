"""A sweep's per-configuration drop columns (`n_drops`, `drop{j}_…`) are the drops of that
configuration's own curve by the one definition (`lvflow.loss_drops`), the drops `predict` prints
for the same configuration, and what `summary.json` and the chunk files hold."""

import json
import math

import numpy as np
import pytest
from _cli import main

import lvflow

R3 = np.array([1.0, 0.5, 0.25])
C3 = np.array([[1.0, 0.2, 0.1], [0.2, 1.0, 0.3], [0.1, 0.3, 1.0]])  # coupled, positive definite
LR = 0.05
PER_DROP = ("t", "step", "excess_loss_before", "excess_loss_after", "complete")


def _columns_of(res, i):
    """Row `i`'s drops as the table holds them, `n_drops` entries each (the rest must be padding)."""
    row = res.row(i)
    n = row["n_drops"]
    for j in range(n, 3):
        assert math.isnan(row[f"drop{j + 1}_t"]) and not row[f"drop{j + 1}_complete"]
    return n, {k: np.array([row[f"drop{j + 1}_{k}"] for j in range(min(n, 3))]) for k in PER_DROP}


@pytest.fixture(scope="module")
def swept():
    eps = [1e-8, 1e-5, 1e-3]
    systems = [{"r": R3, "C": np.eye(3)}, {"r": R3, "C": C3}]
    res = lvflow.sweep(
        {"system": systems, "eps": eps, "lr": LR, "points": 120}, curve=True, progress=False, summary=False
    )
    return res, [(s, e) for s in systems for e in eps]


def test_columns_are_loss_drops_of_the_rows_own_curve(swept):
    res, _ = swept
    assert len(res) == 6
    for i in range(len(res)):
        row = res.row(i)
        want = lvflow.loss_drops(np.asarray(row["ts"]), np.asarray(row["excess_loss"]))
        n, got = _columns_of(res, i)
        assert n == len(want) == len(res.drops(i)) >= 1
        m = min(n, 3)
        np.testing.assert_array_equal(got["t"], want.t_mid[:m])
        np.testing.assert_allclose(got["step"], want.t_mid[:m] / LR, rtol=1e-15)
        np.testing.assert_array_equal(got["excess_loss_before"], want.loss_before[:m])
        np.testing.assert_array_equal(got["excess_loss_after"], want.loss_after[:m])
        np.testing.assert_array_equal(got["complete"], want.complete[:m])


def test_columns_are_predicts_drops(swept):
    """The same configuration through `predict`: the same drops (its table reads the loss where
    `y2` is known, the excess loss otherwise; the levels differ by the final loss)."""
    res, configs = swept
    for i, (s, e) in enumerate(configs):
        pred = lvflow.predict(lvflow.LotkaVolterra(s["r"], s["C"]), eps=e, learning_rate=LR, num_points=120)
        rows = pred.drop_rows()
        offset = 0.0
        if pred.drops_of == "loss":
            offset = float(np.asarray(pred.loss)[-1] - np.asarray(pred.excess_loss)[-1])
        n, got = _columns_of(res, i)
        assert n == len(rows)
        for j in range(min(n, 3)):
            assert got["t"][j] == pytest.approx(rows[j]["t"], rel=1e-9)
            assert got["step"][j] == pytest.approx(rows[j]["steps"], rel=1e-9)
            assert got["excess_loss_before"][j] == pytest.approx(rows[j]["loss_before"] - offset, rel=1e-9)
            assert got["excess_loss_after"][j] == pytest.approx(
                rows[j]["loss_after"] - offset, rel=1e-9, abs=1e-12 * got["excess_loss_before"][0]
            )
            assert bool(got["complete"][j]) == rows[j]["complete"]


def test_well_separated_drops_are_the_staircase():
    """Diagonal `C`, modes far apart (ε = 1e-8, r = 1, 1/2, 1/4): each drop removes one mode's
    `V_k = r_k²/8` (Eq. 168), and lies near its closed-form switch-on (Eq. 158)."""
    res = lvflow.sweep(
        {"system": {"r": R3, "C": np.eye(3)}, "eps": 1e-8, "points": 200}, curve=True, progress=False, summary=False
    )
    n, got = _columns_of(res, 0)
    V = R3**2 / 8
    assert n == 3
    np.testing.assert_allclose(got["excess_loss_before"], np.cumsum(V[::-1])[::-1], rtol=0.02)
    np.testing.assert_allclose(got["excess_loss_after"], [V[1] + V[2], V[2], 0.0], rtol=0.02, atol=1e-6)
    t_on = (math.log(1e8) - np.log(1 / (R3 - 1e-8))) / R3  # Eq. 158, ρ = ½, c = 1
    np.testing.assert_allclose(got["t"], t_on, rtol=0.1)
    assert not np.any(np.isfinite(res["drop1_step"]))  # no learning rate: no steps


def test_without_curves_no_drop_columns():
    res = lvflow.sweep({"system": {"r": R3, "C": np.eye(3)}, "eps": 1e-5}, progress=False, summary=False)
    assert "n_drops" not in res.keys() and "drop1_t" not in res.keys()


def test_cli_summary_and_chunks_hold_the_drops(tmp_path, capsys):
    np.savez(tmp_path / "sys.npz", r=R3, C=C3)
    out = tmp_path / "out"
    argv = ["sweep", "--system", str(tmp_path / "sys.npz"), "--eps", "1e-6,1e-4", "--lr", str(LR), "--curve"]
    assert main([*argv, "--points", "80", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    rows = json.loads((out / "summary.json").read_text())["rows"]
    res = lvflow.load_sweep(out)
    with np.load(next(out.glob("chunk-*.npz"))) as z:
        chunk = {k: z[k] for k in z.files}
    for i, row in enumerate(rows):
        d = res.drops(i)
        assert row["n_drops"] == len(d) == chunk["n_drops"][i]
        assert row["drop1_t"] == pytest.approx(d.t_mid[0], rel=1e-15) == chunk["drop1_t"][i]
        assert row["drop1_step"] == pytest.approx(d.t_mid[0] / LR, rel=1e-15)
        assert row["drop1_excess_loss_before"] == pytest.approx(d.loss_before[0], rel=1e-15)
        assert row["drop1_excess_loss_after"] == pytest.approx(d.loss_after[0], rel=1e-15)
