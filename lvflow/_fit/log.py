"""Reading and checking a training log: steps, losses and (optionally) learning rates."""

from __future__ import annotations

import math
import os
from pathlib import Path

import equinox as eqx
import numpy as np
from jaxtyping import Float

from .._core.errors import LvflowError
from .._workflow.io import csv_lines, read_json

#: Column names accepted for each quantity (case-insensitive).
STEP_NAMES = ("step", "steps", "iteration", "iter", "epoch")
LOSS_NAMES = ("loss", "train_loss", "training_loss")
LR_NAMES = ("lr", "learning_rate", "eta")

#: A fit needs at least this many logged points.
MIN_POINTS = 10


class TrainingLog(eqx.Module):
    """A checked training log: `steps` (strictly increasing, `≥ 0`), `loss` (finite, `> 0`) and
    the gradient-flow time `t` of each row: `t = η · step` for a constant learning rate `η`,
    `t_i = Σ_{j ≤ i} η_j (step_j − step_{j−1})` for a logged schedule, `t = step` without one.
    `learning_rate` is the constant `η` (`None` for a schedule or none)."""

    steps: Float[np.ndarray, " n"]
    loss: Float[np.ndarray, " n"]
    t: Float[np.ndarray, " n"]
    learning_rate: float | None
    source: str

    def step_of(self, t):
        """The step at gradient-flow time `t` (linear in `t` past the last logged row)."""
        t = np.asarray(t, dtype=float)
        if self.learning_rate is not None:
            return t / self.learning_rate
        slope = (self.steps[-1] - self.steps[-2]) / max(self.t[-1] - self.t[-2], 1e-300)
        inside = np.interp(t, self.t, self.steps)
        return np.where(t > self.t[-1], self.steps[-1] + (t - self.t[-1]) * slope, inside)

    def t_of(self, step):
        """The gradient-flow time at `step` (the inverse of `step_of`)."""
        step = np.asarray(step, dtype=float)
        if self.learning_rate is not None:
            return step * self.learning_rate
        slope = (self.t[-1] - self.t[-2]) / max(self.steps[-1] - self.steps[-2], 1e-300)
        inside = np.interp(step, self.steps, self.t)
        return np.where(step > self.steps[-1], self.t[-1] + (step - self.steps[-1]) * slope, inside)


def _pick(columns: dict, names, what: str, source: str, required: bool):
    low = {k.strip().lower(): k for k in columns}
    for n in names:
        if n in low:
            return columns[low[n]]
    if required:
        have = ", ".join(repr(k) for k in columns) or "none"
        raise LvflowError(f"{source}: no {what} column (looked for {', '.join(names)}; found {have})")
    return None


def _column(name: str, values, source: str) -> np.ndarray:
    out = np.empty(len(values))
    for i, v in enumerate(values):
        if isinstance(v, bool) or v is None:
            raise LvflowError(f"{source}: {name} row {i + 1} is not a number: {v!r}")
        if isinstance(v, (list, dict)):
            raise LvflowError(f"{source}: {name} row {i + 1} is not a number: a JSON {type(v).__name__}")
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            raise LvflowError(f"{source}: {name} row {i + 1} is not a number: {str(v)[:40]!r}") from None
    return out


def _read_csv(p: Path, source: str) -> dict:
    lines = csv_lines(p, source)
    sep = "\t" if "\t" in lines[0] and "," not in lines[0] else ","
    header = [c.strip() for c in lines[0].split(sep)]
    if all(_is_number(c) for c in header):
        if len(header) != 2:
            raise LvflowError(f"{source}: {p} has no header; name the columns (step,loss[,lr]) in the first row")
        header, rows = ["step", "loss"], lines
    else:
        rows = lines[1:]
    cols: dict[str, list] = {h: [] for h in header}
    for i, ln in enumerate(rows):
        cells = [c.strip() for c in ln.split(sep)]
        if len(cells) != len(header):
            raise LvflowError(f"{source}: {p} data row {i + 1} has {len(cells)} values, the header {len(header)}")
        for h, c in zip(header, cells):
            cols[h].append(c)
    return cols


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _named(source: str, p: Path) -> str:
    """The head of an error about file `p`: `"log.csv: "` when `source` is the path itself,
    else `"source: log.csv: "`."""
    return f"{source}: " if source == str(p) else f"{source}: {p}: "


