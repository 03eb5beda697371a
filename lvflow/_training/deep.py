"""Deep networks as compositions of two sum-form blocks, and their two-layer NQF (App. B.4, Fig 8).

**The two-layer NQF.** A 4-layer MLP without bias,

`f(x) = W₄ φ(W₃ φ(W₂ φ(W₁ x)))`,

is two two-layer blocks joined by `φ`: `h = W₂ φ(W₁ x)` (neurons: the rows of `W₁` with the
columns of `W₂`) and `f = W₄ φ(W₃ φ(h))` (neurons: rows of `W₃` with columns of `W₄`). These two
sets of neurons partition all weights. Expanding each block around its own zero weights
(Thm 1) gives `h = Tr[M₁ A₁(x)] + O(|W₁₂|³)` and `f = Tr[M₂ A₂(φ(h))] + O(|W₃₄|³)`, and
`φ(h) = φ'(0) h + O(|h|³)` with `h = O(|W|²)`. Dropping the higher orders,

`f_NQF(x) = Tr[M₂ A₂(φ'(0) · Tr[M₁ A₁(x)])]`,   `M_ℓ = W_ℓ W_ℓᵀ`,

a composition of two quadratic forms: degree 4 in the weights, with the same leading term
`φ'(0)³ W₄W₃W₂W₁x` as the network. We keep the link linear (`φ'(0)·h` rather than `φ(h)`) so the
twin is exactly a polynomial "NQF of an NQF": the dropped `O(|h|³)` is two orders smaller than
the error already made inside each block. A one-layer NQF is degree 2 and cannot reproduce the
`W⁴` dynamics (saddle escape ∝ 1/t rather than exponential), which is Fig 8's point.

Two-layer attention is the same with multi-head attention blocks: block 1 is applied with every
token as the query (softmax attention is equivariant under permuting the keys, so token `n`
is made the last one, the query of `MultiHeadAttention`), giving a sequence `X' ∈ R^{D'×N}`;
block 2 reads `X'` at its last token. Attention has no activation between blocks (`φ'(0) = 1`).
"""

from __future__ import annotations

from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._errors import LvflowError


def _all_queries(block, X: Float[Array, "D N"]) -> Float[Array, "k N"]:
    """`block` read out with every token as the query (token `n` rolled to the last position)."""
    N = X.shape[1]
    out = jax.vmap(lambda n: block(jnp.roll(X, -(n + 1), axis=1)))(jnp.arange(N))
    return out.T


def _chain(chain: str, blocks, x, link):
    if chain == "mlp":
        return blocks[1](link(blocks[0](x)))
    if chain == "attention":
        return blocks[1](_all_queries(blocks[0], x))
    raise LvflowError(f"chain: unknown composition {chain!r}")


class DeepMLP(eqx.Module):
    """4-layer MLP `f(x) = W₄ φ(W₃ φ(W₂ φ(W₁ x)))` without bias, as two `MLP` blocks joined by `φ`.

    `blocks[0] = MLP(in_size, h₁, h₂)` (neurons `[row of W₁, column of W₂]`) and
    `blocks[1] = MLP(h₂, h₃, out_size)`. Its twin (`nqf_twin`) is the two-layer NQF of the
    module docstring.
    """

    blocks: tuple
    activation: Callable = eqx.field(static=True)
    chain: str = eqx.field(static=True, default="mlp")
    twin_blocks: bool = eqx.field(static=True, default=True)

    def __init__(
        self,
        in_size: int,
        hidden: tuple[int, int, int],
        out_size=None,
        *,
        key: PRNGKeyArray,
        init_scale=0.01,
        activation=jnp.tanh,
    ):
        from ..architectures import MLP

        if len(tuple(hidden)) != 3:
            raise LvflowError(f"hidden: expected three hidden widths (h₁, h₂, h₃), got {hidden!r}")
        h1, h2, h3 = hidden
        k1, k2 = jax.random.split(key)
        self.blocks = (
            MLP(in_size, h1, h2, key=k1, init_scale=init_scale, activation=activation),
            MLP(h2, h3, out_size, key=k2, init_scale=init_scale, activation=activation),
        )
        self.activation = activation
        self.chain, self.twin_blocks = "mlp", True

    @property
    def link_slope(self) -> float:
        return self.blocks[0].dphi0

    @property
    def out_size(self):
        return self.blocks[1].out_size

    def input_shape_of(self, seq_len=None):
        return (self.blocks[0].in_size,)

    def __call__(self, x: Float[Array, " n"]) -> Float[Array, "*k"]:
        return _chain("mlp", self.blocks, x, self.activation)


class DeepAttention(eqx.Module):
    """Two-layer attention: `MultiHeadAttention` applied at every query position, then again at
    the last token. `blocks[0] = MultiHeadAttention(D, d_k, d_v, heads, D')`,
    `blocks[1] = MultiHeadAttention(D', d_k, d_v, heads, out_size)`.
    """

    blocks: tuple
    chain: str = eqx.field(static=True, default="attention")
    twin_blocks: bool = eqx.field(static=True, default=True)

    def __init__(
        self,
        in_size: int,
        key_size: int,
        value_size: int,
        num_heads: int,
        out_size=None,
        *,
        hidden_size: int | None = None,
        key: PRNGKeyArray,
        init_scale=0.01,
    ):
        from ..architectures import MultiHeadAttention

        hidden_size = in_size if hidden_size is None else hidden_size
        k1, k2 = jax.random.split(key)
        self.blocks = (
            MultiHeadAttention(in_size, key_size, value_size, num_heads, hidden_size, key=k1, init_scale=init_scale),
            MultiHeadAttention(hidden_size, key_size, value_size, num_heads, out_size, key=k2, init_scale=init_scale),
        )
        self.chain, self.twin_blocks = "attention", True

    @property
    def link_slope(self) -> float:
        return 1.0

    @property
    def out_size(self):
        return self.blocks[1].out_size

    def input_shape_of(self, seq_len=None):
        if seq_len is None:
            raise LvflowError("seq_len: required for attention models (the number of tokens N)")
        return (self.blocks[0].in_size, int(seq_len))

    def __call__(self, X: Float[Array, "D N"]) -> Float[Array, "*k"]:
        return _chain("attention", self.blocks, X, None)


class DeepNQF(eqx.Module):
    """The two-layer NQF `f = Q₂(φ'(0) · Q₁(x))`, `Q_ℓ(x) = Tr[M_ℓ A_ℓ(x)]` (module docstring).

    `blocks` are the `NQFModel` twins of the deep network's blocks, holding the network's
    own neuron arrays (so `train` records `M` as a tuple `(M₁, M₂)`).
    """

    blocks: tuple
    chain: str = eqx.field(static=True)
    dphi0: float = eqx.field(static=True)

    @property
    def out_size(self):
        return self.blocks[1].out_size

    def input_shape_of(self, seq_len=None):
        if self.chain == "attention":
            if seq_len is None:
                raise LvflowError("seq_len: required for attention models (the number of tokens N)")
            return (self.blocks[0].network.in_size, int(seq_len))
        return (self.blocks[0].network.in_size,)

    def __call__(self, x):
        return _chain(self.chain, self.blocks, x, lambda h: self.dphi0 * h)
