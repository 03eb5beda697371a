"""Incremental restricted equilibria: the linear algebra under `plateau_schedule`'s event loop.

On a support `S` (the active modes with `z* > 0`) the saturated equilibrium of the gLV
(Eq. 32) solves `C_SS z_S = r_S`, `z = 0` off `S`; the growth rates are `σ_k = r_k − (Cz*)_k`.
Each event moves one mode in or out of `S`, so the solution is kept up to date rather than
recomputed (Lawson–Hanson, warm-started):

- dense `C` (`LotkaVolterra`, `_DenseBackend`): the inverse of `C_SS` is kept as a `K × K`
  matrix, updated by one rank-one Schur-complement step per mode entering or leaving:
  `O(K²)` per update;
- `C = diag(d) + U Uᵀ` (`LowRankLotkaVolterra`, `U` of shape `(K, q)`, `_LowRankBackend`):
  only the `q × q` Woodbury core `G = U_Sᵀ D_S⁻¹ U_S`, its inverse `(I + G)⁻¹`
  (Sherman–Morrison) and `U_Sᵀ D_S⁻¹ r_S` are updated: `O(q²)` per update and `O(K q)` per
  solve.

A backend holds the support (`supp`) and the equilibrium on it. `add(k)` / `remove(k)` update
it by one mode (`add` returns `False` for a mode linearly dependent on `S`, which stays out);
`solve()` computes the trial equilibrium on the new support and returns the support modes with
`z ≤ 0`; `trial_z()` is that trial point and `commit()` accepts it. After a commit, `z_full()`
is `z*` (shape `(K,)`), `sigma()` the growth rates `σ` (valid off `S`), `rz()` is `rᵀz*`,
`schur()` every mode's Schur complement `γ_k = C_kk − C_kS C_SS⁻¹ C_Sk` (valid off `S`; dense
only with `corrected`), and `response(k)` is `C x` for `x = e_k − C_SS⁻¹ C_Sk` (valid off
`S ∪ {k}`). `_repair` drives a backend to the saturated equilibrium on an active set.

Everything is numpy: the event loop is sequential and data dependent, and its per-event work is
a handful of `O(K)` vector operations (`docs/devdocs/schedule.md`).
"""

from __future__ import annotations

import numpy as np

from .._core.errors import LvflowError, NotPSDError, SolverError
from .._glv.lv import LowRankLotkaVolterra

# Q's rank-one updates are kept as columns of X (Q = Q₀ + X Diag(α) Xᵀ) and folded into Q₀ by one
# matrix product every this many updates: BLAS-3 instead of one pass over Q per update.
_BATCH = 32

# A Schur complement below this fraction of C_kk means a linearly dependent mode.
_SCHUR_RTOL = 1e-10

# σ_k = r_k − (Cz*)_k counts as positive (negative) above (below) this fraction of the terms it is
# the difference of, `|r_k| + |(Cz*)_k|`: a mode's own scale, so a small r_k is not lost next to a
# large one (a relative threshold on max|r| dropped every mode below it).
_SIGMA_RTOL = 1e-10


_TINY = float(np.finfo(float).tiny)


def _mode_tol(r, sigma):
    """Per mode, the size below which `σ_k = r_k − (Cz*)_k` is rounding: `_SIGMA_RTOL (|r_k| + |(Cz*)_k|)`."""
    return _SIGMA_RTOL * (np.abs(r) + np.abs(r - sigma)) + _TINY


class _Backend:
    """What both backends share: `copy()`."""

    # never changed after construction: shared by copies
    _SHARED: frozenset = frozenset({"C", "d", "U", "r", "Us", "rs"})

    def copy(self):
        """An independent copy (arrays copied, the system's `C`, `d`, `U`, `r` shared): a trial
        update on it leaves `self` as it was."""
        new = object.__new__(type(self))
        new.__dict__.update(
            {
                k: v.copy() if isinstance(v, np.ndarray) and k not in self._SHARED else v
                for k, v in self.__dict__.items()
            }
        )
        return new


