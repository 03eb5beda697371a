"""The shared look of lvflow's figures: colours, fonts, sizes, saving (PNG + PDF) and the JSON
summary beside each figure. Every figure module draws through these helpers so the set reads
as one paper: modes keep their colour across panels, measured curves are solid, theory dashed
black, predicted event times dotted grey verticals."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import matplotlib

matplotlib.use("Agg")  # files only: no display needed, and no GUI import cost

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .._schedule.scaling import fit_power_law  # noqa: E402
from .._workflow.io import save_json  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

#: Measured curves (GD, the trained network): solid. Theory: these styles.
THEORY = dict(color="black", ls="--", lw=1.1)
PREDICTED_TIME = dict(color="0.45", ls=":", lw=1.0)
FIT = dict(color="tab:red", ls="-", lw=2.2, alpha=0.75)
NETWORK_WIDTH = 1.8

_RC: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 7.5,
    "legend.frameon": False,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
    "lines.linewidth": 1.6,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "pdf.fonttype": 42,  # embed TrueType: editable text in the PDF
}


def mode_colors(n: int) -> list:
    """`n` distinct colours for modes / samples ranked by ignition order (early = dark)."""
    cmap = plt.get_cmap("viridis")
    if n <= 1:
        return [cmap(0.1)]
    return [cmap(0.05 + 0.85 * i / (n - 1)) for i in range(n)]


@contextlib.contextmanager
def style():
    """Matplotlib settings of every lvflow figure, restored on exit."""
    with plt.rc_context(_RC):
        yield


def subplots(ncols: int = 1, nrows: int = 1, *, width: float = 3.4, height: float = 2.8, **kw):
    """A figure of `nrows × ncols` panels of `width × height` inches each."""
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), constrained_layout=True, **kw)


def panel_label(ax, text: str) -> None:
    """Bold panel letter in the top-left corner, outside the axes."""
    ax.text(-0.14, 1.04, text, transform=ax.transAxes, fontweight="bold", fontsize=11, va="bottom")


def save(fig, out: Path, name: str) -> list[Path]:
    """Write `name.png` and `name.pdf` into `out` (created if needed); close the figure."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for p in paths:
        fig.savefig(p)
    plt.close(fig)
    return paths


def write_summary(out: Path, name: str, summary: Mapping[str, Any]) -> Path:
    """Write the quantities the figure shows to `name.json` (atomically)."""
    return save_json(Path(out) / f"{name}.json", summary)  # numpy → JSON, non-finite → null


def claim(text: str, holds: bool | None, criterion: str, *, verdict: str | None = None, **measured) -> dict:
    """One claim the paper makes about a figure, as its summary reports it: the claim in the
    paper's words, whether it `holds` here (`None`: not tested, the run cannot show it), the
    `criterion` applied, the numbers `measured`, and a one-line `verdict` (default "holds",
    "fails" or "not tested"). Where the verdict turns on a threshold or a run length of ours,
    the figure passes a `verdict` that says so: the measured number and the range of our choice
    over which the claim holds."""
    holds = None if holds is None else bool(holds)
    if verdict is None:
        verdict = "not tested" if holds is None else ("holds" if holds else "fails")
    return {"claim": text, "holds": holds, "verdict": verdict, "criterion": criterion, "measured": measured}


def band(
    ax, x, runs, color, *, label=None, lw: float = NETWORK_WIDTH, ls="-", alpha: float = 0.22, log=False, line=True
):
    """The mean of `runs` (axis 0: independent runs) as a line (unless `line=False`), with a ±1 std
    band (the paper's Fig 6 bands). With `log`, mean and std are of `ln runs` (geometric mean,
    multiplicative band), which keeps the band positive on a log axis."""
    runs = np.asarray(runs, float)
    if log:
        mu, sd = np.mean(np.log(runs), axis=0), np.std(np.log(runs), axis=0)
        mid, lo, hi = np.exp(mu), np.exp(mu - sd), np.exp(mu + sd)
    else:
        mu, sd = np.mean(runs, axis=0), np.std(runs, axis=0)
        mid, lo, hi = mu, mu - sd, mu + sd
    ax.fill_between(x, lo, hi, color=color, alpha=alpha, lw=0, label=None if line else label)
    return ax.plot(x, mid, color=color, lw=lw, ls=ls, label=label) if line else None


def rel_err(measured, predicted):
    """`|measured − predicted| / |predicted|`, elementwise."""
    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    return np.abs(m - p) / np.abs(p)


def crossing_time(t, y, level, *, log: bool = True) -> float:
    """First time the curve `y(t)` crosses `level` (from either side), interpolated linearly
    (in `ln y` if `log`). NaN if it never does."""
    t = np.asarray(t, float)
    y = np.asarray(y, float)
    f = (np.log(y) - math.log(level)) if log else (y - level)
    s = np.sign(f)
    idx = np.flatnonzero(s[:-1] != s[1:])
    if idx.size == 0:
        return float("nan")
    i = int(idx[0])
    if f[i + 1] == f[i]:
        return float(t[i])
    return float(t[i] + (t[i + 1] - t[i]) * f[i] / (f[i] - f[i + 1]))


def local_exponents(t, E, window: tuple[float, float], n: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The decay exponent of `E(t)` fitted (`fit_power_law`) on each of `n` equal log-time parts of
    `window`: the local exponent `κ_eff(t)` of App. C (Eq. 295) as the figures measure it.
    Returns the parts' geometric centres and their exponents, each `(n,)`."""
    edges = np.geomspace(window[0], window[1], n + 1)
    parts = list(zip(edges[:-1], edges[1:]))
    t, E = np.asarray(t, float), np.asarray(E, float)
    slopes = [fit_power_law(t, E, window=(float(a), float(b))).exponent for a, b in parts]
    return np.sqrt(edges[:-1] * edges[1:]), np.asarray(slopes, float)


def increasing(values) -> bool:
    """Whether `values` increase strictly from each entry to the next."""
    return bool(np.all(np.diff(np.asarray(values, float)) > 0))
