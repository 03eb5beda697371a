"""The NQF twin of a network: the same neurons `W`, output `Tr[Wᵀ A(x) W]` (Thm 1, Eq. 2)."""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._errors import LvflowError
from .._form.nqf import NQF
from .._form.structure import structure_matrix
from .._validate import as_array


def quadratic_part(unit, w: Float[Array, " p"], x) -> Float[Array, "*k"]:
    """`wᵀ A(x) w = ½ d²/ds² unit(s w, x)|_{s=0}` (Eq. 2), by forward-over-forward differentiation.

    Equal to `wᵀ A(x) w` with `A = ½ ∇²_w unit|_{w=0}`, without forming the `p × p` matrix.
    """
    f = lambda s: unit(s * w, x)
    df = lambda s: jax.jvp(f, (s,), (jnp.ones_like(s),))[1]
    zero = jnp.zeros((), dtype=w.dtype)
    return 0.5 * jax.jvp(df, (zero,), (jnp.ones_like(zero),))[1]


class NQFModel(eqx.Module):
    """The NQF twin of a sum-form network: `f(x) = Σ_i w_iᵀ A(x) w_i = Tr[Wᵀ A(x) W]` (Thm 1, Eq. 2).

    It holds the network itself and trains the network's own neuron array (`model.W` is
    `model.network.W`), so `lvflow.train` treats a network and its twin alike and both record
    the same `M = W Wᵀ`. Only static configuration and fixed buffers of the network are used
    besides `W`.

    `method="jvp"` (default) evaluates each neuron's `wᵀ A(x) w` as `½ d²/ds² unit(s w, x)` at
    `s = 0` (`quadratic_part`): exact, and as cheap as a few forward passes even when `A(x)` is
    large (attention: `p` in the hundreds or thousands). `method="structure"` contracts the
    closed-form `network.structure(x)`.
    """

    network: eqx.Module
    method: str = eqx.field(static=True)

    @property
    def W(self) -> Float[Array, "p d"]:
        return self.network.W

    @property
    def p(self) -> int:
        return self.network.p

    @property
    def d(self) -> int:
        return self.network.d

    @property
    def out_size(self):
        return self.network.out_size

    def structure(self, x) -> Float[Array, "*k p p"]:
        """The network's structure matrix `A(x)`."""
        return self.network.structure(x)

    def unit(self, w: Float[Array, " p"], x) -> Float[Array, "*k"]:
        """`wᵀ A(x) w`: the quadratic unit of the NQF."""
        if self.method == "structure":
            return jnp.einsum("...ij,i,j->...", self.network.structure(x), w, w)
        return quadratic_part(self.network.unit, w, x)

    def __call__(self, x) -> Float[Array, "*k"]:
        if self.method == "structure":
            return jnp.einsum("...ij,id,jd->...", self.network.structure(x), self.W, self.W)
        return jnp.sum(jax.vmap(lambda w: quadratic_part(self.network.unit, w, x))(self.W.T), axis=0)

    def nqf(self, X, y) -> NQF:
        """`lvflow.NQF(A, y)` of the dataset, `A` stacked over samples `(m, [k,] p, p)` — for
        `gd_recursion`, `matrix_flow`, `compress`. Forms `m·k·p²` numbers: small `p` only."""
        A = jax.vmap(self.network.structure)(jnp.asarray(X))
        return NQF(A, y)


def nqf_twin(network, *, x=None, method: Literal["jvp", "structure"] = "jvp", seq_len: int | None = None):
    """The NQF twin of `network`: the same `W`, output `Tr[Wᵀ A(x) W]` (Thm 1).

    `network` is a sum-form module with a neuron array `W` (p, d) and `unit(w, x)` (all of
    `lvflow.architectures`), or a deep model of `lvflow` (`DeepMLP`, `DeepAttention`), whose twin
    is the composition of its blocks' twins (`DeepNQF`, App. B.4).

    ZGZ is checked at a sample input `x` (default: a Gaussian input of the right shape) with
    `lvflow.structure_matrix` on the unit.

    **Raises:** `lvflow.ZGZError` when a unit has a nonzero gradient at `w = 0` (a bias, or
    `φ(0) ≠ 0`): the module is then not an NQF (Thm 12 adds `gᵀμ`); `LvflowError` for a module
    without `W`/`unit` or an unknown `method`.
    """
    if method not in ("jvp", "structure"):
        raise LvflowError(f"method: expected 'jvp' or 'structure', got {method!r}")
    if hasattr(network, "twin_blocks"):
        from .deep import DeepNQF

        blocks = tuple(nqf_twin(b, x=None, method=method, seq_len=seq_len) for b in network.blocks)
        return DeepNQF(blocks=blocks, chain=network.chain, dphi0=network.link_slope)
    if not hasattr(network, "W") or not hasattr(network, "unit"):
        raise LvflowError(f"network: a {type(network).__name__} has no neuron array W and unit(w, x)")
    if method == "structure" and not hasattr(network, "structure"):
        raise LvflowError(f"method: a {type(network).__name__} has no closed-form structure(x); use method='jvp'")
    if x is None:
        from .data import gaussian_inputs, input_shape

        try:
            input_shape(network, seq_len=seq_len or 4)
        except LvflowError:
            raise LvflowError(f"x: pass a sample input to check ZGZ for a {type(network).__name__}") from None
        x = gaussian_inputs(network, 1, seed=12345, seq_len=seq_len or 4)[0]
    else:
        x = jnp.asarray(as_array("x", x))
    p = int(np.shape(network.W)[0])
    structure_matrix(network.unit, x, p)  # raises ZGZError
    return NQFModel(network=network, method=method)
