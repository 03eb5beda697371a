"""The drops table says what the predicted curve shows (issue: "the drop table tells the truth").

Each row of `Prediction.table()` must be one drop of `predict`'s own loss curve: the plateau
levels on either side of it and the time the loss crosses their midpoint. The references here do
not read `predict`'s sampled curve: they evaluate the curve independently (Thm 6's closed form for
diagonal `C`; scipy's Radau for a coupled `C`) and locate plateaus and crossings with scipy's root
finders and minimisers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from scipy.integrate import solve_ivp
from scipy.optimize import brentq, minimize_scalar

import lvflow

MIN_DROP = 0.01  # loss_drops' default: falls under 1 % of the whole are not drops


def _diagonal_curve(r, Ckk, eps):
    """Thm 6's logistic for each mode, z_k(0) = ε: the excess loss Σ C_kk/8 (r_k/C_kk − z_k)² and its
    drop rate per e-fold of time, g = −t dL/dt, as functions of ln t."""
    zs = r / Ckk
    a = (r - Ckk * eps) / (Ckk * eps)

    def z(t):
        return zs / (1 + a * np.exp(-r * t))

    def excess(x):
        return float(np.sum(Ckk / 8 * (zs - z(math.exp(x))) ** 2))

    def rate(x):
        t = math.exp(x)
        zt = z(t)
        dz = r * zt * (1 - zt / zs)  # the logistic's derivative
        return float(t * np.sum(Ckk / 4 * (zs - zt) * dz))

    return excess, rate


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    K=st.integers(2, 3),
    ratio=st.floats(2.0, 4.0),
    C=st.lists(st.floats(0.5, 2.0), min_size=3, max_size=3),
    log_eps=st.floats(-12.0, -5.0),
)
def test_rows_are_the_drops_of_separated_modes(K, ratio, C, log_eps):
    """Diagonal `C`, rates apart by a factor 2–4: every mode is one drop. The reference finds each
    plateau as the minimum of the closed form's drop rate between two switch-ons and each crossing
    by `brentq`; the table must have one row per drop, at those times (1 %) and levels (2 %)."""
    r = ratio ** -np.arange(K, dtype=float)
    Ckk, eps = np.asarray(C[:K]), 10.0**log_eps
    V = r**2 / (8 * Ckk)
    assume(np.all(V / V.sum() >= 3 * MIN_DROP))
    excess, rate = _diagonal_curve(r, Ckk, eps)
    x_on = np.log(np.log((r - Ckk * eps) / (Ckk * eps)) / r)  # ln t*_k, Eq. 158 at ρ = ½
    # the reference's plateaus: the slowest fall between consecutive switch-ons, and its peaks
    valleys = [
        minimize_scalar(rate, bounds=(a, b), method="bounded", options={"xatol": 1e-10}).x
        for a, b in zip(x_on[:-1], x_on[1:])
    ]
    peaks = [-minimize_scalar(lambda x: -rate(x), bounds=(b - 1.0, b + 1.0), method="bounded").fun for b in x_on]
    ratios = [rate(v) / min(p, q) for v, p, q in zip(valleys, peaks[:-1], peaks[1:])]
    assume(all(q < 0.4 for q in ratios))  # clearly separate drops (the table's threshold is ½)
    levels = [excess(x_on[0] - 8.0)] + [excess(v) for v in valleys] + [0.0]
    pred = lvflow.predict(lvflow.LotkaVolterra(r, np.diag(Ckk)), eps=eps)
    rows = pred.drop_rows()
    assert len(rows) == K
    for k, row in enumerate(rows):
        before, after = levels[k], levels[k + 1]
        x_mid = brentq(lambda x: excess(x) - 0.5 * (before + after), x_on[k] - 3.0, x_on[k] + 3.0, xtol=1e-12)
        assert row["t"] == pytest.approx(math.exp(x_mid), rel=0.01)
        assert row["loss_before"] == pytest.approx(before, rel=0.02)
        assert row["loss_after"] == pytest.approx(after, rel=0.02, abs=0.02 * (before - after))
        assert row["modes"] == [k + 1] and row["complete"]


def _radau_curve(r, C, eps, t1):
    """The gLV (Eq. 32) in ln z by scipy's Radau, dense, and its excess loss over the loss's minimum
    over z ≥ 0 (from scipy's NNLS on the factor B with C = BᵀB)."""
    from scipy.optimize import nnls

    sol = solve_ivp(
        lambda t, u: r - C @ np.exp(u),
        (0.0, t1),
        np.full(r.size, math.log(eps)),
        method="Radau",
        rtol=1e-11,
        atol=1e-12,
        dense_output=True,
    )
    assert sol.success
    w, U = np.linalg.eigh(C)
    B = (U * np.sqrt(np.maximum(w, 0))).T
    b = np.linalg.lstsq(B.T, r, rcond=None)[0]
    z_min = nnls(B, b)[0]

    def loss(z):
        return -r @ z / 4 + z @ C @ z / 8

    L_min = loss(z_min)
    return lambda t: loss(np.exp(sol.sol(t))) - L_min


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), log_eps=st.floats(-9.0, -4.0))
def test_rows_cover_the_drops_of_coupled_systems(seed, log_eps):
    """A random coupled PSD `C`: on the reference curve (Radau), each row's time is where the loss
    crosses the midpoint of its levels (1 %), each level is the curve at a point where it falls at
    most half as fast as in the drop, and between rows, before the first and after the last, the
    curve falls by less than `MIN_DROP` of its whole fall: no drop is missing and none is invented."""
    rng = np.random.default_rng(seed)
    K = 3
    G = rng.normal(size=(K, K))
    C = G @ G.T / K + 0.2 * np.eye(K)
    r = np.sort(rng.uniform(0.1, 1.0, size=K))[::-1]
    eps = 10.0**log_eps
    pred = lvflow.predict(lvflow.LotkaVolterra(r, C), eps=eps)
    ref = _radau_curve(r, C, eps, pred.t1)
    total = ref(0.0) - ref(pred.t1)
    assume(total > 1e-6)
    rows, d = pred.drop_rows(), pred.drops
    edges = [0.0]
    for i, row in enumerate(rows):
        tb, ta = float(d.t_before[i]), float(d.t_after[i])
        mid = 0.5 * (row["loss_before"] + row["loss_after"])
        t_ref = brentq(lambda t: ref(t) - mid, tb, ta, xtol=1e-12)
        assert row["t"] == pytest.approx(t_ref, rel=0.01)
        assert row["loss_before"] == pytest.approx(ref(tb), rel=0.02, abs=1e-3 * total)
        assert row["loss_before"] - row["loss_after"] >= MIN_DROP * total * 0.99
        edges += [tb, ta]
    edges.append(pred.t1)
    # outside the rows, the curve stays level (within the threshold) on the reference
    for a, b in zip(edges[::2], edges[1::2]):
        if b > a:
            assert ref(a) - ref(b) <= 1.5 * MIN_DROP * total, (a, b)


