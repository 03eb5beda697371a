"""Attention: multi-head attention, query–key-only heads, and attention logits (Props 2–4, Table 3).

Conventions shared by the three modules: an input is one sequence `X ∈ R^{D×N}` whose columns
are the `N` tokens; the query is the **last token** `x = X[:, -1]` (the position being
predicted, as in causal attention), and it attends to all `N` tokens, itself included. The
score of token `n` is `s_n = x_nᵀ Wᴷᵀ Wᑫ x / √d_k`. Weight matrices are packed into a neuron
row-major, in the order listed.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._core.errors import LvflowError
from .._core.validate import as_array
from ._base import (
    AbstractArchitecture,
    AbstractLearnedMap,
    AbstractSeparableMap,
    AbstractSumForm,
    AbstractVectorOutput,
    bilinear,
    check_out_size,
    check_sequence,
    check_size,
    init_W,
    normal,
    orthonormal,
    per_output,
    teacher_neurons,
    unpack,
)


def sequence_shape(D: int, seq_len: int | None) -> tuple[int, int]:
    """The shape `(D, N)` of one sequence of `N = seq_len` tokens.

    **Raises:** `LvflowError` when `seq_len` is `None`.
    """
    if seq_len is None:
        raise LvflowError("seq_len: required for attention models (the number of tokens N)")
    return (D, int(seq_len))


def centered_softmax(s: Float[ArrayLike, "N ..."]) -> Float[Array, "N ..."]:
    """`softmax(s) − 1/N` over axis 0 (the `N` tokens; any trailing axes, e.g. heads, are
    batched), accurate to relative precision when `s` is tiny.

    Written as `(e_n − ē) / (N (1 + ē))` with `e = expm1(s − c)`: the difference of two numbers
    close to `1/N` would lose everything below `1e-16 · N`, while the NQF regime has `|s| ~ |W|²`.
    The shift `c = max s` (gradient stopped; the value does not depend on it) prevents overflow.
    """
    s = jnp.asarray(s)
    c = jax.lax.stop_gradient(jnp.max(s, axis=0, keepdims=True))
    e = jnp.expm1(s - c)
    ebar = jnp.mean(e, axis=0, keepdims=True)
    return (e - ebar) / (s.shape[0] * (1.0 + ebar))


class MultiHeadAttention(AbstractVectorOutput, AbstractSeparableMap):
    """Multi-head attention read out at the last token: `f(X) = Σ_i v_iᵀ W_iᴠ X softmax(s_i)`,

    `s_i = Xᵀ W_iᴷᵀ W_iᑫ x / √d_k`, `x = X[:, -1]`. A head is a neuron,
    `w_i = [vec Wᑫ (d_k×D), vec Wᴷ (d_k×D), vec Wᴠ (d_v×D), vec v (d_v×k, or d_v)]`.

    At `W = 0` the softmax is uniform, so to second order the head is `vᵀ Wᴠ x̄` with
    `x̄ = X 1/N`; the structure matrix (Prop 2, Eq. 8) has only the `(Wᴠ, v)` block,

    `A⁽ᶜ⁾ = ½ [[0, (I_{d_v} ⊗ x̄) ⊗ e_cᵀ], [·ᵀ, 0]]`

    (`x̄ ⊗ I_{d_v}` in the paper's column-major vec). `Wᑫ` and `Wᴷ` enter at fourth order, and
    the sign flip of a whole head leaves it unchanged, so the NQF error is `O(|W|⁴)`. The learned
    map is `Θ = Σ_i W_iᴠᵀ v_i` (`D × k`), read by `Φ_c(X) = x̄ e_cᵀ`.

    **Arguments:**

    - `in_size` `D`, `key_size` `d_k`, `value_size` `d_v`, `num_heads` `d`, `out_size` `k`
      (`None`: scalar). Paper, Fig 2: `MultiHeadAttention(20, 8, 20, 4, 8)` on sequences of 16.
    - `key`, `init_scale`: `W ~ N(0, init_scale²)`.
    """

    W: Float[Array, "p d"]
    in_size: int = eqx.field(static=True)
    key_size: int = eqx.field(static=True)
    value_size: int = eqx.field(static=True)
    _out_size: int | None = eqx.field(static=True)

    def __init__(self, in_size, key_size, value_size, num_heads, out_size=None, *, key: PRNGKeyArray, init_scale=0.01):
        self.in_size = check_size("in_size", in_size)
        self.key_size = check_size("key_size", key_size)
        self.value_size = check_size("value_size", value_size)
        heads = check_size("num_heads", num_heads)
        self._out_size = check_out_size(out_size)
        p = sum(int(math.prod(s)) for s in self._shapes)
        self.W = init_W(key, p, heads, init_scale)

    @property
    def _shapes(self):
        D, dk, dv, k = self.in_size, self.key_size, self.value_size, self._out_size
        return [(dk, D), (dk, D), (dv, D), (dv,) if k is None else (dv, k)]

    def sample_shape(self, *, seq_len: int | None = None) -> tuple[int, int]:
        return sequence_shape(self.in_size, seq_len)

    def unit(self, w: Float[ArrayLike, " p"], X: Float[ArrayLike, "D N"]) -> Float[Array, "*k"]:
        Wq, Wk, Wv, v = unpack(w, self._shapes)
        X = jnp.asarray(X)
        s = (Wk @ X).T @ (Wq @ X[:, -1]) / math.sqrt(self.key_size)
        return (Wv @ (X @ jax.nn.softmax(s))) @ v

    def __call__(self, X: Float[ArrayLike, "D N"]) -> Float[Array, "*k"]:
        X = check_sequence("X", X, self.in_size)
        Wq, Wk, Wv, v = unpack(self.W, self._shapes)  # head axis h last
        q = jnp.einsum("jbh,b->jh", Wq, X[:, -1])
        s = jnp.einsum("jh,jbh,bn->nh", q, Wk, X) / math.sqrt(self.key_size)
        z = jnp.einsum("abh,bn,nh->ah", Wv, X, jax.nn.softmax(s, axis=0))
        return jnp.einsum("ah,a...h->...", z, v)

    def _scores(self, Wq, Wk, X) -> Float[Array, "N h"]:
        q = jnp.einsum("jbh,b->jh", Wq, X[:, -1])
        return jnp.einsum("jh,jbh,bn->nh", q, Wk, X) / math.sqrt(self.key_size)

    def next_order(self, X=None) -> int:
        """4: the scores are quadratic in `Wᑫ, Wᴷ`, and a head is even in its weights (Thm 13)."""
        return 4

    def expansion_term(self, X: Float[ArrayLike, "D N"], order: int) -> Float[Array, "*k"]:
        """Thm 13's order-`k` term (Eq. 203, `λ = (k)`) in closed form for `k ≤ 4`: 0 for odd `k`,
        `Σ_i v_iᵀ W_iᴠ x̄` for `k = 2`, and the softmax's first term `Σ_i v_iᵀ W_iᴠ X (s_i − s̄_i)/N`
        for `k = 4`; other orders by differentiation."""
        X = check_sequence("X", X, self.in_size)
        Wq, Wk, Wv, v = unpack(self.W, self._shapes)
        N = X.shape[1]
        if order % 2 == 1:
            return jnp.zeros(() if self._out_size is None else (self._out_size,), dtype=self.W.dtype)
        if order == 2:
            z = jnp.einsum("abh,b->ah", Wv, jnp.mean(X, axis=1))
        elif order == 4:
            s = self._scores(Wq, Wk, X)
            z = jnp.einsum("abh,bn,nh->ah", Wv, X, s - jnp.mean(s, axis=0, keepdims=True)) / N
        else:
            return AbstractSumForm.expansion_term(self, X, order)
        return jnp.einsum("ah,a...h->...", z, v)

    def structure(self, X: Float[ArrayLike, "D N"]) -> Float[Array, "*k p p"]:
        X = check_sequence("X", X, self.in_size, dtype=self.W.dtype)
        xbar = jnp.mean(X, axis=1)
        C = per_output(jnp.kron(jnp.eye(self.value_size, dtype=X.dtype), xbar[:, None]), self._out_size)
        start = 2 * self.key_size * self.in_size  # after Wᑫ, Wᴷ
        return bilinear(
            self.p, (start, start + self.value_size * self.in_size), (start + self.value_size * self.in_size, self.p), C
        )

    def learned_map(self) -> Float[Array, "D k"]:
        _, _, Wv, v = unpack(self.W, self._shapes)  # (d_v, D, h), (d_v, [k,] h)
        return jnp.einsum("adh,a...h->d...", Wv, v).reshape(self.in_size, -1)

    def map_features(self, X: Float[ArrayLike, "D N"]) -> Float[Array, "k D k"]:
        return jnp.einsum("a,cb->cab", jnp.mean(X, axis=1), np.eye(self._k))

    def shared_features(self, X: Float[ArrayLike, "D N"]) -> Float[Array, " D"]:
        return jnp.mean(X, axis=1)

    def output_slices(self, Theta: Float[ArrayLike, "D k"]) -> Float[Array, "k D"]:
        return jnp.asarray(Theta).T

    def draw_teacher(self, rng: np.random.Generator, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Head j: Wᴠ = √s_j e_1 u_jᵀ, v = √s_j e_1 v_jᵀ, so Θ = Σ_i W_iᴠᵀ v_i = U S Vᵀ.
        D, r = self.in_size, len(s)
        U, V = orthonormal(rng, D, r), orthonormal(rng, self._k, r)
        start = 2 * self.key_size * D  # Wᑫ = Wᴷ = 0; row 0 of Wᴠ (d_v × D) and of v (d_v × k), row-major
        Z = teacher_neurons(self.p, [(start, U * np.sqrt(s)), (start + self.value_size * D, V * np.sqrt(s))], r)
        return U, V, Z


class QKAttention(AbstractVectorOutput, AbstractLearnedMap):
    """Query–key-only attention: heads with a fixed value readout `c`, `Σ_i cᵀ X softmax(s_i)`.

    `s_i = Xᵀ W_iᴷᵀ W_iᑫ x / √d_k`, `x = X[:, -1]`; neuron `w_i = [vec Wᑫ (d_k×D), vec Wᴷ (d_k×D)]`.
    The readout `c ∈ R^D` (or `R^{D×k}`) is not trained (its gradient is stopped).

    A head at `W = 0` outputs the constant `cᵀ x̄`, which no neuron can change; each unit is
    therefore centred, `unit(w, X) = cᵀ X (softmax(s) − 1/N)`, so that `unit(0, X) = 0` as the
    sum form needs, and `model(X) = f0(X) + Σ_i unit(w_i, X)` with `f0(X) = d cᵀ x̄` (`f0`
    method). `__call__` returns the centred sum `Σ_i unit(w_i, X)` (subtract `f0` from targets,
    or add it to outputs). Structure matrix (Prop 3, Eq. 10), with `Σ_X = X Xᵀ/N − x̄ x̄ᵀ`, `u = Σ_X c`:

    `A = 1/(2√d_k) [[0, I_{d_k} ⊗ x uᵀ], [I_{d_k} ⊗ u xᵀ, 0]]`

    (`x uᵀ ⊗ I_{d_k}` in the paper's column-major vec), one per column of `c`. The softmax's next
    term is quadratic in the scores, so the NQF error is `O(|W|⁴)`. The learned map is
    `Θ = Σ_i W_iᴷᵀ W_iᑫ` (`D × D`), read by `Φ_c(X) = u_c xᵀ/√d_k`.

    **Arguments:**

    - `in_size` `D`, `key_size` `d_k`, `num_heads` `d`, `out_size` `k` (`None`: scalar).
      Paper, Fig 2: `QKAttention(20, 8, 1, 8)` (a single head) on sequences of 16; Fig 6:
      `QKAttention(16, 8, 4)` on sequences of 10; Fig 7: `QKAttention(28, 32, 10)` on 28 tokens.
    - `readout`: the fixed `c`, shape `(D,)` or `(D, k)`; default `N(0, 1/D)` drawn from `key`.
    - `key`, `init_scale`: `W ~ N(0, init_scale²)`.
    """

    W: Float[Array, "p d"]
    readout: Float[Array, "D *k"]  # noqa: F821 (jaxtyping's variadic dims)
    in_size: int = eqx.field(static=True)
    key_size: int = eqx.field(static=True)
    _out_size: int | None = eqx.field(static=True)

    def __init__(
        self, in_size, key_size, num_heads, out_size=None, *, readout=None, key: PRNGKeyArray, init_scale=0.01
    ):
        self.in_size = check_size("in_size", in_size)
        self.key_size = check_size("key_size", key_size)
        heads = check_size("num_heads", num_heads)
        self._out_size = check_out_size(out_size)
        wkey, ckey = jax.random.split(key)
        shape = (self.in_size,) if self._out_size is None else (self.in_size, self._out_size)
        if readout is None:
            readout = normal(ckey, shape) / math.sqrt(self.in_size)
        else:
            readout = as_array("readout", readout)
            if tuple(readout.shape) != shape:
                raise LvflowError(
                    f"readout: expected shape {shape} (D{'' if self._out_size is None else ', k'}), "
                    f"got {tuple(readout.shape)}"
                )
        self.readout = jnp.asarray(readout, dtype=float)
        self.W = init_W(wkey, 2 * self.key_size * self.in_size, heads, init_scale)

    @property
    def _shapes(self):
        return [(self.key_size, self.in_size)] * 2

    @property
    def _c(self):
        return jax.lax.stop_gradient(self.readout)

    def sample_shape(self, *, seq_len: int | None = None) -> tuple[int, int]:
        return sequence_shape(self.in_size, seq_len)

    def f0(self, X: Float[ArrayLike, "D N"]) -> Float[Array, "*k"]:
        """`f_X(0) = d cᵀ x̄`: the output of all heads at `W = 0` (not included in `__call__`)."""
        X = check_sequence("X", X, self.in_size)
        return self.d * (jnp.mean(X, axis=1) @ self._c)

    def unit(self, w: Float[ArrayLike, " p"], X: Float[ArrayLike, "D N"]) -> Float[Array, "*k"]:
        Wq, Wk = unpack(w, self._shapes)
        X = jnp.asarray(X)
        s = (Wk @ X).T @ (Wq @ X[:, -1]) / math.sqrt(self.key_size)
        return (X @ centered_softmax(s)) @ self._c

    def __call__(self, X: Float[ArrayLike, "D N"]) -> Float[Array, "*k"]:
        X = check_sequence("X", X, self.in_size)
        Wq, Wk = unpack(self.W, self._shapes)
        q = jnp.einsum("jbh,b->jh", Wq, X[:, -1])
        s = jnp.einsum("jh,jbh,bn->nh", q, Wk, X) / math.sqrt(self.key_size)
        return jnp.sum(X @ centered_softmax(s), axis=1) @ self._c

    def next_order(self, X=None) -> int:
        """4: the softmax's second term is quadratic in the scores, themselves quadratic in `W` (Thm 13)."""
        return 4

    def expansion_term(self, X: Float[ArrayLike, "D N"], order: int) -> Float[Array, "*k"]:
        """Thm 13's order-`k` term (Eq. 203, `λ = (k)`) in closed form for `k ≤ 4`, from
        `softmax(s) = 1/N + t/N + (t² − mean(t²))/(2N) + O(t³)`, `t = s − s̄`: 0 for odd `k`,
        `Σ_i cᵀ X t_i/N` for `k = 2`, `Σ_i cᵀ X (t_i² − mean(t_i²))/(2N)` for `k = 4`; other orders
        by differentiation."""
        X = check_sequence("X", X, self.in_size)
        N = X.shape[1]
        if order % 2 == 1:
            return jnp.zeros(() if self._out_size is None else (self._out_size,), dtype=self.W.dtype)
        if order not in (2, 4):
            return AbstractSumForm.expansion_term(self, X, order)
        Wq, Wk = unpack(self.W, self._shapes)
        q = jnp.einsum("jbh,b->jh", Wq, X[:, -1])
        t = jnp.einsum("jh,jbh,bn->nh", q, Wk, X) / math.sqrt(self.key_size)
        t = t - jnp.mean(t, axis=0, keepdims=True)
        if order == 2:
            a = jnp.sum(t, axis=1) / N
        else:
            a = jnp.sum(t**2 - jnp.mean(t**2, axis=0, keepdims=True), axis=1) / (2 * N)
        return (X @ a) @ self._c

    def structure(self, X: Float[ArrayLike, "D N"]) -> Float[Array, "*k p p"]:
        X = check_sequence("X", X, self.in_size, dtype=self.W.dtype)
        N = X.shape[1]
        xbar = jnp.mean(X, axis=1)
        Sigma = X @ X.T / N - jnp.outer(xbar, xbar)
        u = Sigma @ self._c  # (D,) or (D, k)
        xu = jnp.einsum("a,b...->...ab", X[:, -1], u)  # x uᵀ, one per output
        eye = jnp.eye(self.key_size, dtype=X.dtype)
        C = jnp.einsum("jl,...ab->...jalb", eye, xu).reshape(xu.shape[:-2] + (self.p // 2, self.p // 2))
        n = self.p // 2
        return bilinear(self.p, (0, n), (n, self.p), C / math.sqrt(self.key_size))

    def learned_map(self) -> Float[Array, "D D"]:
        Wq, Wk = unpack(self.W, self._shapes)  # (d_k, D, h) each
        return jnp.einsum("jah,jbh->ab", Wk, Wq)

    def map_features(self, X: Float[ArrayLike, "D N"]) -> Float[Array, "k D D"]:
        c = self.readout if self.readout.ndim == 2 else self.readout[:, None]
        X = jnp.asarray(X)
        N = X.shape[1]
        xbar = jnp.mean(X, axis=1)
        u = (X @ X.T / N - jnp.outer(xbar, xbar)) @ c  # (D, k)
        return jnp.einsum("ac,b->cab", u, X[:, -1]) / math.sqrt(self.key_size)

    def draw_teacher(self, rng: np.random.Generator, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Head j: Wᑫ = √s_j e_1 v_jᵀ, Wᴷ = √s_j e_1 u_jᵀ, so Θ = Σ_i W_iᴷᵀ W_iᑫ = U S Vᵀ.
        D, r = self.in_size, len(s)
        U, V = orthonormal(rng, D, r), orthonormal(rng, D, r)
        return U, V, teacher_neurons(self.p, [(0, V * np.sqrt(s)), (self.key_size * D, U * np.sqrt(s))], r)


class AttentionLogits(AbstractArchitecture):
    """Single-head attention logits of the last token: `s = Xᵀ Wᴷᵀ Wᑫ x / √d_k ∈ R^N`.

    The neurons are the `d_k` rows of `Wᑫ, Wᴷ ∈ R^{d_k×D}`: `w_j = [wᑫ_j, wᴷ_j] ∈ R^{2D}`, so
    `s_n = Σ_j (wᑫ_jᵀ x)(wᴷ_jᵀ x_n) / √d_k` with `d_k = d` the number of neurons. The logits are
    exactly quadratic in `W`; per logit `n` (Prop 4's Eq. 12 with the key token `u = x_n`):

    `A⁽ⁿ⁾ = 1/(2√d_k) [[0, x x_nᵀ], [x_n xᵀ, 0]]`.

    **Arguments:**

    - `in_size` `D`, `key_size` `d_k` (= `d`, the number of neurons), `seq_len` `N` (= `out_size`).
    - `key`, `init_scale`: `W ~ N(0, init_scale²)`.
    """

    W: Float[Array, "p d"]
    in_size: int = eqx.field(static=True)
    seq_len: int = eqx.field(static=True)

    def __init__(self, in_size, key_size, seq_len, *, key: PRNGKeyArray, init_scale=0.01):
        self.in_size = check_size("in_size", in_size)
        key_size = check_size("key_size", key_size)
        self.seq_len = check_size("seq_len", seq_len)
        self.W = init_W(key, 2 * self.in_size, key_size, init_scale)

    @property
    def out_size(self) -> int:
        return self.seq_len

    def sample_shape(self, *, seq_len: int | None = None) -> tuple[int, int]:
        return (self.in_size, self.seq_len)

    def _check(self, X, dtype=None):
        X = check_sequence("X", X, self.in_size, dtype=dtype)
        if X.shape[1] != self.seq_len:
            raise LvflowError(f"X: expected {self.seq_len} tokens (seq_len), got shape {tuple(X.shape)}")
        return X

    def unit(self, w: Float[ArrayLike, " p"], X: Float[ArrayLike, "D N"]) -> Float[Array, " N"]:
        wq, wk = unpack(w, [(self.in_size,)] * 2)
        X = jnp.asarray(X)
        return (wq @ X[:, -1]) * (wk @ X) / math.sqrt(self.d)

    def __call__(self, X: Float[ArrayLike, "D N"]) -> Float[Array, " N"]:
        X = self._check(X)
        Wq, Wk = unpack(self.W, [(self.in_size,)] * 2)  # (D, d_k) each
        return (X.T @ Wk) @ (Wq.T @ X[:, -1]) / math.sqrt(self.d)

    def next_order(self, X=None) -> None:
        """`None`: the logits are exactly quadratic in `W` (no term beyond the NQF, Thm 13)."""
        return None

    def structure(self, X: Float[ArrayLike, "D N"]) -> Float[Array, "N p p"]:
        X = self._check(X, dtype=self.W.dtype)
        C = jnp.einsum("a,bn->nab", X[:, -1], X) / math.sqrt(self.d)
        return bilinear(self.p, (0, self.in_size), (self.in_size, self.p), C)
