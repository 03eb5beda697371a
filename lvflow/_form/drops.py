"""The drops of `M` on any data: the gradient flow (Eq. 28), or gradient descent's exact map of `M`
(Thm 2), run to convergence, and the directions of `M` that switch on, when, and what each removes
from the loss."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .._core.errors import DivergenceError, LvflowError, SolverError
from .._core.programs import persistent_jit
from .._core.validate import check_in_open_interval, check_positive, check_positive_int, to_jax
from .._curve.drops import LossDrops, loss_drops
from .flow import check_state
from .nqf import NQF
from .recursion import _gd_step

# Directions whose strengths and switch-on times agree to this (relative) are one drop.
_SAME = 1e-6


class MatrixDrops(eqx.Module):
    """The drops of the M-flow `Ṁ = −(HM + MH)` (Eq. 28) from `M0`, integrated until it converges,
    or of gradient descent's exact map `M_{n+1} = (I − ηH) M_n (I − ηH)` (Thm 2) at learning rate
    `η`, iterated until it converges (then `t = η n` at step `n`).

    A *direction* is an eigenvector `u_i` of the final `M(t_end)` whose eigenvalue `λ_i` grew at
    least 100-fold from `M0`; its *strength* is `s_i(t) = u_iᵀ M(t) u_i` (for commuting data, the
    gLV's `z_k`, Eq. 31). It switches on at `t*_i`, the first time `s_i = ρ λ_i` (Thm 8's
    definition). Directions are listed in switch-on order. The drops of the loss are those of
    its curve (`loss_drops`: plateau to plateau, timed where the loss crosses the midpoint);
    directions that switch on too close together for a plateau between them share one drop.

    **Fields:**

    - `ts`, `loss`: the loss curve on `[0, t_end]` (linear and logarithmic samples merged).
    - `drops`: the drops of that curve (`LossDrops`); `drops.containing(t_star)` says which drop
      each direction switches on in.
    - `t_star`, `strength`: per direction, `t*_i` and `λ_i`.
    - `multiplicity`: the dimension of each drop's eigenspace (directions with equal strength
      and `t*` to 1e-6 relative are one drop; `directions` holds one of them).
    - `directions`: `u_i` as rows, shape `(n, p)`, sign fixed so that the largest entry is positive.
    - `loss_floor`: the least loss over the span of the data's features (least squares; a lower
      bound of the loss over PSD `M`, equal to it for learned-map architectures), or NaN when
      `A` is not factored.
    - `converged`: whether the stopping criterion held at `t_end` (below); `t_end`.
    - `learning_rate`: `η` of the GD map, or `None` for the flow.

    The dynamics stop when the loss is within `tol` of its floor, `L − L_floor ≤ tol (L(0) −
    L_floor)`, or when `M` satisfies the optimality conditions of `min_{M ⪰ 0} L(M)`
    (`H ⪰ 0`, `HM = 0`) to `tol` relative to the fastest rate — a steady-state event.
    """

    ts: Float[Array, " T"]
    loss: Float[Array, " T"]
    drops: LossDrops
    t_star: Float[Array, " n"]
    strength: Float[Array, " n"]
    multiplicity: Int[Array, " n"]
    directions: Float[Array, "n p"]
    loss_floor: float = eqx.field(static=True)
    converged: bool = eqx.field(static=True)
    t_end: float = eqx.field(static=True)
    learning_rate: float | None = eqx.field(static=True, default=None)


def _loss_floor(nqf: NQF) -> float:
    """`min_θ (1/m) Σ |Φ θ − (y − f0)|²` over the factored features (NaN when `A` is dense)."""
    if nqf.features is None or nqf.basis is None or nqf.has_mu_terms:  # dense A, or μ-terms
        return math.nan
    t = np.asarray(nqf.y, dtype=np.float64) - np.asarray(nqf.f0, dtype=np.float64)
    F = np.asarray(nqf.features, dtype=np.float64)
    if nqf.basis.ndim == 4:  # shared features, one coefficient vector per output
        res = t - F @ np.linalg.lstsq(F, t, rcond=None)[0]
    else:
        Fm = F.reshape(-1, F.shape[-1])
        res = t.reshape(-1) - Fm @ np.linalg.lstsq(Fm, t.reshape(-1), rcond=None)[0]
    return float(np.sum(res**2) / nqf.m)


def _vector_field(t, M, nqf):
    X = nqf.H(M) @ M
    return -(X + X.T)


def _converged(t, M, args, **kwargs):
    nqf, floor, gap0, tol, rate = args
    H = nqf.H(M)
    gap = nqf.loss(M) - floor
    near_floor = jnp.isfinite(floor) & (gap <= tol * gap0)
    HM = H @ M
    stationary = jnp.linalg.norm(HM + HM.T) <= tol * rate * jnp.linalg.norm(M)
    # H ⪰ 0 (to tol·rate) decided only at stationary points (plateaus and the end): a
    # factorisation per check would cost more than the steps between checks
    psd = lambda: _positive_definite(H + tol * rate * jnp.eye(H.shape[0], dtype=H.dtype))  # noqa: E731
    return near_floor | jax.lax.cond(stationary, psd, lambda: jnp.zeros((), bool))


def _positive_definite(S):
    """Whether the symmetric `S` is positive definite: every pivot of its symmetric Gaussian
    elimination (Cholesky's, unpivoted) is positive (Sylvester's criterion). Rank-1 updates in a
    `fori_loop`, without LAPACK (whose first use in a process imports SciPy)."""
    p = S.shape[0]
    later = jnp.arange(p)

    def eliminate(k, carry):
        S, ok = carry
        pivot = S[k, k]
        ok = ok & (pivot > 0)
        col = jnp.where(later > k, S[:, k], 0.0)
        return S - jnp.outer(col, col) / jnp.where(ok, pivot, 1.0), ok

    return jax.lax.fori_loop(0, p, eliminate, (S, jnp.ones((), bool)))[1]


@eqx.filter_jit
def _chunk(nqf, M0, ts, floor, gap0, tol, rate, rtol, atol, max_steps):
    import diffrax  # here, not at the top: GD's map (the `lvflow predict --lr` path) never needs it

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_vector_field),
        diffrax.Tsit5(),
        ts[0],
        ts[-1],
        None,
        M0,
        args=nqf,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        event=diffrax.Event(lambda t, y, args, **kw: _converged(t, y, (nqf, floor, gap0, tol, rate))),
        max_steps=max_steps,
        throw=False,
    )
    return sol.ys, jax.vmap(nqf.loss)(sol.ys), sol.result, sol.t1


@persistent_jit
def _gd_chunk(nqf, M0, n0, steps, lr, floor, gap0, tol, rate):
    """GD's map of `M` from step `n0` (`M0`), recorded (with its loss) at the non-decreasing `steps`;
    once the steady-state event holds (or the loss overflows) at a record, no further steps are taken."""
    mu, one, zero = jnp.zeros(nqf.p, dtype=M0.dtype), jnp.ones((), M0.dtype), jnp.zeros((), M0.dtype)
    step = lambda _, M: _gd_step(nqf, M, mu, one, lr, zero)[0]  # noqa: E731  (ZGZ: M' = (I − ηH) M (I − ηH))

    def record(carry, n_next):
        M, n, done = carry
        M = jax.lax.fori_loop(0, jnp.where(done, 0, n_next - n), step, M)
        n = jnp.where(done, n, n_next)
        # the loss (quartic in W) overflows first; past that, the event's norms are meaningless
        loss = nqf.loss(M)
        diverged = ~jnp.isfinite(loss)
        stop = done | diverged | _converged(None, M, (nqf, floor, gap0, tol, rate))
        return (M, n, stop), (M, loss, n, stop, diverged)

    _, (Ms, losses, ns, stops, diverged) = jax.lax.scan(record, (M0, n0, jnp.zeros((), bool)), steps)
    return Ms, losses, ns, stops, diverged


@persistent_jit
def _start(nqf, M0):
    """`Y` (Eq. 252) and the loss at `M0`, as one compiled program."""
    return nqf.Y, nqf.loss(M0)


def matrix_drops(
    nqf: NQF,
    M0: Float[ArrayLike, "p p"],
    *,
    learning_rate: float | None = None,
    rho: float = 0.5,
    t1: float | None = None,
    tol: float = 1e-3,
    num_points: int = 400,
    rtol: float = 1e-6,
    max_chunks: int = 12,
    max_steps: int = 100_000,
) -> MatrixDrops:
    """Run the M-flow (Eq. 28) of a ZGZ `nqf` from `M0`, or gradient descent's exact map of `M`
    (Thm 2), until it converges, and find its drops.

    The flow `Ṁ = −(HM + MH)`, `H = (4/m) Σ_μ Δ_μ A_μ` (Eq. 27), is integrated with diffrax's
    `Tsit5` in chunks `[0, T], [T, 4T], …` until the steady-state event of `MatrixDrops` fires
    (or up to `t1` when given, without the event); `T` is 1.5 `ln(1/ε)/r + 10/r` for the
    fastest rate `r = 2 λ_max(Y)` and `ε` the smallest eigenvalue of `M0`.

    With a `learning_rate` η, GD's step `W' = (I − ηH) W` is iterated exactly on `M = W Wᵀ`,

    `M_{n+1} = (I − ηH(M_n)) M_n (I − ηH(M_n))`   (Thm 2, ZGZ),

    the discrete dynamics of every network with this NQF, whatever its width, in chunks of
    steps `[0, N], [N, 4N], …` (`N = ⌈T/η⌉`) with the same stopping event; times are `t = η n`, so the drops'
    `t*/η` are GD's own step counts (the flow is GD's `η → 0` limit: at `ηλ` not small GD grows a
    direction by `1 + ηλ` per step, not `e^{ηλ}`).

    **Arguments:**

    - `nqf`: a ZGZ `lvflow.NQF` (dense or factored).
    - `M0`: the initial `M = W Wᵀ`, symmetric PSD (e.g. `ε I`, or `d σ² I` for `d` neurons
      drawn with standard deviation σ).
    - `learning_rate`: GD's `η > 0` for the exact map; `None` (default) for the flow.
    - `rho`: the switch-on fraction `ρ ∈ (0, 1)`.
    - `t1`: a fixed horizon instead of the convergence event.
    - `tol`: the convergence tolerance (see `MatrixDrops`).
    - `num_points`: samples of the loss curve per chunk.
    - `rtol`: the flow's step-size controller's relative tolerance (`atol` is `rtol` × the
      smallest eigenvalue of `M0` × 1e-3); unused by the GD map, which is exact.
    - `max_chunks`, `max_steps`: bounds on the horizon (`4^max_chunks T`) and on the solver's (or
      GD's) steps per chunk.

    **Returns:** a `MatrixDrops`.

    **Raises:** `LvflowError` for bad input or data with nothing to learn (`Y` has no positive
    eigenvalue); `SolverError` if the solve fails; `DivergenceError` (a `SolverError`) if GD
    diverges (`η` too large: GD on a quadratic needs `η λ_max < 2` for the loss's curvature
    `λ_max`).
    """
    return matrix_drops_path(
        nqf, M0, learning_rate=learning_rate, rho=rho, t1=t1, tol=tol, num_points=num_points, rtol=rtol,
        max_chunks=max_chunks, max_steps=max_steps,
    )[0]  # fmt: skip


def matrix_drops_path(
    nqf: NQF,
    M0: Float[ArrayLike, "p p"],
    *,
    learning_rate: float | None = None,
    rho: float = 0.5,
    t1: float | None = None,
    tol: float = 1e-3,
    num_points: int = 400,
    rtol: float = 1e-6,
    max_chunks: int = 12,
    max_steps: int = 100_000,
) -> tuple[MatrixDrops, np.ndarray, np.ndarray]:
    """`matrix_drops`, and the path it followed: its times `ts` (the loss curve's) and `M` at each, `(T, p, p)`
    (for `predict`'s validity horizon). Arguments and errors as `matrix_drops`."""
    if not isinstance(nqf, NQF):
        raise LvflowError(f"nqf: expected an lvflow.NQF, got {type(nqf).__name__}")
    if nqf.has_mu_terms:
        raise LvflowError("nqf: has μ-terms (g or B, Thm 12); matrix_drops follows M alone (ZGZ modules)")
    M0, _, _ = check_state(nqf, M0, None, None)
    M0 = np.asarray(M0, dtype=np.float64)
    rho = check_in_open_interval("rho", rho, 0.0, 1.0)
    tol = check_in_open_interval("tol", tol, 0.0, 1.0)
    rtol = check_positive("rtol", rtol)
    n = check_positive_int("num_points", num_points)
    check_positive_int("max_chunks", max_chunks)
    check_positive_int("max_steps", max_steps)
    if t1 is not None:
        t1 = check_positive("t1", t1)
    lr = None if learning_rate is None else check_positive("learning_rate", learning_rate)
    lam0 = np.linalg.eigvalsh(M0)
    if lam0[0] <= 0:
        raise LvflowError("M0: must be positive definite (every direction needs a seed to grow from)")
    Y, L0 = (np.asarray(v) for v in _start(nqf, M0))
    rate = 2 * float(np.max(np.linalg.eigvalsh((Y + Y.T) / 2)))
    if not rate > 0:
        raise LvflowError("data: Y = (4/m) Σ y_μ A_μ has no positive eigenvalue, so nothing is learned from small init")
    floor = _loss_floor(nqf)
    L0 = float(L0)
    gap0 = L0 - floor if math.isfinite(floor) else math.nan
    T = 1.5 * math.log(1 / lam0[0]) / rate + 10 / rate if lam0[0] < 1 else 10 / rate
    atol = 1e-3 * rtol * float(lam0[0])
    f = np.float64  # a numpy scalar is traced as an array (not static) and converts without compiling
    # with a fixed t1 the event is switched off by an unreachable tolerance
    args = (f(floor if t1 is None else math.nan), f(gap0), f(tol if t1 is None else -1.0), f(rate))
    if lr is None:
        import diffrax

        def run_flow(t_lo, t_hi, M):
            ts = _grid(t_lo, t_hi, n)
            # numpy arrays go in as they are: `jnp.asarray` would compile a conversion per shape
            Ms, loss, result, t_stop = _chunk(nqf, M, ts, *args, f(rtol), f(atol), int(max_steps))
            event = result == diffrax.RESULTS.event_occurred
            if not (event or result == diffrax.RESULTS.successful):
                raise SolverError(f"matrix_drops: the ODE solve failed: {diffrax.RESULTS[result]}")
            Ms = np.asarray(Ms)
            keep = np.all(np.isfinite(Ms), axis=(1, 2))
            if event:
                keep &= ts <= float(t_stop)
            return ts[keep], Ms[keep], np.asarray(loss)[keep], bool(event)

        horizon = t1 if t1 is not None else T
        ts, Ms, loss, converged = _until_event(run_flow, M0, horizon, math.inf, t1 is not None, max_chunks)
    else:

        def run_gd(n_lo, n_hi, M):
            steps = np.round(_grid(n_lo, n_hi, n)).astype(np.int64)
            out = _gd_chunk(nqf, M, np.int64(n_lo), steps, f(lr), *args)
            Ms, loss, ns, stops, diverged = (np.asarray(v) for v in out)
            if diverged.any():
                bad = int(ns[int(np.argmax(diverged))])
                raise DivergenceError(
                    f"matrix_drops: gradient descent diverged (the loss overflowed by step {bad}); "
                    f"learning_rate={lr:g} is too large (GD needs learning_rate × the loss's largest curvature < 2)",
                    step=bad,
                )
            last = int(np.argmax(stops)) if stops.any() else len(ns) - 1
            return lr * ns[: last + 1].astype(np.float64), Ms[: last + 1], loss[: last + 1], bool(stops.any())

        # N = ⌈T/η⌉ steps first (at most max_steps a chunk), or ⌈t1/η⌉
        first = max(1, math.ceil(t1 / lr)) if t1 is not None else min(max(1, math.ceil(T / lr)), max_steps)
        ts, Ms, loss, converged = _until_event(run_gd, M0, first, max_steps, t1 is not None, max_chunks)
    return _drops(ts, Ms, loss, lam0[0], rho, floor, converged, lr), ts, Ms


def _until_event(run, M0, first, cap, fixed: bool, max_chunks: int):
    """Chunks `[0, first], [first, 4·first], …` (each at most `cap` long) of `run(lo, hi, M) ->
    (times, Ms, losses, event)` from `M0` until the event holds, or the one chunk `[0, first]`
    when `fixed`; returns the times (each once), their `M`s and losses, and whether the event held."""
    lo, M, t_parts, M_parts, L_parts, event = 0, M0, [], [], [], False
    for i in range(1 if fixed else max_chunks):
        hi = first if i == 0 else min(4 * lo, lo + cap)
        ts, Ms, loss, event = run(lo, hi, M)
        t_parts.append(ts)
        M_parts.append(Ms)
        L_parts.append(loss)
        if event or fixed:
            break
        lo, M = hi, Ms[-1]
    ts, Ms, loss = np.concatenate(t_parts), np.concatenate(M_parts), np.concatenate(L_parts)
    _, once = np.unique(ts, return_index=True)
    return ts[once], Ms[once], loss[once], event


def _grid(t0: float, t1: float, n: int) -> np.ndarray:
    """Linear and logarithmic samples of `[t0, t1]`, merged, of fixed length `2n − 1`."""
    lo = t0 if t0 > 0 else t1 * 1e-4
    return np.sort(np.concatenate([np.linspace(t0, t1, n), np.geomspace(lo, t1, n)[:-1]]))


def _crossing(ts, s, level, final) -> float:
    """The first time `s(t)` reaches `level` (below `final`), interpolated linearly in the logit
    `ln(s/(final − s))` between samples — exact for a logistic (Thm 6) — or in `ln s` where `s`
    overshoots `final` (inf if never)."""
    above = np.flatnonzero(s >= level)
    if above.size == 0:
        return math.inf
    j = int(above[0])
    if j == 0:
        return float(ts[0])
    lo, hi = max(s[j - 1], 1e-300), s[j]
    g = (lambda v: math.log(v / (final - v))) if hi < final else math.log  # noqa: E731
    a, b, c = g(lo), g(hi), g(level)
    w = (c - a) / (b - a) if b > a else 1.0
    return float(ts[j - 1] + w * (ts[j] - ts[j - 1]))


def _drops(ts, Ms, loss, eps, rho, floor, converged, lr) -> MatrixDrops:
    lam, U = np.linalg.eigh(Ms[-1])
    grew: Bool[np.ndarray, " p"] = lam >= 100 * eps
    lam, U = lam[grew], U[:, grew]
    strength = np.einsum("ik,tij,jk->tk", U, Ms, U)  # s_i(t) = u_iᵀ M(t) u_i
    t_star = np.array([_crossing(ts, strength[:, i], rho * lam[i], lam[i]) for i in range(lam.size)])
    order = np.lexsort((-lam, t_star))
    # directions of one eigenspace (equal strength, equal t*: e.g. the d_v copies of an attention
    # head's value unit) are one drop
    first = [0] if order.size else []
    for j in range(1, order.size):
        a, b = order[j - 1], order[j]
        same = abs(lam[b] - lam[a]) <= _SAME * lam[a] and abs(t_star[b] - t_star[a]) <= _SAME * max(t_star[a], 1.0)
        if not same:
            first.append(j)
    first = np.asarray(first, dtype=int)
    multiplicity = np.diff(np.append(first, order.size))
    lead = order[first]
    U = U[:, lead]
    U = U * np.where(U[np.argmax(np.abs(U), axis=0), np.arange(U.shape[1])] < 0, -1.0, 1.0)[None, :]
    return MatrixDrops(
        ts=to_jax(ts),
        loss=to_jax(loss),
        drops=loss_drops(ts, loss),
        t_star=to_jax(t_star[lead]),
        strength=to_jax(lam[lead]),
        multiplicity=to_jax(multiplicity),
        directions=to_jax(U.T),
        loss_floor=float(floor),
        converged=converged,
        t_end=float(ts[-1]),
        learning_rate=lr,
    )
