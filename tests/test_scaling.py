"""Scaling laws (Thm 9–11, App. C): exponents, finite-ε corrections, power-law fits."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import lvflow
from lvflow import (
    effective_exponent,
    effective_exponent_time,
    fit_power_law,
    predicted_exponent,
    resolved_steps,
    spectrum_exponents,
)


def test_predicted_exponent_closed_forms():
    assert predicted_exponent(alpha1=2.0, alpha2=0.8) == pytest.approx(1.25, rel=1e-15)
    # Fig 5: α₁ = 2β, α₂ = θ + β
    assert predicted_exponent(alpha1=3.0, alpha2=2.5) == pytest.approx(0.8, rel=1e-15)
    assert predicted_exponent(gamma1=1.0, gamma2=0.5) == pytest.approx(2.0, rel=1e-15)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(alpha1=1.0, alpha2=1.0), "alpha1: must be > 1"),
        (dict(alpha1=2.0, alpha2=0.0), "alpha2: must be positive"),
        (dict(gamma1=0.5, gamma2=1.0), "gamma1: must be > 1/2"),
        (dict(gamma1=1.0, gamma2=-1.0), "gamma2: must be positive"),
        (dict(alpha1=2.0), "needs both alpha1 and alpha2"),
        (dict(gamma2=2.0), "needs both gamma1 and gamma2"),
        (dict(alpha1=2.0, alpha2=1.0, gamma1=1.0, gamma2=1.0), "exactly one pair"),
        (dict(), "exactly one pair"),
        (dict(alpha1=float("nan"), alpha2=1.0), "alpha1: contains 1 non-finite"),
    ],
)
def test_predicted_exponent_errors(kw, match):
    with pytest.raises(lvflow.LvflowError, match=match):
        predicted_exponent(**kw)


def test_spectrum_exponents_from_r_C_and_zeta_V():
    k = np.arange(1, 201, dtype=float)
    r, V = k**-0.8, k**-2.0
    Ckk = r**2 / (8 * V)  # the Fig 3-right system
    perm = np.random.default_rng(0).permutation(k.size)  # the ranking must undo any ordering
    s = spectrum_exponents(r=r[perm], C=np.diag(Ckk[perm]))
    assert s.alpha1 == pytest.approx(2.0, rel=1e-12) and s.alpha2 == pytest.approx(0.8, rel=1e-12)
    assert s.predicted == pytest.approx(1.25, rel=1e-12)
    s2 = spectrum_exponents(zeta=np.r_[r, -1.0], V=np.r_[V, 5.0], kmin=3, kmax=150)  # ζ ≤ 0 never ignites
    assert (s2.alpha1, s2.alpha2) == (pytest.approx(2.0, rel=1e-12), pytest.approx(0.8, rel=1e-12))


@pytest.mark.bad_input
def test_spectrum_exponents_errors():
    k = np.arange(1, 201, dtype=float)
    r, V = k**-0.8, k**-2.0
    Ckk = r**2 / (8 * V)
    with pytest.raises(lvflow.LvflowError, match="give either"):
        spectrum_exponents(zeta=r, r=r)
    with pytest.raises(lvflow.LvflowError, match="C: every diagonal entry"):
        spectrum_exponents(r=r, C=-Ckk)
    with pytest.raises(lvflow.LvflowError, match="kmin, kmax"):
        spectrum_exponents(zeta=r, V=V, kmax=500)
    with pytest.raises(lvflow.LvflowError, match="V: shape"):
        spectrum_exponents(zeta=r, V=V[:3])


def _kt(t, a1, a2, L):
    """Invert t = k^{α₂} (L − (α₁−α₂) ln k) for k by bisection in ln k (numpy, independent)."""
    lo, hi = np.zeros_like(t), np.full_like(t, 0.9 * L / max(a1 - a2, 1e-9))
    for _ in range(200):
        mid = (lo + hi) / 2
        f = np.exp(a2 * mid) * (L - (a1 - a2) * mid) - t
        lo, hi = np.where(f < 0, mid, lo), np.where(f < 0, hi, mid)
    return np.exp((lo + hi) / 2)


def test_effective_exponent_is_the_local_slope_of_the_continuum_law():
    """Eq. 292 is exact for the continuum `E(t) = ∫_{k(t)}^∞ V_k dk` with t*_k = ln(ζ_k/(C_k ε))/ζ_k:
    compare with a finite-difference slope of that independent construction."""
    a1, a2, eps = 2.0, 0.8, 1e-6
    L = math.log(1 / eps)  # ζ_k/C_k = k^{α₂−α₁} (unit prefactors, c_k = 1)
    t = np.geomspace(1e2, 1e3, 7)
    h = 1e-5
    lnE = lambda tt: (1 - a1) * np.log(_kt(tt, a1, a2, L))
    slope = -(lnE(t * math.exp(h)) - lnE(t * math.exp(-h))) / (2 * h)
    k = _kt(t, a1, a2, L)
    ke = effective_exponent(k, eps, alpha1=a1, alpha2=a2, zeta=k**-a2, C=k ** (a1 - 2 * a2))
    np.testing.assert_allclose(ke, slope, rtol=1e-6)
    assert np.all(ke > 1.25)  # steeper than Thm 9 at finite ε
    # the default spectrum (ζ_k = k^{−α₂}, V_k = k^{−α₁}, C_k = ζ_k²/(8V_k)) is this one with ε × 8
    np.testing.assert_allclose(effective_exponent(k, eps * 8, alpha1=a1, alpha2=a2), ke, rtol=1e-12)
    # Eq. 295 (the time form) drops O(ln ln) terms: it is exact only as ε → 0. Here the
    # derivation gives const = −α (α = (α₁−α₂)/α₂); at ε = 1e-30 it matches to 0.5 %.
    eps, al = 1e-30, (a1 - a2) / a2
    L = math.log(1 / eps)
    t = np.geomspace(1e3, 1e4, 5)
    slope = -(lnE(t * math.exp(h)) - lnE(t * math.exp(-h))) / (2 * h)
    kt = effective_exponent_time(t, eps, alpha1=a1, alpha2=a2, const=-al)
    np.testing.assert_allclose(kt, slope, rtol=5e-3)
    assert np.all(np.abs(kt - slope) < 0.1 * (slope - 1.25))  # captures the correction itself


@settings(max_examples=15, deadline=None)
@given(a1=st.floats(1.2, 4.0), a2=st.floats(0.3, 2.0), beta=st.floats(0.0, 2.0), k=st.floats(1.0, 1e3))
def test_effective_exponent_limits(a1, a2, beta, k):
    kappa = (a1 - 1) / a2
    kw = dict(alpha1=a1, alpha2=a2, zeta=k**-a2, C=k ** (a1 - 2 * a2), c=k**-beta, beta=beta)
    # ε → 0 gives Thm 9; the correction decays like 1/ln(1/ε)
    e1 = effective_exponent(k, 1e-200, **kw)
    e2 = effective_exponent(k, 1e-100, **kw)
    assert abs(e1 - kappa) <= 0.6 * abs(e2 - kappa) + 1e-12
    # β = α₁ − α₂ (Fig 3-right) removes the correction at any ε
    kw.update(c=k ** -(a1 - a2), beta=a1 - a2)
    assert effective_exponent(k, 1e-6, **kw) == pytest.approx(kappa, rel=1e-12)
    t = effective_exponent_time(np.array([1.0, 10.0]), 1e-300, alpha1=a1, alpha2=a2)
    np.testing.assert_allclose(t, kappa, rtol=abs(a1 - a2) / a2 / 600 + 1e-12)


def test_effective_exponent_errors():
    kw = dict(alpha1=2.0, alpha2=0.8, zeta=1.0, C=1.0)
    with pytest.raises(lvflow.LvflowError, match="eps: must lie in"):
        effective_exponent(1.0, 2.0, **kw)
    with pytest.raises(lvflow.LvflowError, match="eps: too large"):
        effective_exponent(1.0, 0.5, **dict(kw, C=10.0))
    with pytest.raises(lvflow.LvflowError, match="k: must be positive"):
        effective_exponent(-1.0, 1e-3, **kw)
    with pytest.raises(lvflow.LvflowError, match="t: must be positive"):
        effective_exponent_time(0.0, 1e-3, alpha1=2.0, alpha2=0.8)
    with pytest.raises(lvflow.LvflowError, match="alpha1: must be > 1"):
        effective_exponent_time(1.0, 1e-3, alpha1=0.5, alpha2=0.8)


@pytest.mark.parametrize("kappa", [0.5, 1.25, 2.0])
def test_fit_power_law_recovers_exponent_with_plateau_cutoff_and_noise(kappa):
    """`E = A (1 + (t/t0)^4)^{−κ/4} · exp(−t/t_c)` (plateau until t0, power law, exponential
    cutoff at t_c) with 3 % multiplicative noise: the automatic window must exclude the plateau
    and the cutoff and recover κ."""
    rng = np.random.default_rng(1)
    t = np.arange(1.0, 2e6, 7.0)  # uniform in t, like a GD record
    E = 3.0 * (1 + (t / 30.0) ** 4) ** (-kappa / 4) * np.exp(-t / 3e5) * np.exp(0.03 * rng.standard_normal(t.size))
    fit = fit_power_law(t, E)
    assert fit.auto
    assert fit.exponent == pytest.approx(kappa, rel=0.03)
    assert fit.window[0] > 30.0 and fit.window[1] < 3e5 and fit.decades > 1.5
    exact = fit_power_law(t, 3.0 * t**-kappa, window=(10.0, 1e4))  # exact law, given window
    assert exact.exponent == pytest.approx(kappa, rel=1e-10) and not exact.auto
    assert exact(100.0) == pytest.approx(3.0 * 100.0**-kappa, rel=1e-8)


def test_fit_power_law_on_summed_steps_gives_thm9_slope():
    """`E(τ) = Σ_k V_k 𝟙(τ < 1/ζ_k)` (Eq. 168), built in numpy, has slope (α₁−1)/α₂ (Thm 9)."""
    a1, a2, K = 2.0, 0.8, 10**6
    k = np.arange(1, K + 1, dtype=float)
    V, zeta = k**-a1, k**-a2
    tau = np.geomspace(0.5, 2 * K**a2, 4000)
    tail = np.r_[np.cumsum(V[::-1])[::-1], 0.0]  # tail[j] = Σ_{k > j} V_k (0-based)
    E = tail[np.searchsorted(1 / zeta, tau, side="right")]  # modes with 1/ζ_k > τ still unlearnt
    fit = fit_power_law(tau, E)
    assert fit.exponent == pytest.approx(1.25, rel=0.03)
    assert fit.window[1] < K**a2  # stops before the last mode (finite-size cutoff)


@pytest.mark.bad_input
def test_fit_power_law_errors():
    t = np.arange(1.0, 100.0)
    with pytest.raises(lvflow.LvflowError, match="t: must be positive and strictly increasing"):
        fit_power_law(t[::-1], t)
    with pytest.raises(lvflow.LvflowError, match="loss: shape"):
        fit_power_law(t, t[:5])
    with pytest.raises(lvflow.LvflowError, match="loss: only 0 positive"):
        fit_power_law(t, np.zeros_like(t))
    with pytest.raises(lvflow.LvflowError, match="no power-law window"):
        fit_power_law(t, np.exp(-t / 10))
    with pytest.raises(lvflow.LvflowError, match="no power-law window"):  # a plateau is not a power law
        fit_power_law(t, 1 + 1e-4 * np.exp(-t / 10))
    with pytest.raises(lvflow.LvflowError, match="window: need"):
        fit_power_law(t, 1 / t, window=(5.0, 2.0))


def test_resolved_steps_against_hand_computation():
    zeta = np.array([0.25, 1.0, 0.5])  # unsorted on purpose
    eps = 1e-6
    res = resolved_steps(zeta, eps)
    L = math.log(1 / eps)
    np.testing.assert_array_equal(res.order, [1, 2, 0])
    np.testing.assert_allclose(res.t_star, L / np.array([1.0, 0.5, 0.25]), rtol=1e-14)
    np.testing.assert_allclose(res.gaps, [L, 2 * L], rtol=1e-14)
    w = math.log(81) / np.array([1.0, 0.5, 0.25])
    np.testing.assert_allclose(res.widths, [(w[0] + w[1]) / 2, (w[1] + w[2]) / 2], rtol=1e-14)
    assert res.n_resolved == 3 and res.k_merge is None
    # Eq. 158 with C: Thm 6 switch-on, checked against the closed form z(t*) = ½ z(∞)
    C, r = 2.0, 0.5
    t1 = resolved_steps(np.array([r, 0.1]), eps, C=C).t_star[0]
    z = r * eps / (C * eps + (r - C * eps) * math.exp(-r * t1))
    assert z == pytest.approx(0.5 * r / C, rel=1e-12)


def test_resolved_steps_merge_with_power_law_spectrum():
    """For ζ_k = k^{−α₂} the gap ln(1/ε)·α₂ k^{α₂−1} beats the width ln81·k^{α₂} only for
    k ≲ α₂ ln(1/ε)/ln 81, so the number of resolved steps grows like ln(1/ε)."""
    k = np.arange(1, 400, dtype=float)
    n = [resolved_steps(k**-0.8, e).n_resolved for e in (1e-4, 1e-16, 1e-64)]
    for e, ni in zip((1e-4, 1e-16, 1e-64), n):
        pred = 0.8 * math.log(1 / e) / math.log(81)
        assert abs(ni - pred) <= 0.15 * pred + 1.5
    assert n[0] < n[1] < n[2]
    with pytest.raises(lvflow.LvflowError, match="a: must be 1"):
        resolved_steps(k, 1e-3, a=3)
    with pytest.raises(lvflow.LvflowError, match="eps: too large"):
        resolved_steps(np.array([1.0]), 0.9, C=10.0)


@settings(max_examples=10, deadline=None)
@given(kappa=st.floats(0.2, 3.0), logA=st.floats(-3, 3), lo=st.floats(-1, 1))
def test_fit_power_law_exact_law_any_exponent(kappa, logA, lo):
    """An exact power law is one straight window: the fit takes (almost) all of it, exactly."""
    t = np.geomspace(10**lo, 10 ** (lo + 4), 500)
    fit = fit_power_law(t, 10**logA * t**-kappa)
    assert fit.exponent == pytest.approx(kappa, rel=1e-9)
    assert fit.prefactor == pytest.approx(10**logA, rel=1e-8)
    assert fit.decades > 3.9
