"""`DecoupledModes`: `K` independent logistic modes (Thm 6), each its own rate, drop and start."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._core.errors import LvflowError
from .._core.validate import to_jax
from .base import AbstractCurveModel

#: `ℓ = r t* = ln(z(∞)/z(0) − 1) > ln 9`: every mode starts below a tenth of its plateau, the
#: small initialisation the theory assumes. Without it a mode could start half-way at `t = 0`
#: and imitate a slow linear decline, which a logistic mode of Thm 6 never does.
MIN_LAG = math.log(9.0)


class DecoupledModes(AbstractCurveModel):
    """`K` decoupled modes (orthogonal features, Thm 6) and an offset:

    `L(t) = L_∞ + Σ_k V_k (1 − z_k(t)/z_k(∞))²` (Eq. 163),  `z_k(t)/z_k(∞) = σ(r_k (t − t*_k))`,

    the logistic solution of `ż_k = z_k (r_k − C_kk z_k)`, written from its half-way time
    `t*_k = ℓ_k / r_k`, `ℓ_k = ln(z_k(∞)/z_k(0) − 1)` (Eq. 158 with `ρ = ½`, exact for Thm 6).
    In the paper's units `z_k(∞) = r_k/C_kk = 8 V_k/r_k` (`V_k = r_k²/(8 C_kk)`), so each mode's
    start is `z_k(0) = 8 V_k / (r_k (1 + e^{ℓ_k})) = c_k ε`: the mode's `(r_k, V_k, c_k)`.

    The modes of one network start from one initial scale `ε`; `c_k` says how far each mode's
    start departs from it. The fit puts a Gaussian prior `ln c_k ~ N(0, prior_width²)` on them
    (`penalty`, with `ε` a free parameter): a mode the log has seen fixes its own start, and one
    that has barely begun to rise (the next drop) borrows the scale of the others, which is what
    makes its time predictable. `ℓ_k > ln 9` (`MIN_LAG`): every mode starts below a tenth of its
    plateau (small initialisation).

    **Fields:** `log_rate` (`ln r_k`), `log_drop` (`ln V_k`), `log_tstar` (`ln t*_k`), shape
    `(K,)`; `log_eps` (`ln ε`); `active` `(K,)` (masked modes do not contribute: the fit keeps
    one array size for every `K`); `log_offset` (`ln L_∞`, `−inf` for `L_∞ = 0`);
    `prior_width`; static `fit_offset` (whether `L_∞` is free); `offset_prior`: `(mean, width)`
    of a Gaussian prior on a free `ln L_∞` (width `inf`: none; `fit`'s drop scenario puts the
    next plateau there, `_next_plateau`).

    **Parameters** (`to_vector`): `ln r_k`, `ln V_k`, `ln(r_k t*_k − ln 9)` for every slot,
    `ln ε`, then `ln L_∞` if `fit_offset`. Masked slots keep their entries (zero derivative).
    """

    log_rate: Float[Array, " K"]
    log_drop: Float[Array, " K"]
    log_tstar: Float[Array, " K"]
    log_eps: Float[Array, ""]
    active: Bool[Array, " K"]
    log_offset: Float[Array, ""]
    prior_width: Float[Array, ""]
    fit_offset: bool = eqx.field(static=True)
    offset_prior: Float[Array, " 2"] = eqx.field(default_factory=lambda: np.array([0.0, np.inf]), converter=to_jax)

    def __check_init__(self):
        shapes = {np.shape(self.log_rate), np.shape(self.log_drop), np.shape(self.log_tstar), np.shape(self.active)}
        if len(shapes) != 1 or len(next(iter(shapes))) != 1:
            raise LvflowError(
                f"DecoupledModes: log_rate, log_drop, log_tstar, active need one shape (K,), got {shapes}"
            )
        if np.ndim(self.prior_width) != 0:
            raise LvflowError(f"prior_width: must be a scalar, got shape {np.shape(self.prior_width)}")

    @classmethod
    def from_physical(
        cls,
        rate: ArrayLike,
        drop: ArrayLike,
        tstar: ArrayLike,
        offset: float = 0.0,
        *,
        fit_offset: bool = True,
        prior_width: float = 1.0,
    ) -> DecoupledModes:
        """The model with rates `r_k > 0`, drops `V_k > 0`, half-way times `t*_k` (with
        `r_k t*_k > ln 9`) and offset `L_∞ ≥ 0`; `ε` is the geometric mean of the starts
        `z_k(0)` (so that `Π c_k = 1`)."""
        arrs = []
        for name, v in (("rate", rate), ("drop", drop), ("tstar", tstar)):
            a = np.atleast_1d(np.asarray(v, dtype=float))
            if a.ndim != 1 or not np.all(np.isfinite(a)) or np.any(a <= 0):
                raise LvflowError(f"{name}: must be a finite positive vector, got {v!r}")
            arrs.append(a)
        r, V, ts = np.broadcast_arrays(*arrs)
        if np.any(r * ts <= MIN_LAG):
            raise LvflowError("tstar: every mode needs r_k t*_k > ln 9 (it starts below a tenth of its plateau)")
        if offset < 0 or not math.isfinite(offset):
            raise LvflowError(f"offset: must be finite and >= 0, got {offset!r}")
        if fit_offset and offset == 0:
            raise LvflowError("offset: a fitted offset needs a positive starting value")
        log_z0 = np.log(8 * V / r) - np.logaddexp(0.0, r * ts)
        return cls(
            log_rate=to_jax(np.log(r)),
            log_drop=to_jax(np.log(V)),
            log_tstar=to_jax(np.log(ts)),
            log_eps=to_jax(np.mean(log_z0)),
            active=to_jax(np.ones(r.shape, bool)),
            log_offset=to_jax(np.float64(-np.inf if offset == 0 else math.log(offset))),
            prior_width=to_jax(np.float64(prior_width)),
            fit_offset=fit_offset,
        )

    @property
    def K(self) -> int:
        """The number of mode slots (active or not)."""
        return int(np.shape(self.log_rate)[0])

    def log_z0(self) -> Float[Array, " K"]:
        """`ln z_k(0) = ln(8 V_k / r_k) − ln(1 + e^{r_k t*_k})` in the paper's units."""
        ell = jnp.exp(self.log_rate + self.log_tstar)
        return math.log(8.0) + self.log_drop - self.log_rate - jnp.logaddexp(0.0, ell)

    def log_excess(self, t):
        return _log_excess(self.log_rate, self.log_drop, self.log_tstar, self.active, jnp.asarray(t, dtype=float))

    def penalty(self):
        starts = jnp.where(self.active, (self.log_z0() - self.log_eps) / self.prior_width, 0.0)
        mean, width = self.offset_prior[0], self.offset_prior[1]
        use = self.fit_offset & jnp.isfinite(width)
        off = jnp.where(use, (self.log_offset - mean) / jnp.where(use, width, 1.0), 0.0)
        return jnp.concatenate([starts, off[None]])

    def to_vector(self):
        u = jnp.log(jnp.maximum(jnp.exp(self.log_rate + self.log_tstar) - MIN_LAG, 1e-300))
        parts = [self.log_rate, self.log_drop, u, self.log_eps[None]]
        if self.fit_offset:
            parts.append(self.log_offset[None])
        return jnp.concatenate(parts)

    def from_vector(self, theta):
        K = self.K
        log_rate = theta[:K]
        log_tstar = jnp.log(MIN_LAG + jnp.exp(theta[2 * K : 3 * K])) - log_rate
        return eqx.tree_at(
            lambda m: (m.log_rate, m.log_drop, m.log_tstar, m.log_eps, m.log_offset),
            self,
            (
                log_rate,
                theta[K : 2 * K],
                log_tstar,
                theta[3 * K],
                theta[3 * K + 1] if self.fit_offset else self.log_offset,
            ),
        )

    @property
    def parameter_names(self):
        K = self.K
        names = [f"ln r_{k}" for k in range(1, K + 1)] + [f"ln V_{k}" for k in range(1, K + 1)]
        names += [f"ln(r t* - ln 9)_{k}" for k in range(1, K + 1)]
        return tuple(names + ["ln eps"] + (["ln L_inf"] if self.fit_offset else []))

    @property
    def num_parameters(self) -> int:
        # ε is pinned by the prior on the c_k: 3 per mode.
        return 3 * int(np.sum(np.asarray(self.active))) + int(self.fit_offset)

    def reported(self):
        return {
            "r": jnp.exp(self.log_rate),
            "V": jnp.exp(self.log_drop),
            "t_star": jnp.exp(self.log_tstar),
            "c": jnp.exp(self.log_z0() - self.log_eps),
            "eps": jnp.exp(self.log_eps),
            "offset": self.offset,
        }

    def drops(self):
        V = jnp.where(self.active, jnp.exp(self.log_drop), 0.0)
        return jnp.exp(self.log_tstar), V, jnp.exp(self.log_rate)

    def live(self) -> np.ndarray:
        """Indices into `to_vector()` of the active modes' entries, in the order of `compact()`'s
        vector (so that `compact().to_vector() == to_vector()[live()]`)."""
        S = self.K
        idx = self._order()
        return np.concatenate([idx, S + idx, 2 * S + idx, [3 * S], [3 * S + 1] if self.fit_offset else []]).astype(int)

    def _order(self) -> np.ndarray:
        idx = np.flatnonzero(np.asarray(self.active))
        return idx[np.argsort(np.asarray(self.log_tstar)[idx], kind="stable")]

    def compact(self) -> DecoupledModes:
        """The active modes only, in the order of `t*` (concrete values)."""
        idx = self._order()
        pick = lambda a: to_jax(np.asarray(a)[idx])
        return eqx.tree_at(
            lambda m: (m.log_rate, m.log_drop, m.log_tstar, m.active),
            self,
            (pick(self.log_rate), pick(self.log_drop), pick(self.log_tstar), pick(self.active)),
        )


