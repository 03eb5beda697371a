"""Overlapping ignitions integrated together: the joint window of `plateau_schedule(..., transients=True)`.

The one-mode orbit (`orbit.py`) assumes that, while mode `k` ignites, every other inactive mode is
exponentially small. It fails when the next mode is already past its orbit's threshold when `k`'s
ignition has settled (close growth rates at moderate ε), when two modes ignite at once, or when an
ignition changes the support by more than `k`. Then the gLV (Eq. 32) restricted to the modes involved,

    u̇_M = r_M − C_MM e^{u_M},   İ_M = e^{u_M}     (u = ln z, I = ∫ z dt),

is integrated in log coordinates from the current plateau, `M` the current support plus the window
modes `W`, each at its actual log (the event loop's bookkeeping), until no mode of `M` is in transit:
every log of the support of the reached plateau within `e^-κ` of its value, every other mode of
`M` below `κ` e-folds under its level `ln(|r_j|/C_jj)`. A mode outside `M` is passive: its log is
exactly `u_j(t) = u_j(t0) + r_j (t − t0) − (C_jM I_M)(t)` while it is small, and one that comes
within `κ` e-folds of its level during the window joins `W` (the window is integrated again).

Read off at the end `T`:

- the new plateau `z*`, the saturated equilibrium on the old active set plus the modes present at
  `T` (it is checked against the integrated state);
- the ignitions and switch-offs, replayed in the step picture (`_replay`): a mode ignites where its
  log first crosses `ρ z*_j` upward (`ρ = ½`, `solve_lv`'s switch-on against the plateau reached;
  a mode that ends the window off the support: `ρ` times its level on the active set plus itself),
  in time order, each plateau repaired as in the event loop; a mode that plateau leaves at `σ < 0`
  switches off if it ends off the support or falls below `ρ z*_j` later (then it ignites again);
- every mode off the new support, its log extrapolated back to the window's last ignition `t_ref`,
  `u_j(t_ref) = u_j(T) − σ*_j (T − t_ref) − (C τ)_j`, where `σ* = r − C z*` and `τ` is the
  integral of what is still to come after `T`, to first order: `z_j(T)/|σ*_j|` for a decaying
  mode, and on the support `τ_S = C_SS⁻¹ (expm1(u_S(T) − ln z*_S) − C_SL τ_L)` (the linearised
  relaxation `ḋ_S = −Diag(z*_S)(C_SS d_S + C_SL z_L)` integrated). Against steps at each mode's own
  ignition time this is the shift `−(C m)_j`, `m = ∫ (z − z_step) dt`, of the one-mode orbit.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import diffrax as dfx
import numpy as np

from .._core.errors import LvflowError, SolverError
from .active_set import _mode_tol, _repair
from .orbit import _KAPPA, LogGLV

_RHO = 0.5
# chunks of the joint integration: the first one `1/max|rate|` long, each next one `_GROW` times longer
_GROW = 1.5
_MAX_CHUNKS = 120
# give up on a window that has not settled after this many times its slowest rate's time scale
_HORIZON = 1e4
# ignitions of one window closer than this (relative) in time are simultaneous
_SAME_TIME = 1e-9


class Window(NamedTuple):
    """A joint window's read-off. `ignitions`: `(t, ignited, switched off)` in time order; `t_ref`: the last of
    them, where the step picture of the event loop resumes; `u_ref`: every mode's log extrapolated
    back to `t_ref` (NaN on the new support); `z_new`: the new plateau; `modes`: `M`."""

    ignitions: list
    t_ref: float
    u_ref: np.ndarray
    z_new: np.ndarray
    modes: np.ndarray


def levels(r, cdiag):
    """Each mode's level `ln(|r_j|/C_jj)` minus `κ`: a mode above it is in transit, not passive
    (`+inf` where `C_jj = 0`: such a mode never saturates, and `plateau_schedule` refuses one that grows)."""
    scale = np.maximum(np.abs(r), 1e-6 * float(np.max(np.abs(r), initial=0.0)) + np.finfo(float).tiny)
    with np.errstate(divide="ignore"):
        return np.where(cdiag > 0, np.log(scale / np.where(cdiag > 0, cdiag, 1.0)) - _KAPPA, np.inf)


class _Run(NamedTuple):
    t0: float
    u0: np.ndarray  # (K,) logs at t0 off the old support
    ts: np.ndarray  # step times up to T
    uM: np.ndarray  # (|M|, steps) logs up to T
    sols: list  # the chunks' solves (`orbit.Path`, dense outputs)
    chunk: np.ndarray  # chunk of each step
    y_T: np.ndarray  # (2|M|,) state at T
    eq: object  # (backend, pend) of the reached plateau
    seen: np.ndarray  # (|M|,) present at some step up to T
    glv: LogGLV  # the restricted gLV the chunks solve (their dense outputs: `glv.at`, `glv.crossing`)


def joint_window(be, pend, u_t, t, required, W0, r, cols, tol, max_iter, level) -> Window:
    """Integrate the ignitions of the modes `W0` (and any mode that comes close during them)
    together, from the plateau held by `be` (committed, `pend` the active modes off its support)
    at time `t`, where the inactive modes have logs `u_t` (shape `(K,)`). `required`: modes that
    must have been present (above their level) before the window may close.

    **Returns:** a `Window`. **Raises:** `LvflowError` where the window cannot be read off (said
    which and why); `SolverError` if the integration fails."""
    if pend:
        raise LvflowError(
            f"transients: overlapping ignitions from a plateau with active modes {sorted(pend)} at z* = 0 "
            "(C singular on the active set): their actual levels are not tracked; not supported"
        )
    K = r.shape[0]
    S = be.supp.copy()
    z_old, sig_old = be.z_full().copy(), be.sigma().copy()
    W = {int(j) for j in W0}
    for _ in range(K + 1):
        inW = np.zeros(K, bool)
        inW[list(W)] = True
        M = np.flatnonzero(S | inW)
        CM = cols(M)
        run = _integrate(be, S, z_old, sig_old, u_t, t, M, CM, set(required), r, level, tol, max_iter)
        if isinstance(run, set):  # passive modes that came within κ e-folds of their level
            W.update(run)
            continue
        return _read_off(be, run, S, M, CM, r, level, tol, max_iter)
    raise SolverError("transients: the joint window kept growing")  # pragma: no cover - W grows each time


def _equilibrium(be, P, tol, max_iter):
    """The saturated equilibrium on the old active set plus `P`, on a copy of the backend."""
    fin, fp = be.copy(), {int(j) for j in P}
    _repair(fin, fp, tol, max_iter)
    return fin, fp


def _integrate(be, S, z_old, sig_old, u_t, t, M, CM, required, r, level, tol, max_iter) -> _Run | set[int]:
    """The window's run on the modes `M` until its plateau settles, or the passive modes that came
    within κ e-folds of their level (integrate again with them)."""
    K, n = r.shape[0], M.shape[0]
    CMM, inS, lvM = CM[M], S[M], level[M]
    out = np.ones(K, bool)
    out[M] = False
    t0 = t
    u0 = np.where(S, np.nan, u_t)
    z0 = np.where(inS, z_old[M], np.exp(u0[M]))
    if inS.any():  # each small mode displaces the support along its unstable (or stable) direction
        D, CSS = z_old[M][inS], CMM[np.ix_(inS, inS)]
        dz = np.zeros(D.size)
        for i in np.flatnonzero(~inS):
            if z0[i] > 0:
                try:
                    v = np.linalg.solve(sig_old[M[i]] * np.eye(D.size) + D[:, None] * CSS, D * CMM[inS, i])
                except np.linalg.LinAlgError:
                    continue
                dz -= z0[i] * v
        if np.all(np.abs(dz) < 0.5 * D):  # the linearisation holds (else the modes are not small: start as is)
            z0[inS] += dz
    rM = r[M]
    glv = LogGLV.build(rM, CMM)
    with np.errstate(divide="ignore"):
        y = np.concatenate([np.log(z0), np.zeros(n)])
    rate = max(float(np.max(np.abs(sig_old[M]), initial=0.0)), float(np.max(np.abs(rM))), 1e-300)
    h, tc = 1.0 / rate, t0
    rates = np.abs(np.concatenate([sig_old[M], rM]))
    rate_min = max(float(np.min(rates[rates > 0], initial=rate)), 1e-12 * rate)
    seen = np.zeros(n, bool)
    cache = {}
    ts_all, u_all, sols, chunk_of = [], [], [], []
    for c in range(_MAX_CHUNKS):
        if tc - t0 > _HORIZON / rate_min:
            break
        sol = glv.solve(tc, tc + h, y)
        if sol.result != dfx.RESULTS.successful and sol.result != dfx.RESULTS.max_steps_reached:
            raise SolverError(f"transients: the joint window of modes {M.tolist()} failed ({dfx.RESULTS[sol.result]})")
        tt, yy = sol.ts, sol.ys
        uM = yy[:n]
        present = (uM >= lvM[:, None]) & ~inS[:, None]
        settled, reached = -1, None  # the step where the plateau `reached` (backend, pend) settles
        for s in range(tt.size):
            seen |= present[:, s]
            if not all(seen[np.searchsorted(M, j)] for j in required):
                continue
            key = present[:, s].tobytes()
            if key not in cache:
                cache[key] = _equilibrium(be, M[present[:, s]], tol, max_iter)
            zs = cache[key][0].z_full()[M]
            sp = zs > 0
            with np.errstate(divide="ignore"):
                if np.all(np.abs(uM[sp, s] - np.log(zs[sp])) <= math.exp(-_KAPPA)) and np.all(uM[~sp, s] < lvM[~sp]):
                    settled, reached = s, cache[key]
                    break
        upto = tt.size if settled < 0 else settled + 1
        if out.any():
            uP = u0[out][:, None] + r[out][:, None] * (tt[:upto] - t0) - CM[out] @ yy[n:, :upto]
            hot = np.flatnonzero(out)[np.max(uP, axis=1) >= level[out]]
            if hot.size:
                return set(hot.tolist())
        ts_all.append(tt[:upto])
        u_all.append(uM[:, :upto])
        chunk_of.append(np.full(upto, c))
        sols.append(sol)
        if settled >= 0:
            return _Run(
                t0,
                u0,
                np.concatenate(ts_all),
                np.concatenate(u_all, axis=1),
                sols,
                np.concatenate(chunk_of),
                yy[:, settled],
                reached,
                seen,
                glv,
            )
        tc, y = float(tt[-1]), yy[:, -1]
        if sol.result == dfx.RESULTS.successful:
            h *= _GROW
    raise LvflowError(
        f"transients: the joint window of modes {M.tolist()} did not settle by t = {tc:.6g} (a mode leaving "
        "the support with zero growth rate decays algebraically, not exponentially); not supported"
    )


def _crossing(run, i, target, after):
    """The first upward crossing of `ln z = target` by the `i`-th log of `M` after `after`, or None."""
    d = run.uM[i] - target
    for s in np.flatnonzero((d[:-1] < 0) & (d[1:] >= 0)):
        a, b = float(run.ts[s]), float(run.ts[s + 1])
        if b <= after:
            continue
        path = run.sols[int(run.chunk[s + 1])]
        if a < after:
            if float(run.glv.at(path, after)[i]) >= target:
                continue
            a = after
        if d[s + 1] == 0:
            return b
        return run.glv.crossing(path, i, target, a, b)
    return None


def _replay(be, run, S, M, z_new, tol, max_iter):
    """The window's ignitions in the step picture, driven by the integrated logs. From the old
    plateau, every mode `j` of `M` off the active set is a candidate, with the level `ℓ_j` it
    rises to: its value on the settled plateau `z_new` (`solve_lv`'s switch-on against the level
    reached), or, for a mode that ends the window off the support, its value on the equilibrium
    of the active set plus itself. The first candidate whose log crosses `ln(ρ ℓ_j)` upward
    (after the last event) ignites there, with every candidate crossing at that same time. The
    plateau is repaired as in the event loop; a mode it leaves at `σ < 0` switches off if it ends
    the window off the support or falls below `ρ z_new,j` later in it (then it is a candidate
    again), and otherwise stays active at `z* = 0` (it never left the support in the gLV).
    Returns `[(t, ignited, switched off)]` and the last plateau's backend."""
    rep, rp = be.copy(), set()
    act = S.copy()
    r = be.r
    groups, after = [], -math.inf
    pos = {int(j): i for i, j in enumerate(M.tolist())}

    def crossing(j, z_step):
        """`j`'s ignition: half its level on the settled plateau, or, for a mode that ends the
        window off the support, on the step plateau it ignites into."""
        lv = z_new[j] if z_new[j] > 0 else z_step
        return _crossing(run, pos[j], math.log(_RHO * lv), after) if lv > 0 else None

    for _ in range(4 * M.size + 4):
        cross = {}
        for j in M[~act[M]].tolist():
            tc = crossing(j, _equilibrium(rep, rp | {j}, tol, max_iter)[0].z_full()[j])
            if tc is not None:
                cross[j] = tc
        if not cross:
            break
        t1 = min(cross.values())
        G = sorted(j for j, tc in cross.items() if tc - t1 <= _SAME_TIME * max(1.0, abs(t1)))
        rp.update(G)
        _repair(rep, rp, tol, max_iter)
        act[G] = True
        sig = rep.sigma()
        mt = _mode_tol(r, sig) if tol is None else np.full(r.shape[0], tol)
        off = [
            j
            for j in rp
            if sig[j] < -mt[j]
            and (not z_new[j] > 0 or _falls_below(run, pos[j], math.log(_RHO * z_new[j]), t1) is not None)
        ]
        rp.difference_update(off)
        act[off] = False
        groups.append((t1, G, sorted(off)))
        after = t1
    return groups, rep, rp


