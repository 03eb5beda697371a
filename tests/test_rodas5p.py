"""lvflow.Rodas5P and lvflow.SwitchOnTracker against closed forms and scipy (Radau/LSODA at tight
tolerance): convergence orders of the step and its dense output, stiff and time-dependent
problems, the gLV in log variables with each structure of C, switch-on times (Thm 6) under three
solvers, jit and vmap; the structured stage solves against dense numpy solves."""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings, strategies as st
from scipy.integrate import solve_ivp

import lvflow


def _solve(term, solver, t1, y0, *, dt0=None, controller=None, saveat=None, args=None, max_steps=100_000):
    # t0, t1 and dt0 as arrays so that repeated solves of one problem share a compilation.
    return dfx.diffeqsolve(
        term,
        solver,
        jnp.asarray(0.0),
        jnp.asarray(t1, dtype=float),
        None if dt0 is None else jnp.asarray(dt0, dtype=float),
        jnp.asarray(y0, dtype=float),
        args=args,
        stepsize_controller=controller if controller is not None else dfx.ConstantStepSize(),
        saveat=saveat if saveat is not None else dfx.SaveAt(t1=True),
        max_steps=max_steps,
    )


def _slope(ns, errs):
    # Order p from err ∝ n^(−p): least-squares slope of −log err against log n.
    return -np.polyfit(np.log(ns), np.log(errs), 1)[0]


# ---------------------------------------------------------------------------------------------
# 1. Constant-step convergence: order 5 at the step's end, order ≥ 4 for the dense output.

_NS = np.array([10, 20, 40, 80])


def _convergence(f, exact, T, y0, t_dense, ns=_NS):
    term = dfx.ODETerm(f)
    end_errs, dense_errs = [], []
    for n in ns:
        sol = _solve(term, lvflow.Rodas5P(), T, y0, dt0=T / n, saveat=dfx.SaveAt(t1=True, dense=True))
        assert sol.result == dfx.RESULTS.successful
        assert int(sol.stats["num_steps"]) == n
        end_errs.append(np.max(np.abs(np.asarray(sol.ys[-1]) - exact(T))))
        dense = np.asarray(jax.vmap(sol.evaluate)(jnp.asarray(t_dense)))
        dense_errs.append(np.max(np.abs(dense - np.stack([exact(t) for t in t_dense]))))
    return np.array(end_errs), np.array(dense_errs)


_LAM = np.array([1.0, 2.0])
_Y0_LIN = np.array([1.0, -0.5])


def _linear_forced_exact(t):
    # y' = −Λy + sin t: y = (y0 + 1/(λ²+1)) e^{−λt} + (λ sin t − cos t)/(λ²+1).
    return (_Y0_LIN + 1 / (_LAM**2 + 1)) * np.exp(-_LAM * t) + (_LAM * np.sin(t) - np.cos(t)) / (_LAM**2 + 1)


def test_convergence_order_time_dependent_linear():
    T = 2.0
    f = lambda t, y, args: -jnp.asarray(_LAM) * y + jnp.sin(t)  # noqa: E731
    # Interior points off every step grid (and off the step ends).
    t_dense = np.linspace(0.0137, T - 0.0137, 61)
    end, dense = _convergence(f, _linear_forced_exact, T, _Y0_LIN, t_dense)
    p_end, p_dense = _slope(_NS, end), _slope(_NS, dense)
    print(f"linear forced: end errors {end}, slope {p_end:.3f}; dense errors {dense}, slope {p_dense:.3f}")
    assert 4.7 <= p_end <= 5.3
    assert p_dense >= 3.7
    assert end[-1] < 1e-9 and dense[-1] < 1e-8


def _logistic_exact(t):
    # y' = y(1 − y), y(0) = 0.1: y = 1/(1 + 9 e^{−t}).
    return np.array([1 / (1 + 9 * np.exp(-t)), 0.3 / (0.3 + 0.7 * np.exp(-2 * t))])


