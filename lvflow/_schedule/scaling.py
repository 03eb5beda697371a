"""Scaling laws of the excess loss: exponents (Thm 9–11), finite-ε corrections (App. C, Eq. 292,
295), power-law fits with an automatic window, and when plateaus merge into a power law.

Conventions. Modes are ranked by ignition order, `ζ_1 ≥ ζ_2 ≥ …`, with `ζ_k ∝ k^{−α₂}` and
`V_k ∝ k^{−α₁}`. In rescaled time `τ = t/ln(1/ε)` the loss tends to `E(τ) = Σ_k V_k 𝟙(τ < 1/ζ_k)`
(Eq. 168), so `E(τ) = Θ(τ^{−(α₁−1)/α₂})` (Thm 9). All exponents here are *decay* exponents,
positive numbers `κ` with `E ∝ t^{−κ}`.
"""

from __future__ import annotations

import math

import equinox as eqx
import numpy as np
from jaxtyping import ArrayLike, Float

from .._core.errors import LvflowError
from .._core.validate import as_array, check_in_open_interval, check_positive
from .._glv.closed_forms import ignition_time

__all__ = [
    "PowerLawFit",
    "SpectrumExponents",
    "StepResolution",
    "predicted_exponent",
    "spectrum_exponents",
    "effective_exponent",
    "effective_exponent_time",
    "fit_power_law",
    "resolved_steps",
]


# --------------------------------------------------------------------------------------------
# Asymptotic exponents
# --------------------------------------------------------------------------------------------


def predicted_exponent(*, alpha1=None, alpha2=None, gamma1=None, gamma2=None) -> float:
    """The decay exponent `κ` of `E(τ) = Θ(τ^{−κ})`.

    - feature-wise (Thm 9): `κ = (α₁ − 1)/α₂` for `V_k ∝ k^{−α₁}` (`α₁ > 1`, so the total loss
      `Σ V_k` is finite) and `ζ_k ∝ k^{−α₂}` (`α₂ > 0`);
    - sample-wise (Thm 10–11): `κ = (2γ₁ − 1)/γ₂` for `y_μ ∝ μ^{−γ₁}` (`γ₁ > ½`, so
      `Σ y_μ²` is finite) and `ζ_μ ∝ μ^{−γ₂}` (`γ₂ > 0`).

    Give exactly one of the pairs `(alpha1, alpha2)` or `(gamma1, gamma2)`.
    """
    feat = alpha1 is not None or alpha2 is not None
    samp = gamma1 is not None or gamma2 is not None
    if feat == samp:
        raise LvflowError("predicted_exponent: give exactly one pair, (alpha1, alpha2) or (gamma1, gamma2)")
    # (names, the bound on the first exponent and why, κ as a function of the two exponents)
    if feat:
        names, values, bound, why = ("alpha1", "alpha2"), (alpha1, alpha2), ("1", 1.0), "the total loss Σ V_k"
    else:
        names, values, bound, why = ("gamma1", "gamma2"), (gamma1, gamma2), ("1/2", 0.5), "Σ y_μ²"
    if None in values:
        law = "feature-wise" if feat else "sample-wise"
        raise LvflowError(f"predicted_exponent: the {law} law needs both {names[0]} and {names[1]}")
    e1 = float(as_array(names[0], values[0], ndim=0))
    e2 = check_positive(names[1], values[1])
    if not e1 > bound[1]:
        raise LvflowError(f"{names[0]}: must be > {bound[0]} ({why} must be finite), got {e1:g}")
    return (e1 - 1.0) / e2 if feat else (2.0 * e1 - 1.0) / e2


class SpectrumExponents(eqx.Module):
    """Power-law exponents of a mode spectrum, by log–log least squares over modes
    ranked by ignition order (`ζ` descending)."""

    alpha1: float
    alpha2: float
    alpha1_stderr: float
    alpha2_stderr: float
    kmin: int
    kmax: int

    @property
    def predicted(self) -> float:
        """`(α₁ − 1)/α₂` (Thm 9)."""
        return predicted_exponent(alpha1=self.alpha1, alpha2=self.alpha2)


