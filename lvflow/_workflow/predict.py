"""`predict`: the plateaus, switch-on times and loss curve of a training run, from its NQF.

The user's workflow in one call: a gLV system (Eq. 32) — given directly, built from a power-law
spectrum (Thm 9, `power_law_lv`), or reduced from an architecture's structure matrices on a
dataset (Assumption 1, `nqf_from_data`) — plus an initial scale ε, gives

- the finite-ε switch-on times `t*_k` (the time `z_k` reaches `ρ z_k(∞)`, Thm 8, Eq. 158),
  from an ODE solve (`solve_lv`);
- the ε → 0 schedule: ignition times `τ*_k` in `τ = t/ln(1/ε)` and the plateau losses
  (Eq. 168; `plateau_schedule`);
- the predicted loss curve, in gradient-flow time `t` and in training steps `t/η`;
- for a power-law spectrum, the loss exponent `(α₁ − 1)/α₂` (Thm 9) and, for each pair of
  consecutive modes, the ε above which their two drops merge into one (`eps_merge`).

The result is a `Prediction` (`prediction.py`); the inputs are built in `predict_inputs.py`
and `predict_data.py`.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from .._errors import LvflowError, NotCommutingError
from .._form.nqf import NQF
from .._glv.lv import AbstractLotkaVolterra
from .._glv.reduce import reduce_to_lv
from .._glv.solve import solve_lv
from .._scaling import predicted_exponent
from .._schedule.schedule import plateau_schedule
from .._validate import check_in_open_interval, check_positive
from .eps_merge import eps_merge
from .predict_inputs import initial_scale
from .prediction import Prediction


def predict(
    system: AbstractLotkaVolterra | NQF,
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
    input_shape: tuple[int, ...] | None = None,
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

    - `system`: a `LotkaVolterra` or `LowRankLotkaVolterra`, or an `NQF` (reduced with `reduce_to_lv` when its `A_μ`
      commute, Assumption 1; otherwise the full M-flow, Eq. 28, is run from `M0 = ε I` until it
      converges, and its drops are found by `matrix_drops`; the result says so).
    - `eps`, `c`, `z0`, `init_std`, `width`: the initial scale, one of: `eps` with `c`
      (`z_k0 = ε c_k`, default `c_k = 1`); `z0` (then `ε = max z0`); `init_std` σ with `width`
      d (`z_k0 ≈ d σ²`: `E[W Wᵀ] = d σ² I` for i.i.d. `N(0, σ²)` weights). Need `0 < ε < 1`.
    - `learning_rate`: GD's `η`; gradient-flow time `t` is `η ×` steps, so steps = `t/η`.
    - `rho`: the switch-on fraction `ρ ∈ (0, 1)`.
    - `t1`: the horizon (default: 1.2× the last expected switch-on plus 8 e-folding times of the
      slowest mode; for the M-flow, until the flow converges, see `matrix_drops`).
    - `num_points`: samples of the loss curve (linear and log-spaced, merged).
    - `force_lv`: raise `NotCommutingError` instead of falling back to the M-flow.
    - `alpha`: `(α₁, α₂)` of a power-law spectrum, to report `(α₁−1)/α₂` (Thm 9).
    - `progress`: show a progress bar during the ODE solve (a diagonal `C` is solved exactly, Thm 6,
      with no steps and no bar).
    - `rtol`, `atol`: the solver's tolerances on `ln z` (tight by default: the table prints
      `t*_k` to six digits, and a small system costs milliseconds).
    - `source`: a label for the report.
    - `input_shape`: for an `NQF` of a known architecture, the shape of the input side of a
      neuron (its first entries; e.g. `(8, 8)` for an MLP on 8×8 images, the kernel for a CNN),
      so that the drops' directions are reported as an input picture and an output vector.

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
        exponent = predicted_exponent(alpha1=alpha[0], alpha2=alpha[1])
    notes: list[str] = []
    if isinstance(system, NQF):
        try:
            lv = reduce_to_lv(system)
        except NotCommutingError as e:
            if force_lv:
                raise
            return _predict_matrix_flow(
                system,
                eps=eps,
                c=c,
                z0=z0,
                init_std=init_std,
                width=width,
                lr=lr,
                rho=rho,
                t1=t1,
                num_points=num_points,
                exponent=exponent,
                source=source or "NQF",
                reason=str(e),
                input_shape=None if input_shape is None else tuple(int(v) for v in input_shape),
            )
        y2_known = True
        source = source or f"NQF reduced to a {lv.K}-mode gLV"
    elif isinstance(system, AbstractLotkaVolterra):
        lv = system
        y2_known = bool(np.asarray(lv.y2) != 0)
        source = source or f"{lv.K}-mode gLV"
    else:
        raise LvflowError(
            f"system: expected a LotkaVolterra, LowRankLotkaVolterra or an NQF, got {type(system).__name__}"
        )
    K = lv.K
    eps, c = initial_scale(K, eps=eps, c=c, z0=z0, init_std=init_std, width=width)
    z0 = eps * c
    r = np.asarray(lv.r)
    Ckk = np.asarray(lv.C_diagonal).copy()
    if np.any(Ckk <= 0):
        bad = np.flatnonzero(Ckk <= 0)
        raise LvflowError(f"C: diagonal entries C_kk must be positive (modes {(bad + 1).tolist()[:5]} have C_kk ≤ 0)")
    if np.any((r > 0) & (Ckk * z0 >= r)):
        k = int(np.flatnonzero((r > 0) & (Ckk * z0 >= r))[0])
        raise LvflowError(
            f"eps: too large, mode {k + 1} starts at or above its plateau "
            f"(C_kk z_k0 = {Ckk[k] * z0[k]:.3g} ≥ r_k = {r[k]:.3g}); "
            "the theory describes small initialisation"
        )

    # The ε → 0 limit: every z_k0 = Θ(ε), so c_k = O(1) drops out (s_k(0) = −1).
    sched = plateau_schedule(lv, eps)
    tau_star, plateau_k = _schedule_per_mode(sched, lv)
    if t1 is None:
        t1 = _default_horizon(lv, eps, c, tau_star)
    ts = _time_grid(t1, num_points)
    sol = solve_lv(lv, z0, t1, ts=ts, rho=rho, progress=progress, rtol=rtol, atol=atol)
    t_star = np.asarray(sol.switch_on_times, dtype=np.float64)
    t_star = np.where(np.isfinite(t_star), t_star, np.inf)
    z_inf = np.asarray(sol.z_inf)
    # The solve's loss (Eq. 26 in modes): no second pass over the (n, K) trajectory.
    excess = np.asarray(sol.loss) - float(lv.loss(lv.equilibrium()))
    loss = np.asarray(sol.loss) if y2_known else np.full(ts.shape, np.nan)
    # Ignition order: finite-ε switch-on time, then the asymptotic τ*, then the index.
    order = np.lexsort((np.arange(K), np.where(np.isfinite(tau_star), tau_star, np.inf), t_star))
    never = [int(k) + 1 for k in order if not np.isfinite(t_star[k])]
    if never:
        notes.append(f"modes {never[:10]}{' …' if len(never) > 10 else ''} do not switch on before t1 = {t1:.4g}")
    if not lv.is_diagonal:
        notes.append("C is not diagonal: modes interact; eps_merge uses the isolated-mode rates r_k, C_kk")
    zo, Co, co = r[order], Ckk[order], c[order]
    on = np.isfinite(t_star[order])
    em = eps_merge(zo, C=Co, c=co, rho=rho)
    em = np.where(on[:-1] & on[1:], em, np.nan)
    return Prediction(
        method="lv",
        **_header(source, eps, rho, lr, t1, exponent),
        notes=tuple(notes),
        c=jnp.asarray(c),
        order=jnp.asarray(order),
        r=jnp.asarray(zo),
        C_diag=jnp.asarray(Co),
        V=jnp.asarray(np.where(zo > 0, zo**2 / (8 * Co), 0.0)),
        t_star=jnp.asarray(t_star[order]),
        tau_star=jnp.asarray(tau_star[order]),
        plateau_loss=jnp.asarray(plateau_k[order]),
        eps_merge=jnp.asarray(em),
        z_inf=jnp.asarray(z_inf),
        ts=jnp.asarray(ts),
        loss=jnp.asarray(loss),
        excess_loss=jnp.asarray(excess),
    )


def _header(source, eps, rho, lr, t1, exponent) -> dict:
    """The `Prediction` fields every method fills alike."""
    return dict(source=source, eps=float(eps), rho=float(rho), learning_rate=lr, t1=float(t1), exponent=float(exponent))


def _schedule_per_mode(sched, lv: AbstractLotkaVolterra) -> tuple[np.ndarray, np.ndarray]:
    """Per mode: the ε → 0 ignition time `τ*_k` (inf if never) and the excess loss of the
    plateau just before it (Eq. 168), read off a `plateau_schedule` result."""
    tau_star = np.asarray(sched.tau_star, dtype=np.float64)
    tau_star = np.where(np.isfinite(tau_star), tau_star, np.inf)
    base = float(lv.loss(lv.equilibrium()))
    # The staircase L(τ) is right-continuous: its value just below τ*_k is the plateau before it.
    below = np.where(np.isfinite(tau_star), tau_star * (1 - 1e-9) - 1e-300, 0.0)
    before = np.asarray(sched.loss_at(jnp.asarray(below)), dtype=np.float64)
    return tau_star, np.where(np.isfinite(tau_star), before - base, np.nan)


def _predict_matrix_flow(
    nqf: NQF, *, eps, c, z0, init_std, width, lr, rho, t1, num_points, exponent, source, reason, input_shape
):
    """When the `A_μ` share no eigenbasis: the full M-flow (Eq. 28) from `M0 = ε I`, run until it
    converges, and its drops (`matrix_drops`)."""
    if z0 is not None or (c is not None and np.ndim(c) > 0):
        raise LvflowError("z0/c: per-mode initial values need commuting structure matrices; give eps or init_std")
    from .._form.drops import matrix_drops  # diffrax's import is paid only on this path

    eps, cvec = initial_scale(1, eps=eps, c=c, init_std=init_std, width=width)
    drops = matrix_drops(nqf, eps * float(cvec[0]) * np.eye(nqf.p), rho=rho, t1=t1, num_points=num_points)
    loss = np.asarray(drops.loss)
    floor = drops.loss_floor if math.isfinite(drops.loss_floor) else float(loss[-1])
    notes = [
        f"structure matrices do not commute ({reason}); used the full M-flow (Eq. 28) from M0 = eps·I: "
        "a drop is a direction of M (an eigenvector of M(t_end)) switching on"
    ]
    if t1 is None and not drops.converged:
        notes.append(f"the flow had not converged by t = {drops.t_end:.4g} (the longest horizon tried)")
    empty = jnp.zeros((0,))
    return Prediction(
        method="matrix_flow",
        **_header(source, eps, rho, lr, drops.t_end, exponent),
        notes=tuple(notes),
        c=jnp.asarray(cvec),
        order=jnp.zeros((0,), dtype=int),
        r=empty,
        C_diag=empty,
        V=empty,
        t_star=empty,
        tau_star=empty,
        plateau_loss=empty,
        eps_merge=empty,
        z_inf=empty,
        ts=drops.ts,
        loss=drops.loss,
        excess_loss=jnp.asarray(loss - floor),
        drops=drops,
        input_shape=input_shape,
    )


def _default_horizon(lv: AbstractLotkaVolterra, eps: float, c: np.ndarray, tau_star: np.ndarray) -> float:
    """Long enough to see every switch-on: 1.2× the latest estimated ignition plus eight
    e-folding times of the slowest growing mode (it is then within 0.1 % of saturation)."""
    r, Ckk = np.asarray(lv.r), np.asarray(lv.C_diagonal)
    grow = (r > 0) & (Ckk > 0)
    if not np.any(r > 0):
        raise LvflowError("system: no mode has r_k > 0, so nothing is ever learned (the loss stays flat)")
    with np.errstate(divide="ignore", invalid="ignore"):  # logs of each factor: ε may be subnormal
        log_ratio = np.log(r) - np.log(Ckk) - np.log(c) - math.log(eps)
        t_iso = np.where(grow, np.maximum(log_ratio, 1.0) / r, 0.0)
    t_sched = np.where(np.isfinite(tau_star), tau_star, 0.0) * -math.log(eps)
    rmin = float(np.min(r[r > 0]))
    return float(1.2 * max(np.max(t_iso), np.max(t_sched)) + 8.0 / rmin)


def _time_grid(t1: float, n: int) -> np.ndarray:
    """Linear and logarithmic samples of `[0, t1]` merged, so both plots are smooth."""
    # Always 2n − 1 points (no `unique`): a fixed length means one compiled solve per size.
    return np.sort(np.concatenate([np.linspace(0.0, t1, n), np.geomspace(t1 * 1e-4, t1, n)[:-1]]))
