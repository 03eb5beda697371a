"""The ε → 0 limit of the gLV: a saddle-to-saddle schedule of plateaus for any PSD `C` (§4).

In `s_k = ln z_k / ln(1/ε)` and `τ = t / ln(1/ε)` the gLV (Eq. 32) becomes, as ε → 0, piecewise
linear: `ds_k/dτ = r_k − (C z*)_k`, where `z*` is the saturated equilibrium of the modes at
`s_k = 0` (the *active set*). Nothing has to be integrated: the schedule is a sequence of
events (a mode reaches `s = 0` and ignites; a mode's equilibrium value drops to 0 and it
switches off), and between events the loss sits on a plateau.

The restricted equilibrium is kept up to date incrementally (Lawson–Hanson, warm-started; the
linear algebra is in `active_set`):

- dense `C` (`LotkaVolterra`): rank-one updates of `C_SS⁻¹`, `O(K²)` per event;
- `C = diag(d) + U Uᵀ` (`LowRankLotkaVolterra`, `U` of shape `(K, q)`): Sherman–Morrison on
  the `q × q` Woodbury core, `O(K q)` per event;
- diagonal `C` (or `q = 0`): closed form, `O(K log K)`.

The event loop runs in numpy: its control flow is sequential and data dependent and each event
costs a handful of vector operations (timings, and why not `lax.while_loop`: `docs/devdocs/schedule.md`).
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._core.errors import LvflowError, SolverError
from .._core.validate import as_array, check_in_open_interval, check_positive_int, check_psd
from .._form.nqf import NQF
from .._glv.lv import AbstractLotkaVolterra, LotkaVolterra, LowRankLotkaVolterra
from .active_set import _backend, _mode_tol, _repair
from .base import AbstractPlateauSchedule

if TYPE_CHECKING:
    from .nqf_schedule import NQFPlateauSchedule

# The transients (`orbit`, `window`) and the NQF schedule integrate with diffrax; they are imported
# where they are used, so that a schedule without transients (every `lvflow predict`) does not pay
# diffrax's import (~0.3 s of a cold start).

# σ_k = r_k − (Cz*)_k counts as positive (zero) above (below) this fraction of max|r|.
_RTOL = 1e-10
# Events closer than this (relative) in time are simultaneous.
_TIME_RTOL = 1e-12
# transients: how many one-mode ignitions an overlap may undo to integrate them jointly (each kept
# as a backend, `O(K²)` memory for dense `C`)
_HISTORY = 16


class _Events(NamedTuple):
    """An event loop's result: per event (in the order recorded) its time `t` (`τ`, or real time
    corrected), `mode`, whether it `ignites`, and the `excess` `L − L∞` of the plateau after it; the
    excess before the first event `excess0`, the last plateau's loss `L_inf`, each mode's first
    ignition time `tstar` (inf if never) and the last plateau `z_final`."""

    t: np.ndarray
    mode: np.ndarray
    ignites: np.ndarray
    excess: np.ndarray
    excess0: float
    L_inf: float
    tstar: np.ndarray
    z_final: np.ndarray


class _Checkpoint(NamedTuple):
    """The event loop's state before a one-mode ignition (with transients), to undo it when the next
    ignition overlaps it: the backend (not changed in place afterwards) and the active modes off its
    support, every mode's distance to ignition `w`, the time, the active set, the first ignition
    times, the plateau `z`, the event count, the igniting mode, and the lengths of the event and drop
    lists then."""

    be: object
    pend: frozenset
    w: np.ndarray
    t: float
    active: np.ndarray
    tstar: np.ndarray
    z: np.ndarray
    n: int
    k: int
    n_ev: int
    n_drops: int


def _window_module():
    """`window.py` (joint windows), imported on first use: it imports diffrax, which a schedule
    without transients (a closed-form `lvflow predict`) does not need."""
    from . import window

    return window


def _run(be, r, y2, u0, active0, tol, corrected, max_events, cols=None):
    """The event loop in `u` (`s_k` uncorrected, `ln z_k` corrected) and time `t` (`τ`, or real
    time corrected). A mode off the active set ignites when `u_k` reaches `θ_k` (0, or
    `ln(σ_k/γ_k)` corrected) growing at its rate `σ_k`. With `cols` (`M ↦ C[:, M]`; corrected only)
    the next ignition's threshold and its effect on the other modes come from its orbit
    (`orbit.transient`) instead. `tol`: a growth rate at or below it is zero (`None`: each mode's
    own, `_mode_tol`). Returns the `_Events`: a plateau's excess
    `L − L∞` is the sum of the drops still to come, each in the stationary form of `_drop`
    (never negative, no cancellation against `y2`)."""
    K = r.shape[0]
    max_iter = 3 * K + 10
    ev = []  # (t, modes, ignites, plateau index) per batch
    drops = [0.0]  # drops[p]: L(plateau p − 1) − L(plateau p)

    def mtol(sig):
        return _mode_tol(r, sig) if tol is None else np.full(K, tol)

    active = active0.copy()
    pend = set(np.flatnonzero(active0).tolist())
    _repair(be, pend, tol, max_iter)
    sig = be.sigma()
    neg = sig < -mtol(sig)
    ext = [k for k in pend if neg[k]]
    pend.difference_update(ext)
    active[ext] = False
    ev.append((0.0, np.array(ext, int), False, 0))
    znow = be.z_full().copy()
    tstar = np.where(active0, 0.0, np.inf)
    # w = θ − u is the distance to ignition of each inactive mode; +inf marks the active ones
    w = np.where(active, np.inf, -u0)
    n, t = len(ext), 0.0
    dt = np.empty(K)
    orbits = {}  # mode -> its ignition from the current plateau (`_ignition`), with `cols`
    # with `cols`: the joint windows' module (diffrax: imported only for a corrected schedule) and the
    # level each mode's log must reach to count as present in a window
    window = _window_module() if cols is not None else None
    level = window.levels(r, be.diagonal()) if window is not None else None
    history = []  # with `cols`: a `_Checkpoint` before each one-mode ignition since the last window
    # with `cols`: when the one-mode ignitions since the last window have settled (their orbits within e^-κ
    # of the plateau reached); an ignition before that overlaps them (`_window_modes`)
    settled = -math.inf
    while True:
        sig = be.sigma()
        grow = sig > mtol(sig)
        if corrected:
            theta = np.log(np.where(grow, sig, 1.0) / np.where(grow, be.schur(), 1.0))
            for j, o in orbits.items():
                if isinstance(o, _Ignition):  # else the logistic θ_j ranks a mode that needs a joint window
                    theta[j] = o.theta
            gap = w + theta
        else:
            gap = w
        dt.fill(np.inf)
        np.divide(gap, sig, out=dt, where=grow)
        k = int(np.argmin(dt))
        if not dt[k] < np.inf:
            break
        if cols is not None and k not in orbits:
            # the logistic θ_k only ranks the candidates; the first one whose orbit still
            # comes first ignites
            orbits[k] = _ignition(be, pend, k, r, cols, tol, max_iter)
            continue
        dmin = max(float(dt[k]), 0.0)
        if window is not None and level is not None:
            batch = (dt <= dmin + _TIME_RTOL * max(1.0, abs(t + dmin))).nonzero()[0]
            overlap = dt[k] < -_TIME_RTOL * max(1.0, abs(t)) or t + dt[k] < settled
            W0 = _window_modes(orbits[k], k, batch, overlap)
            if W0 is not None:
                required = batch.tolist()
                if history and overlap:
                    # k ignites before the last one-mode ignition has settled: undo that ignition
                    # (and the ones before it while a mode of the window was already in transit
                    # when they started) and integrate them together
                    while True:
                        c = history.pop()
                        be, pend, w, t, active, tstar, znow, n = (
                            c.be,
                            set(c.pend),
                            c.w,
                            c.t,
                            c.active,
                            c.tstar,
                            c.z,
                            c.n,
                        )
                        W0, required = W0 | {c.k}, [c.k]
                        if not history or not np.any((-w[list(W0)] >= level[list(W0)]) & ~active[list(W0)]):
                            break
                    del ev[c.n_ev :], drops[c.n_drops :]
                history.clear()
                settled = -math.inf
                be = be.copy()  # the window's events are replayed on it in place
                win = window.joint_window(be, pend, -w, t, required, W0, r, cols, tol, max_iter, level)
                zprev = znow
                for tg, modes, off in win.ignitions:  # the window's events, replayed on the backend
                    pend.update(modes)
                    _repair(be, pend, tol, max_iter)
                    active[modes] = True
                    tstar[modes] = np.minimum(tstar[modes], tg)
                    ext = np.array(off, int)
                    pend.difference_update(ext.tolist())
                    active[ext] = False
                    znow = be.z_full().copy()
                    drops.append(_drop(be, zprev, znow))
                    zprev = znow
                    ev.append((tg, np.array(modes, int), True, len(drops) - 1))
                    ev.append((tg, ext, False, len(drops) - 1))
                    n += len(modes) + ext.size
                scale = float(np.max(np.abs(znow), initial=0.0))
                if pend or not np.allclose(znow, win.z_new, rtol=1e-8, atol=1e-10 * scale):
                    raise LvflowError(
                        f"transients: the joint window of modes {win.modes.tolist()} settles on a plateau other than "
                        "the restricted equilibrium of its ignitions; not supported"
                    )
                t = win.t_ref
                w = np.where(active, np.inf, -win.u_ref)
                orbits.clear()
                if n > max_events:
                    raise SolverError(f"max_events: more than {max_events} events; pass a larger max_events")
                continue
        # with `cols`, the state before this ignition, to integrate it jointly with the next one if
        # that one turns out to be past its threshold already (`be` is not changed in place below)
        saved = (
            _Checkpoint(be, frozenset(pend), w.copy(), t, active.copy(), tstar.copy(), znow, n, k, len(ev), len(drops))
            if cols is not None
            else None
        )
        t += dmin
        batch = (dt <= dmin + _TIME_RTOL * max(1.0, abs(t))).nonzero()[0]
        if dmin > 0:
            w -= sig * dmin
        w[batch] = np.inf
        active[batch] = True
        tstar[batch] = np.minimum(tstar[batch], t)
        zprev = znow
        if saved is not None:
            history.append(saved)
            del history[:-_HISTORY]
            be, pend = orbits[k].be, orbits[k].pend  # already repaired onto the new plateau
            settled = max(settled, t + orbits[k].settle)
        else:
            pend.update(batch.tolist())
            _repair(be, pend, tol, max_iter)
        sig = be.sigma()
        neg = sig < -mtol(sig)
        ext = np.array([j for j in pend if neg[j]], int)
        pend.difference_update(ext.tolist())
        active[ext] = False
        if cols is not None:
            o = orbits.pop(k)
            if set(ext.tolist()) != set(o.leaving.tolist()):
                raise LvflowError(f"transients: mode {k}'s ignition leaves modes at z* = 0 still active; not supported")
            w += o.Cm
            w[o.leaving] = -o.u_off
            orbits.clear()
        elif corrected:
            # A switched-off mode decays from the level it held on the last plateau, at rate
            # σ_k < 0; while it lingers it shifts every other mode's log by −(Cx)_j z_k/|σ_k|
            # (integrated), which the instantaneous switch-off of the limit leaves out.
            for j in ext:
                if zprev[j] > 0:
                    w += be.response(j) * (zprev[j] / -sig[j])
            zp = zprev[ext]
            w[ext] = -np.log(np.where(zp > 0, zp, 1.0))
        else:
            w[ext] = 0.0
        znow = be.z_full().copy()
        drops.append(_drop(be, zprev, znow))
        ev.append((t, batch, True, len(drops) - 1))
        ev.append((t, ext, False, len(drops) - 1))
        n += batch.size + ext.size
        if n > max_events:
            raise SolverError(f"max_events: more than {max_events} events; pass a larger max_events")
    be.refine(full=True)  # the last plateau from a fresh solve on its support
    z_final = be.z_full()
    # excess[p] = L(plateau p) − L(last plateau): the drops still to come
    excess = np.append(np.cumsum(np.asarray(drops[:0:-1]))[::-1], 0.0)
    sizes = [e[1].size for e in ev]
    return _Events(
        t=np.repeat([e[0] for e in ev], sizes).astype(float),
        mode=np.concatenate([e[1] for e in ev]).astype(int),
        ignites=np.repeat([e[2] for e in ev], sizes).astype(bool),
        excess=np.repeat([excess[e[3]] for e in ev], sizes).astype(float),
        excess0=float(excess[0]),
        L_inf=_final_loss(r, y2, z_final, be.cz(z_final)),
        tstar=tstar,
        z_final=z_final,
    )


def _drop(be, z_prev, z) -> float:
    """`L(z_prev) − L(z*)` for the backend's restricted equilibrium `z*`, in its stationary form
    `(1/8) dᵀC d + ¼ Σ_k max(−σ_k, 0) z_prev,k` (`d = z_prev − z*`, `σ = r − C z*`; exact because
    `σᵀz* = 0`, and `σ_k ≤ 0` wherever `z_prev,k > 0`): a sum of non-negative terms, where
    `rᵀ(z* − z_prev)/8` would cancel. `z`: the backend's `z*`."""
    d = z_prev - z
    return max(be.quad(d), 0.0) / 8 + float(np.maximum(-be.sigma(), 0.0) @ z_prev) / 4