def test_convergence_order_autonomous_logistic():
    # Two uncoupled logistics (rates 1 and 2) as one 2-d autonomous ODE.
    T = 4.0
    f = lambda t, y, args: jnp.array([1.0, 2.0]) * y * (1 - y)  # noqa: E731
    t_dense = np.linspace(0.021, T - 0.021, 61)
    ns = 2 * _NS  # n = 10 is not yet asymptotic here (error ratio 52 from 10 to 20 steps)
    end, dense = _convergence(f, _logistic_exact, T, _logistic_exact(0.0), t_dense, ns)
    p_end, p_dense = _slope(ns, end), _slope(ns, dense)
    print(f"logistic: end errors {end}, slope {p_end:.3f}; dense errors {dense}, slope {p_dense:.3f}")
    assert 4.7 <= p_end <= 5.3
    assert p_dense >= 3.7


# ---------------------------------------------------------------------------------------------
# 2. Adaptive steps on stiff problems.

_PID = dfx.PIDController(rtol=1e-8, atol=1e-10)


_P = np.array([[1.0, 1.0], [0.5, -2.0]])
_A_STIFF = _P @ np.diag([-1.0, -1e4]) @ np.linalg.inv(_P)  # eigenvalues −1, −1e4, non-normal


def _s(t):
    return np.array([np.sin(t), np.cos(2 * t)])


def _stiff_linear(t, y, args):
    # y' = A (y − s(t)) + s'(t): exact y(t) = s(t) + e^{tA} (y0 − s(0)).
    s = jnp.stack([jnp.sin(t), jnp.cos(2 * t)])
    ds = jnp.stack([jnp.cos(t), -2 * jnp.sin(2 * t)])
    return jnp.asarray(_A_STIFF) @ (y - s) + ds


def test_stiff_time_dependent_linear_vs_closed_form_and_radau():
    y0 = np.array([1.0, 2.0])
    exact = lambda t: _s(t) + scipy.linalg.expm(t * _A_STIFF) @ (y0 - _s(0.0))  # noqa: E731
    ts = np.array([1e-4, 1e-3, 0.01, 0.1, 1.0, 3.0, 7.0, 10.0])
    sol = _solve(
        dfx.ODETerm(_stiff_linear), lvflow.Rodas5P(), 10.0, y0, controller=_PID, saveat=dfx.SaveAt(ts=ts, dense=True)
    )
    assert sol.result == dfx.RESULTS.successful
    ex = np.stack([exact(t) for t in ts])
    ref = solve_ivp(
        lambda t, y: _A_STIFF @ (y - _s(t)) + np.array([np.cos(t), -2 * np.sin(2 * t)]),
        (0, 10),
        y0,
        method="Radau",
        rtol=1e-12,
        atol=1e-14,
        t_eval=ts,
        jac=_A_STIFF,
    ).y.T
    assert np.max(np.abs(ref - ex)) < 1e-9  # the two references agree
    err = np.max(np.abs(np.asarray(sol.ys) - ex))
    t_dense = np.linspace(0.0123, 9.987, 101)
    dense = np.asarray(jax.vmap(sol.evaluate)(jnp.asarray(t_dense)))
    err_dense = np.max(np.abs(dense - np.stack([exact(t) for t in t_dense])))
    steps = int(sol.stats["num_steps"])
    print(f"stiff time-dependent linear: max error {err:.2e}, dense {err_dense:.2e}, {steps} steps")
    # In the stiff regime (hλ ≫ 1) RODAS5P's error on y' = λ(y − s) + s' is of order h³ (order
    # reduction, a property of its coefficients: see the Prothero–Robinson test below), so the
    # global error may exceed rtol = 1e-8 somewhat.
    assert err < 1e-7 and err_dense < 5e-7
    assert steps < 500  # stiff, yet nowhere near the 1e5 steps an explicit method would need


