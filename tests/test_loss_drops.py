"""`loss_drops`: the drops of a loss curve as read off the plot, checked on curves whose plateaus
and midpoint crossings are known in closed form (decoupled modes, Thm 6), with scipy's root finder
for the crossings, and for invariants under rescaling time and loss."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.optimize import brentq

import lvflow


def _grid(t1: float) -> np.ndarray:
    return np.concatenate([np.linspace(0.0, 1.0, 20, endpoint=False), np.geomspace(1.0, t1, 4000)])


def _isolated_loss(r, eps, y2=1.0):
    """The loss of decoupled modes with C = I (Thm 6): z_k logistic from ε to r_k, and
    L = y2 − r·z/4 + |z|²/8, so that mode k removes V_k = r_k²/8."""
    r = np.asarray(r, dtype=float)

    def loss(t):
        t = np.asarray(t, dtype=float)
        z = r[:, None] / (1 + (r[:, None] / eps - 1) * np.exp(-r[:, None] * t[None, :]))
        return y2 - (r[:, None] * z).sum(0) / 4 + (z * z).sum(0) / 8

    return loss


def test_separated_modes_are_one_drop_each_at_the_closed_form_levels_and_crossings():
    r, eps = np.array([1.0, 0.35, 0.15]), 1e-6
    loss = _isolated_loss(r, eps)
    t = _grid(600.0)
    d = lvflow.loss_drops(t, loss(t))
    V = r**2 / 8
    before = 1.0 - np.concatenate([[0.0], np.cumsum(V)[:-1]])
    after = before - V
    assert len(d) == 3 and np.all(d.complete)
    np.testing.assert_allclose(d.loss_before, before, rtol=2e-3)
    np.testing.assert_allclose(d.loss_after, after, rtol=2e-3)
    for i in range(3):  # the loss crosses the midpoint of the staircase's levels (scipy, on the closed form)
        mid = 0.5 * (before[i] + after[i])
        t_ref = brentq(lambda s: loss(np.array([s]))[0] - mid, 1e-3, 600.0, xtol=1e-12)
        assert d.t_mid[i] == pytest.approx(t_ref, rel=1e-2)
        assert d.t_before[i] < d.t_mid[i] <= d.t_after[i]
    assert list(d.containing(np.log(r / eps) / r)) == [0, 1, 2]  # each mode's t* (Eq. 158) in its own drop


def test_modes_switching_on_together_are_one_drop():
    r, eps = np.array([1.0, 0.97, 0.94]), 1e-6  # t* within 6 %: no plateau between them
    loss = _isolated_loss(r, eps)
    t = _grid(200.0)
    d = lvflow.loss_drops(t, loss(t))
    assert len(d) == 1
    assert d.loss_before[0] == pytest.approx(1.0, rel=1e-4)
    assert d.loss_after[0] == pytest.approx(1.0 - np.sum(r**2) / 8, rel=1e-4)
    assert list(d.containing(np.log(r / eps) / r)) == [0, 0, 0]


def test_a_curve_cut_inside_a_drop_ends_with_an_incomplete_row():
    r, eps = np.array([1.0, 0.3]), 1e-6
    loss = _isolated_loss(r, eps)
    t_star2 = math.log(0.3 / eps) / 0.3
    t = _grid(t_star2)  # ends at the second mode's switch-on, mid-drop
    d = lvflow.loss_drops(t, loss(t))
    assert len(d) == 2 and d.complete.tolist() == [True, False]
    assert d.loss_after[1] == pytest.approx(float(loss(np.array([t_star2]))[0]), rel=1e-12)


def test_curves_without_a_drop():
    t = _grid(10.0)
    assert len(lvflow.loss_drops(t, np.ones_like(t))) == 0
    assert len(lvflow.loss_drops(t, 1 + 1e-3 * t)) == 0  # rising
    assert len(lvflow.loss_drops(np.array([0.0, 1.0]), np.array([1.0, 0.5]))) == 0  # one positive time


def test_a_power_law_is_one_smooth_decay():
    t = _grid(1e4)
    d = lvflow.loss_drops(t, (1 + t) ** -1.25)
    assert len(d) == 1


@settings(max_examples=30, deadline=None)
@given(
    a=st.floats(1e-3, 1e3),
    scale=st.floats(1e-3, 1e3),
    shift=st.floats(-10.0, 10.0),
    r2=st.floats(0.05, 0.9),
    log_eps=st.floats(-12.0, -3.0),
)
def test_invariant_under_rescaled_time_and_loss(a, scale, shift, r2, log_eps):
    r = np.array([1.0, r2])
    loss = _isolated_loss(r, 10.0**log_eps)
    t = _grid(40.0 / r2 * (1 - log_eps))
    base = lvflow.loss_drops(t, loss(t))
    moved = lvflow.loss_drops(a * t, scale * loss(t) + shift)
    assert len(moved) == len(base) >= 1
    np.testing.assert_allclose(moved.t_mid, a * base.t_mid, rtol=1e-9)
    np.testing.assert_allclose(moved.loss_before, scale * base.loss_before + shift, rtol=1e-9, atol=1e-9 * scale)
    np.testing.assert_allclose(moved.loss_after, scale * base.loss_after + shift, rtol=1e-9, atol=1e-9 * scale)
    # rows tell the truth about the curve: levels fall, each drop's midpoint lies inside its span,
    # and the plateau after a drop is the plateau before the next
    assert np.all(base.loss_before > base.loss_after)
    assert np.all((base.t_before < base.t_mid) & (base.t_mid <= base.t_after))
    np.testing.assert_array_equal(base.loss_after[:-1], base.loss_before[1:])


@pytest.mark.bad_input
def test_input_errors():
    t = np.linspace(0, 1, 5)
    with pytest.raises(lvflow.LvflowError, match="one length"):
        lvflow.loss_drops(t, np.ones(4))
    with pytest.raises(lvflow.LvflowError, match="finite"):
        lvflow.loss_drops(t, np.full(5, np.nan))
    with pytest.raises(lvflow.LvflowError, match="non-decreasing"):
        lvflow.loss_drops(t[::-1], np.ones(5))
    with pytest.raises(lvflow.LvflowError, match="plateau"):
        lvflow.loss_drops(t, np.ones(5), plateau=1.5)
