"""What every built-in architecture shares: the neuron array `W`, its packing, input checks.

A module with `d` interchangeable neurons `w_1..w_d ∈ R^p` is stored as `W ∈ R^{p×d}` (columns
are neurons, the paper's convention). A neuron made of several tensors (e.g. an attention head
`(Wᑫ, Wᴷ, Wᴠ, v)`) is their row-major (C-order) flattenings concatenated in the listed order;
`unpack` undoes this for one neuron `(p,)` or for all of them at once `(p, d)`.
"""

from __future__ import annotations

import abc
from typing import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._errors import LvflowError, ZGZError
from .._validate import _is_concrete, as_array, check_positive, check_positive_int


class AbstractArchitecture(eqx.Module):
    """A sum-form module `f_x(W) = Σ_i unit(w_i, x)` with a closed-form structure matrix.

    Near `W = 0` it is the neural quadratic form `Tr[W Wᵀ A(x)]` (Thm 1, Eq. 2), with
    `A(x) = ½ ∇²_w unit(w, x)|_{w=0}`; `structure(x)` returns the paper's closed form of `A(x)`
    (Props 1–6, Table 3), which `lvflow.structure_matrix(model.unit, x, model.p)` reproduces by
    autodiff.

    Subclasses hold the trainable neuron array `W` of shape `(p, d)` and static configuration.
    Inputs are single samples; `jax.vmap` over a batch.
    """

    W: eqx.AbstractVar[Float[Array, "p d"]]

    @property
    def p(self) -> int:
        """Neuron size `p`."""
        return self.W.shape[0]

    @property
    def d(self) -> int:
        """Number of neurons `d` (hidden width, channels, heads, experts, rank)."""
        return self.W.shape[1]

    @property
    @abc.abstractmethod
    def out_size(self) -> int | None:
        """Number of outputs `k`, or `None` for a scalar output."""

    @property
    def _k(self) -> int:
        """Number of outputs as an array size (1 for a scalar output)."""
        return 1 if self.out_size is None else self.out_size

    @abc.abstractmethod
    def unit(self, w: Float[Array, " p"], x) -> Float[Array, "*k"]:
        """One neuron's contribution `unit(w, x)`; `__call__(x) = Σ_i unit(W[:, i], x)`."""

    @abc.abstractmethod
    def __call__(self, x) -> Float[Array, "*k"]:
        """The network's output on one input `x`."""

    @abc.abstractmethod
    def structure(self, x) -> Float[Array, "*k p p"]:
        """The closed-form structure matrix `A(x)`, shape `(p, p)` or `(k, p, p)`."""


class AbstractVectorOutput(AbstractArchitecture):
    """An architecture whose number of outputs is set at construction (`out_size=None`: scalar),
    kept in the static field `_out_size`."""

    _out_size: eqx.AbstractVar[int | None]

    @property
    def out_size(self) -> int | None:
        return self._out_size


# ---------------------------------------------------------------------------------------------
# construction helpers


def check_size(name: str, v) -> int:
    """A positive integer size."""
    return check_positive_int(name, v)


def check_out_size(v) -> int | None:
    """`None` (scalar output) or a positive integer."""
    return None if v is None else check_size("out_size", v)


_CHUNK = 4096


@jax.jit
def _normal_chunk(key, i):
    return jax.random.normal(jax.random.fold_in(key, i), (_CHUNK,))