def _excess_terms(log_rate, log_drop, log_tstar, active, t):
    """The pieces of `ln E(t) = ln Σ_k V_k σ(−x_k)²`, `x_k = r_k (t − t*_k)` (Eq. 163, Thm 6), with
    two exponentials per bin and mode and no logarithm: `σ(−x)² = e^{−2 max(x, 0)}/(1 + e^{−|x|})²`,
    the largest `ln V_k − 2 max(x_k, 0)` of each bin factored out (the sum is then at least ¼, so
    no drop of any depth underflows). Returns `x`, `e^{−|x|}`, each term divided by `e^{top}`
    (`top` the bin's largest `ln V_k − 2 max(x_k, 0)`), their sum and `ln E`."""
    r, tstar = jnp.exp(log_rate), jnp.exp(log_tstar)
    x = r[None, :] * (t[:, None] - tstar[None, :])
    pos = x >= 0
    e = jnp.exp(jnp.where(pos, -x, x))
    a = jnp.where(active[None, :], log_drop[None, :] - 2.0 * jnp.where(pos, x, 0.0), -jnp.inf)
    top = jnp.max(a, axis=-1, initial=-jnp.inf)
    top = jnp.where(jnp.isfinite(top), top, 0.0)  # no active mode: ln E = −inf below
    share = jnp.exp(a - top[:, None]) / (1.0 + e) ** 2
    total = jnp.sum(share, axis=-1)
    return x, e, share, total, top + jnp.log(total)


