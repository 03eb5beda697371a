"""The least-squares engine: the reduced log, the residuals, multi-start Levenberg–Marquardt."""

from __future__ import annotations

import math
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._core.programs import persistent_jit
from .._core.validate import to_jax
from .base import AbstractCurveModel, Criterion

_Model = TypeVar("_Model", bound=AbstractCurveModel)


class Binned(eqx.Module):
    """A log reduced to `B` bins of `ln t` (padded; empty bins have weight 0): `t` the geometric
    mean time of each bin's points (`0` for a bin of `t = 0` only), `y` the `ln loss` there (the
    bin's mean, corrected for the curve's curvature: `bin_log`),
    `count` the number of points, `weight` the least-squares weight `1/σ_b²` (times a robust
    weight), `scale` the Cauchy loss's scale in standard errors (`robust_residual`; `inf` for
    plain least squares), `noise` the scatter of a single logged point in `ln loss` (`σ_pt`) and
    `floor` the error every bin has besides (`bin_log`'s `s`, in `ln loss`)."""

    t: jax.Array
    y: jax.Array
    count: jax.Array
    weight: jax.Array
    scale: jax.Array
    noise: jax.Array
    floor: jax.Array

    @property
    def n(self) -> int:
        """The number of non-empty bins (the residuals the fit counts)."""
        return int(np.count_nonzero(np.asarray(self.count)))


#: The rounding of a float64 `ln loss` (a few units in the last place of a loss summed in
#: float64): no log resolves its curve more closely than this.
ROUNDING = 16 * float(np.finfo(np.float64).eps)


#: The share of one step's change of `ln L` within which a log of gradient-descent steps resolves
#: the gradient flow `L(t)` (the modes' rates absorb the rest of GD's departure from the flow).
DISCRETISATION = 0.25


def bin_log(
    t: Float[np.ndarray, " n"],
    loss: Float[np.ndarray, " n"],
    bins: int,
    step_time: Float[np.ndarray, " n"] | None = None,
) -> Binned:
    """Means of `ln loss` over `bins` equal bins of `ln t` between the first positive time and the
    last (points at `t = 0` join the first bin), each corrected for the curve's curvature within
    the bin (`_curvature`) so that it estimates `ln L` at the bin's mean `ln t`, where the model
    is evaluated, and weighted by `1/σ_b²`, every term measured on the log itself:

    `σ_b² = σ_pt²/n_b + (d |Δ₁ ln L|_b)² + s²`

    - `σ_pt²/n_b`: a mean of `n_b` points with the scatter `σ_pt` of one logged point
      (minibatch noise, `point_noise`);
    - `d |Δ₁ ln L|_b`: the discretisation of gradient descent, `d = DISCRETISATION` of the
      change of `ln L` over one step at the bin (`|d ln L/dt|` from the neighbouring bins times
      the bin's time per step `step_time`): a log of steps resolves the gradient flow `L(t)` to
      within a fraction of a step;
    - `s`: the scatter of the bins about their local trend (`bin_scatter`, less the part the
      point noise explains), at least the float64 rounding `ROUNDING`.

    A clean log's bins are weighted by how closely its own curve is resolved, so the model
    selection compares what the log can tell apart; a noisy log's densely logged stretches,
    whose means are more precise, count more.

    **Arguments:** `t` (gradient-flow times, non-decreasing), `loss` (positive) at them, `bins`,
    `step_time` (the time of one step at each point, `η`; `None`: no discretisation term).

    **Returns:** the `Binned` log."""
    t = np.asarray(t, float)
    y = np.log(np.asarray(loss, float))
    pos = t[t > 0]
    if pos.size == 0:
        x = np.zeros_like(t)
        idx = np.zeros(t.size, int)
    else:
        x = np.log(np.maximum(t, pos[0]))
        lo, hi = x.min(), x.max()
        if hi > lo:
            idx = np.clip(((x - lo) / (hi - lo) * bins).astype(int), 0, bins - 1)
        else:
            idx = np.zeros(t.size, int)
    cnt = np.bincount(idx, minlength=bins).astype(float)
    sx = np.bincount(idx, weights=np.where(t > 0, x, 0.0), minlength=bins)
    npos = np.bincount(idx, weights=(t > 0).astype(float), minlength=bins)
    sy = np.bincount(idx, weights=y, minlength=bins)
    ok = cnt > 0
    xbar = sx / np.maximum(npos, 1)
    tb = np.where(npos > 0, np.exp(xbar), 0.0)
    yb = np.where(ok, sy / np.maximum(cnt, 1), 0.0)
    dev = np.where(t > 0, x - xbar[idx], 0.0)
    var = np.bincount(idx, weights=dev**2, minlength=bins) / np.maximum(npos, 1)
    yb = yb - 0.5 * var * _curvature(xbar, yb, npos > 0)
    noise = point_noise(t, y)
    mean_var = np.where(ok, noise**2 / np.maximum(cnt, 1), 0.0)
    disc = np.zeros(bins)
    if step_time is not None:
        dt = np.bincount(idx, weights=np.asarray(step_time, float), minlength=bins) / np.maximum(cnt, 1)
        disc = DISCRETISATION * np.abs(_slope(tb, yb, npos > 0)) * dt
    floor = max(bin_scatter(xbar, yb, npos > 0, mean_var), ROUNDING)
    weight = np.where(ok, 1.0 / (mean_var + disc**2 + floor**2), 0.0)
    return Binned(
        to_jax(tb),
        to_jax(yb),
        to_jax(cnt),
        to_jax(weight),
        to_jax(np.float64(np.inf)),
        to_jax(np.float64(noise)),
        to_jax(np.float64(floor)),
    )


