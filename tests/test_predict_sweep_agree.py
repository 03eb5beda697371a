"""`lvflow.predict` and `lvflow.sweep` are one computation: the same numbers and time grid for the
same configuration at any horizon, checked against closed forms (Thm 6, Eq. 158), plain numpy
and scipy's ODE solver; a singular `C` measures the excess loss from the true minimum; a mode
switched on and later off gets its switch-on time in both; a horizon before the first switch-on
is a table, not a crash."""

import json
import math

import numpy as np
import pytest
from _cli import main
from hypothesis import example, given, settings, strategies as st
from scipy.integrate import solve_ivp

import lvflow

R3 = np.array([1.0, 0.5, 0.25])
SINGULAR = np.ones((3, 3))  # rank 1, PSD
R_OFF = np.array([1.0, 0.8, 1.74])
C_OFF = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 2.09]])  # det 0.09: PD


def _rel(a, b):
    """Largest relative difference, infinities compared exactly."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape
    fin = np.isfinite(a) & np.isfinite(b)
    assert np.array_equal(np.isinf(a), np.isinf(b)), (a, b)
    if not fin.any():
        return 0.0
    return float(np.max(np.abs(a[fin] - b[fin]) / np.maximum(np.abs(b[fin]), 1e-300)))


def _eq158(r, C, c, eps, rho=0.5):
    """Thm 6's switch-on time (Eq. 158 with a = 1), exact for a diagonal C."""
    return (math.log(1 / eps) - np.log(C * c / (r - C * c * eps) * (1 - rho) / rho)) / r


def _horizon_np(r, C, eps):
    """`predict`'s default horizon for a diagonal C with c = 1 (τ*_k = 1/r_k), in numpy."""
    t_iso = np.maximum(np.log(r / (C * eps)), 1.0) / r
    t_sched = math.log(1 / eps) / r
    return 1.2 * max(t_iso.max(), t_sched.max()) + 8.0 / r.min()


def _grid_np(t1, n, t_dyn):
    t_dyn = min(t_dyn, t1)
    if t_dyn < 0.5 * t1:
        h = n // 2
        lin = np.concatenate([np.linspace(0.0, t_dyn, h, endpoint=False), np.linspace(t_dyn, t1, n - h)])
    else:
        lin = np.linspace(0.0, t1, n)
    return np.minimum(np.sort(np.concatenate([lin, np.geomspace(t_dyn * 1e-4, t1, n)[:-1]])), t1)


def _both(lv, eps, t1=None, points=50):
    p = lvflow.predict(lv, eps=eps, t1=t1, num_points=points)
    cfg = {"system": [lv], "eps": eps, "num_points": points}
    if t1 is not None:
        cfg["t1"] = t1
    s = lvflow.sweep(cfg, curve=True, summary=False)
    return p, s


def _agree(p, s):
    assert _rel(p.by_mode("t_star"), s["t_star"][0]) <= 1e-12
    assert _rel(p.z_inf, s["z_inf"][0]) <= 1e-12
    assert _rel(p.t1, s["t1"][0]) <= 1e-12
    np.testing.assert_allclose(np.asarray(p.ts), s["ts"][0], rtol=1e-12, atol=0)
    np.testing.assert_allclose(np.asarray(p.excess_loss), s["excess_loss"][0], rtol=1e-12, atol=1e-15)


@settings(max_examples=12, deadline=None)
@given(
    r2=st.floats(0.3, 0.8),
    log_eps=st.floats(-12.0, -3.0),
    horizon=st.sampled_from(["default", "1e7", "before", "random"]),
    u=st.floats(0.0, 1.0),
)
@example(r2=0.5, log_eps=-4.0, horizon="1e7", u=0.0)
@example(r2=0.5, log_eps=-4.0, horizon="before", u=0.5)
def test_predict_and_sweep_agree_at_any_horizon(r2, log_eps, horizon, u):
    r = np.array([1.0, r2, r2 / 2])
    C = np.array([1.0, 2.0, 0.5])
    eps = 10.0**log_eps
    t_first = _eq158(r[0], C[0], 1.0, eps)
    t1 = {"default": None, "1e7": 1e7, "before": t_first * (0.01 + 0.9 * u), "random": 10 ** (-2 + 9 * u)}[horizon]
    lv = lvflow.LotkaVolterra(r, np.diag(C))
    p, s = _both(lv, eps, t1)
    _agree(p, s)
    # independent references: the grid in numpy, the switch-on times by Eq. 158
    t_dyn = _horizon_np(r, C, eps)
    expect_t1 = t_dyn if t1 is None else t1
    assert p.t1 == pytest.approx(expect_t1, rel=1e-12)
    np.testing.assert_allclose(np.asarray(p.ts), _grid_np(expect_t1, 50, t_dyn), rtol=1e-12, atol=1e-300)
    ref = _eq158(r, C, 1.0, eps)
    ref = np.where(ref <= expect_t1, ref, np.inf)
    assert _rel(p.by_mode("t_star"), ref) <= 1e-9
    assert np.all(np.asarray(p.excess_loss) >= 0)


