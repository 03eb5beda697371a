"""`Prediction`, the result of `predict`: the plateau table, the predicted loss curve, and their
text, JSON and `.npz` forms."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._core.errors import LvflowError
from .io import save_json, save_npz, to_json

if TYPE_CHECKING:
    from .._form.drops import MatrixDrops  # imports diffrax: only the matrix flow builds one


class Prediction(eqx.Module):
    """What `predict` returns: the plateau table and the predicted loss curve.

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
    - `drops`: for the matrix flow, its drops (`MatrixDrops`: the directions of `M` that switch
      on, when, and the loss before and after each); `None` for the gLV.
    - `input_shape`: the shape of the input side of a direction (its first entries; the rest is
      the output side), when the architecture is known; `None` otherwise.
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
    drop: Float[Array, " K"] | None = None
    limit_tau: Float[Array, " n"] | None = None
    limit_excess: Float[Array, " n+1"] | None = None
    drops: MatrixDrops | None = None
    input_shape: tuple[int, ...] | None = eqx.field(static=True, default=None)

    @property
    def steps_star(self) -> Float[Array, " K"]:
        """Switch-on times in training steps, `t*_k / η` (NaN without a learning rate)."""
        return self.t_star / self.learning_rate if self.learning_rate else jnp.full_like(self.t_star, jnp.nan)

    @property
    def steps(self) -> Float[Array, " T"]:
        """The curve's times in training steps, `t / η` (NaN without a learning rate)."""
        return self.ts / self.learning_rate if self.learning_rate else jnp.full_like(self.ts, jnp.nan)

    def by_mode(self, name: str) -> Float[Array, " K"]:
        """The per-row array `name` (e.g. `"t_star"`) in the input's mode order: entry `k` is mode `k`."""
        rows = ("r", "C_diag", "V", "t_star", "tau_star", "plateau_loss", "drop", "steps_star")
        if name not in rows:
            raise LvflowError(f"name: one of {', '.join(rows)}, got {name!r}")
        a = np.asarray(getattr(self, name))
        out = np.empty_like(a)
        out[np.asarray(self.order)] = a
        return jnp.asarray(out)

    def rows(self) -> list[dict[str, Any]]:
        """The table, one dict per mode in ignition order."""
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
            modes=self.rows(),
            drops=self.drop_rows(),
            curve=dict(
                t=np.asarray(self.ts).tolist(),
                steps=np.asarray(self.steps).tolist() if self.learning_rate else None,
                loss=np.asarray(self.loss).tolist(),
                excess_loss=np.asarray(self.excess_loss).tolist(),
            ),
        )

    def to_json(self) -> str:
        """Strict JSON (inf and NaN, e.g. a mode that never switches on, become `null`)."""
        return to_json(self.to_dict())

    def save(self, path) -> Path:
        """Write atomically as `.json` (the `to_dict` tree) or `.npz` (flat arrays + metadata)."""
        p = Path(path)
        if p.suffix.lower() == ".json":
            return save_json(p, self.to_dict())
        if p.suffix.lower() == ".npz":
            skip = ("drops", "input_shape")
            fields = [f.name for f in dataclasses.fields(self) if f.name not in skip]
            arrays = {n: getattr(self, n) for n in fields if getattr(self, n) is not None}
            if self.drops is not None:
                names = [f.name for f in dataclasses.fields(self.drops) if f.name != "learning_rate"]  # = this one's
                arrays.update({f"drops_{n}": getattr(self.drops, n) for n in names})
            arrays["notes"] = np.asarray(list(self.notes) or [""])
            arrays["learning_rate"] = np.nan if self.learning_rate is None else self.learning_rate
            arrays["steps_star"] = self.steps_star
            return save_npz(p, {k: np.asarray(v) for k, v in arrays.items()})
        raise LvflowError(f"save: unsupported file type {p.suffix or '(none)'!r} for {p}; use .json or .npz")

    def table(self, *, digits: int = 6, max_rows: int | None = None) -> str:
        """The plateau table as aligned text (what `lvflow predict` prints); with `max_rows`,
        only the first rows (and a line saying how many were left out)."""
        head = ["#", "mode", "r_k", "V_k alone", "t*_k", "steps*_k", "tau*_k", "plateau loss", "drop", "eps merge"]
        fmt = lambda v: "-" if not np.isfinite(v) else f"{v:.{digits}g}"
        body = [
            [str(d["rank"]), str(d["mode"])]
            + [
                fmt(d[k])
                for k in ("r", "V", "t_star", "steps_star", "tau_star", "plateau_loss", "drop", "eps_merge_next")
            ]
            for d in self.rows()
        ]
        w = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
        line = lambda cells: "  ".join(c.rjust(w[i]) for i, c in enumerate(cells))
        cut = body if max_rows is None else body[:max_rows]
        more = [f"… {len(body) - len(cut)} more modes (all of them in --save / --json)"] if len(cut) < len(body) else []
        return "\n".join([line(head)] + [line(b) for b in cut] + more)

    def _split(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """A direction's input side (reshaped to `input_shape`) and output side, when known."""
        if self.input_shape is None:
            return None
        n = math.prod(self.input_shape)
        return u[:n].reshape(self.input_shape), u[n:]

    def drop_rows(self) -> list[dict[str, Any]]:
        """The drops of the matrix flow, one dict per direction in switch-on order (empty for the gLV)."""
        if self.drops is None:
            return []
        d, out = self.drops, []
        for i in range(d.t_star.shape[0]):
            t, th = float(d.t_star[i]), float(d.t_half[i])
            u = np.asarray(d.directions[i])
            row = dict(
                rank=i + 1,
                t_star=t,
                steps_star=t / self.learning_rate if self.learning_rate else math.nan,
                t_half=th,
                steps_half=th / self.learning_rate if self.learning_rate else math.nan,
                loss_before=float(d.loss_before[i]),
                loss_after=float(d.loss_after[i]),
                strength=float(d.strength[i]),
                multiplicity=int(d.multiplicity[i]),
                direction=u.tolist(),
            )
            parts = self._split(u)
            if parts is not None:
                row.update(input_direction=parts[0].tolist(), output_direction=parts[1].tolist())
            out.append(row)
        return out

    def drop_table(self, *, digits: int = 4, max_rows: int | None = None) -> str:
        """The drops of the matrix flow as aligned text: per direction, its switch-on time `t*`
        (strength at `ρ` of final), the time the loss is halfway through its drop, the loss
        before and after, and (for a vector output) the output direction's largest entries."""
        head = ["#", "t*", "steps*", "t half", "steps half", "loss before", "loss after", "strength", "dim"]
        head.append("output direction")
        fmt = lambda v: "-" if not np.isfinite(v) else f"{v:.{digits}g}"  # noqa: E731
        body = []
        for d in self.drop_rows():
            out = d.get("output_direction")
            if out is None or len(out) < 2:
                desc = "-"
            else:
                v = np.asarray(out) / max(np.linalg.norm(out), np.finfo(float).tiny)
                top = np.argsort(-np.abs(v))[:3]
                desc = " ".join(f"{v[j]:+.2f}·y{j}" for j in top)
            keys = ("t_star", "steps_star", "t_half", "steps_half", "loss_before", "loss_after", "strength")
            body.append([str(d["rank"])] + [fmt(d[k]) for k in keys] + [str(d["multiplicity"]), desc])
        if not body:
            return "no direction of M switched on (grew 100-fold) before the dynamics stopped"
        w = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
        line = lambda cells: "  ".join(c.rjust(w[i]) for i, c in enumerate(cells))  # noqa: E731
        cut = body if max_rows is None else body[:max_rows]
        more = [f"… {len(body) - len(cut)} more drops (all of them in --save / --json)"] if len(cut) < len(body) else []
        floor = self.drops.loss_floor
        tail = [f"loss at the end {float(self.loss[-1]):.{digits}g} (t = {self.t1:.{digits}g})"]
        if np.isfinite(floor):
            tail[0] += f"; least loss over the features {floor:.{digits}g}"
        return "\n".join(["drops (directions of M switching on):", line(head)] + [line(b) for b in cut] + more + tail)

    def merged_pairs(self) -> np.ndarray:
        """For consecutive rows that both switch on: whether their drops merge at this ε, measured
        on the switch-on times — the gap `t*_{i+1} − t*_i` is within the mean 10–90 % rise time
        `½(w_i + w_{i+1})`, `w = ln 81/r` (the criterion of `lvflow._schedule.scaling.resolved_steps`).
        Pairs with a mode that never switches on, or with `r ≤ 0` (no rise time to compare), are
        left out: the result has one entry per pair of consecutive switch-ons measured."""
        t, r = np.asarray(self.t_star), np.asarray(self.r)
        n = max(int(np.count_nonzero(np.isfinite(t))) - 1, 0)  # pairs of consecutive switch-ons
        ta, tb, ra, rb = t[:n], t[1 : n + 1], r[:n], r[1 : n + 1]
        measurable = (ra > 0) & (rb > 0)
        with np.errstate(divide="ignore"):
            width = 0.5 * math.log(81.0) * (1 / ra + 1 / rb)
        return np.where(measurable, tb - ta <= width, False)

    def n_resolved(self) -> int:
        """How many leading switch-ons stand apart at this ε: measured on the switch-on times
        (`merged_pairs`), not on `eps_merge`."""
        n_on = int(np.count_nonzero(np.isfinite(np.asarray(self.t_star))))
        bad = np.flatnonzero(self.merged_pairs())
        return int(bad[0]) if bad.size else n_on

    def summary(self, *, max_rows: int | None = 40) -> str:
        """Header lines, the table, and the notes."""
        lines = [
            f"lvflow predict: {self.source}",
            f"method {self.method}, eps = {self.eps:.6g} (ln 1/eps = {-math.log(self.eps):.6g}), rho = {self.rho:g}"
            + (f", learning rate {self.learning_rate:g}" if self.learning_rate else "")
            + f", horizon t1 = {self.t1:.6g}",
        ]
        if np.isfinite(self.exponent):
            lines.append(f"predicted loss exponent (alpha1 - 1)/alpha2 = {self.exponent:.6g} (Thm 9)")
        if self.order.shape[0]:
            lines += self._resolution_lines()
            lines.append(self.table(max_rows=max_rows))
        if self.drops is not None:
            lines.append(self.drop_table(max_rows=max_rows))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _resolution_lines(self) -> list[str]:
        """What the switch-on times say about merging (measured, `merged_pairs`); nothing where
        there is nothing to measure."""
        merged = self.merged_pairs()
        if not merged.any():
            return []
        n, m = self.n_resolved(), int(merged.sum())
        where = f"{m} of the {merged.size} pairs of consecutive switch-ons are closer than their rise times"
        if m == merged.size:
            head = "at this eps no switch-on stands apart: every drop merges with the next into one smooth decay"
        elif n == 0:
            head = f"at this eps the first switch-on merges with the second ({where})"
        else:
            head = f"at this eps the first {n} switch-ons stand apart; #{n + 1} merges with #{n + 2} ({where})"
        return [head + " (eps merge: the eps above which a step merges with the next)"]

    def plot(self, path, *, title: str | None = None) -> Path:
        """Save the predicted loss curve in linear and log time (two panels), atomically."""
        from .prediction_plot import plot_prediction  # loads matplotlib

        return plot_prediction(self, path, title=title)
