"""Starting points and the model search of `fit`: greedy decoupled modes chosen by an information
criterion, and a grid of starts for the power-law spectrum."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from .._core.validate import to_jax
from . import engine
from .base import Criterion
from .engine import Binned
from .modes import MIN_LAG, DecoupledModes
from .power import PowerLawModel

#: Levenberg–Marquardt steps per start while searching (enough to rank the starts; the chosen
#: one is then refined to convergence).
SEARCH_STEPS = 40
#: with `modes` given, a fit whose residuals exceed this many times the bins' errors (`χ²/(n − p)`)
#: is searched again along the greedy path (`search_modes`)
LOOSE_MISFIT = 4.0


def _f64(x) -> jnp.ndarray:
    """A float64 scalar that is not weakly typed (a weak one would compile the solver again)."""
    return to_jax(np.float64(x))


class Candidate:
    """One fitted model of a search: the template (its static structure), the optimum `theta`,
    the weighted residual sum of the data `χ²` (`rss`) and its information criterion."""

    def __init__(self, label, template, theta, rss, n, p, criterion, batch, K=0):
        self.label, self.template, self.theta, self.batch, self.K = label, template, np.asarray(theta), batch, K
        self.rss, self.n, self.p, self.criterion = float(rss), int(n), int(p), Criterion(criterion)
        self.score = engine.information_criterion(self.rss, n, p, self.criterion)

    @property
    def model(self):
        return engine.model_of(self.template, to_jax(self.theta))

    @property
    def data_term(self) -> float:
        """The information criterion less its penalty: what the data say about this candidate
        (0 for a `χ²` within the bins' errors)."""
        return engine.information_criterion(self.rss, self.n, 0, self.criterion)


def _level(data: Binned, t: float) -> float:
    """The observed loss near time `t` (interpolated in `ln t`; held at the ends)."""
    ok = np.asarray(data.count) > 0
    tb, yb = np.asarray(data.t)[ok], np.asarray(data.y)[ok]
    pos = tb > 0
    x = np.log(tb[pos])
    return float(np.exp(np.interp(math.log(t), x, yb[pos]))) if x.size else float(np.exp(yb[-1]))


def _times(data: Binned) -> tuple[float, float]:
    ok = np.asarray(data.count) > 0
    tb = np.asarray(data.t)[ok]
    pos = tb[tb > 0]
    return float(pos[0]), float(pos[-1])


def find_drops(data: Binned, max_drops: int) -> list[tuple[float, float, float]]:
    """Drops visible in the log, most prominent first, as `(t_c, V, r)`: peaks of the smoothed
    decay rate `−d ln L/d ln t` over the bins, each with the loss it removes (the fall of the
    curve between the neighbouring minima of the rate) and the rate that gives the peak's slope
    (`|d ln L/dt| = r (V/4)/(V/4 + P)` at the half-way point of a logistic mode above a
    plateau `P`)."""
    ok = np.asarray(data.count) > 0
    tb, yb = np.asarray(data.t)[ok], np.asarray(data.y)[ok]
    pos = tb > 0
    x, y = np.log(tb[pos]), yb[pos]
    if x.size < 7:
        return []
    k = np.array([1.0, 2.0, 3.0, 2.0, 1.0]) / 9.0
    ys = np.convolve(np.pad(y, 2, mode="edge"), k, mode="valid")
    s = -np.gradient(ys, x)
    found = []
    for i in range(1, x.size - 1):
        if s[i] > 0 and s[i] >= s[i - 1] and s[i] > s[i + 1]:
            lo = i
            while lo > 0 and s[lo - 1] < s[lo]:
                lo -= 1
            hi = i
            while hi < x.size - 1 and s[hi + 1] < s[hi]:
                hi += 1
            drop = ys[lo] - ys[hi]  # in ln L
            if drop < 0.05:
                continue
            Lb, La = math.exp(ys[lo]), math.exp(ys[hi])
            V = Lb - La
            t_c = math.exp(x[i])
            slope_t = s[i] / t_c  # |d ln L/dt|
            P = La
            r = slope_t * (V / 4 + P) / (V / 4)
            found.append((drop, t_c, V, r))
    found.sort(key=lambda f: -f[0])
    return [(t_c, V, r) for _, t_c, V, r in found[:max_drops]]


def _rate_for(V: float, t_c: float, log_eps: float) -> float:
    """The rate `r` that puts a mode of drop `V` half-way at `t_c` when it starts at `ε`:
    `r t_c = ln(8 V/(r ε) − 1)`, solved by fixed-point iteration (a few steps suffice)."""
    r = 10.0 / t_c
    for _ in range(30):
        w = math.log(8 * V / r) - log_eps
        r = max(w, MIN_LAG + 0.5) / t_c
    return r


def search_modes(
    data: Binned,
    *,
    max_modes: int,
    modes: int | None,
    offset: float | None,
    criterion: Criterion,
    prior_width: float,
    robust: bool,
    floor: DecoupledModes | None = None,
) -> tuple[Candidate | None, dict[str, float]]:
    """Greedy search over the number of decoupled modes: from the best `K − 1` fit, a new mode is
    started at several times (inside the logged range and after it) with several drops, every
    start is refined by Levenberg–Marquardt at once (`SCREEN_STEPS` steps for every start, then
    the `SCREEN_KEEP` best for `SEARCH_STEPS` more: `engine.solve_robust`), and the best is
    kept; `K` stops growing when the criterion has not improved for two steps, or when the best
    fit's `χ²` is within the bins' errors (`χ² ≤ n`: no larger `K` can score lower, its data
    term being 0 already and its penalty larger). With `modes`
    given, `K = modes` is fitted from the drop-based starts alone, and only if that fit's residuals
    exceed `LOOSE_MISFIT` times the bins' errors (the starts missed the staircase) is the path grown
    from one mode to `modes` as well, keeping the lower `χ²`. Returns the best candidate by the
    criterion and every candidate `K`'s score.

    With `floor` (a fit with a free offset, of `max_modes` slots) and `offset=0`, the search
    starts from `floor`'s modes with one more, which begins by taking over the floor's loss:
    the hypothesis that the floor is a plateau, a drop still to come (`fit`'s scenarios): every
    `K`'s fit is then the best whose latest mode is half-way after the log (a fit that moves
    every mode into the log is a different hypothesis), and the search returns no candidate
    (None) when no start keeps one there."""
    slots = modes if modes is not None else max_modes
    fit_offset = offset is None
    y = np.asarray(data.y)[np.asarray(data.count) > 0]
    lmin = float(np.exp(y.min()))
    log_off = math.log(0.5 * lmin) if fit_offset else (-math.inf if offset == 0 else math.log(offset))
    tmin, tmax = _times(data)
    base = DecoupledModes(
        log_rate=to_jax(np.zeros(slots)),
        log_drop=to_jax(np.full(slots, math.log(lmin))),
        log_tstar=to_jax(np.full(slots, math.log(tmax))),
        log_eps=to_jax(np.float64(0.0)),
        active=to_jax(np.zeros(slots, bool)),
        log_offset=to_jax(np.float64(log_off)),
        prior_width=to_jax(np.float64(prior_width)),
        fit_offset=fit_offset,
    )
    peaks = find_drops(data, slots)
    lend = _level(data, tmax)
    prev = None  # model of the previous K
    if floor is not None:  # the floor's model without its floor: the next K starts from it
        prev = DecoupledModes(
            log_rate=floor.log_rate,
            log_drop=floor.log_drop,
            log_tstar=floor.log_tstar,
            log_eps=floor.log_eps,
            active=floor.active,
            log_offset=base.log_offset,
            prior_width=base.prior_width,
            fit_offset=False,
        )
    K_from = 1 if floor is None else int(np.sum(np.asarray(floor.active))) + 1

    def stage(K: int, prev: DecoupledModes | None) -> Candidate | None:
        """The best `K`-mode fit from the drop-based starts and, given the `K − 1` optimum
        `prev`, the starts that add one mode to it; None if no start converged."""
        template = _with_active(base if prev is None else prev, K)
        starts = [_peak_starts(template, K, peaks, tmax, lend, fit_offset=fit_offset)]
        if prev is not None:
            starts.append(_mode_starts(template, K, data, tmin, tmax, fit_offset=fit_offset))
        values, rss, objective, _ = engine.solve_robust(
            template, np.concatenate(starts), data, robust=robust, max_steps=SEARCH_STEPS, screen=True
        )
        if floor is not None:
            # the floor's own starts, solved apart (in a screen with the others, a start whose new
            # mode moves into the log falls faster at first), then a drop to come: the best fit
            # whose latest mode is half-way after the log
            if K == K_from:
                more = engine.solve_robust(
                    template,
                    _floor_starts(template, K, float(floor.offset), tmax),
                    data,
                    robust=robust,
                    max_steps=SEARCH_STEPS,
                )
                values, rss, objective = (np.concatenate([a, b]) for a, b in zip((values, rss, objective), more[:3]))
            S = template.K
            t_star = (MIN_LAG + np.exp(values[:, 2 * S : 2 * S + K])) / np.exp(values[:, :K])
            objective = np.where(t_star.max(axis=1) > tmax, objective, np.inf)
        i = int(np.argmin(objective))
        if not (np.isfinite(rss[i]) and np.isfinite(objective[i])):
            return None
        return Candidate(
            f"{K} modes", template, values[i], rss[i], data.n, 3 * K + fit_offset, criterion, engine.BATCH, K
        )

    scores: dict[str, float] = {}
    best: Candidate | None = None
    if modes is not None:
        best = stage(modes, prev)
        if best is None or best.rss / max(best.n - best.p, 1) > LOOSE_MISFIT:
            # the drop-based starts missed the staircase (merged or spurious modes): grow the path
            # from one mode as the free search does, each `K` from the `K − 1` optimum
            grown = prev
            for K in range(K_from, modes):
                cand = stage(K, grown)
                if cand is None:
                    break
                grown = cand.model
            else:
                cand = stage(modes, grown)
                if cand is not None and (best is None or cand.rss < best.rss):
                    best = cand
        if best is not None:
            scores[f"modes K={modes}"] = best.score
    else:
        since = 0
        for K in range(K_from, max_modes + 1):
            cand = stage(K, prev)
            if cand is None:
                break
            scores[f"modes K={K}"] = cand.score
            prev = cand.model
            if best is None or cand.score < best.score:
                best, since = cand, 0
            else:
                since += 1
                if since >= 2:
                    break
            if best.data_term == 0.0:
                break  # χ² within the bins' errors: a larger K only adds penalty
    if best is None and floor is None:
        raise RuntimeError("no start of the decoupled-modes fit converged")
    return best, scores


def _with_active(model: DecoupledModes, K: int) -> DecoupledModes:
    import equinox as eqx

    return eqx.tree_at(lambda m: m.active, model, to_jax(np.arange(model.K) < K))


def _mode_starts(template, K, data, tmin, tmax, *, fit_offset):
    """Starts that add slot `K − 1` to the previous optimum (every other entry kept): the new
    mode half-way at times inside the log and after it, removing half the loss there or taking
    over the offset, with the rate its start at `ε` implies (Eq. 158) or a faster one."""
    theta = np.asarray(engine.vector_of(template)).copy()
    S = template.K
    k = K - 1
    log_eps = float(theta[3 * S])
    off = math.exp(float(template.log_offset)) if np.isfinite(float(template.log_offset)) else 0.0
    out = []
    for tc in np.concatenate([np.geomspace(tmin, tmax, 5), tmax * np.array([1.4, 2.0, 3.0])]):
        options = [(0.5 * _level(data, min(tc, tmax)), False)]
        if fit_offset and off > 0 and tc > tmax:
            options.append((0.9 * off, True))
        for V, takes_offset in options:
            for r in (_rate_for(V, tc, log_eps), 14.0 / tc):
                th = theta.copy()
                th[k], th[S + k] = math.log(r), math.log(V)
                th[2 * S + k] = math.log(max(r * tc - MIN_LAG, 0.3))
                if takes_offset:
                    th[3 * S + 1] = math.log(0.1 * off)
                out.append(th)
    return np.array(out)


def _floor_starts(template, K, floor, tmax):
    """Starts that turn a floor `L_∞` into slot `K − 1`: a mode removing `floor`, half-way after
    the log (1.1× to 4× its last time), at the rate its start at `ε` implies (Eq. 158) or a
    faster one."""
    theta = np.asarray(engine.vector_of(template)).copy()
    S, k = template.K, K - 1
    log_eps = float(theta[3 * S])
    out = []
    for tc in tmax * np.array([1.1, 1.4, 2.0, 4.0]):
        for r in (_rate_for(floor, tc, log_eps), 14.0 / tc):
            th = theta.copy()
            th[k], th[S + k] = math.log(r), math.log(floor)
            th[2 * S + k] = math.log(max(r * tc - MIN_LAG, 0.3))
            out.append(th)
    return np.array(out)


def _peak_starts(template, K, peaks, tmax, lend, *, fit_offset):
    """Starts with the `K` modes at the most prominent drops the log shows (`find_drops`) and
    the rest after the log (half-way at 1.5× or 2.5× the logged time, then 1.6× apart), each of
    those removing half the last logged loss with `r t* ∈ {7, 12}`; `ε` the mean start."""
    S = template.K
    base = np.asarray(engine.vector_of(template)).copy()
    use = sorted(peaks[:K], key=lambda p: p[0])
    n_extra = K - len(use)
    out = []
    for spread in (1.5, 2.5) if n_extra else (1.0,):
        for a in (7.0, 12.0) if n_extra else (None,):
            modes = use + [(tmax * spread * 1.6**j, 0.5 * lend, a / (tmax * spread * 1.6**j)) for j in range(n_extra)]
            th = base.copy()
            log_z0 = []
            for k, (tc, V, r) in enumerate(modes):
                r = max(r, (MIN_LAG + 0.3) / tc)
                th[k], th[S + k] = math.log(r), math.log(V)
                th[2 * S + k] = math.log(r * tc - MIN_LAG)
                log_z0.append(math.log(8 * V / r) - math.log1p(math.exp(r * tc)))
            th[3 * S] = float(np.mean(log_z0))
            if fit_offset:
                th[3 * S + 1] = math.log(0.3 * lend)
            out.append(th)
    return np.array(out)


def search_power_law(
    data: Binned,
    *,
    max_modes: int,
    modes: int | None,
    offset: float | None,
    criterion: Criterion,
    beta: float,
    fit_beta: bool,
    robust: bool,
) -> Candidate:
    """Levenberg–Marquardt from a grid of starts for the power-law spectrum: `α₂ ∈ {0.6, 1, 1.6,
    2.5}` and the first mode's `ℓ_1 = ζ_1 t*_1 ∈ {6, 12, 20}`, with `α₁ = 1 + κ α₂` from the
    late log–log slope `κ` of the log, `ζ_1` from the time of the first drop and `V_1` from the
    initial loss. With `fit_beta`, the family with `β` fixed at `beta` (Eq. 292's `β = 0` by
    default) is searched first and its optimum is one more start: it is a point of the larger
    family, so the fit with `β` free is never worse than the one with `β` fixed (from the grid
    alone, `β` and `ε` — the slope and intercept of `ℓ_k` in `ln k` — can trade off into a
    worse optimum). Returns the best fit."""
    fit_offset = offset is None
    ok = np.asarray(data.count) > 0
    tb, yb = np.asarray(data.t)[ok], np.asarray(data.y)[ok]
    pos = tb > 0
    x, yy = np.log(tb[pos]), yb[pos]
    L0 = float(np.exp(yb[0]))
    lmin = float(np.exp(yb.min()))
    # the late slope: least squares over the last third of the log-time range
    late = x >= x[0] + (x[-1] - x[0]) * 2 / 3
    kappa = float(-np.polyfit(x[late], yy[late], 1)[0]) if np.count_nonzero(late) >= 3 else 0.5
    kappa = min(max(kappa, 0.1), 3.0)
    below = np.flatnonzero(yy < math.log(0.8 * L0))
    t1 = float(np.exp(x[below[0]])) if below.size else float(np.exp(x[-1]))
    tmax = float(np.exp(x[-1]))
    K_fixed = modes is not None
    slots = modes if K_fixed else max_modes
    log_off = math.log(0.3 * lmin) if fit_offset else (-math.inf if offset == 0 else math.log(offset))
    starts, template = [], None
    for a2 in (0.6, 1.0, 1.6, 2.5):
        a1 = max(1.0 + kappa * a2, 1.1)
        H = float(np.sum(np.arange(1, slots + 1, dtype=float) ** -a1))
        V1 = max(L0 - (0.0 if not fit_offset else 0.3 * lmin), 1e-300) / H
        for ell in (6.0, 12.0, 20.0):
            zeta1 = ell / t1
            log_eps = math.log(8 * V1 / zeta1) - ell - beta * 0.0
            if K_fixed:
                K0 = float(modes)
            else:  # the mode half-way at twice the logged range
                K0 = min(max((2 * tmax * zeta1 / ell) ** (1 / a2), 2.0), float(slots))
            m = PowerLawModel(
                log_zeta1=_f64(math.log(zeta1)),
                log_V1=_f64(math.log(V1)),
                alpha1=_f64(a1),
                alpha2=_f64(a2),
                log_eps=_f64(log_eps),
                beta=_f64(beta),
                log_modes=_f64(math.log(K0)),
                log_offset=_f64(log_off),
                max_modes=slots,
                fit_beta=fit_beta,
                fit_modes=not K_fixed,
                fit_offset=fit_offset,
            )
            template = m
            starts.append(np.asarray(engine.vector_of(m)))
    if fit_beta:
        nested = search_power_law(
            data,
            max_modes=max_modes,
            modes=modes,
            offset=offset,
            criterion=criterion,
            beta=beta,
            fit_beta=False,
            robust=robust,
        )
        starts.append(np.asarray(engine.vector_of(dataclasses.replace(nested.model, fit_beta=True))))
    values, rss, objective, _ = engine.solve_robust(
        template, np.array(starts), data, robust=robust, max_steps=SEARCH_STEPS, keep=None
    )
    i = int(np.argmin(objective))
    if not np.isfinite(rss[i]):
        raise RuntimeError("no start of the power-law fit converged")
    p = len(template.parameter_names)
    return Candidate("power law", template, values[i], rss[i], data.n, p, criterion, engine.BATCH)
