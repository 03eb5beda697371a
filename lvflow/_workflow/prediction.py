"""`Prediction`, the result of `predict`: the plateau table, the predicted loss curve, and their
text, JSON and `.npz` forms."""

from __future__ import annotations

import dataclasses
import enum
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._core.errors import LvflowError
from .._core.validate import to_jax
from .._curve.drops import LossDrops
from .io import save_json, save_npz, to_json
from .predict_horizon import PredictionHorizon, horizon_line
from .prediction_plot import plot_prediction

if TYPE_CHECKING:
    from .._form.drops import MatrixDrops  # imports diffrax: only the matrix flow builds one


class DropsOf(enum.StrEnum):
    """The curve `Prediction.drops` is read off: the loss, or the excess loss where the final loss
    (`y2`) is unknown. A member equals its string (`"loss"`, `"excess_loss"`); any other string is
    refused with an `LvflowError` naming `drops_of`."""

    LOSS = "loss"
    EXCESS_LOSS = "excess_loss"

    @property
    def label(self) -> str:
        """The curve in words: `"loss"` or `"excess loss"`."""
        return self.value.replace("_", " ")

    def curve(self, pred: Prediction) -> Float[Array, " T"]:
        """This curve of `pred`: `pred.loss` or `pred.excess_loss`."""
        return pred.loss if self is DropsOf.LOSS else pred.excess_loss

    @classmethod
    def _missing_(cls, value):
        raise LvflowError(f"drops_of: 'loss' or 'excess_loss', got {value!r}")


