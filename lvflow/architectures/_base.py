"""What every built-in architecture shares: the abstract bases (what a module provides), the
neuron array `W`, its packing, input checks, and the pieces of a low-rank teacher.

A module with `d` interchangeable neurons `w_1..w_d ∈ R^p` is stored as `W ∈ R^{p×d}` (columns
are neurons, the paper's convention). A neuron made of several tensors (e.g. an attention head
`(Wᑫ, Wᴷ, Wᴠ, v)`) is their row-major (C-order) flattenings concatenated in the listed order;
`unpack` undoes this for one neuron `(p,)` or for all of them at once `(p, d)`.
"""

import abc
import functools
import math
from typing import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._core.errors import LvflowError, ZGZError
from .._core.programs import persistent_jit
from .._core.validate import as_array, check_positive, check_positive_int, to_jax
from .._form.taylor import probe_order, taylor_term


class AbstractSumForm(eqx.Module):
    """A sum-form module `f_x(W) = Σ_i unit(w_i, x)` over `d` interchangeable neurons (Thm 1).

    This is all `lvflow.nqf_twin` needs: the neuron array `W` (columns are neurons) and one
    neuron's contribution `unit(w, x)`. Near `W = 0` the module is the neural quadratic form
    `Tr[W Wᵀ A(x)]` (Eq. 2), `A(x) = ½ ∇²_w unit(w, x)|_{w=0}`, provided that `unit` has zero
    gradient at zero (ZGZ). Subclass `AbstractArchitecture` instead when `A(x)` has a closed form.

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

    @abc.abstractmethod
    def unit(self, w: Float[ArrayLike, " p"], x, /) -> Float[Array, "*k"]:
        """One neuron's contribution `unit(w, x)`; `__call__(x) = Σ_i unit(W[:, i], x)`."""

    @abc.abstractmethod
    def __call__(self, x, /) -> Float[Array, "*k"]:
        """The network's output on one input `x`."""

    def next_order(self, x, /) -> int | None:
        """The order `k ≥ 3` of the first term of the symmetric expansion (Thm 13, Eq. 200) beyond the
        NQF that is not identically zero, or `None` when the module is exactly quadratic in each neuron.

        By default probed at a random neuron and the input `x` (`lvflow.next_order`); architectures
        with a closed form override it. `x` must be concrete (not traced).
        """
        return probe_order(self.unit, x, self.p)

    def expansion_term(self, x, /, order: int) -> Float[Array, "*k"]:
        """The order-`k` part of `f_x(W)` in Thm 13 (Eq. 203), `Σ_i T_(k)(x)[w_i^{⊗k}]`, at this `W`.

        For a sum form only the single-neuron partition `λ = (k)` contributes, with
        `T_(k)(x)[w^{⊗k}] = (1/k!) dᵏ/dsᵏ unit(s w, x)|_{s=0}`; by default computed by nested
        forward-mode differentiation of `unit` (architectures with a closed form override it).
        `order = 2` is the NQF's `Tr[W Wᵀ A(x)]`.
        """
        return jnp.sum(jax.vmap(lambda w: taylor_term(self.unit, w, x, order))(self.W.T), axis=0)


class AbstractArchitecture(AbstractSumForm):
    """A sum-form module `f_x(W) = Σ_i unit(w_i, x)` with a closed-form structure matrix.

    Near `W = 0` it is the neural quadratic form `Tr[W Wᵀ A(x)]` (Thm 1, Eq. 2), with
    `A(x) = ½ ∇²_w unit(w, x)|_{w=0}`; `structure(x)` returns the paper's closed form of `A(x)`
    (Props 1–6, Table 3), which `lvflow.structure_matrix(model.unit, x, model.p)` reproduces by
    autodiff.

    Subclasses hold the trainable neuron array `W` of shape `(p, d)` and static configuration,
    and say what one input looks like (`sample_shape`), so that `lvflow.gaussian_inputs` and
    `lvflow.nqf_twin` can draw inputs for them.
    """

    @property
    @abc.abstractmethod
    def out_size(self) -> int | None:
        """Number of outputs `k`, or `None` for a scalar output."""

    @property
    def _k(self) -> int:
        """Number of outputs as an array size (1 for a scalar output)."""
        return 1 if self.out_size is None else self.out_size

    @abc.abstractmethod
    def structure(self, x, /) -> Float[Array, "*k p p"]:
        """The closed-form structure matrix `A(x)`, shape `(p, p)` or `(k, p, p)`."""

    @abc.abstractmethod
    def sample_shape(self, *, seq_len: int | None = None) -> tuple[int, ...]:
        """The shape of ONE input `x`.

        **Arguments:** `seq_len`: the number of tokens `N` of a sequence input (attention);
        ignored by models whose input is not a sequence of free length.

        **Raises:** `LvflowError` when the shape needs `seq_len` and it is `None`.
        """


