"""`lvflow.fit` and `lvflow fit`: the curve families against the closed forms written here, the
fit's derivatives against finite differences, recovery of the drops of plain-numpy gradient
descent (fitted on the first part of the log, checked on the held-out rest), bad logs through
the command line (exit 2 and one line), the saved results and the README's worked example."""

import functools
import json
import math
import re
import warnings
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _cli import main
from hypothesis import given, settings, strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

import lvflow
from lvflow._fit import engine

README = Path(__file__).resolve().parents[1] / "README.md"


# ------------------------------------------------------------------------------------------
# Independent references: gradient descent in plain numpy, Thm 6 written out


def gd_log(r, eps, lr, steps, every=10):
    """Full-batch GD on `L(W) = Σ_k (w_k² − r_k)²/8` (diagonal NQF with `C = I`, `z = w²`,
    `z(0) = ε`), the loss logged every `every` steps; also each mode's half-way step (GD's own,
    where `z_k` first reaches `r_k/2`)."""
    r = np.asarray(r, float)
    w = np.full(r.size, math.sqrt(eps))
    rec_s, rec_l = [], []
    half = np.full(r.size, np.nan)
    for s in range(steps + 1):
        z = w * w
        newly = np.isnan(half) & (z >= r / 2)
        half[newly] = s
        if s % every == 0:
            rec_s.append(s)
            rec_l.append(np.sum((z - r) ** 2) / 8)
        w = w - lr * w * (z - r) / 2
    return np.array(rec_s, float), np.array(rec_l), half


def thm6_loss(r, C, z0, t, offset=0.0):
    """Eq. 163 with Thm 6's `z_k(t) = r z0/(C z0 + (r − C z0) e^{−r t})`, `V_k = r²/(8C)`, with
    `1 − z/z∞ = (r − C z0) e^{−rt}/(C z0 + (r − C z0) e^{−rt})` (no cancellation in the tail)."""
    t = np.asarray(t, float)[:, None]
    e = (r - C * z0) * np.exp(-r * t)
    return offset + np.sum(r**2 / (8 * C) * (e / (C * z0 + e)) ** 2, axis=1)


@pytest.fixture(scope="module")
def three_modes():
    # r = (1, 1/2, 1/4), ε = 1e-4, η = 0.01: the README's example; drops at steps ≈ 921, 1703, 3129
    return gd_log([1.0, 0.5, 0.25], 1e-4, 0.01, 5000)


def gd_midpoints(r, eps, lr, steps):
    """GD as in `gd_log`; per mode, the first step at which the loss is at or below the midpoint
    between the plateaus GD's curve shows on either side of its drop: where one reads the drop
    off the curve. Between two drops the plateau is the loss where the curve is flattest on a
    log-log plot (the least `−Δ ln L/Δ ln step`, between the steps at which the loss crosses the
    staircase's midpoints `Σ_{j>k} V_j + V_k/2`, Eq. 168, `V_j = r_j²/8`); before the first drop
    it is `Σ V_j`, after the last `0`."""
    r = np.asarray(r, float)
    V = r**2 / 8
    w = np.full(r.size, math.sqrt(eps))
    L = np.empty(steps + 1)
    for s in range(steps + 1):
        z = w * w
        L[s] = np.sum((z - r) ** 2) / 8
        w = w - lr * w * (z - r) / 2
    stair = [int(np.argmax(L <= V[k + 1 :].sum() + V[k] / 2)) for k in range(r.size)]
    g = -np.diff(np.log(L[1:])) / np.diff(np.log(np.arange(1, steps + 1)))  # interval i: steps i+1, i+2
    shown = [V.sum()] + [L[a + int(np.argmin(g[a - 1 : b - 1]))] for a, b in zip(stair[:-1], stair[1:])] + [0.0]
    mid = 0.5 * (np.array(shown[:-1]) + np.array(shown[1:]))
    return np.array([float(np.argmax(L <= m)) for m in mid])


@pytest.fixture(scope="module")
def three_mids():
    return gd_midpoints([1.0, 0.5, 0.25], 1e-4, 0.01, 5000)


@pytest.fixture(scope="module")
def fitted(three_modes):
    """The README's fit: three modes, the first 2000 steps, `L_∞ = 0`."""
    steps, loss, _ = three_modes
    return quiet_fit(steps, loss, learning_rate=0.01, until=2000, offset=0.0, family="modes", horizon=5000)


