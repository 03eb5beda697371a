"""Deep networks as compositions of two sum-form blocks, and their two-layer NQF (App. B.4, Fig 8).

**The two-layer NQF.** A 4-layer MLP without bias,

`f(x) = W₄ φ(W₃ φ(W₂ φ(W₁ x)))`,

is two two-layer blocks joined by `φ`: `h = W₂ φ(W₁ x)` (neurons: the rows of `W₁` with the
columns of `W₂`) and `f = W₄ φ(W₃ φ(h))` (neurons: rows of `W₃` with columns of `W₄`). These two
sets of neurons partition all weights. Expanding each block around its own zero weights
(Thm 1) gives `h = Tr[M₁ A₁(x)] + O(|W₁₂|³)` and `f = Tr[M₂ A₂(φ(h))] + O(|W₃₄|³)`.
Def 2 lets layer `ℓ`'s structure matrix depend on the previous layer's output, `A⁽ˡ⁾(h⁽ˡ⁻¹⁾)`:
block 2 reads `φ(h)`, and dropping only the higher orders inside each block gives

`f_NQF(x) = Tr[M₂ A₂(φ(Tr[M₁ A₁(x)]))]`,   `M_ℓ = W_ℓ W_ℓᵀ`,

a composition of two quadratic forms through the network's own activation, whose leading term
is the network's `φ'(0)³ W₄W₃W₂W₁x`. Each block is then exactly the network block's second-order
Taylor term in its own weights. Linearising the link as well (`φ(h) = φ'(0) h + O(|h|³)`) gives
the polynomial "NQF of an NQF" `Tr[M₂ A₂(φ'(0) · Tr[M₁ A₁(x)])]`, degree 4 in the weights; for
the MLP it is a linear map of `x`, the function class of a one-layer NQF. `DeepNQF` builds
either (`activation`); `lvflow.nqf_twin` builds the linear one, Fig 8 the Def 2 one. A one-layer
NQF is degree 2 and cannot reproduce the `W⁴` dynamics (saddle escape ∝ 1/t rather than
exponential), which is Fig 8's point.

Two-layer attention is the same with multi-head attention blocks: block 1 is applied with every
token as the query (softmax attention is equivariant under permuting the keys, so token `n`
is made the last one, the query of `MultiHeadAttention`), giving a sequence `X' ∈ R^{D'×N}`;
block 2 reads `X'` at its last token. Attention has no activation between blocks (`φ'(0) = 1`).

Each deep model is an `AbstractDeepModel`: its two `blocks`, the `chain` that reads block 1 for
block 2 (`DirectChain`, `AllQueriesChain`) and its `link` with slope `link_slope = φ'(0)`; that is
all `lvflow.nqf_twin` needs to build its `DeepNQF`, so a model of your own works the same way.
"""

import abc
from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._core.errors import LvflowError
from ..architectures import MLP, AbstractArchitecture, MultiHeadAttention


class AbstractChain(eqx.Module):
    """How a deep model's first block is read to give the input of the second (App. B.4)."""

    @abc.abstractmethod
    def __call__(self, block: AbstractArchitecture, x) -> Array:
        """The first block's output on `x`, as the second block's input (before the link).

        **Arguments:** `block`: the first block (a network or its NQF twin); `x`: one input.
        """


class DirectChain(AbstractChain):
    """The first block's output itself: `h = block(x)` (deep MLP)."""

    def __call__(self, block: AbstractArchitecture, x) -> Array:
        return block(x)


class AllQueriesChain(AbstractChain):
    """A sequence model read with every token as the query: `h = [block(X with token n last)]_n`,
    a sequence `(k, N)` (two-layer attention: softmax attention is equivariant under permuting
    the keys, so token `n` is made the last one, the query of `MultiHeadAttention`)."""

    def __call__(self, block: AbstractArchitecture, X: Float[ArrayLike, "D N"]) -> Float[Array, "k N"]:
        X = jnp.asarray(X)
        N = X.shape[1]
        out = jax.vmap(lambda n: block(jnp.roll(X, -(n + 1), axis=1)))(jnp.arange(N))
        return out.T


class AbstractDeepModel(eqx.Module):
    """Two sum-form blocks joined by a link: `f(x) = block₂(link(chain(block₁, x)))` (App. B.4).

    What `lvflow.nqf_twin` needs to build the two-layer NQF `DeepNQF`: the `blocks` (each an
    `lvflow.architectures.AbstractArchitecture`, whose twins are composed), the `chain` that reads
    block 1 for block 2, and the slope `φ'(0)` of the link (`link_slope`), with which `nqf_twin`
    linearises the link: `f_NQF(x) = Q₂(φ'(0) · chain(Q₁, x))` (`DeepNQF` can keep it instead).

    **Raises:** `LvflowError` at construction when `blocks` is not two architectures.
    """

    blocks: eqx.AbstractVar[tuple[AbstractArchitecture, AbstractArchitecture]]
    chain: eqx.AbstractVar[AbstractChain]

    @property
    @abc.abstractmethod
    def link_slope(self) -> float:
        """`φ'(0)`, the slope at zero of the link between the blocks."""

    @abc.abstractmethod
    def link(self, h: Array) -> Array:
        """The map between the blocks (an activation `φ`, or linear), applied to the chained `h`."""

    def __check_init__(self):
        blocks = self.blocks
        if not (isinstance(blocks, tuple) and len(blocks) == 2):
            raise LvflowError(f"blocks: expected a pair of blocks, got {type(blocks).__name__}")
        for i, b in enumerate(blocks):
            if not isinstance(b, AbstractArchitecture):
                raise LvflowError(
                    f"blocks: block {i} is a {type(b).__name__}, not an lvflow.architectures.AbstractArchitecture"
                )

    @property
    def out_size(self) -> int | None:
        """Number of outputs `k` (the second block's), or `None` for a scalar output."""
        return self.blocks[1].out_size

    def sample_shape(self, *, seq_len: int | None = None) -> tuple[int, ...]:
        """The shape of ONE input (the first block's); `seq_len` for sequence inputs."""
        return self.blocks[0].sample_shape(seq_len=seq_len)

    def __call__(self, x) -> Float[Array, "*k"]:
        return self.blocks[1](self.link(self.chain(self.blocks[0], x)))