def _prothero_robinson(t, y, args):
    return -1e4 * (y - jnp.sin(t)) + jnp.cos(t)


def test_prothero_robinson_constant_steps():
    # y' = −1e4 (y − sin t) + cos t, y(0) = 0: exact y = sin t. Constant steps with hλ from 5000
    # down to 625: the error falls like h³ (RODAS5P's order on this stiff problem; the scheme
    # written out independently in numpy gives the same errors). Without the h d_i ∂f/∂t terms
    # the error stalls near 1e-6 whatever the step.
    term = dfx.ODETerm(_prothero_robinson)
    ns = np.array([10, 20, 40, 80])
    errs = []
    for n in ns:
        s = _solve(term, lvflow.Rodas5P(), 5.0, np.zeros(1), dt0=5.0 / n)
        errs.append(abs(float(s.ys[-1, 0]) - np.sin(5.0)))
    p = _slope(ns, errs)
    print(f"Prothero–Robinson constant steps: errors {np.array(errs)}, slope {p:.3f}")
    assert p >= 2.7
    assert errs[-1] < 1e-9


def test_robertson_vs_radau():
    def rober(y):
        y1, y2, y3 = y[0], y[1], y[2]
        return [-0.04 * y1 + 1e4 * y2 * y3, 0.04 * y1 - 1e4 * y2 * y3 - 3e7 * y2**2, 3e7 * y2**2]

    ts = np.array([1e-3, 0.1, 1.0, 10.0, 100.0, 1000.0])
    y0 = np.array([1.0, 0.0, 0.0])
    sol = _solve(
        dfx.ODETerm(lambda t, y, args: jnp.stack(rober(y))),
        lvflow.Rodas5P(),
        1000.0,
        y0,
        dt0=1e-6,
        controller=dfx.PIDController(rtol=1e-8, atol=1e-12),
        saveat=dfx.SaveAt(ts=ts),
    )
    assert sol.result == dfx.RESULTS.successful
    ref = solve_ivp(lambda t, y: rober(y), (0, 1000), y0, method="Radau", rtol=1e-12, atol=1e-18, t_eval=ts).y.T
    ys = np.asarray(sol.ys)
    rel = np.max(np.abs(ys - ref) / np.maximum(np.abs(ref), 1e-12), axis=0)
    print(f"Robertson: relative errors per component {rel}, {int(sol.stats['num_steps'])} steps")
    assert np.all(rel < 1e-6)
    np.testing.assert_allclose(ys.sum(1), 1.0, atol=1e-12)  # mass conservation (linear invariant)


# The gLV in log variables with each structure of C, against scipy on z' = z (r − C z).

_K = 6
_R = np.array([1.0, 0.8, 0.6, 0.45, 0.3, 0.2])
_Z0 = np.array([1e-6, 1e-5, 1e-4, 1e-6, 1e-3, 1e-2])
_T_GLV = 40.0
_TS_GLV = np.array([0.5, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0])


def _systems():
    rng = np.random.default_rng(0)
    c = np.array([1.0, 2.0, 0.5, 1.5, 0.8, 1.2])
    d = rng.uniform(0.5, 1.5, _K)
    U = 0.4 * rng.standard_normal((_K, 2))
    B = 0.5 * rng.standard_normal((_K, _K))
    return {
        "diagonal": lvflow.LotkaVolterra(_R, np.diag(c)),
        "lowrank": lvflow.LowRankLotkaVolterra(_R, d, U),
        "dense": lvflow.LotkaVolterra(_R, B @ B.T + np.diag(d)),
    }


_SYSTEMS = _systems()


def _scipy_glv(C, method):
    sol = solve_ivp(
        lambda t, z: z * (_R - C @ z),
        (0, _T_GLV),
        _Z0,
        method=method,
        rtol=1e-12,
        atol=1e-20,
        dense_output=True,
        jac=lambda t, z: np.diag(_R - C @ z) - z[:, None] * C,
    )
    assert sol.success
    return sol.sol