def _slope(t: np.ndarray, y: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """`dy/dt` at each bin from its non-empty neighbours (`np.gradient` over them; 0 with fewer
    than two bins)."""
    out = np.zeros_like(y)
    i = np.flatnonzero(ok)
    if i.size < 2:
        return out
    out[i] = np.gradient(y[i], t[i])
    return out


def detrended(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each interior point's departure from the cubic through its two neighbours on either
    side, `e_i = y_i − Σ_j w_j y_j` (Lagrange weights `w_j` at `x_i`), divided by
    `√(1 + Σ_j w_j²)`: for independent errors of scale `s` it has scale `s`, and a smooth curve
    leaves only its fourth derivative (on equal spacing, the fourth difference `/√70`). Empty
    with fewer than five points."""
    if x.size < 5:
        return np.zeros(0)
    c = np.arange(2, x.size - 2)
    nb = np.stack([c - 2, c - 1, c + 1, c + 2], axis=1)  # (m, 4)
    xn, x0 = x[nb], x[c][:, None]
    w = np.ones_like(xn)
    for j in range(4):
        for m in range(4):
            if m != j:
                w[:, j] *= (x0[:, 0] - xn[:, m]) / np.where(xn[:, j] == xn[:, m], 1e-300, xn[:, j] - xn[:, m])
    return (y[c] - np.sum(w * y[nb], axis=1)) / np.sqrt(1.0 + np.sum(w**2, axis=1))


def bin_scatter(x: np.ndarray, y: np.ndarray, ok: np.ndarray, mean_var: np.ndarray) -> float:
    """The scatter of the non-empty bins' `y` about their local trend (`detrended` in `x`),
    beyond their means' own variance `mean_var`: `s² = (1.4826 median |e|)² −` the median of
    `mean_var`, at least 0 (the median ignores the steep drops). 0 with fewer than 5 bins."""
    i = np.flatnonzero(ok)
    e = detrended(x[i], y[i])
    if e.size == 0:
        return 0.0
    s2 = (1.4826 * float(np.median(np.abs(e)))) ** 2 - float(np.median(mean_var[i]))
    return math.sqrt(max(s2, 0.0))


def _curvature(x: np.ndarray, y: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """`d²y/dx²` at each bin from its neighbours (the three-point divided difference over the
    non-empty bins; at the ends, extrapolated linearly), 0 with fewer than three bins. The mean of `y`
    over a bin whose points' `x` have variance `v` is `y(x̄) + ½ y'' v` to second order:
    `bin_log` subtracts that term, so that a bin is compared with the model at `x̄`. Uncorrected
    it is 2 % of the loss (20× a clean bin's error) on the steep fall at a power law's cutoff."""
    out = np.zeros_like(y)
    i = np.flatnonzero(ok)
    if i.size < 3:
        return out
    xi, yi = x[i], y[i]
    d1 = np.diff(yi) / np.maximum(np.diff(xi), 1e-300)
    c = 2 * np.diff(d1) / np.maximum(xi[2:] - xi[:-2], 1e-300)
    first = 2 * c[0] - c[1] if c.size > 1 else c[0]  # linear extrapolation: the end bins are often the steepest
    last = 2 * c[-1] - c[-2] if c.size > 1 else c[-1]
    out[i] = np.concatenate([[first], c, [last]])
    return out


def with_scale(data: Binned, scale: float) -> Binned:
    """`data` with the Cauchy loss at `scale` standard errors (`inf`: plain least squares)."""
    return eqx.tree_at(lambda d: d.scale, data, to_jax(np.float64(scale)))


def point_noise(t: np.ndarray, y: np.ndarray) -> float:
    """The scatter of one logged `ln loss` about the curve: `1.4826 · median |e|` of the points'
    departures from the cubic through their two neighbours on either side (`detrended` in
    `t`: the cubic removes the curve's local trend, the median ignores the steep drops). 0 with
    fewer than 9 points."""
    if t.size < 9:
        return 0.0
    return float(1.4826 * np.median(np.abs(detrended(t, y))))


#: The scale of the Cauchy loss, in standard errors of a bin: residuals up to a few standard
#: errors count as in least squares, a spike's only logarithmically.
CAUCHY_SCALE = 3.0


def robust_residual(r, c):
    """`ρ(r) = r √(ln(1 + u)/u)`, `u = (r/c)²`: `Σ ρ² = Σ c² ln(1 + (r/c)²)` is the Cauchy
    loss, so least squares on `ρ` down-weights outliers (a spike, a restart) smoothly, while
    `ρ(r) ≈ r` for residuals of a few `c` (and `ρ(r) = r` for `c = inf`)."""
    u = (r / c) ** 2
    small = u < 1e-8
    safe = jnp.where(small, 1.0, u)
    return r * jnp.where(small, 1.0 - u / 4, jnp.sqrt(jnp.log1p(safe) / safe))


def residuals(theta, args):
    """`ρ(√w_b (ln L̂(t_b) − ȳ_b))` for every bin (`robust_residual` at `data.scale`), then the
    prior's rows: the fit's residual vector."""
    template, data = args
    model = template.from_vector(theta)
    r = model.log_loss(data.t) - data.y
    r = jnp.where(data.weight > 0, jnp.sqrt(data.weight) * r, 0.0)
    r = robust_residual(r, data.scale)
    return jnp.concatenate([r, model.penalty()])


@persistent_jit
def _solve_many(template: AbstractCurveModel, thetas, data: Binned, max_steps: int):
    import optimistix as optx  # when traced: a process that loads the kept program never imports it

    solver = optx.LevenbergMarquardt(rtol=1e-7, atol=1e-7)

    def one(theta0):
        sol = optx.least_squares(residuals, solver, theta0, args=(template, data), max_steps=max_steps, throw=False)
        res = residuals(sol.value, (template, data))
        B = data.y.shape[0]
        ok = jnp.all(jnp.isfinite(sol.value)) & jnp.all(jnp.isfinite(res))
        rss = jnp.where(ok, jnp.sum(res[:B] ** 2), jnp.inf)
        objective = jnp.where(ok, jnp.sum(res**2), jnp.inf)
        return sol.value, rss, objective, sol.stats["num_steps"]

    return jax.vmap(one)(thetas)


#: Levenberg–Marquardt steps per compiled call: a longer solve is rounds of this many steps,
#: each from where the last stopped (the starts that converged drop out), so that one compiled
#: solver serves every call of a fit, however many steps it asks for. (Rounds of 20 restart the
#: damping twice as often: the slow-tier power-law test then misses α₂ by 10 %.)
ROUND_STEPS = 40
#: With `screen`, `solve_robust` first runs every start for `SCREEN_STEPS` steps (a second
#: compiled solver) and goes on only from the `SCREEN_KEEP` best.
SCREEN_STEPS = 20
SCREEN_KEEP = 8
#: The starts solved at once (padded by repeating the last): few array sizes for every call, so
#: that few compiled solvers serve a fit (compiling it, or even tracing it again in a process
#: that finds it in the persistent cache, costs more than solving), small enough that a call
#: of the `SCREEN_KEEP` survivors does not pay for many more. A single start (a refinement) is
#: solved alone: padded to `BATCH` it would cost `BATCH` starts' time.
BATCH = SCREEN_KEEP
#: The starts (best by the plain least-squares objective) that `solve_robust` refines again with
#: the Cauchy loss; the rest keep their plain optimum with an infinite objective.
ROBUST_KEEP = SCREEN_KEEP


def _best(thetas: np.ndarray, out, keep: int | None, data: Binned, template, max_steps: int):
    """`solve_many` from the `keep` rows of `thetas` whose `out` objective is least (all rows with
    `keep=None` or at most `keep` rows; a row `out` left non-finite starts from `thetas`).
    The other rows keep `out`'s values with `rss`, `objective` `inf` and 0 steps."""
    v = np.where(np.isfinite(out[1])[:, None], out[0], thetas)
    n = v.shape[0]
    idx = np.arange(n) if keep is None or keep >= n else np.argsort(out[2], kind="stable")[:keep]
    sub = solve_many(template, v[idx], data, max_steps=max_steps)
    values, rss, objective, steps = v.copy(), np.full(n, np.inf), np.full(n, np.inf), np.zeros(n, out[3].dtype)
    values[idx], rss[idx], objective[idx], steps[idx] = sub
    return values, rss, objective, steps


def solve_robust(
    template: AbstractCurveModel,
    thetas,
    data: Binned,
    *,
    robust: bool,
    max_steps: int,
    keep: int | None = ROBUST_KEEP,
    screen: bool = False,
):
    """`solve_many` in plain least squares, then, with `robust`, again from there with the Cauchy
    loss at `CAUCHY_SCALE` (graduated: the Cauchy loss's flat tails would stall a start far from
    any optimum), for the `keep` starts best in plain least squares (`None`: every start).
    With `screen`, every start first runs `SCREEN_STEPS` steps and only the `SCREEN_KEEP` best
    go on for `max_steps` more. Returns what `solve_many` does, for the last stage: a start not
    solved in it has `rss` and `objective` `inf` and 0 steps."""
    thetas = np.atleast_2d(np.asarray(thetas, dtype=float))
    plain = with_scale(data, np.inf)
    if screen and thetas.shape[0] > SCREEN_KEEP:
        first = solve_many(template, thetas, plain, max_steps=SCREEN_STEPS, round_steps=SCREEN_STEPS)
        out = _best(thetas, first, SCREEN_KEEP, plain, template, max_steps)
    else:
        out = solve_many(template, thetas, plain, max_steps=max_steps)
    if not robust:
        return out
    return _best(thetas, out, keep, with_scale(data, CAUCHY_SCALE), template, max_steps)


def solve_many(
    template: AbstractCurveModel, thetas, data: Binned, *, max_steps: int = 100, round_steps: int = ROUND_STEPS
):
    """Levenberg–Marquardt (`optimistix.least_squares`) from every row of `thetas` at once
    (vmapped, in batches of `BATCH`), for up to `max_steps` steps (rounds of `round_steps`,
    each from where the last stopped, for the starts that have not converged). Returns
    `(values, rss, objective, steps)` as numpy arrays: the data's weighted residual sum `χ²`
    and the objective minimised (with the prior's rows); a start that fails or leaves
    non-finite values has both `inf` (and the values it had before that round)."""
    values = np.atleast_2d(np.asarray(thetas, dtype=float)).copy()
    n = values.shape[0]
    rss, objective, steps = np.full(n, np.inf), np.full(n, np.inf), np.zeros(n, np.int64)
    live = np.arange(n)
    for _ in range(max(1, -(-max_steps // round_steps))):
        v, r, o, s = _rounds(template, values[live], data, round_steps)
        ok = np.isfinite(r)
        values[live[ok]] = v[ok]
        rss[live], objective[live] = r, o
        steps[live] += s
        live = live[ok & (s >= round_steps)]
        if live.size == 0:
            break
    return values, rss, objective, steps


def _rounds(template: AbstractCurveModel, thetas: np.ndarray, data: Binned, steps: int):
    """One round of `steps` steps from every row of `thetas`, in batches of `BATCH` (a last
    partial batch padded by repeating its last row), or alone if it is the only row."""
    out = []
    size = 1 if thetas.shape[0] == 1 else BATCH
    for i in range(0, thetas.shape[0], BATCH):
        chunk = thetas[i : i + BATCH]
        k = chunk.shape[0]
        pad = np.concatenate([chunk, np.repeat(chunk[-1:], size - k, axis=0)])
        res = _solve_many(template, to_jax(pad), data, steps)
        out.append(tuple(np.asarray(a)[:k] for a in res))
    return tuple(np.concatenate(parts) for parts in zip(*out))


def jacobian(template: AbstractCurveModel, theta, data: Binned):
    """`∂ residuals / ∂θ` at `theta` (forward mode, `jax.jacfwd`), shape `(B, p)`."""
    return np.asarray(_jac(template, to_jax(np.asarray(theta, dtype=float)), data))


@persistent_jit
def _jac(template, theta, data):
    return jax.jacfwd(residuals)(theta, (template, data))


def information_criterion(chi2: float, n: int, p: float, kind: Criterion) -> float:
    """`n ln(max(χ², n)/n) + penalty` for the weighted residual sum `χ²` of `n` bins: `2p` (AIC)
    or `p ln n` (BIC). A fit closer than the bins' own scatter (`χ² < n`) earns nothing more."""
    if not math.isfinite(chi2) or n <= 0:
        return math.inf
    return n * math.log(max(chi2, n) / n) + kind.penalty(p, n)


# Compiled helpers: the fit's bookkeeping through these instead of eager JAX operations, each of
# which would compile on first use (hundreds of small compilations cost more than the fit). All
# are `persistent_jit`: the `lvflow fit` command keeps them across processes.


def model_of(template: _Model, theta) -> _Model:
    """`template.from_vector(theta)`, compiled (`_from_vector`'s arrays put back into the
    template's structure: a kept program returns no module)."""
    dynamic, static = eqx.partition(template, eqx.is_array)
    leaves = _from_vector(template, theta)
    return eqx.combine(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(dynamic), leaves), static)


@persistent_jit
def _from_vector(template: AbstractCurveModel, theta):
    """The arrays of `template.from_vector(theta)`, in the order of the template's.

    **Raises:** `TypeError` (when traced) if `from_vector` changed which fields are arrays."""
    dynamic = eqx.filter(template, eqx.is_array)
    out = eqx.filter(template.from_vector(theta), eqx.is_array)
    if jax.tree_util.tree_structure(out) != jax.tree_util.tree_structure(dynamic):
        raise TypeError(f"{type(template).__name__}.from_vector changed the model's structure")
    return tuple(jax.tree_util.tree_leaves(out))


@persistent_jit
def vector_of(model: AbstractCurveModel):
    """`model.to_vector()`, compiled."""
    return model.to_vector()


@persistent_jit
def data_residuals(template: AbstractCurveModel, theta, data: Binned):
    """The data rows of `residuals` (without the prior's)."""
    return residuals(theta, (template, data))[: data.y.shape[0]]


@persistent_jit
def drops_of(model: AbstractCurveModel):
    """`model.drops()`, compiled."""
    return model.drops()


@persistent_jit
def log_loss_of(model: AbstractCurveModel, t):
    """`model.log_loss(t)`, compiled."""
    return model.log_loss(t)


@persistent_jit
def log_loss_and_jac(template: AbstractCurveModel, theta, t):
    """`ln L̂(t)` and its Jacobian with respect to `theta`, for the delta method."""
    f = lambda th: template.from_vector(th).log_loss(t)
    return f(theta), jax.jacfwd(f)(theta)


def _ln_loss_at(x, model: AbstractCurveModel):
    """`ln L̂` at `ln t = x` (a scalar)."""
    return model.log_loss(jnp.exp(x)[None])[0]


def _bisect(fn, x0, args, lower, upper, bracketed, tol: float):
    """The root of `fn(x, args)` in `[lower, upper]`, where `fn(lower) > 0 > fn(upper)`
    (`bracketed`), by `optx.Bisection` (its derivative with respect to `args` the implicit
    function theorem's, `optx.ImplicitAdjoint`); NaN where not `bracketed` or not converged."""
    import optimistix as optx  # when traced (`_solve_many`)

    sol = optx.root_find(
        fn,
        optx.Bisection(rtol=tol, atol=tol, flip=True),
        x0,
        args,
        options=dict(lower=lower, upper=upper),
        max_steps=200,
        throw=False,
    )
    return jnp.where(bracketed & (sol.result == optx.RESULTS.successful), sol.value, jnp.nan)


def _ln_crossing(model: AbstractCurveModel, ln_t0: Float[Array, " n"], ln_level: Float[Array, " n"]):
    """Per entry, the `ln t` at which the model's loss (non-increasing in `t`) crosses `level`,
    searched within 40 e-folds of `t0` (`_bisect`). NaN where the loss does not cross the level
    in that range."""

    def fn(x, args):
        m, level = args
        return _ln_loss_at(x, m) - level

    def one(x0, level):
        x0 = jax.lax.stop_gradient(x0)
        lo, hi = x0 - 40.0, x0 + 40.0
        crosses = (fn(lo, (model, level)) > 0) & (fn(hi, (model, level)) < 0)
        return _bisect(fn, x0, (model, level), lo, hi, crosses, 1e-13)

    return jax.vmap(one)(ln_t0, ln_level)


def _ln_flattest(model: AbstractCurveModel, ln_a: Float[Array, " n"], ln_b: Float[Array, " n"]):
    """Per entry, the `ln t` between `ln_a` and `ln_b` (two consecutive drops' `ln t*`) where the
    loss is flattest, the minimum of `g = −d ln L/d ln t`: the plateau the curve shows between
    them. Found on a grid of `_FLAT_GRID` points, then exactly by `_bisect` on
    `d² ln L/d(ln t)² = −g'`, which falls through 0 there. NaN where `g` has no minimum inside
    (two drops that merge into one fall)."""
    slope = jax.grad(_ln_loss_at)
    curvature = jax.grad(slope)

    def one(a, b):
        a, b = jax.lax.stop_gradient(a), jax.lax.stop_gradient(b)
        x = jnp.linspace(a, b, _FLAT_GRID)
        i = jnp.argmax(jax.lax.stop_gradient(jax.vmap(slope, in_axes=(0, None))(x, model)))  # min of g
        lo, hi = x[jnp.maximum(i - 1, 0)], x[jnp.minimum(i + 1, _FLAT_GRID - 1)]
        inside = (i > 0) & (i < _FLAT_GRID - 1) & (curvature(lo, model) > 0) & (curvature(hi, model) < 0)
        return _bisect(curvature, x[i], model, lo, hi, inside, 1e-12)

    return jax.vmap(one)(ln_a, ln_b)


#: Grid points between two drops on which `_ln_flattest` first looks for the curve's plateau.
_FLAT_GRID = 64


def _curve_plateaus(model: AbstractCurveModel, ln_t: Float[Array, " n"], before, after):
    """The plateau levels on either side of each of `n` drops in time order (`ln_t` their
    `ln t*`), as the curve shows them: between two drops, the loss where the curve is flattest
    (`_ln_flattest`); before the first drop and after the last, and between drops that merge
    into one fall, the ε → 0 staircase's levels `before`, `after`."""
    if ln_t.shape[0] < 2:
        return before, after
    x = _ln_flattest(model, ln_t[:-1], ln_t[1:])
    ok = jnp.isfinite(x)
    level = jnp.exp(model.log_loss(jnp.exp(jnp.where(ok, x, ln_t[1:]))))
    return (
        jnp.concatenate([before[:1], jnp.where(ok, level, before[1:])]),
        jnp.concatenate([jnp.where(ok, level, after[:-1]), after[-1:]]),
    )


@persistent_jit
def summaries_and_jac(template: AbstractCurveModel, theta, t_curve, t_horizon, order):
    """Every quantity `fit` reports as a function of the fit's coordinates, and its Jacobian
    (`jax.jacfwd`): the reported parameters, the drops `order` (their `ln t*`, the `ln` of the
    plateau levels the curve shows before and after each, `_curve_plateaus`, the `ln` of their
    ratio, and the `ln t` at which the loss crosses the midpoint between them), `ln L̂` at the
    horizon and on the curve grid."""

    def g(th):
        m = template.from_vector(th)
        t_all, V_all, _ = m.drops()
        t_sel = t_all[order]
        later_eq = t_all[None, :] >= t_sel[:, None]
        later = t_all[None, :] > t_sel[:, None]
        before = m.offset + jnp.sum(jnp.where(later_eq, V_all[None, :], 0.0), axis=1)
        after = m.offset + jnp.sum(jnp.where(later, V_all[None, :], 0.0), axis=1)
        tiny = jnp.finfo(float).tiny
        shown_before, shown_after = _curve_plateaus(m, jnp.log(t_sel), before, after)
        mid = jnp.log(jnp.maximum(0.5 * (shown_before + shown_after), tiny))
        ln_before, ln_after = jnp.log(jnp.maximum(shown_before, tiny)), jnp.log(jnp.maximum(shown_after, tiny))
        return {
            "reported": m.reported(),
            "ln_t_star": jnp.log(t_sel),
            "ln_t_mid": _ln_crossing(m, jnp.log(t_sel), mid) if t_sel.shape[0] else jnp.zeros(0),
            "ln_before": ln_before,
            "ln_after": ln_after,
            "ln_fall": ln_before - ln_after,
            "ln_final": m.log_loss(t_horizon),
            "ln_curve": m.log_loss(t_curve),
        }

    return g(theta), jax.jacfwd(g)(theta)


@persistent_jit
def log_z0_minus_eps(model):
    """`ln c_k = ln z_k(0) − ln ε` of a `DecoupledModes`, compiled."""
    return model.log_z0() - model.log_eps
