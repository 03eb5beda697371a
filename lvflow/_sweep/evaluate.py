"""One configuration of a sweep, as a function of arrays (vmapped over a batch, compiled once per
group), and the per-configuration numbers derived from it on the host.

For each configuration it computes what `predict` computes, per mode in the system's own order:

- `t_star`: the finite-ε switch-on time `t*_k` (`z_k = ρ z_k(∞)`, Thm 8): for a diagonal `C`
  Eq. 158 exactly (`ignition_time`, Thm 6), otherwise the ODE (`solve_lv`); `inf` if mode `k` does
  not grow (`z_k(∞) ≤ z_k0`, as `predict`'s "decays") or does not switch on by `t1`; a mode that
  switches on and is later switched off by a competitor (`z_k(∞) = 0`) is `inf` here, where
  `predict` re-solves for its time;
- `tau_star`, `plateau_loss`: the ε → 0 ignition time `τ*_k` and the excess loss of the plateau just
  before it (Eq. 168): `1/r_k` and the tail sums of `V` for a diagonal `C`; `plateau_schedule` on
  the host otherwise;
- `z_inf`, `r`, `V = r²/(8 C_kk)`, the horizon `t1` (`predict`'s default where not given), the
  solver's step count and success; with `curve`, the excess loss at `predict`'s time grid.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .._glv.closed_forms import ignition_time, orthogonal_features
from .._glv.solve import solve_lv
from .families import Group


def _staircase(tau, V):
    """Eq. 168 per mode for modes that ignite one at a time in index order (`τ*` strictly
    increasing): the excess loss just before mode `k` ignites, `Σ_{j ≥ k} V_j`."""
    return jnp.where(jnp.isfinite(tau), jnp.cumsum(V[::-1])[::-1], jnp.nan)


def _horizon(r, Ckk, c, eps, tau):
    """`predict`'s default horizon: 1.2× the latest estimated ignition (isolated-mode Eq. 158, and
    `τ*_k ln(1/ε)`) plus eight e-folding times of the slowest growing mode."""
    grow = (r > 0) & (Ckk > 0)
    ratio = r / jnp.where(grow, Ckk * c * eps, 1.0)
    t_iso = jnp.where(grow, jnp.log(jnp.maximum(ratio, math.e)) / jnp.where(grow, r, 1.0), 0.0)
    t_sched = jnp.where(jnp.isfinite(tau), tau, 0.0) * -jnp.log(eps)
    rmin = jnp.min(jnp.where(r > 0, r, jnp.inf))
    return 1.2 * jnp.maximum(jnp.max(t_iso), jnp.max(t_sched)) + 8.0 / rmin


def _time_grid(t1, n: int):
    """`predict`'s curve times: `n` linear and `n − 1` log-spaced samples of `[0, t1]`, merged."""
    ts = jnp.sort(jnp.concatenate([jnp.linspace(0.0, t1, n), jnp.geomspace(t1 * 1e-4, t1, n)[:-1]]))
    return jnp.minimum(ts, t1)


