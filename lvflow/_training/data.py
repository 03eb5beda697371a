"""Deterministic-from-seed datasets: Gaussian inputs per architecture, the low-rank NQF teacher
(Fig 2), the tanh teacher–student stream (Fig 6), the Fourier-feature task (Fig 5) and
odd-vs-even digits (Fig 7, offline real data)."""

import math
from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._core.errors import LvflowError
from .._core.validate import as_array, check_positive
from ..architectures import MLP, AbstractArchitecture, AbstractLearnedMap, AbstractSeparableMap
from .deep import AbstractDeepModel


class AbstractDataset(eqx.Module):
    """Inputs `X` (samples on axis 0) and targets `y`, shape `(m,)` or `(m, k)`: what `lvflow.train`
    accepts as `data` besides an `(X, y)` pair. `X, y = dataset` unpacks it."""

    X: eqx.AbstractVar[Array]
    y: eqx.AbstractVar[Array]

    @property
    def m(self) -> int:
        """The number of samples `m`."""
        return self.X.shape[0]

    def __iter__(self):  # so that `X, y = dataset` works
        return iter((self.X, self.y))


class Dataset(AbstractDataset):
    """Inputs `X` (samples on axis 0) and targets `y`, shape `(m,)` or `(m, k)`."""

    X: Array
    y: Array