def test_long_horizon_samples_the_switch_ons():
    """t1 = 1e7 ≫ the dynamics (t ≲ 60): half the linear samples and the log samples still cover
    them, in both predict and sweep."""
    lv = lvflow.LotkaVolterra(R3, np.eye(3))
    p, s = _both(lv, 1e-4, 1e7, points=400)
    _agree(p, s)
    ts = np.asarray(p.ts)
    t_dyn = _horizon_np(R3, np.ones(3), 1e-4)
    # 200 linear samples in [0, t_dyn) plus the log ones from 1e-4 t_dyn up to it (4 of 9.1 decades)
    assert np.sum(ts <= t_dyn) == np.sum(_grid_np(1e7, 400, t_dyn) <= t_dyn) >= 350
    assert np.sum(ts < 1e4) == np.sum(s["ts"][0] < 1e4)


def test_coupled_system_agrees():
    lv = lvflow.LotkaVolterra(R_OFF, C_OFF)
    p, s = _both(lv, 1e-5, None)
    _agree(p, s)


@settings(max_examples=5, deadline=None)
@given(log_t1=st.floats(-1.0, 7.0))
@example(log_t1=7.0)
def test_coupled_system_agrees_at_any_horizon(log_t1):
    """The ODE path (a coupled C, mode 3 switched on and later off) at horizons from before the
    first switch-on to far past the last: the same numbers and grid in both."""
    t1 = 10.0**log_t1
    lv = lvflow.LotkaVolterra(R_OFF, C_OFF)
    p, s = _both(lv, 1e-5, t1)
    _agree(p, s)
    assert p.t1 == pytest.approx(t1, rel=1e-12) and np.asarray(p.ts)[-1] == pytest.approx(t1, rel=1e-12)


def _glv_ivp(r, C, z0, t_end, **kw):
    f = lambda t, u: r - C @ np.exp(u)  # noqa: E731 (in ln z)
    return solve_ivp(f, (0.0, t_end), np.log(z0), method="LSODA", rtol=1e-11, atol=1e-12, **kw)


def test_singular_C_floor_is_the_true_minimum():
    """C = 11ᵀ: min over z ≥ 0 of zᵀCz/8 − rᵀz/4 is at z = (1, 0, 0), L* = 1/8 − 1/4 = −1/8, so
    the only drop is 1/8 = V_1, plateau = drop, and the excess is L(z(t)) + 1/8 ≥ 0."""
    lv = lvflow.LotkaVolterra(R3, SINGULAR)
    p, s = _both(lv, 1e-4, None, points=100)
    assert float(p.plateau_loss[0]) == pytest.approx(0.125, rel=1e-12)
    assert float(p.drop[0]) == pytest.approx(0.125, rel=1e-12)
    assert s["plateau_loss"][0][0] == pytest.approx(0.125, rel=1e-12)
    exc = np.asarray(p.excess_loss)
    assert np.all(exc >= 0)
    assert exc[0] == pytest.approx(0.125, rel=1e-3)  # L(z0) ≈ 0
    # against scipy: L(z(t)) + 1/8 on the curve's times
    ts = np.asarray(p.ts)
    sol = _glv_ivp(R3, SINGULAR, np.full(3, 1e-4), ts[-1], t_eval=ts)
    z = np.exp(sol.y.T)
    ref = np.einsum("ti,ij,tj->t", z, SINGULAR, z) / 8 - z @ R3 / 4 + 0.125
    np.testing.assert_allclose(exc, ref, atol=1e-8)
    _agree(p, s)