class _DenseBackend(_Backend):
    """`Q = (C_SS)⁻¹` embedded in `K × K` (zero off `S`), updated by rank-one Schur-complement
    steps, held as `Q₀ + X Diag(α) Xᵀ` with at most `_BATCH` pending columns in `X` (folded into
    `Q₀` by one matrix product when full); `z = Q r` and `φ = r − C z` follow each step in `O(K)`
    plus one product with `C` (`O(K²)` per step, refreshed from scratch every 64 steps against
    drift). With `corrected`, also every mode's Schur complement `γ_k = C_kk − C_kS Q C_Sk`."""

    def __init__(self, C, r, corrected):
        K = r.shape[0]
        self.C, self.r, self.corrected = C, r, corrected
        self.Q = np.zeros((K, K))
        self.X, self.alpha, self.pending = np.zeros((K, _BATCH)), np.zeros(_BATCH), 0
        self.gam = np.diagonal(C).copy()
        self.supp = np.zeros(K, bool)
        self.z, self.phi = np.zeros(K), r.copy()
        self._z, self._phi = self.z, self.phi
        self._updates = 0

    def diagonal(self):
        """`C_jj` for every mode."""
        return np.diagonal(self.C).copy()

    def _q(self, v):
        """`Q v`."""
        m = self.pending
        out = self.Q @ v
        if m:
            X = self.X[:, :m]
            out += X @ (self.alpha[:m] * (v @ X))
        return out

    def _q_column(self, k):
        """`Q[:, k]` (a new array)."""
        m = self.pending
        return self.Q[:, k] + self.X[:, :m] @ (self.alpha[:m] * self.X[k, :m])

    def _rank_one(self, x, alpha, Cx):
        """`Q += α x xᵀ` (pending in `X`), and the matching `z`, `φ`, `γ` updates (`Cx = C x`)."""
        if self.pending == _BATCH:
            X = self.X
            self.Q += (X * self.alpha) @ X.T
            self.pending = 0
        self.X[:, self.pending] = x
        self.alpha[self.pending] = alpha
        self.pending += 1
        xr = alpha * (x @ self.r)
        self._z = self._z + xr * x
        self._phi = self._phi - xr * Cx
        if self.corrected:
            self.gam = self.gam - alpha * Cx**2
        self._updates += 1
        if self._updates % 64 == 0:
            self._z = self._q(self.r)
            self._z[~self.supp] = 0.0
            self._phi = self.r - self.C @ self._z

    def add(self, k) -> bool:
        c = np.where(self.supp, self.C[:, k], 0.0)
        a = self._q(c)
        g = self.C[k, k] - c @ a
        ckk = abs(self.C[k, k])
        if g < -_SCHUR_RTOL * ckk - np.finfo(float).tiny:
            raise NotPSDError(f"C: not positive semi-definite (negative Schur complement {g:.3g} at mode {k})")
        if g <= _SCHUR_RTOL * ckk:
            return False
        a[k] -= 1.0
        self.supp[k] = True
        self._rank_one(a, 1.0 / g, self.C @ a)
        return True

    def remove(self, k) -> None:
        q = self._q_column(k)
        self.supp[k] = False
        self._rank_one(q, -1.0 / q[k], self.C @ q)
        self.Q[k, :] = 0.0
        self.Q[:, k] = 0.0
        self.X[k, :] = 0.0  # row and column k of X Diag(α) Xᵀ
        self._z[k] = 0.0

    def solve(self):
        return (self.supp & (self._z <= 0)).nonzero()[0]

    def trial_z(self):
        return self._z

    def commit(self):
        self.z, self.phi = self._z, self._phi

    def z_full(self):
        return self.z

    def sigma(self):
        return self.phi

    def rz(self) -> float:
        return float(self.r @ self.z)

    def response(self, k):
        """`C x` for `x = e_k − C_SS⁻¹ C_Sk` (mode `k` off `S` at unit level, `S` adiabatically
        re-equilibrated): the rate change every mode feels per unit of a lingering `z_k`."""
        x = -self._q(np.where(self.supp, self.C[:, k], 0.0))
        x[k] += 1.0
        return self.C @ x

    def schur(self):
        return self.gam

    def cz(self, x):
        """`C x`."""
        return self.C @ x

    def quad(self, x) -> float:
        """`xᵀ C x`."""
        return float(x @ (self.C @ x))

    def refine(self, full: bool = False) -> None:
        """One step of iterative refinement of `C_SS z_S = r_S` (the rank-one updates drift),
        `z_S += Q (r − C z)_S`, after a fresh solve of `C_SS` with `full`; clipped at 0 (a support
        mode at the boundary may round below it); `σ = r − C z` recomputed from the refined `z`."""
        S = self.supp
        if not S.any():
            return
        z = self.z
        if full:
            z = np.zeros_like(z)
            z[S] = np.linalg.solve(self.C[np.ix_(S, S)], self.r[S])
        z = z + self._q(np.where(S, self.r - self.C @ z, 0.0))  # Q vanishes off S
        z = np.maximum(z, 0.0)
        self.z, self._z = z, z.copy()
        self.phi = self.r - self.C @ z
        self._phi = self.phi.copy()