def _final_loss(r, y2: float, z, Cz) -> float:
    """The loss on the last plateau, `L∞ = y2 − rᵀz*/4 + z*ᵀCz*/8` (the quadratic itself: its error
    is second order in that of `z*`, where `y2 − rᵀz*/8` would be first order); a value within the
    rounding of its terms is 0 (a loss is a mean of squares: an interpolating problem ends at exactly
    0, not at a rounding error of either sign)."""
    rz, zCz = float(r @ z) / 4, float(z @ Cz) / 8
    L = (y2 - rz) + zCz
    # rounding of the sum: its terms' sizes (they cancel when z* is large along a near-null direction)
    terms = abs(y2) + float(np.abs(r) @ np.abs(z)) / 4 + float(np.abs(z) @ np.abs(Cz)) / 8
    if y2 >= 0 and abs(L) <= 16 * np.finfo(float).eps * terms:
        return 0.0
    return L


def plateau_excess_in_order(
    system: AbstractLotkaVolterra, modes
) -> tuple[Float[np.ndarray, " n"], Float[np.ndarray, " n"]]:
    """The excess loss `L(z*_i) − L(z∞)` of the plateau before each of `modes` switches on, when
    they switch on in this order (at a finite ε the order may differ from the ε → 0 one):
    `z*_i` is the saturated equilibrium restricted to `modes[:i]`, `z∞` the unrestricted one.
    For diagonal `C` it is `Σ_{j ≥ i} V_{modes[j]}` plus the `V_k` of growing modes not listed
    (Eq. 168); otherwise the drops between consecutive plateaus in the stationary form of
    `_drop`, summed from the last: never negative, and non-increasing along `modes`. Returns the
    excess before each switch-on and the drop each makes."""
    modes = np.asarray(modes, dtype=int)
    r = np.asarray(system.r, dtype=float)
    K = r.shape[0]
    if system.is_diagonal:
        c = np.asarray(system.C_diagonal, dtype=float)
        V = np.where(r > 0, r**2 / (8 * np.where(c > 0, c, 1.0)), 0.0)
        rest = np.ones(K, bool)
        rest[modes] = False
        drops, tail = V[modes], float(np.sum(V[rest]))
    else:
        be, pend, zprev, drops = _backend(system, False), set(), np.zeros(K), []
        with _one_blas_thread():
            for k in modes:
                pend.add(int(k))
                _repair(be, pend, None, 3 * K + 10)
                if k == modes[-1]:
                    be.refine(full=True)
                z = be.z_full().copy()
                drops.append(_drop(be, zprev, z))
                zprev = z
        z_inf = np.asarray(system.equilibrium(), dtype=float)
        d = zprev - z_inf
        tail = max(float(d @ be.cz(d)), 0.0) / 8 + float(np.maximum(be.cz(z_inf) - r, 0.0) @ zprev) / 4
        drops = np.asarray(drops, dtype=float)
    return tail + np.cumsum(drops[::-1])[::-1], drops


