"""`fit`: infer a spectrum from an observed training curve and predict the drops to come."""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jaxtyping import ArrayLike, Float

from .._core.errors import LvflowError
from .._core.validate import check_memory, to_jax
from .._workflow.io import atomic_write_text, save_npz, to_json
from . import engine
from .base import AbstractCurveModel, Criterion, Family
from .log import MIN_POINTS, TrainingLog, check_log, read_log, rises
from .modes import DecoupledModes
from .plot import plot_fit
from .power import PowerLawModel
from .search import SEARCH_STEPS, Candidate, search_modes, search_power_law

FAMILIES = tuple(f.value for f in Family)
#: the families a result can have (`auto` chooses one of them)
_RESULT_FAMILIES = (Family.MODES.value, Family.POWER_LAW.value)
_WIDTH = math.log(81.0)  # 10–90 % rise time of a logistic mode, times its rate
_REFINE_ROUNDS = 5  # rounds of SEARCH_STEPS Levenberg–Marquardt steps refining the chosen model
_SPECTRUM_CHI2 = 2.0  # auto tries the power law when the modes leave χ² above this many times n


class FitResult(eqx.Module):
    """A fitted training curve (returned by `lvflow.fit`).

    **Fields:**

    - `family`: `"modes"` (`DecoupledModes`) or `"power_law"` (`PowerLawModel`); `model`, the
      fitted model (time in `t = η · step`).
    - `parameters`, `stderr`: the reported physical parameters (`model.reported()`) and their
      standard errors, by the delta method from the covariance `(JᵀJ/φ + J_pᵀJ_p)⁻¹` of the
      fit's coordinates (`J` the Jacobian of the standardised residuals at the optimum,
      `jax.jacfwd`; `J_p` the prior's rows for `DecoupledModes`; `φ = max(k χ²/dof, 1)`, the
      residual variance in units of the bins' errors, `σ²` of the textbook `σ² (JᵀJ)⁻¹`, times
      the variance inflation `k = (1 + ρ)/(1 − ρ)` of residuals with lag-1 autocorrelation `ρ`
      along `ln t`: a systematic misfit is not independent errors).
      `inf` marks a quantity the log does not determine.
    - `theta`, `covariance`, `parameter_names`: the optimum in the fit's coordinates and its
      covariance.
    - `sigma`: the RMS residual of the bins in `ln loss`; `noise`: the scatter of one logged
      point (minibatch noise, `0` for a clean log); `n_bins`, `n_points`: bins and logged points
      fitted.
    - `criterion`, `scores`: the information criterion and its value for every model tried.
    - `log`: the whole log (`TrainingLog`), and `fit_until`: the last step fitted (the rest is
      held out).
    - `drops`: one row per drop, in time order (dict of arrays): `step` (where the fitted loss
      crosses the midpoint between the plateau levels on either side: what one reads off the
      curve) with its interval `step_lo`, `step_hi`; `t_star` and `step_strength` (when the
      mode reaches half its final strength, Eq. 158: later than `step`); `V`, `rate`,
      `loss_before`, `loss_after` (the plateau levels the fitted curve shows, with `_lo`/`_hi`:
      between two drops, the loss where the curve is flattest on a log-log plot, the minimum
      of `−d ln L/d ln t`; before the first drop and after the last, the ε → 0 staircase's
      levels, `L_∞ + Σ V_k` and `L_∞`), `fall` (`loss_before / loss_after`, with `_lo`/`_hi`
      from its own standard error: the two levels' errors are correlated), `resolved` (its gap
      to the next drop exceeds their widths) and `future` (after `fit_until`).
    - `curve`: the fitted and extrapolated loss on `_CURVE` steps up to the horizon (`step`,
      `loss`, and the band `lo`, `hi`).
    - `horizon`: the step the extrapolation runs to; `final_loss` (`_lo`, `_hi`): the predicted
      loss there; `asymptote` (`_lo`, `_hi`): `L_∞`.
    - `level`: the coverage of every interval (0.95: `±1.96` standard errors, on the log scale
      for positive quantities).
    - `warnings`: how far to trust the fit, in sentences.
    - `alternative`: `None`, or the next scenario when the log cannot decide between them (a
      floor `L_∞` at the level the log ends on, or a drop still to come down to a next plateau
      or to nothing: see `fit`), as a `FitResult` of its own, whose own `alternative` is the
      one after (`scenarios` lists them); this one is the one the criterion prefers.
    - `weight`: this scenario's weight in the forecast, `e^{−S/2}` normalised over the
      scenarios, `S` the information criterion with the effective number of parameters
      (`effective_parameters`, `tr(H_d (H_d + H_p)⁻¹)`: the directions the log determines,
      `H_d` the data's precision and `H_p` the prior's) in place of their count: 1 without an
      alternative. `forecast` and `next_drop` mix the scenarios by these weights: with `n`
      (`n_bins`), `χ²` (`chi2`), `k` (`evidence_discount`) and `p_eff`, BIC's
      `S = n ln(max(χ², n)/n)/k + p_eff ln max(n/k, 1)` (AIC's penalty `2 p_eff`).
    - `chi2`: the weighted residual sum `χ²` of the bins at the search's optimum, the data's
      term of the criterion the scenarios are compared on; `evidence_discount`: `k`, the
      factor the data's term is divided by for residuals correlated beyond the bins' errors
      (`n/k` independent residuals; 1 without an alternative).
    """

    family: str
    model: AbstractCurveModel
    parameters: dict[str, np.ndarray]
    stderr: dict[str, np.ndarray]
    theta: np.ndarray
    covariance: np.ndarray
    parameter_names: tuple[str, ...]
    sigma: float
    noise: float
    n_bins: int
    n_points: int
    criterion: str
    scores: dict[str, float]
    log: TrainingLog
    fit_until: float
    drops: dict[str, np.ndarray]
    curve: dict[str, np.ndarray]
    horizon: float
    final_loss: float
    final_loss_lo: float
    final_loss_hi: float
    asymptote: float
    asymptote_lo: float
    asymptote_hi: float
    level: float
    warnings: tuple[str, ...]
    alternative: FitResult | None = None
    weight: float = 1.0
    effective_parameters: float = math.nan
    chi2: float = math.nan
    evidence_discount: float = 1.0

    def __check_init__(self):
        if self.family not in _RESULT_FAMILIES:
            raise LvflowError(f"FitResult: family must be 'modes' or 'power_law', got {self.family!r}")
        if not 0 < self.level < 1:
            raise LvflowError(f"FitResult: level must lie in (0, 1), got {self.level!r}")
        if np.shape(self.covariance) != (np.size(self.theta),) * 2:
            raise LvflowError("FitResult: covariance does not match theta")
        if not 0 <= self.weight <= 1:
            raise LvflowError(f"FitResult: weight must lie in [0, 1], got {self.weight!r}")

    # ----------------------------------------------------------------------------------------
    def predict(self, steps: Float[ArrayLike, " n"]) -> Float[np.ndarray, " n"]:
        """The fitted loss at `steps` (extrapolated past the log)."""
        t = self.log.t_of(np.atleast_1d(np.asarray(steps, dtype=float)))
        return np.exp(np.asarray(engine.log_loss_of(self.model, to_jax(t))))

    def _ln_loss_sd(self, steps) -> tuple[np.ndarray, np.ndarray]:
        """`ln L̂` at `steps` and its delta-method standard error (`inf` along a direction the
        log does not determine)."""
        t = to_jax(self.log.t_of(np.atleast_1d(np.asarray(steps, dtype=float))))
        mean, J = (np.asarray(a) for a in engine.log_loss_and_jac(self.model, to_jax(self.theta), t))
        var = np.einsum("ip,pq,iq->i", J, np.where(np.isfinite(self.covariance), self.covariance, 0.0), J)
        touches = (np.abs(J) > 0) @ (~np.isfinite(self.covariance)).any(axis=0)
        return mean, np.where(touches, np.inf, np.sqrt(np.maximum(var, 0.0)))

    def band(self, steps: Float[ArrayLike, " n"]) -> tuple[Float[np.ndarray, " n"], Float[np.ndarray, " n"]]:
        """The pointwise interval of this scenario's fitted loss at `steps` (delta method on
        `ln L`, at `level`): the uncertainty of the curve from that of its parameters, not the
        noise, nor the other scenario (`forecast` mixes them)."""
        mean, sd = self._ln_loss_sd(steps)
        z = _z(self.level)
        with np.errstate(over="ignore"):  # an undetermined direction: the bound is inf, as meant
            return np.exp(mean - z * sd), np.exp(mean + z * sd)

    @property
    def scenarios(self) -> tuple[FitResult, ...]:
        """This result and its alternatives, if any (each with its `weight`): the chain
        `self.alternative`, `self.alternative.alternative`, …"""
        out: list[FitResult] = [self]
        r = self.alternative
        while r is not None:
            out.append(r)
            r = r.alternative
        return tuple(out)

    def forecast(self, steps: Float[ArrayLike, " n"]) -> dict[str, np.ndarray]:
        """The loss at `steps` forecast by the mixture of the scenarios: each a log-normal
        `ln L ~ N(ln L̂, sd²)` (the delta method) with its `weight`. The point forecast `loss` is
        the mixture's median (what minimises the expected `|ln(L/L̂)|` under it; with the
        scenarios' own spreads small beside their distance, the value of the one that weighs
        more than half); the interval is the mixture's `(1 ∓ level)/2` quantiles (not the
        hull of the scenarios' intervals).

        Past `fit_until`, a scenario whose loss has an infinite standard error (the log does not
        constrain a parameter it depends on), or that has a drop to come whose time the log does
        not determine (an unbounded interval or one wider than `UNDETERMINED_DECADES`: from that
        interval's lower end on, the drop may have come or not), still bounds it: its loss never rises (every mode
        of Eq. 163 only falls) and never falls below its floor `L_∞`, so it lies between the
        floor's lower end (`0` without a floor) and the highest loss logged in the last tenth of
        the fitted part; its weight is put at the lower bound for the lower quantile and at the upper
        bound for the upper one (the interval every distribution on that range would give at
        most). An interval wider than `UNDETERMINED_DECADES` is replaced by those bounds over
        every scenario, and every interval past `fit_until` is cut to them (the log-normal of the
        delta method knows nothing of them).

        **Returns:** dict of arrays over `steps`: `loss`, `lo`, `hi` (`lo = 0`: the loss may go
        to 0 as far as the log tells) and `determined` (False where the interval is the bounds
        alone: a scenario of weight above `(1 − level)/2` with an infinite standard error there,
        or an interval wider than `UNDETERMINED_DECADES`)."""
        steps = np.atleast_1d(np.asarray(steps, dtype=float))
        w = np.array([r.weight for r in self.scenarios])
        ms, ss = zip(*(r._ln_loss_sd(steps) for r in self.scenarios))
        m, sd = np.stack(ms), np.stack(ss)  # (scenarios, n)
        tail = (1 - self.level) / 2
        # each scenario's bounds: its floor's lower end; the highest loss logged in the last tenth
        # of the fitted part (the loss never rises: a bound from the log itself, which holds
        # however many parameters the seen part leaves undetermined)
        low = np.array([math.log(r.asymptote_lo) if r.asymptote_lo > 0 else -_LN_ZERO for r in self.scenarios])
        seen = self.log.loss[self.log.steps <= self.fit_until]
        ceiling = math.log(float(np.max(seen[-max(1, seen.size // 10) :])))
        low, up = low[:, None] + 0 * m, np.full_like(m, ceiling)
        # a scenario with a drop to come whose time the log does not determine (`_time_undetermined`)
        # may or may not have dropped by any step past that interval's lower end: its loss there
        # is known only within its bounds, whatever the delta method's (linearised) spread says
        opens = np.array([r._undetermined_from() for r in self.scenarios])
        undet = (~np.isfinite(sd) | (steps[None, :] >= opens[:, None])) & (steps > self.fit_until)[None, :]
        tiny = 1e-12
        lo = _mixture_quantiles(w, np.where(undet, low, m), np.where(undet, tiny, sd), np.zeros(len(w)), [tail])[0]
        pin = undet & np.isfinite(up)
        hi = _mixture_quantiles(w, np.where(pin, up, m), np.where(pin, tiny, sd), np.zeros(len(w)), [1 - tail])[0]
        wide = ~np.isfinite(hi - lo) | ((hi - lo) > UNDETERMINED_DECADES * math.log(10))
        lo = np.where(wide, np.min(low, axis=0), lo)
        hi = np.where(wide, np.max(up, axis=0), hi)
        # the log-normals ignore that the loss never rises nor falls below the floor: past the
        # seen part, the interval is cut to those bounds
        past = steps > self.fit_until
        lo = np.where(past, np.maximum(lo, np.min(low, axis=0)), lo)
        hi = np.where(past, np.minimum(hi, np.max(up, axis=0)), hi)
        determined = ~wide & (np.sum(np.where(undet, w[:, None], 0.0), axis=0) <= tail)
        # the median: a scenario whose loss is not determined there counts at its own L̂
        med = _mixture_quantiles(w, m, np.where(np.isfinite(sd), sd, tiny), np.zeros(len(w)), [0.5])[0]
        return {
            "loss": np.exp(np.clip(med, -_LN_ZERO, 700.0)),
            "lo": np.where(lo < -700.0, 0.0, np.exp(np.minimum(lo, 700.0))),
            "hi": np.where(hi > 700.0, np.inf, np.exp(np.minimum(hi, 700.0))),
            "determined": determined,
        }

    def next_drop(self, min_fall: float = 1.0) -> dict[str, Any]:
        """The first drop after `fit_until` that divides the loss by at least `min_fall`
        (`loss_before / loss_after`), forecast by the mixture of the scenarios: each scenario's
        drop step log-normal (its `step_lo`, `step_hi` are `±z` standard errors of `ln step`),
        a scenario without such a drop an atom at "no drop"; the mixture's `(1 ∓ level)/2`
        quantiles. Whether a drop divides the loss by `min_fall` is itself uncertain when its
        levels are: a scenario's future drop `k` is its first such drop with probability
        `p_k Π_{j<k} (1 − p_j)`, `p_k = Φ((ln fall_k − ln min_fall)/s_k) / Φ(ln fall_k / s_k)`
        (`ln fall_k` normal with its standard error `s_k`, given `fall_k ≥ 1`; `p_k = 1/2` when
        `s_k` is infinite, `1` for `min_fall ≤ 1`), and the rest of the scenario's weight is at
        "no drop". A drop whose time has an infinite
        standard error or an interval wider than `UNDETERMINED_DECADES` (the log does not bound
        it) is known only to come after the seen part: its weight is put at `fit_until` for the
        lower quantile and at "no drop" for the upper (the interval every distribution on that
        range would give at most). The lower end is at least `fit_until`.

        **Returns:** dict: `probability` (the weight of such a drop over the scenarios), `step`
        (the point forecast, below), `lo`, `hi` (`hi = inf`: "no drop" lies inside the
        interval), `note` (`""`; a sentence when the drop's time is not determined beyond coming
        after the seen part, `lo`, `hi` then the bounds above; or "not determined by this log:
        a N-decade interval" with `lo`, `hi` NaN). `step` is the point forecast: the most
        probable scenario's drop step (`inf` when it has no such drop), never a step between
        scenarios that none predicts."""
        tail = (1 - self.level) / 2
        z = _z(self.level)
        w, m, sd = [], [], []
        undetermined = 0.0
        top = max(self.scenarios, key=lambda r: r.weight)
        point = math.inf
        for r in self.scenarios:
            d = r.drops
            i = np.flatnonzero(d["future"] & (d["fall"] >= min_fall))
            if r is top and i.size:
                point = float(d["step"][int(i[0])])
            none_before = 1.0  # the chance that no earlier drop to come divided the loss by min_fall
            for k in np.flatnonzero(d["future"]):
                p_k = _fall_probability(d, int(k), min_fall, z)
                w_k, none_before = r.weight * none_before * p_k, none_before * (1.0 - p_k)
                if w_k <= 0.0:
                    continue
                lo_k, hi_k, st = float(d["step_lo"][k]), float(d["step_hi"][k]), float(d["step"][k])
                if _time_undetermined(lo_k, hi_k):
                    undetermined += w_k
                    continue
                w.append(w_k)
                m.append(math.log(st))
                sd.append((math.log(hi_k) - math.log(lo_k)) / (2 * z))
        p = float(sum(w)) + undetermined
        out: dict[str, Any] = {"probability": p, "step": math.inf, "lo": math.nan, "hi": math.nan, "note": ""}
        if not w and not undetermined:
            out["lo"] = out["hi"] = math.inf
            return out
        # a scenario whose drop time the log does not bound (infinite standard error) says only
        # that the drop comes after the seen part: its mass is put where it widens the interval
        # most, at `fit_until` for the lower quantile and at "no drop" for the upper
        u = undetermined
        weights = np.array(w + [u, max(1.0 - sum(w) - u, 0.0)])  # then: the undetermined, no drop (at +inf)
        at_cut = math.log(max(self.fit_until, 1e-300))
        mm = np.array(m + [at_cut, 0.0])[:, None]
        ss = np.array(sd + [1e-12, 1.0])[:, None]
        atoms = [0.0] * len(w)
        lo = float(_mixture_quantiles(weights, mm, ss, np.array(atoms + [0.0, 1.0]), np.array([tail]))[0, 0])
        hi = float(_mixture_quantiles(weights, mm, ss, np.array(atoms + [1.0, 1.0]), np.array([1 - tail]))[0, 0])
        # a drop to come comes after the seen part: a log-normal's tail before it is cut off (the
        # quantiles of the mixture conditioned on it lie at or above `lo`: this end is the wider)
        lo = max(lo, at_cut)
        out.update(step=point, lo=_exp_or_inf(lo), hi=_exp_or_inf(hi))
        if undetermined > tail:
            out["note"] = (
                "the drop's time is not determined by this log beyond coming after the seen part (step "
                f"{self.fit_until:g}): it depends on parameters the seen part does not constrain"
            )
        elif math.isfinite(out["hi"]) and hi - lo > UNDETERMINED_DECADES * math.log(10):
            out.update(
                lo=math.nan,
                hi=math.nan,
                note=f"not determined by this log: a {(hi - lo) / math.log(10):.0f}-decade interval",
            )
        return out

    def _undetermined_from(self) -> float:
        """The first step from which this scenario's loss is not determined by the log: the lower
        end (at least `fit_until`) of the earliest drop to come whose time is not determined
        (`_time_undetermined`); `inf` if there is none."""
        d = self.drops
        out = math.inf
        for i in np.flatnonzero(d["future"]):
            lo, hi = float(d["step_lo"][i]), float(d["step_hi"][i])
            if _time_undetermined(lo, hi):
                out = min(out, max(lo if math.isfinite(lo) else 0.0, self.fit_until))
        return out

    @property
    def future_drops(self) -> dict[str, np.ndarray]:
        """The rows of `drops` after the fitted part of the log."""
        sel = self.drops["future"]
        return {k: v[sel] for k, v in self.drops.items()}

    def to_dict(self) -> dict[str, Any]:
        """Every number, JSON-ready (`inf` becomes `null` in JSON)."""
        return {
            "family": self.family,
            "source": self.log.source,
            "learning_rate": self.log.learning_rate,
            "parameters": {k: np.asarray(v) for k, v in self.parameters.items()},
            "stderr": {k: np.asarray(v) for k, v in self.stderr.items()},
            "parameter_names": list(self.parameter_names),
            "theta": self.theta,
            "covariance": self.covariance,
            "sigma_ln_loss": self.sigma,
            "noise_ln_loss": self.noise,
            "n_bins": self.n_bins,
            "n_points": self.n_points,
            "criterion": self.criterion,
            "scores": self.scores,
            "fit_until_step": self.fit_until,
            "drops": self.drops,
            "horizon_step": self.horizon,
            "final_loss": [self.final_loss, self.final_loss_lo, self.final_loss_hi],
            "asymptote": [self.asymptote, self.asymptote_lo, self.asymptote_hi],
            "level": self.level,
            "warnings": list(self.warnings),
            "curve": self.curve,
            "observed": {"step": self.log.steps, "loss": self.log.loss},
            "alternative": None if self.alternative is None else _without_log(self.alternative.to_dict()),
            "weight": self.weight,
            "effective_parameters": self.effective_parameters,
            "chi2": self.chi2,
            "evidence_discount": self.evidence_discount,
            "forecast": {"next_drop": self.next_drop(), "final_loss": self.forecast(np.array([self.horizon]))},
        }

    def to_json(self) -> str:
        """`to_dict()` as strict JSON."""
        return to_json(self.to_dict())

    def save(self, path) -> Path:
        """Write every number atomically: `.json` (`to_json`) or `.npz` (flat arrays, nested
        keys joined by `/`).

        **Raises:** `LvflowError` for another suffix or a missing directory."""
        p = Path(os.fspath(path))
        write = {".json": lambda p: atomic_write_text(p, self.to_json()), ".npz": self._save_npz}.get(p.suffix.lower())
        if write is None:
            raise LvflowError(f"save: unsupported file type {p.suffix or '(none)'!r} for {p}; use .json or .npz")
        return write(p)

    def _save_npz(self, p: Path) -> Path:
        flat: dict[str, Any] = {}

        def put(prefix, v):
            if isinstance(v, dict):
                for k, w in v.items():
                    put(f"{prefix}/{k}" if prefix else str(k), w)
            elif isinstance(v, (list, tuple)) and v and isinstance(v[0], str):
                flat[prefix] = np.asarray(v, dtype=str)
            elif v is not None:
                flat[prefix] = np.asarray(v)

        put("", self.to_dict())
        return save_npz(p, flat)

    def describe(self) -> str:
        """One line: the family and its size."""
        if isinstance(self.model, DecoupledModes):
            K = int(np.size(self.parameters["r"]))
            name = f"{K} decoupled mode{'s' if K != 1 else ''}"
        else:
            name = "power-law spectrum"
        off = "free offset" if self.model.fit_offset else f"offset fixed at {self.asymptote:g}"
        return f"{name}, {off}"

    def table(self) -> str:
        """The fitted parameters, the drops and the final loss as text (what `lvflow fit` prints)."""
        pct = f"{100 * self.level:g}%"
        lines = []
        P, S = self.parameters, self.stderr
        if isinstance(self.model, PowerLawModel):
            lines.append("parameter        value        stderr")
            for k in ("alpha1", "alpha2", "kappa", "zeta1", "V1", "eps", "beta", "modes", "offset"):
                lines.append(f"{k:<12} {float(P[k]):>12.6g}  {_fmt_se(S[k])}")
            lines.append("")
        lines.append(
            f"{'#':>2} {'step':>11} {pct + ' interval':>25} {'step*':>10} {'t*':>10} {'r':>9} {'V':>10} "
            f"{'c':>8} {'loss before':>11} {'loss after':>11}  note"
        )
        d = self.drops
        c = P.get("c")
        for i in range(np.size(d["step"])):
            note = "future" if d["future"][i] else "seen"
            if not d["resolved"][i]:
                note += ", merges with the next"
            ck = f"{float(np.asarray(c)[i]):8.3g}" if c is not None else f"{'-':>8}"
            interval = "[{:.5g}, {:.5g}]".format(d["step_lo"][i], d["step_hi"][i])
            lines.append(
                f"{i + 1:>2} {d['step'][i]:>11.6g} {interval:>25} {d['step_strength'][i]:>10.5g} "
                f"{d['t_star'][i]:>10.5g} {d['rate'][i]:>9.4g} {d['V'][i]:>10.4g} {ck} "
                f"{_loss(d['loss_before'][i]):>11} {_loss(d['loss_after'][i]):>11}  {note}"
            )
        if np.size(d["step"]) == 0:
            lines.append("   (no resolved drops)")
        if math.isfinite(self.final_loss_lo):
            final = f"[{self.final_loss_lo:.4g}, {self.final_loss_hi:.4g}]"
        else:
            final = f"({_NOT_DETERMINED})"
        asym = (
            f"[{self.asymptote_lo:.4g}, {self.asymptote_hi:.4g}]"
            if math.isfinite(self.asymptote_hi)
            else f"({_NOT_DETERMINED})"
        )
        lines.append(
            f"final loss at step {self.horizon:.6g}: {self.final_loss:.6g} {final}; L_inf = {self.asymptote:.4g} {asym}"
        )
        return "\n".join(lines)

    def forecast_text(self) -> str:
        """The mixed forecast in two lines: the next drop (`next_drop`) and the loss at the
        horizon (`forecast`)."""
        pct = f"{100 * self.level:g}%"
        nd = self.next_drop()
        mix = " + ".join(f"{r.weight:.3g} x {r.describe()}" for r in self.scenarios)
        if nd["note"]:
            drop = nd["note"]
        elif nd["probability"] == 0:
            drop = "none predicted"
        else:
            hi = "no drop" if not math.isfinite(nd["hi"]) else f"{nd['hi']:.5g}"
            at = "no drop (median)" if not math.isfinite(nd["step"]) else f"step {nd['step']:.6g}"
            drop = f"{at}, {pct} interval [{nd['lo']:.5g}, {hi}], probability of a drop {nd['probability']:.3g}"
        f = self.forecast(np.array([self.horizon]))
        if f["determined"][0]:
            loss = f"{f['loss'][0]:.4g}, {pct} interval [{f['lo'][0]:.4g}, {f['hi'][0]:.4g}]"
        else:
            loss = f"{f['loss'][0]:.4g} ({_NOT_DETERMINED}; between {f['lo'][0]:.4g} and {f['hi'][0]:.4g})"
        return f"forecast ({mix}): next drop: {drop}\nforecast: loss at step {self.horizon:.6g}: {loss}"

    def summary(self) -> str:
        """The header lines, `table()` and the warnings."""
        lg = self.log
        lr = f"learning rate {lg.learning_rate:g}" if lg.learning_rate is not None else "t = step (no learning rate)"
        held = lg.steps[lg.steps > self.fit_until]
        span = f"steps {lg.steps[0]:g}–{self.fit_until:g}"
        if held.size:
            span += f" (held out: {held.size} points to step {held[-1]:g})"
        others = ", ".join(f"{k} {v:.1f}" for k, v in self.scores.items())
        head = [
            f"lvflow fit: {lg.source}, {self.n_points} points, {span}, {lr}",
            f"model: {self.describe()}; residual {self.sigma:.3g} in ln loss over {self.n_bins} bins, "
            f"point noise {self.noise:.3g}",
            f"{self.criterion.upper()}: {others}",
        ]
        warn = [f"warning: {w}" for w in self.warnings]
        alt = []
        for a in self.scenarios[1:]:
            alt += [
                "",
                f"alternative scenario: {a.describe()}; residual {a.sigma:.3g} in ln loss",
                a.table(),
            ]
        return "\n".join(head + [self.table()] + alt + ["", self.forecast_text()] + warn)

    def plot(self, path, *, title: str | None = None) -> Path:
        """Observed, fitted and extrapolated loss with the band and the predicted drops (see
        `lvflow._fit.plot.plot_fit`)."""
        return plot_fit(self, path, title=title)


def _without_log(d: dict[str, Any]) -> dict[str, Any]:
    """An alternative's `to_dict()` without what it shares with the main result (the log)."""
    return {k: v for k, v in d.items() if k not in ("observed", "source", "learning_rate", "forecast")}


def _loss(v: float) -> str:
    """A plateau level for the table (`0` for a level of nothing but exhausted modes)."""
    return "0" if v <= 1e-300 else f"{v:.4g}"


def _fmt_se(se) -> str:
    se = float(np.asarray(se))
    return "not determined" if not math.isfinite(se) else f"{se:.3g}"


#: An interval wider than this many decades is reported as not determined by the log.
UNDETERMINED_DECADES = 30.0
#: `−ln 0` for the quantiles: below `e^{−700}` a loss is reported as 0.
_LN_ZERO = 745.0
_NOT_DETERMINED = "not determined by this log: it depends on parameters the seen part does not constrain"

_erfc = np.frompyfunc(math.erfc, 1, 1)


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    """`Φ(x)`, elementwise (`erfc(−x/√2)/2`)."""
    return 0.5 * np.asarray(_erfc(-np.asarray(x, dtype=float) / math.sqrt(2.0)), dtype=float)


def _mixture_quantiles(w, m, sd, atom, qs) -> np.ndarray:
    """Quantiles `qs` of a mixture, per column: component `i` of weight `w_i` is `N(m_i, sd_i²)`
    (rows of `m`, `sd`: shape `(k, n)`), an atom at `+inf` where `atom_i`, and half at `−inf`,
    half at `+inf` where `sd_i = inf` (a quantity the log does not determine). Bisection on
    the mixture's CDF. Returns shape `(len(qs), n)`, `±inf` beyond the finite components."""
    w = np.asarray(w, float)
    m, sd = np.atleast_2d(np.asarray(m, float)), np.atleast_2d(np.asarray(sd, float))
    normal = (np.asarray(atom) == 0)[:, None] & np.isfinite(sd)  # (k, n)
    wide = (np.asarray(atom) == 0)[:, None] & ~np.isfinite(sd)
    below = 0.5 * np.sum(np.where(wide, w[:, None], 0.0), axis=0)  # mass at -inf, per column
    total = below + np.sum(np.where(normal, w[:, None], 0.0), axis=0)  # the CDF at +inf
    safe_sd = np.where(normal, np.maximum(sd, 1e-300), 1.0)
    lo0 = np.min(np.where(normal, m - 40 * safe_sd, np.inf), axis=0)
    hi0 = np.max(np.where(normal, m + 40 * safe_sd, -np.inf), axis=0)
    out = []
    for q in np.asarray(qs, float):
        lo, hi = np.where(np.isfinite(lo0), lo0, 0.0), np.where(np.isfinite(hi0), hi0, 0.0)
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            cdf = below + np.sum(np.where(normal, w[:, None] * _normal_cdf((mid - m) / safe_sd), 0.0), axis=0)
            up = cdf >= q
            hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
        x = np.where(below >= q, -np.inf, np.where(total < q, np.inf, hi))
        out.append(x)
    return np.array(out)


def _time_undetermined(lo: float, hi: float) -> bool:
    """Whether a drop's step interval `[lo, hi]` leaves its time undetermined: unbounded
    (`lo ≤ 0`, `hi = inf`, NaN) or wider than `UNDETERMINED_DECADES` (the delta method's
    log-normal, linearised at the optimum, means nothing across that many decades)."""
    if not (lo > 0 and math.isfinite(hi)):
        return True
    return math.log10(hi / lo) > UNDETERMINED_DECADES


def _fall_probability(drops: dict[str, np.ndarray], k: int, min_fall: float, z: float) -> float:
    """`P(fall_k ≥ min_fall)` for row `k` of a drop table, `ln fall_k` normal with the standard
    error `s` that its interval gives (`fall_lo = fall_k e^{−z s}`) and conditioned on
    `fall_k ≥ 1` (a mode only removes loss: `loss_after ≤ loss_before`):
    `Φ((ln fall_k − ln min_fall)/s) / Φ(ln fall_k / s)`; `1/2` when `s` is infinite (the log
    does not determine the fall); `1` for `min_fall ≤ 1` and for a drop to `L = 0`
    (`fall = inf`)."""
    lf, lo = float(drops["fall"][k]), float(drops["fall_lo"][k])
    if min_fall <= 1.0 or lf == math.inf:
        return 1.0
    if not lf > 0:
        return 0.0
    if not lo > 0:  # an infinite (or NaN) standard error
        return 0.5
    s = math.log(lf / lo) / z
    if s <= 0.0:
        return float(lf >= min_fall)
    above_one = float(_normal_cdf(math.log(lf) / s))
    return min(float(_normal_cdf(math.log(lf / min_fall) / s)) / above_one, 1.0) if above_one > 0 else 0.0


def _exp_or_inf(x: float) -> float:
    """`e^x`, `inf` above `e^700` (and `0` below `e^−700`)."""
    return math.inf if x > 700 else (0.0 if x < -700 else math.exp(x))


def _z(level: float) -> float:
    """The standard normal quantile of a two-sided interval of coverage `level`."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + level / 2)


def _quad(J: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """`diag(J Σ Jᵀ)` with `Σ` given as `(V, s)`, the eigenvectors and inverse eigenvalues of the
    precision (`inf` for a null direction)."""
    vecs, inv = cov
    proj = J @ vecs  # (m, p)
    finite = np.isfinite(inv)
    var = (proj[:, finite] ** 2) @ inv[finite]
    touches = np.any(np.abs(proj[:, ~finite]) > 1e-9 * (np.abs(J).max(axis=1, keepdims=True) + 1e-300), axis=1)
    return np.where(touches, np.inf, var)


def _precision_eig(J_data, J_prior, inflation):
    """Eigen-decomposition of the precision `J_dᵀJ_d/φ + J_pᵀJ_p` (Jacobi-scaled; `J_d` the
    weighted data rows, `φ = max(χ²/dof, 1)`), as `(V, 1/λ)` in the original coordinates' frame
    via the scaling, `1/λ = inf` for a null direction."""
    H = J_data.T @ J_data / inflation + J_prior.T @ J_prior
    d = np.sqrt(np.maximum(np.diag(H), 1e-300))
    Hs = H / d[:, None] / d[None, :]
    lam, U = np.linalg.eigh((Hs + Hs.T) / 2)
    null = lam <= 1e-12 * max(lam.max(), 1e-300)
    inv = np.where(null, np.inf, 1.0 / np.where(null, 1.0, lam))
    # Σ = D⁻¹ U Λ⁻¹ Uᵀ D⁻¹: return the columns of D⁻¹ U (not orthonormal, but J Σ Jᵀ only needs them)
    return U / d[:, None], inv


def _covariance_matrix(cov) -> np.ndarray:
    vecs, inv = cov
    finite = np.isfinite(inv)
    M = (vecs[:, finite] * inv[finite]) @ vecs[:, finite].T
    if not finite.all():
        # an undetermined direction: infinite variance along it
        touched = np.any(np.abs(vecs[:, ~finite]) > 1e-12, axis=1)
        M[np.ix_(touched, touched)] = np.inf
    return M


def _empirical_width(model: DecoupledModes, t_end: float) -> float:
    """The sample standard deviation of `ln c_k` over the active modes half-way before `t_end`,
    clipped to `[0.1, 1]`; 1 with fewer than two such modes."""
    act = np.asarray(model.active)
    seen = act & (np.asarray(model.log_tstar) <= math.log(t_end))
    if np.count_nonzero(seen) < 2:
        return 1.0
    lc = np.asarray(engine.log_z0_minus_eps(model))[seen]
    return float(np.clip(np.std(lc, ddof=1), 0.1, 1.0))


def _refine(template, theta, data):
    """Levenberg–Marquardt from `theta` to convergence (at most `_REFINE_ROUNDS` times
    `SEARCH_STEPS` steps, in the search's compiled solver); a round that fails keeps the last
    values."""
    values, _, _, _ = engine.solve_many(template, theta[None], data, max_steps=_REFINE_ROUNDS * SEARCH_STEPS)
    return values[0]


def _reweight(data: engine.Binned, weight: np.ndarray) -> engine.Binned:
    return eqx.tree_at(lambda d: d.weight, data, to_jax(weight))


def fit(
    log,
    loss: Float[ArrayLike, " n"] | None = None,
    *,
    learning_rate: float | Float[ArrayLike, " n"] | None = None,
    family: str = "auto",
    until: float | None = None,
    modes: int | None = None,
    max_modes: int = 8,
    max_spectrum_modes: int = 2048,
    offset: float | None = None,
    beta: float | None = None,
    criterion: str = "bic",
    bins: int = 200,
    robust: bool = True,
    prior_width: float | None = None,
    level: float = 0.95,
    horizon: float | None = None,
) -> FitResult:
    """Fit a training curve and predict the drops to come.

    The loss is modelled as `L(t) = L_∞ + E(t)` in gradient-flow time `t = η · step`, with the
    excess loss `E` of decoupled logistic modes (Eq. 163, Thm 6) in one of two families:

    - `"modes"`: `K` independent modes with their own rate `r_k`, drop `V_k` and start `c_k`
      (`DecoupledModes`), `K` chosen by the information criterion;
    - `"power_law"`: a power-law spectrum `ζ_k ∝ k^{−α₂}`, `V_k ∝ k^{−α₁}`, `z_k(0) = ε k^{−β}`
      with a cutoff `K` (`PowerLawModel`: Thm 9, with the finite-ε drift of Eq. 292/295 built in);
    - `"auto"` (default): decoupled modes, and when they need all `max_modes` modes or leave
      residuals beyond twice the log's own scatter (`χ² > 2n`), the power law too, keeping the
      one the criterion prefers (the power law only with more modes than `max_modes`: with
      fewer it is a few decoupled modes).

    **Method.** The log is reduced to `bins` equal bins of `ln t` (mean `ln loss` per bin: every
    stretch of log-time weighs the same however it was logged, and minibatch noise averages
    out; the mean is corrected to second order for the curve's curvature within the bin, from
    the neighbouring bins). The residual is `ln L̂ − ȳ` per bin, divided by a first noise estimate; it is
    minimised by Levenberg–Marquardt (`optimistix.LevenbergMarquardt`, derivatives by
    `jax.jacfwd` through the closed-form modes) from several starts at once. With `robust`,
    the fit is repeated from there with the Cauchy loss `Σ c² ln(1 + (r/c)²)` at `c = 3` standard
    errors of a bin (residuals up to a few standard errors count as in least squares, spikes and
    outliers only logarithmically). The criterion (`"bic"`: `n ln(RSS/n) + p ln n`; `"aic"`: `+ 2p`)
    does not reward a fit closer than the bins' own errors (`χ² < n`).

    **Scenarios.** With `L_∞` free, a decoupled-modes fit whose floor is at least 1 % of the
    fitted loss at the end of the log is also fitted as a drop still to come (no floor, one
    mode more, started where the floor was), in two endings the log cannot tell apart: the
    loss then rests on nothing (`L_∞ = 0`, the floor all one mode) or on a next plateau
    (`_with_plateau`: the same fit with part of the new mode's drop left as `L_∞`, under a
    Gaussian prior on `ln L_∞` from the floor's staircase, `_next_plateau`). A floor and a mode
    that has not yet begun to rise describe a plateau alike; when the data alone (`n ln χ²`,
    over `_evidence_discount` for residuals correlated beyond the bins' errors) do not
    separate the floor from the better drop by 10 (a likelihood ratio `e⁵`), the result is the
    scenario the criterion prefers with the others as a chain of `alternative`s, each with its
    `weight` (`e^{−S/2}` normalised, `S` the criterion with the effective number of
    parameters), and `FitResult.forecast` and `FitResult.next_drop` give their mixture. When
    they do, the floor alone, or the two drop endings, are kept.

    **Bins' errors** are measured on the log (`engine.bin_log`): the scatter of one point
    about its local trend, a share of one gradient-descent step's change of `ln L` (for a log
    of integer steps), the bins' own scatter and the float64 rounding; no fixed floor.

    **Uncertainties** come from the Jacobian `J` at the optimum: covariance `σ² (JᵀJ)⁻¹` with `σ²`
    the residual variance (plus the prior's rows), inflated by `(1 + ρ)/(1 − ρ)` for residuals
    with lag-1 autocorrelation `ρ` along `ln t` (the AR(1) variance inflation: a model that
    misses the curve's shape leaves long runs of one sign, which are not `n` independent
    errors; the evidence between two scenarios is divided by the same inflation beyond the
    plain misfit, `_evidence_discount`), and
    every reported quantity — parameters, drop steps, plateau levels, the final loss, the
    curve's band — by the **delta method**
    (linearised at the optimum; positive quantities on the log scale). They describe the
    curve's uncertainty given the family, not the chance that the family is wrong: check the
    `warnings` and the held-out part of the log.

    **Arguments:**

    - `log`: a path to a `.csv`/`.json` log (see `read_log`), or the steps (with `loss`).
    - `loss`: the loss at each step, when `log` is the steps.
    - `learning_rate`: `η` (constant), or one per row (a schedule); `None` uses a learning-rate
      column of the file if there is one, else `t = step`.
    - `family`: `"auto"`, `"modes"` or `"power_law"`.
    - `until`: fit the rows up to this step only, holding out the rest (at or past the last step:
      the whole log, with a warning that nothing is held out).
    - `modes`: a fixed number of modes (either family); default: chosen (modes) or fitted as a
      continuous cutoff (power law).
    - `max_modes`: the most decoupled modes tried (default 8); `max_spectrum_modes`: the
      power-law modes evaluated (default 2048).
    - `offset`: `L_∞` fixed at this value (e.g. 0 for a target the model can fit exactly);
      default fitted.
    - `beta`: the initialisation exponent `β` of the power law (`z_k(0) = ε k^{−β}`) fixed at
      this value (0 is the paper's Eq. 292); default fitted.
    - `criterion`: `"bic"` (default) or `"aic"`.
    - `bins`: the number of `ln t` bins (default 200).
    - `robust`: the Cauchy loss on the residuals (default on).
    - `prior_width`: the width `w` of the prior `ln c_k ~ N(0, w²)` on the modes' starts;
      default: the spread of the starts of the modes whose drop the log shows (empirical
      Bayes), clipped to `[0.1, 1]` (1 while fewer than two drops are seen).
    - `level`: the coverage of the intervals (default 0.95).
    - `horizon`: the step to extrapolate to (default: the last logged step, or past the last
      predicted drop if later).

    **Returns:** a `FitResult`.

    **Raises:** `LvflowError` with one line for a bad log (not numeric, NaN or inf, fewer than 10
    points, steps not increasing, a loss `≤ 0` or one that ends above its start), bad options, an
    `offset` above where the log ends, or sizes (`bins`, `modes`, `max_modes`) whose fit needs more
    memory than this machine has available. A log that climbs back up part way, or a fit the log
    cannot pin down, gives warnings in the result (and a `UserWarning`).
    """
    lg = training_log(log, loss, learning_rate=learning_rate)
    try:
        fam = Family(family)
    except ValueError:
        raise LvflowError(f"family: must be one of {', '.join(FAMILIES)}, got {family!r}") from None
    try:
        crit = Criterion(criterion)
    except ValueError:
        raise LvflowError(f"criterion: must be 'aic' or 'bic', got {criterion!r}") from None
    for name, v, lo in (("bins", bins, 10), ("max_modes", max_modes, 1), ("max_spectrum_modes", max_spectrum_modes, 2)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise LvflowError(f"{name}: must be an integer >= {lo}, got {v!r}")
    if modes is not None and (isinstance(modes, bool) or not isinstance(modes, (int, np.integer)) or modes < 1):
        raise LvflowError(f"modes: must be a positive integer, got {modes!r}")
    if beta is not None and not math.isfinite(beta):
        raise LvflowError(f"beta: must be finite, got {beta!r}")
    slots = int(modes if modes is not None else max_modes)
    need = _fit_bytes(
        bins=bins,
        slots=slots,
        spectrum_modes=modes if modes is not None else max_spectrum_modes,
        power_law=fam is not Family.MODES,
        modes_family=fam is not Family.POWER_LAW,
    )
    what = f"a fit of {slots} mode{'s' * (slots != 1)} over {bins} bins"
    check_memory("bins" if bins > 200 else ("modes" if modes is not None else "max_modes"), need, what)
    if offset is not None and not (math.isfinite(offset) and offset >= 0):
        raise LvflowError(f"offset: must be finite and >= 0, got {offset!r}")
    if not 0 < level < 1:
        raise LvflowError(f"level: must lie in (0, 1), got {level!r}")
    if prior_width is not None and not prior_width > 0:
        raise LvflowError(f"prior_width: must be positive, got {prior_width!r}")
    if horizon is not None and not (math.isfinite(float(horizon)) and float(horizon) > 0):
        raise LvflowError(f"horizon: must be a positive step, got {horizon!r}")
    fit_until = float(lg.steps[-1]) if until is None else float(until)
    sel = lg.steps <= fit_until
    if np.count_nonzero(sel) < MIN_POINTS:
        raise LvflowError(
            f"until: only {np.count_nonzero(sel)} logged point(s) up to step {fit_until:g}; "
            f"a fit needs at least {MIN_POINTS}"
        )
    fit_until = float(lg.steps[sel][-1])
    t, y = lg.t[sel], lg.loss[sel]
    # the loss falls towards L_∞ from above (Eq. 163): a floor above where the fitted log ends
    # (the median of its last tenth, robust to minibatch noise) contradicts the log
    end = float(np.median(y[-max(1, y.size // 10) :]))
    if offset is not None and offset > end:
        raise LvflowError(
            f"offset: {offset:g} is above where the log ends ({end:.4g}, the median of its last tenth up to step "
            f"{fit_until:g}); the loss falls towards L_inf from above, so L_inf must lie below it"
        )
    # η at each row, for the discretisation of gradient descent: none for a log of fractional
    # steps (a sampled gradient flow, not a run of discrete steps)
    s_sel = lg.steps[sel]
    step_time = np.gradient(t) / np.gradient(s_sel) if np.all(s_sel == np.round(s_sel)) else None
    data = engine.bin_log(t, y, int(bins), step_time)

    cands: list[Candidate] = []
    scores: dict[str, float] = {}
    best_modes: Candidate | None = None
    if fam is not Family.POWER_LAW:
        best_modes, sc = search_modes(
            data,
            max_modes=int(max_modes),
            modes=modes,
            offset=offset,
            criterion=crit,
            prior_width=1.0 if prior_width is None else prior_width,
            robust=bool(robust),
        )
        assert best_modes is not None  # the search without a floor raises instead
        cands.append(best_modes)
        scores.update(sc)
    # auto: the power law is tried when the decoupled modes need every mode allowed or leave
    # residuals beyond the log's own scatter (a few drops, well fitted, are not a spectrum)
    need_spectrum = fam is Family.POWER_LAW or (
        fam is Family.AUTO
        and best_modes is not None
        and (best_modes.K >= max_modes or best_modes.rss > _SPECTRUM_CHI2 * best_modes.n)
    )
    if need_spectrum:
        pl = search_power_law(
            data,
            max_modes=int(modes if modes is not None else max_spectrum_modes),
            modes=modes,
            offset=offset,
            criterion=crit,
            beta=0.0 if beta is None else float(beta),
            fit_beta=beta is None,
            robust=bool(robust),
        )
        cands.append(pl)
        scores["power law"] = pl.score
    if fam is Family.AUTO and len(cands) == 2:
        # a power law of no more modes than the modes family tries is a few decoupled modes with
        # a constrained spectrum (and a fractional last mode): leave those to the modes family
        pl_model = cands[1].model
        K_pl = float(np.exp(float(pl_model.log_modes))) if isinstance(pl_model, PowerLawModel) else 0.0
        if K_pl <= max_modes:
            cands = cands[:1]
            scores.pop("power law")
    best = min(cands, key=lambda c: c.score)
    opts: dict[str, Any] = dict(robust=bool(robust), prior_width=prior_width, level=float(level), criterion=crit)
    # scenarios: a floor L_∞ at the level the log ends on is also a plateau with a drop to come,
    # after which the loss rests on a next plateau or on nothing: the log cannot tell which
    kept, k = [best], 1.0  # k: the evidence discount, set with the drop scenarios
    # (it needs a slot for the extra mode: none when the number of modes is fixed; one more than
    # `max_modes` when the floor's fit uses them all)
    if isinstance(best.template, DecoupledModes) and best.template.fit_offset and modes is None:
        model = engine.model_of(best.template, to_jax(best.theta))
        end_loss = float(np.exp(np.asarray(engine.log_loss_of(model, to_jax(np.array([float(t[-1])]))))[0]))
        if float(model.offset) >= _FLOOR_SHARE * end_loss:
            if best.K >= model.K:
                model = _with_slot(model)
            zero, sc = search_modes(
                data,
                max_modes=model.K,
                modes=None,
                offset=0.0,
                criterion=crit,
                prior_width=1.0 if prior_width is None else prior_width,
                robust=bool(robust),
                floor=model,
            )
            scores.update({f"drop to no floor, {k}": v for k, v in sc.items()})
            drops_ = []  # none when no fit keeps a drop after the log
            if zero is not None:
                k_new = int(np.sum(np.asarray(model.active)))
                plateau = _with_plateau(zero, k_new, _next_plateau(model), data, robust=bool(robust))
                drops_ = [zero] if plateau is None else [zero, plateau]
                if plateau is not None:
                    scores[f"drop to a next plateau, modes K={plateau.K}"] = plateau.score
            if drops_:
                k = _evidence_discount(min([best, *drops_], key=lambda c: c.rss), data)
                d_best = min(drops_, key=lambda c: c.score)
                if abs(d_best.data_term - best.data_term) / k < _DECISIVE:
                    kept = [best, *drops_]
                elif d_best.score < best.score:
                    kept = drops_  # a drop to come, decided; where the loss then rests is not
    kept.sort(key=lambda c: c.score)
    best = kept[0]
    h = None if horizon is None else float(horizon)
    if h is None:
        h = max(_default_horizon(c, lg) for c in kept)
    results = [_finish(lg, t, sel, fit_until, data, c, scores, h, **opts) for c in kept]
    result = results[0]
    if len(results) > 1:
        w = _weights(kept, [r.effective_parameters for r in results], k)
        results = [
            eqx.tree_at(lambda r: (r.weight, r.evidence_discount), r, (wi, float(k))) for r, wi in zip(results, w)
        ]
        note = _undecided(kept, results, k)
        alt = None
        for r in results[:0:-1]:  # the chain of alternatives, from the last
            alt = eqx.tree_at(lambda r: r.alternative, r, alt, is_leaf=lambda x: x is None)
        result = eqx.tree_at(
            lambda r: (r.alternative, r.warnings, r.weight),
            results[0],
            (alt, results[0].warnings + (note,), w[0]),
            is_leaf=lambda x: x is None,
        )
    if until is not None and float(until) >= lg.steps[-1]:
        past = (
            f"the fitted part (until step {float(until):g}) reaches the log's last step ({lg.steps[-1]:g}): "
            "nothing is held out"
        )
        result = eqx.tree_at(lambda r: r.warnings, result, (past,) + result.warnings)
    for msg in result.warnings:
        warnings.warn(msg, stacklevel=2)
    return result


#: A floor `L_∞` of at least this share of the fitted loss at the end of the log is a candidate
#: plateau: `fit` also tries the log without a floor (a drop still to come). A floor the log has
#: not reached (a drop in progress where it ends, levelling off below) is as much a guess as one
#: it ends on: with 0.5, 9 of the 30 `--quick` calibration logs kept a free floor of 1.5–51 % of
#: the loss where the seen part ends as their only scenario, and a drop came in every one
#: (`benchmarks/README.md`).
_FLOOR_SHARE = 0.01
#: The data decide between two hypotheses when `n ln χ²` differs by this much (a likelihood
#: ratio `e^5 ≈ 150`, "very strong" on the scale of Kass and Raftery); less, and the result
#: carries both.
_DECISIVE = 10.0


def _with_slot(model: DecoupledModes) -> DecoupledModes:
    """`model` with one more, inactive mode slot (for the drop scenario of a fit whose floor
    uses every slot): the new slot's entries are copies of the last's, masked."""
    pad = lambda a: to_jax(np.append(np.asarray(a), np.asarray(a)[-1:]))  # noqa: E731
    return eqx.tree_at(
        lambda m: (m.log_rate, m.log_drop, m.log_tstar, m.active),
        model,
        (pad(model.log_rate), pad(model.log_drop), pad(model.log_tstar), to_jax(np.append(model.active, False))),
    )


def _next_plateau(model: DecoupledModes) -> tuple[float, float]:
    """The prior `(mean, width)` of `ln L_∞` for the drop scenario: the plateau after the drop
    to come, from the staircase the floor's fit shows. Its plateaus `P_0 = L_∞ + Σ V_k`,
    `P_j = L_∞ + Σ_{k>j} V_k` (modes in the order of `t*`) fall by `q_j = ln(P_j/P_{j−1})`
    per mode; the drop to come falls as the largest of them, `q = min_j q_j` (a drop, not one
    of the small modes a fit adds to a drop's shape): mean `ln L_∞ + q`, width the larger of
    the predictive spread of one more fall, `s √(1 + 1/m)` (`s` the sample deviation of the
    `m` falls; `m ≥ 2`), and `|q|` (the size of a fall the log has not shown is known to its
    order only). With `L_∞ = 0` assumed instead, the loss after the drop is the seen modes'
    tails alone, decades below any next plateau."""
    ts, V, _ = (np.asarray(a) for a in engine.drops_of(model))
    V = V[np.argsort(ts)]
    V = V[V > 0]
    f = float(model.offset)
    P = f + np.concatenate([np.cumsum(V[::-1])[::-1], [0.0]])
    q = np.diff(np.log(P))
    m = q.size
    spread = float(np.std(q, ddof=1) * math.sqrt(1 + 1 / m)) if m >= 2 else 0.0
    fall = float(q.min())
    return math.log(f) + fall, max(spread, abs(fall), 1e-3)


def _effective_parameters(J_data: np.ndarray, inflation: float, cov, unseen: np.ndarray | None = None) -> float:
    """`tr(H_d Σ)`, `H_d = J_dᵀJ_d/φ` the data's precision and `Σ` the covariance (`_precision_eig`'s
    `(V, 1/λ)`; a null direction counts 0): the number of parameters the log determines (each
    direction the prior alone pins counts 0, one the data pin counts 1).

    `unseen` (a boolean mask over the parameters; default none) leaves those parameters'
    diagonal entries `(H_d Σ)_ii` out of the sum: the rate and the lag of a mode whose drop's
    midpoint lies after the log (`_unseen_timing`). The log bounds such a mode's time from one side
    only (it has not dropped yet): the likelihood is flat as the mode moves later (its limit, a
    mode that never starts, is a floor), so the Occam factor of its timing is the prior's mass
    past the log, of order 1, not the Laplace approximation's `(2π/n)^{1/2}` per direction that
    the curvature at the optimum (the mode's onset just touching the log's end) would charge."""
    vecs, inv = cov
    finite = np.isfinite(inv)
    proj = J_data @ vecs[:, finite]  # (B, m)
    if unseen is None or not np.any(unseen):
        return float(np.sum(np.sum(proj**2, axis=0) / inflation * inv[finite]))
    # diag(H_d Σ)_i = Σ_m (J_dᵀ J_d V)_{im} (1/λ_m) V_{im} / φ; the entries sum to the trace
    diag = np.sum((J_data.T @ proj) * inv[finite] * vecs[:, finite], axis=1) / inflation
    return float(np.sum(diag[~np.asarray(unseen, bool)]))


def _unseen_timing(model: DecoupledModes, future: np.ndarray) -> np.ndarray:
    """The mask over a compacted `DecoupledModes`'s parameters (`ln r_k`, `ln V_k`,
    `ln(r_k t*_k − ln 9)`, `ln ε`, `ln L_∞`) that marks the rate and the lag of the modes
    `future` (indices: those whose drop's midpoint lies after the fitted part, the drop table's
    `future` rows)."""
    K = model.K
    late = np.zeros(K, bool)
    late[np.asarray(future, int)] = True
    mask = np.zeros(len(model.parameter_names), bool)
    mask[:K] = late
    mask[2 * K : 3 * K] = late
    return mask


def _weights(cands, p_eff, k: float = 1.0) -> list[float]:
    """The scenarios' weights `e^{−S/2}`, normalised: `S` the data's term (`Candidate.data_term`) over the
    evidence's discount `k` (`_evidence_discount`: `n/k` independent residuals) plus
    the criterion's penalty for the effective number of parameters (`p_eff ln(n/k)` for BIC,
    `2 p_eff` for AIC)."""
    S = np.array([c.data_term / k + c.criterion.penalty(p, max(c.n / k, 1.0)) for c, p in zip(cands, p_eff)])
    e = np.exp(-0.5 * (S - S.min()))
    return [float(v) for v in e / e.sum()]


def _with_plateau(
    zero: Candidate, k_new: int, prior: tuple[float, float], data: engine.Binned, *, robust: bool
) -> Candidate | None:
    """The drop scenario whose loss rests on a next plateau after the drop: `zero`'s fit (no
    floor, the new mode in slot `k_new` taking the whole floor over) with the plateau `e^mean`
    of `prior` (`_next_plateau`) left as a free `L_∞` under that prior and the rest of the new
    mode's drop kept, refined by Levenberg–Marquardt. `None` if the new mode's drop is not above
    the plateau or the refinement fails."""
    m = zero.model
    mean, width = prior
    log_drop = np.asarray(m.log_drop).copy()
    if not bool(np.asarray(m.active)[k_new]) or log_drop[k_new] <= mean:
        return None
    log_drop[k_new] = math.log(math.exp(log_drop[k_new]) - math.exp(mean))
    template = DecoupledModes(
        log_rate=m.log_rate,
        log_drop=to_jax(log_drop),
        log_tstar=m.log_tstar,
        log_eps=m.log_eps,
        active=m.active,
        log_offset=to_jax(np.float64(mean)),
        prior_width=m.prior_width,
        fit_offset=True,
        offset_prior=to_jax(np.array([mean, width])),
    )
    theta0 = np.asarray(engine.vector_of(template))
    values, rss, objective, _ = engine.solve_robust(template, theta0[None], data, robust=robust, max_steps=SEARCH_STEPS)
    if not np.isfinite(rss[0]):
        return None
    K = int(np.sum(np.asarray(m.active)))
    return Candidate(f"{K} modes", template, values[0], rss[0], data.n, 3 * K + 1, zero.criterion, engine.BATCH, K)


def _evidence_discount(c: Candidate, data: engine.Binned) -> float:
    """`max(k m, 1)/max(m, 1)`, `m = χ²/dof` of the better-fitting candidate `c` and `k` its
    residuals' `_correlation_factor`: the factor by which `_finish` inflates the covariance
    beyond the plain misfit, applied to the evidence between the scenarios too. Within the bins'
    errors (`k m ≤ 1`: the residuals are what the log's measured resolution allows) the data
    count in full."""
    m = c.rss / max(c.n - c.p, 1)
    return max(_correlation_factor(_residuals_of(c, data)) * m, 1.0) / max(m, 1.0)


def _residuals_of(c: Candidate, data: engine.Binned) -> np.ndarray:
    """A candidate's weighted residuals over the non-empty bins, in the order of `ln t`."""
    r = np.asarray(engine.data_residuals(c.template, to_jax(c.theta), data))
    return r[np.asarray(data.count) > 0]


def _correlation_factor(r: np.ndarray) -> float:
    """`(1 + ρ)/(1 − ρ)`, `ρ` the lag-1 autocorrelation of the residuals `r` in the order of
    `ln t` (`Σ r_i r_{i+1} / Σ r_i²`, clipped to `[0, 1 − 2/n]`): the variance inflation of a
    mean or a least-squares estimate when the errors are an AR(1) sequence, so that `n`
    correlated residuals count as `n/k` independent ones. A model that misses the curve's shape
    leaves residuals of one sign over long stretches: its χ² then measures the misfit, not `n`
    independent errors, and the standard errors and the evidence between scenarios are scaled
    accordingly. 1 for fewer than 3 residuals."""
    r = np.asarray(r, float)
    ss = float(np.sum(r**2))
    if r.size < 3 or ss <= 0:
        return 1.0
    rho = min(max(float(np.sum(r[1:] * r[:-1])) / ss, 0.0), 1.0 - 2.0 / r.size)
    return (1.0 + rho) / (1.0 - rho)


def _default_horizon(c: Candidate, lg: TrainingLog) -> float:
    """The last logged step, or 1.5× the last drop's time if later."""
    ts, V, _ = (np.asarray(a) for a in engine.drops_of(c.model))
    ts = ts[V > 0]
    h_t = max(float(lg.t[-1]), 1.5 * float(ts.max()) if ts.size else 0.0)
    return float(lg.step_of(h_t))


def _undecided(cands: list[Candidate], results: list[FitResult], k: float) -> str:
    """The sentence that says the log cannot decide between the scenarios."""

    def says(r: FitResult) -> str:
        fut = r.future_drops
        if fut["step"].size:
            rest = f"L_inf = {r.asymptote:.3g}" if r.asymptote > 0 else "nothing (L_inf = 0)"
            return (
                f"a drop still to come at step {fut['step'][0]:.5g} "
                f"[{fut['step_lo'][0]:.4g}, {fut['step_hi'][0]:.4g}] down to {rest}, "
                f"then {r.final_loss:.3g} at step {r.horizon:.6g}"
            )
        return f"the loss levels off at L_inf = {r.asymptote:.4g} (no drop to come)"

    crit = cands[0].criterion.value.upper()
    terms = [c.data_term for c in cands]
    spread = max(terms) - min(terms)
    each = "; or ".join(f"{says(r)} (weight {r.weight:.3g})" for r in results)
    return (
        f"{len(cands)} scenarios fit the log equally well ({crit} "
        f"{' vs '.join(f'{c.score:.1f}' for c in cands)}, the data alone differ by up to {spread:.1f}, "
        f"{spread / k:.1f} for correlated residuals < {_DECISIVE:g}): {each} (see .alternative); "
        "the forecast mixes them"
    )


def _finish(
    lg: TrainingLog,
    t: np.ndarray,
    sel: np.ndarray,
    fit_until: float,
    data: engine.Binned,
    best: Candidate,
    scores: dict[str, float],
    horizon_step: float,
    *,
    robust: bool,
    prior_width: float | None,
    level: float,
    criterion: Criterion,
) -> FitResult:
    """The chosen candidate refined (with the empirical-Bayes prior), its covariance, drops,
    curve, band and warnings: the `FitResult`."""
    template, theta = best.template, best.theta
    if robust:
        data = engine.with_scale(data, engine.CAUCHY_SCALE)
    B = int(np.size(data.y))
    ok = np.asarray(data.count) > 0
    is_modes = isinstance(template, DecoupledModes)
    if isinstance(template, DecoupledModes) and prior_width is None:
        # empirical Bayes: the prior's width is the spread of the starts of the modes seen
        width = _empirical_width(engine.model_of(template, to_jax(theta)), float(t[-1]))
        template = eqx.tree_at(lambda m: m.prior_width, template, to_jax(np.float64(width)))
    theta = _refine(template, theta, data)

    res = np.asarray(engine.data_residuals(template, to_jax(theta), data))
    n = int(ok.sum())
    p = best.p
    chi2 = float(np.sum(res[ok] ** 2))
    # φ: the residual variance in units of the bins' errors, times the variance inflation of
    # residuals correlated along the log (a systematic misfit is not n independent errors)
    misfit = chi2 / max(n - p, 1)
    inflation = max(misfit * _correlation_factor(res[ok]), 1.0)
    raw = np.asarray(engine.log_loss_of(engine.model_of(template, to_jax(theta)), data.t)) - np.asarray(data.y)
    sigma = math.sqrt(float(np.sum(raw[ok] ** 2)) / max(n - p, 1))  # RMS bin residual in ln loss
    J = engine.jacobian(template, theta, data)
    if isinstance(template, DecoupledModes):
        slots = engine.model_of(template, to_jax(theta))
        live = slots.live()
        template = slots.compact()
        theta, J = np.asarray(theta)[live], J[:, live]
    model = engine.model_of(template, to_jax(theta))
    cov = _precision_eig(J[:B], J[B:], inflation)

    # the drops, then every reported number and its delta-method interval at once
    order, resolved = _drop_order(model, is_modes)
    h_t = float(lg.t_of(horizon_step))
    first = lg.steps[lg.steps > 0][0] if np.any(lg.steps > 0) else 1.0
    curve_steps = np.concatenate([[0.0], np.geomspace(min(first, horizon_step), horizon_step, _CURVE - 1)])
    out, jac = engine.summaries_and_jac(
        template,
        to_jax(theta),
        to_jax(lg.t_of(curve_steps)),
        to_jax(np.array([h_t])),
        to_jax(order.astype(np.int32)),
    )
    sd = jax.tree_util.tree_map(lambda v, Jv: _sd(np.asarray(v), np.asarray(Jv), cov), out, jac)
    out = jax.tree_util.tree_map(np.asarray, out)
    z = _z(level)
    parameters = dict(out["reported"])
    stderr = dict(sd["reported"])
    drops = _drop_table(out, sd, model, order, resolved, lg, fit_until, z)
    unseen = _unseen_timing(model, order[drops["future"]]) if is_modes else None
    p_eff = _effective_parameters(J[:B], inflation, cov, unseen)
    fl, fl_sd = float(out["ln_final"][0]), float(sd["ln_final"][0])
    fl_ok = 2 * z * fl_sd <= UNDETERMINED_DECADES * math.log(10)  # False for an infinite one
    cmean, csd = out["ln_curve"], sd["ln_curve"]
    off_val = float(parameters["offset"])
    off_se = float(stderr["offset"])

    # the scale a climb is measured against: robust (1.4826 × the median absolute bin residual),
    # so that a spike the Cauchy loss leaves unfitted does not hide itself by inflating it
    typical = 1.4826 * float(np.median(np.abs(raw[ok]))) if n else sigma
    notes = _trust(lg, sigma, max(misfit, 1.0), drops, stderr, best, typical)
    return FitResult(
        family=(Family.MODES if is_modes else Family.POWER_LAW).value,
        model=model,
        parameters=parameters,
        stderr=stderr,
        theta=np.asarray(theta),
        covariance=_covariance_matrix(cov),
        parameter_names=tuple(template.parameter_names),
        sigma=sigma,
        noise=float(data.noise),
        n_bins=n,
        n_points=int(np.count_nonzero(sel)),
        criterion=criterion.value,
        scores=dict(scores),
        log=lg,
        fit_until=fit_until,
        drops=drops,
        curve={
            "step": curve_steps,
            "loss": np.exp(cmean),
            "lo": np.exp(cmean - z * csd),
            "hi": np.exp(cmean + z * csd),
        },
        horizon=horizon_step,
        final_loss=math.exp(fl),
        final_loss_lo=math.exp(fl - z * fl_sd) if fl_ok else math.nan,
        final_loss_hi=math.exp(fl + z * fl_sd) if fl_ok else math.nan,
        asymptote=off_val,
        asymptote_lo=max(off_val - z * off_se, 0.0),
        asymptote_hi=off_val + z * off_se,
        level=float(level),
        warnings=tuple(notes),
        effective_parameters=p_eff,
        chi2=best.rss,
    )


_CURVE = 400  # points of the saved and plotted curve


def _sd(v: np.ndarray, Jv: np.ndarray, cov) -> np.ndarray:
    """Delta-method standard errors of the entries of `v` from their Jacobian `Jv`."""
    J = Jv.reshape(max(v.size, 1), -1)[: v.size]
    if v.size == 0:
        return np.zeros_like(v)
    return np.sqrt(np.maximum(_quad(J, cov), 0.0)).reshape(v.shape)


def _drop_order(model, is_modes: bool) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the listed drops in the order of `t*` and whether each is resolved (its
    gap to the next exceeds half their two widths `ln 81 / r`). A power law lists its leading
    resolved drops only: the rest merge into the power law."""
    ts, V, r = (np.asarray(a) for a in engine.drops_of(model))
    order = np.argsort(ts, kind="stable")
    order = order[V[order] > 0]
    ts_o, r_o = ts[order], r[order]
    widths = 0.5 * (_WIDTH / r_o[:-1] + _WIDTH / r_o[1:])
    resolved = np.append(np.diff(ts_o) > widths, True)
    if not is_modes:
        bad = np.flatnonzero(~resolved)
        n_res = int(bad[0]) if bad.size else order.size
        order, resolved = order[:n_res], resolved[:n_res]
    return order, resolved


def _drop_table(out, sd, model, order, resolved, lg: TrainingLog, fit_until: float, z: float):
    lm, sm = out["ln_t_mid"], sd["ln_t_mid"]
    lb, sb = out["ln_before"], sd["ln_before"]
    la, sa = out["ln_after"], sd["ln_after"]
    lf, sf = out["ln_fall"], sd["ln_fall"]
    _, V, r = (np.asarray(a) for a in engine.drops_of(model))
    t_star = np.exp(out["ln_t_star"])
    step = lg.step_of(np.exp(lm))
    expo = lambda a: np.where(a < 690.0, np.exp(np.minimum(a, 690.0)), np.inf)
    return {
        "t_star": t_star,
        "step_strength": lg.step_of(t_star),
        "step": step,
        "step_lo": lg.step_of(np.exp(lm - z * sm)),
        "step_hi": lg.step_of(expo(lm + z * sm)),
        "V": V[order],
        "rate": r[order],
        "loss_before": np.exp(lb),
        "loss_before_lo": np.exp(lb - z * sb),
        "loss_before_hi": expo(lb + z * sb),
        "loss_after": np.exp(la),
        "loss_after_lo": np.exp(la - z * sa),
        "loss_after_hi": expo(la + z * sa),
        "fall": expo(lf),
        "fall_lo": np.exp(lf - z * sf),
        "fall_hi": expo(lf + z * sf),
        "resolved": np.asarray(resolved, bool),
        "future": step > fit_until,
    }


def _trust(lg, sigma, inflation, drops, stderr, best, typical) -> list[str]:
    """Sentences saying how far to trust the fit (`typical`: the robust bin residual scale a
    climb of the loss is measured against)."""
    notes = []
    climb = rises(lg, typical)
    if climb:
        notes.append(climb)
    undetermined = [k for k, se in stderr.items() if not np.all(np.isfinite(np.asarray(se)))]
    if undetermined:
        notes.append(
            f"the log does not determine {', '.join(undetermined)} (infinite standard error): "
            "the predictions that depend on them are guesses"
        )
    fut = drops["future"]
    if np.any(fut):
        i = int(np.flatnonzero(fut)[0])
        rel = (drops["step_hi"][i] - drops["step_lo"][i]) / (2 * drops["step"][i])
        if rel > 0.25:
            notes.append(
                f"the next drop's interval is wide ([{drops['step_lo'][i]:.4g}, {drops['step_hi'][i]:.4g}] "
                f"around step {drops['step'][i]:.4g}): the log shows little of its rise"
            )
    if inflation > 4.0:
        notes.append(
            f"the residuals are {math.sqrt(inflation):.1f}x the log's own scatter (sigma = {sigma:.2g} in ln loss): "
            "the family describes this curve loosely"
        )
    if best.n < 4 * best.p:
        notes.append(f"{best.n} bins for {best.p} parameters: a longer or denser log would pin the fit down better")
    return notes


def training_log(
    log, loss: Float[ArrayLike, " n"] | None = None, *, learning_rate: float | Float[ArrayLike, " n"] | None = None
) -> TrainingLog:
    """A training log as `fit` reads it, checked, with the gradient-flow time of each row
    (`TrainingLog.t`: `t = η · step`, or `t_i = Σ_{j ≤ i} η_j (step_j − step_{j−1})` for a schedule).

    **Arguments:** `log`: a `.csv`/`.json` file (the columns `lvflow fit` reads, a learning-rate
    column included) with `loss` `None`, or the logged steps with `loss` beside them;
    `learning_rate`: a constant `η`, one rate per row (a schedule), or `None` (the file's
    learning-rate column if it has one, else `t = step`).

    **Raises:** `LvflowError` naming the problem: a missing `loss` for arrays, an unreadable or
    unsupported file, and the checks of a log (`TrainingLog`)."""
    if loss is None:
        if isinstance(log, (str, os.PathLike)):
            steps, values, lr_col = read_log(log, source=str(log))
            lr = learning_rate if learning_rate is not None else lr_col
            return check_log(steps, values, lr, source=str(log))
        raise LvflowError("loss: missing; pass fit(path) or fit(steps, loss)")
    return check_log(log, loss, learning_rate, source="arrays")


#: The power law's parameters per start (rate and drop exponents, scales, `ε`, `β`, the cutoff,
#: the offset): the width of its Jacobian.
_POWER_LAW_PARAMETERS = 8


def _fit_bytes(*, bins: int, slots: int, spectrum_modes: int, power_law: bool, modes_family: bool) -> float:
    """The peak bytes of `fit`'s Levenberg–Marquardt search: `engine.BATCH` starts at once, each
    pushing one forward-mode tangent per parameter (`3·slots + 2` for decoupled modes) through
    every bin's every mode, `BATCH · p · bins · modes` float64 (measured with 32 starts at once:
    1.58e11 bytes for 1000 slots and 200 bins, this formula 1.54e11); the binned log besides. Exact Python integers,
    returned as a float (no overflow for any input).

    **Arguments:** `bins`; `slots` (the decoupled modes tried: `modes`, else `max_modes`);
    `spectrum_modes` (the power law's: `modes`, else `max_spectrum_modes`); which families are tried.
    """
    bins, slots, spectrum_modes = max(int(bins), 0), max(int(slots), 0), max(int(spectrum_modes), 0)
    need = 8 * 16 * bins
    if modes_family:
        need += 8 * engine.BATCH * (3 * slots + 2) * bins * slots
    if power_law:
        need += 8 * engine.BATCH * _POWER_LAW_PARAMETERS * bins * spectrum_modes
    return float(need)