class _LowRankBackend(_Backend):
    """`C = diag(d) + UUᵀ`: only the Woodbury core `G = U_Sᵀ D_S⁻¹ U_S`, `b = U_Sᵀ D_S⁻¹ r_S`
    and `c = r_Sᵀ D_S⁻¹ r_S` are kept (`O(q²)` per update). On `S`, `z = D⁻¹ψ` with
    `ψ = r − U v`, `v = Uᵀz = (I + G)⁻¹ b`; off `S` the growth rate is `σ = ψ` (`O(K q)` per
    solve); `rᵀz = c − bᵀv`; a mode's Schur complement is `γ_k = d_k + u_kᵀ (I + G)⁻¹ u_k`."""

    def __init__(self, d, U, r, corrected):
        K, q = U.shape
        self.d, self.U, self.r = d, U, r
        self.Us = U / np.sqrt(d)[:, None]
        self.rs = r / np.sqrt(d)
        self.G = np.zeros((q, q))
        self.b = np.zeros(q)
        self.c = 0.0
        self.v = np.zeros(q)
        self.Ginv = np.eye(q)
        self._updates = 0
        self.supp = np.zeros(K, bool)
        self.psi = r.copy()

    def diagonal(self):
        """`C_jj = d_j + Σ_i U_ji²` for every mode."""
        return self.d + np.sum(self.U**2, axis=1)

    def add(self, k) -> bool:
        u = self.Us[k]
        self.G += np.outer(u, u)
        self.b += u * self.rs[k]
        self.c += self.rs[k] ** 2
        self.supp[k] = True
        self._rank_one(u, 1.0)
        return True

    def remove(self, k) -> None:
        u = self.Us[k]
        self.G -= np.outer(u, u)
        self.b -= u * self.rs[k]
        self.c -= self.rs[k] ** 2
        self.supp[k] = False
        self._rank_one(u, -1.0)

    def _rank_one(self, u, sign):
        """Sherman–Morrison on `(I + G)⁻¹`, refreshed from `G` every 64 updates against drift."""
        self._updates += 1
        if self._updates % 64 == 0:
            self.Ginv = np.linalg.inv(np.eye(self.G.shape[0]) + self.G)
            return
        a = self.Ginv @ u
        self.Ginv -= sign * np.outer(a, a) / (1.0 + sign * (u @ a))

    def solve(self):
        self._v = self.Ginv @ self.b
        self._psi = self.r - self.U @ self._v
        return (self.supp & (self._psi <= 0)).nonzero()[0]

    def trial_z(self):
        return np.where(self.supp, self._psi / self.d, 0.0)

    def commit(self):
        self.v, self.psi = self._v, self._psi

    def z_full(self):
        return np.where(self.supp, self.psi / self.d, 0.0)

    def sigma(self):
        return self.psi

    def rz(self) -> float:
        return float(self.c - self.b @ self.v)

    def response(self, k):
        """`C x` off `S ∪ {k}` for `x = e_k − C_SS⁻¹ C_Sk`: by Woodbury `Uᵀx = (I + G)⁻¹ u_k`."""
        return self.U @ (self.Ginv @ self.U[k])

    def schur(self):
        return self.d + np.einsum("kq,kq->k", self.U @ self.Ginv, self.U)

    def cz(self, x):
        """`C x = d x + U (Uᵀ x)`."""
        return self.d * x + self.U @ (self.U.T @ x)

    def quad(self, x) -> float:
        """`xᵀ C x = Σ d x² + |Uᵀ x|²`."""
        Ux = self.U.T @ x
        return float(self.d @ (x * x) + Ux @ Ux)

    def refine(self, full: bool = False) -> None:
        """Iterative refinement in `z` (the updated `G`, `b`, `(I + G)⁻¹` drift, and `z = (r − Uv)/d`
        cancels when `d ≪ |U|²`): `z_S += C_SS⁻¹ (r − C z)_S`, `C z = d z + U(Uᵀz)` formed directly and
        `C_SS⁻¹` applied by Woodbury; one step, or with `full` the core formed afresh on the support
        and three steps. (Without it the plateaus of an ill-conditioned `I + G`, `d ≪ |U|²`, drift to
        1e-9; a step costs four `O(K q)` products.) Then `v = Uᵀz`, `ψ = d z` on `S` and
        `σ = r − C z` off it; `z` clipped at 0 (a support mode at the boundary may round below it)."""
        S = self.supp
        if not S.any():
            return
        if full:
            Us, rs = self.Us[S], self.rs[S]
            self.G, self.b, self.c = Us.T @ Us, Us.T @ rs, float(rs @ rs)
            self.Ginv = np.linalg.inv(np.eye(self.G.shape[0]) + self.G)
        d, U = self.d, self.U
        z = self.z_full()
        Uz = U.T @ z
        for _ in range(3 if full else 1):
            w = np.where(S, (self.r - d * z - U @ Uz) / d, 0.0)
            Uw = U.T @ w
            a = self.Ginv @ Uw
            z = z + w - np.where(S, (U @ a) / d, 0.0)
            Uz = Uz + Uw - self.G @ a  # Uᵀ(D_S⁻¹ U_S a) = G a
        if np.any(z < 0):  # a support mode at the boundary rounded below 0
            z = np.maximum(z, 0.0)
            Uz = U.T @ z
        self.v = Uz
        self.psi = np.where(S, d * z, self.r - d * z - U @ Uz)
        self._v, self._psi = self.v, self.psi