def _log_glv(t, u, C):
    return jnp.asarray(_R) - C @ jnp.exp(u)


@pytest.mark.parametrize("kind", ["diagonal", "lowrank", "dense"])
def test_glv_log_term_structures_vs_scipy(kind):
    system = _SYSTEMS[kind]
    C = np.asarray(system.C)
    term = lvflow.LogLotkaVolterraTerm.from_system(system)
    expected_interaction = {
        "diagonal": "DiagonalInteraction",
        "lowrank": "LowRankInteraction",
        "dense": "DenseInteraction",
    }[kind]
    assert type(term.interaction).__name__ == expected_interaction
    saveat = dfx.SaveAt(ts=_TS_GLV, dense=True)
    sol = _solve(term, lvflow.Rodas5P(), _T_GLV, np.log(_Z0), controller=_PID, saveat=saveat)
    assert sol.result == dfx.RESULTS.successful
    radau, lsoda = _scipy_glv(C, "Radau"), _scipy_glv(C, "LSODA")
    ref = np.log(radau(_TS_GLV).T)
    assert np.max(np.abs(np.log(lsoda(_TS_GLV).T) - ref)) < 1e-8  # the two references agree
    err = np.max(np.abs(np.asarray(sol.ys) - ref))
    t_dense = np.linspace(0.031, _T_GLV - 0.031, 157)
    dense = np.asarray(jax.vmap(sol.evaluate)(jnp.asarray(t_dense)))
    err_dense = np.max(np.abs(dense - np.log(radau(t_dense).T)))
    print(f"gLV {kind}: max |Δ ln z| {err:.2e} at ts, {err_dense:.2e} dense, {int(sol.stats['num_steps'])} steps")
    assert err < 5e-7
    assert err_dense < 2e-6
    if kind == "diagonal":  # Thm 6 in closed form as well
        c = np.diag(C)
        exact = np.log(_R * _Z0 / (c * _Z0 + (_R - c * _Z0) * np.exp(-_R * _TS_GLV[:, None])))
        assert np.max(np.abs(np.asarray(sol.ys) - exact)) < 1e-6

    # The same log vector field as a plain ODETerm takes the jacfwd + LU path: same trajectory.
    # (C passed as args: one compilation for the three structures.)
    sol_plain = _solve(
        dfx.ODETerm(_log_glv),
        lvflow.Rodas5P(),
        _T_GLV,
        np.log(_Z0),
        controller=_PID,
        saveat=saveat,
        args=jnp.asarray(C),
    )
    assert sol_plain.result == dfx.RESULTS.successful
    diff = np.max(np.abs(np.asarray(sol_plain.ys) - np.asarray(sol.ys)))
    diff_dense = np.max(np.abs(np.asarray(jax.vmap(sol_plain.evaluate)(jnp.asarray(t_dense))) - dense))
    print(
        f"gLV {kind}: structured vs plain ODETerm {diff:.2e} at ts, {diff_dense:.2e} dense; steps "
        f"{int(sol.stats['num_steps'])} vs {int(sol_plain.stats['num_steps'])}"
    )
    assert diff < 1e-12 and diff_dense < 1e-12


# ---------------------------------------------------------------------------------------------
# 3. SwitchOnTracker: first crossings of ln(ρ z_k(∞)) against Thm 6 inverted.

_R4 = np.array([1.0, 0.5, 0.25, 2.0, 0.7])
_C4 = np.array([1.0, 10.0, 0.1, 0.5, 1.0])
_ZT0 = np.array([1e-8, 1e-5, 1e-3, 3.9, 1e-4])  # mode 3 starts above ρ r/c = 2
_RHO = 0.5


def _thm6_crossing(r, c, z0, rho):
    T = rho * r / c
    return (np.log(T / z0) + np.log((r - c * z0) / (r - c * T))) / r