def _linfit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares `y ≈ a + b x`: returns `(b, a, stderr of b)`."""
    n = x.size
    xm, ym = x.mean(), y.mean()
    sxx = float(np.sum((x - xm) ** 2))
    b = float(np.sum((x - xm) * (y - ym)) / sxx)
    a = float(ym - b * xm)
    res = y - a - b * x
    se = math.sqrt(float(np.sum(res**2)) / max(n - 2, 1) / sxx) if n > 2 else float("nan")
    return b, a, se


def spectrum_exponents(
    *,
    zeta: Float[ArrayLike, " K"] | None = None,
    V: Float[ArrayLike, " K"] | None = None,
    r: Float[ArrayLike, " K"] | None = None,
    C: Float[ArrayLike, "K K"] | Float[ArrayLike, " K"] | None = None,
    kmin: int = 1,
    kmax: int | None = None,
) -> SpectrumExponents:
    """Estimate `α₁, α₂` from `(ζ, V)`, or from a gLV's `(r, C)` with `ζ_k = r_k` and
    `V_k = r_k²/(8 C_kk)` (Thm 9, for isolated modes). Modes with `ζ_k ≤ 0` never ignite and are dropped; the rest
    are ranked `k = 1, 2, …` by decreasing `ζ`, and `ln ζ_k`, `ln V_k` are regressed on `ln k`
    over ranks `kmin..kmax` (inclusive; default all)."""
    if (zeta is None) == (r is None):
        raise LvflowError("spectrum_exponents: give either (zeta, V) or (r, C)")
    if r is not None:
        if C is None:
            raise LvflowError("C: is None, expected the (K, K) or (K,) interaction diagonal with r")
        zeta = as_array("r", r, ndim=1)
        C = as_array("C", C, ndim=(1, 2))
        Ckk = np.diagonal(C) if C.ndim == 2 else C
        if Ckk.shape != zeta.shape:
            raise LvflowError(f"C: diagonal of shape {Ckk.shape} does not match r of shape {zeta.shape}")
        if np.any(Ckk <= 0):
            raise LvflowError("C: every diagonal entry C_kk must be positive")
        V = zeta**2 / (8.0 * Ckk)
    else:
        if V is None:
            raise LvflowError("V: is None, expected the plateau drops V_k beside zeta")
        zeta = as_array("zeta", zeta, ndim=1)
        V = as_array("V", V, ndim=1)
        if V.shape != zeta.shape:
            raise LvflowError(f"V: shape {V.shape} does not match zeta of shape {zeta.shape}")
    keep = zeta > 0
    order = np.argsort(-zeta[keep], kind="stable")
    zs, Vs = zeta[keep][order], V[keep][order]
    n = zs.size
    kmax = n if kmax is None else int(kmax)
    if not (1 <= int(kmin) < kmax <= n) or kmax - int(kmin) < 2:
        raise LvflowError(
            f"kmin, kmax: need 1 ≤ kmin and kmin + 2 ≤ kmax ≤ {n} (the number of modes with ζ > 0), got {kmin}, {kmax}"
        )
    if np.any(Vs[kmin - 1 : kmax] <= 0):
        raise LvflowError("V: must be positive on the fitted modes (log–log regression)")
    lk = np.log(np.arange(kmin, kmax + 1, dtype=float))
    b2, _, s2 = _linfit(lk, np.log(zs[kmin - 1 : kmax]))
    b1, _, s1 = _linfit(lk, np.log(Vs[kmin - 1 : kmax]))
    return SpectrumExponents(alpha1=-b1, alpha2=-b2, alpha1_stderr=s1, alpha2_stderr=s2, kmin=int(kmin), kmax=kmax)


# --------------------------------------------------------------------------------------------
# Finite-ε effective exponents (App. C)
# --------------------------------------------------------------------------------------------


def effective_exponent(
    k: Float[ArrayLike, "*b"],
    eps: float,
    *,
    alpha1: float,
    alpha2: float,
    zeta: Float[ArrayLike, "*b"] | None = None,
    C: Float[ArrayLike, "*b"] | None = None,
    c: Float[ArrayLike, "*b"] | None = None,
    beta: float = 0.0,
) -> Float[ArrayLike, "*b"]:
    """The local decay exponent of the loss at the switch-on of mode `k`, at finite `ε` (Eq. 292):

    `κ_eff(k, ε) = (α₁ − 1) / (α₂ − (α₁ − α₂ − β) / ln(ζ_k / (C_k c_k ε)))`.

    It follows from `t*_k ≈ ln(ζ_k/(C_k c_k ε))/ζ_k` (Eq. 158): the logarithm drifts with `k`, so
    `d ln t*/d ln k` is not `α₂`. The paper's Eq. 292 is the case `z_k0 = ε` (`c_k = 1`, `β = 0`);
    here `z_k0 = c_k ε` with `c_k ∝ k^{−β}` is allowed, and `β = α₁ − α₂` removes the
    correction (the logarithm is then the same for every mode). As `ε → 0`,
    `κ_eff → (α₁ − 1)/α₂` (Thm 9); for `α₁ − α₂ − β > 0` the finite-ε law is steeper.

    **Arguments:** `k` (mode rank, array), `eps` in (0, 1); keyword-only `alpha1`, `alpha2` (the
    spectrum exponents) and `beta` (the exponent of `c_k`); `zeta`, `C`, `c`: the values `ζ_k`,
    `C_k`, `c_k` at `k` (broadcastable with `k`). By default the pure power-law spectrum of Thm 6
    with unit prefactors: `ζ_k = k^{−α₂}`, `V_k = k^{−α₁}`, `C_k = ζ_k²/(8V_k)`, `c_k = k^{−β}`.
    """
    eps = check_in_open_interval("eps", eps, 0.0, 1.0)
    kappa = predicted_exponent(alpha1=alpha1, alpha2=alpha2)
    k = as_array("k", k)
    if np.any(k <= 0):
        raise LvflowError("k: must be positive")
    a1, a2, beta = float(alpha1), float(alpha2), float(beta)
    zeta = k**-a2 if zeta is None else as_array("zeta", zeta)
    C = zeta**2 / (8.0 * k**-a1) if C is None else as_array("C", C)
    c = k**-beta if c is None else as_array("c", c)
    for name, v in (("zeta", zeta), ("C", C), ("c", c)):
        if np.any(v <= 0):
            raise LvflowError(f"{name}: must be positive")
    ell = np.log(zeta / (C * c * eps))
    if np.any(ell <= 0):
        raise LvflowError("eps: too large, ln(ζ_k/(C_k c_k ε)) ≤ 0 (the mode starts above its plateau)")
    den = a2 - (a1 - a2 - beta) / ell
    if np.any(den <= 0):
        raise LvflowError("eps: too large for Eq. 292, the switch-on times are not increasing in k here")
    return kappa * a2 / den


def effective_exponent_time(
    t: Float[ArrayLike, "*b"], eps: float, *, alpha1: float, alpha2: float, const: float = 0.0
) -> Float[ArrayLike, "*b"]:
    """The time form of the finite-ε exponent (Eq. 295), `α = (α₁ − α₂)/α₂`:

    `κ_eff(t) ≈ (α₁−1)/α₂ · [1 + α / (ln(1/ε) + α ln ln(1/ε) + const − α ln t)]`.

    `const` is the paper's O(1) constant `C` (it depends on the prefactors of `ζ_k`, `C_k`).
    The bracket corrects `(α₁−1)/α₂` by O(1/ln(1/ε)) and tends to 1 as `ε → 0` at fixed `t`.
    """
    eps = check_in_open_interval("eps", eps, 0.0, 1.0)
    if not eps < 1.0 / math.e:
        raise LvflowError(f"eps: must be < 1/e for ln ln(1/ε) to exist, got {eps:g}")
    kappa = predicted_exponent(alpha1=alpha1, alpha2=alpha2)
    t = as_array("t", t)
    if np.any(t <= 0):
        raise LvflowError("t: must be positive")
    a = (float(alpha1) - float(alpha2)) / float(alpha2)
    L = math.log(1.0 / eps)
    den = L + a * math.log(L) + float(const) - a * np.log(t)
    if np.any(den <= 0):
        raise LvflowError("t: too late for Eq. 295 at this ε (the expansion's denominator is ≤ 0)")
    return kappa * (1.0 + a / den)


# --------------------------------------------------------------------------------------------
# Power-law fit with an automatic window
# --------------------------------------------------------------------------------------------


class PowerLawFit(eqx.Module):
    """`loss ≈ prefactor · t^{−exponent}` on `window = (t_min, t_max)`.

    `stderr` is the regression standard error of the slope over log-binned points (the points
    are correlated, so read it as a measure of curvature within the window, not a confidence
    interval). `auto` says whether the window was chosen automatically.
    """

    exponent: float
    stderr: float
    prefactor: float
    window: tuple[float, float]
    n_points: int
    auto: bool

    @property
    def decades(self) -> float:
        """Width of the window in decades of `t`."""
        return math.log10(self.window[1] / self.window[0])

    def __call__(self, t):
        """The fitted line at times `t`."""
        return self.prefactor * np.asarray(t, dtype=float) ** (-self.exponent)


def _bin_loglog(t: np.ndarray, loss: np.ndarray, nbins: int) -> tuple[np.ndarray, np.ndarray]:
    """Means of `(ln t, ln loss)` in `nbins` equal bins of `ln t`: each decade weighs the same
    (GD records are uniform in `t`, so most raw points sit in the last decade) and noise averages."""
    x, y = np.log(t), np.log(loss)
    edges = np.linspace(x[0], x[-1], nbins + 1)
    idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, nbins - 1)
    cnt = np.bincount(idx, minlength=nbins)
    sx = np.bincount(idx, weights=x, minlength=nbins)
    sy = np.bincount(idx, weights=y, minlength=nbins)
    ok = cnt > 0
    return sx[ok] / cnt[ok], sy[ok] / cnt[ok]


def _local_slopes(x: np.ndarray, y: np.ndarray, half: float) -> np.ndarray:
    """Slope of a least-squares line through the binned points within `±half` of each `x`."""
    out = np.full(x.size, np.nan)
    for i in range(x.size):
        sel = np.abs(x - x[i]) <= half + 1e-12
        if np.count_nonzero(sel) >= 3:
            out[i] = _linfit(x[sel], y[sel])[0]
    return out


def fit_power_law(
    t: Float[ArrayLike, " n"],
    loss: Float[ArrayLike, " n"],
    window: tuple[float, float] | None = None,
    *,
    nbins: int = 80,
    smooth: float = 0.25,
    tol: float = 0.25,
    min_decades: float = 0.5,
    min_exponent: float = 0.05,
) -> PowerLawFit:
    """Fit `loss ∝ t^{−κ}` by least squares in log–log coordinates.

    With `window=(t_min, t_max)` the fit uses exactly those times. With `window=None` it is
    chosen automatically to exclude the initial plateau (local slope ≈ 0) and the finite-size
    cutoff (the slope steepens without bound as the last modes saturate): the points are averaged
    into `nbins` bins of `ln t`, local slopes are measured over `±smooth/2` decades, and the
    window is the widest run of bins (at least `min_decades` wide) whose local slopes all lie
    within `tol · κ` of the slope fitted over the run itself, and whose exponent `κ` is at least
    `min_exponent` (a plateau is a run of constant slope too, with `κ ≈ 0`). The window used is
    reported.

    **Arguments:** `t` (positive, increasing), `loss` (same shape; non-positive and non-finite
    entries are dropped, e.g. an excess loss that reached 0 in floating point).
    """
    t = np.asarray(as_array("t", t, ndim=1))
    loss = np.asarray(loss, dtype=float)
    if loss.shape != t.shape:
        raise LvflowError(f"loss: shape {loss.shape} does not match t of shape {t.shape}")
    if np.any(t <= 0) or np.any(np.diff(t) <= 0):
        raise LvflowError("t: must be positive and strictly increasing")
    keep = np.isfinite(loss) & (loss > 0)
    t, loss = t[keep], loss[keep]
    if t.size < 5:
        raise LvflowError(f"loss: only {t.size} positive finite value(s), need at least 5 for a fit")
    if window is not None:
        lo, hi = (float(v) for v in window)
        if not 0 < lo < hi:
            raise LvflowError(f"window: need 0 < t_min < t_max, got ({lo:g}, {hi:g})")
        sel = (t >= lo) & (t <= hi)
        if np.count_nonzero(sel) < 3:
            raise LvflowError(f"window: holds {np.count_nonzero(sel)} point(s) with positive loss, need at least 3")
        x, y = _bin_loglog(t[sel], loss[sel], nbins)
        if x.size < 3:
            x, y = np.log(t[sel]), np.log(loss[sel])
        b, a, se = _linfit(x, y)
        return PowerLawFit(
            exponent=-b, stderr=se, prefactor=math.exp(a), window=(lo, hi), n_points=int(x.size), auto=False
        )

    x, y = _bin_loglog(t, loss, nbins)
    ln10 = math.log(10.0)
    s = _local_slopes(x, y, 0.5 * smooth * ln10)
    # cumulative sums: the least-squares line over any run of bins [i, j] in O(1)
    c1, cx, cy = np.cumsum(np.ones_like(x)), np.cumsum(x), np.cumsum(y)
    cxx, cxy = np.cumsum(x * x), np.cumsum(x * y)

    def seg(i, j):
        g = lambda c: c[j] - (c[i - 1] if i > 0 else 0.0)
        n, sx, sy, sxx, sxy = g(c1), g(cx), g(cy), g(cxx), g(cxy)
        return (n * sxy - sx * sy) / (n * sxx - sx * sx)

    best = None
    n = x.size
    for i in range(n):
        for j in range(n - 1, i + 1, -1):
            width = (x[j] - x[i]) / ln10
            if width < min_decades or (best is not None and width <= best[0]):
                break
            b = seg(i, j)
            if not -b >= min_exponent:
                continue
            loc = s[i : j + 1]
            loc = loc[np.isfinite(loc)]
            if loc.size and np.max(np.abs(loc - b)) <= tol * abs(b):
                best = (width, i, j)
                break
    if best is None:
        raise LvflowError(
            f"loss: no power-law window of at least {min_decades:g} decades found "
            f"(local slopes vary by more than tol={tol:g} of the fit); pass window=(t_min, t_max)"
        )
    _, i, j = best
    b, a, se = _linfit(x[i : j + 1], y[i : j + 1])
    return PowerLawFit(
        exponent=-b,
        stderr=se,
        prefactor=math.exp(a),
        window=(math.exp(x[i]), math.exp(x[j])),
        n_points=int(j - i + 1),
        auto=True,
    )


# --------------------------------------------------------------------------------------------
# Where do plateaus merge into a power law?
# --------------------------------------------------------------------------------------------


#: Width of a logistic switch-on, `z/z∞ = 1/(1 + e^{−aζ(t − t*)})`, from 10 % to 90 %: `ln 81/(aζ)`.
_WIDTH = math.log(81.0)


class StepResolution(eqx.Module):
    """Which consecutive switch-ons are separate plateaus at a given `ε`.

    Modes are ranked by decreasing `ζ` (`order` maps ranks to the input's indices). For ranks
    `k, k+1`: `gaps[k] = t*_{k+1} − t*_k`, `widths[k] = ½(w_k + w_{k+1})` with
    `w_k = ln 81/(a ζ_k)` the 10–90 % rise time of the logistic switch-on (Thm 6/7), and
    `resolved[k] = gaps[k] > widths[k]`. `n_resolved` counts the leading steps that stand
    apart (every earlier step resolved as well); `k_merge` is the first rank (1-based) whose
    step merges with the next, or `None`. The gap grows like `ln(1/ε)·|1/ζ_{k+1} − 1/ζ_k|/a`
    while the width stays O(1/ζ_k), so smaller `ε` resolves more steps.
    """

    t_star: Float[np.ndarray, " K"]
    gaps: Float[np.ndarray, " K-1"]
    widths: Float[np.ndarray, " K-1"]
    resolved: np.ndarray
    order: np.ndarray
    n_resolved: int
    k_merge: int | None


def resolved_steps(
    zeta: Float[ArrayLike, " K"],
    eps: float,
    *,
    a: int = 1,
    C: Float[ArrayLike, " K"] | float | None = None,
    c: Float[ArrayLike, " K"] | float = 1.0,
    rho: float = 0.5,
) -> StepResolution:
    """How many switch-on steps are resolved at initial scale `ε` (see `StepResolution`).

    Switch-on times are `t*_k = ln(1/ε)/(a ζ_k)` (leading order of Eq. 158), or with `C`
    (the values `C_k`) the full Eq. 158,
    `t*_k = [ln(1/ε) − ln(C_k c_k/(ζ_k − C_k c_k ε) · (1−ρ)/ρ)]/(a ζ_k)` for `z_k0 = c_k ε`.
    Modes with `ζ_k ≤ 0` never switch on and are left out.
    """
    zeta = np.asarray(as_array("zeta", zeta, ndim=1))
    eps = check_in_open_interval("eps", eps, 0.0, 1.0)
    rho = check_in_open_interval("rho", rho, 0.0, 1.0)
    if a not in (1, 2):
        raise LvflowError(f"a: must be 1 (Thm 6) or 2 (Thm 7), got {a!r}")
    idx = np.flatnonzero(zeta > 0)
    order = idx[np.argsort(-zeta[idx], kind="stable")]
    zs = zeta[order]
    L = math.log(1.0 / eps)
    if C is None:
        t_star = L / (a * zs)
    else:
        Ck = np.broadcast_to(as_array("C", C), zeta.shape)[order]
        ck = np.broadcast_to(as_array("c", c), zeta.shape)[order]
        if np.any(Ck <= 0) or np.any(ck <= 0):
            raise LvflowError("C, c: must be positive")
        room = zs - Ck * ck * eps
        if np.any(room <= 0):
            raise LvflowError("eps: too large, some mode starts at or above its plateau (ζ_k ≤ C_k c_k ε)")
        t_star = np.asarray(ignition_time(zs, Ck, ck, eps, a=a, rho=rho))
    w = _WIDTH / (a * zs)
    gaps = np.diff(t_star)
    widths = 0.5 * (w[:-1] + w[1:])
    resolved = gaps > widths
    bad = np.flatnonzero(~resolved)
    k_merge = int(bad[0]) + 1 if bad.size else None
    n_res = int(bad[0]) if bad.size else int(zs.size)
    return StepResolution(
        t_star=t_star, gaps=gaps, widths=widths, resolved=resolved, order=order, n_resolved=n_res, k_merge=k_merge
    )
