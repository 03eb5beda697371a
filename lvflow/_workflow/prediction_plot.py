"""`plot_prediction`: the predicted loss curve of a `Prediction`, in linear and log time, with its
drops (midpoint crossings, as in the drops table), the ε → 0 staircase (Eq. 168) and Thm 9's slope
marked; for the M-flow, the loss floor and each direction's input side as a picture; with a
validity horizon (`PredictionHorizon`), the part beyond it shaded.

The drawing (`draw`) takes plain numpy arrays (`plot_data`) and imports neither JAX nor the rest of
lvflow, so that the CLI can run it in a process started before JAX is imported (`plot_worker`)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import plot_worker
from .io import PLOT_SUFFIXES, atomic_write_bytes, check_suffix

if TYPE_CHECKING:
    from .prediction import Prediction

_MAX_MARKS = 12
_MAX_PICTURES = 8


def plot_prediction(pred: Prediction, path, *, title: str | None = None) -> Path:
    """Two panels: excess loss vs time (linear) and vs time (log), the drops marked (and the part
    beyond the validity horizon shaded); drawn
    by the CLI's plot process where one was started (`plot_worker`), else here.

    **Raises:** `LvflowError` for a file type other than `.png`, `.pdf`, `.svg`.
    """
    return plot_worker.render(plot_data(pred, title=title), path)


def check_plot_path(path) -> str:
    """The file type of `path` (`png`, `pdf` or `svg`).

    **Raises:** `LvflowError` for any other.
    """
    return check_suffix("plot", path, PLOT_SUFFIXES).lstrip(".")


def plot_data(pred: Prediction, *, title: str | None = None) -> dict[str, Any]:
    """What `draw` needs from a `Prediction`, as numpy arrays and Python scalars (picklable without JAX)."""
    steps = pred.learning_rate is not None
    flow = pred.matrix is not None  # the matrix flow: the loss of M, not the gLV's excess
    xs = np.asarray(pred.drops.t_mid) / (pred.learning_rate or 1.0)  # the drops, as the table gives them
    pictures, floor = [], math.nan
    if pred.matrix is not None:
        pictures = [
            np.asarray(r["input_direction"]) for r in pred.direction_rows() if np.ndim(r.get("input_direction", 0)) == 2
        ]
        floor = float(pred.matrix.loss_floor)
    limit = not flow and pred.limit_tau is not None
    return dict(
        steps=steps,
        flow=flow,
        x=np.asarray(pred.steps if steps else pred.ts),
        xs=xs,
        y=np.asarray(pred.loss if flow else pred.excess_loss),
        y_drops=np.asarray(pred.drops_of.curve(pred)),
        drops_label=pred.drops_of.label,
        pictures=pictures[:_MAX_PICTURES],
        loss_floor=floor,
        exponent=float(pred.exponent),
        limit_t=np.asarray(pred.limit_tau) * math.log(1 / pred.eps) / (pred.learning_rate or 1.0) if limit else None,
        limit_excess=np.asarray(pred.limit_excess) if limit else None,
        title=title or f"{pred.source}  (eps = {pred.eps:.3g})",
        horizon=math.nan if pred.horizon is None else pred.horizon.t / (pred.learning_rate or 1.0),
    )


def warm_up() -> None:
    """Draw a figure like `draw`'s on made-up data into memory (imports matplotlib, loads the fonts,
    exercises the log axes, legend and staircase), for a plot process that waits for its data."""
    t = np.geomspace(1e-2, 1e4, 200)
    excess = 0.1 / (1 + (t / 10) ** 2)
    _figure_bytes(
        dict(
            steps=True,
            flow=False,
            x=t,
            xs=np.array([10.0, 100.0]),
            y=excess,
            y_drops=excess,
            drops_label="excess loss",
            pictures=[],
            loss_floor=math.nan,
            exponent=1.0,
            limit_t=np.array([10.0, 100.0]),
            limit_excess=np.array([0.1, 0.05, 0.0]),
            title="warm-up",
        ),
        "png",
    )


def draw(data: dict[str, Any], path) -> Path:
    """Draw `plot_data`'s output and write it to `path` atomically (its suffix gives the format).

    **Raises:** `LvflowError` for a file type other than `.png`, `.pdf`, `.svg`.
    """
    p = Path(path)
    return atomic_write_bytes(p, _figure_bytes(data, check_plot_path(p)))


def _figure_bytes(data: dict[str, Any], fmt: str) -> bytes:
    """The figure of `draw`, encoded as `fmt`."""
    # matplotlib is imported here only (computing a prediction does not need it), and without
    # pyplot: a figure drawn straight onto an Agg canvas needs no GUI backend and imports less.
    from matplotlib.figure import Figure

    steps, flow, x, xs, y, pictures = (data[k] for k in ("steps", "flow", "x", "xs", "y", "pictures"))
    ylabel = "loss" if flow else "excess loss"
    # fixed margins: constrained layout measured every tick label again (~1 s of a 2 s plot)
    n_pic = len(pictures)
    fig = Figure(figsize=(10, 3.8 + (1.6 if n_pic else 0.0)))
    if n_pic:
        grid = fig.add_gridspec(2, max(n_pic, 2), height_ratios=(3.8, 1.6), hspace=0.5)
        axes = [fig.add_subplot(grid[0, : max(n_pic, 2) // 2]), fig.add_subplot(grid[0, max(n_pic, 2) // 2 :])]
        for i, pic in enumerate(pictures[:n_pic]):
            ax = fig.add_subplot(grid[1, i])
            lim = float(np.max(np.abs(pic))) or 1.0
            ax.imshow(pic, cmap="RdBu_r", vmin=-lim, vmax=lim)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"direction {i + 1}: input side", fontsize=8)
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.04, top=0.9, wspace=0.22)
    else:
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.85, wspace=0.22)
        axes = fig.subplots(1, 2)
    for ax, logx in zip(axes, (False, True)):
        # The linear panel shows the quantity the drops table is read off, on a linear scale (the
        # drops are falls of the loss itself); the log panel the excess loss on log-log axes.
        keep = x > 0 if logx else np.ones_like(x, bool)
        yk, label = (y, ylabel) if logx else (data["y_drops"], data["drops_label"])
        # Floor the log axis ten decades below the start: the tail's 1e-300 says nothing.
        floor = max(float(np.nanmax(np.abs(yk))) if yk.size else 1.0, np.finfo(float).tiny) * 1e-8 if logx else -np.inf
        ax.plot(x[keep], np.maximum(yk[keep], floor), lw=1.8, label=f"predicted {label}")
        if flow and np.isfinite(data["loss_floor"]):
            ax.axhline(data["loss_floor"], color="C2", lw=0.9, ls=":", label="least loss over the features")
        for t in xs[np.isfinite(xs)][:_MAX_MARKS]:  # more would hide the curve
            ax.axvline(t, color="0.6", lw=0.8, ls="--")
        fin = xs[np.isfinite(xs) & (xs > 0)]
        if logx and np.isfinite(data["exponent"]) and fin.size >= 2:
            # Thm 9's slope −(α₁−1)/α₂, anchored on the curve midway (in log t) through the drops.
            tm = math.sqrt(fin[0] * fin[-1])
            ym = float(np.interp(math.log(tm), np.log(x[keep]), y[keep]))
            tt = np.geomspace(fin[0], fin[-1], 20)
            ax.plot(
                tt,
                ym * (tt / tm) ** -data["exponent"],
                color="k",
                lw=0.9,
                ls="-.",
                label=f"slope −{data['exponent']:.3g} (Thm 9)",
            )
        if data["limit_t"] is not None:
            # The ε → 0 staircase (plateau_schedule, Eq. 168 for diagonal C), from its own events in
            # time order (the table's rows follow this ε's switch-on order, which may differ).
            tev, lev = data["limit_t"], data["limit_excess"]
            tu = np.unique(tev)
            levels = np.concatenate([lev[:1], lev[np.searchsorted(tev, tu, side="right")]])
            edges = np.clip(np.concatenate([[x[keep][0]], tu, [x[-1]]]), x[keep][0], x[-1])
            shift = 0.0 if logx else float(np.nanmedian(data["y_drops"] - y))  # loss = excess + final loss
            ax.stairs(
                np.maximum(levels, floor) + shift,
                edges,
                color="C1",
                lw=1.2,
                ls=":",
                label="ε → 0 limit (plateau_schedule)",
                baseline=None,
            )
        h = data.get("horizon", math.nan)
        if math.isfinite(h) and h < x[-1] and (h > 0 or not logx):
            ax.axvspan(h, x[-1], color="0.5", alpha=0.15, lw=0, label="beyond the NQF's validity horizon (Thm 13)")
        fin_all = xs[np.isfinite(xs)]
        if not logx and fin_all.size and x[-1] > 20 * fin_all.max() > 0:
            ax.set_xlim(0.0, 3 * fin_all.max())  # a t1 far past the dynamics would flatten this panel
        ax.legend(fontsize=8, loc="lower left" if logx else "upper right")
        if logx:
            ax.set_yscale("log")
            ax.set_xscale("log")
        # no minor ticks on the log axes: they are most of the drawing time, and carry no label
        ax.minorticks_off()
        ax.set_xlabel("training step" if steps else "time t (gradient flow)")
        ax.set_ylabel(ylabel if logx else data["drops_label"])
        ax.set_title(
            ("log-log" if logx else "linear")
            + "; dashed: the drops (halfway between plateaus)"
            + (f" (first {_MAX_MARKS})" if np.count_nonzero(np.isfinite(xs)) > _MAX_MARKS else ""),
            fontsize=10,
        )
    fig.suptitle(data["title"], fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=120)
    return buf.getvalue()