class Prediction(eqx.Module):
    """What `predict` returns: the predicted loss curve, its drops, and the directions that switch on.

    **Drops and directions.** A *drop* is what the loss curve shows: a fall from one plateau to
    the next (`loss_drops`), timed where the loss crosses the midpoint between them (`table`,
    `drop_rows`). A *direction* is a mode of the gLV (or a direction of `M` for the matrix flow)
    with its own switch-on time `t*` — when its strength reaches `ρ` of its final value, not when
    the loss drops (`direction_table`, `direction_rows`). Directions that switch on too close
    together for a plateau between them share one drop (`drop_members`).

    **Rows.** The per-mode arrays (`r`, `C_diag`, `V`, `t_star`, `tau_star`, `plateau_loss`,
    `drop`, `steps_star`) are in *switch-on order*, not the input's mode order: row `i` is mode
    `order[i]` (0-based). `by_mode(name)` gives any of them in the input's order. Modes that
    never switch on (they only decay, or are not on before `t1`) come last with `t*_k = inf`.
    `c` and `z_inf` are in the input's order.

    **Fields:**

    - `method`: `"lv"` (reduced to the gLV, Eq. 32), `"matrix_flow"` (the full M-flow, Eq. 28,
      used when the structure matrices do not commute; no per-mode table then) or `"matrix_gd"`
      (the same with a learning rate: GD's exact map of `M`, Thm 2, so steps are GD's own).
    - `eps`, `c`, `rho`, `learning_rate`, `t1`: the initial scale `z_k0 = ε c_k`, the switch-on
      fraction `ρ`, the learning rate `η` (steps = t/η; `None` if not given), and the horizon
      (`c` in input order; one entry, `M0 = ε c I`, for the matrix flow).
    - `order`: the input index of the mode in each row.
    - `r`, `C_diag`, `V`: per row `r_k`, `C_kk` and `V_k = r_k²/(8 C_kk)`, the loss mode `k` would
      remove *alone* (an isolated mode, Thm 6). With a coupled `C` the `V_k` need not add up to the
      total drop; the drops this run makes are `drop`.
    - `t_star`: finite-ε switch-on times: the first time `z_k` reaches `ρ z_k(∞)`, from the ODE
      solve (0 for a mode that starts above it and grows; inf for a mode that only decays,
      `z_k(∞) ≤ z_k0`; for a mode later switched off by a competitor, `z_k(∞) = 0`, `ρ` × the
      plateau it switches on to); `steps_star = t_star/η`.
    - `tau_star`: ε → 0 ignition times in `τ = t/ln(1/ε)` (`1/r_k` for diagonal `C`, Eq. 168).
    - `plateau_loss`: the excess loss (over the final loss) on the plateau just before each mode
      switches on, at this ε: the saturated equilibrium restricted to the modes switched on in the
      rows above (`Σ_{j ignites later} V_j` for diagonal `C`, Eq. 168); non-increasing down the
      table. NaN for modes that never switch on.
    - `eps_merge`: for consecutive rows, the ε above which their drops overlap (Eq. 158's times for
      isolated modes; see `predict`).
    - `exponent`: the predicted loss exponent `(α₁−1)/α₂` (Thm 9) for a power-law spectrum, else NaN.
    - `ts`, `loss`, `excess_loss`: the predicted curve (loss is NaN where `y2` is unknown).
    - `drop`: per row, the excess loss that switch-on removes at this ε (`plateau_loss` minus the
      next plateau's); the drops add up to the total drop. NaN for modes that never switch on.
    - `limit_tau`, `limit_excess`: the ε → 0 staircase (`plateau_schedule`): event times in `τ`
      and the excess loss before the first event and after each (`n + 1` levels).
    - `notes`: human-readable remarks (fallbacks taken, modes that do not switch on, warnings).
    - `drops`: the drops of the predicted curve (`LossDrops`, read off `loss`, or `excess_loss`
      when `y2` is unknown: `drops_of`, a `DropsOf`, says which).
    - `matrix`: for the matrix flow, its directions (`MatrixDrops`: the directions of `M` that
      switch on, when, and how strong); `None` for the gLV.
    - `input_shape`: the shape of the input side of a direction (its first entries; the rest is
      the output side), when the architecture is known; `None` otherwise.
    - `horizon`: the validity horizon (`PredictionHorizon`: up to when the NQF describes the
      network, Thm 13) when `predict` was given the network, and it is not exactly its NQF;
      `None` otherwise.
    """

    method: str = eqx.field(static=True)
    source: str = eqx.field(static=True)
    eps: float = eqx.field(static=True)
    rho: float = eqx.field(static=True)
    learning_rate: float | None = eqx.field(static=True)
    t1: float = eqx.field(static=True)
    exponent: float = eqx.field(static=True)
    notes: tuple[str, ...] = eqx.field(static=True)
    c: Float[Array, " Kc"]  # K entries, or one for the matrix flow
    order: Int[Array, " K"]
    r: Float[Array, " K"]
    C_diag: Float[Array, " K"]
    V: Float[Array, " K"]
    t_star: Float[Array, " K"]
    tau_star: Float[Array, " K"]
    plateau_loss: Float[Array, " K"]
    eps_merge: Float[Array, " Km1"]
    z_inf: Float[Array, " K"]
    ts: Float[Array, " T"]
    loss: Float[Array, " T"]
    excess_loss: Float[Array, " T"]
    drops: LossDrops
    drops_of: DropsOf = eqx.field(static=True, converter=DropsOf)
    drop: Float[Array, " K"] | None = None
    limit_tau: Float[Array, " n"] | None = None
    limit_excess: Float[Array, " n+1"] | None = None
    matrix: MatrixDrops | None = None
    input_shape: tuple[int, ...] | None = eqx.field(static=True, default=None)
    horizon: PredictionHorizon | None = None

    @property
    def steps_star(self) -> Float[Array, " K"]:
        """Switch-on times in training steps, `t*_k / η` (NaN without a learning rate)."""
        return self.t_star / self.learning_rate if self.learning_rate else jnp.full_like(self.t_star, jnp.nan)

    @property
    def steps(self) -> Float[Array, " T"]:
        """The curve's times in training steps, `t / η` (NaN without a learning rate)."""
        return to_jax(
            np.asarray(self.ts) / self.learning_rate if self.learning_rate else np.full(np.shape(self.ts), np.nan)
        )

    def by_mode(self, name: str) -> Float[Array, " K"]:
        """The per-row array `name` (e.g. `"t_star"`) in the input's mode order: entry `k` is mode `k`."""
        rows = ("r", "C_diag", "V", "t_star", "tau_star", "plateau_loss", "drop", "steps_star")
        if name not in rows:
            raise LvflowError(f"name: one of {', '.join(rows)}, got {name!r}")
        a = np.asarray(getattr(self, name))
        out = np.empty_like(a)
        out[np.asarray(self.order)] = a
        return jnp.asarray(out)

    def _direction_times(self) -> tuple[np.ndarray, list[int]]:
        """Per row of the directions table, its switch-on time and the number it is known by (the
        input's mode number, 1-based, for the gLV; the row number for the matrix flow)."""
        if self.matrix is not None:
            t = np.asarray(self.matrix.t_star)
            return t, list(range(1, t.shape[0] + 1))
        return np.asarray(self.t_star), [int(k) + 1 for k in np.asarray(self.order)]

    def drop_members(self) -> list[list[int]]:
        """Per drop of the curve, the directions that switch on within it (their `t*` lies between
        the plateaus on either side): mode numbers (1-based, the input's) for the gLV, row numbers
        of the directions table for the matrix flow. A direction whose switch-on removes too little
        loss to show on the curve lies on a plateau and is in no drop."""
        return self._membership()[0]

    def _membership(self) -> tuple[list[list[int]], list[int]]:
        """`drop_members`, and the directions that switch on (`0 < t* < inf`) in no drop."""
        t, ids = self._direction_times()
        where = self.drops.containing(t)
        members = [[ids[j] for j in np.flatnonzero(where == i)] for i in range(len(self.drops))]
        return members, [ids[j] for j in np.flatnonzero((where < 0) & (t > 0) & np.isfinite(t))]

    def drop_rows(self) -> list[dict[str, Any]]:
        """The drops of the predicted curve (`drops`, see `loss_drops`), one dict each in time order:
        `t` and `steps` where the loss crosses the midpoint between its plateaus, `loss_before` and
        `loss_after` (the plateau levels, of `drops_of`), `complete` (False: still falling at the
        horizon) and the `modes` (gLV) or `directions` (matrix flow) that switch on within it."""
        d, key = self.drops, ("directions" if self.matrix is not None else "modes")
        out = []
        for i, members in enumerate(self.drop_members()):
            t = float(d.t_mid[i])
            out.append(
                {
                    "rank": i + 1,
                    "t": t,
                    "steps": t / self.learning_rate if self.learning_rate else math.nan,
                    "loss_before": float(d.loss_before[i]),
                    "loss_after": float(d.loss_after[i]),
                    "complete": bool(d.complete[i]),
                    key: members,
                }
            )
        return out

    def table(self, *, digits: int = 4, max_rows: int | None = None) -> str:
        """The drops of the predicted loss as aligned text (what `lvflow predict` prints first): per
        drop, when the loss crosses the midpoint between its plateaus, the plateau levels, and
        the directions that switch on in it; with `max_rows`, only the first rows."""
        matrix = self.matrix is not None
        lr = bool(self.learning_rate)
        what = self.drops_of.label
        head = ["#", "t"] + (["step"] if lr else []) + [f"{what} before", f"{what} after"]
        head.append("directions" if matrix else "modes")
        fmt = lambda v: "-" if not np.isfinite(v) else f"{v:.{digits}g}"  # noqa: E731
        # a level below the first one by more than float64 can resolve reads as the floor: 0
        tiny = 1e-9 * (abs(float(self.drops.loss_before[0])) if len(self.drops) else 0.0)
        floor = self.drops_of is DropsOf.EXCESS_LOSS
        level = lambda v: "0" if floor and abs(v) < tiny else fmt(v)  # noqa: E731
        body = []
        for d in self.drop_rows():
            members = d["directions" if matrix else "modes"]
            cells = [str(d["rank"]), fmt(d["t"])] + ([fmt(d["steps"])] if lr else [])
            after = level(d["loss_after"]) + ("" if d["complete"] else " (still falling)")
            cells += [level(d["loss_before"]), after, ", ".join(map(str, members)) or "-"]
            body.append(cells)
        title = f"drops of the predicted {what} (t: where it crosses the midpoint between the plateaus):"
        if not body:
            return f"the predicted {what} has no drop before t1 = {self.t1:.{digits}g}"
        quiet = self._membership()[1]
        tail = []
        if quiet:
            names = ", ".join(map(str, quiet[:10])) + (" …" if len(quiet) > 10 else "")
            tail.append(
                f"{'directions' if matrix else 'modes'} {names}: switch on (directions table) without a drop the "
                "curve shows (each removes under 1 % of its whole fall)"
            )
        return _aligned(title, head, body, max_rows, "more drops") + "".join("\n" + x for x in tail)

    def direction_rows(self) -> list[dict[str, Any]]:
        """The directions that can switch on, one dict per row of the directions table: for the gLV
        each mode in switch-on order (`r`, `C_kk`, `V`, `t_star`, `steps_star`, `tau_star`,
        `plateau_loss`, `drop`, `eps_merge_next`); for the matrix flow each direction of `M` that
        switched on (`t_star`, `steps_star`, `strength`, `multiplicity`, `direction`, and its
        input and output sides when the architecture is known)."""
        if self.matrix is not None:
            return self._matrix_rows(self.matrix)
        # one conversion per column: indexing a device array per entry costs ~10 µs each
        columns = (self.r, self.C_diag, self.V, self.t_star, self.tau_star, self.plateau_loss, self.eps_merge)
        r, Cd, V, ts, tau, pl, em = (np.asarray(a) for a in columns)
        st = np.asarray(self.steps_star)
        dr = np.full(self.order.shape, np.nan) if self.drop is None else np.asarray(self.drop)
        out = []
        for i, k in enumerate(np.asarray(self.order)):
            out.append(
                dict(
                    rank=i + 1,
                    mode=int(k) + 1,
                    r=float(r[i]),
                    C_kk=float(Cd[i]),
                    V=float(V[i]),
                    drop=float(dr[i]),
                    t_star=float(ts[i]),
                    steps_star=float(st[i]),
                    tau_star=float(tau[i]),
                    plateau_loss=float(pl[i]),
                    eps_merge_next=float(em[i]) if i < em.shape[0] else math.nan,
                )
            )
        return out

    def _matrix_rows(self, d: MatrixDrops) -> list[dict[str, Any]]:
        out = []
        # numpy first: indexing a JAX array compiles a small program per shape
        t_star, directions, strength, multiplicity = (
            np.asarray(a) for a in (d.t_star, d.directions, d.strength, d.multiplicity)
        )
        for i in range(t_star.shape[0]):
            t = float(t_star[i])
            u = directions[i]
            row = dict(
                rank=i + 1,
                t_star=t,
                steps_star=t / self.learning_rate if self.learning_rate else math.nan,
                strength=float(strength[i]),
                multiplicity=int(multiplicity[i]),
                direction=u.tolist(),
            )
            parts = self._split(u)
            if parts is not None:
                row.update(input_direction=parts[0].tolist(), output_direction=parts[1].tolist())
            out.append(row)
        return out

    def direction_table(self, *, digits: int = 6, max_rows: int | None = None) -> str:
        """The directions table as aligned text (see `direction_rows`); `t*` is when a direction
        reaches `ρ` of its final strength, not when the loss drops (that is `table`)."""
        fmt = lambda v: "-" if not np.isfinite(v) else f"{v:.{digits}g}"  # noqa: E731
        if self.matrix is not None:
            head = ["#", "t*", "steps*", "strength", "dim", "output direction"]
            body = []
            for d in self._matrix_rows(self.matrix):
                out = d.get("output_direction")
                if out is None or len(out) < 2:
                    desc = "-"
                else:
                    v = np.asarray(out) / max(np.linalg.norm(out), np.finfo(float).tiny)
                    top = np.argsort(-np.abs(v))[:3]
                    desc = " ".join(f"{v[j]:+.2f}·y{j}" for j in top)
                cells = [fmt(d[k]) for k in ("t_star", "steps_star", "strength")]
                body.append([str(d["rank"])] + cells + [str(d["multiplicity"]), desc])
            title = f"directions of M that switch on (t*: strength u·M·u at rho = {self.rho:g} of its final value):"
            empty = "no direction of M switched on (grew 100-fold) before the dynamics stopped"
        else:
            head = ["#", "mode", "r_k", "V_k alone", "t*_k", "steps*_k", "tau*_k", "plateau loss", "drop", "eps merge"]
            keys = ("r", "V", "t_star", "steps_star", "tau_star", "plateau_loss", "drop", "eps_merge_next")
            body = [[str(d["rank"]), str(d["mode"])] + [fmt(d[k]) for k in keys] for d in self.direction_rows()]
            title = f"directions (modes) in switch-on order (t*_k: z_k at rho = {self.rho:g} of its final value):"
            empty = "no modes"
        if not body:
            return empty
        return _aligned(title, head, body, max_rows, "more")

    def to_dict(self) -> dict[str, Any]:
        """Everything, as plain Python (floats, lists, strings): JSON-ready via `lvflow._workflow.io.to_json`."""
        return dict(
            method=self.method,
            source=self.source,
            eps=self.eps,
            ln_inv_eps=-math.log(self.eps),
            c=np.asarray(self.c).tolist(),
            rho=self.rho,
            learning_rate=self.learning_rate,
            t1=self.t1,
            exponent=self.exponent,
            notes=list(self.notes),
            drops_of=self.drops_of.value,
            drops=self.drop_rows(),
            directions=self.direction_rows(),
            curve=dict(
                t=np.asarray(self.ts).tolist(),
                steps=np.asarray(self.steps).tolist() if self.learning_rate else None,
                loss=np.asarray(self.loss).tolist(),
                excess_loss=np.asarray(self.excess_loss).tolist(),
            ),
            horizon=self._horizon_dict(),
        )

    def _horizon_dict(self) -> dict[str, Any] | None:
        """`horizon` as plain Python (`None` without one; `t`, `step` `None` when never reached)."""
        h = self.horizon
        if h is None:
            return None
        steps = lambda t: t / self.learning_rate if self.learning_rate else math.nan  # noqa: E731
        times = np.asarray(h.times)
        return dict(
            t=h.t,
            step=steps(h.t),
            fraction=h.fraction,
            order=h.order,
            width=h.width,
            measure="RMS of Thm 13's next term / RMS of the NQF's output, along the predicted M(t)",
            floor_t=h.floor_t,
            floor_step=steps(h.floor_t),
            first=None if math.isnan(h.floor_t) else ("floor" if h.floor_t < h.t else "horizon"),
            times=times.tolist(),
            steps=(times / self.learning_rate).tolist() if self.learning_rate else None,
            ratio=np.asarray(h.ratio).tolist(),
        )

    def to_json(self) -> str:
        """Strict JSON (inf and NaN, e.g. a mode that never switches on, become `null`)."""
        return to_json(self.to_dict())

    def save(self, path) -> Path:
        """Write atomically as `.json` (the `to_dict` tree) or `.npz` (flat arrays + metadata; the
        curve's drops as `drops_*`, the matrix flow's directions as `matrix_*`)."""
        p = Path(path)
        write = {".json": lambda p: save_json(p, self.to_dict()), ".npz": self._save_npz}.get(p.suffix.lower())
        if write is None:
            raise LvflowError(f"save: unsupported file type {p.suffix or '(none)'!r} for {p}; use .json or .npz")
        return write(p)

    def _save_npz(self, p: Path) -> Path:
        skip = ("drops", "matrix", "input_shape", "horizon")
        fields = [f.name for f in dataclasses.fields(self) if f.name not in skip]
        arrays = {n: getattr(self, n) for n in fields if getattr(self, n) is not None}
        arrays.update({f"drops_{f.name}": getattr(self.drops, f.name) for f in dataclasses.fields(self.drops)})
        if self.matrix is not None:
            names = [f.name for f in dataclasses.fields(self.matrix) if f.name not in ("learning_rate", "drops")]
            arrays.update({f"matrix_{n}": getattr(self.matrix, n) for n in names})
        arrays["notes"] = np.asarray(list(self.notes) or [""])
        arrays["learning_rate"] = np.nan if self.learning_rate is None else self.learning_rate
        arrays["steps_star"] = self.steps_star
        if self.horizon is not None:
            h = self.horizon
            arrays.update(horizon_t=h.t, horizon_fraction=h.fraction, horizon_order=h.order, horizon_width=h.width)
            arrays.update(horizon_floor_t=h.floor_t, horizon_times=h.times, horizon_ratio=h.ratio)
        return save_npz(p, {k: np.asarray(v) for k, v in arrays.items()})

    def _split(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """A direction's input side (reshaped to `input_shape`) and output side, when known."""
        if self.input_shape is None:
            return None
        n = math.prod(self.input_shape)
        return u[:n].reshape(self.input_shape), u[n:]

    def summary(self, *, max_rows: int | None = 40) -> str:
        """Header lines, the drops table, the directions table, and the notes."""
        lines = [
            f"lvflow predict: {self.source}",
            f"method {self.method}, eps = {self.eps:.6g} (ln 1/eps = {-math.log(self.eps):.6g}), rho = {self.rho:g}"
            + (f", learning rate {self.learning_rate:g}" if self.learning_rate else "")
            + f", horizon t1 = {self.t1:.6g}",
        ]
        if np.isfinite(self.exponent):
            lines.append(f"predicted loss exponent (alpha1 - 1)/alpha2 = {self.exponent:.6g} (Thm 9)")
        lines.append(self.table(max_rows=max_rows))
        if self.order.shape[0] or self.matrix is not None:
            lines.append(self.direction_table(max_rows=max_rows))
        if self.matrix is not None:
            floor = self.matrix.loss_floor
            end = f"loss at the end {float(np.asarray(self.loss)[-1]):.4g} (t = {self.t1:.4g})"
            lines.append(end + (f"; least loss over the features {floor:.4g}" if np.isfinite(floor) else ""))
        if self.horizon is not None:
            lines.append(horizon_line(self.horizon, self.learning_rate))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def plot(self, path, *, title: str | None = None) -> Path:
        """Save the predicted loss curve in linear and log time (two panels), atomically."""
        return plot_prediction(self, path, title=title)


def _aligned(title: str, head: list[str], body: list[list[str]], max_rows: int | None, more: str) -> str:
    """`title`, then `head` and the rows of `body` right-aligned in columns; with `max_rows`, only the
    first rows and a line saying how many `more` were left out."""
    w = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w[i]) for i, c in enumerate(cells))  # noqa: E731
    cut = body if max_rows is None else body[:max_rows]
    rest = [f"… {len(body) - len(cut)} {more} (all of them in --save / --json)"] if len(cut) < len(body) else []
    return "\n".join([title, line(head)] + [line(b) for b in cut] + rest)