def make_member(group: Group, *, schedule: str, host_schedule: bool, max_steps: int):
    """The evaluation of one configuration (a dict of arrays, one row of the batch)."""
    fam = group.family
    K = fam.K
    diagonal = fam.structure == "diagonal"

    def member(x):
        r, Ckk, lv = fam.system(x)
        k = jnp.arange(1, K + 1, dtype=float)
        eps = x["eps"]
        if group.init == "array":
            c = x["c"]
        elif group.init == "beta":
            c = jnp.exp(-x["beta"] * jnp.log(k))  # k^{−β}
        else:
            c = jnp.ones(K)
        z0 = eps * c
        grow = r > 0
        # predict's refusals: C_kk ≤ 0, nothing learnable, a mode starting at or above its plateau
        valid = jnp.all(Ckk > 0) & jnp.any(grow) & ~jnp.any(grow & (Ckk * z0 >= r))
        V = jnp.where(grow, r**2 / (8 * jnp.where(Ckk > 0, Ckk, 1.0)), 0.0)
        if host_schedule:
            tau, plateau = x["tau_star"], x["plateau_loss"]
        elif schedule != "none":  # a power-law spectrum: τ*_k = 1/r_k, increasing (Eq. 168)
            tau = jnp.where(grow, 1 / jnp.where(grow, r, 1.0), jnp.inf)
            plateau = _staircase(tau, V)
        else:
            tau = plateau = jnp.full(K, jnp.nan)
        t1 = jnp.where(jnp.isnan(x["t1"]), _horizon(r, Ckk, c, eps, tau), x["t1"])
        ts = _time_grid(t1, group.points) if group.points else jnp.stack([jnp.zeros(()), t1])
        if diagonal:
            z_inf = jnp.where(grow, r / jnp.where(Ckk > 0, Ckk, 1.0), 0.0)
            t_star = ignition_time(r, jnp.where(Ckk > 0, Ckk, 1.0), c, eps, rho=x["rho"])
            t_star = jnp.where(t_star <= t1, t_star, jnp.inf)  # as solve_lv: not reached by t1
            steps = jnp.zeros((), dtype=jnp.int64)
            zs = orthogonal_features(r, Ckk, z0, ts) if group.points else None
            success = ~jnp.any(jnp.isnan(t_star))
            if zs is not None:
                success &= jnp.all(jnp.isfinite(zs))
        else:
            sol = solve_lv(
                lv,
                z0,
                t1,
                ts=ts,
                rho=x["rho"],
                rtol=group.rtol,
                atol=group.atol,
                max_steps=max_steps,
                throw=False,
                z_inf=x["z_inf"] if fam.z_inf_known else None,
            )
            z_inf, t_star, steps, zs = sol.z_inf, sol.switch_on_times, sol.num_steps, sol.zs
            # as predict: a mode that does not grow (z_k(∞) ≤ z_k0) never switches on, even where
            # z_k(∞) comes from z(t1) and sits a rounding error above 0 (a singular C)
            t_star = jnp.where(z_inf > z0, t_star, jnp.inf)
            # `sol.success` is `sol.result == successful` and finite values; reading diffrax's result
            # code out of a vmapped RODAS5P solve sends XLA's algebraic simplifier into a loop
            # (compile-time log spam), so: the step budget not exhausted, and finite values (no other
            # failure applies: RODAS5P has no Newton iteration, the PID controller no dtmin)
            success = (steps < max_steps) & jnp.all(jnp.isfinite(zs)) & jnp.all(jnp.isfinite(z_inf))
        out = {
            "valid": valid,
            "success": success,
            "t1": t1,
            "num_steps": steps.astype(jnp.int64),
            "t_star": t_star,
            "z_inf": z_inf,
            "r": r,
            "V": V,
        }
        if schedule != "none":
            out["tau_star"], out["plateau_loss"] = tau, plateau
        if group.points:
            Cz = (lambda z: jnp.broadcast_to(Ckk, z.shape) * z) if diagonal else lv.Cz
            loss = jnp.sum(zs * Cz(zs), axis=-1) / 8 - zs @ r / 4
            loss_inf = jnp.sum(z_inf * Cz(z_inf)) / 8 - z_inf @ r / 4
            out["ts"], out["excess_loss"] = ts, loss - loss_inf
        return out

    return member


def batched(member, *, per_member: bool):
    """`member` over a batch: `vmap`, or one after another (`lax.map`) where a vmapped batch would
    run batched LAPACK factorisations (a dense `C` under RODAS5P; a first pass for `z(∞)`), which
    deadlock on a CPU split into several devices (jaxlib's batched LU runs its batch on the thread
    pool the devices' programs occupy)."""
    if per_member:
        return lambda x: jax.lax.map(member, x)
    return jax.vmap(member)


# --------------------------------------------------------------------------------------------
# Per-configuration numbers, on the host
# --------------------------------------------------------------------------------------------


def derived(out: dict[str, np.ndarray], eps: np.ndarray, lr: np.ndarray, alpha: tuple | None) -> dict:
    """Scalars per configuration from the per-mode results:

    - `ln_inv_eps` = ln(1/ε);
    - `n_on`: modes that switch on by `t1`; `t_first`, `t_last`: the first and last switch-on (the
      first is the length of the initial plateau); `steps_first = t_first/η`;
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
        "ln_inv_eps": np.log(1 / eps),
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