def _read_json(p: Path, source: str) -> dict:
    obj = read_json(p, _named(source, p))
    if isinstance(obj, dict) and not any(isinstance(v, list) for v in obj.values()):
        raise LvflowError(f"{source}: {p} holds a JSON object without columns; expected lists under 'step' and 'loss'")
    if isinstance(obj, dict):
        return {k: v for k, v in obj.items() if isinstance(v, list)}
    if isinstance(obj, list) and obj and all(isinstance(r, dict) for r in obj):
        keys = list(obj[0])
        cols: dict[str, list] = {k: [] for k in keys}
        for i, r in enumerate(obj):
            for k in keys:
                if k not in r:
                    raise LvflowError(f"{source}: {p} record {i + 1} has no {k!r}")
                cols[k].append(r[k])
        return cols
    raise LvflowError(f"{source}: {p} must hold a list of records or an object of columns (step, loss)")


#: the log files `read_log` reads, by suffix
_READERS = {".csv": _read_csv, ".tsv": _read_csv, ".txt": _read_csv, ".json": _read_json}


def read_log(path, *, source: str = "log") -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`(steps, loss, lr)` from a `.csv` (header row naming the columns; comma or tab separated;
    `#` comments) or `.json` file (a list of records `{"step": …, "loss": …}` or an object of
    columns `{"step": [...], "loss": [...]}`), UTF-8 with or without a byte-order mark. Columns:
    step (`step`, `steps`, `iteration`, `iter`, `epoch`), loss (`loss`, `train_loss`,
    `training_loss`), optional learning rate (`lr`, `learning_rate`, `eta`). A header-less CSV of
    two columns is read as step, loss.

    **Raises:** `LvflowError` naming `source`: missing or unreadable file, unknown type, JSON
    nested too deeply, no step or loss column, a cell that is not a number."""
    p = Path(os.fspath(path))
    if not p.exists():
        raise LvflowError(f"{_named(source, p)}file not found")
    if p.is_dir():
        raise LvflowError(f"{source}: is a directory, expected a file: {p}")
    read = _READERS.get(p.suffix.lower())
    if read is None:
        raise LvflowError(f"{source}: unsupported file type {p.suffix or '(none)'!r} for {p}; use .csv or .json")
    cols = read(p, source)
    steps = _column("step", _pick(cols, STEP_NAMES, "step", source, True), source)
    loss = _column("loss", _pick(cols, LOSS_NAMES, "loss", source, True), source)
    lr = _pick(cols, LR_NAMES, "learning-rate", source, False)
    return steps, loss, None if lr is None else _column("lr", lr, source)


def check_log(steps, loss, learning_rate=None, *, source: str = "log") -> TrainingLog:
    """Check a log and compute its gradient-flow times (see `TrainingLog`).

    `learning_rate`: a positive number (constant `η`), an array with one rate per row (a
    schedule: `η_i` applies to the steps from row `i − 1` to row `i`), or `None` (`t = step`).

    **Raises:** `LvflowError` with one line naming the problem: not numeric, shapes, NaN or inf
    (with the first bad row), fewer than 10 points, steps not increasing, a loss `≤ 0`, a loss
    that ends above where it started (a rising or diverging run).
    """
    out = []
    for name, v in (("steps", steps), ("loss", loss)):
        a = np.asarray(v)
        if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
            raise LvflowError(f"{name}: not numeric (dtype {a.dtype})")
        if a.ndim != 1:
            raise LvflowError(f"{name}: expected one value per logged step, got shape {a.shape}")
        out.append(a.astype(float))
    steps, loss = out
    if steps.shape != loss.shape:
        raise LvflowError(f"loss: {loss.size} values for {steps.size} steps")
    for name, a in (("steps", steps), ("loss", loss)):
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            at = f"row {bad[0] + 1}" + (f" (step {steps[bad[0]]:g})" if name == "loss" else "")
            raise LvflowError(f"{name}: {bad.size} non-finite value(s) (NaN or inf), the first at {at}")
    if steps.size < MIN_POINTS:
        raise LvflowError(f"loss: only {steps.size} logged point(s); a fit needs at least {MIN_POINTS}")
    if steps[0] < 0:
        raise LvflowError(f"steps: must be >= 0, got {steps[0]:g} in row 1")
    dec = np.flatnonzero(np.diff(steps) <= 0)
    if dec.size:
        i = dec[0] + 1
        raise LvflowError(
            f"steps: must be strictly increasing; row {i + 1} (step {steps[i]:g}) follows step {steps[i - 1]:g}"
        )
    nonpos = np.flatnonzero(loss <= 0)
    if nonpos.size:
        i = nonpos[0]
        raise LvflowError(
            f"loss: must be positive (the fit is on ln loss); row {i + 1} (step {steps[i]:g}) is {loss[i]:g}"
        )
    n10 = max(1, steps.size // 10)
    first, last = float(np.median(loss[:n10])), float(np.median(loss[-n10:]))
    if last >= first:
        raise LvflowError(
            f"loss: rises from {first:.4g} to {last:.4g} over the log (medians of its first and last tenth); "
            "a rising or diverging run has no drops to fit"
        )
    lr_const = None
    if learning_rate is None:
        t = steps.copy()
    elif np.ndim(learning_rate) == 0:
        lr_const = float(learning_rate)
        if not (math.isfinite(lr_const) and lr_const > 0):
            raise LvflowError(f"learning_rate: must be finite and positive, got {learning_rate!r}")
        t = lr_const * steps
    else:
        eta = np.asarray(learning_rate, dtype=float)
        if eta.shape != steps.shape:
            raise LvflowError(f"learning_rate: {eta.size} values for {steps.size} steps")
        bad = np.flatnonzero(~(np.isfinite(eta) & (eta > 0)))
        if bad.size:
            raise LvflowError(f"learning_rate: must be finite and positive; row {bad[0] + 1} is {eta[bad[0]]:g}")
        if np.all(eta == eta[0]):
            lr_const = float(eta[0])
            t = lr_const * steps
        else:
            t = eta[0] * steps[0] + np.concatenate([[0.0], np.cumsum(eta[1:] * np.diff(steps))])
    if not 1e-150 < t[-1] < 1e150:  # rates 1/t and their logarithms stay far inside float64
        raise LvflowError(
            f"learning_rate: gradient-flow time t = η × step ends at {t[-1]:g}; lvflow fits logs whose "
            "last time lies between 1e-150 and 1e150 (rescale the steps or the learning rate)"
        )
    return TrainingLog(steps=steps, loss=loss, t=t, learning_rate=lr_const, source=source)


def rises(log: TrainingLog, sigma: float) -> str | None:
    """A warning when the loss climbs back by more than the noise after reaching a lower level
    (a spike, a divergence starting, a schedule's restart), else `None`."""
    y = np.log(log.loss)
    w = max(3, log.loss.size // 50)
    smooth = np.convolve(y, np.ones(w) / w, mode="valid")
    if smooth.size < 2:
        return None
    running_min = np.minimum.accumulate(smooth)
    climb = smooth - running_min
    i = int(np.argmax(climb))
    if climb[i] > max(3 * sigma, math.log(1.1)):
        step = log.steps[i + w // 2]
        return (
            f"loss: rises by {100 * math.expm1(climb[i]):.0f}% above its running minimum near step {step:g} "
            "(a spike, a divergence or a restart): the curve families only go down, read the fit with care"
        )
    return None
