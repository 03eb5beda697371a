"""The scipy baseline: `solve_ivp`'s LSODA and Radau solvers on the gLV in log variables.

`u = ln z` obeys `u̇ = r − C e^u` (the flow lvflow integrates), with Jacobian `−C Diag(e^u)`,
given analytically: banded (diagonal) to LSODA and sparse to Radau when `C` is diagonal, dense
otherwise. The vector field uses `C = Diag(d) + U Uᵀ` in O(K R), the strongest baseline.

Switch-on times come from the solver's dense output, as `solve_ivp(events=...)` does it but
vectorised over modes: `solve_ivp` would call one Python event function per mode per step
(10⁶–10⁷ calls at K = 1000), which measures Python overhead, not scipy. We step the solver
class ourselves, test every mode's threshold `u_k ≥ ln(ρ z_k(∞))` after each step with one array
comparison, keep only the crossing modes' rows of that step's interpolant (a polynomial per
component), and root-find all of them at the end in one vectorised Illinois iteration.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import scipy.sparse
from scipy.integrate import LSODA, Radau

from .problems import Problem

METHODS = {"LSODA": LSODA, "Radau": Radau}


@dataclasses.dataclass
class ScipyResult:
    method: str
    switch_on_times: np.ndarray  # inf for modes that never switch on
    u1: np.ndarray  # ln z at t1
    seconds: float
    root_seconds: float  # of which spent locating switch-on times
    n_steps: int
    nfev: int
    njev: int
    nlu: int


def _fun_jac(p: Problem, method: str):
    r, d, U = p.r, p.d, p.U

    if p.diagonal:

        def fun(t, u):
            return r - d * np.exp(u)

        if method == "LSODA":  # banded storage with lband = uband = 0: one row, the diagonal

            def jac(t, u):
                return (-d * np.exp(u))[None, :]

            return fun, jac, {"lband": 0, "uband": 0}

        def jac(t, u):
            return scipy.sparse.diags(-d * np.exp(u), format="csc")

        return fun, jac, {}

    C = p.C

    def fun(t, u):
        z = np.exp(u)
        return r - d * z - U @ (U.T @ z)

    def jac(t, u):
        return -C * np.exp(u)[None, :]

    return fun, jac, {}


def _illinois(f, a, b, fa, fb, *, iters: int = 60, rtol: float = 1e-14):
    """Roots of `f` (vectorised) bracketed by `fa < 0 ≤ fb`, by the Illinois false-position method."""
    side = np.zeros_like(a)
    c = b.copy()
    for _ in range(iters):
        c = (a * fb - b * fa) / (fb - fa)
        fc = f(c)
        done = (np.abs(b - a) <= rtol * np.abs(c)) | (fc == 0)
        if np.all(done):
            break
        up = fc >= 0
        # replace the endpoint on fc's side; halve the stale one if it stayed twice (Illinois)
        b = np.where(up, c, b)
        fb = np.where(up, fc, fb)
        a = np.where(up, a, c)
        fa = np.where(up, fa, fc)
        fa = np.where(up & (side == 1), fa / 2, fa)
        fb = np.where(~up & (side == -1), fb / 2, fb)
        side = np.where(up, 1, -1)
    return c


_MAX_DEG = 13  # LSODA's Adams order ≤ 12; Radau's interpolant has degree 3


def _rows(dense, idx):
    """Mode rows of a step's interpolant as `(t_ref, h, coeffs)`: `u_k(t) = Σ_j c_kj x^j`, `x = (t − t_ref)/h`."""
    c = np.zeros((idx.size, _MAX_DEG + 1))
    if hasattr(dense, "yh"):  # LsodaDenseOutput: Nordsieck array about the step's end
        c[:, : dense.yh.shape[1]] = dense.yh[idx]
        return dense.t, dense.h, c
    c[:, 0] = dense.y_old[idx]  # RadauDenseOutput: y_old + Q [x, x², x³]
    c[:, 1 : dense.Q.shape[1] + 1] = dense.Q[idx]
    return dense.t_old, dense.h, c


def solve_scipy(p: Problem, *, method: str = "LSODA", rtol: float = 1e-8, atol: float = 1e-8) -> ScipyResult:
    """Integrate `u̇ = r − C e^u` from `ln z0` to `p.t1` and locate every switch-on time."""
    if method not in METHODS:
        raise ValueError(f"method: must be one of {sorted(METHODS)}, got {method!r}")
    fun, jac, extra = _fun_jac(p, method)
    z_inf = p.z_inf
    u0 = np.log(p.z0)
    thr = np.where(z_inf > 0, np.log(np.maximum(p.rho * z_inf, 1e-300)), np.inf)
    t_on = np.where(u0 >= thr, 0.0, np.inf)
    pending = np.isfinite(thr) & (u0 < thr)
    K = p.K
    lo, hi, t_ref, h = (np.zeros(K) for _ in range(4))
    coef = np.zeros((K, _MAX_DEG + 1))
    start = time.perf_counter()
    solver = METHODS[method](fun, 0.0, u0, p.t1, rtol=rtol, atol=atol, jac=jac, **extra)
    n_steps = 0
    while solver.status == "running":
        msg = solver.step()
        if solver.status == "failed":
            raise RuntimeError(f"scipy {method} failed at t = {solver.t:g}: {msg}")
        n_steps += 1
        hit = pending & (solver.y >= thr)
        if hit.any():
            idx = np.flatnonzero(hit)
            t_ref[idx], h[idx], coef[idx] = _rows(solver.dense_output(), idx)
            lo[idx], hi[idx] = solver.t_old, solver.t
            pending[idx] = False
    r0 = time.perf_counter()
    found = np.flatnonzero(np.isinf(t_on) & ~pending & np.isfinite(thr))
    if found.size:
        c, tr, hh, th = coef[found], t_ref[found], h[found], thr[found]

        def f(t):
            x = (t - tr) / hh
            acc = c[:, -1]
            for j in range(_MAX_DEG - 1, -1, -1):  # Horner
                acc = acc * x + c[:, j]
            return acc - th

        a, b = lo[found], hi[found]
        t_on[found] = _illinois(f, a, b, f(a), f(b))
    end = time.perf_counter()
    return ScipyResult(
        method,
        t_on,
        solver.y.copy(),
        end - start,
        end - r0,
        n_steps,
        int(solver.nfev),
        int(solver.njev),
        int(solver.nlu),
    )
