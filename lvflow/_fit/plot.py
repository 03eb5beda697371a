"""`plot_fit`: observed, fitted and extrapolated loss with the band and the predicted drops."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from .._workflow.io import PLOT_SUFFIXES, atomic_write_bytes, check_suffix

_MAX_MARKS = 12


def plot_fit(result, path, *, title: str | None = None) -> Path:
    """Two panels, the loss against the step in log and in linear steps: the fitted part of the
    log, the held-out rest (grey), the fitted curve (solid) and its extrapolation (dashed) with
    the band of `result.level`, the last fitted step, and each drop's step with its interval;
    the alternative scenario's curve (dash-dotted) when the result has one. Written atomically.

    **Raises:** `LvflowError` for a file type other than `.png`, `.pdf`, `.svg`.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    p = Path(os.fspath(path))
    fmt = check_suffix("plot", p, PLOT_SUFFIXES).lstrip(".")
    lg = result.log
    seen = lg.steps <= result.fit_until
    c = result.curve
    cs, cl, lo, hi = (np.asarray(c[k]) for k in ("step", "loss", "lo", "hi"))
    inside = cs <= result.fit_until
    d = result.drops
    pct = f"{100 * result.level:g}%"
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.0), constrained_layout=True)
    for ax, logx in zip(axes, (True, False)):
        keep = (lg.steps > 0) if logx else np.ones(lg.steps.shape, bool)
        ckeep = (cs > 0) if logx else np.ones(cs.shape, bool)
        ax.plot(lg.steps[keep & seen], lg.loss[keep & seen], ".", ms=2.5, color="C0", label="observed (fitted)")
        if np.any(~seen):
            ax.plot(
                lg.steps[keep & ~seen], lg.loss[keep & ~seen], ".", ms=2.5, color="0.6", label="observed (held out)"
            )
        ax.fill_between(cs[ckeep], lo[ckeep], hi[ckeep], color="C1", alpha=0.25, lw=0, label=f"{pct} band")
        ax.plot(cs[ckeep & inside], cl[ckeep & inside], color="C1", lw=1.6, label="fit")
        out = ckeep & (cs >= result.fit_until)
        ax.plot(cs[out], cl[out], color="C1", lw=1.6, ls="--", label="extrapolation")
        alt = result.alternative
        if alt is not None:
            a_s, a_l = np.asarray(alt.curve["step"]), np.asarray(alt.curve["loss"])
            a_keep = (a_s > 0) if logx else np.ones(a_s.shape, bool)
            ax.plot(a_s[a_keep], a_l[a_keep], color="C2", lw=1.2, ls="-.", label=f"alternative: {alt.describe()}")
        ax.axvline(result.fit_until, color="k", lw=0.8, ls=":", label="end of the fitted part")
        for i in range(min(np.size(d["step"]), _MAX_MARKS)):
            if not (logx and d["step"][i] <= 0):
                col = "C3" if d["future"][i] else "0.5"
                ax.axvline(d["step"][i], color=col, lw=0.7, ls="--")
                if d["future"][i]:
                    y = d["loss_after"][i] if d["loss_after"][i] > 0 else d["loss_before"][i]
                    lo_s = max(d["step_lo"][i], cs[ckeep][0])
                    hi_s = min(d["step_hi"][i], cs[-1])
                    ax.plot([lo_s, hi_s], [y, y], color="C3", lw=2.5, alpha=0.7)
        ax.plot([], [], color="C3", lw=2.5, alpha=0.7, label=f"next drops, {pct} interval")
        ax.set_yscale("log")
        if logx:
            ax.set_xscale("log")
        finite = lg.loss[keep]
        ax.set_ylim(max(min(finite.min(), cl[ckeep].min()) / 3, finite.max() * 1e-12), finite.max() * 2)
        ax.set_xlabel("training step")
        ax.set_ylabel("loss")
        ax.set_title(("log" if logx else "linear") + " steps", fontsize=10)
    axes[0].legend(fontsize=7.5, loc="lower left")
    fig.suptitle(title or f"lvflow fit: {lg.source} ({result.describe()})", fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=120)
    plt.close(fig)
    return atomic_write_bytes(p, buf.getvalue())
