"""`eps_merge`: the initial scale ε above which two consecutive drops of the loss merge into one
(from the switch-on times of Eq. 158)."""

from __future__ import annotations

import math

import numpy as np
from jaxtyping import Float

from .._glv.closed_forms import ignition_time


def eps_merge(zeta, *, C, c, rho: float = 0.5) -> Float[np.ndarray, " Km1"]:
    """For consecutive modes in ignition order (`ζ` decreasing), the initial scale `ε` at which
    their two drops merge: the gap between switch-on times (Eq. 158, `z_k0 = c_k ε`) equals the
    mean 10–90 % rise time `½(w_k + w_{k+1})`, `w_k = ln 81/ζ_k` — the criterion of
    `lvflow._schedule.scaling.resolved_steps`. For smaller ε the steps are resolved.

    To leading order `ln(1/ε_merge) = ln 9 · (1/ζ_k + 1/ζ_{k+1}) / (1/ζ_{k+1} − 1/ζ_k)`; the
    O(1) terms of Eq. 158 (`lvflow._glv.closed_forms.ignition_time`) are included by bisection in
    `ln(1/ε)`. `0` for a pair still merged at `ε = 1e-304` (float64's end); NaN for equal rates,
    a pair with `ζ ≤ 0`, or a pair resolved for every admissible ε.
    """
    zeta, C, c = (np.asarray(a, dtype=np.float64) for a in (zeta, C, c))
    za, zb, Ca, Cb, ca, cb = zeta[:-1], zeta[1:], C[:-1], C[1:], c[:-1], c[1:]
    ok = (zb > 0) & (za > zb * (1 + 1e-12)) & (Ca > 0) & (Cb > 0) & (ca > 0) & (cb > 0)
    # Pairs that cannot merge get harmless stand-ins, masked to NaN at the end.
    za, zb = np.where(ok, za, 2.0), np.where(ok, zb, 1.0)
    Ca, Cb, ca, cb = (np.where(ok, v, 1.0) for v in (Ca, Cb, ca, cb))
    width = 0.5 * math.log(81.0) * (1 / za + 1 / zb)

    def excess(L):  # gap − width at ε = e^{−L}; increasing in L when ζ_a > ζ_b
        e = np.exp(-L)
        t = lambda z, C, c: np.asarray(ignition_time(z, C, c, e, rho=rho))  # Eq. 158
        return t(zb, Cb, cb) - t(za, Ca, ca) - width

    # Admissible ε leave room below each plateau (ζ > C c ε): L = ln(1/ε) > L_min. The upper
    # end, L = 700 (ε ≈ 1e-304), is the smallest ε a float64 holds.
    L_max = 700.0
    L_min = np.maximum(np.log(np.maximum(Ca * ca / za, Cb * cb / zb)), 0.0) + 1e-9
    lo, hi = L_min.copy(), np.full(za.shape, L_max)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        up = excess(mid) < 0
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    L = 0.5 * (lo + hi)
    # 0: still merged at ε = 1e-304 (any representable ε). NaN: equal or non-positive rates,
    # or resolved for every admissible ε.
    em = np.where(L < L_max - 1e-6, np.exp(-L), 0.0)
    return np.where(ok & (excess(L_min) < 0), em, np.nan)
