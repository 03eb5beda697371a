"""The fast NQF twin of a built-in network, through its learned map `Θ(W)` (Thm 1, Eq. 17).

A built-in network's NQF `Tr[Wᵀ A_c(x) W]` (Eq. 2) is bilinear: `⟨Θ(W), Φ_c(x)⟩`, with the
learned map `Θ(W)` (a block of `M = W Wᵀ`) and linear input features `Φ_c(x)` (Eq. 17).
`Θ(W)` does not depend on the input, so under `vmap` over samples it is formed once per step:
`BilinearTwin` costs about what the network does, where the per-neuron Hessian form of
`lvflow.nqf_twin` costs 15–40× a network step at Fig 2's sizes. The training figures
(Fig 2, 6, 7, 8) train it beside the network; `twin_check` confirms it is `nqf_twin`.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._bundle import with_W


def learned_map(network) -> Float[Array, "a b"]:
    """`Θ(W)`, the block of `M = W Wᵀ` that a built-in network's NQF reads (`LowRankTeacher`):
    `U Vᵀ` (MLP: input weights × readouts; CNN: kernels × readouts), `Σ_h W_hᴠᵀ v_h`
    (multi-head attention), `Σ_h W_hᴷᵀ W_hᑫ` (query–key-only attention)."""
    from .. import architectures as arch
    from ..architectures._base import unpack

    W = network.W
    if isinstance(network, (arch.MLP, arch.CNN)):
        U, V = W[: -network._k], W[-network._k :]  # [u (or kernel), v] per neuron
        return U @ V.T
    if isinstance(network, arch.MultiHeadAttention):
        _, _, Wv, v = unpack(W, network._shapes)  # (d_v, D, h), (d_v, [k,] h)
        return jnp.einsum("adh,a...h->d...", Wv, v).reshape(network.in_size, -1)
    if isinstance(network, arch.QKAttention):
        Wq, Wk = unpack(W, network._shapes)  # (d_k, D, h) each
        return jnp.einsum("jah,jbh->ab", Wk, Wq)
    raise NotImplementedError(type(network).__name__)


class BilinearTwin(eqx.Module):
    """A built-in network's NQF `Tr[Wᵀ A_c(x) W] = ⟨Θ(W), Φ_c(x)⟩` (Thm 1, Eq. 2, Eq. 17).

    The same function as `lvflow.nqf_twin(network)` (checked by `twin_check`), evaluated
    through the learned map `Θ(W)` (`learned_map`) and the linear features `Φ_c(x)` of the
    low-rank teacher: `Θ(W)` does not depend on the input, so under `vmap` over samples it is
    formed once per step, making the twin as cheap as the network (the per-neuron Hessian form
    of `nqf_twin` costs 15–40× a network step at Fig 2's sizes).
    """

    network: eqx.Module

    @property
    def W(self):
        return self.network.W

    def __call__(self, x):
        from .._training.data import _spec

        Phi = _spec(self.network).features(x)  # (k, a, b)
        out = jnp.einsum("cab,ab->c", Phi, learned_map(self.network))
        return out[0] if self.network.out_size is None else out


def twin_check(network, X, *, seed: int = 7) -> float:
    """`max |BilinearTwin − nqf_twin| / max |nqf_twin|` on inputs `X` at a random `W` of scale 0.3."""
    from .._training.twin import nqf_twin

    W = 0.3 * jax.random.normal(jax.random.PRNGKey(seed), network.W.shape)
    net = with_W(network, W)
    ref = jax.vmap(nqf_twin(net, x=X[0]))(X)
    fast = jax.vmap(BilinearTwin(net))(X)
    return float(jnp.max(jnp.abs(fast - ref)) / jnp.max(jnp.abs(ref)))