class _Ignition(NamedTuple):
    """Mode `k`'s ignition from the current plateau: its threshold `θ_k` in `ln z_k`, the backend
    and pending set repaired onto the next plateau, the shift `C m` of every passive log, and the
    modes switched off with their extrapolated logs; `settle`: how long after its ignition the orbit
    is within `e^-κ` of the next plateau (`κ` over its slowest rate)."""

    theta: float
    be: object
    pend: set
    Cm: np.ndarray
    leaving: np.ndarray
    u_off: np.ndarray
    settle: float


class _NeedsWindow(NamedTuple):
    """Mode `k`'s ignition cannot be described by one orbit: the support changes by more than `k`
    and the modes it drops, so a joint window is needed. `reason`: why, for messages."""

    reason: str


def _ignition(be, pend, k, r, cols, tol, max_iter) -> _Ignition | _NeedsWindow:
    """Mode `k`'s ignition on its orbit (`orbit.transient`), from a copy of the backend (the
    ignition may lose to another candidate); or, where one orbit cannot describe it (the support
    changes by more than `k` and the modes it drops), a `_NeedsWindow`."""
    new, new_pend = be.copy(), set(pend) | {k}
    _repair(new, new_pend, tol, max_iter)
    z_old, z_new = be.z_full(), new.z_full()
    S, Sn = be.supp, new.supp
    back = np.flatnonzero(Sn & ~S)
    if back.size != 1:  # back == [k] unless a mode at z* = 0 re-enters with it
        return _NeedsWindow(f"mode {k}'s ignition brings modes {back.tolist()} into the support")
    sig_new = new.sigma()
    stay = np.flatnonzero(S & ~Sn & (sig_new >= -(_mode_tol(r, sig_new) if tol is None else tol)))
    if stay.size:
        return _NeedsWindow(f"mode {k}'s ignition leaves modes {stay.tolist()} at z* = 0 without decaying")
    from . import orbit  # diffrax: imported only for a schedule with transients

    M = np.flatnonzero(S | Sn)
    CM = cols(M)
    o = orbit.transient(r[M], CM[M], z_old[M], z_new[M], int(np.searchsorted(M, k)))
    gone = ~np.isnan(o.u_off)
    return _Ignition(o.theta, new, new_pend, CM @ o.m, M[gone], o.u_off[gone], orbit._KAPPA / o.rate)


