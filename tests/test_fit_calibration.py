"""The fit-calibration benchmark (`benchmarks/fit_calibration.py`): its scorer against coverage,
widths and errors computed by hand, its drop detector against Thm 6's staircase written out, the
Domhan et al. baseline against a curve of its own family, and a tiny end-to-end run."""

import math

import numpy as np
import pytest

from benchmarks import fit_calibration as fc


def test_score_interval_by_hand():
    # covered, inside: truth 10 in [5, 20], pred 8
    s = fc.score_interval(10.0, 8.0, 5.0, 20.0)
    assert s["covered"] is True
    assert s["width"] == pytest.approx(math.log10(4.0))
    assert s["error"] == pytest.approx(math.log(10 / 8))
    # the ends count as covered
    assert fc.score_interval(5.0, 8.0, 5.0, 20.0)["covered"] is True
    assert fc.score_interval(20.0, 8.0, 5.0, 20.0)["covered"] is True
    # just outside
    assert fc.score_interval(20.01, 8.0, 5.0, 20.0)["covered"] is False
    assert fc.score_interval(4.99, 8.0, 5.0, 20.0)["covered"] is False
    # a lower end of 0 or an upper end of inf: infinite width, coverage as the bounds say
    s = fc.score_interval(1e-9, 1e-3, 0.0, 1.0)
    assert s["covered"] is True and s["width"] == math.inf
    s = fc.score_interval(3.0, 1.0, 2.0, math.inf)
    assert s["covered"] is True and s["width"] == math.inf
    # no prediction (NaN): not covered, infinite width and error
    s = fc.score_interval(3.0, math.nan, math.nan, math.nan)
    assert s == {"covered": False, "width": math.inf, "error": math.inf}
    # a non-positive prediction: infinite error
    assert fc.score_interval(3.0, -1.0, math.nan, math.nan)["error"] == math.inf


def test_summarise_by_hand():
    # five intervals: three cover (1, 2, 4), widths 1, 2, 3, inf, 0.5 decades
    truths = [1.0, 1.0, 1.0, 1.0, 1.0]
    preds = [1.0, math.e, 0.5, 2.0, 10.0]
    ints = [(0.1, 1.0), (0.1, 10.0), (1e-3, 0.9), (0.0, 2.0), (10.0, 10**1.5)]
    scores = [fc.score_interval(t, p, lo, hi) for t, p, (lo, hi) in zip(truths, preds, ints)]
    s = fc.summarise(scores)
    assert s["n"] == 5
    assert s["coverage"] == pytest.approx(3 / 5)
    assert s["width"] == pytest.approx(2.0)  # median of 1, 2, 3, inf, 0.5
    assert s["error"] == pytest.approx(math.log(2.0))  # median of 0, 1, ln 2, ln 2, ln 10
    assert math.isnan(fc.summarise([])["coverage"])


def test_coverage_by_kind_of_answer_by_hand():
    def rec(loss_int, loss_truth, determined, drop_int, drop_truth):
        return {
            "loss_pred": [1.0, *loss_int],
            "loss": fc.score_interval(loss_truth, 1.0, *loss_int),
            "loss_determined": determined,
            "next_drop_pred": [100.0, *drop_int],
            "drop": fc.score_interval(drop_truth, 100.0, *drop_int),
        }

    rs = [
        rec((0.5, 2.0), 1.0, True, (50.0, 200.0), 300.0),  # determined loss covered; two-sided drop missed
        rec((0.0, 2.0), 1e-9, False, (50.0, math.inf), 1e6),  # bounds and [lo, no drop], both covered
        rec((0.0, 2.0), 3.0, False, (50.0, math.inf), 10.0),  # both missed
        rec((0.0, 2.0), 1e-9, True, (50.0, 200.0), 60.0),  # a determined interval reaching 0; drop covered
        rec((math.nan, math.nan), 1.0, False, (math.nan, math.nan), 100.0),  # no prediction: missed
    ]
    assert fc.by_kind(rs) == {
        "loss determined": (2, 3),
        "loss bounds only": (1, 2),
        "drop two-sided": (1, 3),
        "drop [lo, no drop]": (1, 2),
    }


