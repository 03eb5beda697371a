"""One ignition's transient, integrated on its unstable orbit: the `transients=True` option of
`plateau_schedule`.

The corrected schedule places an ignition where a logistic mode, rising on an adiabatically
relaxing support, reaches half of `σ_k/γ_k`. When the support relaxes about as slowly as the
entering mode grows, or the ignition switches modes off, neither holds. Near the plateau
`z_old` (support `S`) the restricted gLV (Eq. 32) has one unstable direction per growing mode:
linearising `ż = z ⊙ (r − Cz)` at `z_old` with `z_k` small,

    ż_k = σ_k z_k,   ż_S = −D (C_SS δz_S + C_Sk z_k),   D = Diag(z_old,S),

whose solution growing like `e^{σ_k t}` is `δz = z_k v`, `v_k = 1`,
`v_S = −(σ_k I + D C_SS)⁻¹ D C_Sk`. Every finite-ε trajectory igniting mode `k` runs close to
the orbit that leaves `z_old` along `v` (the other modes are exponentially small), so it is
integrated once, from `z_old + A v`, until it has settled on the next plateau `z_new`. Mode `k`
grows like `A e^{σ_k t}` at first, so an inactive mode that reaches `ln z_k = θ_k` ignites at
the orbit's `t_c`, with

    θ_k = ln A + σ_k t_c,      z_k(t_c) = ρ z_new,k   (ρ = ½, as `solve_lv`'s switch-on).

The passive modes `j` (off the orbit, `ż_j = z_j (r_j − (Cz)_j)`) see the transition through
`(Cz)_j`; against a step from `z_old` to `z_new` at `t_c` their logs shift by
`Δu_j = −(C m)_j`, `m = ∫ (z − z_step) dt`. A mode leaving the support decays at its new rate
`σ_j < 0` once the others have settled: its tail, `x z_j(T)/|σ_j|` with
`x = e_j − C_SS⁻¹ C_Sj` on the new support, is added to `m` in closed form, and its log is
reported as `lim_{t→∞} [ln z_j(t) − σ_j (t − t_c)]` (where the step picture puts it at `t_c`).

Cost: one stiff ODE of `2|M|` unknowns (`ln z` and `∫ z` on `M = S ∪ {k} ∪ supp z_new`) per
ignition, `O(|M|³)` per step (`lvflow.Rodas5P`, its Jacobian by autodiff).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import diffrax as dfx
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array, Float, Int

from .._core.errors import SolverError
from .._glv.interaction import exp_clipped
from .._glv.rodas5p import Rodas5P

# z_k at the start, relative to the target ρ z_new,k: small enough that the linearisation's
# O(A²) and the logistic's O(A) error stay below the integration tolerance.
_AMPLITUDE = 1e-9
_RTOL, _ATOL = 1e-11, 1e-12
# Integrate until the slowest relaxation has decayed by e^-40.
_SETTLE = 40.0
# The joint window (`window.py`): a mode within e^-κ of its level is in transit, not passive, and a
# transition has settled when every log of the support is within e^-κ of its plateau value.
_KAPPA = 8.0


class Transient(NamedTuple):
    """`theta`: the ignition threshold `θ_k` in `ln z_k`; `m`: `∫ (z − z_step) dt` on `M`;
    `u_off`: for the modes leaving the support, their log extrapolated back to `t_c` (NaN elsewhere);
    `rate`: the slowest decay after `t_c` (the entering mode's `σ_k`, the new support's relaxation, a
    leaving mode's `|σ_j|`): the orbit is within `e^-x` of `z_new` about `x / rate` after `t_c`."""

    theta: float
    m: Float[np.ndarray, " M"]
    u_off: Float[np.ndarray, " M"]
    rate: float


# steps per solve (a solve that needs more is continued from where it stopped)
_MAX_STEPS = 4096


def _field(t, y: Float[Array, " twoN"], args) -> Float[Array, " twoN"]:
    """The restricted gLV (Eq. 32) in `y = (u, I)`, `u = ln z`, `I = ∫ z dt`: `u̇ = r − C e^u`, `İ = e^u`."""
    r, C = args
    z = exp_clipped(y[: r.shape[0]])
    return jnp.concatenate([r - C @ z, z])


@eqx.filter_jit
def _solve(
    r: Float[Array, " N"],
    C: Float[Array, "N N"],
    mask: Float[Array, " N"],
    t0: Float[Array, ""],
    t1: Float[Array, ""],
    y0: Float[Array, " twoN"],
    k: Int[Array, ""],
    log_target: Float[Array, ""],
) -> dfx.Solution:
    """`_field` from `y0` at `t0` towards `t1` (RODAS5P, `_RTOL`/`_ATOL`, the PID controller's RMS
    norm over the real modes, `mask`), every step saved with the dense output; stopped at the end of
    the step where `u_k` first crosses `log_target` upward when `k ≥ 0`, or after `_MAX_STEPS` steps
    (`throw=False`: the caller reads the result)."""
    w = jnp.concatenate([mask, mask])

    def norm(e):
        return jnp.sqrt(jnp.sum(w * e**2) / jnp.sum(w))

    def crossed(t, y, args, **kwargs):
        return jnp.where(k >= 0, y[jnp.maximum(k, 0)] - log_target, -1.0)

    return dfx.diffeqsolve(
        dfx.ODETerm(_field),
        Rodas5P(),
        t0,
        t1,
        None,
        y0,
        args=(r, C),
        saveat=dfx.SaveAt(t0=True, steps=True, dense=True),
        stepsize_controller=dfx.PIDController(rtol=_RTOL, atol=_ATOL, norm=norm),
        event=dfx.Event(crossed, direction=True),
        max_steps=_MAX_STEPS,
        throw=False,
    )


@eqx.filter_jit
def _evaluate(sol: dfx.Solution, t: Float[Array, ""]) -> Float[Array, " twoN"]:
    """The dense output of a `_solve` at `t`."""
    return sol.evaluate(t)


@eqx.filter_jit
def _bisect(
    sol: dfx.Solution, i: Int[Array, ""], target: Float[Array, ""], a: Float[Array, ""], b: Float[Array, ""]
) -> Float[Array, ""]:
    """The time in `[a, b]` where `y_i` of the dense output crosses `target` upward (`y_i(a) < target
    ≤ y_i(b)`), by bisection to adjacent floats."""

    def gap(x, _):
        return sol.evaluate(x)[i] - target

    solver = optx.Bisection(rtol=0.0, atol=0.0, flip=False)
    opts = dict(lower=a, upper=b)
    return optx.root_find(gap, solver, b, options=opts, max_steps=160, throw=False).value


class Path(NamedTuple):
    """A solve of the restricted gLV in `(u, I)` on `n` modes, padded to `N` (`LogGLV`): `ts`, `ys`
    (`(2n, steps)`, unpadded) its steps, `sol` its dense output (padded: `u_i` is entry `i`, `I_i`
    entry `N + i`), `result` diffrax's."""

    ts: Float[np.ndarray, " steps"]
    ys: Float[np.ndarray, "twon steps"]
    sol: dfx.Solution
    result: dfx.RESULTS


class LogGLV(NamedTuple):
    """The restricted gLV (Eq. 32) of `n` modes for `_solve`, padded to a power of two `N ≥ 8`
    (one compilation per `N`; a step costs about the same below 8 modes): the padding modes have
    `r = 0`, `C = 0` and start at `u = −700`."""

    r: Float[Array, " N"]
    C: Float[Array, "N N"]
    mask: Float[Array, " N"]
    n: int

    @classmethod
    def build(cls, r: Float[np.ndarray, " n"], C: Float[np.ndarray, "n n"]) -> LogGLV:
        """The padded system of `r`, `C`."""
        n = r.shape[0]
        N = max(8, 1 << (n - 1).bit_length())
        rp, Cp, mask = np.zeros(N), np.zeros((N, N)), np.zeros(N)
        rp[:n], Cp[:n, :n], mask[:n] = r, C, 1.0
        return cls(jnp.asarray(rp), jnp.asarray(Cp), jnp.asarray(mask), n)

    def solve(self, t0: float, t1: float, y0: Float[np.ndarray, " twon"], k: int = -1, log_target: float = 0.0) -> Path:
        """From `y0 = (u, I)` (shape `(2n,)`) at `t0` towards `t1`; see `_solve`."""
        n, N = self.n, self.r.shape[0]
        yp = np.zeros(2 * N)
        yp[:N] = -700.0
        yp[:n], yp[N : N + n] = y0[:n], y0[n:]
        f = jnp.asarray
        sol = _solve(self.r, self.C, self.mask, f(float(t0)), f(float(t1)), f(yp), f(k), f(float(log_target)))
        ts, ys = np.asarray(sol.ts), np.asarray(sol.ys)
        keep = np.isfinite(ts)
        ys = ys[keep]
        return Path(ts[keep], np.concatenate([ys[:, :n], ys[:, N : N + n]], axis=1).T, sol, sol.result)

    def at(self, path: Path, t: float) -> Float[np.ndarray, " twon"]:
        """`y = (u, I)` (shape `(2n,)`) of `path`'s dense output at `t`."""
        n, N = self.n, self.r.shape[0]
        y = np.asarray(_evaluate(path.sol, jnp.asarray(float(t))))
        return np.concatenate([y[:n], y[N : N + n]])

    def crossing(self, path: Path, i: int, target: float, a: float, b: float) -> float:
        """The upward crossing of `u_i = target` in `[a, b]` on `path`'s dense output."""
        return float(
            _bisect(path.sol, jnp.asarray(i), jnp.asarray(float(target)), jnp.asarray(float(a)), jnp.asarray(float(b)))
        )


def transient(
    r: Float[np.ndarray, " M"],
    C: Float[np.ndarray, "M M"],
    z_old: Float[np.ndarray, " M"],
    z_new: Float[np.ndarray, " M"],
    k: int,
    *,
    rho: float = 0.5,
) -> Transient:
    """Mode `k`'s ignition from the plateau `z_old` to the plateau `z_new` of the gLV restricted to
    `M` (`r`, `C` restricted; `z_old,k = 0 < z_new,k`; every mode of `M` is in the support of
    `z_old` or `z_new`, or is `k`). See the module docstring."""
    n = r.shape[0]
    S, Sn = z_old > 0, z_new > 0
    sig_k = float(r[k] - C[k] @ z_old)
    sig_new = r - C @ z_new
    leaving = np.flatnonzero(S & ~Sn)
    target = rho * float(z_new[k])
    A = _AMPLITUDE * target

    v = np.zeros(n)
    v[k] = 1.0
    if S.any():
        D = z_old[S]
        v[S] = -np.linalg.solve(sig_k * np.eye(D.size) + D[:, None] * C[np.ix_(S, S)], D * C[S, k])
    z0 = z_old + A * v
    if np.any(z0[S | (np.arange(n) == k)] <= 0):
        raise SolverError(f"transients: the unstable direction of mode {k} leaves z ≥ 0 at amplitude {A:.3g}")

    # slowest decay after the transition: relaxation on the new support, or a leaving mode
    Dn = np.sqrt(z_new[Sn])
    rates = np.linalg.eigvalsh(Dn[:, None] * C[np.ix_(Sn, Sn)] * Dn[None, :])
    rate = min([sig_k, float(rates[0])] + [-float(sig_new[j]) for j in leaving])

    glv = LogGLV.build(r, C)
    y0 = np.concatenate([np.log(np.where(z0 > 0, z0, 1.0)), np.zeros(n)])
    t_max = 10 * (math.log(1 / _AMPLITUDE) + 10) / sig_k + _SETTLE / rate
    t, y = 0.0, y0
    while True:  # the rise, to the step where z_k reaches ρ z_new,k
        rise = glv.solve(t, t_max, y, k, math.log(target))
        if rise.result != dfx.RESULTS.max_steps_reached:
            break
        t, y = float(rise.ts[-1]), rise.ys[:, -1]
    if rise.result != dfx.RESULTS.event_occurred:
        raise SolverError(f"transients: mode {k} did not reach ρ z_new,k on its orbit ({dfx.RESULTS[rise.result]})")
    t_c = glv.crossing(rise, k, math.log(target), rise.ts[-2], rise.ts[-1])
    T = t_c + _SETTLE / rate
    t, y = t_c, glv.at(rise, t_c)
    while True:
        settle = glv.solve(t, T, y)
        t, y = float(settle.ts[-1]), settle.ys[:, -1]
        if settle.result != dfx.RESULTS.max_steps_reached:
            break
    if settle.result != dfx.RESULTS.successful:
        raise SolverError(f"transients: the orbit of mode {k} did not settle ({dfx.RESULTS[settle.result]})")
    y_T = y

    m = y_T[n:] - z_old * t_c - z_new * (T - t_c)
    u_off = np.full(n, np.nan)
    for j in leaving:
        x = np.zeros(n)
        x[j] = 1.0
        if Sn.any():
            x[Sn] -= np.linalg.solve(C[np.ix_(Sn, Sn)], C[Sn, j])
        z_j = math.exp(y_T[j])
        m += x * z_j / -sig_new[j]
        u_off[j] = y_T[j] - sig_new[j] * (T - t_c)
    return Transient(theta=math.log(A) + sig_k * t_c, m=m, u_off=u_off, rate=rate)
