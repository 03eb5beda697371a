"""`PowerLawModel`: the feature-wise power-law spectrum of Thm 9, mode by mode at finite ε."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._core.errors import LvflowError
from .._core.validate import to_jax
from .base import AbstractCurveModel, sigmoid_log_sq

#: Modes `k ≤ EXACT` are summed one by one; above, modes are grouped into bins of `ln k` no wider
#: than `GROUP_RATIO`, and each group's sum `Σ_{k=a}^{b−1} f(k) ≈ ∫_{a−½}^{b−½} f` is evaluated by
#: two-point Gauss–Legendre (nodes at the middle `± (b − a)/(2√3)`, each standing for half the
#: group). Within a group `ζ_k` varies by ~`α₂ · 3 %`; the two-point rule follows the exact sum to
#: ~`10⁻⁵` where the midpoint rule was off by `0.5 %` (1000 modes of Fig 3 right at `t = t*_K`)
#: and by `8 %` deep in the tail (`t = 2.5 t*_K`).
EXACT = 32
GROUP_RATIO = 1.03
_GAUSS = 0.5 / math.sqrt(3.0)


def mode_nodes(max_modes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(k, first, count)`: the rank at which each node is evaluated, the first rank it stands
    for and how many ranks (1 for the exact modes; a group's two Gauss nodes stand for its
    lower and upper half)."""
    exact = np.arange(1, min(EXACT, max_modes) + 1, dtype=float)
    firsts, counts = [exact], [np.ones_like(exact)]
    reps = [exact]
    a = EXACT + 1
    while a <= max_modes:
        b = min(max(a + 1, int(math.floor(a * GROUP_RATIO)) + 1), max_modes + 1)  # ranks a … b−1
        n, mid = b - a, 0.5 * (a + b - 1)
        if n == 1:
            reps.append(np.array([mid]))
            firsts.append(np.array([a], float))
            counts.append(np.array([1.0]))
        else:
            reps.append(np.array([mid - _GAUSS * n, mid + _GAUSS * n]))
            firsts.append(np.array([a, a + 0.5 * n]))
            counts.append(np.array([0.5 * n, 0.5 * n]))
        a = b
    return np.concatenate(reps), np.concatenate(firsts), np.concatenate(counts)


