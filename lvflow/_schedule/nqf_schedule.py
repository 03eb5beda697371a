"""The ε → 0 saddle-to-saddle schedule of a neural quadratic form whose data need not commute.

From `M0 = ε I` the flow `Ẇ = −H W` (Eq. 27) gives `M(t) = ε Φ(t) Φ(t)ᵀ`, `Φ` the propagator of
`−H(t)`. In `τ = t / ln(1/ε)` and log-scale `s = ln λ(M) / ln(1/ε)` the limit ε → 0 is a sequence
of plateaus (the reasoning and its assumptions: `docs/devdocs/nqf_schedule.md`):

- *plateau*: a critical point `M*` of the flow, `H(M*) M* = 0` — on its range `S` (the active
  subspace) it minimises the convex loss (Eq. 26) over PSD matrices with range in `S`, and
  `H(M*)` is block diagonal, zero on `S`. It is the end of the flow from the previous plateau
  pushed along the igniting directions (greedy low-rank learning, Li, Luo & Lyu 2021);
- *growth*: on `S⊥` the inactive part obeys `Ẇ⊥ = −H⊥⊥ W⊥`, so its log-scales grow at the rates
  `g = −2 eig(H⊥⊥)` (the gLV's `r_k − (Cz*)_k`); across plateaus with different eigenvectors the
  log-scales combine like the valuations of a product of matrix exponentials (a tropical
  Gaussian elimination on the overlaps of the inactive flag with `H⊥⊥`'s eigenvectors);
- *events*: a direction ignites when its log-scale reaches 0 (`ln(1/ε)` accumulated growth);
  a direction whose plateau value drops to 0 leaves the active subspace at log-scale 0 and
  decays from there.

Commuting data (Assumption 1) make every matrix diagonal in one basis, and the schedule is the
gLV schedule of `reduce_to_lv` (`plateau_schedule` on the `LotkaVolterra`).
"""

from __future__ import annotations

import math

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array, Bool, Float

from .._core.errors import LvflowError, SolverError
from .._core.validate import check_in_open_interval, check_positive_int
from .._form.nqf import NQF
from .._glv.reduce import _targets
from .._glv.rodas5p import Rodas5P
from .base import AbstractPlateauSchedule

# Overlaps (entries of an orthogonal matrix, after elimination) below this count as exact zeros.
_OVERLAP_TOL = 1e-7
# Rates below _RATE_RTOL of the first plateau's largest are 0 (and closer ones equal); eigenvalues
# of M below _RANK_RTOL of the largest have left; log-scales and times within _TIME_RTOL are equal.
_RATE_RTOL = 1e-9
_RANK_RTOL = 1e-7
_TIME_RTOL = 1e-10
# The push along an igniting direction, relative to its own saturation level.
_PUSH = 1e-5
# The flow to a plateau stops at |Ẇ| < _STEADY |H| |W| (then a Newton polish): an explicit or
# implicit solver hovers near 1e-8 at a steady state, so a tighter test would never fire.
_STEADY = 1e-6
# the flow to the next plateau runs at least this many times a push's growth time ln(1/_PUSH)/rate
_SETTLE = 100.0


