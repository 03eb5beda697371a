"""The common base of the ε → 0 plateau schedules (§4, "Beyond the paper"): `plateau_schedule`
returns a `PlateauSchedule` for a gLV and an `NQFPlateauSchedule` for an `NQF`, both subclasses of
`AbstractPlateauSchedule`."""

from __future__ import annotations

import abc
import math

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._core.errors import LvflowError
from .._core.validate import check_in_open_interval


class AbstractPlateauSchedule(eqx.Module):
    """An ε → 0 saddle-to-saddle schedule: events sorted in time (several may share one), and
    between events a plateau of the loss.

    **Fields** (every subclass has them):

    - `tau`: event times in `τ = t / ln(1/ε)`, shape `(n,)`.
    - `ignites`: `True` for an ignition, `False` for a switch-off, shape `(n,)`.
    - `loss`: plateau losses, shape `(n + 1,)`: `loss[0]` before the first event, `loss[i+1]`
      after event `i` (events at one time share the loss after all of them).
    - `eps`: the initial scale ε the schedule was built for.
    """

    tau: eqx.AbstractVar[Float[Array, " n"]]
    ignites: eqx.AbstractVar[Bool[Array, " n"]]
    loss: eqx.AbstractVar[Float[Array, " n+1"]]
    eps: eqx.AbstractVar[float]

    @property
    @abc.abstractmethod
    def eps_fixed(self) -> bool:
        """Whether the event times hold only at the schedule's own `eps` (else at any ε)."""

    @property
    def n_events(self) -> int:
        """The number of events, `n`."""
        return self.tau.shape[0]

    def times(self, eps=None) -> Float[Array, " n"]:
        """Event times in real time, `t = τ ln(1/ε)`.

        **Arguments:** `eps`: the ε to convert at (default the schedule's own); a limit schedule
        holds at any ε, one with `eps_fixed` only at its own.

        **Raises:** `LvflowError` for `eps ∉ (0, 1)`, or another ε than the schedule's own where
        `eps_fixed`.
        """
        if eps is None:
            eps = self.eps
        eps = check_in_open_interval("eps", eps, 0.0, 1.0)
        if self.eps_fixed and not math.isclose(eps, self.eps, rel_tol=1e-12):
            raise LvflowError(
                f"eps: this schedule was built for eps = {self.eps:g} (corrected or explicit z0), got {eps:g}"
            )
        return self.tau * -math.log(eps)

    def loss_at(self, tau: Float[ArrayLike, "*b"]) -> Float[Array, "*b"]:
        """The limiting step-function loss `L(τ)` (right-continuous: at an event time, the value
        after it).

        **Arguments:** `tau`: times in `τ`, any shape.

        **Returns:** `L(τ)`, the shape of `tau`; NaN where `tau` is NaN in a JAX array (under `jit`).

        **Raises:** `LvflowError` for a NaN in a Python or numpy `tau`.
        """
        if not isinstance(tau, jnp.ndarray) and np.any(np.isnan(np.asarray(tau, dtype=float))):
            raise LvflowError("tau: contains NaN")
        tau = jnp.asarray(tau, dtype=float)
        value = self.loss[jnp.searchsorted(self.tau, tau, side="right")]
        return jnp.where(jnp.isnan(tau), jnp.nan, value)
