"""solve_lv against closed forms (Thm 6, Eq. 158), numpy GD on W (Fig 3 left) and scipy Radau."""

import re

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.integrate import solve_ivp

import lvflow
from lvflow import ClosedForm, solve_lv

# internal on purpose: solve_lv's default log-spaced save grid, reused for the GD comparison (not exported)

# One diagonal 5-mode system serves several tests (one compilation): Fig 3 left's rates, with
# interaction strengths over four decades.
R5 = np.array([1.0, 0.5, 0.25, 0.125, 0.0625])


def _thm6(r, c, z0, t):
    # Thm 6 written out in numpy (independently of lvflow's closed forms).
    t = np.asarray(t)[:, None]
    return r * z0 / (c * z0 + (r - c * z0) * np.exp(-r * t))


def _eq158(r, c, z0, rho):
    # Eq. 158 with a = 1, ζ = r, C_k = C_kk, z0 = c_k ε (take c_k = 1, ε = z0).
    return (np.log(1 / z0) - np.log(c / (r - c * z0) * (1 - rho) / rho)) / r


def test_thm6_tiny_initial_values_and_switch_on_times():
    c = np.array([1.0, 10.0, 0.1, 1e-2, 1e2])
    z0 = np.array([1e-300, 1e-200, 1e-100, 1e-50, 1e-5])
    t_last = np.max(_eq158(R5, c, z0, 0.5))
    sol = solve_lv(lvflow.LotkaVolterra(R5, np.diag(c)), z0, 1.5 * t_last, rtol=1e-11, atol=1e-11)
    assert bool(sol.success)
    exact = _thm6(R5, c, z0, sol.ts)
    assert np.max(np.abs(np.asarray(sol.zs) / exact - 1)) < 1e-8
    np.testing.assert_allclose(np.asarray(sol.z_inf), R5 / c, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(sol.switch_on_times), _eq158(R5, c, z0, 0.5), rtol=1e-6)
    # Loss in modes vs its definition L = zᵀCz/8 − rᵀz/4 (+ y2 = 0).
    z = np.asarray(sol.zs)
    np.testing.assert_allclose(np.asarray(sol.loss), (c * z**2).sum(1) / 8 - z @ R5 / 4, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("rho", [0.1, 0.9])
def test_switch_on_times_other_rho(rho):
    c = np.ones(5)
    z0 = np.full(5, 1e-5)
    sol = solve_lv(lvflow.LotkaVolterra(R5, np.diag(c)), z0, 400.0, rho=rho, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(np.asarray(sol.switch_on_times), _eq158(R5, c, z0, rho), rtol=1e-6)


def test_fig3_left_vs_numpy_gd_on_W():
    # m = 5 diagonal A_μ whose diagonals are the columns of a random orthogonal matrix, scaled so
    # C_kk = 1; targets chosen so r = (1, ½, ¼, ⅛, 1/16); W(0) = √ε I; full-batch GD, lr 0.01.
    m = p = 5
    eps, eta = 1e-5, 0.01
    Q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(p, p)))
    s = np.sqrt(m / 8)
    lam = s * Q.T  # lam[μ, k] = s Q_kμ
    A = np.array([np.diag(l) for l in lam])
    y = m / (8 * s) * Q.T @ R5
    C = 8 / m * lam.T @ lam
    r = 8 / m * lam.T @ y
    np.testing.assert_allclose(C, np.eye(p), atol=1e-12)
    np.testing.assert_allclose(r, R5, atol=1e-12)
    system = lvflow.LotkaVolterra(r, np.eye(p), y2=np.mean(y**2))
    # Gradient flow Ẇ = −∇L (Eq. 27, L without a ½) is GD's limit with t = η · step.
    n_steps = 25_000
    ts = n_steps * eta * np.r_[0.0, np.logspace(-4.0, 0.0, 399)]  # 0 and log-spaced times, as solve_lv's default
    save = np.unique(np.round(ts / eta).astype(int))
    sol = solve_lv(system, np.full(p, eps), n_steps * eta, ts=save * eta, rtol=1e-11, atol=1e-11)
    W = np.sqrt(eps) * np.eye(p)
    gd_loss = np.empty(len(save))
    j = 0
    for n in range(n_steps + 1):
        delta = np.einsum("mij,ij->m", A, W @ W.T) - y
        if n == save[j]:
            gd_loss[j] = np.mean(delta**2)
            j += 1
            if j == len(save):
                break
        W = W - eta * (4 / m) * np.einsum("m,mij->ij", delta, A) @ W
    scale = gd_loss[0]
    err = np.max(np.abs(np.asarray(sol.loss) - gd_loss)) / scale
    assert err < 0.01, err
    # The loss has its plateaus: after the last switch-on it is at the saturated value.
    assert float(sol.loss[-1]) == pytest.approx(float(system.loss(system.equilibrium())), abs=1e-7 * scale)


