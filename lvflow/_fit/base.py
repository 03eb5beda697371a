"""`AbstractCurveModel`: a family of loss curves `L(t) = L_∞ + E(t)` with a flat parameter vector.

The excess loss of independent modes is `E(t) = Σ_k V_k (1 − z_k(t)/z_k(∞))²` (Eq. 163); each
family below says how its `V_k` and `z_k(t)` depend on a few parameters. The fit works on the
logarithm of the loss, so the families return `ln E(t)`, evaluated in log space (no underflow for
drops of many decades).
"""

from __future__ import annotations

import abc
import enum
import math
from typing import Self

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float


class Family(str, enum.Enum):
    """`fit`'s `family` option: decoupled modes, a power-law spectrum, or whichever the criterion
    prefers. The public API takes the values as strings, converted once by `fit`."""

    AUTO = "auto"
    MODES = "modes"
    POWER_LAW = "power_law"


class Criterion(str, enum.Enum):
    """`fit`'s information criterion; `penalty` is its charge for `p` parameters over `n` bins."""

    AIC = "aic"
    BIC = "bic"

    def penalty(self, p: float, n: float) -> float:
        """`2p` (AIC) or `p ln n` (BIC)."""
        return 2 * p if self is Criterion.AIC else p * math.log(n)


class AbstractCurveModel(eqx.Module):
    """A family of loss curves `L(t) = L_∞ + E(t)` (`L_∞ ≥ 0` the offset, `E` the excess loss,
    Eq. 163), in gradient-flow time `t = η · step`.

    A concrete family stores its parameters as fields (in the units of `t` and of the loss) and
    says how to pack its free parameters into the unconstrained vector the least-squares fit
    works on (`to_vector`, `from_vector`; positive quantities as logarithms), which quantities to
    report (`reported`), and where its drops are (`drops`).
    """

    log_offset: eqx.AbstractVar[Float[Array, ""]]
    fit_offset: eqx.AbstractVar[bool]

    @property
    def offset(self) -> Float[Array, ""]:
        """`L_∞`, the loss the curve tends to (`0` when the offset is fixed at 0)."""
        return jnp.exp(self.log_offset)

    @abc.abstractmethod
    def log_excess(self, t: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
        """`ln E(t)` at times `t ≥ 0` (gradient-flow time, `η · step`)."""

    def log_loss(self, t: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
        """`ln L(t) = ln(L_∞ + E(t))`, by `logaddexp` (exact for `L_∞ = 0`: `log_offset = −inf`)."""
        return jnp.logaddexp(self.log_offset, self.log_excess(jnp.asarray(t, dtype=float)))

    def loss(self, t: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
        """`L(t) = L_∞ + E(t)`."""
        return jnp.exp(self.log_loss(t))

    @abc.abstractmethod
    def to_vector(self) -> Float[Array, " p"]:
        """The free parameters as one unconstrained vector (the fit's coordinates)."""

    @abc.abstractmethod
    def from_vector(self, theta: Float[Array, " p"]) -> Self:
        """This model with its free parameters replaced by `theta` (the inverse of `to_vector`)."""

    @property
    @abc.abstractmethod
    def parameter_names(self) -> tuple[str, ...]:
        """Names of the entries of `to_vector()`, in order."""

    @abc.abstractmethod
    def reported(self) -> dict[str, Float[Array, "..."]]:
        """The physical parameters reported with uncertainties (functions of `to_vector()`, so
        that their standard errors follow by the delta method)."""

    @abc.abstractmethod
    def drops(self) -> tuple[Float[Array, " K"], Float[Array, " K"], Float[Array, " K"]]:
        """`(t*_k, V_k, r_k)` of every mode: the time its drop is half-way (`z_k = z_k(∞)/2`,
        Eq. 158 with `ρ = ½`), the loss it removes and its rate (the drop's width is
        `ln 81 / r_k` from 10 % to 90 %), in the order of `t*`."""

    def penalty(self) -> Float[Array, " q"]:
        """Extra residuals appended to the data's: a Gaussian prior on some parameters, as
        `(θ − θ₀)/width` (default none)."""
        return jnp.zeros((0,))

    @property
    def num_parameters(self) -> int:
        """The number of free parameters (counted by the information criterion)."""
        return int(np.size(self.to_vector()))


def sigmoid_log_sq(x: Float[Array, "..."]) -> Float[Array, "..."]:
    """`ln σ(−x)² = −2 softplus(x)`: the log of a logistic mode's remaining share of its drop,
    `(1 − z/z∞)² = σ(−x)²` with `x = r (t − t*)` (Thm 6)."""
    return -2.0 * jnp.logaddexp(0.0, x)
