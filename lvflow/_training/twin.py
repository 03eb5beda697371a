"""The NQF twin of a network: the same neurons `W`, output `Tr[Wᵀ A(x) W]` (Thm 1, Eq. 2)."""

import enum
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._core.errors import LvflowError
from .._core.validate import as_array
from .._form.nqf import NQF
from .._form.structure import structure_matrix
from ..architectures import AbstractArchitecture, AbstractLearnedMap, AbstractSumForm
from ..architectures._base import AbstractTwin
from .data import gaussian_inputs
from .deep import AbstractDeepModel, DeepNQF


class _Method(str, enum.Enum):
    """How an `NQFModel` evaluates a neuron's `wᵀ A(x) w`: by differentiating the network's unit
    (`quadratic_part`) or by contracting its closed-form `structure(x)`. The public API takes the
    values as strings (`method="jvp"`), converted once by `_method`; a member equals its string."""

    JVP = "jvp"
    STRUCTURE = "structure"


def _method(method) -> _Method:
    """`method` (a string or a `_Method`) as a `_Method`. **Raises:** `LvflowError` naming it."""
    try:
        return _Method(method)
    except (ValueError, TypeError):
        raise LvflowError(f"method: expected 'jvp' or 'structure', got {method!r}") from None


def quadratic_part(unit, w: Float[ArrayLike, " p"], x) -> Float[Array, "*k"]:
    """`wᵀ A(x) w = ½ d²/ds² unit(s w, x)|_{s=0}` (Eq. 2), by forward-over-forward differentiation.

    Equal to `wᵀ A(x) w` with `A = ½ ∇²_w unit|_{w=0}`, without forming the `p × p` matrix.
    """
    w = jnp.asarray(w)
    f = lambda s: unit(s * w, x)
    df = lambda s: jax.jvp(f, (s,), (jnp.ones_like(s),))[1]
    zero = jnp.zeros((), dtype=w.dtype)
    return 0.5 * jax.jvp(df, (zero,), (jnp.ones_like(zero),))[1]


class NQFModel(AbstractTwin):
    """The NQF twin of a sum-form network: `f(x) = Σ_i w_iᵀ A(x) w_i = Tr[Wᵀ A(x) W]` (Thm 1, Eq. 2).

    It holds the network itself and trains the network's own neuron array (`model.W` is
    `model.network.W`), so `lvflow.train` treats a network and its twin alike and both record
    the same `M = W Wᵀ`. Only static configuration and fixed buffers of the network are used
    besides `W`.

    `method="jvp"` (default) evaluates each neuron's `wᵀ A(x) w` as `½ d²/ds² unit(s w, x)` at
    `s = 0` (`quadratic_part`): exact, and as cheap as a few forward passes even when `A(x)` is
    large (attention: `p` in the hundreds or thousands). `method="structure"` contracts the
    closed-form `network.structure(x)`.

    **Arguments:** `network`: an `lvflow.architectures.AbstractSumForm` (an
    `AbstractArchitecture` for `method="structure"`); `method`: `"jvp"` or `"structure"`.

    **Raises:** `LvflowError` for another `network` or `method`.
    """

    network: AbstractSumForm
    method: _Method = eqx.field(static=True)

    def __init__(self, network: AbstractSumForm, method: Literal["jvp", "structure"] | _Method):
        self.network = network
        self.method = _method(method)

    def __check_init__(self):
        if not isinstance(self.network, AbstractSumForm):
            raise LvflowError(
                f"network: expected a sum-form module (lvflow.architectures.AbstractSumForm), "
                f"got a {type(self.network).__name__}"
            )
        if self.method is _Method.STRUCTURE and not isinstance(self.network, AbstractArchitecture):
            raise LvflowError(
                f"method: a {type(self.network).__name__} has no closed-form structure(x); use method='jvp'"
            )

    def unit(self, w: Float[ArrayLike, " p"], x) -> Float[Array, "*k"]:
        """`wᵀ A(x) w`: the quadratic unit of the NQF."""
        if self.method is _Method.STRUCTURE:
            return jnp.einsum("...ij,i,j->...", self.structure(x), w, w)
        return quadratic_part(self.network.unit, w, x)

    def __call__(self, x) -> Float[Array, "*k"]:
        if self.method is _Method.STRUCTURE:
            return jnp.einsum("...ij,id,jd->...", self.structure(x), self.W, self.W)
        return jnp.sum(jax.vmap(lambda w: quadratic_part(self.network.unit, w, x))(self.W.T), axis=0)

    def nqf(self, X, y) -> NQF:
        """`lvflow.NQF` of the dataset — for `matrix_flow`, `matrix_drops`, `predict`,
        `gd_recursion`, `compress`. Factored (`A_c(x) = Σ_d Φ_d E_d`, Eq. 17, from
        `network.factors`) for a learned-map architecture; otherwise `A` stacked over samples,
        `(m, [k,] p, p)`, which forms `m·k·p²` numbers: small `p` only."""
        if isinstance(self.network, AbstractLearnedMap):
            features, basis = self.network.factors(X)
            return NQF(features=features, basis=basis, y=y)
        A = jax.vmap(self.structure)(jnp.asarray(X))
        return NQF(A, y)


