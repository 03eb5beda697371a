"""`nqf_from_data`: the NQF (Eq. 26) of a built-in architecture on a dataset, `A_μ = A(x_μ)` from
the architecture's closed-form structure matrix (Table 3)."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import architectures
from .._core.errors import LvflowError
from .._core.validate import as_array, check_positive_int, to_jax
from .._form.nqf import NQF


def _key():
    # Any key: only `structure(x)` is used, and it does not depend on the weights.
    return jax.random.PRNGKey(0)


def _vectors(x) -> None:
    if x.ndim != 2:
        raise LvflowError(f"x: expected shape (m, n) (one input vector per row), got {x.shape}")


def _scalar_output(label: str, k) -> None:
    if k is not None:
        raise LvflowError(f"y: {label} has a scalar output, so y must have shape (m,), got (m, {k})")


def _mlp(x, k, kernel, value_size):
    if x.ndim < 2:
        raise LvflowError(f"x: expected shape (m, n) or (m, H, W) (flattened), got {x.shape}")
    return architectures.MLP(math.prod(x.shape[1:]), 1, k, key=_key())


def _cnn(x, k, kernel, value_size):
    if x.ndim != 3:
        raise LvflowError(f"x: expected shape (m, H, W) (one single-channel image per sample), got {x.shape}")
    if kernel is None:
        raise LvflowError("kernel: the cnn architecture needs the kernel shape (--kernel KH KW)")
    return architectures.CNN(tuple(x.shape[1:]), tuple(int(v) for v in kernel), 1, k, key=_key())


def _scalar_vectors(name: str):
    """The builder of the scalar-output architecture `lvflow.architectures.<name>` (loaded when
    first built: the package loads each architecture on first use)."""

    def build(x, k, kernel, value_size):
        _scalar_output(name, k)
        _vectors(x)
        return getattr(architectures, name)(x.shape[1], 1, key=_key())

    return build


def _sensing(x, k, kernel, value_size):
    _scalar_output("matrix sensing", k)
    if x.ndim != 3 or x.shape[1] != x.shape[2]:
        raise LvflowError(f"x: expected shape (m, n, n) (one square sensing matrix S_a per sample), got {x.shape}")
    return architectures.MatrixSensing(x.shape[1], 1, key=_key())


def _attention(x, k, kernel, value_size):
    if x.ndim != 3:
        raise LvflowError(f"x: expected shape (m, D, N) (one sequence of N tokens of size D per sample), got {x.shape}")
    # key_size 1: at small init the softmax is uniform to first order, so the query and key
    # blocks of A(X) vanish (Prop 2) and their size does not enter the NQF
    return architectures.MultiHeadAttention(x.shape[1], 1, value_size, 1, k, key=_key())


class _Builtin(NamedTuple):
    """A built-in architecture of `nqf_from_data`: the data shapes it expects (in words), its
    `builder(x, k, kernel, value_size)` of a module in `lvflow.architectures` (`k`: the output
    dimension, `None` for scalar `y`), whether the module reads each sample `flat`, the shape
    of a neuron's input side, `input_side(x_shape, kernel)` (`None` where it has none), and
    whether it takes a `kernel` shape."""

    inputs: str
    build: Callable[..., Any]
    flat: bool = False
    input_side: Callable[[tuple[int, ...], Any], tuple[int, ...] | None] = lambda x_shape, kernel: None
    kernel: bool = False


# The width is irrelevant: `A(x)` is the same for every neuron (Thm 1), so a one-neuron module is built.
_ARCHITECTURES = {
    "mlp": _Builtin(
        "x (m, n), or (m, H, W) images (flattened); y (m,) or (m, k)",
        _mlp,
        flat=True,
        input_side=lambda x_shape, kernel: tuple(int(v) for v in x_shape[1:]),  # the input
    ),
    "cnn": _Builtin(
        "x (m, H, W) single-channel images, with --kernel KH KW; y (m,) or (m, k)",
        _cnn,
        input_side=lambda x_shape, kernel: None if kernel is None else tuple(int(v) for v in kernel),  # the kernel
        kernel=True,
    ),
    "diagonal": _Builtin("x (m, n); y (m,)", _scalar_vectors("DiagonalLinear")),
    "signed-diagonal": _Builtin("x (m, n); y (m,)", _scalar_vectors("SignedDiagonal")),
    "quadratic": _Builtin("x (m, n); y (m,)", _scalar_vectors("QuadraticNet")),
    "sensing": _Builtin("x (m, n, n) square sensing matrices; y (m,)", _sensing),
    "attention": _Builtin(
        "x (m, D, N) sequences of N tokens (columns) of size D, query = last token, with --value-size; "
        "y (m,) or (m, k)",
        _attention,
    ),
}


def architecture_names() -> list[str]:
    """Built-in architectures `nqf_from_data` accepts."""
    return list(_ARCHITECTURES)


def architecture_inputs() -> dict[str, str]:
    """Each built-in architecture's expected data shapes, for `lvflow predict --list-architectures`."""
    return {name: a.inputs for name, a in _ARCHITECTURES.items()}