@pytest.mark.parametrize("solver", [lvflow.Rodas5P(), dfx.Tsit5(), dfx.Dopri5()], ids=["Rodas5P", "Tsit5", "Dopri5"])
def test_switch_on_tracker_thm6(solver):
    threshold = np.log(_RHO * _R4 / _C4)
    threshold[4] = np.inf  # never tracked
    tracker = lvflow.SwitchOnTracker(solver, jnp.asarray(threshold))
    assert isinstance(tracker, dfx.AbstractAdaptiveSolver)
    term = lvflow.LogLotkaVolterraTerm.from_system(lvflow.LotkaVolterra(_R4, np.diag(_C4)))
    sol = _solve(
        term,
        tracker,
        120.0,
        np.log(_ZT0),
        dt0=None if isinstance(solver, lvflow.Rodas5P) else 1e-2,
        controller=dfx.PIDController(rtol=1e-10, atol=1e-10),
        saveat=dfx.SaveAt(t1=True, solver_state=True),
    )
    assert sol.result == dfx.RESULTS.successful
    t_star = np.asarray(tracker.crossing_times(sol.solver_state))
    expected = _thm6_crossing(_R4, _C4, _ZT0, _RHO)
    print(f"{type(solver).__name__}: crossing errors {t_star[:3] - expected[:3]}")
    np.testing.assert_allclose(t_star[:3], expected[:3], rtol=0, atol=1e-7)
    assert t_star[3] == 0.0
    assert t_star[4] == np.inf


def test_switch_on_tracker_isinstance_forwarding():
    th = jnp.zeros(3)
    assert isinstance(lvflow.SwitchOnTracker(lvflow.Rodas5P(), th), dfx.AbstractAdaptiveSolver)
    assert isinstance(lvflow.SwitchOnTracker(dfx.Tsit5(), th), dfx.AbstractAdaptiveSolver)
    assert not isinstance(lvflow.SwitchOnTracker(dfx.Euler(), th), dfx.AbstractAdaptiveSolver)


# ---------------------------------------------------------------------------------------------
# 4. jit and vmap over a batch of initial conditions.


_RODAS5P_GAMMA = 0.21193756319429014  # RODAS5P's γ (Steinebach 2023): stage matrices I/(hγ) − J


def test_singular_stage_solve_is_a_failed_result():
    # ẏ = λy with λ = 1/γ and h = 1: every stage matrix I/(hγ) − J = λ − λ is singular, so the stage
    # solves give non-finite values. Under a constant step size the step is kept and its flag ends
    # the solve.
    lam = 1.0 / _RODAS5P_GAMMA
    term = dfx.ODETerm(lambda t, y, args: lam * y)
    kw = dict(t0=0.0, t1=1.0, dt0=1.0, y0=jnp.ones(1), stepsize_controller=dfx.ConstantStepSize())
    sol = dfx.diffeqsolve(term, lvflow.Rodas5P(), **kw, throw=False)
    assert sol.result == dfx.RESULTS.singular
    with pytest.raises(Exception, match="non-finite"):
        dfx.diffeqsolve(term, lvflow.Rodas5P(), **kw)
    # The gLV's structured solve, backwards in time (diffeqsolve's direction wrapping looked
    # through): u̇ = 1 − λe^u at u = 0 has J = −λ, and h = −1 makes I/(hγ) − J = −λ + λ = 0.
    lv_term = lvflow.LogLotkaVolterraTerm.from_system(lvflow.LotkaVolterra([1.0], [[lam]]))
    back = dict(kw, t1=-1.0, dt0=-1.0, y0=jnp.zeros(1))
    assert dfx.diffeqsolve(lv_term, lvflow.Rodas5P(), **back, throw=False).result == dfx.RESULTS.singular
    # Away from the singular step the same problems succeed (no spurious flag).
    sol = dfx.diffeqsolve(term, lvflow.Rodas5P(), **dict(kw, t1=0.1, dt0=0.01))
    np.testing.assert_allclose(np.asarray(sol.ys[-1]), [np.exp(0.1 * lam)], rtol=1e-6)
    sol = dfx.diffeqsolve(lv_term, lvflow.Rodas5P(), **dict(back, t1=-0.1, dt0=-0.01))
    assert sol.result == dfx.RESULTS.successful and np.all(np.isfinite(np.asarray(sol.ys)))