def quiet_fit(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lvflow.fit(*args, **kw)


# ------------------------------------------------------------------------------------------
# The families


def test_decoupled_modes_curve_is_thm6():
    r, C, z0 = np.array([1.0, 0.3, 0.05]), np.array([2.0, 0.5, 1.0]), np.array([1e-5, 3e-6, 1e-4])
    V = r**2 / (8 * C)
    tstar = np.log(r / (C * z0) - 1) / r  # Eq. 158, ρ = ½
    model = lvflow.DecoupledModes.from_physical(r, V, tstar, 0.02)
    t = np.linspace(0, 200, 301)
    np.testing.assert_allclose(np.asarray(model.loss(t)), thm6_loss(r, C, z0, t, 0.02), rtol=1e-10)
    # the round trip through the fit's coordinates, and the starts it reports (c_k ε = z_k(0))
    again = model.from_vector(model.to_vector())
    np.testing.assert_allclose(np.asarray(again.loss(t)), np.asarray(model.loss(t)), rtol=1e-12)
    rep = model.reported()
    z0_model = np.asarray(rep["c"]) * float(rep["eps"]) * 8 * V / r / (r / C)  # in the paper's units
    np.testing.assert_allclose(z0_model, z0, rtol=1e-10)


@functools.cache
def _mode_sum_derivatives():
    """For 4 mode slots: `log_excess` (ours) and the mode sum written out with `logsumexp` and
    `softplus` (direct), as functions of `(θ, active, t)`, with their derivatives in `θ` (forward
    and reverse, the Hessian of the sum) and in `t` to third order (the first two also
    differentiated in `θ`), each compiled once for every example."""
    base = lvflow.DecoupledModes.from_physical(np.ones(4), np.ones(4), np.full(4, 10.0), 1e-3)
    with_active = lambda theta, active: eqx.tree_at(lambda m: m.active, base, active).from_vector(theta)

    def ours(theta, active, t):
        return with_active(theta, active).log_excess(t)

    def direct(theta, active, t):
        m = with_active(theta, active)
        x = jnp.exp(m.log_rate)[None, :] * (t[:, None] - jnp.exp(m.log_tstar)[None, :])
        terms = jnp.where(active[None, :], m.log_drop[None, :] - 2.0 * jax.nn.softplus(x), -jnp.inf)
        return jax.nn.logsumexp(terms, axis=-1)

    def derivatives(f):
        out = {"value": f, "jacfwd": jax.jacfwd(f), "jacrev": jax.jacrev(f)}
        out["hessian"] = jax.hessian(lambda th, a, t: f(th, a, t).sum())
        g = lambda th, a, s: f(th, a, s[None])[0]  # one time
        for order in (1, 2, 3):
            g = jax.grad(g, 2)
            out[f"d{order}/dt"] = jax.vmap(g, (None, None, 0))
            if order < 3:
                out[f"d/dθ d{order}/dt"] = jax.jacfwd(out[f"d{order}/dt"])
        return {k: jax.jit(v) for k, v in out.items()}

    return base, derivatives(ours), derivatives(direct)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_decoupled_modes_derivatives_are_the_mode_sums(seed):
    """`log_excess`'s closed-form derivative against automatic differentiation of the mode sum
    written out (`_mode_sum_derivatives`): in the fit's coordinates (the Jacobian of every
    solve, reverse mode too, and the Hessian) and in `t` to third order, mixed with `θ` (the
    drops' times, the plateaus' curvature, and its derivative in `summaries_and_jac`), over
    random modes, masked slots and times from before the first drop to deep in the tail and at
    each `t*` exactly; with no active mode, `ln E = −inf` with a zero derivative."""
    base, ours, direct = _mode_sum_derivatives()
    rng = np.random.default_rng(seed)
    K = 4
    r = np.exp(rng.uniform(-3, 1, K))
    tstar = (math.log(9) + np.exp(rng.uniform(-1, 3, K))) / r
    active = rng.random(K) < 0.7
    active[rng.integers(K)] = True
    theta = lvflow.DecoupledModes.from_physical(r, np.exp(rng.uniform(-8, 0, K)), tstar, 1e-3).to_vector()
    active = jnp.asarray(active)
    t_star = jnp.exp(base.from_vector(theta).log_tstar)  # x = 0 exactly there
    t = jnp.concatenate([jnp.asarray(np.geomspace(1e-2, 30 * tstar.max(), 25)), t_star])
    for name in ours:
        a, b = np.asarray(ours[name](theta, active, t)), np.asarray(direct[name](theta, active, t))
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12 * max(np.abs(b).max(), 1.0), err_msg=name)
    none = jnp.zeros(K, bool)
    assert np.all(np.asarray(ours["value"](theta, none, t)) == -np.inf)
    for name in ("jacfwd", "jacrev"):
        assert np.all(np.asarray(ours[name](theta, none, t)) == 0.0), name


def test_power_law_curve_is_the_mode_sum():
    a1, a2, beta, eps, zeta1, V1 = 2.0, 0.8, 1.2, 1e-6, 1.0, 1.0
    t = np.geomspace(0.5, 2e3, 200)

    def direct(K, t=t):
        k = np.arange(1, K + 1, dtype=float)
        r, V = zeta1 * k**-a2, V1 * k**-a1
        C = r**2 / (8 * V)
        return thm6_loss(r, C, eps * k**-beta, t)

    exact = lvflow.PowerLawModel.from_physical(
        zeta1=zeta1, V1=V1, alpha1=a1, alpha2=a2, eps=eps, beta=beta, modes=20, offset=0.0, fit_offset=False
    )
    np.testing.assert_allclose(np.asarray(exact.loss(t)), direct(20), rtol=1e-9)
    # above 32 modes, groups of ranks by two-point Gauss–Legendre: close to the exact sum, also
    # in the tail where the loss has fallen by 10²⁰ (the midpoint rule was 5 % off there)
    grouped = lvflow.PowerLawModel.from_physical(
        zeta1=zeta1, V1=V1, alpha1=a1, alpha2=a2, eps=eps, beta=beta, modes=500, offset=0.0, fit_offset=False
    )
    t_tail = np.geomspace(0.5, 5e3, 200)  # to 2.2 t*_K of the 500 modes
    np.testing.assert_allclose(np.asarray(grouped.loss(t_tail)), direct(500, t_tail), rtol=1e-3)


def test_objective_derivative_matches_finite_differences(three_modes):
    steps, loss, _ = three_modes
    data = engine.bin_log(0.01 * steps, loss, 60)
    models = [
        lvflow.DecoupledModes.from_physical([1.0, 0.4], [0.1, 0.02], [10.0, 25.0], 1e-4),
        lvflow.PowerLawModel.from_physical(
            zeta1=0.9, V1=0.12, alpha1=2.2, alpha2=1.1, eps=1e-3, beta=0.3, modes=40.5, offset=1e-4, fit_beta=True
        ),
    ]
    for m in models:
        theta = np.asarray(m.to_vector())
        J = engine.jacobian(m, theta, data)
        f = lambda th: np.asarray(engine.residuals(jnp.asarray(th), (m, data)))
        h = 1e-6
        fd = np.stack([(f(theta + h * e) - f(theta - h * e)) / (2 * h) for e in np.eye(theta.size)], axis=1)
        np.testing.assert_allclose(J, fd, rtol=1e-5, atol=1e-6 * np.abs(fd).max())


# ------------------------------------------------------------------------------------------
# Fits


@pytest.mark.slow
def test_fit_predicts_the_next_drop_of_gradient_descent(three_modes, three_mids, fitted):
    steps, loss, half = three_modes
    res = fitted
    assert res.family == "modes" and np.size(res.parameters["r"]) == 3
    d = res.drops
    # the seen drops where GD's loss crossed their midpoints, the next one (held out) within 5 %
    np.testing.assert_allclose(d["step"][:2], three_mids[:2], rtol=0.01)
    assert d["future"].tolist() == [False, False, True]
    assert abs(d["step"][2] / three_mids[2] - 1) < 0.05
    assert d["step_lo"][2] < three_mids[2] < d["step_hi"][2]
    # and each mode's half-strength step where GD's z_k was half-way
    np.testing.assert_allclose(d["step_strength"][:2], half[:2], rtol=0.01)
    assert abs(d["step_strength"][2] / half[2] - 1) < 0.05
    # the two modes seen to 1 %; the third, whose rise the log barely shows, to 3 %
    tol = np.array([0.01, 0.01, 0.03])
    assert np.all(np.abs(np.asarray(res.parameters["r"]) / [1.0, 0.5, 0.25] - 1) < tol)
    assert np.all(np.abs(np.asarray(res.parameters["V"]) / [1 / 8, 1 / 32, 1 / 128] - 1) < tol)
    # the fitted curve on the held-out part: the next drop is there (a plateau would be 20x off)
    held = steps > 2000
    ratio = res.predict(steps[held & (steps < 3800)]) / loss[held & (steps < 3800)]
    assert np.all(np.abs(np.log(ratio)) < 0.5)


