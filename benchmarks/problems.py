"""The gLV problems every benchmark runs, built once and handed to lvflow and to the baselines.

Each `Problem` keeps the interaction matrix in its structured form, `C = Diag(d) + U Uᵀ`
(`U` may be empty), so that a baseline can exploit the same structure lvflow could; `C` dense
is there too for code that takes a plain `LotkaVolterra(r, C)`.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Problem:
    """A gLV `ż = z ⊙ (r − C z)` (Eq. 32) with `C = Diag(d) + U Uᵀ`, an initial state and a horizon.

    `rho` is the switch-on fraction: mode `k` switches on when `z_k` first reaches `ρ z_k(∞)`
    (Thm 8, Eq. 158).
    """

    name: str
    r: np.ndarray
    d: np.ndarray
    U: np.ndarray  # (K, R); R = 0 for a diagonal C
    z0: np.ndarray
    t1: float
    rho: float = 0.5

    @property
    def K(self) -> int:
        return self.r.shape[0]

    @property
    def diagonal(self) -> bool:
        return self.U.shape[1] == 0

    @property
    def C(self) -> np.ndarray:
        """Dense `C = Diag(d) + U Uᵀ`."""
        return np.diag(self.d) + self.U @ self.U.T

    def Cz(self, z: np.ndarray) -> np.ndarray:
        """`C z` in O(K R), for `z` of shape `(K,)` or `(K, n)`."""
        dz = self.d.reshape((-1,) + (1,) * (z.ndim - 1)) * z
        return dz if self.diagonal else dz + self.U @ (self.U.T @ z)

    @property
    def z_inf(self) -> np.ndarray:
        """The saturated equilibrium `z(∞)` (lvflow's, in `C`'s low-rank structure)."""
        import lvflow

        return np.asarray(lvflow.LowRankLotkaVolterra(self.r, self.d, self.U).equilibrium())

    def system(self, *, check: bool = False):
        """The `lvflow.LotkaVolterra(r, C)` of this problem (dense `C`; PSD by construction)."""
        import lvflow

        return lvflow.LotkaVolterra(self.r, self.C, check=check)

    def solver_system(self):
        """What `solve_lv` is given: `LowRankLotkaVolterra(r, d, U)` for a coupled problem (its
        products cost O(K R), as scipy's vector field here), the dense `LotkaVolterra` for a
        diagonal one (`solve_lv` detects a diagonal `C`). Returns `(system, kind)`."""
        import lvflow

        if self.diagonal:
            return self.system(), "diagonal"
        return lvflow.LowRankLotkaVolterra(self.r, self.d, self.U), "low-rank"


def fig3_right(K: int = 1000) -> Problem:
    """Fig 3 right (App. C): `r_k = k^{−0.8}`, `V_k = k^{−2}`, `C_kk = r_k²/(8V_k)`, diagonal,
    `z_k0 = 10⁻⁶ k^{−1.2}`. The horizon covers every switch-on with a margin of 2.5."""
    k = np.arange(1, K + 1, dtype=float)
    r = k**-0.8
    V = k**-2.0
    d = r**2 / (8 * V)
    z0 = 1e-6 * k**-1.2
    return Problem("fig3_right", r, d, np.zeros((K, 0)), z0, _horizon(r, r / d, z0))


def coupled(K: int = 1000, *, rank: int = 4, beta: float = 0.25, seed: int = 0) -> Problem:
    """The Fig 3-right rates and self-interactions with a dense PSD coupling added:
    `C = Diag(C_kk) + U Uᵀ`, `U = β · Diag(r) G / √R`, `G` standard normal `(K, R)`.

    The coupling changes each mode's net rate `(C z)_k` by a fraction ~β²·Σ_j r_j z_j ≈ 0.5 of
    `r_k`, of either sign (competition and mutualism), so switch-on times move far from the
    decoupled closed form while every mode still survives (checked by the caller via `z_inf`).
    """
    base = fig3_right(K)
    G = np.random.default_rng(seed).standard_normal((K, rank))
    U = beta * base.r[:, None] * G / np.sqrt(rank)
    p = Problem(f"coupled_r{rank}", base.r, base.d, U, base.z0, 0.0)
    return dataclasses.replace(p, t1=_horizon(p.r, p.z_inf, p.z0, margin=4.0))


def batch(n: int = 1024, K: int = 100, *, rank: int = 4, seed: int = 0) -> list[Problem]:
    """`n` coupled problems of `K` modes, one random coupling each, on a common horizon."""
    probs = [coupled(K, rank=rank, seed=seed + i) for i in range(n)]
    t1 = max(p.t1 for p in probs)
    return [dataclasses.replace(p, t1=t1) for p in probs]


def batch_diagonal(n: int = 1024, K: int = 100, *, seed: int = 0) -> list[Problem]:
    """`n` diagonal (Fig 3-type) problems of `K` modes, a sweep a researcher runs: rate exponent
    `r_k = k^{−a}`, `a ∈ [0.5, 1.2]`, and initial scale `z_k0 = ε k^{−1.2}`, `ε ∈ [10⁻⁸, 10⁻⁴]`
    (log-uniform), `V_k = k^{−2}`, `C_kk = r_k²/(8V_k)`; one common horizon."""
    rng = np.random.default_rng(seed)
    k = np.arange(1, K + 1, dtype=float)
    probs = []
    for a, log_eps in zip(rng.uniform(0.5, 1.2, n), rng.uniform(-8.0, -4.0, n)):
        r = k**-a
        d = r**2 / (8 * k**-2.0)
        z0 = 10.0**log_eps * k**-1.2
        probs.append(Problem("sweep", r, d, np.zeros((K, 0)), z0, _horizon(r, r / d, z0)))
    t1 = max(p.t1 for p in probs)
    return [dataclasses.replace(p, t1=t1) for p in probs]


def row_problems(smoke: bool) -> list[Problem]:
    """The problems of rows 1, 2 and 6: Fig 3 right and the coupled family at K = 1000; for a
    smoke run only a 30-mode coupled one (one compilation instead of two; the diagonal paths of
    the baselines are covered by the tests)."""
    return [coupled(30)] if smoke else [fig3_right(1000), coupled(1000)]


def switch_on_closed_form(p: Problem) -> np.ndarray:
    """Exact switch-on times of a diagonal gLV (Thm 6 solved for `z_k = ρ z_k(∞)`, Eq. 158 with
    `a = 1`): `t*_k = (1/r_k) ln[(r_k − C_kk z_k0)/(C_kk z_k0) · ρ/(1−ρ)]`."""
    if not p.diagonal:
        raise ValueError(f"problem {p.name}: closed-form switch-on times need a diagonal C")
    c0 = p.d * p.z0
    return np.log((p.r - c0) / c0 * p.rho / (1 - p.rho)) / p.r


def _horizon(r, z_inf, z0, *, margin: float = 2.5) -> float:
    """`margin ×` the slowest decoupled escape time `ln(z_inf/z0)/r`, rounded up to 2 digits."""
    live = z_inf > 0
    t = margin * float(np.max(np.log(z_inf[live] / z0[live]) / r[live]))
    e = 10 ** np.floor(np.log10(t) - 1)
    return float(np.ceil(t / e) * e)
