"""A sweep's evaluation: one row of a batch (`make_member`: the predict kernel,
`_workflow/predict_kernel.configuration`, plus the ε → 0 schedule's columns), a batch (`batched`:
vmapped, or one member after another), and the per-configuration numbers read off the results on
the host (`derived`, `drop_columns`)."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from .._curve.drops import loss_drops
from .._workflow.predict_kernel import configuration
from .base import Init, Schedule

if TYPE_CHECKING:
    from .families import Group


# --------------------------------------------------------------------------------------------
# A sweep's member: one row of a batch
# --------------------------------------------------------------------------------------------


def _staircase(tau, V):
    """Eq. 168 per mode for modes that ignite one at a time in index order (`τ*` strictly
    increasing): the excess loss just before mode `k` ignites, `Σ_{j ≥ k} V_j`."""
    return jnp.where(jnp.isfinite(tau), jnp.cumsum(V[::-1])[::-1], jnp.nan)


def make_member(group: Group, *, schedule: Schedule, host_schedule: bool, max_steps: int):
    """The evaluation of one configuration of `group` (a dict of arrays, one row of the batch):
    `configuration` plus the ε → 0 schedule's `tau_star` and `plateau_loss` (Eq. 168) and `r`,
    `V = r²/(8 C_kk)`; with the group's `horizon_points`, the curve at those points with its `loss`
    and `zs` (`configuration`'s `keep_zs`: the validity horizon's trajectory, `horizon.horizon_columns`)."""
    fam = group.family
    K = fam.K

    def member(x, *, check_curve: bool = True):
        r, Ckk, lv = fam.system(x)
        k = jnp.arange(1, K + 1, dtype=float)
        if group.init is Init.ARRAY:
            c = x["c"]
        elif group.init is Init.BETA:
            c = jnp.exp(-x["beta"] * jnp.log(k))  # k^{−β}
        else:
            c = jnp.ones(K)
        grow = r > 0
        V = jnp.where(grow, r**2 / (8 * jnp.where(Ckk > 0, Ckk, 1.0)), 0.0)
        if host_schedule:
            tau, plateau = x["tau_star"], x["plateau_loss"]
        elif schedule is not Schedule.NONE:  # a power-law spectrum: τ*_k = 1/r_k, increasing (Eq. 168)
            tau = jnp.where(grow, 1 / jnp.where(grow, r, 1.0), jnp.inf)
            plateau = _staircase(tau, V)
        else:
            tau = plateau = jnp.full(K, jnp.nan)
        res = configuration(
            r,
            Ckk,
            lv,
            c=c,
            eps=x["eps"],
            log_eps=x["log_eps"],
            rho=x["rho"],
            t1=x["t1"],
            tau=tau,
            z_on=x["z_on"] if "z_on" in x else jnp.zeros(K),
            z_floor=x.get("z_floor"),
            points=group.points or group.horizon_points,
            rtol=group.rtol,
            atol=group.atol,
            max_steps=max_steps,
            z_inf_known=fam.z_inf_known,
            check_curve=check_curve,
            keep_zs=bool(group.horizon_points),
        )
        out = {k: res[k] for k in ("valid", "success", "t1", "num_steps", "t_star", "z_inf", "bounded") if k in res}
        out.update(r=r, V=V)
        if schedule is not Schedule.NONE:
            out["tau_star"], out["plateau_loss"] = tau, plateau
        if group.points or group.horizon_points:
            out["ts"], out["excess_loss"] = res["ts"], res["excess_loss"]
        if group.horizon_points:
            out["loss"], out["zs"] = res["loss"], res["zs"]
        return out

    return member


#: configurations per vmapped slice where `batched` checks a batch's curves
_CHECK_SLICE = 64


def batched(member, *, per_member: bool):
    """`member` over a batch: `vmap`, or one after another (`lax.map`) where a vmapped batch would
    run batched LAPACK factorisations (a dense `C` under RODAS5P; a first pass for `z(∞)`), which
    deadlock on a CPU split into several devices (jaxlib's batched LU runs its batch on the thread
    pool the devices' programs occupy).

    Vmapped, `member` runs with `check_curve=False`: a diagonal group without a curve then does not
    evaluate Thm 6 at `[0, t1]` only to check it is finite (`configuration`), unless some member
    of the batch is not `bounded`, when the batch's `success` comes from `member` as is."""
    if per_member:
        return lambda x: jax.lax.map(member, x)

    def run(x):
        out = jax.vmap(functools.partial(member, check_curve=False))(x)
        if "bounded" in out:
            bounded, success = out.pop("bounded"), out["success"]
            # in slices: vmapped over the whole batch, the check's temporaries would enlarge the
            # working memory every call allocates (shared with the untaken branch), taken or not
            checked = lambda: jax.lax.map(member, x, batch_size=_CHECK_SLICE)["success"]  # noqa: E731
            out["success"] = jax.lax.cond(jnp.all(bounded), lambda: success, checked)
        return out

    return run


# --------------------------------------------------------------------------------------------
# Per-configuration numbers, on the host
# --------------------------------------------------------------------------------------------


def derived(out: dict[str, np.ndarray], eps: np.ndarray, lr: np.ndarray, alpha: tuple | None) -> dict:
    """Scalars per configuration from the per-mode results:

    - `ln_inv_eps` = ln(1/ε);
    - `n_on`: modes that switch on by `t1`; `t_first`, `t_last`: the first and last switch-on (the
      times `t*` a mode reaches `ρ` of its final strength: not when the loss drops, see
      `SweepResult.drops`); `steps_first = t_first/η`;
    - `tau_first`: the first ε → 0 ignition (`t_first ≈ tau_first · ln(1/ε)`);
    - `exponent`: Thm 9's `(α₁ − 1)/α₂` for a power-law spectrum with `α₁ > 1` (else NaN);
    - `exponent_fit`: the decay exponent the finite-ε staircase shows, the least-squares slope of
      −ln(plateau loss before each switch-on) against ln t*, over the 2nd to the ⌈K/10⌉-th
      switch-on (at least 4; NaN with fewer than 3 points). It tends to `exponent` as ε → 0,
      slowly (App. C).
    """
    t = out["t_star"]
    B, K = t.shape
    finite = np.isfinite(t)
    n_on = finite.sum(axis=1)
    with np.errstate(invalid="ignore"):
        t_first = np.min(t, axis=1) if K else np.full(B, np.inf)
        t_last = np.max(np.where(finite, t, -np.inf), axis=1)
    t_last = np.where(n_on > 0, t_last, np.nan)
    res = {
        "ln_inv_eps": -np.log(eps),
        "n_on": n_on.astype(np.int64),
        "t_first": t_first,
        "t_last": t_last,
        "steps_first": t_first / lr,
    }
    if "tau_star" in out:
        tau = out["tau_star"]
        res["tau_first"] = np.min(np.where(np.isnan(tau), np.inf, tau), axis=1)
    if alpha is not None:
        a1, a2 = alpha
        with np.errstate(invalid="ignore", divide="ignore"):
            res["exponent"] = np.where(a1 > 1, (a1 - 1) / a2, np.nan)
    else:
        res["exponent"] = np.full(B, np.nan)
    res["exponent_fit"] = _staircase_exponent(t, out.get("plateau_loss"))
    return res


#: drops of each configuration's curve given their own columns (`drop_columns`)
DROPS_SHOWN = 3
_PER_DROP = ("t", "step", "excess_loss_before", "excess_loss_after", "complete")
_READ = ("t", "excess_loss_before", "excess_loss_after")  # read off `LossDrops` (the rest derived)
#: the columns `drop_columns` returns, in order
DROP_COLUMNS = ("n_drops",) + tuple(f"drop{j + 1}_{k}" for j in range(DROPS_SHOWN) for k in _PER_DROP)


def drop_columns(ts: np.ndarray, excess: np.ndarray, lr: np.ndarray) -> dict[str, np.ndarray]:
    """Per configuration, the drops of its excess-loss curve as `predict`'s drops table reads them
    (`loss_drops`: plateau to plateau, timed where the loss crosses the midpoint between them):

    - `n_drops`: how many drops the curve has;
    - for the first `DROPS_SHOWN` drops `j = 1, 2, 3` (NaN, or False, where the curve has fewer):
      `drop{j}_t` (the time the loss crosses the midpoint between the plateaus on either side),
      `drop{j}_step` (`drop{j}_t/η`), `drop{j}_excess_loss_before`, `drop{j}_excess_loss_after`
      (the plateau levels of the excess loss `L − min L`) and `drop{j}_complete` (False: still
      falling at the horizon).

    **Arguments:** `ts`, `excess` of shape `(B, T)` (NaN-free: one group's curves), `lr` of shape
    `(B,)` (NaN where not given).

    **Returns:** the columns, each of shape `(B,)`.
    """
    B = ts.shape[0]
    n = np.zeros(B, dtype=np.int64)
    cols = {k: np.full((B, DROPS_SHOWN), np.nan) for k in _READ}
    complete = np.zeros((B, DROPS_SHOWN), dtype=bool)
    for b in range(B):
        d = loss_drops(ts[b], excess[b])
        n[b] = len(d)
        m = min(len(d), DROPS_SHOWN)
        cols["t"][b, :m] = d.t_mid[:m]
        cols["excess_loss_before"][b, :m] = d.loss_before[:m]
        cols["excess_loss_after"][b, :m] = d.loss_after[:m]
        complete[b, :m] = d.complete[:m]
    out: dict[str, np.ndarray] = {"n_drops": n}
    for j in range(DROPS_SHOWN):
        out[f"drop{j + 1}_t"] = cols["t"][:, j]
        out[f"drop{j + 1}_step"] = cols["t"][:, j] / lr  # NaN where no learning rate is given
        out[f"drop{j + 1}_excess_loss_before"] = cols["excess_loss_before"][:, j]
        out[f"drop{j + 1}_excess_loss_after"] = cols["excess_loss_after"][:, j]
        out[f"drop{j + 1}_complete"] = complete[:, j]
    return out


def _staircase_exponent(t: np.ndarray, plateau: np.ndarray | None) -> np.ndarray:
    B, K = t.shape
    if plateau is None or K < 4:
        return np.full(B, np.nan)
    hi = max(4, math.ceil(K / 10))
    order = np.argsort(t, axis=1, kind="stable")[:, 1:hi]
    x = np.take_along_axis(t, order, axis=1)
    y = np.take_along_axis(plateau, order, axis=1)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lx = np.where(ok, np.log(np.where(ok, x, 1.0)), 0.0)
        ly = np.where(ok, np.log(np.where(ok, y, 1.0)), 0.0)
        n = ok.sum(axis=1)
        mx = lx.sum(axis=1) / n
        my = ly.sum(axis=1) / n
        dx = np.where(ok, lx - mx[:, None], 0.0)
        slope = (dx * (ly - my[:, None])).sum(axis=1) / (dx * dx).sum(axis=1)
    return np.where(n >= 3, -slope, np.nan)
