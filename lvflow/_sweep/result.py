"""`SweepResult`, what `lvflow.sweep` returns, and `load_sweep`, which reads a sweep's directory back
in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import equinox as eqx
import numpy as np

from .._core.errors import LvflowError
from .._curve.drops import loss_drops
from .grid import Chunk
from .run import CURVE, PER_MODE, chunk_path, exists, read_chunk, read_manifest
from .summary import plot_summary, summarize


class SweepResult(eqx.Module):
    """A sweep's results: one row per configuration, in configuration order, as columns.

    **Columns** (`result["t_first"]`, `result.columns`):

    - the configuration: `index` (its number in the spec's order), every parameter given in the
      spec (files and Python values by name; NaN, −1 or "" where a configuration leaves it out),
      and as used: `eps` (also from `z0` or `init_std`/`width`), `modes` (K), `rho`;
    - per configuration: `t1` (the horizon), `success` (the ODE solve succeeded; always for a
      diagonal `C`), `num_steps`, `ln_inv_eps`, `n_on`, `t_first` (the first switch-on time `t*`:
      a mode at `ρ` of its final strength; the loss's first drop crosses its midpoint earlier,
      see `drops`),
      `t_last`, `steps_first`, `tau_first`, `exponent` (Thm 9) and `exponent_fit` (the finite-ε
      staircase's), as described in `lvflow.sweep`;
    - per mode, shape `(n, K)` in each system's own mode order (NaN-padded to the largest `K` when
      groups differ): `t_star`, `tau_star`, `plateau_loss`, `z_inf`, `r`, `V`;
    - with `curve=True`, shape `(n, T)`: `ts` and `excess_loss` (`predict`'s time grid); then
      `drops(i)` gives configuration `i`'s drops as `predict`'s drops table, and per configuration
      `n_drops` (how many drops its curve has) and, for the first three drops `j = 1, 2, 3` (NaN,
      or False, where it has fewer), `drop{j}_t` (when the loss crosses the midpoint between the
      plateaus on either side), `drop{j}_step` (`drop{j}_t/η`), `drop{j}_excess_loss_before`,
      `drop{j}_excess_loss_after` (the excess loss on those plateaus) and `drop{j}_complete`
      (False: still falling at `t1`): the numbers `drops(i)` gives;
    - for a sweep with an architecture on data: `horizon_t`, `horizon_step`, `horizon_floor_t`,
      `predict`'s validity horizon for the configuration (`lvflow._sweep.horizon.horizon_columns`;
      NaN for the other systems).

    **Fields:** `columns`, `out` (the directory, or `None` for an in-memory sweep), `complete`
    (every chunk present), `stats` (chunks and configurations evaluated and skipped by this call,
    seconds, devices, processes).
    """

    columns: dict[str, np.ndarray]
    stats: dict[str, Any]
    out: str | None = eqx.field(static=True)
    complete: bool = eqx.field(static=True)
    parameters: tuple[str, ...] = eqx.field(static=True)

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.columns[name]
        except KeyError:
            raise KeyError(f"{name!r}: no such column; columns: {', '.join(self.columns)}") from None

    def __len__(self) -> int:
        return int(self.columns["index"].shape[0]) if "index" in self.columns else 0

    def keys(self) -> list[str]:
        return list(self.columns)

    def row(self, i: int) -> dict[str, Any]:
        """Configuration `i` and its results as plain Python values (per-mode arrays as lists,
        padding dropped)."""
        pos = int(np.searchsorted(self.columns["index"], i))
        if pos >= len(self) or self.columns["index"][pos] != i:
            raise KeyError(f"configuration {i} is not in this result")
        K = int(self.columns["modes"][pos])
        T = int(np.count_nonzero(np.isfinite(self.columns["ts"][pos]))) if "ts" in self.columns else 0
        out: dict[str, Any] = {}
        for k, v in self.columns.items():
            x = v[pos]
            if k in PER_MODE:
                out[k] = x[:K].tolist()
            elif k in CURVE:
                out[k] = x[:T].tolist()
            else:
                out[k] = x.item() if isinstance(x, (np.ndarray, np.generic)) else x
        return out

    def drops(self, i: int):
        """The drops of configuration `i`'s excess-loss curve, as `predict`'s drops table reads them
        (`loss_drops`: plateau to plateau, timed where the loss crosses their midpoint).

        **Raises:** `LvflowError` when the sweep kept no curves (run it with `curve=True`);
        `KeyError` for a configuration not in this result.
        """
        if "ts" not in self.columns:
            raise LvflowError("drops: this sweep kept no curves; run it with curve=True (--curve)")
        row = self.row(i)
        return loss_drops(np.asarray(row["ts"]), np.asarray(row["excess_loss"]))

    def summary(self) -> dict[str, Any]:
        """The swept quantities against the parameters (see `lvflow.sweep`), as a JSON-ready dict."""
        return summarize(self)

    def plot(self, path) -> Path:
        """The summary plot (initial plateau against ln(1/ε), fitted against predicted exponents),
        written atomically (`.png`, `.pdf` or `.svg`)."""
        return plot_summary(self, path)


class Assembler:
    """Chunk tables into one table in configuration order, written in place into columns allocated
    once for all `n` configurations (no concatenation: one copy of the results in memory, not two).
    Per-mode and curve columns are NaN-padded to `widths` (the largest `K`, the longest curve)."""

    def __init__(self, n: int, widths: dict[str, int]):
        self.n, self.widths = n, widths
        self.cols: dict[str, np.ndarray] = {}
        self.text: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.covered = np.zeros(n, dtype=bool)

    def add(self, t: dict[str, np.ndarray]) -> None:
        rows = t["index"]
        if rows.size and rows[-1] - rows[0] + 1 == rows.size and np.all(np.diff(rows) == 1):
            at = slice(int(rows[0]), int(rows[-1]) + 1)
        else:
            at = rows
        self.covered[rows] = True
        for k, v in t.items():
            if v.dtype.kind in "US":  # names: small, joined at the end (their widths differ)
                self.text.setdefault(k, []).append((rows, v))
                continue
            a = self.cols.get(k)
            if a is None:
                shape = (self.n, self.widths.get(k, int(v.shape[1]))) if v.ndim == 2 else (self.n, *v.shape[1:])
                a = self.cols[k] = np.empty(shape, dtype=np.float64 if v.ndim == 2 else v.dtype)
            if v.ndim == 2 and v.shape[1] < a.shape[1]:
                a[at, : v.shape[1]] = v
                a[at, v.shape[1] :] = np.nan
            else:
                a[at] = v

    def result(self) -> dict[str, np.ndarray]:
        cols = dict(self.cols)
        for k, parts in self.text.items():
            out = np.zeros(self.n, dtype=max((v.dtype for _, v in parts), key=lambda d: d.itemsize))
            for rows, v in parts:
                out[rows] = v
            cols[k] = out
        if not self.covered.all():
            cols = {k: v[self.covered] for k, v in cols.items()}
        return cols


def load_sweep(out, *, partial: bool = False) -> SweepResult:
    """Read a sweep's directory back: `lvflow.load_sweep("DIR")["t_first"]`.

    Checks every chunk against the manifest: each configuration once, none missing (unless
    `partial=True`, which returns the chunks present).

    **Raises:** `LvflowError` if `out` is not a sweep directory, a chunk is unreadable or holds other
    configurations than the manifest says, or (without `partial`) chunks are missing.
    """
    out = Path(out)
    m = read_manifest(out)
    if m is None:
        raise LvflowError(f"out: {out} holds no sweep (no manifest.json)")
    K = max(int(g["modes"]) for g in m["groups"])
    T = max(2 * int(g["curve_points"]) - 1 for g in m["groups"])
    asm = Assembler(int(m["n_configs"]), {**dict.fromkeys(PER_MODE, K), **dict.fromkeys(CURVE, max(T, 0))})
    missing = 0
    for c in m["chunks"]:
        p = chunk_path(out, Chunk(int(c["id"]), int(c["group"]), np.zeros(0)))
        if not exists(p):
            missing += 1
            continue
        try:
            t = read_chunk(p)
        except (OSError, ValueError) as e:
            raise LvflowError(f"out: chunk {p.name} is unreadable ({e}); delete it and rerun the sweep") from None
        if t["index"].shape[0] != c["n"] or int(t["index"][0]) != c["first_index"]:
            raise LvflowError(f"out: chunk {p.name} does not hold the configurations the manifest lists")
        if np.any(asm.covered[t["index"]]):
            raise LvflowError(f"out: {out} holds a configuration twice (chunk {p.name})")
        asm.add(t)
    if missing and not partial:
        raise LvflowError(
            f"out: {missing} of {len(m['chunks'])} chunks are missing in {out}; rerun the same sweep to finish it "
            "(or load_sweep(..., partial=True))"
        )
    cols = asm.result() if asm.covered.any() else {}
    if not missing and cols and not np.array_equal(cols["index"], np.arange(m["n_configs"])):
        raise LvflowError(f"out: {out}'s chunks do not cover configurations 0…{m['n_configs'] - 1} exactly once")
    params = tuple(m.get("options", {}).get("parameters", ()))
    return SweepResult(cols, {"chunks_missing": missing}, str(out), missing == 0, params)