def _rng(seed) -> np.random.Generator:
    """Data are drawn with numpy from an integer seed: deterministic, and no JAX compilation."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise LvflowError(f"seed: expected a non-negative int, got {seed!r}")
    return np.random.default_rng(int(seed))


def _check_m(m) -> int:
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m <= 0:
        raise LvflowError(f"m: the number of samples must be a positive integer, got {m!r}")
    return int(m)


def input_shape(model, *, seq_len: int | None = None) -> tuple[int, ...]:
    """Shape of ONE input of `model` (attention needs `seq_len` tokens): its `sample_shape`.

    MLP, mixture of experts, deep MLP: `(n,)`; CNN: `(H, W)`; attention: `(D, N)`; FourierMLP: `()`.

    **Raises:** `LvflowError` when `model` is neither an `lvflow.architectures.AbstractArchitecture`
    (NQF twins included) nor an `lvflow.AbstractDeepModel`, or `seq_len` is missing.
    """
    if not isinstance(model, (AbstractArchitecture, AbstractDeepModel)):
        raise LvflowError(
            f"model: cannot infer the input shape of a {type(model).__name__} (not an "
            "lvflow.architectures.AbstractArchitecture or lvflow.AbstractDeepModel); pass inputs explicitly"
        )
    return model.sample_shape(seq_len=seq_len)


def gaussian_inputs(
    model, m: int, *, seed: int | np.random.Generator = 0, seq_len: int | None = None
) -> Float[Array, "m ..."]:
    """`m` inputs with i.i.d. `N(0, 1)` entries, shaped for `model` (see `input_shape`)."""
    shape = input_shape(model, seq_len=seq_len)
    return jnp.asarray(_rng(seed).standard_normal((_check_m(m),) + shape))


# ---------------------------------------------------------------------------------------------
# The low-rank NQF teacher (Fig 2)


class LowRankTeacher(AbstractDataset):
    """A rank-`r` NQF teacher for an architecture and its dataset (Fig 2).

    Every built-in architecture's output is, to second order, `f_c(x) = ⟨Θ, Φ_c(x)⟩`: a matrix
    `Θ` — an off-diagonal block of `M = W Wᵀ` between the input side and the output side of a
    neuron (partially traced for attention) — read by linear features `Φ_c(x)`:

    | model | `Θ` | `Φ_c(x)` |
    |---|---|---|
    | MLP | `Σ_i u_i v_iᵀ` (n × k) | `φ'(0) x e_cᵀ` |
    | CNN | `Σ_i k_i v_iᵀ` | `φ'(0) (Σ_p x_p) e_cᵀ` |
    | multi-head attention | `Σ_i W_iᴠᵀ v_i` (D × k) | `x̄ e_cᵀ` |
    | QK-only attention | `Σ_i W_iᴷᵀ W_iᑫ` (D × D) | `u_c xᵀ/√d_k`, `u_c = Σ_X c_c` |
    | mixture of experts | `Σ_i r_i vec(Θ_i)ᵀ` (D × kD) | `ψ'(0) x (e_c ⊗ x)ᵀ` |

    The teacher is `Θ* = U diag(s) Vᵀ`, realised by `r` teacher neurons `Z` (`M* = Z Zᵀ`), and
    the labels are `y_c(x) = Tr[M* A_c(x)] = ⟨Θ*, Φ_c(x)⟩` (Cor. 1).

    The recovered singular values (`recovered`) are measured from a model's outputs alone, so
    that a network and its NQF are measured the same way: `Θ̂` is the least-squares fit of
    `f_c(x_μ) ≈ ⟨Θ, Φ_c(x_μ)⟩` over the dataset (minimum norm; output by output when, as for
    all but QK attention, each output reads its own slice of `Θ`), and `ŝ_j = u_jᵀ Θ̂ v_j`. This is a
    fixed linear functional of the outputs, `ŝ_j = Σ_{μ,c} R_{jμc} f_c(x_μ)`; on the teacher's
    own labels it returns `s` exactly.

    Fields: `X`, `y` (the dataset), `s`, `U`, `V`, `Theta` (`Θ*`), `Z` (teacher neurons,
    `(p, r)`), `readout` `R` (`(r, m, k)`).
    """

    X: Array
    y: Array
    s: Float[Array, " r"]
    U: Array
    V: Array
    Theta: Array
    Z: Array
    readout: Array

    @property
    def data(self) -> Dataset:
        return Dataset(self.X, self.y)

    def singular_values(self, outputs: Float[ArrayLike, "..."]) -> Float[Array, "... j"]:
        """`ŝ` from model outputs on `X`, shape `(*n, m)` or `(*n, m, k)` (optionally with leading
        time axes `*n`); returns shape `(*n, r)`."""
        outputs = jnp.asarray(outputs)
        out = outputs if self.y.ndim == 2 else outputs[..., None]
        return jnp.einsum("jmc,...mc->...j", self.readout, out)

    def recovered(self, model) -> Float[Array, " r"]:
        """`ŝ_j = u_jᵀ Θ̂ v_j` of `model` (usable as `train(..., record=teacher.recovered)`)."""
        return self.singular_values(jax.vmap(model)(self.X))


def low_rank_teacher(
    model,
    m: int,
    *,
    s=(1.0, 0.5, 0.25, 0.125),
    seed=0,
    seq_len: int | None = None,
    X=None,
    rtol: float = 1e-8,
) -> LowRankTeacher:
    """A rank-`len(s)` NQF teacher with singular values `s` for `model`, and `m` Gaussian samples.

    Labels `y_c(x) = Tr[M* A_c(x)]` with `M* = Z Zᵀ` whose relevant block `Θ*` has singular values
    `s` (see `LowRankTeacher`). `Z` is checked against `model.structure` on the first samples.

    **Arguments:** `model` (an `lvflow.architectures.AbstractLearnedMap`: MLP, CNN,
    MultiHeadAttention, QKAttention, MixtureOfExperts), `m` samples, singular values `s` (default
    `(1, ½, ¼, ⅛)`, Fig 2), `seed` (int), `seq_len` (attention), `X` (own inputs instead of
    Gaussian ones), `rtol` of the identifiability check.

    **Returns:** a `LowRankTeacher` (a dataset: pass it to `lvflow.train` as `data`).

    **Raises:** `LvflowError` when `model` is not an `AbstractLearnedMap`, `s` is not positive,
    the rank exceeds the block, or `m` is too small for `ŝ` to be identifiable from outputs
    (the teacher's own `ŝ` must return `s`).
    """
    if not isinstance(model, AbstractLearnedMap):
        raise LvflowError(
            f"model: no low-rank teacher is defined for a {type(model).__name__} "
            "(not an lvflow.architectures.AbstractLearnedMap)"
        )
    s = np.asarray(as_array("s", s, ndim=1), dtype=float)
    r = s.shape[0]
    if r == 0 or bool(np.any(s <= 0)):
        raise LvflowError(f"s: singular values must be positive, got {np.asarray(s)}")
    a, b = model.map_shape
    if r > min(a, b):
        raise LvflowError(f"s: rank {r} exceeds the {a}×{b} learned block of this {type(model).__name__}")
    rng = _rng(seed)
    if X is None:
        X = gaussian_inputs(model, _check_m(m), seed=rng, seq_len=seq_len)
    else:
        X = jnp.asarray(as_array("X", X))
    U, V, Z = model.draw_teacher(rng, s)
    Theta = (U * s) @ V.T
    separable = isinstance(model, AbstractSeparableMap)
    features = model.shared_features if separable else model.map_features
    Phi, y_check = _teacher_arrays(features, model.structure, X, jnp.asarray(Z))
    Phi = np.asarray(Phi)  # (m, F) if separable, else (m, k, a, b)
    mm = Phi.shape[0]
    G = np.einsum("aj,bj->jab", U, V)  # u_j v_jᵀ
    # Readout: ŝ_j = ⟨u_j v_jᵀ, Θ̂⟩ with Θ̂ = pinv(Φ) f (least squares, minimum norm).
    if separable:
        y = Phi @ np.asarray(model.output_slices(Theta)).T  # (m, k)
        k = y.shape[1]
        Gs = np.stack([np.asarray(model.output_slices(g)) for g in G])  # (r, k, F)
        readout = np.einsum("fm,jcf->jmc", np.linalg.pinv(Phi, rcond=1e-10), Gs)
    else:
        y = np.einsum("mcab,ab->mc", Phi, Theta)
        k = Phi.shape[1]
        readout = (G.reshape(r, a * b) @ np.linalg.pinv(Phi.reshape(mm * k, a * b), rcond=1e-10)).reshape(r, mm, k)
    # The embedding is the definition of the labels: check it against the closed-form A.
    if not np.allclose(np.asarray(y_check), y[:2], rtol=1e-10, atol=1e-10 * float(np.max(np.abs(y)))):
        raise LvflowError(f"model: the teacher embedding does not reproduce Tr[M* A(x)] for a {type(model).__name__}")
    s_back = np.einsum("jmc,mc->j", readout, y)
    err = float(np.max(np.abs(s_back - s) / s))
    if not err <= rtol:
        raise LvflowError(
            f"m: {mm} samples do not identify the {a}×{b} learned map from outputs (teacher's ŝ off by "
            f"{err:.2g} relative); use more samples"
        )
    if model.out_size is None:
        y = y[:, 0]
    arr = jnp.asarray
    return LowRankTeacher(X=X, y=arr(y), s=arr(s), U=arr(U), V=arr(V), Theta=arr(Theta), Z=arr(Z), readout=arr(readout))


@eqx.filter_jit
def _teacher_arrays(features, structure, X, Z):
    """Features of all samples, and `Tr[Z Zᵀ A_c(x)]` on the first two (one compile)."""
    A = jax.vmap(structure)(X[:2])
    A = A if A.ndim == 4 else A[:, None]
    return jax.vmap(features)(X), jnp.einsum("mcij,ir,jr->mc", A, Z, Z)


# ---------------------------------------------------------------------------------------------
# Teacher–student stream (Fig 6)


class TeacherStream(eqx.Module):
    """Online data: fresh Gaussian inputs labelled by a fixed teacher model, `stream(key, n)`.

    Pass it as `data` to `lvflow.train` with `batch_size` and `key` for online SGD (Fig 6).
    """

    teacher: Callable
    shape: tuple[int, ...] = eqx.field(static=True)

    def __call__(self, key: PRNGKeyArray, n: int) -> tuple[Array, Array]:
        X = jax.random.normal(key, (n,) + self.shape)
        return X, jax.vmap(self.teacher)(X)


def teacher_student_stream(
    in_size: int = 20,
    width: int = 100,
    out_size: int | None = None,
    *,
    seed=0,
    activation=jnp.tanh,
    readout_scale: float | None = None,
) -> TeacherStream:
    """Fig 6's teacher: a tanh MLP `in_size → width → out_size` (default 20 → 100 → 1, scalar).

    Teacher weights are standard (LeCun) scale: `u_i ~ N(0, I/in_size)`, `v_i ~ N(0, s²)` with
    `s = readout_scale`, by default `1/√width`, so that pre-activations and outputs are O(1).
    A larger readout (Fig 6 uses `s = 1`) makes the target O(√width): a student must grow until
    its activation's curvature matters, which is where it leaves its NQF.
    """
    if readout_scale is None:
        readout_scale = 1 / math.sqrt(width)
    else:
        readout_scale = check_positive("readout_scale", readout_scale)
    teacher = MLP(
        in_size,
        width,
        out_size,
        key=jax.random.PRNGKey(_rng(seed).integers(2**31)),
        init_scale=1.0,
        activation=activation,
    )
    k = 1 if out_size is None else out_size
    W = teacher.W
    scale = jnp.concatenate([jnp.full(in_size, 1 / math.sqrt(in_size)), jnp.full(k, readout_scale)])
    teacher = eqx.tree_at(lambda t: t.W, teacher, W * scale[:, None])
    return TeacherStream(teacher, (teacher.in_size,))


# ---------------------------------------------------------------------------------------------
# Fourier-feature task (Fig 5)


def fourier_task(*, M: int = 256, P: int = 64, beta: float = 1.5) -> Dataset:
    """Fig 5's regression task: inputs on the grid `x_j = j/M`, `j = 0..M−1`, target
    `y(x) = Σ_{k=1}^{P} k^{−β} ψ_k(x)`, `ψ_k(x) = √2 cos(2πkx)`. Inputs are scalars, `X` of shape `(M,)`."""
    for name, v in (("M", M), ("P", P)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise LvflowError(f"{name}: must be a positive integer, got {v!r}")
    beta = float(as_array("beta", beta, ndim=0))
    x = jnp.arange(M, dtype=float) / M
    k = jnp.arange(1, P + 1, dtype=float)
    psi = math.sqrt(2) * jnp.cos(2 * jnp.pi * k[None, :] * x[:, None])
    return Dataset(x, psi @ k ** (-beta))


# ---------------------------------------------------------------------------------------------
# Odd vs even digits (Fig 7, offline real data)


#: `digits_parity`'s layouts: the `(m, 64)` pixels arranged for each architecture
_DIGIT_LAYOUTS = {
    "flat": lambda X: X,  # (m, 64): MLP
    "image": lambda X: X.reshape(-1, 8, 8),  # (m, 8, 8): CNN
    "sequence": lambda X: X.reshape(-1, 8, 8).transpose(0, 2, 1),  # X[:, :, n] = image row n: attention
}


def digits_parity(*, layout: str = "flat", m: int | None = None, seed=0) -> Dataset:
    """scikit-learn's bundled 8×8 digits (1797 images, no download), label `+1` odd, `−1` even.

    Pixels are standardised per feature over the dataset (constant pixels become 0).
    `layout`: `"flat"` `(m, 64)` (MLP), `"image"` `(m, 8, 8)` (CNN), `"sequence"` `(m, 8, 8)` with
    image rows as tokens, i.e. columns of `X ∈ R^{8×8}` (attention). `m`: a random subset
    of that size (deterministic from `seed`); default all.
    """
    from sklearn.datasets import load_digits

    arrange = _DIGIT_LAYOUTS.get(layout) if isinstance(layout, str) else None
    if arrange is None:
        raise LvflowError(f"layout: expected 'flat', 'image' or 'sequence', got {layout!r}")
    data, target = load_digits(return_X_y=True)
    X = np.asarray(data, dtype=float)
    mean, std = X.mean(0), X.std(0)
    X = (X - mean) / np.where(std > 0, std, 1.0)
    y = np.where(target % 2 == 1, 1.0, -1.0)
    if m is not None:
        m = _check_m(m)
        if m > X.shape[0]:
            raise LvflowError(f"m: only {X.shape[0]} digits are available, asked for {m}")
        idx = _rng(seed).permutation(X.shape[0])[:m]
        X, y = X[idx], y[idx]
    return Dataset(jnp.asarray(arrange(X)), jnp.asarray(y))