def nqf_twin(network, *, x=None, method: Literal["jvp", "structure"] = "jvp", seq_len: int | None = None):
    """The NQF twin of `network`: the same `W`, output `Tr[Wᵀ A(x) W]` (Thm 1).

    **Arguments:**

    - `network`: a sum-form module (`lvflow.architectures.AbstractSumForm`: a neuron array `W`
      (p, d) and `unit(w, x)`; all of `lvflow.architectures`), whose twin is an `NQFModel`; or a
      deep model (`lvflow.AbstractDeepModel`: `DeepMLP`, `DeepAttention`, your own), whose twin
      is the composition of its blocks' twins (`DeepNQF`, App. B.4).
    - `x`: a sample input at which ZGZ is checked with `lvflow.structure_matrix` on the unit;
      default a Gaussian input of the right shape (`sample_shape`), which needs an
      `AbstractArchitecture`.
    - `method`: `"jvp"` or `"structure"` (see `NQFModel`).
    - `seq_len`: the number of tokens of the default sample input of an attention model (4).

    **Returns:** an `NQFModel`, or a `DeepNQF` for a deep model.

    **Raises:** `lvflow.ZGZError` when a unit has a nonzero gradient at `w = 0` (a bias, or
    `φ(0) ≠ 0`): the module is then not an NQF (Thm 12 adds `gᵀμ`); `LvflowError` for a
    `network` that is neither of the above, an unknown `method`, `method="structure"` without
    a closed form, or no `x` for a module whose input shape is unknown.
    """
    kind = _method(method)
    if isinstance(network, AbstractDeepModel):
        blocks = tuple(nqf_twin(b, x=None, method=method, seq_len=seq_len) for b in network.blocks)
        return DeepNQF(blocks=blocks, chain=network.chain, dphi0=network.link_slope)
    if not isinstance(network, AbstractSumForm):
        raise LvflowError(
            f"network: expected a sum-form module (lvflow.architectures.AbstractSumForm, with a neuron array W "
            f"and unit(w, x)) or a deep model (lvflow.AbstractDeepModel), got a {type(network).__name__}"
        )
    if kind is _Method.STRUCTURE and not isinstance(network, AbstractArchitecture):
        raise LvflowError(f"method: a {type(network).__name__} has no closed-form structure(x); use method='jvp'")
    if x is None:
        if not isinstance(network, AbstractArchitecture):
            raise LvflowError(f"x: pass a sample input to check ZGZ for a {type(network).__name__}")
        x = gaussian_inputs(network, 1, seed=12345, seq_len=seq_len or 4)[0]
    else:
        x = jnp.asarray(as_array("x", x))
    p = int(np.shape(network.W)[0])
    structure_matrix(network.unit, x, p)  # raises ZGZError
    return NQFModel(network=network, method=kind)
