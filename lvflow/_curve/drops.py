"""The drops of a loss curve, as a person reads them off the plot: plateaus, and the sudden drops
between them."""

from __future__ import annotations

import math

import equinox as eqx
import numpy as np
from jaxtyping import ArrayLike, Float

from .._core.errors import LvflowError
from .._core.validate import check_in_open_interval

# The end of a curve is a plateau when its drop rate is at most this fraction of the last peak.
_END_FLAT = 0.1


class LossDrops(eqx.Module):
    """The drops of a sampled loss curve `L(t)`, in time order.

    A *plateau* is a stretch where the loss changes slowest per e-fold of time: a local minimum
    of the drop rate `g = −dL/d ln t`. Between two plateaus lies one *drop*: a peak of `g`, or
    several peaks with no plateau between them (the rate between them never falls to `plateau`
    × the smaller peak). Each drop is described by the plateau levels on either side of it,
    read off the curve at the flattest point of each plateau (the first sample for the initial
    plateau, the last for the final one), and by the time the loss crosses the midpoint between
    them — what one reads off a training curve. Drops that remove less than `min_drop` of the
    curve's whole fall are left out.

    **Fields** (one entry per drop):

    - `t_mid`: the first time the loss crosses `½(loss_before + loss_after)` (linear
      interpolation in `ln t` between samples).
    - `loss_before`, `loss_after`: the plateau levels on either side.
    - `t_before`, `t_after`: where those levels were read: the drop lies in `(t_before, t_after]`.
    - `complete`: `False` for a last drop still under way at the curve's end: the drop rate
      there is above a tenth of that drop's peak (its `loss_after`
      is the last sample, not a plateau).
    """

    t_mid: Float[np.ndarray, " n"]
    loss_before: Float[np.ndarray, " n"]
    loss_after: Float[np.ndarray, " n"]
    t_before: Float[np.ndarray, " n"]
    t_after: Float[np.ndarray, " n"]
    complete: np.ndarray

    def __len__(self) -> int:
        return int(self.t_mid.shape[0])

    def containing(self, t: Float[ArrayLike, " K"]) -> np.ndarray:
        """For each time in `t`, the index of the drop whose span `(t_before, t_after]` holds
        it, or −1 (a time on a plateau, or outside the curve)."""
        t = np.asarray(t, dtype=float)
        out = np.full(t.shape, -1, dtype=int)
        for i in range(len(self)):
            inside = (t > self.t_before[i]) & (t <= self.t_after[i])
            out[inside & (out < 0)] = i
        return out