class PowerLawModel(AbstractCurveModel):
    """A power-law spectrum of decoupled modes (Thm 9) and an offset,

    `ζ_k = ζ_1 k^{−α₂}`,  `V_k = V_1 k^{−α₁}`,  `z_k(0) = ε k^{−β}`,  `z_k(∞) = 8 V_k / ζ_k`
    (Thm 6, `V_k = ζ_k²/(8 C_kk)`),  `k = 1 … K`,

    whose loss is the sum of its logistic modes, `L(t) = L_∞ + Σ_k V_k σ(−ζ_k t + ℓ_k)²` with
    `ℓ_k = ζ_k t*_k = ln(z_k(∞)/z_k(0) − 1)` (Eq. 158 with `ρ = ½`, Eq. 163). Summed mode by mode,
    the curve carries the finite-ε drift of the exponent exactly: the `−(α₁ − α₂ − β) ln k` in
    `ℓ_k` is what Eq. 292 (`κ_eff(k, ε)`) and Eq. 295 (`κ_eff(t)`) expand, and as `ε → 0`
    the decay between the first drop and the cutoff tends to `t^{−(α₁−1)/α₂}` (Thm 9).

    The number of modes enters through a continuous cutoff `K` (mode `k` has weight
    `clip(K − k + 1, 0, 1)`, so the last mode fades in and `K` can be fitted), with
    `k ≤ max_modes` evaluated: the first `EXACT` one by one, the rest in narrow groups by
    two-point Gauss–Legendre (`mode_nodes`).

    **Fields:** `log_zeta1` (`ln ζ_1`, the first mode's rate), `log_V1` (`ln V_1`, the loss
    scale), `alpha1`, `alpha2`, `log_eps` (`ln ε`), `beta`, `log_modes` (`ln K`), `log_offset`
    (`ln L_∞`); static: `max_modes`, and which of `beta`, `K` and `L_∞` are fitted.

    **Parameters** (`to_vector`): `ln ζ_1, ln V_1, α₁, α₂, ln ε`, then `β`, `ln K`, `ln L_∞` when
    fitted.
    """

    log_zeta1: Float[Array, ""]
    log_V1: Float[Array, ""]
    alpha1: Float[Array, ""]
    alpha2: Float[Array, ""]
    log_eps: Float[Array, ""]
    beta: Float[Array, ""]
    log_modes: Float[Array, ""]
    log_offset: Float[Array, ""]
    max_modes: int = eqx.field(static=True)
    fit_beta: bool = eqx.field(static=True)
    fit_modes: bool = eqx.field(static=True)
    fit_offset: bool = eqx.field(static=True)

    def __check_init__(self):
        if not isinstance(self.max_modes, int) or self.max_modes < 2:
            raise LvflowError(f"max_modes: must be an integer >= 2, got {self.max_modes!r}")

    @classmethod
    def from_physical(
        cls,
        *,
        zeta1: float,
        V1: float,
        alpha1: float,
        alpha2: float,
        eps: float,
        beta: float = 0.0,
        modes: float,
        offset: float = 0.0,
        max_modes: int | None = None,
        fit_beta: bool = False,
        fit_modes: bool = True,
        fit_offset: bool = True,
    ) -> PowerLawModel:
        """The model from its physical parameters (`ζ_1, V_1, ε > 0`, `α₁ > 1`, `α₂ > 0`,
        `K ≥ 1` modes, `L_∞ ≥ 0`); `max_modes` slots (default `ceil(K)`)."""
        for name, v in (("zeta1", zeta1), ("V1", V1), ("eps", eps), ("modes", modes)):
            if not (math.isfinite(v) and v > 0):
                raise LvflowError(f"{name}: must be finite and positive, got {v!r}")
        if not alpha2 > 0:
            raise LvflowError(f"alpha2: must be positive, got {alpha2!r}")
        if offset < 0 or (fit_offset and offset == 0):
            raise LvflowError(f"offset: must be >= 0 (> 0 when fitted), got {offset!r}")
        max_modes = int(math.ceil(modes)) if max_modes is None else max_modes
        f = lambda v: to_jax(np.float64(v))
        return cls(
            log_zeta1=f(math.log(zeta1)),
            log_V1=f(math.log(V1)),
            alpha1=f(alpha1),
            alpha2=f(alpha2),
            log_eps=f(math.log(eps)),
            beta=f(beta),
            log_modes=f(math.log(modes)),
            log_offset=f(-math.inf if offset == 0 else math.log(offset)),
            max_modes=max_modes,
            fit_beta=fit_beta,
            fit_modes=fit_modes,
            fit_offset=fit_offset,
        )

    def _spectrum(self):
        k, first, count = mode_nodes(self.max_modes)
        lk = jnp.log(jnp.asarray(k))
        log_zeta = self.log_zeta1 - self.alpha2 * lk
        log_V = self.log_V1 - self.alpha1 * lk
        # ln q_k = ln(z_k0/z_k∞) = ln(ε k^{−β} ζ_k / (8 V_k))
        log_q = self.log_eps - self.beta * lk + log_zeta - log_V - math.log(8.0)
        log_q = jnp.minimum(log_q, -1e-12)  # a mode that starts at its plateau has ℓ = −inf
        ell = -log_q + jnp.log(-jnp.expm1(log_q))  # ln(1/q − 1)
        weight = jnp.clip(jnp.exp(self.log_modes) - jnp.asarray(first) + 1.0, 0.0, jnp.asarray(count))
        return log_zeta, log_V, ell, weight

    def log_excess(self, t):
        t = jnp.asarray(t, dtype=float)
        log_zeta, log_V, ell, weight = self._spectrum()
        x = jnp.exp(log_zeta)[None, :] * t[:, None] - ell[None, :]
        terms = log_V[None, :] + sigmoid_log_sq(x)
        return jax.nn.logsumexp(terms, axis=-1, b=jnp.broadcast_to(weight, terms.shape))

    def _free(self):
        names = ["ln zeta_1", "ln V_1", "alpha1", "alpha2", "ln eps"]
        if self.fit_beta:
            names.append("beta")
        if self.fit_modes:
            names.append("ln K")
        if self.fit_offset:
            names.append("ln L_inf")
        return names

    def to_vector(self):
        vals = {
            "ln zeta_1": self.log_zeta1,
            "ln V_1": self.log_V1,
            "alpha1": self.alpha1,
            "alpha2": self.alpha2,
            "ln eps": self.log_eps,
            "beta": self.beta,
            "ln K": self.log_modes,
            "ln L_inf": self.log_offset,
        }
        return jnp.stack([vals[n] for n in self._free()])

    def from_vector(self, theta):
        names = self._free()
        get = lambda n, old: theta[names.index(n)] if n in names else old
        return PowerLawModel(
            log_zeta1=get("ln zeta_1", self.log_zeta1),
            log_V1=get("ln V_1", self.log_V1),
            alpha1=get("alpha1", self.alpha1),
            alpha2=get("alpha2", self.alpha2),
            log_eps=get("ln eps", self.log_eps),
            beta=get("beta", self.beta),
            log_modes=get("ln K", self.log_modes),
            log_offset=get("ln L_inf", self.log_offset),
            max_modes=self.max_modes,
            fit_beta=self.fit_beta,
            fit_modes=self.fit_modes,
            fit_offset=self.fit_offset,
        )

    @property
    def parameter_names(self):
        return tuple(self._free())

    def reported(self):
        return {
            "alpha1": self.alpha1,
            "alpha2": self.alpha2,
            "kappa": (self.alpha1 - 1.0) / self.alpha2,
            "zeta1": jnp.exp(self.log_zeta1),
            "V1": jnp.exp(self.log_V1),
            "eps": jnp.exp(self.log_eps),
            "beta": self.beta,
            "modes": jnp.exp(self.log_modes),
            "offset": self.offset,
        }

    def drops(self):
        # the modes summed one by one (a group is no single drop)
        log_zeta, log_V, ell, weight = self._spectrum()
        n = min(EXACT, self.max_modes)
        zeta = jnp.exp(log_zeta[:n])
        return ell[:n] / zeta, jnp.exp(log_V[:n]) * weight[:n], zeta