def normal(key: PRNGKeyArray, shape: tuple[int, ...]) -> Float[Array, "..."]:
    """Standard normal draws of the given shape.

    Drawn in fixed-size chunks (`fold_in(key, i)`, `i = 0, 1, …`) so that one compiled sampler
    serves every shape: `jax.random.normal` compiles anew for each shape (~0.5 s on CPU), which
    would dominate building small models. Works under `jit`/`vmap` over keys too.
    """
    n = int(np.prod(shape, dtype=int))
    chunks = [_normal_chunk(key, i) for i in range(max(1, -(-n // _CHUNK)))]
    if _is_concrete(chunks[0]):  # assemble in numpy: jnp slicing would compile per shape too
        return jnp.asarray(np.concatenate([np.asarray(c) for c in chunks])[:n].reshape(shape))
    return jnp.concatenate(chunks)[:n].reshape(shape)


def init_W(key: PRNGKeyArray, p: int, d: int, init_scale) -> Float[Array, "p d"]:
    """`W ~ N(0, init_scale²)` entrywise, shape `(p, d)`."""
    return check_positive("init_scale", init_scale, allow_zero=True) * normal(key, (p, d))


def check_activation(name: str, phi) -> float:
    """`φ` callable with `φ(0) = 0` (needed for ZGZ, Thm 1); returns `φ'(0)`.

    **Raises:** `ZGZError` when `φ(0) ≠ 0` (e.g. a sigmoid): then `∂unit/∂v = φ(0) ≠ 0` at `w = 0`
    and the module has a linear term in `μ = W 1` (Thm 12) instead of being an NQF.
    """
    if not callable(phi):
        raise LvflowError(f"{name}: must be a callable activation, got {phi!r}")
    with jax.ensure_compile_time_eval():  # concrete even when a model is built under jit/vmap
        phi0 = float(phi(jnp.zeros(())))
        dphi0 = float(jax.grad(phi)(jnp.zeros(())))
    if not np.isfinite(phi0) or abs(phi0) > 1e-12:
        raise ZGZError(
            f"{name}: φ(0) = {phi0:.3g} ≠ 0 breaks ZGZ (zero gradient at zero, Thm 1); "
            "use an activation with φ(0) = 0 such as tanh, or shift it by φ(0)"
        )
    if not np.isfinite(dphi0):
        raise LvflowError(f"{name}: φ'(0) = {dphi0} is not finite; the activation must be smooth at 0")
    return dphi0


# ---------------------------------------------------------------------------------------------
# packing of a neuron


def sizes_of(shapes: Sequence[tuple[int, ...]]) -> list[int]:
    return [int(np.prod(s, dtype=int)) for s in shapes]


def unpack(w: Float[Array, "p *d"], shapes: Sequence[tuple[int, ...]]) -> list[Array]:  # noqa: F821 (jaxtyping's variadic dims)
    """Split the leading axis of `w` into row-major tensors of the given shapes.

    For one neuron `w` of shape `(p,)` the pieces have shapes `shapes`; for the whole array
    `W` of shape `(p, d)` they have shapes `shape + (d,)` (the neuron axis stays last).
    """
    out, start = [], 0
    for shape, n in zip(shapes, sizes_of(shapes)):
        out.append(w[start : start + n].reshape(tuple(shape) + w.shape[1:]))
        start += n
    return out


def bilinear(p: int, rows: tuple[int, int], cols: tuple[int, int], C: Array) -> Array:
    """`½ [[0, C], [Cᵀ, 0]]` embedded in a `(p, p)` matrix (Eq. 17).

    `C` of shape `(*k, r, c)` occupies rows `rows = (start, stop)` and columns `cols`; a leading
    output axis `k` gives one matrix per output (Cor. 1). This is the structure matrix of any
    unit whose output is the bilinear form `z₁ᵀ C z₂` of two disjoint parts of the neuron.
    """
    A = jnp.zeros(C.shape[:-2] + (p, p), dtype=C.dtype)
    A = A.at[..., rows[0] : rows[1], cols[0] : cols[1]].set(C / 2)
    return A + jnp.swapaxes(A, -1, -2)


def per_output(C: Array, out_size: int | None) -> Array:
    """Blocks against a readout `V ∈ R^{c×k}` (row-major), one per output: shape `(k, r, c·k)`.

    If output `o` is `z₁ᵀ C V[:, o]` for a part `z₁` of size `r`, its bilinear block is
    `C ⊗ e_oᵀ` (entry `[r, a·k + o'] = C[r, a] δ_{o o'}`). For a scalar output (`out_size=None`,
    readout `V ∈ R^{c}`) the block is `C` itself.
    """
    if out_size is None:
        return C
    E = jnp.eye(out_size, dtype=C.dtype)  # E[o] = e_o
    return jnp.einsum("rc,ok->orck", C, E).reshape(out_size, C.shape[0], C.shape[1] * out_size)


# ---------------------------------------------------------------------------------------------
# input checks (static shapes: they work under jit and vmap too)


def check_input(name: str, x, shape: tuple[int, ...], what: str, *, dtype=None) -> Array:
    """`x` as an array of exactly `shape`; finite when concrete."""
    if _is_concrete(x):
        x = as_array(name, x)
    x = jnp.asarray(x, dtype=dtype)
    if tuple(x.shape) != tuple(shape):
        raise LvflowError(f"{name}: expected shape {tuple(shape)} ({what}), got {tuple(x.shape)}")
    return x


def check_sequence(name: str, X, D: int, *, dtype=None) -> Array:
    """A sequence `X ∈ R^{D×N}` (tokens are columns), `N ≥ 1`."""
    if _is_concrete(X):
        X = as_array(name, X)
    X = jnp.asarray(X, dtype=dtype)
    if X.ndim != 2 or X.shape[0] != D or X.shape[1] < 1:
        raise LvflowError(f"{name}: expected a sequence of shape ({D}, N) (features × tokens), got {tuple(X.shape)}")
    return X


Activation = Callable[[Array], Array]