class DeepMLP(AbstractDeepModel):
    """4-layer MLP `f(x) = W₄ φ(W₃ φ(W₂ φ(W₁ x)))` without bias, as two `MLP` blocks joined by `φ`.

    `blocks[0] = MLP(in_size, h₁, h₂)` (neurons `[row of W₁, column of W₂]`) and
    `blocks[1] = MLP(h₂, h₃, out_size)`. Its twin (`nqf_twin`) is the two-layer NQF of the
    module docstring.

    **Raises:** `LvflowError` when `hidden` is not three widths; `ZGZError` when `φ(0) ≠ 0`.
    """

    blocks: tuple[MLP, MLP]
    activation: Callable = eqx.field(static=True)

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
        if len(tuple(hidden)) != 3:
            raise LvflowError(f"hidden: expected three hidden widths (h₁, h₂, h₃), got {hidden!r}")
        h1, h2, h3 = hidden
        k1, k2 = jax.random.split(key)
        self.blocks = (
            MLP(in_size, h1, h2, key=k1, init_scale=init_scale, activation=activation),
            MLP(h2, h3, out_size, key=k2, init_scale=init_scale, activation=activation),
        )
        self.activation = activation

    @property
    def chain(self) -> DirectChain:
        return DirectChain()

    @property
    def link_slope(self) -> float:
        return self.blocks[0].dphi0

    def link(self, h: Array) -> Array:
        return self.activation(h)


class DeepAttention(AbstractDeepModel):
    """Two-layer attention: `MultiHeadAttention` applied at every query position, then again at
    the last token. `blocks[0] = MultiHeadAttention(D, d_k, d_v, heads, D')`,
    `blocks[1] = MultiHeadAttention(D', d_k, d_v, heads, out_size)`; no activation between them
    (the link is the identity, `φ'(0) = 1`).
    """

    blocks: tuple[MultiHeadAttention, MultiHeadAttention]

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
        hidden_size = in_size if hidden_size is None else hidden_size
        k1, k2 = jax.random.split(key)
        self.blocks = (
            MultiHeadAttention(in_size, key_size, value_size, num_heads, hidden_size, key=k1, init_scale=init_scale),
            MultiHeadAttention(hidden_size, key_size, value_size, num_heads, out_size, key=k2, init_scale=init_scale),
        )

    @property
    def chain(self) -> AllQueriesChain:
        return AllQueriesChain()

    @property
    def link_slope(self) -> float:
        return 1.0

    def link(self, h: Array) -> Array:
        return h


class DeepNQF(AbstractDeepModel):
    """The two-layer NQF `f = Q₂(link(chain(Q₁, x)))`, `Q_ℓ(x) = Tr[M_ℓ A_ℓ(x)]` (App. B.4, Def 2).

    `blocks` are the NQF twins (`NQFModel`) of the deep network's blocks, holding the network's
    own neuron arrays (so `train` records `M` as a tuple `(M₁, M₂)`); `chain` is the network's.
    The link between the blocks is

    - `activation=None` (the default, what `lvflow.nqf_twin` builds): linear, `φ'(0) · h`
      (`dphi0 = φ'(0)`), so `f` is a polynomial of degree 4 in the weights — for the MLP a linear
      map of `x`;
    - `activation=φ`: the network's own activation, `φ(h)`. Def 2 lets the structure matrix of
      layer `ℓ` depend on the previous layer's output, `A⁽ˡ⁾(h⁽ˡ⁻¹⁾)`; for the MLP block 2 reads
      `φ(h)`, so `f = Q₂(φ(Q₁(x)))` keeps the nonlinearity of the network between the blocks,
      and each block is exactly the second-order Taylor term of the network's block in its own
      weights (Thm 1). Fig 8 uses this form.
    """

    blocks: tuple[AbstractArchitecture, AbstractArchitecture]
    chain: AbstractChain
    dphi0: float = eqx.field(static=True)
    activation: Callable | None = eqx.field(default=None, static=True)

    @property
    def link_slope(self) -> float:
        return self.dphi0

    def link(self, h: Array) -> Array:
        return self.dphi0 * h if self.activation is None else self.activation(h)