def test_bins_corrected_for_the_curves_curvature():
    """A bin's mean of `ln L` over its points is `ln L` at their mean `ln t` plus `½ y'' var`:
    the binned log removes that term, so the model at the bins' times follows a steep fall to
    the bins' error floor; the plain means (computed here) do not (so that the test can fail)."""
    r, C, z0 = np.array([1.0, 0.05]), np.array([1.0, 1.0]), np.array([1e-5, 1e-5])
    t = np.geomspace(0.1, 600.0, 1000)
    L = thm6_loss(r, C, z0, t)  # the second drop, then its exponential tail: ln L falls by 49
    data = engine.bin_log(t, L, 200)  # fit's default bins
    x = np.log(t)
    idx = np.clip(((x - x[0]) / (x[-1] - x[0]) * 200).astype(int), 0, 199)
    plain = np.bincount(idx, np.log(L), 200) / np.maximum(np.bincount(idx, minlength=200), 1)
    tstar = np.log(r / (C * z0) - 1) / r
    model = lvflow.DecoupledModes.from_physical(r, r**2 / (8 * C), tstar, 0.0, fit_offset=False)
    ok = np.asarray(data.count) > 0
    at = np.asarray(model.log_loss(data.t))[ok]
    assert np.max(np.abs(at - np.asarray(data.y)[ok])) < 2e-3  # measured 1.1e-3 (at the knee of a drop)
    assert np.max(np.abs(at - plain[ok])) > 5e-3  # measured 1.3e-2


def test_a_clean_logs_bins_are_weighted_by_its_own_resolution(three_modes):
    """Full-batch GD has no minibatch noise: the bins' errors are the log's own resolution, a
    share of one step's change of `ln L` (`engine.DISCRETISATION`, the finite differences of the
    log computed here) and the scatter about the local trend (tiny), not a constant."""
    steps, loss, _ = three_modes
    sel = steps <= 2000
    t, y = 0.01 * steps[sel], np.log(loss[sel])
    data = engine.bin_log(t, loss[sel], 200, np.full(t.size, 0.01))
    assert float(data.noise) < 1e-5 and float(data.floor) < 1e-5  # measured 4e-7, 4e-6
    ok = np.asarray(data.count) > 0
    sig = 1 / np.sqrt(np.asarray(data.weight)[ok])
    per_step = np.abs(np.interp(np.asarray(data.t)[ok], t[1:], np.diff(y) / np.diff(steps[sel])))
    # σ_b follows the step's change where that dominates (to the bins' own slope estimate)
    big = per_step * engine.DISCRETISATION > 10 * float(data.floor)
    ratio = sig[big] / (engine.DISCRETISATION * per_step[big])
    assert np.median(ratio) == pytest.approx(1.0, abs=0.1)
    assert np.median(sig) < 2e-4  # the old constant floor was 1e-3


@pytest.mark.parametrize("sigma", [0.05, 0.005])
def test_minibatch_noise_is_recovered_from_the_log(sigma):
    """Multiplicative noise `exp(σ ξ)` on every logged step of GD: the scatter of one point and
    of each bin's mean (`σ/√n_b`) come back within a factor 2."""
    steps, clean, _ = gd_log([1.0, 0.5, 0.25], 1e-4, 0.01, 4000, every=1)
    rng = np.random.default_rng(1)
    loss = clean * np.exp(sigma * rng.standard_normal(clean.size))
    data = engine.bin_log(0.01 * steps, loss, 200, np.full(steps.size, 0.01))
    assert sigma / 2 < float(data.noise) < 2 * sigma
    cnt = np.asarray(data.count)
    dense = cnt >= 20
    ratio = (1 / np.sqrt(np.asarray(data.weight)[dense])) / (sigma / np.sqrt(cnt[dense]))
    assert 0.5 < np.median(ratio) < 2.0


@pytest.mark.slow
def test_a_drop_to_come_chosen_when_the_clean_log_shows_its_rise(three_modes, three_mids):
    """Fitted to step 2000 with `L_∞` free, the third mode has begun its rise (the loss is 20 %
    below its plateau): a floor cannot follow that to the log's own resolution, a mode still
    to come can, and the data decide (with a constant error floor of 1e-3 per bin both fitted
    'equally well' and the parameter count chose the floor)."""
    steps, loss, _ = three_modes
    res = quiet_fit(steps, loss, learning_rate=0.01, until=2000, family="modes", horizon=5000)
    # the drop to come, decided; where the loss rests after it is not: to nothing or to a next
    # plateau, both kept, and no floor scenario
    assert all(r.future_drops["step"].size == 1 for r in res.scenarios)
    assert sum(r.weight for r in res.scenarios) == pytest.approx(1.0)
    assert sorted(r.asymptote == 0.0 for r in res.scenarios) in ([True], [False, True])
    fut = res.future_drops
    assert fut["step"].size == 1
    assert fut["step"][0] == pytest.approx(three_mids[2], rel=0.05)
    assert fut["step_lo"][0] <= three_mids[2] <= fut["step_hi"][0]
    # the drop to nothing divides the loss by any factor; the drop to a next plateau (a level
    # the log does not see) by 3 with the probability its fall's interval gives (ln fall
    # normal, given fall ≥ 1), computed here
    z = norm.ppf(0.975)
    want = 0.0
    for r in res.scenarios:
        f, lo = r.future_drops["fall"][0], r.future_drops["fall_lo"][0]
        assert (f == math.inf) == (r.asymptote == 0.0)
        s = math.log(f / lo) / z if math.isfinite(f) else 0.0
        want += r.weight * (1.0 if f == math.inf else norm.cdf(math.log(f / 3.0) / s) / norm.cdf(math.log(f) / s))
    nd = res.next_drop(min_fall=3.0)
    assert nd["probability"] == pytest.approx(want, rel=1e-9) and nd["lo"] <= three_mids[2] <= nd["hi"]
    assert res.next_drop()["probability"] == pytest.approx(1.0)  # a drop to come, decided


@pytest.fixture(scope="module")
def three_scenarios(three_modes):
    """The README's log fitted to step 1800 with `L_∞` free (three scenarios)."""
    steps, loss, _ = three_modes
    return quiet_fit(steps, loss, learning_rate=0.01, until=1800, family="modes", horizon=5000)