def _backend(system, corrected):
    """The backend for `system`: Woodbury for a `LowRankLotkaVolterra`, dense inverse otherwise."""
    r = np.asarray(system.r, dtype=float)
    if isinstance(system, LowRankLotkaVolterra):
        return _LowRankBackend(np.asarray(system.d, dtype=float), np.asarray(system.U, dtype=float), r, corrected)
    return _DenseBackend(np.asarray(system.C, dtype=float), r, corrected)


def _repair(be, pend: set, tol, max_iter):
    """Lawson–Hanson on the active set, warm-started from the backend's support. `pend` holds
    the active modes off the support (after an ignition, normally just the new ones), so a step
    costs one solve. Afterwards the backend holds the saturated equilibrium of the gLV
    restricted to the active set, refined on its support (`refine`), and `pend` the active modes
    at `z* = 0`. `tol`: a growth rate at or below it is zero; `None` for each mode's own
    (`_mode_tol`)."""
    _lawson_hanson(be, pend, tol, max_iter)
    be.refine()


def _lawson_hanson(be, pend: set, tol, max_iter):
    for _ in range(max_iter):
        if not pend:
            return
        phi = be.sigma()
        k = max(pend, key=phi.__getitem__)  # `pend` is small: plain Python beats numpy here
        if not phi[k] > (_mode_tol(be.r[k], phi[k]) if tol is None else tol):
            return
        if not be.add(k):
            raise LvflowError(
                f"system: C is singular on the active modes and r is not in its range there (mode {k} "
                f"grows at rate {float(be.sigma()[k]):.3g} along a null direction of C): no saturated "
                "equilibrium is reachable (r ∈ range C holds for every NQF reduction)"
            )
        pend.discard(k)
        neg = be.solve()
        if neg.size:  # Lawson–Hanson inner loop: step back to feasibility, drop a mode, resolve
            z = be.z_full().copy()  # the last feasible point: the committed equilibrium, z_k = 0
            z[k] = 0.0
            for _ in range(max_iter):
                zn = be.trial_z()
                den = z[neg] - zn[neg]
                ratio = np.where(den > 0, z[neg] / np.where(den > 0, den, 1.0), 0.0)
                j = int(neg[np.argmin(ratio)])
                alpha = min(max(float(np.min(ratio)), 0.0), 1.0)
                z = np.where(be.supp, z + alpha * (zn - z), 0.0)
                z[j] = 0.0
                be.remove(j)
                pend.add(j)
                neg = be.solve()
                if neg.size == 0:
                    break
        be.commit()
    raise SolverError(f"restricted equilibrium: Lawson–Hanson did not converge in {max_iter} steps")
