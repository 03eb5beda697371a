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

import enum
import math
import warnings

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._core.errors import DivergenceError, LvflowError, NotCommutingError, SolverError
from .._core.validate import as_array, to_jax
from .._curve.drops import loss_drops
from .._form.drops import matrix_drops_path
from .._form.nqf import NQF
from .._glv.lv import AbstractLotkaVolterra, LotkaVolterra, LowRankLotkaVolterra
from .._glv.reduce import reduce_to_lv
from .._glv.solve import _DEFAULT_MAX_STEPS
from .._schedule.scaling import predicted_exponent
from .._schedule.schedule import PlateauSchedule, plateau_excess_in_order, plateau_schedule
from .eps_merge import eps_merge
from .predict_horizon import (
    HORIZON_FRACTION,
    PredictionHorizon,
    check_network,
    floor_time,
    prediction_horizon,
    probe_indices,
)
from .predict_inputs import check_curve_memory, check_drops_finite, initial_scale
from .predict_kernel import configuration, loss_floor, switch_off_levels
from .prediction import Prediction
from .spec import Configurations, check_ranges


def predict(
    system: LotkaVolterra | LowRankLotkaVolterra | NQF,
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
    network=None,
    inputs=None,
    horizon_fraction: float = HORIZON_FRACTION,
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
    - `learning_rate`: GD's `η`; gradient-flow time `t` is `η ×` steps, so steps = `t/η`. For the
      M-flow it also selects GD's exact map of `M` (Thm 2) in place of the flow, so the drop
      table's steps are GD's own at this `η` (`matrix_drops`).
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
    - `network`, `inputs`: for an `NQF`, the network it is the NQF of (a sum-form module from
      `lvflow.architectures`, or its NQF twin; only its configuration is used) and the inputs `x_μ`
      it was built from (samples on axis 0), to report the validity horizon (`Prediction.horizon`,
      `PredictionHorizon`): along the predicted `M(t)`, the first time Thm 13's next term (Eq. 200)
      reaches `horizon_fraction` of the NQF's output, from representative neurons of width `width`
      (default: the network's own). `None` for a network that is exactly its NQF.
    - `horizon_fraction`: that fraction, `> 0`.
    - `input_shape`: for an `NQF` of a known architecture, the shape of the input side of a
      neuron (its first entries; e.g. `(8, 8)` for an MLP on 8×8 images, the kernel for a CNN),
      so that the drops' directions are reported as an input picture and an output vector.

    **Returns:** a `Prediction`. **Raises:** `LvflowError` subclasses for bad input (one line
    naming it; a `network` whose quadratic form on `inputs` is not the NQF's),
    `NotCommutingError` with `force_lv`, `SolverError` if the solve fails.
    """
    if not isinstance(num_points, (int, np.integer)):
        raise LvflowError(f"num_points: must be an integer ≥ 2, got {num_points!r}")
    check_ranges(Configurations.one({"rho": rho, "learning_rate": learning_rate, "t1": t1, "num_points": num_points}))
    rho, t1 = float(rho), None if t1 is None else float(t1)
    lr = None if learning_rate is None else float(learning_rate)
    exponent = math.nan
    if alpha is not None:
        exponent = predicted_exponent(alpha1=alpha[0], alpha2=alpha[1])
    notes: list[str] = []
    probe = None
    if network is not None:
        network, inputs = check_network(system, network, inputs)
        horizon_fraction = float(as_array("horizon_fraction", horizon_fraction, ndim=0))
        if not horizon_fraction > 0:
            raise LvflowError(f"horizon_fraction: must be > 0, got {horizon_fraction}")
        probe = (network, inputs, network.d if width is None else int(width), horizon_fraction)
    elif inputs is not None:
        raise LvflowError("inputs: only used with network= (the network whose NQF this is)")
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
                probe=probe,
            )
        y2_known = True
        source = source or f"NQF reduced to a {lv.K}-mode gLV"
    elif isinstance(system, (LotkaVolterra, LowRankLotkaVolterra)):
        lv = system
        y2_known = bool(np.asarray(lv.y2) != 0)
        source = source or f"{lv.K}-mode gLV"
    else:
        raise LvflowError(
            f"system: expected a LotkaVolterra, LowRankLotkaVolterra or an NQF, got {type(system).__name__}"
        )
    K = lv.K
    check_curve_memory(K, num_points)
    eps, c = initial_scale(K, eps=eps, c=c, z0=z0, init_std=init_std, width=width)
    z0 = eps * c
    r = np.asarray(lv.r)
    Ckk = np.asarray(lv.C_diagonal).copy()
    if np.any(Ckk <= 0):
        bad = np.flatnonzero(Ckk <= 0)
        raise LvflowError(f"C: diagonal entries C_kk must be positive (modes {(bad + 1).tolist()[:5]} have C_kk ≤ 0)")
    if not np.any(r > 0):
        raise LvflowError("system: no mode has r_k > 0, so nothing is ever learned (the loss stays flat)")
    check_drops_finite("system", r, Ckk)
    if np.any((r > 0) & (Ckk * z0 >= r)):
        k = int(np.flatnonzero((r > 0) & (Ckk * z0 >= r))[0])
        raise LvflowError(
            f"eps: too large, mode {k + 1} starts at or above its plateau "
            f"(C_kk z_k0 = {Ckk[k] * z0[k]:.3g} ≥ r_k = {r[k]:.3g}); "
            "the theory describes small initialisation"
        )

    # The ε → 0 limit: every z_k0 = Θ(ε), so c_k = O(1) drops out (s_k(0) = −1).
    sched = plateau_schedule(lv, eps)
    assert isinstance(sched, PlateauSchedule)  # a gLV's schedule (an NQF's only for an NQF)
    if y2_known:
        _check_y2(lv, sched)
    tau_star = np.asarray(sched.tau_star, dtype=np.float64)
    z_floor, unique = loss_floor(lv)
    out = _configuration(
        lv,
        c=c,
        eps=eps,
        rho=rho,
        t1=t1,
        tau=tau_star,
        z_on=switch_off_levels(lv, sched, z_floor),
        z_floor=z_floor,
        unique=unique,
        num_points=int(num_points),
        rtol=rtol,
        atol=atol,
        progress=progress,
        keep_zs=probe is not None,
    )
    t1, ts = float(out["t1"]), out["ts"]
    z_inf, t_star = out["z_inf"], out["t_star"]
    kinds = _kinds(z_inf, z0, t_star, out["later_off"], rho)
    loss = out["loss"] if y2_known else np.full(ts.shape, np.nan)
    # Ignition order: finite-ε switch-on time, then the asymptotic τ*, then the index.
    order = np.lexsort((np.arange(K), tau_star, t_star))
    notes += _mode_notes(order, t_star, kinds, t1)
    if lr is not None:
        notes += _stability_notes(lv, z_inf, lr)
    if not lv.is_diagonal:
        notes.append(
            "C is not diagonal: modes interact; V_k = r_k²/(8 C_kk) is what mode k would remove alone (the drops "
            "this run makes are the drop column) and eps_merge uses the isolated-mode rates r_k, C_kk"
        )
    tau_order = np.lexsort((np.arange(K), tau_star))
    if not np.array_equal(order[np.isfinite(t_star[order])], tau_order[np.isfinite(t_star[tau_order])]):
        notes.append(
            "at this eps the modes switch on in another order than as eps → 0 (compare t*_k with tau*_k): the "
            "plateau-loss column follows this eps's order, the eps → 0 staircase its own"
        )
    zo, Co, co = r[order], Ckk[order], c[order]
    on = np.isfinite(t_star[order])
    em = eps_merge(zo, C=Co, c=co, rho=rho)
    em = np.where(on[:-1] & on[1:], em, np.nan)
    plateau, drop = np.full(K, np.nan), np.full(K, np.nan)
    plateau[: int(on.sum())], drop[: int(on.sum())] = plateau_excess_in_order(lv, order[on])  # on: first rows
    horizon = None
    if probe is not None and y2_known:
        horizon = _lv_horizon(lv, probe, z0, ts, loss, out["excess_loss"], out["zs"])
    return Prediction(
        method="lv",
        **_header(source, eps, rho, lr, t1, exponent),
        notes=tuple(notes),
        c=to_jax(c),
        order=to_jax(order),
        r=to_jax(zo),
        C_diag=to_jax(Co),
        V=to_jax(np.where(zo > 0, zo**2 / (8 * Co), 0.0)),
        t_star=to_jax(t_star[order]),
        tau_star=to_jax(tau_star[order]),
        plateau_loss=to_jax(plateau),
        eps_merge=to_jax(em),
        z_inf=to_jax(z_inf),
        ts=to_jax(ts),
        loss=to_jax(loss),
        excess_loss=to_jax(out["excess_loss"]),
        **_curve_drops(ts, loss, out["excess_loss"]),
        drop=to_jax(drop),
        limit_tau=to_jax(sched.tau),
        limit_excess=to_jax(_excess(sched)),
        horizon=horizon,
    )


def _lv_horizon(lv, probe, z0, ts, loss, excess, zs) -> PredictionHorizon | None:
    """The validity horizon of a gLV reduced from the network's NQF: `M(t) = P diag(z(t)) Pᵀ` plus the
    untouched directions at their start `ε`, at the probed times of the curve."""
    network, X, width, fraction = probe
    idx = probe_indices(ts, loss)
    P = np.asarray(lv.P)
    rest = float(np.max(z0)) * (np.eye(P.shape[0]) - P @ P.T)
    Ms = np.einsum("ik,tk,jk->tij", P, np.asarray(zs)[idx], P) + rest
    floor_t = floor_time(ts, excess, True)
    return prediction_horizon(network, X, np.asarray(ts)[idx], Ms, width=width, fraction=fraction, floor_t=floor_t)


def _configuration(
    lv: AbstractLotkaVolterra, *, c, eps, rho, t1, tau, z_on, z_floor, unique, num_points, rtol, atol, progress, keep_zs
) -> dict[str, np.ndarray]:
    """One call of the per-configuration prediction (`lvflow._workflow.predict_kernel.configuration`, the
    function `sweep` vmaps), compiled once per shape; its arrays on the host.

    **Raises:** `SolverError` when the solve fails (not finite, or out of steps).
    """
    diagonal = bool(lv.is_diagonal)
    arrays = dict(
        r=np.asarray(lv.r, dtype=float),
        Ckk=np.asarray(lv.C_diagonal, dtype=float),
        lv=None if diagonal else lv,
        c=np.asarray(c, dtype=float),
        eps=np.asarray(eps, dtype=float),
        log_eps=np.asarray(math.log(eps)),  # on the host: a subnormal ε reads as 0 on a device
        rho=np.asarray(rho, dtype=float),
        t1=np.asarray(np.nan if t1 is None else t1, dtype=float),
        tau=np.asarray(tau, dtype=float),
        z_on=np.asarray(z_on, dtype=float),
        z_floor=None if diagonal else np.asarray(z_floor, dtype=float),
        y2=np.asarray(lv.y2, dtype=float),
    )
    statics = dict(
        points=num_points,
        rtol=float(rtol),
        atol=float(atol),
        max_steps=_DEFAULT_MAX_STEPS,
        z_inf_known=bool(unique),
        progress=bool(progress) and not diagonal,
        keep_zs=bool(keep_zs),
    )
    out = {k: np.asarray(v) for k, v in _configuration_jit(arrays, **statics).items()}
    if not bool(out["success"]):
        why = "out of steps" if int(out["num_steps"]) >= _DEFAULT_MAX_STEPS else "non-finite values in the solution"
        raise SolverError(f"solve_lv: {why} (after {int(out['num_steps'])} steps)")
    return out


@eqx.filter_jit
def _configuration_jit(arrays, **statics):
    return configuration(**arrays, **statics)


class _Kind(enum.IntEnum):
    """What kind of mode each is (`_kinds`): `ON`; `DECAYS` (never grows: `z_k(∞) ≤ z_k0`, e.g.
    `r_k < 0`); `FROM_START` (grows, but starts at or above `ρ z_k(∞)`: `t*_k = 0`, no switch-on
    to see); `OFF_LATER` (switches on, then a competitor switches it off: `z_k(∞) = 0`; `t*_k` is
    when it reaches `ρ` × the level of the plateau it ignites into, from the ε → 0 schedule);
    `LATE` (not on before `t1`)."""

    ON = 0
    DECAYS = 1
    FROM_START = 2
    OFF_LATER = 3
    LATE = 4


def _kinds(z_inf, z0, t_star, later_off, rho) -> np.ndarray:
    """Each mode's `_Kind`, as an integer array."""
    kinds = np.where(later_off, _Kind.OFF_LATER, np.where(z_inf > z0, _Kind.ON, _Kind.DECAYS))
    kinds = np.where((kinds != _Kind.DECAYS) & ~np.isfinite(t_star), _Kind.LATE, kinds)
    return np.where((kinds == _Kind.ON) & (rho * z_inf <= z0), _Kind.FROM_START, kinds)


def _mode_notes(order, t_star, kinds, t1) -> list[str]:
    """One note per kind of mode that is not a plain switch-on (modes 1-based, in table order)."""

    def modes(kind):
        m = [int(k) + 1 for k in order if kinds[k] == kind]
        return f"{m[:10]}{' …' if len(m) > 10 else ''}", len(m)

    out = []
    if not np.any(np.isfinite(t_star)):
        out.append(f"no mode has switched on by t1 = {t1:.4g}: the loss is still on its first plateau")
    for kind, text in (
        (_Kind.LATE, "do not switch on before t1 = {t1:.4g}"),
        (
            _Kind.DECAYS,
            "end at or below their start (z_k(inf) ≤ z_k(0)): no switch-on (a mode may grow for a while before "
            "competitors push it down)",
        ),
        (_Kind.FROM_START, "start at or above rho z_k(inf) (z_k(0) ≥ rho z_k(inf)): t*_k = 0, no switch-on to see"),
        (
            _Kind.OFF_LATER,
            "switch on, then competitors switch them off (z_k(inf) = 0): their t*_k is when z_k reaches rho × "
            "the plateau it switches on to",
        ),
    ):
        m, n = modes(kind)
        if n:
            out.append(f"modes {m}: {text.format(t1=t1)}")
    return out


def _check_y2(lv: AbstractLotkaVolterra, sched) -> None:
    """`y2 = (1/m) Σ y_μ²` bounds the loss below by 0: the last plateau's loss
    `L∞ = y2 − rᵀz*/4 + z*ᵀCz*/8` (the schedule's, 0 within rounding) must not be negative."""
    y2 = float(lv.y2)
    if y2 < 0:
        raise LvflowError(f"y2: must be ≥ 0 (the mean of the squared targets), got {y2:g}")
    L_inf = float(sched.loss[-1])
    if L_inf < 0:
        raise LvflowError(
            f"y2: {y2:.6g} is below rᵀz*/8 = {y2 - L_inf:.6g}, so the loss would end negative; y2 is the mean of the "
            "squared targets, at least the loss the modes can remove"
        )


def _stability_notes(lv: AbstractLotkaVolterra, z_inf: np.ndarray, lr: float) -> list[str]:
    """GD with step `η` is stable at the last plateau only if `η λ_max < 2`, `λ_max` the largest
    eigenvalue of the loss Hessian there in the weights `w_k = √z_k`, `Diag(√z∞) C Diag(√z∞)`
    (for diagonal `C`, `max_k r_k`). Warns (and returns the note) when it is not."""
    lam = _hessian_max_eig(lv, z_inf)
    if not lr * lam > 2:
        return []
    msg = (
        f"learning rate {lr:g}: eta·lambda_max = {lr * lam:.3g} > 2 (lambda_max = {lam:.3g}, the loss Hessian's "
        "largest eigenvalue at the last plateau, Diag(√z∞) C Diag(√z∞)): gradient descent is unstable there, "
        "so steps = t/eta do not describe it; use eta < 2/lambda_max"
    )
    warnings.warn(msg, stacklevel=3)
    return [msg]


def _hessian_max_eig(lv: AbstractLotkaVolterra, z_inf: np.ndarray) -> float:
    """Largest eigenvalue of `Diag(√z∞) C Diag(√z∞)`: dense up to 2000 modes, else Lanczos on `C z`
    with full reorthogonalisation (PSD, so the largest Ritz value converges first), to a residual
    `|β_m y_m| ≤ 1e-12 θ`."""
    s = np.sqrt(np.maximum(z_inf, 0.0))
    if lv.is_diagonal:
        return float(np.max(s**2 * np.asarray(lv.C_diagonal), initial=0.0))
    if lv.K <= 2000:
        return float(np.linalg.eigvalsh(s[:, None] * np.asarray(lv.C) * s[None, :])[-1])
    n = min(lv.K, 400)
    V = np.zeros((n, lv.K))
    v = np.random.default_rng(0).standard_normal(lv.K)
    V[0] = v / np.linalg.norm(v)
    alpha, beta = np.zeros(n), np.zeros(n)
    theta = 0.0
    for m in range(n):
        w = s * np.asarray(lv.Cz(jnp.asarray(s * V[m])), dtype=np.float64)
        alpha[m] = V[m] @ w
        for _ in range(2):  # full reorthogonalisation, twice
            w -= V[: m + 1].T @ (V[: m + 1] @ w)
        beta[m] = np.linalg.norm(w)
        if m % 8 == 7 or m == n - 1 or beta[m] <= 1e-300:
            T = np.diag(alpha[: m + 1]) + np.diag(beta[:m], 1) + np.diag(beta[:m], -1)
            lam, Y = np.linalg.eigh(T)
            theta = float(lam[-1])
            if beta[m] * abs(float(Y[-1, -1])) <= 1e-12 * max(abs(theta), 1e-300) or beta[m] <= 1e-300:
                break
        if m + 1 < n:
            V[m + 1] = w / beta[m]
    return theta


def _curve_drops(ts, loss, excess) -> dict:
    """The drops of the predicted curve (`loss_drops`), read off the loss where it is known, else
    off the excess loss (the same drops, shifted by the final loss)."""
    known = bool(np.all(np.isfinite(loss)))
    return dict(drops=loss_drops(ts, loss if known else excess), drops_of="loss" if known else "excess_loss")


def _header(source, eps, rho, lr, t1, exponent) -> dict:
    """The `Prediction` fields every method fills alike."""
    return dict(source=source, eps=float(eps), rho=float(rho), learning_rate=lr, t1=float(t1), exponent=float(exponent))


def _excess(sched) -> np.ndarray:
    """A schedule's plateau levels over its last one (`excess`; from `loss` for a schedule built without it)."""
    if sched.excess is not None:
        return np.asarray(sched.excess, dtype=np.float64)
    loss = np.asarray(sched.loss, dtype=np.float64)
    return loss - loss[-1]


def _schedule_per_mode(sched, lv: AbstractLotkaVolterra) -> tuple[np.ndarray, np.ndarray]:
    """Per mode: the ε → 0 ignition time `τ*_k` (inf if never) and the excess loss of the
    plateau just before it (Eq. 168), read off a `plateau_schedule` result (its `excess`, formed
    without cancellation; the level before the first event at `τ*_k`)."""
    tau_star = np.asarray(sched.tau_star, dtype=np.float64)
    tau_star = np.where(np.isfinite(tau_star), tau_star, np.inf)
    excess = _excess(sched)
    before = excess[np.searchsorted(np.asarray(sched.tau), np.where(np.isfinite(tau_star), tau_star, 0.0))]
    return tau_star, np.where(np.isfinite(tau_star), before, np.nan)


def _predict_matrix_flow(
    nqf: NQF, *, eps, c, z0, init_std, width, lr, rho, t1, num_points, exponent, source, reason, input_shape, probe
):
    """When the `A_μ` share no eigenbasis: the full M-flow (Eq. 28) from `M0 = ε I`, or with a
    learning rate GD's exact map of `M` (Thm 2), run until it converges, and its drops
    (`matrix_drops`)."""
    if z0 is not None or (c is not None and np.ndim(c) > 0):
        raise LvflowError("z0/c: per-mode initial values need commuting structure matrices; give eps or init_std")
    eps, cvec = initial_scale(1, eps=eps, c=c, init_std=init_std, width=width)
    M0 = eps * float(cvec[0]) * np.eye(nqf.p)
    notes = []
    try:
        drops, ts, Ms = matrix_drops_path(nqf, M0, learning_rate=lr, rho=rho, t1=t1, num_points=num_points)
    except DivergenceError as e:
        # The quadratic form's curvature grows with M without bound; a real network's saturating
        # units need not follow it past 2/η, so the flow (GD's η → 0 limit) is the prediction left.
        notes.append(
            f"gradient descent on the quadratic form diverges at lr {lr:g} (its loss overflows by step {e.step}): its "
            "curvature passes 2/lr, which a network with saturating units may avoid; shown instead: the gradient "
            "flow, in steps t/lr"
        )
        drops, ts, Ms = matrix_drops_path(nqf, M0, rho=rho, t1=t1, num_points=num_points)
    loss = np.asarray(drops.loss)
    floor = drops.loss_floor if math.isfinite(drops.loss_floor) else float(loss[-1])
    gd = drops.learning_rate is not None
    dynamics = f"gradient descent's exact map of M (Thm 2) at lr {lr:g}" if gd else "the full M-flow (Eq. 28)"
    notes.insert(
        0,
        f"structure matrices do not commute ({reason}); used {dynamics} from M0 = eps·I: "
        "the directions are eigenvectors of M(t_end) that switch on",
    )
    grown = int(np.sum(np.asarray(drops.multiplicity)))
    if width is not None and grown > width:
        notes.append(
            f"{grown} directions of M switch on, but the {width} neurons' M = W Wᵀ has rank ≤ {width}: "
            "a network this narrow cannot follow M0 = eps·I; the prediction is for a width ≥ "
            f"{grown}"
        )
    if t1 is None and not drops.converged:
        notes.append(f"the dynamics had not converged by t = {drops.t_end:.4g} (the longest horizon tried)")
    horizon = None
    if probe is not None:
        network, X, hwidth, fraction = probe
        idx = probe_indices(ts, loss)
        floor_t = floor_time(ts, loss - floor, math.isfinite(drops.loss_floor))
        horizon = prediction_horizon(network, X, ts[idx], Ms[idx], width=hwidth, fraction=fraction, floor_t=floor_t)
    del Ms
    empty = to_jax(np.zeros(0))
    return Prediction(
        method="matrix_gd" if gd else "matrix_flow",
        **_header(source, eps, rho, lr, drops.t_end, exponent),
        notes=tuple(notes),
        c=to_jax(cvec),
        order=to_jax(np.zeros(0, dtype=int)),
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
        excess_loss=to_jax(loss - floor),
        drops=drops.drops,
        drops_of="loss",
        matrix=drops,
        input_shape=input_shape,
        horizon=horizon,
    )