def _falls_below(run, i, target, after):
    """The first time after `after` that the `i`-th log of `M` is below `target`, or None."""
    below = np.flatnonzero((run.ts > after) & (run.uM[i] < target))
    return float(run.ts[below[0]]) if below.size else None


def _read_off(be, run, S, M, CM, r, level, tol, max_iter) -> Window:
    K, n = r.shape[0], M.shape[0]
    fin, fp = run.eq
    z_new, sig = fin.z_full().copy(), fin.sigma().copy()
    mt = _mode_tol(r, sig) if tol is None else np.full(K, tol)
    stay = [j for j in fp if abs(sig[j]) <= mt[j]]
    if stay:
        raise LvflowError(
            f"transients: the ignitions leave modes {sorted(stay)} at z* = 0 without decaying (σ = 0 there: C is "
            "singular on the new support, whose plateau is then a continuum the restricted equilibrium does not "
            "pick the gLV's point of); not supported"
        )
    groups, rep, rp = _replay(be, run, S, M, z_new, tol, max_iter)
    scale = float(np.max(np.abs(z_new), initial=0.0))
    if not groups or not np.allclose(rep.z_full(), z_new, rtol=1e-8, atol=1e-10 * scale):
        raise LvflowError(
            f"transients: the joint window of modes {M.tolist()} settles on a plateau that its ignitions, replayed in "
            f"the step picture, do not reach (z = {np.round(run.y_T[:n], 4).tolist()} on M at the end; an ignition "
            "overlapping the previous window, or a mode switched off that never decays below its target); not supported"
        )
    t_ref = groups[-1][0]
    T = float(run.ts[-1])
    uT = run.u0 + r * (T - run.t0) - CM @ run.y_T[n:]
    uT[M] = run.y_T[:n]
    # what is still to come after T, to first order: decaying modes' tails, the support's relaxation
    Sn = z_new[M] > 0
    tail = np.zeros(n)
    dec = ~Sn & (sig[M] < 0)
    tail[dec] = np.exp(uT[M][dec]) / -sig[M][dec]
    if Sn.any():
        CMM = CM[M]
        dev = np.expm1(uT[M][Sn] - np.log(z_new[M][Sn]))
        tail[Sn] = np.linalg.solve(CMM[np.ix_(Sn, Sn)], dev - CMM[np.ix_(Sn, dec)] @ tail[dec])
    u_ref = uT - sig * (T - t_ref) - CM @ tail
    u_ref[z_new > 0] = np.nan
    return Window(groups, t_ref, u_ref, z_new, M)
