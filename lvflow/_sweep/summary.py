"""A sweep's summary: the swept quantities against the parameters, as JSON and as a plot.

- **Plateau law.** The first switch-on time `t_first` against `ln(1/ε)`, one
  least-squares line per setting of the other swept parameters: as ε → 0 its slope tends to the
  first ε → 0 ignition time `tau_first` (`t*_k = τ*_k ln(1/ε) + O(1)`, Eq. 158/168).
- **Exponents.** For power-law spectra, the decay exponent the finite-ε staircase shows
  (`exponent_fit`) against Thm 9's `(α₁ − 1)/α₂` (`exponent`), per `(α₁, α₂)` and ε.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from .._workflow.io import PLOT_SUFFIXES, atomic_write_bytes, check_suffix
from .evaluate import DROP_COLUMNS
from .horizon import HORIZON_COLUMNS

_ROWS_IN_JSON = 10_000  # per-configuration rows in summary.json up to this many configurations
_FAILED_IN_JSON = 1000  # numbers of failed configurations listed in summary.json
_SERIES_IN_PLOT = 8
_NOT_SERIES = ("eps", "init_std", "width", "z0")  # what sets ε: the x axis, not a series


def _distinct(col: np.ndarray) -> np.ndarray:
    if np.issubdtype(col.dtype, np.floating):
        col = col[~np.isnan(col)]
    elif np.issubdtype(col.dtype, np.integer):
        col = col[col >= 0]
    else:
        col = col[col != ""]
    return np.unique(col)


def swept(res) -> dict[str, list]:
    """Parameters that take more than one value, with their values (at most 100 listed)."""
    out = {}
    for p in res.parameters:
        if p in res.columns:
            vals = _distinct(res.columns[p])
            if vals.size > 1:
                out[p] = vals[:100].tolist()
    return out


def _series(res, names: list[str]) -> list[tuple[dict[str, Any], np.ndarray]]:
    """Rows grouped by the values of `names` (each group: its values, its rows)."""
    if not names:
        return [({}, np.arange(len(res)))]
    keys = np.stack([res.columns[n].astype(str) for n in names], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    out = []
    for j in range(uniq.shape[0]):
        rows = np.flatnonzero(inv == j)
        out.append(({n: res.columns[n][rows[0]].item() for n in names}, rows))
    return out


def _fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    ok = np.isfinite(x) & np.isfinite(y)
    if np.count_nonzero(ok) < 2 or np.ptp(x[ok]) == 0:
        return math.nan, math.nan
    slope, icept = np.polyfit(x[ok], y[ok], 1)
    return float(slope), float(icept)


def summarize(res) -> dict[str, Any]:
    """The summary of a `SweepResult` as a JSON-ready dict: counts (`n_failed`: configurations whose
    solve failed, `failed`: the first 1000 of their numbers), swept parameters and ranges, the
    plateau law per series, the exponents per spectrum, and (up to 10⁴ configurations) one row of
    scalars per configuration (with curves, its drops: `n_drops`, `drop{j}_…`)."""
    c = res.columns
    n = len(res)
    sw = swept(res)
    failed = np.flatnonzero(~c["success"].astype(bool)) if n else np.zeros(0, dtype=np.int64)
    out: dict[str, Any] = {
        "n_configs": n,
        "complete": res.complete,
        "n_failed": int(failed.size),
        "failed": [int(i) for i in c["index"][failed[:_FAILED_IN_JSON]]] if n else [],
        "swept": sw,
        "ranges": {},
    }
    for q in ("t_first", "tau_first", "n_on", "exponent", "exponent_fit"):
        if q in c and n:
            v = c[q].astype(float)
            v = v[np.isfinite(v)]
            out["ranges"][q] = [float(v.min()), float(v.max())] if v.size else None
    others = [p for p in sw if p not in _NOT_SERIES]
    if n and _distinct(c["eps"]).size >= 2:
        law = []
        for vals, rows in _series(res, others)[:1000]:
            slope, icept = _fit_line(c["ln_inv_eps"][rows], c["t_first"][rows])
            tau = c["tau_first"][rows] if "tau_first" in c else np.full(rows.size, np.nan)
            law.append(
                {
                    **vals,
                    "n": int(rows.size),
                    "slope": slope,
                    "intercept": icept,
                    "tau_first": float(np.nanmean(tau)) if np.any(np.isfinite(tau)) else None,
                }
            )
        out["plateau_law"] = law
    if n and np.any(np.isfinite(c["exponent"])):
        power = np.isfinite(c["exponent"])
        names = [p for p in ("alpha1", "alpha2", "beta", "modes") if p in c]
        exps = []
        for vals, rows in _series(res, names):
            rows = rows[power[rows]]
            if rows.size == 0:
                continue
            order = rows[np.argsort(c["eps"][rows])]
            exps.append(
                {
                    **vals,
                    "predicted": float(c["exponent"][rows[0]]),
                    "fit": [[float(c["eps"][i]), float(c["exponent_fit"][i])] for i in order[:200]],
                }
            )
        out["exponents"] = exps
    if 0 < n <= _ROWS_IN_JSON:
        keys = [p for p in res.parameters if p in c] + ["eps", "modes"]
        keys += [q for q in ("t1", "success", "n_on", "t_first", "tau_first", "exponent", "exponent_fit") if q in c]
        keys += [q for q in DROP_COLUMNS if q in c]  # with curves
        keys += [q for q in HORIZON_COLUMNS if q in c]  # architectures on data
        keys = list(dict.fromkeys(["index"] + keys))
        out["rows"] = [{k: c[k][i].item() for k in keys} for i in range(n)]
    return out


def plot_summary(res, path) -> Path:
    """Two panels: the initial plateau `t_first` against `ln(1/ε)` (a line per setting of the other
    swept parameters, up to 8, with the ε → 0 prediction `tau_first · ln(1/ε)` dashed), and the
    exponents the finite-ε staircases show against Thm 9's (power-law spectra only)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    p = Path(path)
    fmt = check_suffix("plot", p, PLOT_SUFFIXES).lstrip(".")
    c = res.columns
    sw = swept(res)
    exps = len(res) > 0 and bool(np.any(np.isfinite(c["exponent"])))
    fig, axes = plt.subplots(1, 2 if exps else 1, figsize=(11 if exps else 5.5, 4.2), squeeze=False)
    ax = axes[0, 0]
    eps_swept = len(res) > 0 and _distinct(c["eps"]).size >= 2
    others = [q for q in sw if q not in _NOT_SERIES]
    if eps_swept:
        xname, x = "ln(1/ε)", c["ln_inv_eps"]
        series = _series(res, others)
    else:
        first = next(iter(others), None)
        xname = first or "configuration"
        x = c[first].astype(float) if first and c[first].dtype.kind in "fiu" else c["index"].astype(float)
        series = _series(res, others[1:])
    picked = series
    if len(series) > _SERIES_IN_PLOT:
        picked = [series[int(i)] for i in np.linspace(0, len(series) - 1, _SERIES_IN_PLOT)]
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(picked), 1)))
    for (vals, rows), col in zip(picked, colors):
        o = rows[np.argsort(x[rows])]
        label = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in vals.items()) or None
        ax.plot(x[o], c["t_first"][o], "o-", color=col, ms=3, lw=1, label=label)
        if eps_swept and "tau_first" in c:
            ax.plot(x[o], c["tau_first"][o] * x[o], "--", color=col, lw=0.8)
    ax.set_xlabel(xname)
    ax.set_ylabel("initial plateau t*₁ (first switch-on)")
    title = "plateau length; dashed: ε → 0, τ*₁ ln(1/ε)" if eps_swept else "first switch-on"
    if len(series) > len(picked):
        title += f" ({len(picked)} of {len(series)} series)"
    ax.set_title(title, fontsize=9)
    if any(v for v, _ in picked):
        ax.legend(fontsize=7)
    if exps:
        ax = axes[0, 1]
        m = np.isfinite(c["exponent"]) & np.isfinite(c["exponent_fit"])
        sc = ax.scatter(c["exponent"][m], c["exponent_fit"][m], c=c["ln_inv_eps"][m], s=10, cmap="viridis")
        if np.any(m):
            lo = float(min(c["exponent"][m].min(), c["exponent_fit"][m].min()))
            hi = float(max(c["exponent"][m].max(), c["exponent_fit"][m].max()))
            ax.plot([lo, hi], [lo, hi], "k:", lw=1, label="fit = Thm 9")
            ax.legend(fontsize=7)
        fig.colorbar(sc, ax=ax, label="ln(1/ε)")
        ax.set_xlabel("Thm 9: (α₁ − 1)/α₂")
        ax.set_ylabel("exponent of the finite-ε staircase")
        ax.set_title("loss exponents against the spectrum's", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=130)
    plt.close(fig)
    return atomic_write_bytes(p, buf.getvalue())