def _competitive():
    # Mode 1 (r = 0.8) grows first, then is driven extinct by modes 0 and 2 (w_1 < 0 at z*).
    r = np.array([1.0, 0.8, 0.5])
    C = np.array([[1.0, 0.95, 0.2], [0.95, 1.0, 0.2], [0.2, 0.2, 1.0]])
    return lvflow.LotkaVolterra(r, C), np.array([1e-6, 1e-6, 1e-8])


@pytest.mark.smoke
def test_coupled_extinction_vs_scipy_radau():
    system, z0 = _competitive()
    r, C = np.asarray(system.r), np.asarray(system.C)
    t1 = 120.0
    ts = np.linspace(0, t1, 41)
    sol = solve_lv(system, z0, t1, ts=ts, rtol=1e-11, atol=1e-11)
    z_inf = np.asarray(sol.z_inf)
    assert z_inf[1] == 0 and np.all(z_inf[[0, 2]] > 0)
    np.testing.assert_allclose(z_inf[[0, 2]], np.linalg.solve(C[np.ix_([0, 2], [0, 2])], r[[0, 2]]), rtol=1e-12)
    assert np.isinf(sol.switch_on_times[1])
    # Independent: scipy Radau in z with exact Jacobian; crossings of ρ z_k(∞) by scipy's events.
    events = [lambda t, z, k=k: z[k] - 0.5 * z_inf[k] for k in (0, 2)]
    ref = solve_ivp(
        lambda t, z: z * (r - C @ z),
        (0, t1),
        z0,
        method="Radau",
        t_eval=ts,
        rtol=1e-12,
        atol=1e-30,
        jac=lambda t, z: np.diag(r - C @ z) - z[:, None] * C,
        events=events,
    )
    np.testing.assert_allclose(np.asarray(sol.zs), ref.y.T, rtol=1e-6)
    assert np.max(ref.y[1]) > 1e4 * z0[1]  # mode 1 did grow before it died out
    for j, k in enumerate((0, 2)):
        assert float(sol.switch_on_times[k]) == pytest.approx(ref.t_events[j][0], rel=1e-6)