def _window_modes(o, k, batch, overlap):
    """The modes to integrate together (a set), or `None` where `k`'s one-mode orbit `o` applies: a
    joint window where `o` is a `_NeedsWindow` (the support changes by more than `k` and the
    modes it drops), several modes ignite at once, or `k`'s ignition overlaps the previous one
    (`overlap`: `k` is past its orbit's threshold, or it ignites before the previous one-mode
    ignition's orbit is within `e^-κ` of its plateau, `κ` e-folds of that orbit's slowest rate
    after it; its orbit assumes every other inactive mode exponentially small meanwhile)."""
    if isinstance(o, _NeedsWindow) or batch.size > 1 or overlap:
        return {int(j) for j in batch} | {k}
    return None


class PlateauSchedule(AbstractPlateauSchedule):
    """The ε → 0 saddle-to-saddle schedule of a gLV (§4, "Beyond the paper"); final, its common
    methods (`n_events`, `times`, `loss_at`) on `AbstractPlateauSchedule`.

    Events are sorted in time; several may share a time (simultaneous ignitions, or a
    competitor's ignition switching modes off). Between events the loss sits on a plateau.

    **Fields:**

    - `tau`: event times in `τ = t / ln(1/ε)`, shape `(n,)`.
    - `mode`: the mode of each event; `ignites`: `True` for an ignition (`s_k` reaches 0),
      `False` for a switch-off (its restricted equilibrium value drops to 0).
    - `loss`: plateau losses, shape `(n + 1,)`: `loss[0]` before the first event, `loss[i+1]`
      after event `i` (all events at one time share the loss after all of them). Formed as
      `L∞ + excess`, `L∞ = y2 − rᵀz*/8` on the last plateau (0 on an interpolating problem).
    - `excess`: `loss − L∞`, formed without that subtraction: the sum of the drops still to come,
      each `L(z_prev) − L(z*) = (1/8)(z_prev − z*)ᵀC(z_prev − z*) + ¼ Σ_k max(−σ_k, 0) z_prev,k`
      (`σ = r − C z*`; `V_k = r_k²/(8 C_kk)` for diagonal `C`), so never negative; `None` when the
      schedule was built elsewhere.
    - `tau_star`: first ignition time of each mode (`inf` if it never ignites; 0 if it starts
      on the plateau, `z0_k ≥ 1`).
    - `initially_active`: the modes with `s_k(0) = 0`.
    - `z_final`: `z*` on the last plateau.
    - `eps`, `corrected`, `transients`, `system`.
    """

    tau: Float[Array, " n"]
    mode: Int[Array, " n"]
    ignites: Bool[Array, " n"]
    loss: Float[Array, " n+1"]
    tau_star: Float[Array, " K"]
    initially_active: Bool[Array, " K"]
    z_final: Float[Array, " K"]
    system: LotkaVolterra | LowRankLotkaVolterra
    eps: float = eqx.field(static=True)
    corrected: bool = eqx.field(static=True)
    transients: bool = eqx.field(static=True, default=False)
    explicit_z0: bool = eqx.field(static=True, default=False)
    excess: Float[Array, " n+1"] | None = None

    @property
    def eps_fixed(self) -> bool:
        """The corrected schedule, and one from an explicit `z0`, hold only at their own ε; the
        limit from the default `z0` does not depend on it."""
        return self.corrected or self.explicit_z0

    def active_at(self, tau: float) -> Bool[Array, " K"]:
        """The modes on the plateau (`s_k = 0`) at time `tau`."""
        act = np.array(self.initially_active)
        sel = np.flatnonzero(np.asarray(self.tau) <= tau)
        modes = np.asarray(self.mode)[sel][::-1]
        uniq, first = np.unique(modes, return_index=True)
        act[uniq] = np.asarray(self.ignites)[sel][::-1][first]
        return jnp.asarray(act)

    def z_at(self, tau: float) -> Float[Array, " K"]:
        """The plateau equilibrium `z*` at time `tau`: the saturated equilibrium restricted to
        `active_at(tau)` (unique up to `C`'s null space; `Cz*` and the loss are unique)."""
        return self.system.equilibrium(self.active_at(tau))

    def equilibria(self) -> Float[Array, "plateaus K"]:
        """`z*` on every plateau: row 0 before the first event, row `i+1` after event `i`
        (recomputed, one restricted solve per plateau: for small systems)."""
        ts = [-1.0] + [float(t) for t in np.asarray(self.tau)]
        return jnp.stack([self.z_at(t) for t in ts])