def test_a_floor_or_a_drop_to_come_three_scenarios(three_modes, three_mids, three_scenarios):
    """Fitted to step 1800 with `L_∞` free, the log ends on the plateau before the third drop,
    whose rise is still below the log's resolution: a floor or a mode still to come fit it
    alike, and after that drop the loss may rest on a next plateau or on nothing; the result
    carries the three scenarios, and the forecast is their mixture."""
    steps, loss, half = three_modes
    res = three_scenarios
    assert res.alternative is not None and res.alternative.alternative is not None
    assert any("3 scenarios" in w for w in res.warnings)
    sc = res.scenarios
    assert len(sc) == 3 and sc[0] is res
    assert res.next_drop()["lo"] >= res.fit_until  # a drop to come comes after the seen part
    drop = [x for x in sc if x.future_drops["step"].size]
    floor = [x for x in sc if not x.future_drops["step"].size]
    assert len(drop) == 2 and len(floor) == 1
    # the floor is most of the loss the log ends on; the other scenarios' drop is GD's third
    end = loss[steps <= 1800][-1]
    f0 = floor[0].asymptote
    assert 0.5 * end <= f0 <= end
    for x in drop:
        d = x.future_drops
        assert d["step_lo"][0] <= three_mids[2] <= d["step_hi"][0]
        assert d["step"][0] == pytest.approx(three_mids[2], rel=0.2)  # measured 13 % early: its rise is unseen
    # one drop ends on nothing; the other on a next plateau at the largest fall of the floor
    # scenario's staircase (its plateaus from its V_k, computed here)
    assert sorted(x.asymptote == 0.0 for x in drop) == [False, True]
    V = np.asarray(floor[0].parameters["V"])[np.argsort(floor[0].parameters["t_star"])]
    P = f0 + np.concatenate([np.cumsum(V[::-1])[::-1], [0.0]])
    nxt = f0 * np.min(P[1:] / P[:-1])
    rest = max(x.asymptote for x in drop)
    assert nxt / 3 <= rest <= min(3 * nxt, f0)
    # the weights: e^{-S/2} of each scenario's criterion (effective parameters), normalised
    assert sum(x.weight for x in sc) == pytest.approx(1.0)
    assert all(0 < x.weight < 1 for x in sc)
    # the mixed forecast's quantiles and median, against the CDF of the mixture solved here (scipy)
    z = 1.959963984540054
    N = 5000.0
    comps = []
    for r in sc:
        lo, hi = (float(v[0]) for v in r.band(np.array([N])))
        comps.append((r.weight, math.log(r.predict(np.array([N]))[0]), math.log(hi / lo) / (2 * z)))
    cdf = lambda x: sum(w * norm.cdf((x - m) / s) for w, m, s in comps)
    f = res.forecast(np.array([N]))
    # past the seen part the interval is cut to the bounds the model allows: above the lowest
    # floor's lower end (0 without a floor), below the highest loss logged in the last tenth
    seen = loss[steps <= 1800]
    ceiling = math.log(seen[-(seen.size // 10) :].max())
    floor = min(math.log(r.asymptote_lo) if r.asymptote_lo > 0 else -math.inf for r in sc)
    for q, got in ((0.025, f["lo"][0]), (0.975, f["hi"][0]), (0.5, f["loss"][0])):
        want = brentq(lambda x: cdf(x) - q, -800.0, 10.0, xtol=1e-12)
        if q != 0.5:
            want = min(max(want, floor), ceiling)
        assert math.log(got) == pytest.approx(want, abs=1e-6)
    # the next drop: the drop scenarios' log-normal steps and an atom at "no drop"
    nd = res.next_drop()
    assert nd["probability"] == pytest.approx(sum(x.weight for x in drop))
    # both in the table and the JSON
    assert res.summary().count("alternative scenario") == 2 and "forecast (" in res.summary()
    saved = json.loads(res.to_json())
    assert len(saved["alternative"]["drops"]["step"]) == np.size(res.alternative.drops["step"])
    assert len(saved["alternative"]["alternative"]["drops"]["step"]) == np.size(sc[2].drops["step"])
    # told that the loss goes to 0, the fit has one scenario: the drop to come
    zero = quiet_fit(steps, loss, learning_rate=0.01, until=1800, offset=0.0, family="modes", horizon=5000)
    assert zero.alternative is None and zero.future_drops["step"].size == 1


def test_the_scenario_weights_are_e_to_the_minus_half_bic(three_scenarios):
    """The scenarios' weights are `e^{−S/2}` normalised, `S` BIC written out here from each
    scenario's reported terms: `n ln(max(χ², n)/n)/k + p_eff ln max(n/k, 1)` (`n` bins, the
    data's `χ²`, the evidence discount `k`, the effective number of parameters `p_eff`)."""
    sc = three_scenarios.scenarios
    assert len(sc) == 3
    k = sc[0].evidence_discount
    assert k >= 1 and all(r.evidence_discount == k for r in sc)
    S = []
    for r in sc:
        n = r.n_bins
        assert n > 0 and r.chi2 > 0 and 0 < r.effective_parameters < r.theta.size
        S.append(n * math.log(max(r.chi2, n) / n) / k + r.effective_parameters * math.log(max(n / k, 1.0)))
    S = np.array(S)
    want = np.exp(-(S - S.min()) / 2) / np.sum(np.exp(-(S - S.min()) / 2))
    np.testing.assert_allclose([r.weight for r in sc], want, rtol=1e-9, atol=1e-12)
    # the better criterion weighs more (a weight e^{+S/2} once did the opposite)
    assert np.argmax([r.weight for r in sc]) == np.argmin(S)
    # the terms are in the saved result too
    saved = json.loads(three_scenarios.to_json())
    assert saved["chi2"] == pytest.approx(sc[0].chi2) and saved["evidence_discount"] == pytest.approx(k)


def test_a_log_cut_in_a_drops_tail_keeps_the_drop_to_come():
    """A log cut while a drop is still levelling off (Thm 6 written out here: three modes, the
    calibration benchmark's *modes* seed 0) is fitted with a floor of about a third of the loss
    where it ends, below the level it is heading to; the floor could as well be a mode not yet
    begun, so the no-floor scenario is tried too (with floors questioned only from half the last
    loss, this log had the floor alone and no drop ahead), and the mixed forecast covers the
    third drop and the loss past it."""
    r = np.array([1.92569554, 0.66099092, 0.38641188])
    C = np.array([0.96774718, 1.13498967, 1.74155389])
    z0 = np.array([1.88406960e-05, 1.84467323e-05, 1.70333667e-05])
    lr, cut = 0.01, 1522.0
    steps = np.round(np.linspace(0.0, 3552.0, 400))
    loss = thm6_loss(r, C, z0, lr * steps)
    V = r**2 / (8 * C)
    fine = np.arange(cut, 3553.0)
    mid = fine[np.argmax(thm6_loss(r, C, z0, lr * fine) <= V[2] / 2)]  # the third drop's midpoint
    res = quiet_fit(steps, loss, learning_rate=lr, until=cut)
    assert res.alternative is not None
    nd = res.next_drop(min_fall=3.0)
    assert nd["lo"] <= mid <= nd["hi"]
    f = res.forecast(np.array([3552.0]))
    assert f["lo"][0] <= loss[-1] <= f["hi"][0]


def test_fixed_number_of_modes_has_no_second_scenario(three_modes, three_mids):
    """With `modes` fixed, a floor at the end of the log stays a floor: the scenario without it
    would need one mode more than asked for (it used to fail with an IndexError)."""
    steps, loss, half = three_modes
    res = quiet_fit(steps, loss, learning_rate=0.01, until=2000, family="modes", modes=2, horizon=5000)
    assert res.alternative is None and np.size(res.parameters["r"]) == 2
    np.testing.assert_allclose(res.drops["step_strength"], half[:2], rtol=0.01)
    np.testing.assert_allclose(res.drops["step"][:1], three_mids[:1], rtol=0.01)
    end = loss[steps <= 2000][-1]
    assert 0.5 * end <= res.asymptote <= end


def test_a_drop_time_the_log_does_not_bound_is_after_the_seen_part(fitted):
    """A scenario whose next drop has an infinite standard error says only that the drop comes
    after the seen part: the interval is `[fit_until, no drop]` (the widest any distribution on
    that range gives), and the point is still the scenario's own drop step."""
    d = {k: np.array(v, copy=True) for k, v in fitted.drops.items()}
    k = int(np.flatnonzero(d["future"])[0])
    d["step_lo"][k], d["step_hi"][k] = 0.0, math.inf
    res = eqx.tree_at(lambda r: r.drops, fitted, d)
    nd = res.next_drop()
    assert nd["lo"] == pytest.approx(2000.0) and nd["hi"] == math.inf
    assert nd["step"] == d["step"][k] and nd["probability"] == 1.0
    assert "not determined" in nd["note"]
    # the same for an interval of 40 decades (wider than UNDETERMINED_DECADES): the delta
    # method's log-normal means nothing there; the loss past the interval's lower end (here the
    # seen part's end) is then known only within the model's bounds: 0 (no floor) and the
    # highest loss logged in the last tenth of the fitted part
    d["step_lo"][k], d["step_hi"][k] = 1e-20, 1e20
    wide = eqx.tree_at(lambda r: r.drops, fitted, d)
    nd = wide.next_drop()
    assert nd["lo"] == pytest.approx(2000.0) and nd["hi"] == math.inf and "not determined" in nd["note"]
    seen = fitted.log.loss[fitted.log.steps <= 2000]
    f = wide.forecast(np.array([1000.0, 5000.0]))
    assert f["lo"][1] == 0.0 and f["hi"][1] == pytest.approx(seen[-(seen.size // 10) :].max(), rel=1e-12)
    assert not f["determined"][1] and f["determined"][0]  # the seen part keeps its band
    assert (f["lo"][0], f["hi"][0]) == pytest.approx(tuple(float(v[0]) for v in fitted.band(np.array([1000.0]))))
    # a determined drop keeps its delta-method interval (the log-normal's quantiles)
    ok = fitted.next_drop()
    assert ok["note"] == "" and (ok["lo"], ok["hi"]) == pytest.approx(
        (fitted.drops["step_lo"][k], fitted.drops["step_hi"][k])
    )


def test_a_drop_whose_fall_is_uncertain_counts_with_its_probability(fitted):
    """`next_drop(min_fall)` counts a drop whose fall `loss_before / loss_after` the log leaves
    uncertain around `min_fall` with the probability that it reaches `min_fall` (`ln fall`
    normal with its standard error `s`, given `fall ≥ 1`); the rest of the scenario's weight is
    at "no drop". Checked against the mixture's quantile solved here."""
    z = norm.ppf(0.975)
    d = {k: np.array(v, copy=True) for k, v in fitted.drops.items()}
    k = int(np.flatnonzero(d["future"])[0])
    fall, s = 2.5, 0.4

    def with_fall(lo, hi):
        d["fall"][k], d["fall_lo"][k], d["fall_hi"][k] = fall, lo, hi
        return eqx.tree_at(lambda r: r.drops, fitted, d)

    nd = with_fall(fall * math.exp(-z * s), fall * math.exp(z * s)).next_drop(min_fall=3.0)
    p = norm.cdf(math.log(fall / 3.0) / s) / norm.cdf(math.log(fall) / s)  # given fall ≥ 1
    assert nd["probability"] == pytest.approx(p, rel=1e-9)
    # the mixture: p at the drop's log-normal step, 1 − p at "no drop"; its 2.5 % quantile
    m = math.log(d["step"][k])
    sd = (math.log(d["step_hi"][k]) - math.log(d["step_lo"][k])) / (2 * z)
    want = math.exp(brentq(lambda x: p * norm.cdf((x - m) / sd) - 0.025, m - 20 * sd, m + 20 * sd))
    assert nd["lo"] == pytest.approx(max(want, fitted.fit_until), rel=1e-6) and nd["hi"] == math.inf
    assert nd["step"] == math.inf  # the point: the scenario's own fall, 2.5 < 3, is no such drop
    # a fall the log determines below min_fall: no drop; one it does not determine: even odds
    assert with_fall(fall, fall).next_drop(min_fall=3.0)["probability"] == 0.0
    assert with_fall(0.0, math.inf).next_drop(min_fall=3.0)["probability"] == pytest.approx(0.5)
    # every drop divides the loss by at least 1
    assert with_fall(fall * math.exp(-z * s), fall * math.exp(z * s)).next_drop()["probability"] == 1.0


def test_a_loss_the_log_does_not_determine_is_bounded_by_the_log(fitted, three_modes):
    """With every parameter undetermined (infinite covariance), the forecast past the seen part is
    the bound the model allows: above 0 (no floor: `offset=0`), below the highest loss logged in
    the last tenth of the fitted part (every mode of Eq. 163 only falls); it holds GD's loss."""
    steps, loss, _ = three_modes
    res = eqx.tree_at(lambda r: r.covariance, fitted, np.full_like(fitted.covariance, np.inf))
    f = res.forecast(np.array([3000.0, 5000.0]))
    seen = loss[steps <= 2000]
    ceiling = seen[-(seen.size // 10) :].max()
    np.testing.assert_array_equal(f["lo"], [0.0, 0.0])
    np.testing.assert_allclose(f["hi"], [ceiling, ceiling], rtol=1e-12)
    assert not f["determined"].any()
    truth = loss[np.searchsorted(steps, [3000.0, 5000.0])]
    assert np.all((f["lo"] <= truth) & (truth <= f["hi"]))
    assert fitted.forecast(np.array([5000.0]))["determined"][0]
    # a band wider than floats hold is (0, inf), without an overflow warning
    wide = eqx.tree_at(lambda r: r.covariance, fitted, fitted.covariance * 1e12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lo, hi = wide.band(np.array([5000.0]))
    assert lo[0] == 0.0 and hi[0] == np.inf


def test_correlated_residuals_count_as_fewer():
    """The variance inflation `k = (1 + ρ)/(1 − ρ)` that `fit` applies to the covariance (and to
    the evidence between scenarios) for residuals correlated along `ln t`, against a Monte Carlo
    here: the variance of the mean of `n` AR(1) errors is `k σ²/n` for large `n`."""
    from lvflow._fit.fit import _correlation_factor

    rng = np.random.default_rng(0)
    n, reps = 200, 4000
    for rho in (0.0, 0.5, 0.9):
        e = rng.standard_normal((reps, n))
        x = np.empty_like(e)
        x[:, 0] = e[:, 0]
        for i in range(1, n):  # stationary AR(1) with unit variance
            x[:, i] = rho * x[:, i - 1] + math.sqrt(1 - rho**2) * e[:, i]
        k_mc = n * np.var(x.mean(axis=1))
        k_fit = np.median([_correlation_factor(row) for row in x[:200]])
        # the finite-n Monte Carlo value is (1+ρ)/(1−ρ) less O(1/n); the estimate's median within 15 %
        assert k_fit == pytest.approx(k_mc, rel=0.15), (rho, k_fit, k_mc)
    assert _correlation_factor(np.array([1.0, -1.0, 1.0, -1.0])) == 1.0  # anticorrelated: no credit
    assert _correlation_factor(np.ones(50)) == pytest.approx(2 / (2 / 50) - 1)  # ρ clipped at 1 − 2/n


def test_uncertainties_are_the_delta_method(fitted):
    res = fitted
    model, theta, cov = res.model, res.theta, res.covariance
    # t*_k as a function of the fit's coordinates, differentiated by central differences here
    f = lambda th: np.asarray(model.from_vector(jnp.asarray(th)).reported()["t_star"])
    h = 1e-6
    G = np.stack([(f(theta + h * e) - f(theta - h * e)) / (2 * h) for e in np.eye(theta.size)], axis=1)
    se = np.sqrt(np.einsum("ip,pq,iq->i", G, cov, G))
    np.testing.assert_allclose(res.stderr["t_star"], se, rtol=1e-4)
    # the interval on the drop's step is ±1.96 standard errors of ln t*, in steps
    z = 1.959963984540054

    # the interval on the drop's step is ±1.96 standard errors of ln t, where t is the time the
    # fitted loss crosses the midpoint between the plateaus the curve shows on either side of
    # its drop (between two drops: where −d ln L/d ln t is least; before the first and after the
    # last, the staircase's L_∞ + Σ V and L_∞): the least on a grid, then brentq on
    # d² ln L/d(ln t)² = 0 there; the crossing by brentq; differentiated by differences
    f = lambda x, th: model.from_vector(th).log_loss(jnp.exp(x)[None])[0]  # ln L at ln t = x
    f_, g_ = jax.jit(f), jax.jit(jax.vmap(jax.grad(f), (0, None)))
    g1_ = jax.jit(jax.grad(jax.grad(f)))

    def ln_t_mid(th):
        m, th = model.from_vector(jnp.asarray(th)), jnp.asarray(th)
        t_all, V_all, _ = (np.asarray(a) for a in m.drops())
        o = np.argsort(t_all)
        ln_L = lambda x: float(f_(x, th))
        x_star = np.log(t_all[o])
        levels = [float(m.offset) + V_all.sum()]
        for a, b in zip(x_star[:-1], x_star[1:]):
            grid = np.linspace(a, b, 200)
            i = int(np.argmax(np.asarray(g_(jnp.asarray(grid), th))))  # the least −d ln L/d ln t
            flat = brentq(lambda x: float(g1_(x, th)), grid[i - 1], grid[i + 1], xtol=1e-15)
            levels.append(math.exp(ln_L(flat)))
        levels.append(float(m.offset))
        mids = 0.5 * (np.array(levels[:-1]) + np.array(levels[1:]))
        cross = lambda x, v: ln_L(x) - math.log(v)
        return np.array([brentq(cross, x - 10, x + 10, args=(v,), xtol=1e-14) for x, v in zip(x_star, mids)])

    lm = ln_t_mid(theta)  # ln t
    np.testing.assert_allclose(res.drops["step"], np.exp(lm) / 0.01, rtol=1e-9)
    G = np.stack([(ln_t_mid(theta + h * e) - ln_t_mid(theta - h * e)) / (2 * h) for e in np.eye(theta.size)], axis=1)
    slm = np.sqrt(np.einsum("ip,pq,iq->i", G, cov, G))
    np.testing.assert_allclose(res.drops["step_hi"], np.exp(lm + z * slm) / 0.01, rtol=1e-4)
    np.testing.assert_allclose(res.drops["step_lo"], np.exp(lm - z * slm) / 0.01, rtol=1e-4)


def test_noisy_irregular_log(three_modes, three_mids):
    # minibatch-like multiplicative noise (5 %), a random half of the rows, some outliers; fitted
    # to step 2500, where the third mode has removed a third of its plateau (at step 2000 the
    # noise hides its rise, and the fit says so: an unbounded interval)
    steps, loss, half = three_modes
    rng = np.random.default_rng(0)
    keep = np.sort(rng.choice(steps.size, steps.size // 2, replace=False))
    s, L = steps[keep], loss[keep] * np.exp(0.05 * rng.standard_normal(keep.size))
    L[rng.choice(L.size, 5, replace=False)] *= 3.0
    res = quiet_fit(s, L, learning_rate=0.01, until=2500, offset=0.0, family="modes")
    assert 0.03 < res.noise < 0.08
    fut = res.future_drops
    assert fut["step"].size == 1 and abs(fut["step"][0] / three_mids[2] - 1) < 0.1


@pytest.mark.slow
def test_power_law_exponents():
    # Fig 3 right at K = 200 modes: r_k = k^−0.8, V_k = k^−2, z_k(0) = 1e-6 k^−1.2 (Thm 6, exact)
    K, a1, a2, beta = 200, 2.0, 0.8, 1.2
    k = np.arange(1, K + 1, dtype=float)
    r, V = k**-a2, k**-a1
    C = r**2 / (8 * V)
    t = np.concatenate([[0.0], np.geomspace(0.05, 2e3, 600)])
    loss = thm6_loss(r, C, 1e-6 * k**-beta, t)
    res = quiet_fit(t, loss, until=400.0, offset=0.0, family="power_law")
    P = res.parameters
    assert abs(P["alpha1"] / a1 - 1) < 0.05 and abs(P["alpha2"] / a2 - 1) < 0.05
    assert abs(P["kappa"] / ((a1 - 1) / a2) - 1) < 0.05


@pytest.mark.slow
def test_a_curve_without_drops_is_fitted():
    """A smooth power-law decay `(1 + t/10)^(−1/2)` has no plateau and no drop: the power law's
    fit lists none (it raised before: the drop summaries' Jacobian over zero drops), forecasts
    none, and follows the curve in its power-law part (from `t = 100`; at `t = 1` it is 18 % off)."""
    t = np.arange(0, 3000.0)
    loss = (1 + t / 10) ** -0.5
    res = quiet_fit(t, loss, learning_rate=1.0, family="power_law")
    assert np.size(res.drops["step"]) == 0
    nd = res.next_drop()
    assert nd["probability"] == 0.0 and nd["lo"] == nd["hi"] == math.inf
    np.testing.assert_allclose(res.predict(t[100::100]), loss[100::100], rtol=0.02)


def power_law_log(K, a1, a2, beta, eps, zeta1, V1, t, noise, seed=0):
    """Thm 6 summed over a power-law spectrum (`r_k = ζ_1 k^{−α₂}`, `V_k = V_1 k^{−α₁}`,
    `z_k(0) = ε k^{−β}`), times log-normal noise of `noise` in `ln L`: the log and its truth."""
    k = np.arange(1, K + 1, dtype=float)
    r, V = zeta1 * k**-a2, V1 * k**-a1
    true = thm6_loss(r, r**2 / (8 * V), eps * k**-beta, t)
    return true * np.exp(noise * np.random.default_rng(seed).standard_normal(t.size)), true


@pytest.mark.slow
def test_power_law_with_free_beta_never_worse_than_beta_fixed():
    """`β` free contains `β = 0`: the search starts from that family's optimum too, so its fit
    is at least as close. From the grid alone it was not on this noisy log (χ² 129 vs 113)."""
    from lvflow._fit import search

    t = 0.05 * np.arange(20, 10001, 20.0)
    loss, true = power_law_log(2048, 7.96, 7.55, 0.43, 2.66e6, 0.784, 2.6e5, t, 0.3)
    data = engine.bin_log(t, loss, 200)
    opts = dict(max_modes=2048, modes=None, offset=0.0, criterion="bic", beta=0.0, robust=True)
    fixed = search.search_power_law(data, fit_beta=False, **opts)
    free = search.search_power_law(data, fit_beta=True, **opts)
    assert free.rss <= fixed.rss * (1 + 1e-9)
    # and the curve follows the noiseless truth through the fitted log (the noise is 0.3 a point)
    dev = np.asarray(engine.log_loss_of(free.model, jnp.asarray(t))) - np.log(true)
    assert abs(np.mean(dev)) < 0.05  # measured -0.010


def test_learning_rate_column_and_schedule(tmp_path, three_modes):
    steps, loss, _ = three_modes
    lg = lvflow.training_log(steps, loss, learning_rate=np.where(steps <= 1000, 0.01, 0.02))
    # t_i = Σ η_j (step_j − step_{j−1}): 0.01 per step to 1000, then 0.02
    np.testing.assert_allclose(lg.t[steps == 3000], 0.01 * 1000 + 0.02 * 2000)
    assert lg.learning_rate is None
    np.testing.assert_allclose(lg.step_of(lg.t), steps)
    f = tmp_path / "log.json"
    f.write_text(json.dumps({"iteration": steps.tolist(), "train_loss": loss.tolist(), "lr": [0.01] * steps.size}))
    lg = lvflow.training_log(str(f))
    assert lg.learning_rate == 0.01 and lg.source == str(f)
    np.testing.assert_allclose(lg.t, 0.01 * steps)


# ------------------------------------------------------------------------------------------
# The command


def cli(capsys, *argv):
    rc = main(["fit", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(capsys, argv, *needles):
    try:
        rc, out, err = cli(capsys, *argv)
    except SystemExit as e:
        rc = e.code
        out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def write_csv(path, steps, loss, header="step,loss"):
    path.write_text(header + "\n" + "".join(f"{s},{v}\n" for s, v in zip(steps, loss)))
    return path


def test_bad_logs_exit_2_with_one_line(capsys, tmp_path):
    s = np.arange(0, 200, 10)
    good = np.exp(-s / 50.0) + 0.1
    one_line_error(capsys, [tmp_path / "missing.csv"], "file not found")
    (tmp_path / "b.yaml").write_text("x")
    one_line_error(capsys, [tmp_path / "b.yaml"], "unsupported file type")
    nan = good.copy()
    nan[7] = np.nan
    one_line_error(capsys, [write_csv(tmp_path / "nan.csv", s, nan)], "loss", "non-finite", "row 8", "step 70")
    one_line_error(capsys, [write_csv(tmp_path / "few.csv", s[:6], good[:6])], "only 6", "at least 10")
    text = (tmp_path / "nan.csv").read_text().replace("nan", "oops")
    (tmp_path / "word.csv").write_text(text)
    one_line_error(capsys, [tmp_path / "word.csv"], "loss row 8 is not a number", "oops")
    one_line_error(capsys, [write_csv(tmp_path / "up.csv", s, 1 / good)], "loss: rises")
    one_line_error(capsys, [write_csv(tmp_path / "zero.csv", s, good - good[-1])], "must be positive", "row 20")
    one_line_error(capsys, [write_csv(tmp_path / "order.csv", s[::-1], good)], "steps", "strictly increasing")
    one_line_error(capsys, [write_csv(tmp_path / "cols.csv", s, good, "iteration,acc")], "no loss column")
    (tmp_path / "bad.json").write_text("{not json")
    one_line_error(capsys, [tmp_path / "bad.json"], "not valid JSON")
    ok = write_csv(tmp_path / "ok.csv", s, good)
    one_line_error(capsys, [ok, "--lr", "-1"], "--lr", "positive")
    one_line_error(capsys, [ok, "--until", "30"], "--until", "at least 10")
    one_line_error(capsys, [ok, "--save", tmp_path / "out.txt"], "--save", "unsupported file type")
    one_line_error(capsys, [ok, "--family", "spline"], "--family")


def test_rising_part_gives_a_warning_and_a_fit(capsys, tmp_path, three_modes):
    steps, loss, _ = three_modes
    bumped = loss.copy()
    bumped[(steps > 1200) & (steps < 1400)] *= 2.0  # a spike the families cannot follow
    f = tmp_path / "spike.json"
    f.write_text(json.dumps([{"step": float(s), "loss": float(v)} for s, v in zip(steps, bumped)]))
    rc, out, err = cli(capsys, f, "--lr", "0.01", "--until", "2000", "--offset", "0", "--family", "modes", "--json")
    assert rc == 0, err
    rec = json.loads(out)
    assert any(w.startswith("loss: rises by") and "near step 1" in w for w in rec["warnings"])
    # the first drop where GD's is (`gd_midpoints`: 839), the second within 25 % of GD's 1585.
    # Where the second lands is decided by the search's rounding: over 40 copies of this log
    # perturbed by 1e-13 (relative), at 1253–1784 both before (`b952f81`) and after (`8772da1`)
    # `log_excess`'s closed-form Jacobian, 15 of 40 within 10 % and 3 of 40 inside the spike's
    # steps in both; the first at 838–844 in every copy (benchmarks/README.md).
    steps_pred = np.array(rec["drops"]["step"])
    assert rec["drops"]["future"][:2] == [False, False]
    np.testing.assert_allclose(steps_pred[0], 839, rtol=0.02)
    np.testing.assert_allclose(steps_pred[1], 1585, rtol=0.25)


@pytest.mark.xfail(
    strict=True,
    reason="known regression: on a clean log resolved to 1e-5, a 2x spike is 1e5 bin errors and dominates the "
    "criterion's residual scale, so the third mode's first 20 % is not worth its parameters",
)
def test_the_next_drop_is_found_past_a_spike(three_modes):
    steps, loss, _ = three_modes
    bumped = loss.copy()
    bumped[(steps > 1200) & (steps < 1400)] *= 2.0
    res = quiet_fit(steps, bumped, learning_rate=0.01, until=2000, offset=0.0, family="modes")
    fut = res.future_drops["step"]
    assert fut.size == 1 and abs(fut[0] / 2896 - 1) < 0.1  # GD's third drop, `gd_midpoints`: step 2896


def test_until_past_the_log_warns_that_nothing_is_held_out(three_modes):
    steps, loss, _ = three_modes
    with pytest.warns(UserWarning, match="nothing is held out") as caught:
        res = lvflow.fit(steps, loss, learning_rate=0.01, until=1e6, offset=0.0, family="modes", modes=3)
    assert res.fit_until == steps[-1]
    assert not np.any(np.asarray(res.drops["future"]))
    # the whole log with three modes given: GD's rates, and no other warning (the starts from the
    # log's visible drops alone merged two modes and added one at r = 4224, residuals 6× the
    # log's scatter; that misfit now sends the search along the path from one mode)
    np.testing.assert_allclose(np.sort(res.parameters["r"])[::-1], [1.0, 0.5, 0.25], rtol=0.01)
    assert [str(w.message) for w in caught if "held out" not in str(w.message)] == []


def test_outputs_written_atomically(capsys, tmp_path, fitted):
    out_npz, png = tmp_path / "fit.npz", tmp_path / "fit.png"
    fitted.save(out_npz)
    with np.load(out_npz, allow_pickle=False) as z:
        np.testing.assert_allclose(z["drops/step"], fitted.drops["step"])
        np.testing.assert_allclose(z["parameters/r"], fitted.parameters["r"])
        assert z["curve/step"].shape == (400,)
    fitted.plot(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fitted.save(tmp_path / "fit.json")
    rec = json.loads((tmp_path / "fit.json").read_text())
    assert rec["family"] == "modes" and rec["drops"]["future"] == [False, False, True]
    assert rec["learning_rate"] == 0.01 and rec["final_loss"][0] == pytest.approx(fitted.final_loss)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.json", "fit.npz", "fit.png"]  # no temp files
    with pytest.raises(lvflow.LvflowError, match="save: unsupported file type"):
        fitted.save(tmp_path / "fit.txt")
    summary = fitted.summary()
    assert "3 decoupled modes" in summary and "future" in summary


def test_readme_example(capsys, tmp_path, monkeypatch):
    """The README's worked example: its script writes the log, the command's table is the one
    printed there (to the digits shown), and the next drop is where Eq. 158 puts it."""
    text = README.read_text()
    section = text[text.index("## Fit a training curve") :]
    script = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    command = re.search(r"```console\n\$ (lvflow fit .*?)\n(.*?)```", section, re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(script, str(README), "exec"), {})
    argv = command.group(1).split()[1:]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    printed = command.group(2)
    table = [ln for ln in printed.splitlines() if re.match(r"\s*\d+\s", ln)]
    got = [ln for ln in out.splitlines() if re.match(r"\s*\d+\s", ln)]
    assert len(table) == len(got) == 3
    for want, have in zip(table, got):
        w, h = want.split(), have.split()
        assert w[0] == h[0] and w[-1] == h[-1]
        # step, step*, t*, r, V as printed (the table's rounding)
        for i in (1, 4, 5, 6, 7):
            assert float(h[i]) == pytest.approx(float(w[i]), rel=2e-3)
    r, eps = np.array([1.0, 0.5, 0.25]), 1e-4
    # step: where GD's own loss crosses each drop's midpoint; step*: Eq. 158's half-strength step
    steps_printed = np.array([float(ln.split()[1]) for ln in table])
    np.testing.assert_allclose(steps_printed, gd_midpoints(r, eps, 0.01, 5000), rtol=0.015)
    eq158 = np.log(r / eps - 1) / r / 0.01
    np.testing.assert_allclose([float(ln.split()[4]) for ln in table], eq158, rtol=0.01)