class NQFPlateauSchedule(AbstractPlateauSchedule):
    """The ε → 0 schedule of an `NQF` flowing from `M0 = ε I` (§4, "Beyond the paper"); final, its
    common methods (`n_events`, `times`, `loss_at`) on `AbstractPlateauSchedule`.

    Events are sorted in time; several may share a time. Between events the loss sits on a
    plateau.

    **Fields:**

    - `tau`: event times in `τ = t / ln(1/ε)`, shape `(n,)`.
    - `direction`: the unit vector of each event, shape `(n, p)`: the eigenvector of `H⊥⊥` on the
      plateau before that ignites (in the limit, the new eigenvector of `M` at log-scale 0), or
      the direction of `M` that leaves (an eigenvector of the next plateau's `H⊥⊥`). Signs are
      arbitrary.
    - `ignites`: `True` for an ignition, `False` for a direction leaving the active subspace.
    - `loss`: plateau losses (Eq. 26), shape `(n + 1,)`: `loss[0]` before the first event,
      `loss[i+1]` after event `i` (events at one time share the loss after all of them).
    - `M`: the plateau matrices `M*`, shape `(plateaus, p, p)`, one per distinct event time plus
      the initial `M* = 0`; `plateau_tau[j]` is the time plateau `j` is reached.
    - `rates`: the growth rates `g = −2 eig(H⊥⊥(M*))` of the inactive directions on each plateau,
      descending, padded with NaN to `p`, shape `(plateaus, p)`.
    - `kkt_residual`: `max ‖H(M*) M*‖_F` over the plateaus (0 at an exact critical point).
    - `eps`, `nqf`.
    """

    tau: Float[Array, " n"]
    direction: Float[Array, "n p"]
    ignites: Bool[Array, " n"]
    loss: Float[Array, " n+1"]
    M: Float[Array, "plateaus p p"]
    plateau_tau: Float[Array, " plateaus"]
    rates: Float[Array, "plateaus p"]
    kkt_residual: float = eqx.field(static=True)
    nqf: NQF
    eps: float = eqx.field(static=True)

    @property
    def eps_fixed(self) -> bool:
        """The limit schedule holds at any ε (`times(eps)` converts at the one given)."""
        return False

    def M_at(self, tau: float) -> Float[Array, "p p"]:
        """The plateau matrix `M*` at time `tau` (right-continuous)."""
        j = int(np.searchsorted(np.asarray(self.plateau_tau), float(tau), side="right")) - 1
        return self.M[max(j, 0)]


# ---------------------------------------------------------------------------------------------
# Linear algebra of the inactive flag


def _blocks(x: np.ndarray, tol: float) -> list[np.ndarray]:
    """Index groups of consecutive (sorted) entries of `x` closer than `tol`."""
    if x.size == 0:
        return []
    cuts = np.flatnonzero(np.abs(np.diff(x)) > tol) + 1
    return np.split(np.arange(x.size), cuts)