def _columns(system):
    """`M ↦ C[:, M]` (shape `(K, |M|)`), without forming a low-rank `C`."""
    if isinstance(system, LowRankLotkaVolterra):
        d, U = np.asarray(system.d, dtype=float), np.asarray(system.U, dtype=float)

        def cols(M):
            out = U @ U[M].T
            out[M, np.arange(M.size)] += d[M]
            return out

        return cols
    C = np.asarray(system.C, dtype=float)
    return lambda M: C[:, M]


def _one_blas_thread():
    """One BLAS thread for the event loop, whose many small sequential BLAS calls threaded BLAS
    only synchronises (`docs/devdocs/schedule.md` has the measurement); a null context without
    threadpoolctl."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _initial_u(system, eps: float, z0, corrected: bool):
    K = system.K
    L = -math.log(eps)
    if z0 is None:
        lnz0 = np.full(K, -L)
    else:
        z0 = as_array("z0", z0, ndim=1)
        if np.shape(z0) != (K,):
            raise LvflowError(f"z0: shape {np.shape(z0)}, expected ({K},)")
        if np.size(z0) and float(np.min(z0)) < 0:
            raise LvflowError(f"z0: must be non-negative, min is {float(np.min(z0)):g}")
        with np.errstate(divide="ignore"):
            lnz0 = np.log(np.asarray(z0, dtype=float))
    active0 = lnz0 >= 0
    u0 = lnz0 if corrected else np.minimum(lnz0 / L, 0.0)
    return u0, active0, L


def _diagonal_schedule(r, c, y2, u0, active0, L, corrected):
    """Closed form for diagonal `C` (Thm 6): mode `k` ignites when `u_k` reaches 0 (or
    `ln(r_k / C_kk)` corrected) growing at rate `r_k`, for every `r_k > 0` however small; each
    ignition lowers the loss by `V_k = r_k² / (8 C_kk)` (Eq. 168). Plateau losses are `L∞` plus
    the drops still to come (no cancellation against `y2`): returned as the excess over `L∞`
    (`_Events`)."""
    grow = r > 0
    if np.any(grow & (c <= 0)):
        k = int(np.flatnonzero(grow & (c <= 0))[0])
        raise LvflowError(f"system: mode {k} has r_k = {r[k]:g} > 0 and C_kk = 0: it grows without saturating")
    with np.errstate(divide="ignore", invalid="ignore"):
        theta = np.log(r / c) if corrected else np.zeros_like(r)
        t = np.where(grow & ~active0, np.maximum((theta - u0) / np.where(grow, r, 1.0), 0.0), np.inf)
        V = np.where(grow, r**2 / (8 * np.where(c > 0, c, 1.0)), 0.0)
    t = np.where(active0 & grow, 0.0, t)
    ext = np.flatnonzero(active0 & (r < 0))
    ign = np.flatnonzero(np.isfinite(t) & ~active0)
    ign = ign[np.argsort(t[ign], kind="stable")]
    times = t[ign]
    z_final = np.where(np.isfinite(t) & grow, r / np.where(c > 0, c, 1.0), 0.0)
    L_inf = _final_loss(r, y2, z_final, c * z_final)
    # after[i]: the drops of the ignitions after the i-th, summed from the smallest
    after = np.append(np.cumsum(V[ign][::-1])[::-1][1:], 0.0)
    excess0 = float(np.sum(V[ign][::-1]))
    # events at (numerically) one time share the loss after all of them
    last = np.ones(times.size, bool)
    if times.size > 1:
        last[:-1] = np.diff(times) > _TIME_RTOL * np.maximum(1.0, np.abs(times[1:]))
    grp_end = np.flatnonzero(last)
    after = after[grp_end[np.searchsorted(grp_end, np.arange(times.size))]] if times.size else after[:0]
    ev_t = np.concatenate([np.zeros(ext.size), times])
    ev_mode = np.concatenate([ext, ign]).astype(int)
    ev_ign = np.concatenate([np.zeros(ext.size, bool), np.ones(ign.size, bool)])
    ev_excess = np.concatenate([np.full(ext.size, excess0), after])
    return _Events(ev_t, ev_mode, ev_ign, ev_excess, excess0, L_inf, t, z_final)


def plateau_schedule(
    system: LotkaVolterra | LowRankLotkaVolterra | NQF,
    eps,
    *,
    z0=None,
    corrected: bool = False,
    transients: bool = False,
    max_events: int | None = None,
) -> PlateauSchedule | NQFPlateauSchedule:
    """The ε → 0 limit of the gLV `ż_k = z_k (r_k − Σ_j C_kj z_j)` (Eq. 32) started at `z_k0 = Θ(ε)`.

    With `s_k = ln z_k / ln(1/ε)` and `τ = t / ln(1/ε)` the limit flow is piecewise linear,
    `ds_k/dτ = r_k − (C z*)_k`, `z*` the saturated equilibrium (the minimiser of
    `½ zᵀCz − rᵀz` over `z ≥ 0`) of the gLV restricted to the active set `{k : s_k = 0}`.
    Events: a mode outside the set reaches `s_k = 0` with positive slope and ignites (the next
    one is the smallest `−s_k / (ds_k/dτ)`); a mode of the set whose equilibrium value drops
    to 0 with negative slope switches off (it may re-ignite later). For diagonal `C` the
    ignition times are `τ*_k = 1/r_k` (Thm 8 with `a = 1`) and the loss is the staircase of
    Eq. 168.

    **Arguments:**

    - `system`: a `LotkaVolterra` (dense PSD `C`, checked) or a `LowRankLotkaVolterra`
      (`C = diag(d) + UUᵀ`, for 10⁴–10⁵ modes); or an `NQF`, whose data need not commute: its
      flow `Ṁ = −(HM + MH)` (Eq. 28) from `M0 = ε I` in the same limit, returned as an
      `NQFPlateauSchedule` (`nqf_schedule.py`; `z0`, `corrected` and `transients` do not apply).
      On commuting data it is the schedule of `reduce_to_lv(system)`.
    - `eps`: the initial scale ε ∈ (0, 1).
    - `z0`: initial values; default `z_k0 = ε` (`s_k(0) = −1`). Otherwise
      `s_k(0) = ln z0_k / ln(1/ε)`; modes with `z0_k ≥ 1` start on the plateau, `z0_k = 0` never grow.
    - `corrected`: a finite-ε schedule (below).
    - `transients`: with `corrected`, each ignition's transient integrated on its orbit (below).
    - `max_events`: size of the event buffer (default `4K + 16`).

    **Finite-ε correction** (`corrected=True`). Convergence to the limit is slow, `O(1/ln(1/ε))`.
    The corrected schedule runs the same event logic in real time on `u_k = ln z_k`, starting
    from the actual `ln z_k0`, and lets a mode ignite when `u_k` reaches the log of its own
    saturation level instead of 0: `θ_k = ln(σ_k / γ_k)`, with `σ_k = r_k − (Cz*)_k` its growth
    rate and `γ_k = C_kk − C_kS C_SS⁻¹ C_Sk` its Schur complement on the current support `S` —
    near the saddle the entering mode is logistic with rate `σ_k` and capacity `σ_k/γ_k`, and
    this is its half-saturation time (Eq. 158 with `ρ = ½`). For diagonal `C` it reproduces
    Eq. 158, `t*_k = (1/r_k)[ln(1/ε) − ln(C_kk c_k / r_k)]`, up to `O(ε)`. A switched-off mode
    decays from the value `z_k` it held on the last plateau at its new rate `σ_k < 0`; while it
    lingers it changes every inactive mode's log by the integral `−(Cx)_j z_k / |σ_k|`, with
    `x = e_k − C_SS⁻¹ C_Sk` (the support re-equilibrating adiabatically), which is added. An
    adiabatic logistic rise is symmetric about its half time, so ignitions placed there need no
    such term. Event times are reported as `τ = t / ln(1/ε)`; switch-offs are recorded at the
    time of the ignition that causes them. It is exact for diagonal `C`.

    *Validity.* The correction assumes that the support relaxes fast compared with the entering
    mode (`σ_k` well below the eigenvalues of `Diag(z*_S) C_SS`) and that an ignition does not
    switch modes off; where either fails it can be worse than the limit, and `transients=True`
    is the remedy (measurements in `docs/devdocs/schedule.md`).

    **Transients** (`transients=True`, with `corrected=True`). Each ignition of a mode `k` from a
    plateau `z_old` into `z_new` is integrated once on its local unstable orbit (`orbit.py`):
    the gLV restricted to `supp z_old ∪ {k} ∪ supp z_new`, from `z_old + A v` (`v` the unstable
    eigenvector, `v_k = 1`, `v_S = −(σ_k I + D C_SS)⁻¹ D C_Sk`, `D = Diag(z_old,S)`, small `A`),
    until it settles. The mode then ignites at `θ_k = ln A + σ_k t_c`, `t_c` the time its
    orbit reaches `½ z_new,k` (the switch-on of `solve_lv`); every passive mode's log shifts by
    `−(C m)_j`, `m = ∫ (z − z_step) dt` over the transition (a step at `t_c`, plus the decay
    tail of the modes it switches off), in place of the linger term; and a switched-off mode
    restarts from `lim [ln z_j(t) − σ_j (t − t_c)]`, not from its last plateau level. Neither
    adiabatic relaxation nor non-swap ignitions are assumed; what remains is the other modes'
    finite size during a transition, `O(ε^s)` rather than `O(1/ln(1/ε))`. Cost: one small stiff
    ODE (`2|M|` unknowns) per ignition and per candidate the logistic `θ_k` ranked first but
    whose orbit does not come first — for systems of up to a few hundred modes. For diagonal `C` the orbit is the
    logistic and the closed form above is used.

    *Overlapping ignitions* (a mode igniting before the previous ignition has settled: close growth
    rates at moderate ε), simultaneous ones, and ignitions that change the support by more than the
    entering mode and the modes it drops are integrated together (`window.py`): the one-mode
    ignitions back to where the modes involved were small are undone, and the gLV restricted to `M`
    (the support plus those modes, and any other that comes within `e^8` of its level `|r_j|/C_jj`
    meanwhile) is integrated in `ln z` from that plateau, every mode at its actual log, until no
    mode of `M` is in transit. Each mode ignites where it first reaches `½` of its level on the
    plateau reached (`solve_lv`'s switch-on); the others' logs are read off and extrapolated back to
    the last ignition, with the linearised remainder of the relaxation. One ODE of `2|M|` unknowns
    per window. An ignition overlaps the previous one-mode ignition when it comes before that orbit
    is within `e^-8` of its plateau (8 e-folds of the orbit's slowest rate after its ignition), not
    only once it is past its own orbit's threshold (measurements in `docs/devdocs/schedule.md`).

    **Complexity:** diagonal `O(K log K)`; low rank `O(K q)` per event; dense `O(K²)` per event
    plus the `O(K³)` PSD check. Roughly one event per mode.

    **Raises:** `LvflowError` for `eps ∉ (0, 1)`, bad `z0`, `max_events` not a positive integer,
    `transients` without `corrected`, or a singular `C` with `r` outside its range along it (no
    saturated equilibrium); with `transients`, for a joint window that cannot be read off, naming
    its modes and the reason: it starts from a plateau with active modes at `z* = 0`, leaves a
    mode at `z* = 0` with `σ = 0` (singular `C`: no exponential decay), does not settle, a mode
    of it is already above half its new level at the start, or its ignitions replayed in the step
    picture do not reach the plateau it settles on; `NotPSDError` for a non-PSD `C`;
    `SolverError` if the event buffer overflows (or an orbit or window integration fails).
    """
    eps = check_in_open_interval("eps", eps, 0.0, 1.0)
    if isinstance(system, NQF):
        if z0 is not None or corrected or transients:
            raise LvflowError(
                "system: an NQF's schedule starts at M0 = eps·I in the limit; z0, corrected, transients are gLV-only"
            )
        from .nqf_schedule import nqf_plateau_schedule

        return nqf_plateau_schedule(system, eps, max_events=max_events)
    if not isinstance(system, AbstractLotkaVolterra):
        raise LvflowError(f"system: expected a LotkaVolterra, LowRankLotkaVolterra or NQF, got {type(system).__name__}")
    if transients and not corrected:
        raise LvflowError("transients: needs corrected=True (it refines the finite-ε schedule)")
    if max_events is not None:
        max_events = check_positive_int("max_events", max_events)
    u0, active0, L = _initial_u(system, eps, z0, corrected)
    K = system.K
    r = np.asarray(system.r, dtype=float)
    y2 = float(system.y2)

    if isinstance(system, LowRankLotkaVolterra):
        diagonal = system.U.shape[1] == 0
        c = np.asarray(system.d) + np.sum(np.asarray(system.U) ** 2, axis=1)
    else:
        C = np.asarray(system.C, dtype=float)
        check_psd("C", C)
        diagonal = not np.any(C - np.diag(np.diagonal(C)))
        c = np.diagonal(C)

    if diagonal:
        res = _diagonal_schedule(r, c, y2, u0, active0, L, corrected)
    else:
        N = 4 * K + 16 if max_events is None else max_events
        with _one_blas_thread():
            res = _run(
                _backend(system, corrected),
                r,
                y2,
                u0,
                active0,
                None,
                corrected,
                N,
                _columns(system) if transients else None,
            )
        # ignitions are recorded before the switch-offs they cause; keep time order stable
        order = np.argsort(res.t, kind="stable")
        res = res._replace(t=res.t[order], mode=res.mode[order], ignites=res.ignites[order], excess=res.excess[order])
    excess = np.concatenate([[res.excess0], np.asarray(res.excess, dtype=float)])

    scale = L if corrected else 1.0
    return PlateauSchedule(
        tau=jnp.asarray(np.asarray(res.t, dtype=float) / scale),
        mode=jnp.asarray(np.asarray(res.mode, dtype=int)),
        ignites=jnp.asarray(np.asarray(res.ignites, dtype=bool)),
        loss=jnp.asarray(res.L_inf + excess),
        excess=jnp.asarray(excess),
        tau_star=jnp.asarray(np.asarray(res.tstar, dtype=float) / scale),
        initially_active=jnp.asarray(active0),
        z_final=jnp.asarray(res.z_final),
        system=system,
        eps=eps,
        corrected=corrected,
        transients=transients,
        explicit_z0=z0 is not None,
    )
