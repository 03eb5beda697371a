"""The fast NQF twin of a built-in network, through its learned map `Θ(W)` (Thm 1, Eq. 17).

A built-in network's NQF `Tr[Wᵀ A_c(x) W]` (Eq. 2) is bilinear: `⟨Θ(W), Φ_c(x)⟩`, with the
learned map `Θ(W)` (a block of `M = W Wᵀ`) and linear input features `Φ_c(x)` (Eq. 17).
`Θ(W)` does not depend on the input, so under `vmap` over samples it is formed once per step:
`BilinearTwin` costs about what the network does, where the per-neuron Hessian form of
`lvflow.nqf_twin` costs 15–40× a network step at Fig 2's sizes. The training figures
(Fig 2, 6, 7, 8) train it beside the network; `twin_check` confirms it is `nqf_twin`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._core.errors import LvflowError
from .._training.twin import AbstractTwin, nqf_twin
from ..architectures import AbstractLearnedMap
from ._bundle import with_W


class BilinearTwin(AbstractTwin):
    """A built-in network's NQF `Tr[Wᵀ A_c(x) W] = ⟨Θ(W), Φ_c(x)⟩` (Thm 1, Eq. 2, Eq. 17).

    The same function as `lvflow.nqf_twin(network)` (checked by `twin_check`), evaluated
    through the learned map `Θ(W)` (`network.learned_map()`) and the linear features `Φ_c(x)`
    (`network.map_features(x)`): `Θ(W)` does not depend on the input, so under `vmap` over
    samples it is formed once per step, making the twin as cheap as the network (the per-neuron
    Hessian form of `nqf_twin` costs 15–40× a network step at Fig 2's sizes).

    **Arguments:** `network`: an `lvflow.architectures.AbstractLearnedMap`.

    **Raises:** `LvflowError` for another `network`.
    """

    network: AbstractLearnedMap

    def __init__(self, network: AbstractLearnedMap):
        self.network = network

    def __check_init__(self):
        if not isinstance(self.network, AbstractLearnedMap):
            raise LvflowError(
                f"network: a {type(self.network).__name__} has no learned map "
                "(not an lvflow.architectures.AbstractLearnedMap)"
            )

    def unit(self, w: Float[ArrayLike, " p"], x) -> Float[Array, "*k"]:
        """`wᵀ A(x) w`: one neuron's quadratic form (Eq. 2)."""
        return jnp.einsum("...ij,i,j->...", self.network.structure(x), w, w)

    def __call__(self, x) -> Float[Array, "*k"]:
        Phi = self.network.map_features(x)  # (k, a, b)
        out = jnp.einsum("cab,ab->c", Phi, self.network.learned_map())
        return out[0] if self.network.out_size is None else out


def twin_check(network: AbstractLearnedMap, X, *, seed: int = 7) -> float:
    """`max |BilinearTwin − nqf_twin| / max |nqf_twin|` on inputs `X` at a random `W` of scale 0.3."""
    W = 0.3 * jax.random.normal(jax.random.PRNGKey(seed), network.W.shape)
    net = with_W(network, W)
    ref = jax.vmap(nqf_twin(net, x=X[0]))(X)
    fast = jax.vmap(BilinearTwin(net))(X)
    return float(jnp.max(jnp.abs(fast - ref)) / jnp.max(jnp.abs(ref)))
