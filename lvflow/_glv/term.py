"""The gLV (Eq. 32) in log variables as a diffrax term that keeps `C`'s structure."""

from __future__ import annotations

import diffrax as dfx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._core.errors import LvflowError
from .interaction import AbstractInteraction, exp_clipped
from .lv import AbstractLotkaVolterra


class LogLotkaVolterraTerm(dfx.AbstractTerm):
    """The gLV `ż_k = z_k (r_k − Σ_j C_kj z_j)` (Eq. 32) in `u = ln z`: `u̇ = r − C e^u`, an ODE
    term for `diffrax.diffeqsolve` (its control is `t1 − t0`, as `diffrax.ODETerm`'s).

    `C` is kept in its structure (`interaction`): a diagonal, a diagonal plus low rank, or a dense
    matrix. `lvflow.Rodas5P` uses it to solve with `α I − J`, `J = −C Diag(e^u)`, in `O(K)`,
    `O(K q²)` (Woodbury) or `O(K³)` (LU) per step; any other diffrax solver sees an ordinary ODE.
    `e^u` is evaluated with `u` clipped at 300, so that a trial stage of an overshooting step gives
    a large finite value (and a rejected step) instead of an overflow.

    Build it from a system with `LogLotkaVolterraTerm.from_system(system)`.

    **Fields:**

    - `r`: growth rates, shape `(K,)`.
    - `interaction`: `C` in its structure (built by `from_system`).
    """

    r: Float[Array, " K"]
    interaction: AbstractInteraction

    def __check_init__(self):
        if jnp.ndim(self.r) != 1:
            raise LvflowError(f"r: expected shape (K,), got {jnp.shape(self.r)}")
        if not isinstance(self.interaction, AbstractInteraction):
            raise LvflowError(
                f"interaction: expected C in its structure, got {type(self.interaction).__name__} "
                "(build the term with from_system)"
            )

    @classmethod
    def from_system(cls, system: AbstractLotkaVolterra) -> "LogLotkaVolterraTerm":
        """The term of `system`, with `C` in the structure `system.interaction()` gives: a
        `LowRankLotkaVolterra` keeps `Diag(d) + UUᵀ` (`Diag(d)` if `U` is empty or zero); a
        `LotkaVolterra` built from a concrete diagonal `C` gets `Diag(C_kk)`, any other is dense
        (the structure each system fixed when it was built, also when it is passed into `jit`).

        **Raises:** `LvflowError` if `system` is not an `AbstractLotkaVolterra`.
        """
        if not isinstance(system, AbstractLotkaVolterra):
            raise LvflowError(f"system: expected a LotkaVolterra or LowRankLotkaVolterra, got {type(system).__name__}")
        return cls(system.r, system.interaction())

    def vf(self, t, y: Float[ArrayLike, " K"], args) -> Float[Array, " K"]:
        """`u̇ = r − C e^u` (Eq. 32 divided by `z`)."""
        return self.r - self.interaction.Cz(exp_clipped(y))

    def contr(self, t0, t1, **kwargs):
        return t1 - t0

    def prod(self, vf, control):
        return vf * control

    def shifted_solver(self, alpha, y: Float[ArrayLike, " K"]):
        """`b ↦ (α I − J)⁻¹ b` with `J = −C Diag(e^y)` the Jacobian of `vf` at `y`."""
        return self.interaction.shifted_solver(alpha, exp_clipped(y))