def kernel_architectures() -> list[str]:
    """The built-in architectures that take a kernel shape (`--kernel`)."""
    return [name for name, b in _ARCHITECTURES.items() if b.kernel]


def input_side_shape(architecture: str, x_shape: tuple[int, ...], kernel=None) -> tuple[int, ...] | None:
    """The shape of a neuron's input side for `architecture` on inputs of shape `x_shape`
    (`(m, …)`): the input for an MLP, the kernel for a CNN; `None` for the others."""
    return _ARCHITECTURES[architecture].input_side(x_shape, kernel)


def _xy(arrays: Mapping[str, np.ndarray], name: str) -> tuple[np.ndarray | jax.Array, np.ndarray | jax.Array]:
    keys = {k.lower(): k for k in arrays}
    if set(keys) == {""}:
        a = as_array(name, arrays[""], ndim=2)
        if a.shape[1] < 2:
            raise LvflowError(
                f"{name}: a header-less table needs input columns then a target column, got shape {a.shape}"
            )
        return a[:, :-1], a[:, -1]
    if "x" not in keys or "y" not in keys:
        raise LvflowError(f"{name}: expected arrays 'x' (inputs) and 'y' (targets), found {sorted(arrays)}")
    x = as_array(f"{name}: x", arrays[keys["x"]])
    y = as_array(f"{name}: y", arrays[keys["y"]], ndim=(1, 2))
    if x.ndim == 1:
        x = x[:, None]
    if x.shape[0] != y.shape[0]:
        raise LvflowError(f"{name}: x has {x.shape[0]} samples but y has {y.shape[0]}")
    return x, y


def nqf_from_data(
    architecture: str, arrays: Mapping[str, Any], *, kernel=None, value_size: int = 1, name: str = "data"
) -> NQF:
    """The NQF of a built-in architecture on a dataset: `A_μ = A(x_μ)` from the architecture's
    closed-form `structure` (Table 3), targets `y_μ` (Eq. 26).

    **Arguments:** `architecture` (see `architecture_names()`), `arrays` with `x` of shape
    `(m, …)` and `y` of shape `(m,)` or `(m, k)` (or one unnamed table whose last column is
    `y`), `kernel` for the CNN, `value_size` (`d_v` of each head) for attention. Learned-map
    architectures (MLP, CNN, attention) give a factored NQF (`A_c(x) = Σ_d Φ_d E_d`, Eq. 17).

    **Raises:** `LvflowError` for an unknown architecture or data of the wrong shape.
    """
    model, x, y = _model(architecture, arrays, kernel=kernel, value_size=value_size, name=name)
    if isinstance(model, architectures.AbstractLearnedMap):
        features, basis = model.factors(x)
        return NQF(features=features, basis=basis, y=y)
    A = jax.vmap(model.structure)(jnp.asarray(x))
    return NQF(A, y)


def _model(architecture: str, arrays: Mapping[str, Any], *, kernel, value_size, name: str):
    """The architecture's module sized for the data, and the data (`x` flattened for the MLP)."""
    names = architecture_names()
    if architecture not in names:
        raise LvflowError(f"architecture: unknown {architecture!r}; built-in: {', '.join(names)}")
    x, y = _xy(arrays, name)
    if x.shape[0] == 0:
        raise LvflowError(f"{name}: holds no samples")
    k = None if y.ndim == 1 else y.shape[1]
    value_size = check_positive_int("value_size", value_size)
    builtin = _ARCHITECTURES[architecture]
    model = _weightless(lambda: builtin.build(x, k, kernel, value_size))
    if builtin.flat:
        x = x.reshape(x.shape[0], -1)
    return model, x, y


def _weightless(build):
    """The module `build()` returns, with zero weights `W` instead of random ones: `A(x)` does not
    depend on them (Thm 1). The constructor runs under `equinox.filter_eval_shape`, so that drawing
    the weights (the PRNG key, the normal sampler: one compiled program each) costs nothing; a
    module that holds another array (e.g. a random readout) is built as is."""
    shapes = eqx.filter_eval_shape(build)
    leaves = [leaf for leaf in jax.tree_util.tree_leaves(shapes) if isinstance(leaf, jax.ShapeDtypeStruct)]
    W = getattr(shapes, "W", None)
    if len(leaves) != 1 or not isinstance(W, jax.ShapeDtypeStruct):
        return build()
    return eqx.tree_at(lambda m: m.W, shapes, to_jax(np.zeros(W.shape, W.dtype)))


def architecture_network(
    architecture: str,
    arrays: Mapping[str, Any],
    *,
    kernel=None,
    value_size: int = 1,
    width: int | None = None,
    name: str = "data",
):
    """The built-in architecture's module sized for the data, with `width` neurons (default `p`;
    zero weights: only its configuration and width matter), and its inputs (flattened for the
    MLP), as `predict`'s `network=` and `inputs=`.

    **Raises:** as `nqf_from_data`.
    """
    model, x, _ = _model(architecture, arrays, kernel=kernel, value_size=value_size, name=name)
    d = model.p if width is None else check_positive_int("width", width)
    return eqx.tree_at(lambda n: n.W, model, to_jax(np.zeros((model.p, d)))), to_jax(x)