def test_rodas5p_jit_vmap_over_initial_conditions():
    r, c = _R4[:3], _C4[:3]
    term = lvflow.LogLotkaVolterraTerm.from_system(lvflow.LotkaVolterra(r, np.diag(c)))
    ts = jnp.array([1.0, 5.0, 20.0, 60.0])

    @jax.jit
    @jax.vmap
    def solve(u0):
        sol = dfx.diffeqsolve(
            term,
            lvflow.Rodas5P(),
            0.0,
            60.0,
            None,
            u0,
            stepsize_controller=_PID,
            saveat=dfx.SaveAt(ts=ts),
            max_steps=10_000,
        )
        return sol.ys, sol.stats["num_steps"]

    z0 = np.array([[1e-8, 1e-5, 1e-3], [1e-2, 1e-6, 1e-9], [0.5, 3.0, 1e-4], [1e-12, 1e-12, 1e-12]])
    ys, steps = solve(jnp.log(z0))
    assert ys.shape == (4, 4, 3)
    assert len(set(np.asarray(steps).tolist())) > 1  # the batch members took their own steps
    tt = np.asarray(ts)[None, :, None]
    exact = np.log(r * z0[:, None] / (c * z0[:, None] + (r - c * z0[:, None]) * np.exp(-r * tt)))
    err = np.max(np.abs(np.asarray(ys) - exact))
    print(f"jit+vmap: max |Δ ln z| {err:.2e}, steps {np.asarray(steps)}")
    assert err < 1e-6


# ---------------------------------------------------------------------------------------------
# The term's structured stage solve, (α I − J)⁻¹ b with J = −C Diag(e^u), against numpy's dense
# solve, for C = Diag(d) + UUᵀ of every rank (the unrolled small-rank path and the LAPACK one,
# q > 8) and for a batch of systems under vmap (the path a sweep takes).


@jax.jit
def _low_rank_solve(alpha, d, U, u, b):
    term = lvflow.LogLotkaVolterraTerm.from_system(lvflow.LowRankLotkaVolterra(jnp.ones_like(d), d, U))
    return term.shifted_solver(alpha, u)(b)


@settings(max_examples=25, deadline=None)
@given(
    K=st.sampled_from([1, 7]),
    q=st.sampled_from([0, 1, 4, 10]),  # q = 0: a diagonal C held as LowRankLotkaVolterra
    log_alpha=st.floats(-3.0, 3.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_low_rank_shifted_solve_vs_dense_numpy(K, q, log_alpha, seed):
    B = 3
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.1, 2.0, (B, K))
    U = rng.standard_normal((B, K, q)) * rng.uniform(0.1, 2.0)
    u = rng.uniform(-4.0, 3.0, (B, K))  # ln z: z spans e^-4 … e^3
    b = rng.standard_normal((B, K))
    alpha = np.exp(log_alpha)
    got = np.asarray(jax.vmap(_low_rank_solve, in_axes=(None, 0, 0, 0, 0))(alpha, d, U, u, b))
    for i in range(B):
        C = np.diag(d[i]) + U[i] @ U[i].T
        A = alpha * np.eye(K) + C * np.exp(u[i])[None, :]  # α I − J, J = −C Diag(e^u)
        want = np.linalg.solve(A, b[i])
        assert np.allclose(got[i], want, rtol=1e-9, atol=1e-9 * np.max(np.abs(want)))
        one = np.asarray(_low_rank_solve(alpha, d[i], U[i], u[i], b[i]))  # unbatched: the same solve
        assert np.allclose(one, want, rtol=1e-9, atol=1e-9 * np.max(np.abs(want)))
