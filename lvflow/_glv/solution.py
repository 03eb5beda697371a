"""The result of `solve_lv`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
from jaxtyping import Array, ArrayLike, Bool, Float, Int

if TYPE_CHECKING:
    import diffrax as dfx

#: the integer code of `diffrax.RESULTS.successful` (tests/test_solve.py checks it against diffrax)
SUCCESSFUL = 0


def result_code(result) -> Int[Array, "*batch"]:
    """The integer code behind a `diffrax.RESULTS` item (its one pytree leaf), or `result` itself
    when it is already a code."""
    (code,) = jtu.tree_leaves(result)
    return jnp.asarray(code, dtype=jnp.int32)


def result_item(code) -> dfx.RESULTS:
    """The `diffrax.RESULTS` item with integer code `code` (diffrax is imported here, on first use)."""
    import diffrax

    return jtu.tree_unflatten(jtu.tree_structure(diffrax.RESULTS.successful), [code])


class LVSolution(eqx.Module):
    """The solution of `ż_k = z_k (r_k − Σ_j C_kj z_j)` (Eq. 32) returned by `solve_lv`.

    **Fields:**

    - `ts`: save times, shape `(n,)`.
    - `zs`: mode strengths `z_k(t)` at `ts`, shape `(n, K)`.
    - `loss`: the loss `L(z) = zᵀCz/8 − rᵀz/4 + y2` (Eq. 26 in modes) at `ts`, shape `(n,)`.
    - `switch_on_times`: `t*_k`, the first `t ≥ 0` with `z_k(t) ≥ ρ z_k(∞)` (Thm 8, Eq. 158), shape
      `(K,)`: `0` for a mode that starts above its target, `inf` for one that never gets there
      (`z_k(∞) = 0`: `r_k ≤ 0`, or driven extinct by its competitors; or not reached by `t1`).
    - `z_inf`: the limit `z(∞)` the switch-on targets refer to, shape `(K,)`.
    - `rho`: the switch-on fraction `ρ`.
    - `num_steps`, `num_accepted_steps`, `num_rejected_steps`: solver statistics.
    - `result`: diffrax's `RESULTS` flag; `success` is `True` iff the solve succeeded and every
      saved value is finite.

    `result` is stored as its integer code and made a `diffrax.RESULTS` item when read, so that a
    closed-form solve (which cannot fail) does not import diffrax. `LVSolution(..., result=...)`
    takes either.
    """

    ts: Float[Array, " n"]
    zs: Float[Array, "n K"]
    loss: Float[Array, " n"]
    switch_on_times: Float[Array, " K"]
    z_inf: Float[Array, " K"]
    rho: Float[Array, ""]
    num_steps: Int[Array, ""]
    num_accepted_steps: Int[Array, ""]
    num_rejected_steps: Int[Array, ""]
    _result: Int[Array, ""]
    success: Bool[Array, ""]

    def __init__(
        self,
        ts,
        zs,
        loss,
        switch_on_times,
        z_inf,
        rho,
        num_steps,
        num_accepted_steps,
        num_rejected_steps,
        result: dfx.RESULTS | ArrayLike,
        success,
    ):
        self.ts = ts
        self.zs = zs
        self.loss = loss
        self.switch_on_times = switch_on_times
        self.z_inf = z_inf
        self.rho = rho
        self.num_steps = num_steps
        self.num_accepted_steps = num_accepted_steps
        self.num_rejected_steps = num_rejected_steps
        self._result = result_code(result)
        self.success = success

    @property
    def result(self) -> dfx.RESULTS:
        """diffrax's `RESULTS` flag of the solve (`diffrax.RESULTS.successful` for the closed form)."""
        return result_item(self._result)


def finish_solution(ts, zs, Czs, r, y2, switch_on_times, z_inf, rho, z_end, stats, result) -> LVSolution:
    """The `LVSolution` every solve path returns: the loss `zᵀCz/8 − rᵀz/4 + y2` (Eq. 26 in modes,
    `Czs = C z` at `ts`) and `success` = solver success with a finite trajectory and end state.
    `stats`: `(num_steps, num_accepted_steps, num_rejected_steps)`; `result`: a `diffrax.RESULTS`
    item or its integer code (`SUCCESSFUL` for the closed form)."""
    num_steps, num_accepted, num_rejected = stats
    loss = jnp.sum(zs * Czs, axis=-1) / 8 - zs @ r / 4 + y2
    code = result_code(result)
    success = (code == SUCCESSFUL) & jnp.all(jnp.isfinite(zs)) & jnp.all(jnp.isfinite(z_end))
    return LVSolution(
        ts=ts,
        zs=zs,
        loss=loss,
        switch_on_times=switch_on_times,
        z_inf=z_inf,
        rho=rho,
        num_steps=num_steps,
        num_accepted_steps=num_accepted,
        num_rejected_steps=num_rejected,
        result=code,
        success=success,
    )


def switch_on_target(z_inf: Float[Array, " K"], rho: Float[ArrayLike, ""]) -> Float[Array, " K"]:
    """Thm 8's threshold in `u = ln z`: `ln T_k = ln(ρ z_k(∞))` where `z_k(∞) > 0`. A mode with no
    positive limit never switches on; it gets the finite placeholder `ln ρ`, which every caller
    masks (finite, so that no NaN enters a `where`'s unused branch and its gradient)."""
    return jnp.log(rho) + jnp.log(jnp.where(z_inf > 0, z_inf, 1.0))