def test_close_switch_ons_are_one_drop_and_the_summary_says_so():
    """Three modes with rates within 6 %: one drop on the curve (no plateau between them), listed
    with all three modes — not three rows, and no claim about merging beyond that row."""
    r = np.array([1.0, 0.97, 0.94])
    pred = lvflow.predict(lvflow.LotkaVolterra(r, np.eye(3)), eps=1e-6)
    assert pred.drop_members() == [[1, 2, 3]]
    excess, rate = _diagonal_curve(r, np.ones(3), 1e-6)
    x = np.linspace(math.log(5.0), math.log(40.0), 4001)
    g = np.array([rate(v) for v in x])
    assert np.count_nonzero((g[1:-1] > g[:-2]) & (g[1:-1] >= g[2:])) == 1  # the reference has one peak
    text = pred.summary()
    assert "1, 2, 3" in text and "merges" not in text


def test_a_plateau_between_coupled_drops_is_two_rows():
    """`coop` (issue 32, class 4): r = (1, 0.05), C = [[1, −0.35], [−0.35, 1]] at ε = 1e-6 has a flat
    plateau between its two drops on the reference curve; the table has two rows, not "every drop
    merges"."""
    r, C = np.array([1.0, 0.05]), np.array([[1.0, -0.35], [-0.35, 1.0]])
    pred = lvflow.predict(lvflow.LotkaVolterra(r, C), eps=1e-6)
    ref = _radau_curve(r, C, 1e-6, pred.t1)
    t = np.geomspace(1.0, pred.t1, 3000)
    L = np.array([ref(v) for v in t])
    g = -np.diff(L) / np.diff(np.log(t))
    # the reference: two peaks of the drop rate with a valley below a tenth of the smaller
    peaks = np.flatnonzero((g[1:-1] > g[:-2]) & (g[1:-1] >= g[2:]) & (g[1:-1] > 1e-3 * g.max())) + 1
    assert peaks.size == 2 and g[peaks[0] : peaks[1]].min() < 0.1 * g[peaks].min()
    assert pred.drop_members() == [[1], [2]]
    assert "merges" not in pred.summary()


def test_a_horizon_inside_a_drop_marks_it_incomplete():
    """`t1` before the last drop ends: the row says the loss is still falling, and its level after
    is the curve's last value."""
    r = np.array([1.0, 0.25])
    pred = lvflow.predict(lvflow.LotkaVolterra(r, np.eye(2)), eps=1e-8, t1=4 * math.log(0.25e8))  # t1 = t*_2
    rows = pred.drop_rows()
    assert [row["complete"] for row in rows] == [True, False]
    assert rows[-1]["loss_after"] == pytest.approx(float(pred.excess_loss[-1]), rel=1e-12)
    assert "still falling" in pred.table()
