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
ignition, `O(|M|³)` per step (scipy LSODA with its analytic Jacobian; Radau gives the same
thresholds to 1e-9 and is 20× slower).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from jaxtyping import Float

from .._core.errors import SolverError

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


def log_glv(r: Float[np.ndarray, " M"], C: Float[np.ndarray, "M M"]):
    """The restricted gLV (Eq. 32) in `y = (u, I)`, `u = ln z`, `I = ∫ z dt`: `u̇ = r − C e^u`,
    `İ = e^u`, as scipy's `solve_ivp` takes it. Returns `(f, jac)`, the field and its Jacobian."""
    n = r.shape[0]

    def f(t, y):
        z = np.exp(y[:n])
        return np.concatenate([r - C @ z, z])

    def jac(t, y):
        z = np.exp(y[:n])
        J = np.zeros((2 * n, 2 * n))
        J[:n, :n] = -C * z[None, :]
        J[n:, :n] = np.diag(z)
        return J

    return f, jac


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

    f, jac = log_glv(r, C)

    def hit(t, y):
        return y[k] - math.log(target)

    hit.terminal, hit.direction = True, 1
    y0 = np.concatenate([np.log(np.where(z0 > 0, z0, 1.0)), np.zeros(n)])
    t_max = 10 * (math.log(1 / _AMPLITUDE) + 10) / sig_k + _SETTLE / rate
    from scipy.integrate import solve_ivp  # here, not at import: only `transients=True` needs it

    opts = dict(method="LSODA", jac=jac, rtol=_RTOL, atol=_ATOL)
    with np.errstate(over="ignore"):  # rejected trial steps may overflow
        rise = solve_ivp(f, (0.0, t_max), y0, events=hit, **opts)
        if rise.status != 1:
            raise SolverError(f"transients: mode {k} did not reach ρ z_new,k on its orbit ({rise.message})")
        t_c = float(rise.t_events[0][0])
        T = t_c + _SETTLE / rate
        settle = solve_ivp(f, (t_c, T), rise.y_events[0][0], **opts)
    if not settle.success:
        raise SolverError(f"transients: the orbit of mode {k} did not settle ({settle.message})")
    y_T = settle.y[:, -1]

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
