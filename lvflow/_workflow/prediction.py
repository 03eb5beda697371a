"""`Prediction`, the result of `predict`: the plateau table, the predicted loss curve, and their
text, JSON and `.npz` forms."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._errors import LvflowError
from .._form.drops import MatrixDrops
from .io import save_json, save_npz, to_json


class Prediction(eqx.Module):
    """What `predict` returns: the plateau table and the predicted loss curve.

    Modes are listed in ignition order (`order[i]` is the index, in the input system, of the
    `i`-th mode to switch on); modes that never switch on (e.g. `r_k ≤ 0`, or suppressed by a
    competitor) come last with `t*_k = τ*_k = inf`.

    **Fields:**

    - `method`: `"lv"` (reduced to the gLV, Eq. 32) or `"matrix_flow"` (the full M-flow, Eq. 28,
      used when the structure matrices do not commute; no per-mode table then).
    - `eps`, `c`, `rho`, `learning_rate`, `t1`: the initial scale `z_k0 = ε c_k`, the switch-on
      fraction `ρ`, the learning rate `η` (steps = t/η; `None` if not given), and the horizon
      (`c` in input order; one entry, `M0 = ε c I`, for the matrix flow).
    - `order`, `r`, `C_diag`, `V`: the modes in ignition order: `r_k`, `C_kk`,
      `V_k = r_k²/(8 C_kk)`.
    - `t_star`: finite-ε switch-on times (`z_k = ρ z_k(∞)`, from the ODE solve); `steps_star = t_star/η`.
    - `tau_star`: ε → 0 ignition times in `τ = t/ln(1/ε)` (`1/r_k` for diagonal `C`, Eq. 168).
    - `plateau_loss`: the excess loss on the plateau just before each mode switches on
      (`Σ_{j ignites later} V_j` for diagonal `C`, Eq. 168).
    - `eps_merge`: for consecutive modes, the ε above which their drops overlap (see `predict`).
    - `exponent`: the predicted loss exponent `(α₁−1)/α₂` (Thm 9) for a power-law spectrum, else NaN.
    - `ts`, `loss`, `excess_loss`: the predicted curve (loss is NaN where `y2` is unknown).
    - `notes`: human-readable remarks (fallbacks taken, modes that never switch on).
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

    def rows(self) -> list[dict[str, Any]]:
        """The table, one dict per mode in ignition order."""
        out = []
        st = np.asarray(self.steps_star)
        for i, k in enumerate(np.asarray(self.order)):
            out.append(
                dict(
                    rank=i + 1,
                    mode=int(k) + 1,
                    r=float(self.r[i]),
                    C_kk=float(self.C_diag[i]),
                    V=float(self.V[i]),
                    t_star=float(self.t_star[i]),
                    steps_star=float(st[i]),
                    tau_star=float(self.tau_star[i]),
                    plateau_loss=float(self.plateau_loss[i]),
                    eps_merge_next=float(self.eps_merge[i]) if i < self.eps_merge.shape[0] else math.nan,
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
            arrays = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
            if self.drops is not None:
                arrays.update({f"drops_{f.name}": getattr(self.drops, f.name) for f in dataclasses.fields(self.drops)})
            arrays["notes"] = np.asarray(list(self.notes) or [""])
            arrays["learning_rate"] = np.nan if self.learning_rate is None else self.learning_rate
            arrays["steps_star"] = self.steps_star
            return save_npz(p, {k: np.asarray(v) for k, v in arrays.items()})
        raise LvflowError(f"save: unsupported file type {p.suffix or '(none)'!r} for {p}; use .json or .npz")

    def table(self, *, digits: int = 6, max_rows: int | None = None) -> str:
        """The plateau table as aligned text (what `lvflow predict` prints); with `max_rows`,
        only the first rows (and a line saying how many were left out)."""
        head = ["#", "mode", "r_k", "V_k", "t*_k", "steps*_k", "tau*_k", "plateau loss", "eps merge"]
        fmt = lambda v: "-" if not np.isfinite(v) else f"{v:.{digits}g}"
        body = [
            [str(d["rank"]), str(d["mode"])]
            + [fmt(d[k]) for k in ("r", "V", "t_star", "steps_star", "tau_star", "plateau_loss", "eps_merge_next")]
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
            return "no direction of M switched on (grew 100-fold) before the flow stopped"
        w = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
        line = lambda cells: "  ".join(c.rjust(w[i]) for i, c in enumerate(cells))  # noqa: E731
        cut = body if max_rows is None else body[:max_rows]
        more = [f"… {len(body) - len(cut)} more drops (all of them in --save / --json)"] if len(cut) < len(body) else []
        floor = self.drops.loss_floor
        tail = [f"loss at the end {float(self.loss[-1]):.{digits}g} (t = {self.t1:.{digits}g})"]
        if np.isfinite(floor):
            tail[0] += f"; least loss over the features {floor:.{digits}g}"
        return "\n".join(["drops (directions of M switching on):", line(head)] + [line(b) for b in cut] + more + tail)

    def n_resolved(self) -> int:
        """How many leading switch-ons stand apart at this ε (each of them and its successor
        have `ε < ε_merge`; the convention of `lvflow._scaling.resolved_steps`)."""
        em = np.asarray(self.eps_merge)
        if not self.order.shape[0]:
            return 0
        bad = np.flatnonzero(~(self.eps < em))
        return int(bad[0]) if bad.size else int(self.order.shape[0])

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
            n, K = self.n_resolved(), int(self.order.shape[0])
            if n == 0:
                lines.append(
                    "at this eps no switch-on stands apart: the drops merge into one smooth decay "
                    "(eps merge: the eps above which a step merges with the next)"
                )
            elif n < K:
                lines.append(
                    f"at this eps the first {n} switch-ons stand apart; from #{n + 1} on they merge "
                    "into a smooth decay (eps merge: the eps above which a step merges with the next)"
                )
            lines.append(self.table(max_rows=max_rows))
        if self.drops is not None:
            lines.append(self.drop_table(max_rows=max_rows))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def plot(self, path, *, title: str | None = None) -> Path:
        """Save the predicted loss curve in linear and log time (two panels), atomically."""
        from .prediction_plot import plot_prediction  # loads matplotlib

        return plot_prediction(self, path, title=title)