def test_singular_C_uses_the_end_state():
    # Two identical features: u̇_0 = u̇_1, so z_0/z_1 is conserved and z_0 + z_1 → 1.
    r = np.array([1.0, 1.0, 0.5])
    C = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    z0 = np.array([1e-6, 3e-6, 1e-6])
    sol = solve_lv(lvflow.LotkaVolterra(r, C), z0, 120.0, ts=np.linspace(0, 120.0, 41), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(np.asarray(sol.z_inf), [0.25, 0.75, 0.5], rtol=1e-8)
    # Each of the twins behaves as a logistic with rate 1 for the pair: t* from z0_0 + z0_1.
    s0 = z0[0] + z0[1]
    np.testing.assert_allclose(float(sol.switch_on_times[0]), np.log((1 - s0) / s0), rtol=1e-6)
    # An explicit z_inf is used as given: targets ρ z_inf = (0.2, 1.0, 0.3).
    given = solve_lv(
        lvflow.LotkaVolterra(r, C),
        z0,
        120.0,
        ts=np.linspace(0, 120.0, 41),
        rtol=1e-11,
        atol=1e-11,
        z_inf=[0.4, 2.0, 0.6],
    )
    np.testing.assert_array_equal(np.asarray(given.z_inf), [0.4, 2.0, 0.6])
    t2 = -2 * np.log((0.5 * z0[2] / 0.3 - z0[2]) / (0.5 - z0[2]))  # logistic, r = 0.5, C = 1
    np.testing.assert_allclose(np.asarray(given.switch_on_times)[[0, 2]], [np.log(4 * (1 - s0) / s0), t2], rtol=1e-6)
    assert np.isinf(given.switch_on_times[1])  # z_1 → 0.75 never reaches 1.0


@pytest.mark.slow
def test_vmap_over_z0_and_systems_equals_loop():
    system, z0 = _competitive()
    ts = np.linspace(0, 120.0, 41)
    z0s = z0 * np.array([[1.0], [0.1], [10.0]])
    solve = lambda s, z: solve_lv(s, z, 120.0, ts=ts, rtol=1e-11, atol=1e-11)
    batched = jax.vmap(lambda z: solve(system, z))(jnp.asarray(z0s))
    for i, z in enumerate(z0s):
        one = solve(system, z)
        np.testing.assert_allclose(np.asarray(batched.zs[i]), np.asarray(one.zs), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(batched.switch_on_times[i]), np.asarray(one.switch_on_times), rtol=1e-13)
    # Over systems (traced r and C: the equilibrium is found in JAX).
    scales = np.array([1.0, 0.5, 2.0])
    rs = np.asarray(system.r) * scales[:, None]
    by_system = jax.jit(jax.vmap(lambda r: solve(lvflow.LotkaVolterra(r, system.C), jnp.asarray(z0))))(jnp.asarray(rs))
    for i, r in enumerate(rs):
        one = solve(lvflow.LotkaVolterra(r, system.C), z0)
        np.testing.assert_allclose(np.asarray(by_system.z_inf[i]), np.asarray(one.z_inf), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.asarray(by_system.zs[i]), np.asarray(one.zs), rtol=1e-10)
        np.testing.assert_allclose(
            np.asarray(by_system.switch_on_times[i]), np.asarray(one.switch_on_times), rtol=1e-10
        )


def test_nonpositive_rates_never_switch_on():
    r = np.array([1.0, 0.0, -0.5])
    c = np.array([1.0, 1.0, 1.0])
    z0 = np.array([1e-3, 1e-3, 1e-3])
    ts = np.linspace(0, 50.0, 41)
    sol = solve_lv(lvflow.LotkaVolterra(r, np.diag(c)), z0, 50.0, ts=ts, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(np.asarray(sol.zs)[:, 1:], _thm6_nonpositive(r[1:], c[1:], z0[1:], ts), rtol=1e-8)
    assert np.isfinite(sol.switch_on_times[0]) and np.all(np.isinf(sol.switch_on_times[1:]))


def _thm6_nonpositive(r, c, z0, t):
    t = np.asarray(t)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(r == 0, z0 / (1 + c * z0 * t), r * z0 / (c * z0 + (r - c * z0) * np.exp(-r * t)))


def test_solver_failure_raises_or_flags():
    system, z0 = _competitive()
    ts = np.linspace(0, 120.0, 41)
    # Eagerly and under jit diffrax's message comes through equinox's runtime error.
    with pytest.raises(Exception, match="maximum number of solver steps was reached"):
        solve_lv(system, z0, 120.0, ts=ts, max_steps=8)
    jitted = jax.jit(lambda z: solve_lv(system, z, 120.0, ts=ts, max_steps=8).zs)
    with pytest.raises(Exception, match="maximum number of solver steps was reached"):
        jax.block_until_ready(jitted(jnp.asarray(z0)))
    sol = solve_lv(system, z0, 120.0, ts=ts, max_steps=8, throw=False)
    assert not bool(sol.success)


def test_progress_bar_on_the_ode_path(capfd):
    # progress=True hands diffeqsolve a TqdmProgressMeter: one bar on stderr, rising from 0%
    # through intermediate values to 100%, and the solution bit-for-bit that of progress=False.
    system, z0 = _competitive()
    ts = np.linspace(0, 120.0, 41)
    tol = dict(rtol=1e-11, atol=1e-11)  # as test_vmap_over_z0_and_systems_equals_loop: one compilation
    plain = solve_lv(system, z0, 120.0, ts=ts, **tol)
    assert capfd.readouterr().err == ""
    shown = solve_lv(system, z0, 120.0, ts=ts, progress=True, **tol)
    err = capfd.readouterr().err
    pct = [float(p) for p in re.findall(r"(\d+\.\d\d)%\|", err)]
    assert pct[0] == 0.0 and pct[-1] == 100.0 and pct == sorted(pct)  # diffrax's tqdm format
    assert pct.count(0.0) == 1 and pct.count(100.0) == 1  # one bar, opened and closed once
    assert sum(0 < p < 100 for p in pct) >= 5  # refreshed along the way (every 20 steps)
    assert int(plain.num_steps) > 100
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(shown)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(lvflow.LvflowError, match="progress"):
        solve_lv(system, z0, 120.0, progress="yes")


def test_input_errors():
    system, z0 = _competitive()
    # Input of the wrong kind or shape: LvflowError; values out of range: equinox's run-time error
    # (the same check eagerly and under jit), its message naming the input.
    with pytest.raises(Exception, match="z0: must be > 0"):
        solve_lv(system, np.array([1e-3, 0.0, 1e-3]), 10.0)
    with pytest.raises(Exception, match="z0: must be > 0"):
        jax.jit(lambda z: solve_lv(system, z, 10.0).zs)(jnp.array([1e-3, 0.0, 1e-3]))
    with pytest.raises(lvflow.LvflowError, match="z0"):
        solve_lv(system, np.array([1e-3, np.nan, 1e-3]), 10.0)
    with pytest.raises(lvflow.LvflowError, match="z0"):
        solve_lv(system, np.array([1e-3, 1e-3]), 10.0)
    with pytest.raises(Exception, match="t1: must be > 0"):
        solve_lv(system, z0, 0.0)
    with pytest.raises(Exception, match="rho: must lie in"):
        solve_lv(system, z0, 10.0, rho=1.0)
    with pytest.raises(Exception, match="rho: must lie in"):
        solve_lv(system, z0, 10.0, rho=0.0)
    with pytest.raises(Exception, match="ts: must lie in"):
        solve_lv(system, z0, 10.0, ts=[0.0, 11.0])
    with pytest.raises(Exception, match="ts: must be non-decreasing"):
        solve_lv(system, z0, 10.0, ts=[0.0, 2.0, 1.0])
    with pytest.raises(lvflow.LvflowError, match="ts: is empty"):
        solve_lv(system, z0, 10.0, ts=[])
    with pytest.raises(Exception, match="z_inf: must be >= 0"):
        solve_lv(system, z0, 10.0, z_inf=[1.0, -1.0, 1.0])
    diagonal = lvflow.LotkaVolterra(R5[:3], np.eye(3))  # the closed form checks the same values
    with pytest.raises(Exception, match="z0: must be > 0"):
        solve_lv(diagonal, np.array([1e-3, -1.0, 1e-3]), 10.0)
    with pytest.raises(Exception, match="ts: must lie in"):
        solve_lv(diagonal, z0, 10.0, ts=[-1.0, 1.0])
    with pytest.raises(lvflow.NotPSDError, match="C"):
        lvflow.LotkaVolterra([1.0, 1.0], [[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(lvflow.LvflowError, match="r"):
        lvflow.LotkaVolterra([1.0, np.nan], np.eye(2))
    with pytest.raises(lvflow.LvflowError, match="grows without bound"):
        solve_lv(lvflow.LotkaVolterra([1.0, 1.0], np.diag([1.0, 0.0])), [1e-3, 1e-3], 10.0)
    with pytest.raises(lvflow.LvflowError, match="system"):
        solve_lv(np.eye(3), z0, 10.0)


def test_low_rank_system_matches_dense():
    LowRank = getattr(lvflow, "LowRankLotkaVolterra", None)
    if LowRank is None:
        pytest.skip("LowRankLotkaVolterra not available")
    r = np.array([1.0, 0.8, 0.5])
    d = np.array([0.1, 0.05, 0.8])
    U = np.array([[0.9, 0.1], [0.95, 0.0], [0.2, 0.4]])
    z0 = np.array([1e-6, 1e-6, 1e-8])
    ts = np.linspace(0, 120.0, 41)
    dense = solve_lv(lvflow.LotkaVolterra(r, np.diag(d) + U @ U.T), z0, 120.0, ts=ts, rtol=1e-11, atol=1e-11)
    low = solve_lv(LowRank(r, d, U), z0, 120.0, ts=ts, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(np.asarray(low.zs), np.asarray(dense.zs), rtol=1e-9)
    np.testing.assert_allclose(np.asarray(low.z_inf), np.asarray(dense.z_inf), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(np.asarray(low.switch_on_times), np.asarray(dense.switch_on_times), rtol=1e-9)
    np.testing.assert_allclose(np.asarray(low.loss), np.asarray(dense.loss), rtol=1e-9, atol=1e-15)


# --- solver=ClosedForm() (Thm 6) against the ODE path and against independent numpy -----------

_K6 = 6


def _random_diagonal(seed):
    rng = np.random.default_rng(seed)
    r = rng.uniform(0.05, 1.0, _K6) * rng.choice([1.0, 1.0, 1.0, -1.0, 0.0], _K6)
    r[0] = abs(r[0]) + 0.05  # at least one mode switches on
    c = 10.0 ** rng.uniform(-2, 2, _K6)
    z0 = 10.0 ** rng.uniform(-300, -1, _K6)
    z0[1] = 1e-300
    return r, c, z0


@settings(max_examples=4, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1))
def test_closed_form_matches_ode_on_random_diagonal_systems(seed):
    r, c, z0 = _random_diagonal(seed)
    system = lvflow.LotkaVolterra(r, np.diag(c))
    live = r > 0
    t_on = _eq158(r[live], c[live], z0[live], 0.5)
    t1 = 1.3 * float(np.max(t_on))
    ts = np.linspace(0.0, t1, 9)
    exact = solve_lv(system, z0, t1, ts=ts)  # default: the closed form for a declared diagonal C
    ode = solve_lv(system, z0, t1, ts=ts, solver=lvflow.Rodas5P(), rtol=1e-12, atol=1e-12)
    assert int(exact.num_steps) == 0 and int(ode.num_steps) > 0 and bool(exact.success)
    np.testing.assert_allclose(np.asarray(exact.zs), np.asarray(ode.zs), rtol=1e-8)
    np.testing.assert_allclose(np.asarray(exact.loss), np.asarray(ode.loss), rtol=1e-8, atol=1e-300)
    t_exact, t_ode = np.asarray(exact.switch_on_times), np.asarray(ode.switch_on_times)
    np.testing.assert_array_equal(np.isinf(t_exact), ~live)
    np.testing.assert_array_equal(np.isinf(t_ode), ~live)
    np.testing.assert_allclose(t_exact[live], t_ode[live], rtol=1e-8)
    # And against Eq. 158 written out in numpy, and Thm 6 for the nonpositive rates.
    np.testing.assert_allclose(t_exact[live], t_on, rtol=1e-13)
    with np.errstate(over="ignore"):
        ref = _thm6_nonpositive(r[~live], c[~live], z0[~live], ts)
    # (values below float64's normal range, 2.2e-308, are flushed to 0 by XLA on CPU)
    np.testing.assert_allclose(np.asarray(exact.zs)[:, ~live], ref, rtol=1e-13, atol=3e-308)


def test_closed_form_switch_on_edge_cases():
    # Mode 0 starts above its target (t* = 0), mode 1 above saturation (decays; t* = 0), mode 2's
    # given target 2 r/C is never reached (inf), mode 3's is past t1 (inf), mode 4 crosses a
    # given target below saturation: t* from Thm 6 solved for z = T by hand.
    r = np.array([1.0, 1.0, 1.0, 0.01, 0.5])
    c = np.ones(5)
    z0 = np.array([0.6, 3.0, 1e-3, 1e-9, 1e-4])
    T = np.array([0.5, 0.5, 2.0, 0.005, 0.1])
    sol = solve_lv(lvflow.LotkaVolterra(r, np.diag(c)), z0, 100.0, rho=0.5, z_inf=2 * T, solver=ClosedForm())
    t = np.asarray(sol.switch_on_times)
    assert t[0] == 0 and t[1] == 0 and np.isinf(t[2]) and np.isinf(t[3])
    e = (z0[4] / T[4] - c[4] * z0[4] / r[4]) / (1 - c[4] * z0[4] / r[4])  # e^{−r t*}
    assert t[4] == pytest.approx(-np.log(e) / r[4], rel=1e-13)


def test_closed_form_under_vmap_and_jit():
    c = np.array([1.0, 10.0, 0.1, 1e-2, 1e2])
    z0s = np.array([[1e-300, 1e-200, 1e-100, 1e-50, 1e-5], [1e-6] * 5, [1e-3, 1e-4, 1e-5, 1e-6, 1e-7]])
    ts = np.linspace(0.0, 2000.0, 5)
    system = lvflow.LotkaVolterra(R5, np.diag(c))
    batched = jax.vmap(lambda z: solve_lv(system, z, 2000.0, ts=ts))(jnp.asarray(z0s))
    assert np.all(np.asarray(batched.num_steps) == 0)
    for i, z0 in enumerate(z0s):
        np.testing.assert_allclose(np.asarray(batched.zs[i]), _thm6(R5, c, z0, ts), rtol=1e-13)
        np.testing.assert_allclose(np.asarray(batched.switch_on_times[i]), _eq158(R5, c, z0, 0.5), rtol=1e-13)
    # Traced r with a concrete diagonal C: still the closed form, z(∞) = r/C found in JAX.
    rs = R5 * np.array([[1.0], [0.5]])
    by_r = jax.vmap(lambda r: solve_lv(lvflow.LotkaVolterra(r, np.diag(c), check=False), z0s[1], 2000.0, ts=ts))(rs)
    assert np.all(np.asarray(by_r.num_steps) == 0)
    for i, r in enumerate(rs):
        np.testing.assert_allclose(np.asarray(by_r.z_inf[i]), r / c, rtol=1e-15)
        np.testing.assert_allclose(np.asarray(by_r.switch_on_times[i]), _eq158(r, c, z0s[1], 0.5), rtol=1e-13)

    # A traced diagonal: a LowRankLotkaVolterra without columns declares it (a traced dense C does
    # not, so ClosedForm() refuses it when tracing).
    def forced(d, C=None):
        system = lvflow.LowRankLotkaVolterra(R5, d, np.zeros((5, 0))) if C is None else lvflow.LotkaVolterra(R5, C)
        return solve_lv(system, z0s[1], 2000.0, ts=ts, solver=ClosedForm()).switch_on_times

    np.testing.assert_allclose(np.asarray(jax.jit(forced)(c)), _eq158(R5, c, z0s[1], 0.5), rtol=1e-13)
    with pytest.raises(lvflow.LvflowError, match="ClosedForm.. needs a diagonal C"):
        jax.jit(lambda C: forced(c, C))(np.diag(c))


def test_result_is_a_diffrax_flag_on_every_path():
    # `LVSolution.result` is stored as its code (the closed form does not import diffrax) and read
    # back as a `diffrax.RESULTS` item, on the closed form, under vmap, and on the ODE path.
    c = np.array([1.0, 10.0, 0.1, 1e-2, 1e2])
    system = lvflow.LotkaVolterra(R5, np.diag(c))
    closed = solve_lv(system, np.full(5, 1e-6), 100.0)
    # the closed form's stored code is diffrax's `successful`: read back as it, and counted a success
    assert isinstance(closed.result, dfx.RESULTS) and closed.result == dfx.RESULTS.successful and bool(closed.success)
    batched = jax.vmap(lambda z: solve_lv(system, z, 100.0))(jnp.full((3, 5), 1e-6))
    assert isinstance(batched.result, dfx.RESULTS) and np.all(np.asarray(batched.result == dfx.RESULTS.successful))
    competitive, z0 = _competitive()
    ode = solve_lv(competitive, z0, 120.0)
    assert ode.result == dfx.RESULTS.successful and bool(ode.success)
    assert jax.tree_util.tree_structure(ode) == jax.tree_util.tree_structure(closed)  # one pytree for both paths
    failed = solve_lv(competitive, z0, 120.0, max_steps=8, throw=False)
    assert failed.result == dfx.RESULTS.max_steps_reached and not bool(failed.success)
    assert "maximum number of solver steps" in dfx.RESULTS[failed.result]
    # The constructor takes the item, as before.
    fields = {k: getattr(failed, k) for k in ("ts", "zs", "loss", "switch_on_times", "z_inf", "rho", "success")}
    stats = {k: getattr(failed, k) for k in ("num_steps", "num_accepted_steps", "num_rejected_steps")}
    rebuilt = lvflow.LVSolution(**fields, **stats, result=dfx.RESULTS.max_steps_reached)
    assert rebuilt.result == dfx.RESULTS.max_steps_reached


def test_solver_errors():
    system, z0 = _competitive()
    with pytest.raises(lvflow.LvflowError, match=r"solver: ClosedForm\(\) needs a diagonal C"):
        solve_lv(system, z0, 10.0, solver=ClosedForm())
    with pytest.raises(lvflow.LvflowError, match="solver: expected lvflow.ClosedForm"):
        solve_lv(system, z0, 10.0, solver="closed_form")


# --- the Rodas5P path (default for a coupled C) against scipy Radau ------------------------------


def test_low_rank_rodas5p_with_extinctions_vs_scipy_radau():
    # C = Diag(½) + UUᵀ with a random rank-2 U: two of the 12 modes are driven extinct.
    K = 12
    rng = np.random.default_rng(4)
    r = np.linspace(1.0, 0.3, K)
    d = np.full(K, 0.5)
    U = rng.normal(0.0, 0.4, (K, 2))
    z0 = 10.0 ** rng.uniform(-10, -4, K)
    C = np.diag(d) + U @ U.T
    t1 = 300.0
    ts = np.linspace(0.0, t1, 31)
    sol = solve_lv(lvflow.LowRankLotkaVolterra(r, d, U), z0, t1, ts=ts, rtol=1e-10, atol=1e-12)
    assert bool(sol.success) and int(sol.num_steps) > 0
    z_inf = np.asarray(sol.z_inf)
    dead = z_inf == 0
    assert dead.sum() == 2 and np.all(r[dead] > 0)
    w = r - C @ z_inf  # KKT of the saturated equilibrium
    assert np.max(np.abs(w[~dead])) < 1e-12 and np.all(w[dead] < 0)
    # Independent: Radau in u = ln z with the exact Jacobian −C Diag(e^u), crossings by events.
    target = np.log(0.5 * z_inf[~dead])
    live = np.flatnonzero(~dead)
    events = [lambda t, u, k=k, g=g: u[k] - g for k, g in zip(live, target)]
    ref = solve_ivp(
        lambda t, u: r - C @ np.exp(u),
        (0, t1),
        np.log(z0),
        method="Radau",
        t_eval=ts,
        rtol=1e-13,
        atol=1e-13,
        jac=lambda t, u: -C * np.exp(u)[None, :],
        events=events,
    )
    np.testing.assert_allclose(np.asarray(sol.zs), np.exp(ref.y.T), rtol=1e-7)
    assert np.max(np.exp(ref.y[dead])) > 1e3 * np.max(z0[dead])  # the extinct modes grew first
    t_ref = np.array([te[0] for te in ref.t_events])
    np.testing.assert_allclose(np.asarray(sol.switch_on_times)[live], t_ref, rtol=1e-8)
    assert np.all(np.isinf(np.asarray(sol.switch_on_times)[dead]))
    # The diffrax path (solver= given) agrees at its own tolerance.
    dop = solve_lv(lvflow.LowRankLotkaVolterra(r, d, U), z0, t1, ts=ts, rtol=1e-10, atol=1e-12, solver=dfx.Dopri5())
    np.testing.assert_allclose(np.asarray(dop.zs), np.asarray(sol.zs), rtol=1e-7)


def test_rodas5p_switch_on_accuracy_at_default_tolerances():
    # Fig 3 right at K = 60 (r_k = k^−0.8, V_k = k^−2, z_k0 = 1e-6 k^−1.2) through the ODE path at
    # the default rtol/atol: every switch-on time within 1e-7 of Eq. 158 and z within 1e-6 of Thm 6
    # (max-norm error control and the solver's own dense output, not a grid).
    k = np.arange(1, 61, dtype=float)
    r = k**-0.8
    c = r**2 / (8 * k**-2.0)
    z0 = 1e-6 * k**-1.2
    t_on = _eq158(r, c, z0, 0.5)
    t1 = 1.2 * float(t_on.max())
    ts = np.linspace(0.0, t1, 50)
    sol = solve_lv(lvflow.LotkaVolterra(r, np.diag(c)), z0, t1, ts=ts, solver=lvflow.Rodas5P())
    assert int(sol.num_steps) > 0
    np.testing.assert_allclose(np.asarray(sol.switch_on_times), t_on, rtol=1e-7)
    np.testing.assert_allclose(np.asarray(sol.zs), _thm6(r, c, z0, ts), rtol=1e-6)


def test_vmapped_gradients_are_finite_and_equal_the_unbatched_ones():
    # Under vmap diffrax keeps stepping finished members with zero-length steps; their derivative
    # must not turn into NaN (1/h at h = 0). Each row of the batched gradient equals its own
    # unbatched gradient.
    system, z0 = _competitive()
    z0s = jnp.stack([jnp.asarray(z0), jnp.asarray(z0) * 1e3])

    def total(z0):
        return jnp.sum(solve_lv(system, z0, 120.0, ts=[0.0, 120.0]).switch_on_times[jnp.array([0, 2])])

    batched = jax.vmap(jax.grad(total))(z0s)
    assert np.all(np.isfinite(np.asarray(batched)))
    for row, z in zip(batched, z0s):
        np.testing.assert_allclose(np.asarray(row), np.asarray(jax.grad(total)(z)), rtol=1e-8)


def test_any_diffrax_solver_and_adjoint_through_the_tracker():
    # An implicit solver (diffrax reads its root finder through the tracker) and an explicit
    # Runge–Kutta one under ForwardMode (its scan_kind) give the same switch-on times as Rodas5P;
    # adjoints that cannot differentiate the saved tracker state are refused up front.
    system, z0 = _competitive()
    ts = [0.0, 120.0]
    ref = np.asarray(solve_lv(system, z0, 120.0, ts=ts, rtol=1e-10, atol=1e-12).switch_on_times)
    for kw in (dict(solver=dfx.Kvaerno5()), dict(solver=dfx.Tsit5(), adjoint=dfx.ForwardMode())):
        got = np.asarray(solve_lv(system, z0, 120.0, ts=ts, rtol=1e-10, atol=1e-12, **kw).switch_on_times)
        np.testing.assert_allclose(got, ref, rtol=1e-6)
    with pytest.raises(lvflow.LvflowError, match="adjoint"):
        solve_lv(system, z0, 120.0, adjoint=dfx.BacksolveAdjoint())
    with pytest.raises(lvflow.LvflowError, match="Rodas5P solves ODEs"):
        control = dfx.ControlTerm(
            lambda t, y, args: -y, dfx.LinearInterpolation(jnp.array([0.0, 1.0]), jnp.array([0.0, 1.0]))
        )
        dfx.diffeqsolve(control, lvflow.Rodas5P(), 0.0, 1.0, 0.1, jnp.ones(()))


def test_closed_form_takes_a_subnormal_z0_from_its_log():
    # z0 below the smallest normal double (compiled code reads it as 0): Thm 6 and Eq. 158 from
    # ln z0, against numpy, which keeps subnormals. C = 1e300 makes C z0 = 1e-10 a normal number.
    r, c = np.array([1.0, 0.5]), np.array([1e300, 2.0])
    z0 = np.array([1e-310, 5e-324])
    ts = np.array([0.0, 100.0, 1490.0, 2000.0])
    sol = solve_lv(lvflow.LotkaVolterra(r, np.diag(c)), z0, 2000.0, ts=ts)
    T = 0.5 * r / c
    exact_t = (np.log(T) - np.log(z0) + np.log((r - c * z0) / (r - c * T))) / r  # Eq. 158 in logs
    np.testing.assert_allclose(np.asarray(sol.switch_on_times), exact_t, rtol=1e-13)
    # ln z(t) = ln z0 − ln(e^{−rt} + C z0 (1 − e^{−rt})/r), the sum in logs (C z0 may be subnormal)
    t = ts[:, None]
    with np.errstate(divide="ignore"):  # ln φ = −inf at t = 0
        log_z = np.log(z0) - np.logaddexp(-r * t, np.log(c) + np.log(z0) + np.log(-np.expm1(-r * t) / r))
    exact_z = np.exp(log_z)
    normal = exact_z > np.finfo(float).tiny
    assert normal[1:, 0].all() and normal[2:, 1].all()
    np.testing.assert_allclose(np.asarray(sol.zs)[normal], exact_z[normal], rtol=1e-12)
    assert np.all(np.asarray(sol.zs)[~normal] <= np.finfo(float).tiny)