def _align(B: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """An orthonormal basis of `span B` whose `k`-th vector is the projection of the first
    `ref` column not yet represented, with the earlier ones removed (so a degenerate block
    follows the flag `ref` it is compared with)."""
    out, rem = [], B
    for v in ref.T:
        if rem.shape[1] == 0:
            break
        w = rem.T @ v
        nw = float(np.linalg.norm(w))
        if nw > _OVERLAP_TOL:
            w = w / nw
            out.append(rem @ w)
            rem = rem @ _null_space(w[None, :])
    return np.column_stack(out + [rem]) if out else B


def _eliminate(c: np.ndarray, u: np.ndarray, g: np.ndarray, dtau: float) -> tuple[np.ndarray, np.ndarray]:
    """Tropical Gaussian elimination of `diag(e^{L g dτ/2}) c diag(e^{L u/2})` as `L → ∞`.

    `c = Qᵀ V` holds the overlaps of the rate eigenvectors `Q` (rows, rates `g`) with the flag
    `V` (columns, log-scales `u`). Each step pivots on the largest exponent `u_i + g_j dτ` among
    the non-zero entries (ties: the largest overlap) and takes the Schur complement, which keeps
    the form `diag(e^a) c' diag(e^b)`. Returns the pivot rows (the new flag, in order) and
    their log-scales (non-increasing).
    """
    c = c.copy()
    q = c.shape[0]
    rows, cols = list(range(q)), list(range(q))
    piv_rows, expo = [], []
    E = u[None, :] + g[:, None] * dtau
    for _ in range(q):
        sub = c[np.ix_(rows, cols)]
        big = np.abs(sub)
        nz = big > _OVERLAP_TOL
        if not nz.any():  # rounding ate what is left: take the largest overlap
            nz = big >= big.max()
        Es = np.where(nz, E[np.ix_(rows, cols)], -np.inf)
        top = Es.max()
        cand = Es >= top - _TIME_RTOL * max(1.0, abs(top))
        a, b = np.unravel_index(np.argmax(np.where(cand, big, -1.0)), sub.shape)
        j, i = rows[a], cols[b]
        piv_rows.append(j)
        expo.append(E[j, i])
        rest_r = [r for r in rows if r != j]
        rest_c = [k for k in cols if k != i]
        if rest_r:
            c[np.ix_(rest_r, rest_c)] -= np.outer(c[rest_r, i], c[j, rest_c]) / c[j, i]
        rows, cols = rest_r, rest_c
    return np.array(piv_rows, int), np.array(expo)


def _gram_schmidt(vectors: list[np.ndarray], proj: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Orthonormalise `proj @ v` in order, dropping those (nearly) in the span of the earlier
    ones; returns the basis and the kept indices."""
    out, kept = [], []
    for k, v in enumerate(vectors):
        w = proj @ v
        for o in out:
            w = w - o * (o @ w)
        n = float(np.linalg.norm(w))
        if n > 1e-6:
            w = w / n
            for o in out:  # re-orthogonalise once
                w = w - o * (o @ w)
            out.append(w / np.linalg.norm(w))
            kept.append(k)
    p = proj.shape[0]
    return (np.column_stack(out) if out else np.zeros((p, 0))), kept


# ---------------------------------------------------------------------------------------------
# Plateaus: the flow from a pushed saddle, then a Gauss–Newton polish of the factor


def _vector_field(t, W, args):
    # Ẇ = −H(W Wᵀ) W (Eq. 27), H = K(M) − Y (Eq. 252) with K as a p² × p² matrix: one compiled
    # solve per p, whatever the number of samples
    Kmat, Y = args
    p = W.shape[0]
    return -((Kmat @ (W @ W.T).reshape(p * p)).reshape(p, p) - Y) @ W


@eqx.filter_jit
def _flow(args, W0, t1, tol):
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_vector_field),
        Rodas5P(),  # stiff: a leaving direction decays slowly beside fast ones
        0.0,
        t1,
        None,
        W0,
        args=args,
        stepsize_controller=diffrax.PIDController(rtol=1e-7, atol=1e-12),
        event=diffrax.Event(diffrax.steady_state_event(rtol=0.0, atol=tol, norm=lambda x: jnp.max(jnp.abs(x)))),
        max_steps=200_000,
        throw=False,
    )
    assert sol.ys is not None and sol.ts is not None  # SaveAt(t1=True)
    return sol.ys[-1], sol.result, sol.ts[-1], sol.stats["num_steps"]


def _null_space(A: np.ndarray, rcond: float | None = None) -> np.ndarray:
    """An orthonormal basis (columns) of the null space of `A`: the right singular vectors whose
    singular values are at most `rcond` (default `max(A.shape)` ulps) times the largest."""
    _, sv, vh = np.linalg.svd(A, full_matrices=True)
    if rcond is None:
        rcond = max(A.shape) * np.finfo(float).eps
    rank = int(np.sum(sv > rcond * sv.max())) if sv.size else 0
    return vh[rank:].T.copy()


@eqx.filter_jit
def _newton_factor(R, qt, m, F0, cols):
    """Levenberg–Marquardt on the residuals of `L(F Fᵀ)` (Eq. 26), then on its gradient `H F`
    (Newton on `H F = 0` with the Hessian `δF ↦ K(δF Fᵀ + F δFᵀ) F + H δF`, Eq. 252, as its
    Jacobian: near the optimum the loss stops resolving the steps, the gradient does not). Both stop
    at rounding (`throw=False`: the last iterate is kept).

    The residuals `vec(A_μ)ᵀ vec(M) − t_μ` enter through `(R, qt)`, `vec(A) = Q R` (reduced QR,
    rows padded to `p²`), `qt = Qᵀ t`: `R vec(M) − qt` has the same normal equations and
    `Σ res_μ A_μ = Rᵀ(R vec(M) − qt)`, so one compilation serves every number of samples. `F0` is
    `p × p`, its columns off `cols` masked out (one compilation for every rank)."""
    p = F0.shape[0]

    def factor(F):
        return F * cols[None, :]

    def residual(F, _):
        G = factor(F)
        return (R @ (G @ G.T).reshape(p * p) - qt) / jnp.sqrt(m)

    def gradient(F, _):
        G = factor(F)
        H = 4.0 / m * (R.T @ (R @ (G @ G.T).reshape(p * p) - qt)).reshape(p, p)
        return H @ G

    solver = optx.LevenbergMarquardt(rtol=1e-15, atol=1e-15)
    F = optx.least_squares(residual, solver, F0, max_steps=200, throw=False).value
    return factor(optx.least_squares(gradient, solver, F, max_steps=100, throw=False).value)


def _polish(A2, t2, m, F0):
    """The critical point `H M = 0` of `L(F Fᵀ)` (Eq. 26) near the flow's end `F0`: Newton on the
    factor `F` of `M = F Fᵀ` (`_newton_factor`, quadratic convergence), then on its range, where the
    problem is linear, the exact minimiser over symmetric matrices (kept if positive definite).
    `A2`: `(n, p, p)`, zero beyond the first `d` rows and columns; `F0`: `(d, r)`. Returns `(d, r)`."""
    n, p = A2.shape[0], A2.shape[-1]
    d, r = F0.shape
    Q, R = np.linalg.qr(A2.reshape(n, p * p))
    Rp, qt = np.zeros((p * p, p * p)), np.zeros(p * p)
    Rp[: R.shape[0]], qt[: R.shape[0]] = R, Q.T @ t2
    Fp = np.zeros((p, p))
    Fp[:d, :r] = F0
    cols = jnp.asarray(np.arange(p) < r, dtype=float)
    F = np.asarray(_newton_factor(jnp.asarray(Rp), jnp.asarray(qt), jnp.asarray(float(m)), jnp.asarray(Fp), cols))
    F = F[:d, :r]
    A2 = A2[:, :d, :d]
    # On its range the problem is linear: the exact minimiser over symmetric X (kept if PD)
    # leaves `H` exactly zero there.
    # The smallest change (Frobenius) from the flow's end does it: directions the loss does not
    # see keep the values the flow gave them (for commuting data, the off-diagonal entries of Prop 7 stay 0).
    R = np.linalg.qr(F)[0]
    B = np.einsum("ia,nij,jb->nab", R, A2, R)
    X0 = R.T @ F0 @ F0.T @ R  # the flow's end, not Gauss–Newton's (which drifts along them)
    iu = np.triu_indices(r)
    w = np.where(iu[0] == iu[1], 1.0, math.sqrt(2.0))  # coordinates in which ‖X‖_F is Euclidean
    design = B[:, iu[0], iu[1]] * w[None, :]
    dx = np.linalg.lstsq(design, t2 - np.einsum("nab,ab->n", B, X0), rcond=None)[0] / w
    D = np.zeros((r, r))
    D[iu] = dx
    X = X0 + D + D.T - np.diag(np.diagonal(D))
    if np.linalg.eigvalsh(X)[0] > 0:
        F = R @ np.linalg.cholesky(X)
    return F


def _saturation(A2, t2, m, M, q):
    """Where the loss along `M + z q qᵀ` is least: `z = −(qᵀHq/2) / ((2/m) Σ (qᵀA_μq)²)`."""
    a = np.einsum("i,nij,j->n", q, A2, q)
    res = np.einsum("nij,ij->n", A2, M) - t2
    curv = 2.0 / m * float(a @ a)
    return max(-(2.0 / m * float(res @ a)) / curv, 0.0) if curv > 0 else 0.0


def _invariant_span(A2: np.ndarray, S: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the smallest subspace containing `span S` that every `A_μ` maps
    into itself. A flow whose `M` has its range there stays there (`H` is a combination of the
    `A_μ`); for commuting data it is `span S` itself when `S` is made of common eigenvectors."""
    p = A2.shape[-1]
    tol = 1e-6 * max(float(np.max(np.abs(A2))), 1e-300)  # well above the polish's residual tilt
    T, _ = np.linalg.qr(S)
    todo = T
    while todo.shape[1] and T.shape[1] < p:
        img = np.einsum("nij,jk->ink", A2, todo).reshape(p, -1)
        img = img - T @ (T.T @ img)
        img = img - T @ (T.T @ img)
        U, sv, _ = np.linalg.svd(img, full_matrices=False)
        todo = U[:, sv > tol]
        T = np.column_stack([T, todo])
    return T


def _next_plateau(nqf, A2, t2, m, F, dirs, rate):
    """The plateau the flow reaches from `F Fᵀ + δ Σ q qᵀ` (the saddle `F Fᵀ` pushed along the
    igniting directions `dirs`, the slowest of which grows at `rate`), its factor and the
    directions that left on the way.

    The flow and the polish run in the invariant span of `range F + span dirs` (coordinates `T`,
    zero-padded to `p` so that one compiled solve serves every plateau): rounding errors outside
    it would otherwise grow along unstable directions that the exact flow never excites."""
    p = A2.shape[-1]
    M = F @ F.T
    sat = [_saturation(A2, t2, m, M, q) for q in dirs.T]
    pushes = [math.sqrt(_PUSH * max(z, 1e-300)) * q for z, q in zip(sat, dirs.T)]
    cols = np.column_stack([F] + pushes) if F.shape[1] else np.column_stack(pushes)
    T = _invariant_span(A2, cols)
    d = T.shape[1]
    AT = np.zeros(A2.shape)
    AT[:, :d, :d] = np.einsum("ia,nij,jb->nab", T, A2, T)
    flat = AT.reshape(A2.shape[0], p * p)
    args = (jnp.asarray(4.0 / m * flat.T @ flat), jnp.asarray(4.0 / m * np.einsum("n,nij->ij", t2, AT)))
    W0 = np.zeros((p, p))
    W0[:d, : cols.shape[1]] = T.T @ cols
    # |Ẇ| = |H W| at steady state, against |H| |W| on the way there
    size = math.sqrt(max(max(sat), float(np.max(np.abs(M))) if M.size else 0.0, 1e-300))
    scale = max(float(np.max(np.abs(np.asarray(nqf.H(jnp.asarray(M)))))), 1e-300) * size
    t1 = 1e6 / max(float(np.max(np.abs(A2))) * max(float(np.max(np.abs(t2))), 1.0), 1e-300)
    # ... and long enough for the slowest push to grow from δ² = _PUSH · sat to saturation
    # (ln(1/_PUSH)/rate) and settle: the steady-state event ends the solve when it has
    t1 = max(t1, _SETTLE * math.log(1 / _PUSH) / max(rate, 1e-300))
    # ... and below the push's own start, |H q| |push|, lest a slowly growing direction count as
    # already settled
    v0 = float(np.max(np.abs(np.asarray(nqf.H(jnp.asarray(M))) @ np.column_stack(pushes))))
    tol = min(_STEADY * scale, 1e-2 * v0) if v0 > 0 else _STEADY * scale
    Wend, result, _, _ = _flow(args, jnp.asarray(W0), jnp.asarray(t1), jnp.asarray(tol))
    if result != diffrax.RESULTS.successful and result != diffrax.RESULTS.event_occurred:
        raise SolverError(f"plateau_schedule: the flow to the next plateau failed: {diffrax.RESULTS[result]}")
    Wend = np.asarray(Wend)[:d]
    lam, U = np.linalg.eigh(Wend @ Wend.T)
    lam, U = lam[::-1], U[:, ::-1]
    n = cols.shape[1]
    r = int(np.sum(lam > _RANK_RTOL * max(float(lam[0]), 1e-300)))
    gone = T @ U[:, r:n]  # directions the flow had and lost
    F0 = U[:, :r] * np.sqrt(lam[:r])[None, :]
    Fnew = T @ _polish(AT, t2, m, F0) if r else T @ F0
    return Fnew, gone


# ---------------------------------------------------------------------------------------------


def _check_nqf(nqf):
    if not isinstance(nqf, NQF):
        raise LvflowError(f"nqf: expected an lvflow.NQF, got {type(nqf).__name__}")
    return _targets(nqf, "nqf")


def nqf_plateau_schedule(nqf: NQF, eps, *, max_events: int | None = None) -> NQFPlateauSchedule:
    """The ε → 0 limit of the flow `Ṁ = −(H M + M H)` (Eq. 28) of an `NQF` from `M0 = ε I`.

    Called by `plateau_schedule` for an `NQF`; the algorithm is in the module docstring and
    `docs/devdocs/nqf_schedule.md`. Each plateau costs one stiff solve of the `p × p` factor flow
    and a Newton polish, so it is meant for `p` up to a few tens.

    **Arguments:**

    - `nqf`: a ZGZ `NQF` (no `g`, `B`), scalar or vector outputs.
    - `eps`: the initial scale ε ∈ (0, 1); the limit does not depend on it (`times` uses it).
    - `max_events`: size of the event buffer (default `4p + 16`).

    **Returns:** an `NQFPlateauSchedule`.

    **Raises:** `LvflowError` for `eps ∉ (0, 1)`, a non-`NQF`, an NQF with μ-terms or a bad
    `max_events`; `SolverError` when a plateau's flow fails, an ignition does not lower the loss
    (a rate within rounding of 0), the inactive flag loses a dimension in a transition, or the
    event budget overflows.
    """
    eps = check_in_open_interval("eps", eps, 0.0, 1.0)
    A2, t2, m = _check_nqf(nqf)
    p = A2.shape[-1]
    event_cap = 4 * p + 16 if max_events is None else check_positive_int("max_events", max_events)
    H_of = lambda M: np.asarray(nqf.H(jnp.asarray(M)))  # noqa: E731
    loss_of = lambda M: float(nqf.loss(jnp.asarray(M)))  # noqa: E731

    F = np.zeros((p, 0))  # factor of the plateau M* = F Fᵀ
    V = np.eye(p)  # the inactive flag (columns), log-scales u (non-increasing)
    u = np.full(p, -1.0)
    t = 0.0
    ev_t, ev_dir, ev_ign, ev_loss = [], [], [], []
    Ms, taus, rates = [np.zeros((p, p))], [0.0], []
    kkt = 0.0
    rscale = 1e-300  # the first plateau's largest rate (set on the first pass)
    loss0 = loss_of(np.zeros((p, p)))
    while True:
        M = F @ F.T
        H = H_of(M)
        kkt = max(kkt, float(np.linalg.norm(H @ M)))
        # the inactive subspace S⊥ and the rates of H⊥⊥ there
        if F.shape[1]:
            B = _null_space(F.T, rcond=1e-10)
        else:
            B = np.eye(p)
        h, Qc = np.linalg.eigh(B.T @ H @ B)
        g = -2.0 * h  # descending
        Q = B @ Qc
        if not rates:  # rates below _RATE_RTOL of the first plateau's (2‖Y‖) are zero
            rscale = max(float(np.max(np.abs(g))), 1e-300)
        rates.append(np.concatenate([g, np.full(p - g.size, np.nan)]))
        if g.size == 0:
            break
        for blk in _blocks(u, _TIME_RTOL * max(1.0, t)):  # degenerate log-scales follow Q
            V[:, blk] = _align(V[:, blk], Q)
        for blk in _blocks(g, _RATE_RTOL * rscale):  # degenerate rates follow the flag
            Q[:, blk] = _align(Q[:, blk], V)
        c = Q.T @ V
        grow = g > _RATE_RTOL * rscale
        ok = (np.abs(c) > _OVERLAP_TOL) & grow[:, None]
        if not ok.any():
            break
        dt_all = np.where(ok, -u[None, :] / np.where(grow, g, 1.0)[:, None], np.inf)
        dtau = max(float(dt_all.min()), 0.0)
        piv, w = _eliminate(c, u, g, dtau)
        t += dtau
        w = np.minimum(w, 0.0)
        ign = (w >= -_TIME_RTOL * max(1.0, t) * np.abs(g[piv])) & grow[piv]
        ign[0] = True
        dirs = Q[:, piv[ign]]
        F, gone = _next_plateau(nqf, A2, t2, m, F, dirs, float(np.min(g[piv[ign]])))
        Mnew = F @ F.T
        Lnew = loss_of(Mnew)
        if Lnew >= (ev_loss[-1] if ev_loss else loss0) - 1e-14 * max(1.0, abs(loss0)):
            raise SolverError(
                f"plateau_schedule: the ignition at τ = {t:.6g} did not lower the loss (rate {g[piv[0]]:.3g} "
                "too close to 0 for the plateau flow to resolve)"
            )
        for d in dirs.T:
            ev_t.append(t)
            ev_dir.append(d)
            ev_ign.append(True)
            ev_loss.append(Lnew)
        # the new flag in the new S⊥: leaving directions at log-scale 0, then the rest in order
        proj = np.eye(p)
        if F.shape[1]:
            Bn = _null_space(F.T, rcond=1e-10)
            proj = Bn @ Bn.T
            if gone.shape[1]:
                # in the limit a leaving direction is an eigenvector of the new H⊥⊥: snap to it
                hn, Qn = np.linalg.eigh(Bn.T @ H_of(Mnew) @ Bn)
                ov = (Bn @ Qn).T @ (proj @ gone)
                gone = (Bn @ Qn)[:, np.argmax(np.abs(ov), axis=0)]
        vecs = list(gone.T) + list(Q[:, piv[~ign]].T)
        logs = np.concatenate([np.zeros(gone.shape[1]), w[~ign]])
        V, kept = _gram_schmidt(vecs, proj)
        u = logs[kept]
        for k in kept:
            if k < gone.shape[1]:
                ev_t.append(t)
                ev_dir.append(V[:, kept.index(k)])
                ev_ign.append(False)
                ev_loss.append(Lnew)
        if V.shape[1] != p - F.shape[1]:
            raise SolverError(
                f"plateau_schedule: the inactive flag has {V.shape[1]} directions, expected {p - F.shape[1]} "
                f"(at τ = {t:.6g}; the transition rotated the active subspace too far for the projection)"
            )
        Ms.append(Mnew)
        taus.append(t)
        if len(ev_t) > event_cap:
            raise SolverError(f"max_events: more than {event_cap} events; pass a larger max_events")

    return NQFPlateauSchedule(
        tau=jnp.asarray(np.array(ev_t, dtype=float)),
        direction=jnp.asarray(np.array(ev_dir, dtype=float).reshape(len(ev_t), p)),
        ignites=jnp.asarray(np.array(ev_ign, dtype=bool)),
        loss=jnp.asarray(np.array([loss0] + ev_loss, dtype=float)),
        M=jnp.asarray(np.stack(Ms)),
        plateau_tau=jnp.asarray(np.array(taus)),
        rates=jnp.asarray(np.stack(rates)),
        kkt_residual=kkt,
        nqf=nqf,
        eps=eps,
    )