class AbstractTwin(AbstractArchitecture):
    """The NQF of a sum-form `network`, on the network's own neurons: `f(x) = Tr[Wᵀ A(x) W]` (Thm 1, Eq. 2).

    A twin holds the network itself and its neuron array is the network's (`twin.W` is
    `twin.network.W`), so `lvflow.train` treats a network and its twin alike and both record the
    same `M = W Wᵀ`. It is itself a sum-form module with the network's structure matrix `A(x)`,
    input shape and number of outputs; those three need the network to be an
    `lvflow.architectures.AbstractArchitecture` (a bare `AbstractSumForm` has none of them).
    """

    network: eqx.AbstractVar[AbstractSumForm]

    @property
    def W(self) -> Float[Array, "p d"]:
        return self.network.W

    def _architecture(self, what: str) -> AbstractArchitecture:
        if not isinstance(self.network, AbstractArchitecture):
            raise LvflowError(
                f"network: a {type(self.network).__name__} has no {what} "
                "(not an lvflow.architectures.AbstractArchitecture)"
            )
        return self.network

    @property
    def out_size(self) -> int | None:
        return self._architecture("out_size").out_size

    def sample_shape(self, *, seq_len: int | None = None) -> tuple[int, ...]:
        return self._architecture("input shape").sample_shape(seq_len=seq_len)

    def structure(self, x) -> Float[Array, "*k p p"]:
        """The network's structure matrix `A(x)`."""
        return self._architecture("closed-form structure(x)").structure(x)


