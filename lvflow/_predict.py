"""`predict`: the plateaus, switch-on times and loss curve of a training run, from its NQF.

The user's workflow in one call: a gLV system (Eq. 32) — given directly, built from a power-law
spectrum (Thm 9), or reduced from an architecture's structure matrices on a dataset
(Assumption 1) — plus an initial scale ε, gives

- the finite-ε switch-on times `t*_k` (the time `z_k` reaches `ρ z_k(∞)`, Thm 8, Eq. 158),
  from an ODE solve (`solve_lv`);
- the ε → 0 schedule: ignition times `τ*_k` in `τ = t/ln(1/ε)` and the plateau losses
  (Eq. 168; `plateau_schedule`);
- the predicted loss curve, in gradient-flow time `t` and in training steps `t/η`;
- for a power-law spectrum, the loss exponent `(α₁ − 1)/α₂` (Thm 9) and, for each pair of
  consecutive modes, the ε above which their two drops merge into one.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Mapping

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._errors import LvflowError, NotCommutingError
from ._io import save_json, save_npz, to_json
from ._lv import LotkaVolterra
from ._nqf import NQF
from ._validate import as_array, check_in_open_interval, check_positive

# ----------------------------------------------------------------------------------------------
# Building the system
# ----------------------------------------------------------------------------------------------


def lv_from_arrays(arrays: Mapping[str, Any], *, name: str = "system") -> LotkaVolterra:
    """A gLV system from named arrays: `r` and `C`, or `zeta` and `V`.

    With `zeta` and `V` (the rates and loss drops of independent modes, Thm 6) the system is
    diagonal with `r_k = ζ_k` and `C_kk = ζ_k² / (8 V_k)`, so that `V_k = r_k²/(8 C_kk)`.
    An unnamed array (an `.npy` or a header-less `.csv`) of shape `(K, K+1)` is read as the
    columns `[r | C]`.

    **Raises:** `LvflowError` naming `name` and the problem (missing keys, shapes, NaN/inf,
    `V ≤ 0`); `SymmetryError` / `NotPSDError` when `C` is not symmetric PSD.
    """
    keys = {k.lower(): k for k in arrays}
    if set(keys) == {""}:
        a = as_array(name, arrays[keys[""]], ndim=2)
        K = a.shape[0]
        if a.shape != (K, K + 1):
            raise LvflowError(
                f"{name}: an unnamed array must have shape (K, K+1) holding the columns [r | C], got {a.shape}"
            )
        arrays, keys = {"r": a[:, 0], "C": a[:, 1:]}, {"r": "r", "c": "C"}
    if "r" in keys and "c" in keys:
        r = as_array(f"{name}: r", arrays[keys["r"]], ndim=1)
        C = as_array(f"{name}: C", arrays[keys["c"]], ndim=2)
        if C.shape != (r.shape[0],) * 2:
            raise LvflowError(f"{name}: C has shape {C.shape}, expected {(r.shape[0],) * 2} to match r of shape {r.shape}")
        _check_C(name, C)
        return LotkaVolterra(r, C, check=False)
    if "zeta" in keys and "v" in keys:
        zeta = as_array(f"{name}: zeta", arrays[keys["zeta"]], ndim=1)
        V = as_array(f"{name}: V", arrays[keys["v"]], ndim=1)
        if zeta.shape != V.shape:
            raise LvflowError(f"{name}: zeta has shape {zeta.shape} but V has shape {V.shape}")
        if np.any(V <= 0):
            raise LvflowError(f"{name}: V must be positive (the loss drop of each mode), got min {V.min():g}")
        return LotkaVolterra(zeta, np.diag(zeta**2 / (8 * V)), check=False)
    raise LvflowError(f"{name}: expected arrays 'r' and 'C', or 'zeta' and 'V'; found {sorted(arrays) or 'none'}")


def _check_C(name: str, C: np.ndarray) -> None:
    # Same checks as `LotkaVolterra`, re-labelled with the input's name for the CLI's one line.
    from ._errors import NotPSDError, SymmetryError
    from ._validate import check_psd

    try:
        check_psd("C", C)
    except (NotPSDError, SymmetryError) as e:
        raise type(e)(f"{name}: {e}") from None


def power_law_lv(*, alpha1: float, alpha2: float, modes: int) -> LotkaVolterra:
    """Independent modes with a power-law spectrum (Thm 9): `ζ_k = r_k = k^{−α₂}`,
    `V_k = k^{−α₁}`, hence `C_kk = r_k² / (8 V_k) = k^{α₁ − 2α₂} / 8`, `k = 1..modes`.

    The excess loss then falls as `E(τ) = Θ(τ^{−(α₁−1)/α₂})` for `α₁ > 1` (Thm 9).
    """
    a1 = float(as_array("alpha1", alpha1, ndim=0))
    a2 = check_positive("alpha2", alpha2)
    if not isinstance(modes, (int, np.integer)) or isinstance(modes, bool) or modes < 1:
        raise LvflowError(f"modes: must be a positive integer, got {modes!r}")
    k = np.arange(1, int(modes) + 1, dtype=np.float64)
    r, V = k**-a2, k**-a1
    return LotkaVolterra(r, np.diag(r**2 / (8 * V)), check=False)


def initial_scale(
    K: int,
    *,
    eps: float | None = None,
    c=None,
    z0=None,
    init_std: float | None = None,
    width: int | None = None,
) -> tuple[float, np.ndarray]:
    """The initial condition `z_k(0) = ε c_k` from one of three specifications.

    - `eps` (and optionally `c`, default `c_k = 1`): `z_k0 = ε c_k` (Thm 8).
    - `z0`: the initial modes themselves; then `ε = max_k z_k0` and `c_k = z_k0 / ε`.
    - `init_std` σ and `width` d: a weight matrix `W ∈ R^{p×d}` with i.i.d. `N(0, σ²)` entries
      has `E[M] = E[W Wᵀ] = d σ² I`, so every mode starts at `z_k0 = p_kᵀ M p_k ≈ d σ²`
      (relative fluctuations `√(2/d)`): `ε = d σ²`, and `c` as with `eps`.

    **Raises:** `LvflowError` unless exactly one is given and `0 < ε < 1`, `c_k > 0`.
    """
    given = [n for n, v in (("eps", eps), ("z0", z0), ("init_std", init_std)) if v is not None]
    if len(given) > 1:
        raise LvflowError(f"initial scale: give only one of eps, z0, init_std (got {', '.join(given)})")
    if init_std is None and width is not None:
        raise LvflowError("width: only meaningful together with init_std")
    if z0 is not None:
        if c is not None:
            raise LvflowError("c: give either z0 or c (with eps), not both")
        z0 = as_array("z0", z0, ndim=1)
        if z0.shape != (K,):
            raise LvflowError(f"z0: shape {z0.shape}, expected ({K},) (one entry per mode)")
        if np.any(z0 <= 0):
            raise LvflowError(f"z0: every entry must be positive, got min {z0.min():g}")
        e = float(np.max(z0))
        check_in_open_interval("z0: max entry (ε)", e, 0.0, 1.0)
        return e, z0 / e
    if init_std is not None:
        s = check_positive("init_std", init_std)
        if width is None:
            raise LvflowError("width: required with init_std (the number of neurons d; ε = d σ²)")
        if not isinstance(width, (int, np.integer)) or isinstance(width, bool) or width < 1:
            raise LvflowError(f"width: must be a positive integer, got {width!r}")
        eps = width * s**2
        if not eps < 1:
            raise LvflowError(f"init_std: ε = width·σ² = {eps:g} must lie in (0, 1): the theory needs a small initialisation")
    if eps is None:
        raise LvflowError("eps: required (or give z0, or init_std with width)")
    eps = check_in_open_interval("eps", eps, 0.0, 1.0)
    if c is None:
        return eps, np.ones(K)
    c = as_array("c", c, ndim=(0, 1))
    c = np.broadcast_to(c, (K,)).astype(np.float64) if c.ndim == 0 else c
    if c.shape != (K,):
        raise LvflowError(f"c: shape {c.shape}, expected ({K},)")
    if np.any(c <= 0):
        raise LvflowError(f"c: every entry must be positive, got min {c.min():g}")
    return eps, np.asarray(c, dtype=np.float64)


# ----------------------------------------------------------------------------------------------
# The result
# ----------------------------------------------------------------------------------------------


class Prediction(eqx.Module):
    """What `predict` returns: the plateau table and the predicted loss curve.

    Modes are listed in ignition order (`order[i]` is the index, in the input system, of the
    `i`-th mode to switch on); modes that never switch on (e.g. `r_k ≤ 0`, or suppressed by a
    competitor) come last with `t*_k = τ*_k = inf`.

    **Fields:**

    - `method`: `"lv"` (reduced to the gLV, Eq. 32) or `"matrix_flow"` (the full M-flow, Eq. 28,
      used when the structure matrices do not commute; no per-mode table then).
    - `eps`, `c`, `rho`, `learning_rate`, `t1`: the initial scale `z_k0 = ε c_k`, the switch-on
      fraction `ρ`, the learning rate `η` (steps = t/η; `None` if not given), and the horizon.
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
    """

    method: str = eqx.field(static=True)
    source: str = eqx.field(static=True)
    eps: float = eqx.field(static=True)
    rho: float = eqx.field(static=True)
    learning_rate: float | None = eqx.field(static=True)
    t1: float = eqx.field(static=True)
    exponent: float = eqx.field(static=True)
    notes: tuple[str, ...] = eqx.field(static=True)
    c: Float[Array, " K"]
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
        """Everything, as plain Python (floats, lists, strings): JSON-ready via `lvflow._io.to_json`."""
        return dict(
            method=self.method,
            source=self.source,
            eps=self.eps,
            ln_inv_eps=math.log(1 / self.eps),
            c=np.asarray(self.c).tolist(),
            rho=self.rho,
            learning_rate=self.learning_rate,
            t1=self.t1,
            exponent=self.exponent,
            notes=list(self.notes),
            modes=self.rows(),
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
            arrays = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
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
            f"method {self.method}, eps = {self.eps:.6g} (ln 1/eps = {math.log(1 / self.eps):.6g}), rho = {self.rho:g}"
            + (f", learning rate {self.learning_rate:g}" if self.learning_rate else "")
            + f", horizon t1 = {self.t1:.6g}",
        ]
        if np.isfinite(self.exponent):
            lines.append(f"predicted loss exponent (alpha1 - 1)/alpha2 = {self.exponent:.6g} (Thm 9)")
        if self.order.shape[0]:
            n, K = self.n_resolved(), int(self.order.shape[0])
            if n == 0:
                lines.append("at this eps no switch-on stands apart: the drops merge into one smooth decay "
                             "(eps merge: the eps above which a step merges with the next)")
            elif n < K:
                lines.append(f"at this eps the first {n} switch-ons stand apart; from #{n + 1} on they merge "
                             "into a smooth decay (eps merge: the eps above which a step merges with the next)")
            lines.append(self.table(max_rows=max_rows))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def plot(self, path, *, title: str | None = None) -> Path:
        """Save the predicted loss curve in linear and log time (two panels), atomically."""
        return plot_prediction(self, path, title=title)


_MAX_MARKS = 12


def plot_prediction(pred: Prediction, path, *, title: str | None = None) -> Path:
    """Two panels: excess loss vs time (linear) and vs time (log), switch-on times marked."""
    import io

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from ._io import atomic_write_bytes

    p = Path(path)
    fmt = p.suffix.lower().lstrip(".")
    if fmt not in ("png", "pdf", "svg"):
        raise LvflowError(f"plot: unsupported file type {p.suffix or '(none)'!r} for {p}; use .png, .pdf or .svg")
    steps = pred.learning_rate is not None
    x = np.asarray(pred.steps if steps else pred.ts)
    xs = np.asarray(pred.steps_star if steps else pred.t_star)
    # The M-flow fallback has no known minimum: plot its loss, not a loss relative to t1.
    flow = pred.method == "matrix_flow"
    y = np.asarray(pred.loss if flow else pred.excess_loss)
    ylabel = "loss" if flow else "excess loss"
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    for ax, logx in zip(axes, (False, True)):
        keep = x > 0 if logx else np.ones_like(x, bool)
        # Floor the log axis ten decades below the start: the tail's 1e-300 says nothing.
        floor = max(float(np.nanmax(np.abs(y))) if y.size else 1.0, np.finfo(float).tiny) * 1e-8
        ax.plot(x[keep], np.maximum(y[keep], floor), lw=1.8, label=f"predicted {ylabel}")
        for t in xs[np.isfinite(xs)][:_MAX_MARKS]:  # more would hide the curve
            ax.axvline(t, color="0.6", lw=0.8, ls="--")
        fin = xs[np.isfinite(xs) & (xs > 0)]
        if logx and np.isfinite(pred.exponent) and fin.size >= 2:
            # Thm 9's slope −(α₁−1)/α₂, anchored on the curve midway (in log t) through the switch-ons.
            tm = math.sqrt(fin[0] * fin[-1])
            ym = float(np.interp(math.log(tm), np.log(x[keep]), y[keep]))
            tt = np.geomspace(fin[0], fin[-1], 20)
            ax.plot(tt, ym * (tt / tm) ** -pred.exponent, color="k", lw=0.9, ls="-.",
                    label=f"slope −{pred.exponent:.3g} (Thm 9)")
        if not flow and pred.order.shape[0]:
            # The ε → 0 staircase (Eq. 168): plateau levels switching at τ*_k ln(1/ε).
            tau = np.asarray(pred.tau_star) * math.log(1 / pred.eps) / (pred.learning_rate or 1.0)
            lev = np.asarray(pred.plateau_loss)
            ok = np.isfinite(tau) & np.isfinite(lev)
            edges = np.concatenate([[x[keep][0]], tau[ok], [x[-1]]])
            levels = np.concatenate([lev[ok], [floor]])
            ax.stairs(np.maximum(levels, floor), np.maximum.accumulate(edges), color="C1", lw=1.2, ls=":",
                      label="ε → 0 limit (Eq. 168)", baseline=None)
        ax.legend(fontsize=8, loc="lower left")
        ax.set_yscale("log")
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel("training step" if steps else "time t (gradient flow)")
        ax.set_ylabel(ylabel)
        ax.set_title(("log" if logx else "linear") + " time; dashed: switch-on times t*_k"
                     + (f" (first {_MAX_MARKS})" if np.count_nonzero(np.isfinite(xs)) > _MAX_MARKS else ""), fontsize=10)
    fig.suptitle(title or f"{pred.source}  (eps = {pred.eps:.3g})", fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=120)
    plt.close(fig)
    return atomic_write_bytes(p, buf.getvalue())


# ----------------------------------------------------------------------------------------------
# The prediction
# ----------------------------------------------------------------------------------------------


def eps_merge(zeta, *, C, c, rho: float = 0.5) -> Float[np.ndarray, " Km1"]:
    """For consecutive modes in ignition order (`ζ` decreasing), the initial scale `ε` at which
    their two drops merge: the gap between switch-on times (Eq. 158, `z_k0 = c_k ε`) equals the
    mean 10–90 % rise time `½(w_k + w_{k+1})`, `w_k = ln 81/ζ_k` — the criterion of
    `lvflow._scaling.resolved_steps`. For smaller ε the steps are resolved.

    To leading order `ln(1/ε_merge) = ln 9 · (1/ζ_k + 1/ζ_{k+1}) / (1/ζ_{k+1} − 1/ζ_k)`; the
    O(1) terms of Eq. 158 (`lvflow._closed_forms.ignition_time`) are included by bisection in
    `ln(1/ε)`. `0` for a pair still merged at `ε = 1e-304` (float64's end); NaN for equal rates,
    a pair with `ζ ≤ 0`, or a pair resolved for every admissible ε.
    """
    zeta, C, c = (np.asarray(a, dtype=np.float64) for a in (zeta, C, c))
    za, zb, Ca, Cb, ca, cb = zeta[:-1], zeta[1:], C[:-1], C[1:], c[:-1], c[1:]
    ok = (zb > 0) & (za > zb * (1 + 1e-12)) & (Ca > 0) & (Cb > 0) & (ca > 0) & (cb > 0)
    # Pairs that cannot merge get harmless stand-ins, masked to NaN at the end.
    za, zb = np.where(ok, za, 2.0), np.where(ok, zb, 1.0)
    Ca, Cb, ca, cb = (np.where(ok, v, 1.0) for v in (Ca, Cb, ca, cb))
    width = 0.5 * math.log(81.0) * (1 / za + 1 / zb)

    from ._closed_forms import ignition_time

    def excess(L):  # gap − width at ε = e^{−L}; increasing in L when ζ_a > ζ_b
        e = np.exp(-L)
        t = lambda z, C, c: np.asarray(ignition_time(z, C, c, e, rho=rho))  # Eq. 158
        return t(zb, Cb, cb) - t(za, Ca, ca) - width

    # Admissible ε leave room below each plateau (ζ > C c ε): L = ln(1/ε) > L_min. The upper
    # end, L = 700 (ε ≈ 1e-304), is the smallest ε a float64 holds.
    L_max = 700.0
    L_min = np.maximum(np.log(np.maximum(Ca * ca / za, Cb * cb / zb)), 0.0) + 1e-9
    lo, hi = L_min.copy(), np.full(za.shape, L_max)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        up = excess(mid) < 0
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    L = 0.5 * (lo + hi)
    # 0: still merged at ε = 1e-304 (any representable ε). NaN: equal or non-positive rates,
    # or resolved for every admissible ε.
    em = np.where(L < L_max - 1e-6, np.exp(-L), 0.0)
    return np.where(ok & (excess(L_min) < 0), em, np.nan)


def _default_horizon(lv: LotkaVolterra, eps: float, c: np.ndarray, tau_star: np.ndarray) -> float:
    """Long enough to see every switch-on: 1.2× the latest estimated ignition plus eight
    e-folding times of the slowest growing mode (it is then within 0.1 % of saturation)."""
    r, Ckk = np.asarray(lv.r), np.diagonal(np.asarray(lv.C))
    grow = (r > 0) & (Ckk > 0)
    if not np.any(r > 0):
        raise LvflowError("system: no mode has r_k > 0, so nothing is ever learned (the loss stays flat)")
    with np.errstate(divide="ignore", invalid="ignore"):
        t_iso = np.where(grow, np.log(np.maximum(r / (Ckk * c * eps), math.e)) / r, 0.0)
    t_sched = np.where(np.isfinite(tau_star), tau_star, 0.0) * math.log(1 / eps)
    rmin = float(np.min(r[r > 0]))
    return float(1.2 * max(np.max(t_iso), np.max(t_sched)) + 8.0 / rmin)


def _time_grid(t1: float, n: int) -> np.ndarray:
    """Linear and logarithmic samples of `[0, t1]` merged, so both plots are smooth."""
    # Always 2n − 1 points (no `unique`): a fixed length means one compiled solve per size.
    return np.sort(np.concatenate([np.linspace(0.0, t1, n), np.geomspace(t1 * 1e-4, t1, n)[:-1]]))


def predict(
    system: LotkaVolterra | NQF,
    *,
    eps: float | None = None,
    c=None,
    z0=None,
    init_std: float | None = None,
    width: int | None = None,
    learning_rate: float | None = None,
    rho: float = 0.5,
    t1: float | None = None,
    num_points: int = 400,
    force_lv: bool = False,
    alpha: tuple[float, float] | None = None,
    progress: bool = False,
    rtol: float = 1e-10,
    atol: float = 1e-12,
    source: str | None = None,
) -> Prediction:
    """Predict the plateaus, switch-on times and loss curve of gradient descent from small init.

    The system is the gLV `ż_k = z_k (r_k − Σ_j C_kj z_j)` (Eq. 32) started at `z_k0 = ε c_k`.
    Each mode switches on at `t*_k`, the time `z_k` reaches `ρ z_k(∞)` (Thm 8): for diagonal `C`
    (Thm 6, `a = 1`) Eq. 158 gives

    `t*_k = (1/r_k) [ln(1/ε) − ln(C_kk c_k/(r_k − C_kk c_k ε) · (1−ρ)/ρ)]`,

    and for any PSD `C` the times come from the ODE (`solve_lv`). As ε → 0 the loss becomes a
    staircase in `τ = t/ln(1/ε)` with ignitions at `τ*_k` (`1/r_k` for diagonal `C`) and
    plateau levels `Σ_{j not yet on} V_j` (Eq. 168), from `plateau_schedule`.

    **Arguments:**

    - `system`: a `LotkaVolterra`, or an `NQF` (reduced with `reduce_to_lv` when its `A_μ`
      commute, Assumption 1; otherwise integrated with the full M-flow `matrix_flow`, Eq. 28,
      from `M0 = ε I`, and the result says so).
    - `eps`, `c`, `z0`, `init_std`, `width`: the initial scale, one of: `eps` with `c`
      (`z_k0 = ε c_k`, default `c_k = 1`); `z0` (then `ε = max z0`); `init_std` σ with `width`
      d (`z_k0 ≈ d σ²`: `E[W Wᵀ] = d σ² I` for i.i.d. `N(0, σ²)` weights). Need `0 < ε < 1`.
    - `learning_rate`: GD's `η`; gradient-flow time `t` is `η ×` steps, so steps = `t/η`.
    - `rho`: the switch-on fraction `ρ ∈ (0, 1)`.
    - `t1`: the horizon (default: 1.5× the last expected switch-on plus 10 e-folds).
    - `num_points`: samples of the loss curve (linear and log-spaced, merged).
    - `force_lv`: raise `NotCommutingError` instead of falling back to the M-flow.
    - `alpha`: `(α₁, α₂)` of a power-law spectrum, to report `(α₁−1)/α₂` (Thm 9).
    - `progress`: show diffrax's progress meter during the ODE solve.
    - `rtol`, `atol`: the solver's tolerances on `ln z` (tight by default: the table prints
      `t*_k` to six digits, and a small system costs milliseconds).
    - `source`: a label for the report.

    **Returns:** a `Prediction`. **Raises:** `LvflowError` subclasses for bad input (one line
    naming it), `NotCommutingError` with `force_lv`, `SolverError` if the solve fails.
    """
    rho = check_in_open_interval("rho", rho, 0.0, 1.0)
    lr = None if learning_rate is None else check_positive("learning_rate", learning_rate)
    if not isinstance(num_points, (int, np.integer)) or num_points < 2:
        raise LvflowError(f"num_points: must be an integer ≥ 2, got {num_points!r}")
    if t1 is not None:
        t1 = check_positive("t1", t1)
    exponent = math.nan
    if alpha is not None:
        from ._scaling import predicted_exponent

        exponent = predicted_exponent(alpha1=alpha[0], alpha2=alpha[1])
    notes: list[str] = []
    if isinstance(system, NQF):
        from ._reduce import reduce_to_lv

        try:
            lv = reduce_to_lv(system)
        except NotCommutingError as e:
            if force_lv:
                raise
            return _predict_matrix_flow(
                system, eps=eps, c=c, z0=z0, init_std=init_std, width=width, lr=lr, rho=rho, t1=t1,
                num_points=num_points, exponent=exponent, source=source or "NQF", reason=str(e),
            )
        y2_known = True
        source = source or f"NQF reduced to a {lv.K}-mode gLV"
    elif isinstance(system, LotkaVolterra):
        lv = system
        y2_known = bool(np.asarray(lv.y2) != 0)
        source = source or f"{lv.K}-mode gLV"
    else:
        raise LvflowError(f"system: expected a LotkaVolterra or an NQF, got {type(system).__name__}")
    K = lv.K
    eps, c = initial_scale(K, eps=eps, c=c, z0=z0, init_std=init_std, width=width)
    z0 = eps * c
    r = np.asarray(lv.r)
    Cm = np.asarray(lv.C)
    Ckk = np.diagonal(Cm).copy()
    if np.any(Ckk <= 0):
        bad = np.flatnonzero(Ckk <= 0)
        raise LvflowError(f"C: diagonal entries C_kk must be positive (modes {(bad + 1).tolist()[:5]} have C_kk ≤ 0)")
    if np.any((r > 0) & (Ckk * z0 >= r)):
        k = int(np.flatnonzero((r > 0) & (Ckk * z0 >= r))[0])
        raise LvflowError(
            f"eps: too large, mode {k + 1} starts at or above its plateau (C_kk z_k0 = {Ckk[k] * z0[k]:.3g} ≥ r_k = {r[k]:.3g}); "
            "the theory describes small initialisation"
        )

    from ._schedule import plateau_schedule
    from ._solve import solve_lv

    # The ε → 0 limit: every z_k0 = Θ(ε), so c_k = O(1) drops out (s_k(0) = −1).
    sched = plateau_schedule(lv, eps)
    tau_star, plateau_k = _schedule_per_mode(sched, lv)
    if t1 is None:
        t1 = _default_horizon(lv, eps, c, tau_star)
    ts = _time_grid(t1, num_points)
    sol = solve_lv(lv, z0, t1, ts=ts, rho=rho, progress=progress, rtol=rtol, atol=atol)
    zs = np.asarray(sol.zs)
    t_star = np.asarray(sol.switch_on_times, dtype=np.float64)
    t_star = np.where(np.isfinite(t_star), t_star, np.inf)
    z_inf = np.asarray(getattr(sol, "z_inf", lv.equilibrium()))
    excess = np.asarray(lv.excess_loss(jnp.asarray(zs)))
    loss = np.asarray(lv.loss(jnp.asarray(zs))) if y2_known else np.full(ts.shape, np.nan)
    # Ignition order: finite-ε switch-on time, then the asymptotic τ*, then the index.
    order = np.lexsort((np.arange(K), np.where(np.isfinite(tau_star), tau_star, np.inf), t_star))
    never = [int(k) + 1 for k in order if not np.isfinite(t_star[k])]
    if never:
        notes.append(f"modes {never[:10]}{' …' if len(never) > 10 else ''} do not switch on before t1 = {t1:.4g}")
    if np.any(np.abs(Cm - np.diag(Ckk)) > 0):
        notes.append("C is not diagonal: modes interact; eps_merge uses the isolated-mode rates r_k, C_kk")
    zo, Co, co = r[order], Ckk[order], c[order]
    on = np.isfinite(t_star[order])
    em = eps_merge(zo, C=Co, c=co, rho=rho)
    em = np.where(on[:-1] & on[1:], em, np.nan)
    return Prediction(
        method="lv", source=source, eps=float(eps), rho=float(rho), learning_rate=lr, t1=float(t1),
        exponent=float(exponent), notes=tuple(notes),
        c=jnp.asarray(c), order=jnp.asarray(order), r=jnp.asarray(zo), C_diag=jnp.asarray(Co),
        V=jnp.asarray(np.where(zo > 0, zo**2 / (8 * Co), 0.0)),
        t_star=jnp.asarray(t_star[order]), tau_star=jnp.asarray(tau_star[order]),
        plateau_loss=jnp.asarray(plateau_k[order]), eps_merge=jnp.asarray(em), z_inf=jnp.asarray(z_inf),
        ts=jnp.asarray(ts), loss=jnp.asarray(loss), excess_loss=jnp.asarray(excess),
    )


def _schedule_per_mode(sched, lv: LotkaVolterra) -> tuple[np.ndarray, np.ndarray]:
    """Per mode: the ε → 0 ignition time `τ*_k` (inf if never) and the excess loss of the
    plateau just before it (Eq. 168), read off a `plateau_schedule` result."""
    tau_star = np.asarray(sched.tau_star, dtype=np.float64)
    tau_star = np.where(np.isfinite(tau_star), tau_star, np.inf)
    base = float(lv.loss(lv.equilibrium()))
    # The staircase L(τ) is right-continuous: its value just below τ*_k is the plateau before it.
    below = np.where(np.isfinite(tau_star), tau_star * (1 - 1e-9) - 1e-300, 0.0)
    before = np.asarray(sched.loss_at(jnp.asarray(below)), dtype=np.float64)
    return tau_star, np.where(np.isfinite(tau_star), before - base, np.nan)


def _predict_matrix_flow(nqf: NQF, *, eps, c, z0, init_std, width, lr, rho, t1, num_points, exponent, source, reason):
    """Fallback when the `A_μ` share no eigenbasis: the full M-flow (Eq. 28) from `M0 = ε I`."""
    from ._flow import matrix_flow

    if z0 is not None or (c is not None and np.ndim(c) > 0):
        raise LvflowError("z0/c: per-mode initial values need commuting structure matrices; give eps or init_std")
    eps, cvec = initial_scale(1, eps=eps, c=c, init_std=init_std, width=width)
    # r_k = 2 × (eigenvalues of Y = (4/m) Σ y_μ A_μ) in the commuting case: the same rates set
    # the time scale here.
    Y = np.asarray(nqf.Y)
    rates = 2 * np.linalg.eigvalsh((Y + Y.T) / 2)
    pos = rates[rates > 1e-9 * max(float(np.max(np.abs(rates))), np.finfo(float).tiny)]
    if pos.size == 0:
        raise LvflowError("data: Y = (4/m) Σ y_μ A_μ has no positive eigenvalue, so nothing is learned from small init")
    if t1 is None:
        t1 = float(1.5 * math.log(1 / eps) / pos.min() + 10.0 / pos.min())
    ts = _time_grid(t1, num_points)
    sol = matrix_flow(nqf, eps * float(cvec[0]) * np.eye(nqf.p), ts)
    loss = np.asarray(sol.loss)
    empty = jnp.zeros((0,))
    return Prediction(
        method="matrix_flow", source=source, eps=float(eps), rho=float(rho), learning_rate=lr, t1=float(t1),
        exponent=float(exponent),
        notes=(f"structure matrices do not commute ({reason}); used the full M-flow (Eq. 28) from M0 = eps·I, "
               "no per-mode table; excess_loss is relative to the loss at t1",),
        c=jnp.asarray(cvec), order=jnp.zeros((0,), dtype=int), r=empty, C_diag=empty, V=empty, t_star=empty,
        tau_star=empty, plateau_loss=empty, eps_merge=empty, z_inf=empty,
        ts=jnp.asarray(ts), loss=jnp.asarray(loss), excess_loss=jnp.asarray(loss - loss[-1]),
    )


# ----------------------------------------------------------------------------------------------
# Architecture + dataset → NQF
# ----------------------------------------------------------------------------------------------


def _arch(cls_name: str):
    import importlib
    import pkgutil

    from . import architectures

    cls = getattr(architectures, cls_name, None)
    if cls is None:  # not re-exported (yet): look in the package's modules
        for mod in pkgutil.iter_modules(architectures.__path__):
            cls = getattr(importlib.import_module(f"{architectures.__name__}.{mod.name}"), cls_name, None)
            if cls is not None:
                break
    return cls


def _vector_inputs(cls_name):
    def build(x, k, kernel):
        if x.ndim != 2:
            raise LvflowError(f"x: expected shape (m, n) (one input vector per row), got {x.shape}")
        import jax

        return _arch(cls_name)(x.shape[1], 1, k, key=jax.random.PRNGKey(0))

    return build


def _cnn(x, k, kernel):
    import jax

    if x.ndim != 3:
        raise LvflowError(f"x: expected shape (m, H, W) (one single-channel image per sample), got {x.shape}")
    if kernel is None:
        raise LvflowError("kernel: the cnn architecture needs the kernel shape (--kernel KH KW)")
    return _arch("CNN")(tuple(x.shape[1:]), tuple(int(v) for v in kernel), 1, k, key=jax.random.PRNGKey(0))


def _scalar_vector_inputs(cls_name):
    def build(x, k, kernel):
        if k is not None:
            raise LvflowError(f"y: {cls_name} has a scalar output, so y must have shape (m,), got (m, {k})")
        import jax

        if x.ndim != 2:
            raise LvflowError(f"x: expected shape (m, n) (one input vector per row), got {x.shape}")
        return _arch(cls_name)(x.shape[1], 1, key=jax.random.PRNGKey(0))

    return build


def _sensing(x, k, kernel):
    import jax

    if k is not None:
        raise LvflowError(f"y: matrix sensing has a scalar output, so y must have shape (m,), got (m, {k})")
    if x.ndim != 3 or x.shape[1] != x.shape[2]:
        raise LvflowError(f"x: expected shape (m, n, n) (one square sensing matrix S_a per sample), got {x.shape}")
    return _arch("MatrixSensing")(x.shape[1], 1, key=jax.random.PRNGKey(0))


# name → (class in `lvflow.architectures`, builder(x, k, kernel)). The width is irrelevant:
# `A(x)` is the same for every neuron (Thm 1), so a one-neuron module is built.
_ARCHITECTURES = {
    "mlp": ("MLP", _vector_inputs("MLP")),
    "cnn": ("CNN", _cnn),
    "diagonal": ("DiagonalLinear", _scalar_vector_inputs("DiagonalLinear")),
    "signed-diagonal": ("SignedDiagonal", _scalar_vector_inputs("SignedDiagonal")),
    "quadratic": ("QuadraticNet", _scalar_vector_inputs("QuadraticNet")),
    "sensing": ("MatrixSensing", _sensing),
}


def architecture_names() -> list[str]:
    """Built-in architectures `nqf_from_data` accepts (those present in `lvflow.architectures`)."""
    try:
        return [n for n, (cls, _) in _ARCHITECTURES.items() if _arch(cls) is not None]
    except ImportError:
        return []


def _xy(arrays: Mapping[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray]:
    keys = {k.lower(): k for k in arrays}
    if set(keys) == {""}:
        a = as_array(name, arrays[""], ndim=2)
        if a.shape[1] < 2:
            raise LvflowError(f"{name}: a header-less table needs input columns then a target column, got shape {a.shape}")
        return a[:, :-1], a[:, -1]
    if "x" not in keys or "y" not in keys:
        raise LvflowError(f"{name}: expected arrays 'x' (inputs) and 'y' (targets), found {sorted(arrays)}")
    x = as_array(f"{name}: x", arrays[keys["x"]])
    y = as_array(f"{name}: y", arrays[keys["y"]], ndim=(1, 2))
    if x.ndim == 1:
        x = x[:, None]
    if x.shape[0] != y.shape[0]:
        raise LvflowError(f"{name}: x has {x.shape[0]} samples but y has {y.shape[0]}")
    return x, y


def nqf_from_data(architecture: str, arrays: Mapping[str, Any], *, kernel=None, name: str = "data") -> NQF:
    """The NQF of a built-in architecture on a dataset: `A_μ = A(x_μ)` from the architecture's
    closed-form `structure` (Table 3), targets `y_μ` (Eq. 26).

    **Arguments:** `architecture` (see `architecture_names()`), `arrays` with `x` of shape
    `(m, …)` and `y` of shape `(m,)` or `(m, k)` (or one unnamed table whose last column is
    `y`), `kernel` for the CNN.
    """
    import jax

    names = architecture_names()
    if architecture not in names:
        raise LvflowError(f"architecture: unknown {architecture!r}; built-in: {', '.join(names) or 'none available'}")
    x, y = _xy(arrays, name)
    if x.shape[0] == 0:
        raise LvflowError(f"{name}: holds no samples")
    k = None if y.ndim == 1 else y.shape[1]
    model = _ARCHITECTURES[architecture][1](x, k, kernel)
    A = jax.vmap(model.structure)(jnp.asarray(x))
    return NQF(A, y)