def loss_drops(
    ts: Float[ArrayLike, " T"],
    loss: Float[ArrayLike, " T"],
    *,
    plateau: float = 0.5,
    min_drop: float = 0.01,
) -> LossDrops:
    """The drops of the loss curve `loss` sampled at times `ts` (see `LossDrops`).

    **Arguments:**

    - `ts`: sample times, non-decreasing, at least two of them positive (the drop rate is taken
      per e-fold of time, `g = −dL/d ln t`; a sample at `t = 0` gives the initial level).
    - `loss`: the loss at those times (finite).
    - `plateau`: two peaks of `g` are separate drops when `g` between them falls to at most
      `plateau` × the smaller peak (the default ½: the loss falls at most half as fast there as
      in the drops on either side, a visible shoulder); in (0, 1).
    - `min_drop`: drops that remove less than this fraction of `loss[0] − min(loss)` are left
      out; in (0, 1).

    **Returns:** a `LossDrops`; empty when the curve does not fall.

    **Raises:** `LvflowError` for times that decrease, non-finite values or mismatched shapes.
    """
    t = np.asarray(ts, dtype=float)
    y = np.asarray(loss, dtype=float)
    if t.ndim != 1 or y.shape != t.shape:
        raise LvflowError(f"ts and loss must be 1-D of one length, got shapes {t.shape} and {y.shape}")
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(y))):
        raise LvflowError("ts and loss must be finite")
    if np.any(np.diff(t) < 0):
        raise LvflowError("ts must be non-decreasing")
    check_in_open_interval("plateau", plateau, 0.0, 1.0)
    check_in_open_interval("min_drop", min_drop, 0.0, 1.0)
    empty = np.zeros(0)
    none = LossDrops(empty, empty, empty, empty, empty, np.zeros(0, dtype=bool))
    pos = np.flatnonzero(t > 0)
    pos = pos[np.concatenate([[True], np.diff(t[pos]) > 0])] if pos.size else pos  # one sample per time
    total = float(y[0] - y.min())
    if pos.size < 2 or not total > 0:
        return none
    x, L, tp = np.log(t[pos]), y[pos], t[pos]
    g = -np.diff(L) / np.diff(x)  # the drop rate per e-fold, on the intervals between samples
    # a rate below `floor` cannot carry a drop of `min_drop` even spread over the whole curve:
    # such maxima (rounding on a plateau) are not peaks
    floor = 0.1 * min_drop * total / (x[-1] - x[0])
    peaks, valleys = _peak_groups(g, plateau, floor)
    if not peaks:
        return none
    # the plateaus: the flattest interval between neighbouring groups; before the first group and
    # after the last, the flattest interval there (none: the curve starts or ends inside a drop)
    first, last = peaks[0][0], peaks[-1][1]
    head = int(np.argmin(g[:first])) if first > 0 else None
    tail = last + 1 + int(np.argmin(g[last + 1 :])) if last + 1 < g.size else None
    # the curve has levelled off at its end only where it falls at most a tenth as fast as in the
    # last drop (a half-peak rate would still take several percent of that drop)
    ends_flat = tail is not None and g[tail] <= _END_FLAT * peaks[-1][2]
    sides = [head] + valleys + [tail if ends_flat else None]

    def level(k: int, before: bool) -> tuple[float, float]:
        v = sides[k]
        if v is None:  # the curve's first or last sample
            return (float(y[0]), float(t[0])) if before else (float(y[-1]), float(t[-1]))
        return 0.5 * float(L[v] + L[v + 1]), math.sqrt(tp[v] * tp[v + 1])

    rows = []
    for k in range(len(peaks)):
        (lb, tb), (la, ta) = level(k, True), level(k + 1, False)
        if lb - la >= min_drop * total:
            rows.append((_crossing(t, y, 0.5 * (lb + la), tb, ta), lb, la, tb, ta, k + 1 < len(peaks) or ends_flat))
    if not rows:
        return none
    col = lambda i: np.array([row[i] for row in rows])
    return LossDrops(col(0), col(1), col(2), col(3), col(4), col(5).astype(bool))


def _peak_groups(g: np.ndarray, plateau: float, floor: float) -> tuple[list[tuple[int, int, float]], list[int]]:
    """The peaks of `g` (local maxima above `floor`), merged until every valley between neighbouring groups is at most
    `plateau` × the smaller group's peak (the least separated pair first).

    Returns the groups, as (first peak, last peak, height), and the valleys between consecutive
    groups (the index of the flattest interval between them)."""
    n = g.size
    peaks = [i for i in range(n) if g[i] > floor and (i == 0 or g[i] >= g[i - 1]) and (i == n - 1 or g[i] > g[i + 1])]
    groups = [(p, p, float(g[p])) for p in peaks]
    valleys = [a + int(np.argmin(g[a : b + 1])) for a, b in zip(peaks[:-1], peaks[1:])]
    while valleys:
        ratios = [max(float(g[v]), 0.0) / min(groups[i][2], groups[i + 1][2]) for i, v in enumerate(valleys)]
        i = int(np.argmax(ratios))
        if ratios[i] <= plateau:
            break
        (a, _, ha), (_, b, hb) = groups[i], groups.pop(i + 1)
        groups[i] = (a, b, max(ha, hb))
        valleys.pop(i)
    return groups, valleys


def _crossing(t: np.ndarray, y: np.ndarray, level: float, t_lo: float, t_hi: float) -> float:
    """The first time in `[t_lo, t_hi]` at which `y` falls to `level` (linear in `ln t` between
    samples; linear in `t` next to `t = 0`)."""
    idx = np.flatnonzero((t >= t_lo) & (t <= t_hi))
    for a, b in zip(idx[:-1], idx[1:]):
        if y[a] > level >= y[b]:
            f = (y[a] - level) / (y[a] - y[b])
            if t[a] > 0:
                return float(math.exp(math.log(t[a]) + f * (math.log(t[b]) - math.log(t[a]))))
            return float(t[a] + f * (t[b] - t[a]))
    return math.nan