@jax.custom_jvp
def _log_excess(
    log_rate: Float[Array, " K"],
    log_drop: Float[Array, " K"],
    log_tstar: Float[Array, " K"],
    active: Bool[Array, " K"],
    t: Float[Array, " n"],
) -> Float[Array, " n"]:
    """`ln E(t) = ln Σ_k V_k σ(−r_k (t − t*_k))²` over the active modes (Eq. 163 with Thm 6's
    logistic `z_k`). Its derivative (`_log_excess_jvp`) is a product of `(n, K)` matrices, computed
    with the curve, with the tangents: the fit's Jacobian, every start's at every step, costs a
    few evaluations of the curve, not one per parameter."""
    return _excess_terms(log_rate, log_drop, log_tstar, active, t)[-1]


@_log_excess.defjvp
def _log_excess_jvp(primals, tangents):
    """`d ln E = Σ_k w_k (d ln V_k − 2 σ(x_k) dx_k)`, `dx_k = x_k d ln r_k − r_k t*_k d ln t*_k + r_k dt`,
    `w_k` the mode's share of `E` at `t`."""
    log_rate, _, log_tstar, _, _ = primals
    d_rate, d_drop, d_tstar, _, d_t = tangents
    x, e, share, total, out = _excess_terms(*primals)
    w = share / jnp.where(total > 0, total, 1.0)[:, None]  # (no active mode: w = 0)
    g = -2.0 * w * jnp.where(x >= 0, 1.0, e) / (1.0 + e)  # ∂ ln E/∂x_k = −2 w_k σ(x_k)
    r = jnp.exp(log_rate)
    d_out = w @ d_drop + (g * x) @ d_rate - (g * (r * jnp.exp(log_tstar))[None, :]) @ d_tstar + (g @ r) * d_t
    return out, d_out