class AbstractLearnedMap(AbstractArchitecture):
    """An architecture whose NQF reads one learned map: `Tr[Wᵀ A_c(x) W] = ⟨Θ(W), Φ_c(x)⟩` (Eq. 17).

    `Θ(W)` is an `(a, b)` matrix, an off-diagonal block of `M = W Wᵀ` between the input side
    and the output side of a neuron (partially traced for attention), and `Φ_c(x)` are linear
    features of the input, one per output `c`. This is what `lvflow.low_rank_teacher` needs to
    plant a rank-`r` teacher `Θ* = U diag(s) Vᵀ` and to read `ŝ` off a model's outputs.
    """

    @abc.abstractmethod
    def learned_map(self) -> Float[Array, "a b"]:
        """`Θ(W)`, the block of `M = W Wᵀ` that the NQF reads (Eq. 17)."""

    @abc.abstractmethod
    def map_features(self, x, /) -> Float[Array, "k a b"]:
        """`Φ_c(x)` for every output `c` (`k = 1` for a scalar output): `f_c ≈ ⟨Θ(W), Φ_c(x)⟩`."""

    @abc.abstractmethod
    def draw_teacher(self, rng: np.random.Generator, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A rank-`r` teacher `Θ* = U diag(s) Vᵀ` and `r` neurons realising it.

        **Arguments:** `rng`: numpy generator of the directions; `s`: the `r` singular values.

        **Returns:** `(U, V, Z)`: `U (a, r)` and `V (b, r)` with orthonormal columns (drawn from
        `rng`), and `Z (p, r)` with `Tr[Z Zᵀ A_c(x)] = ⟨Θ*, Φ_c(x)⟩` for every `x` and `c`.
        """

    def map_basis(self) -> Float[Array, "a b p p"]:
        """`E_ab`, the symmetric matrices with `Θ_ab(W) = Tr[W Wᵀ E_ab]` (the adjoint of `M ↦ Θ`).

        Then `A_c(x) = Σ_ab Φ_c(x)_ab E_ab` (Eq. 17), the factored form `NQF(features=…,
        basis=…)` uses. Computed as `E_ab = ½ ∂Θ_ab/∂W` at `W = I_p` (`Θ` is linear in `WWᵀ`,
        so `∂⟨G, Θ⟩/∂W = 2 Θ*(G) W`).
        """
        eye = jnp.eye(self.p, dtype=self.W.dtype)
        jac = jax.jacrev(lambda W: eqx.tree_at(lambda m: m.W, self, W).learned_map())(eye)
        return 0.5 * jac

    def factors(self, X) -> tuple[Array, Array]:
        """`(Φ, E)` with `A_c(x_μ) = Σ_d Φ_{μ[c]d} E_{[c]d}` for a batch `X` (samples on axis 0),
        the factored form of `NQF(features=Φ, basis=E, y=…)` (Eq. 17).

        A separable map (`f_c = ψ(x)ᵀ S(Θ)_c`) shares its features across outputs: `Φ = ψ(X)`
        `(m, F)` and `E_{c,f} = Σ_ab ∂S(Θ)_{c,f}/∂Θ_ab E_ab`, `([k,] F, p, p)`; otherwise `Φ` are
        the map features flattened, `(m, [k,] a·b)`, and `E = map_basis()` flattened, `(a·b, p, p)`.
        """
        return _factors(self, to_jax(X))

    @property
    def map_shape(self) -> tuple[int, int]:
        """`(a, b)`, the shape of `Θ(W)`."""
        return tuple(jax.eval_shape(type(self).learned_map, self).shape)


class AbstractSeparableMap(AbstractLearnedMap):
    """A learned-map architecture whose outputs each read their own slice of `Θ` with one
    shared feature vector: `f_c = ψ(x)ᵀ output_slices(Θ)[c]` (MLP, CNN, multi-head attention,
    mixture of experts; not QK attention, whose features depend on the output's readout).

    `lvflow.low_rank_teacher` then fits `Θ̂` output by output from the `(m, F)` matrix of `ψ`,
    not from the `(m·k, a·b)` matrix of `Φ`.
    """

    @abc.abstractmethod
    def shared_features(self, x, /) -> Float[Array, " F"]:
        """`ψ(x)`, the features every output reads."""

    @abc.abstractmethod
    def output_slices(self, Theta: Float[ArrayLike, "a b"], /) -> Float[Array, "k F"]:
        """Output `c`'s slice of `Θ` (a linear rearrangement of its entries), row `c`."""


class AbstractPooledPerceptron(AbstractSeparableMap):
    """`f(x) = Σ_i v_i Σ_q φ(u_iᵀ x_q)`: neurons `w_i = [u_i (n), v_i (k, or 1)]` read out summed
    over the patches `x_q` of the input (MLP: one patch, `x` itself; CNN: Prop 6).

    The structure matrix is `A⁽ᶜ⁾(x) = φ'(0)/2 · [[0, z(x) e_cᵀ], [e_c z(x)ᵀ, 0]]` with
    `z(x) = Σ_q x_q` (Props 1 and 6), so to second order `f_c(x) = φ'(0) z(x)ᵀ U Vᵀ e_c`: the
    learned map is `Θ = Σ_i u_i v_iᵀ = U Vᵀ` (`n × k`) and `Φ_c(x) = φ'(0) z(x) e_cᵀ`; each
    output reads its own column of `Θ` with `ψ(x) = φ'(0) z(x)`.
    """

    dphi0: eqx.AbstractVar[float]

    @property
    @abc.abstractmethod
    def _n(self) -> int:
        """Size `n` of a neuron's input weights `u` (the input side of `Θ`)."""

    @abc.abstractmethod
    def _check(self, x, /, *, dtype=None) -> Array:
        """`x` as an array of the input's shape (`sample_shape`); raises `LvflowError` otherwise."""

    @abc.abstractmethod
    def pooled_input(self, x, /) -> Float[Array, " n"]:
        """`z(x) = Σ_q x_q`, the sum of the input's patches (no input check)."""

    def _split(self, w: Float[ArrayLike, " p *d"]) -> tuple[Array, Array]:  # noqa: F821 (jaxtyping's variadic dims)
        """`(u, v)` of one neuron, or `(U, V)` of all of them (`v` a scalar for a scalar output)."""
        u, v = unpack(w, [(self._n,), (self._k,)])
        return u, (v[0] if self.out_size is None else v)

    def structure(self, x) -> Float[Array, "*k p p"]:
        z = self.pooled_input(self._check(x, dtype=self.W.dtype))
        C = per_output(self.dphi0 * z[:, None], self.out_size)
        return bilinear(self.p, (0, self._n), (self._n, self.p), C)

    def learned_map(self) -> Float[Array, "n k"]:
        return self.W[: self._n] @ self.W[self._n :].T

    def map_features(self, x) -> Float[Array, "k n k"]:
        return self.dphi0 * jnp.einsum("a,cb->cab", self.pooled_input(x), np.eye(self._k))

    def shared_features(self, x) -> Float[Array, " n"]:
        return self.dphi0 * self.pooled_input(x)

    def output_slices(self, Theta: Float[ArrayLike, "n k"]) -> Float[Array, "k n"]:
        return jnp.asarray(Theta).T

    def draw_teacher(self, rng: np.random.Generator, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Z_j = √s_j [u_j; v_j]: Tr[Z Zᵀ A_c] = φ'(0) z(x)ᵀ U S Vᵀ e_c.
        U, V = orthonormal(rng, self._n, len(s)), orthonormal(rng, self._k, len(s))
        return U, V, teacher_neurons(self.p, [(0, U * np.sqrt(s)), (self._n, V * np.sqrt(s))], len(s))


class AbstractVectorInput(AbstractArchitecture):
    """An architecture whose input is one vector `x ∈ R^n`, `n = in_size`."""

    in_size: eqx.AbstractVar[int]

    def sample_shape(self, *, seq_len: int | None = None) -> tuple[int]:
        return (self.in_size,)

    def _check(self, x, *, dtype=None) -> Float[Array, " n"]:
        """`x` as an array of shape `(n,)`; raises `LvflowError` otherwise."""
        return check_input("x", x, (self.in_size,), "one input vector", dtype=dtype)


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


def normal(key: PRNGKeyArray, shape: tuple[int, ...], scale: float | Float[Array, ""] = 1.0) -> Float[Array, "..."]:
    """`scale` times standard normal draws of the given shape.

    Drawn in fixed-size chunks (`fold_in(key, i)`, `i = 0, 1, …`) so that one compiled sampler
    serves every shape (`jax.random.normal` compiles anew for each shape, ~0.5 s on CPU), and
    assembled by one small compiled function per shape. Works under `jit`/`vmap` over keys too.
    """
    n = int(np.prod(shape, dtype=int))
    chunks = [_normal_chunk(key, i) for i in range(max(1, -(-n // _CHUNK)))]
    return _assemble(chunks, tuple(int(s) for s in shape), jnp.asarray(scale, dtype=float))


@functools.partial(jax.jit, static_argnums=1)
def _assemble(chunks: list[Array], shape: tuple[int, ...], scale: Float[Array, ""]) -> Array:
    return scale * jnp.concatenate(chunks)[: math.prod(shape)].reshape(shape)


def init_W(key: PRNGKeyArray, p: int, d: int, init_scale) -> Float[Array, "p d"]:
    """`W ~ N(0, init_scale²)` entrywise, shape `(p, d)`."""
    return normal(key, (p, d), check_positive("init_scale", init_scale, allow_zero=True))


def check_activation(name: str, phi) -> float:
    """`φ` callable with `φ(0) = 0` (needed for ZGZ, Thm 1); returns `φ'(0)`.

    **Raises:** `ZGZError` when `φ(0) ≠ 0` (e.g. a sigmoid): then `∂unit/∂v = φ(0) ≠ 0` at `w = 0`
    and the module has a linear term in `μ = W 1` (Thm 12) instead of being an NQF.
    """
    if not callable(phi):
        raise LvflowError(f"{name}: must be a callable activation, got {phi!r}")
    phi0, dphi0 = _taylor(phi)[:2]
    if not np.isfinite(phi0) or abs(phi0) > 1e-12:
        raise ZGZError(
            f"{name}: φ(0) = {phi0:.3g} ≠ 0 breaks ZGZ (zero gradient at zero, Thm 1); "
            "use an activation with φ(0) = 0 such as tanh, or shift it by φ(0)"
        )
    if not np.isfinite(dphi0):
        raise LvflowError(f"{name}: φ'(0) = {dphi0} is not finite; the activation must be smooth at 0")
    return dphi0


# φ⁽ʲ⁾(0)/j! for j ≤ _TAYLOR come from one compiled program: `check_activation`'s, and
# `activation_next_order`'s for an odd φ such as tanh
_TAYLOR = 3

# ... except for the architectures' default activation, whose coefficients are known exactly:
# tanh(z) = z − z³/3 + O(z⁵) (tracing its three nested `jax.grad`s is most of the time an MLP's
# constructor takes in a fresh process)
_KNOWN_TAYLOR = ((jnp.tanh, (0.0, 1.0, 0.0, -1.0 / 3.0)),)


def _taylor(phi) -> tuple[float, ...]:
    """`φ⁽ʲ⁾(0)/j!` for `j = 0, …, 3` by one compiled program (by nested `jax.grad`), or for
    `j = 0, 1` where `jax.grad` cannot take φ's third derivative (exact for `jnp.tanh`); cached
    per activation."""
    try:
        return _taylor_at_zero(phi)
    except TypeError:  # an unhashable callable: not cached
        return _taylor_at_zero.__wrapped__(phi)


@functools.lru_cache(maxsize=256)
def _taylor_at_zero(phi) -> tuple[float, ...]:
    for known, coefficients in _KNOWN_TAYLOR:
        if phi is known:
            return coefficients
    zero = np.zeros(())
    for order in (_TAYLOR, 1):
        derivatives = [phi]
        for _ in range(order):
            derivatives.append(jax.grad(derivatives[-1]))
        program = jax.jit(lambda z, fs=tuple(derivatives): [jnp.asarray(f(z)) for f in fs])
        try:
            # compiled ahead of time and called on a concrete zero: concrete even when a model
            # is built under jit/vmap
            values = program.lower(zero).compile()(zero)
        except Exception:
            if order == 1:
                raise
            continue  # no third derivative: φ(0) and φ'(0) alone
        return tuple(float(v) / math.factorial(j) for j, v in enumerate(values))
    raise AssertionError("unreachable")


def activation_coefficient(phi, j: int) -> float:
    """`φ⁽ʲ⁾(0)/j!`, the `j`-th Taylor coefficient of an activation at 0 (by nested `jax.grad`)."""
    try:
        return _activation_coefficient(phi, j)
    except TypeError:  # an unhashable callable: not cached
        return _activation_coefficient.__wrapped__(phi, j)


@functools.lru_cache(maxsize=256)
def _activation_coefficient(phi, j: int) -> float:
    low = _taylor(phi)
    if j < len(low):  # from the program `check_activation` runs
        return low[j]
    f = phi
    for _ in range(j):
        f = jax.grad(f)
    # one compiled program per order, called on a concrete zero (concrete under jit/vmap too)
    zero = np.zeros(())
    return float(jax.jit(f).lower(zero).compile()(zero)) / math.factorial(j)


def activation_next_order(phi, *, max_power: int = 8, rtol: float = 1e-12) -> int | None:
    """`j + 1` for the first `j ≥ 2` with `φ⁽ʲ⁾(0) ≠ 0` (up to `max_power`), or `None` (a linear `φ`).

    The order in the weights of the first term of `v φ(uᵀx)` beyond the NQF (Thm 13): `v` brings one
    power, `(uᵀx)ʲ` brings `j`.
    """
    scale = abs(activation_coefficient(phi, 1))
    for j in range(2, max_power + 1):
        c = activation_coefficient(phi, j)
        if not np.isfinite(c) or abs(c) > rtol * max(scale, 1e-300):
            return j + 1
    return None


def pooled_expansion_term(phi, patches: Float[Array, "P n"], U: Float[Array, "n d"], V, order: int) -> Array:
    """Thm 13's order-`k` term of `Σ_i v_i Σ_q φ(u_iᵀ x_q)`: `Σ_i v_i φ⁽ᵏ⁻¹⁾(0)/(k−1)! Σ_q (u_iᵀ x_q)^{k−1}`.

    `patches` are the `x_q` (one row for an MLP), `U` the input weights `(n, d)` and `V` the readout
    `(d,)` or `(k_out, d)`.
    """
    if order < 1:
        return jnp.zeros(V.shape[:-1], dtype=U.dtype)
    c = activation_coefficient(phi, order - 1)
    return V @ (c * jnp.sum((patches @ U) ** (order - 1), axis=0))


# ---------------------------------------------------------------------------------------------
# packing of a neuron


def sizes_of(shapes: Sequence[tuple[int, ...]]) -> list[int]:
    return [int(np.prod(s, dtype=int)) for s in shapes]


def unpack(w: Float[ArrayLike, "p *d"], shapes: Sequence[tuple[int, ...]]) -> list[Array]:  # noqa: F821 (jaxtyping's variadic dims)
    """Split the leading axis of `w` into row-major tensors of the given shapes.

    For one neuron `w` of shape `(p,)` the pieces have shapes `shapes`; for the whole array
    `W` of shape `(p, d)` they have shapes `shape + (d,)` (the neuron axis stays last).
    """
    w = jnp.asarray(w)
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
    """`x` as an array of exactly `shape`, finite (checked through `equinox.error_if` when traced)."""
    x = jnp.asarray(as_array(name, x), dtype=dtype)
    if tuple(x.shape) != tuple(shape):
        raise LvflowError(f"{name}: expected shape {tuple(shape)} ({what}), got {tuple(x.shape)}")
    return x


def check_sequence(name: str, X, D: int, *, dtype=None) -> Array:
    """A sequence `X ∈ R^{D×N}` (tokens are columns), `N ≥ 1`."""
    X = jnp.asarray(as_array(name, X), dtype=dtype)
    if X.ndim != 2 or X.shape[0] != D or X.shape[1] < 1:
        raise LvflowError(f"{name}: expected a sequence of shape ({D}, N) (features × tokens), got {tuple(X.shape)}")
    return X


Activation = Callable[[Array], Array]


# ---------------------------------------------------------------------------------------------
# low-rank teachers (`AbstractLearnedMap.draw_teacher`)


def orthonormal(rng: np.random.Generator, n: int, r: int) -> np.ndarray:
    """`r` orthonormal columns in `R^n`, Haar-distributed (drawn with numpy from `rng`)."""
    q, rr = np.linalg.qr(rng.standard_normal((n, r)))
    return q * np.sign(np.diagonal(rr))


def teacher_neurons(p: int, pieces: Sequence[tuple[int, np.ndarray]], r: int) -> np.ndarray:
    """`r` teacher neurons `Z (p, r)` from blocks `[(start, (n_i, r) array)]`, zero elsewhere."""
    Z = np.zeros((p, r))
    for start, blk in pieces:
        Z[start : start + blk.shape[0]] = blk
    return Z


@persistent_jit
def _factors(model: AbstractLearnedMap, X):
    E = model.map_basis()
    a, b, p = E.shape[0], E.shape[1], E.shape[-1]
    scalar = model.out_size is None
    if isinstance(model, AbstractSeparableMap):
        features = jax.vmap(model.shared_features)(X)
        jac = jax.jacfwd(model.output_slices)(jnp.zeros((a, b), E.dtype))  # (k, F, a, b)
        basis = jnp.einsum("cfab,abij->cfij", jac, E)
        return features, basis[0] if scalar else basis
    features = jax.vmap(model.map_features)(X).reshape(X.shape[0], -1, a * b)
    return (features[:, 0] if scalar else features), E.reshape(a * b, p, p)