def test_summarise_gaussian_coverage():
    # intervals of ±1.96 and ±1 standard deviations on the log scale around a Gaussian truth
    rng = np.random.default_rng(0)
    ln_truth = rng.standard_normal(40000)
    for z, p in ((1.959964, 0.95), (1.0, 0.682689)):
        scores = [fc.score_interval(math.exp(v), 1.0, math.exp(-z), math.exp(z)) for v in ln_truth]
        s = fc.summarise(scores)
        assert abs(s["coverage"] - p) < 4 * math.sqrt(p * (1 - p) / ln_truth.size)
        assert s["width"] == pytest.approx(2 * z / math.log(10))


def test_true_drops_match_the_staircase():
    # three well-separated decoupled modes (Thm 6): the drop's step is the first crossing of
    # Σ_{j>k} V_j + V_k/2 (the staircase's midpoint)
    r = np.array([1.0, 0.1, 0.01])
    C = np.array([1.0, 2.0, 0.5])
    z0 = 1e-6 * np.ones(3)
    lr = 0.01
    steps = np.arange(0.0, 3.5e5, 20.0)
    t = lr * steps[:, None]
    e = (r - C * z0) * np.exp(-r * t)
    L = np.sum(r**2 / (8 * C) * (e / (C * z0 + e)) ** 2, axis=1)
    V = r**2 / (8 * C)
    want = [steps[np.flatnonzero(L <= V[k + 1 :].sum() + V[k] / 2)[0]] for k in range(3)]
    got = fc.true_drops(steps, L, lr)
    np.testing.assert_allclose(got, want, rtol=0.01)
    # a curve without a drop of 3x between plateaus: none
    assert fc.true_drops(steps, 1.0 + 0.5 * np.exp(-lr * steps / 100), lr).size == 0


def test_a_slower_rate_in_an_exponential_tail_is_not_a_plateau():
    # L = e^{−t} + 10⁻⁶ e^{−0.3 t}: one fall from the start, whose tail turns to the slower rate
    # near t = 20, where g = −d ln L/d ln t has a local minimum of about 8 (the loss falling as
    # t^−8): not a plateau, so one drop, at the first crossing of the midpoint between the start
    # and the record's end; with every local minimum a plateau the tail makes a second one
    lr = 0.01
    steps = np.arange(0.0, 6000.0, 1.0)
    t = lr * steps
    L = np.exp(-t) + 1e-6 * np.exp(-0.3 * t)
    want = steps[np.flatnonzero(L <= 0.5 * (L[1] + L[-1]))[0]]  # the first step t > 0 starts it
    np.testing.assert_allclose(fc.true_drops(steps, L, lr), [want], rtol=0.02)
    assert fc.true_drops(steps, L, lr, plateau_slope=math.inf).size == 2


def test_domhan_recovers_its_own_family():
    x = np.arange(1.0, 101.0)
    y = 0.1 + 2.0 * x**-0.7
    pred = fc.domhan_fit(x, y, 1000.0)
    assert pred["pow3"] == pytest.approx(0.1 + 2.0 * 1000.0**-0.7, rel=1e-3)
    assert pred["ensemble"] > 0


@pytest.mark.slow
def test_tiny_run():
    logs = fc.make_logs(1, families=("modes",))
    assert len(logs) == 1
    log = logs[0]
    assert 0.25 * log.steps[-1] - np.diff(log.steps).max() <= log.cut <= 0.6 * log.steps[-1]
    assert log.cut < log.next_drop <= log.steps[-1]
    r = fc.fit_one(log)
    r["baseline"] = fc.baseline_one(log)
    text, summary = fc.table([r])
    assert "| modes | 1 |" in text and "| overall | 1 |" in text
    assert summary["overall"]["drop"]["coverage"] in (0.0, 1.0)
    assert r["drop"]["covered"] == (r["next_drop_pred"][1] <= log.next_drop <= r["next_drop_pred"][2])
    # the forecast is the mixture; the preferred scenario alone is scored beside it
    assert 0.0 <= r["drop_probability"] <= 1.0
    lo, med, hi = r["loss_pred"][1], r["loss_pred"][0], r["loss_pred"][2]
    assert math.isnan(lo) or lo <= med <= hi
    assert set(summary["overall"]["preferred_scenario"]) == {"drop", "loss"}