def test_mode_switched_on_then_off_has_one_finite_time():
    """Mode 3 (r = 1.74) ignites first, to z_3 = r_3/C_33 alone, then modes 1 and 2 switch it
    off (z(∞) = (1, 0.8, 0)). Its t* is when z_3 first reaches ρ r_3/C_33 (scipy)."""
    lv = lvflow.LotkaVolterra(R_OFF, C_OFF)
    eps = 1e-6
    p = lvflow.predict(lv, eps=eps)
    s = lvflow.sweep({"system": [lv], "eps": eps}, summary=False)
    t3p, t3s = float(p.by_mode("t_star")[2]), float(s["t_star"][0][2])
    assert math.isfinite(t3p) and t3p == pytest.approx(t3s, rel=1e-12)
    target = math.log(0.5 * 1.74 / 2.09)
    ev = lambda t, u: u[2] - target  # noqa: E731
    ev.terminal, ev.direction = True, 1
    sol = _glv_ivp(R_OFF, C_OFF, np.full(3, eps), 50.0, events=ev)
    assert t3p == pytest.approx(float(sol.t_events[0][0]), rel=1e-6)
    assert t3p == pytest.approx(7.8367, rel=1e-4)


def test_subnormal_eps_switches_on():
    """ε = 5e-324 (subnormal): the flow rescaled, with Eq. 158's times in both."""
    alpha2 = 0.8
    k = np.arange(1, 5.0)
    r, C = k**-alpha2, k ** (2 - 2 * alpha2) / 8  # C_kk = r_k²/(8 V_k), V_k = k^-2 (Thm 9)
    p = lvflow.predict(lvflow.LotkaVolterra(r, np.diag(C)), eps=5e-324)
    s = lvflow.sweep({"alpha1": 2.0, "alpha2": alpha2, "modes": 4, "eps": 5e-324}, summary=False)
    ref = (-math.log(5e-324) - np.log(C / r)) / r  # Eq. 158, ρ = ½ (c ε ≪ r/C)
    assert s["success"][0]
    assert _rel(s["t_star"][0], ref) <= 1e-9
    assert _rel(p.by_mode("t_star"), s["t_star"][0]) <= 1e-12
    assert np.isfinite(s["ln_inv_eps"][0])


@pytest.mark.parametrize("t1", ["5", "1e-10", "8", "1e-300"])
def test_cli_horizon_before_the_first_switch_on(tmp_path, capsys, t1):
    path = tmp_path / "sys3.csv"
    path.write_text("r,C0,C1,C2\n1,1,0,0\n0.5,0,1,0\n0.25,0,0,1\n")
    out = tmp_path / "out.json"
    rc = main(["predict", "--system", str(path), "--eps", "1e-4", "--t1", t1, "--quiet", "--save", str(out)])
    text, err = capsys.readouterr()
    assert rc == 0, err
    assert "no mode has switched on" in text
    d = json.loads(out.read_text())
    assert all(m["t_star"] is None for m in d["directions"])
    exc = np.asarray(d["curve"]["excess_loss"], dtype=float)
    assert d["curve"]["t"][-1] == pytest.approx(float(t1), rel=1e-12)
    # Eq. 163 with Thm 6's z_k(t) = r_k z0 / (z0 + (r_k − z0) e^{−r_k t}) (C = I): Σ V_k (1 − z_k/z_k(∞))²
    t = np.asarray(d["curve"]["t"], dtype=float)[:, None]
    z = R3 * 1e-4 / (1e-4 + (R3 - 1e-4) * np.exp(-R3 * t))
    np.testing.assert_allclose(exc, np.sum(R3**2 / 8 * (1 - z / R3) ** 2, axis=1), rtol=1e-10)
    assert exc[0] == pytest.approx(0.1640625, rel=1e-3)  # the whole staircase, Eq. 168


def test_sweep_drops_are_predicts_drops():
    """With curves kept, a sweep's configuration has the drops `predict` prints for it (one
    implementation, `loss_drops`, on one curve), and the first drop's midpoint crossing comes before
    the first switch-on `t_first`; without curves it says how to get them."""
    eps = [1e-6, 1e-4]
    res = lvflow.sweep({"system": {"r": R3, "C": np.eye(3)}, "eps": eps}, curve=True, progress=False, summary=False)
    for i, e in enumerate(eps):
        want = lvflow.predict(lvflow.LotkaVolterra(R3, np.eye(3)), eps=e).drops
        got = res.drops(i)
        assert len(got) == len(want)
        np.testing.assert_allclose(got.t_mid, want.t_mid, rtol=1e-9)
        np.testing.assert_allclose(got.loss_before, want.loss_before, rtol=1e-9)
        assert got.t_mid[0] < res["t_first"][i]
    bare = lvflow.sweep({"system": {"r": R3, "C": np.eye(3)}, "eps": eps}, progress=False, summary=False)
    with pytest.raises(lvflow.LvflowError, match="curve=True"):
        bare.drops(0)