def _log(cut=500.0):
    steps = np.arange(0.0, 1001.0, 5.0)
    loss = 1.0 / (1.0 + 1e-3 * steps) + 0.01
    return fc.Log("modes", 0, steps, loss, loss, 0.01, cut, 800.0, np.array([800.0]))


def test_overlap_perturbations_stay_under_two_percent():
    log = _log()
    seen = log.steps <= log.cut
    members = [log] + [fc.perturbed(log, "smooth", k) for k in (0, 1)] + [fc.perturbed(log, "noise", k) for k in (1, 2)]
    for m in members[1:]:
        np.testing.assert_array_equal(m.loss[~seen], log.loss[~seen])  # the unseen part untouched
        assert 0.005 < fc.rel_diff(m.loss[seen], log.loss[seen]) <= fc.PERTURB / (1 - fc.PERTURB) * (1 + 1e-12)
    # the two smooth members mirror each other around the log
    np.testing.assert_allclose(0.5 * (members[1].loss + members[2].loss), log.loss, rtol=1e-14)
    for i, a in enumerate(members):
        for b in members[i + 1 :]:
            d = np.max(np.abs(a.loss[seen] - b.loss[seen]) / np.minimum(a.loss[seen], b.loss[seen]))
            assert fc.rel_diff(a.loss[seen], b.loss[seen]) == pytest.approx(d)
            assert d < fc.OVERLAP_MAX


def _fit(drop, loss):
    return {
        "cut": 500.0,
        "N": 1000.0,
        "next_drop_true": 800.0,
        "loss_true": 0.01,
        "next_drop_pred": list(drop),
        "next_drop_note": "",
        "loss_pred": list(loss),
        "per_scenario": [],
    }


def test_overlap_pairs_by_hand():
    inf, nan = math.inf, math.nan
    log = _log()
    fits = [
        _fit((700.0, 600.0, 900.0), (0.01, 0.005, 0.02)),
        _fit((850.0, 800.0, inf), (0.015, 0.01, 0.03)),  # overlaps the first in both
        _fit((inf, inf, inf), (0.5, 0.1, 1.0)),  # no drop at all; a loss above the others
        _fit((inf, nan, nan), (0.02, 0.0, 0.05)),  # not determined: [cut, inf]
    ]
    g = fc.Group("modes", "noise", 0, ["a", "b", "c", "d"], [log] * 4)
    pairs = {p["names"]: p for p in fc.overlap_pairs([g], [fits])}
    assert len(pairs) == 6
    want_drop = {("a", "b"): True, ("a", "c"): False, ("a", "d"): True, ("b", "c"): True, ("b", "d"): True}
    want_drop[("c", "d")] = True
    want_loss = {("a", "b"): True, ("a", "c"): False, ("a", "d"): True, ("b", "c"): False, ("b", "d"): True}
    want_loss[("c", "d")] = False
    for k, p in pairs.items():
        assert p["drop_overlap"] is want_drop[k], k
        assert p["loss_overlap"] is want_loss[k], k
    # points: a's 700 is outside b's [800, inf]; b's 850 inside a's [600, 900]
    assert pairs[("a", "b")]["drop_points"] is False
    assert pairs[("b", "d")]["drop_points"] is True  # "no drop" inside [800, inf], 850 inside [500, inf]
    assert pairs[("a", "d")]["loss_points"] is True  # 0.01 in [0, 0.05], 0.02 in [0.005, 0.02]
    text = fc.overlap_table(list(pairs.values()))
    assert "| modes | noise | 6 | 0 % | 5/6 (83 %) |" in text
    assert "a vs c" in text and "next drop intervals disjoint" in text
    # a fit that raised has no interval: it overlaps nothing
    failed = _fit((nan, nan, nan), (nan, nan, nan)) | {"error": "ValueError: x"}
    (p,) = fc.overlap_pairs([fc.Group("modes", "noise", 0, ["a", "e"], [log] * 2)], [[fits[3], failed]])
    assert not (p["drop_overlap"] or p["loss_overlap"] or p["drop_points"] or p["loss_points"])
