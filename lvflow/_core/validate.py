"""Input checks shared by every public entry point.

A check reads concrete values with numpy and raises its error at once. Under a JAX
transformation (`jit`, `vmap`, `grad`) the values are unknown when the check runs: the same
predicate is then computed by JAX and attached to the returned array with `equinox.error_if`,
which raises when the values exist. Shapes and dtypes are checked in both cases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from .errors import LvflowError, NotPSDError, SymmetryError
from .memory import check_memory as check_memory, curve_bytes as curve_bytes  # one import for callers

_T = TypeVar("_T")
_A = TypeVar("_A", bound=np.ndarray | jax.Array)


def _namespace(*arrays) -> Any:
    """`jax.numpy` when one of `arrays` is traced (its values unknown), else `numpy` (which reads
    concrete values without compiling anything per shape)."""
    return jnp if any(isinstance(a, Tracer) for a in arrays) else np


def to_jax(x) -> jax.Array:
    """`jnp.asarray(x)` without compiling anything: a numpy array (or scalar) is copied to the device
    with `jax.device_put` (same dtype), where `jnp.asarray` would compile and run one small program per
    shape and dtype (~10 ms each on a CPU, the persistent cache notwithstanding); anything else
    (a JAX array, a tracer, a list) goes through `jnp.asarray`."""
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype != object:
        return jax.device_put(x, may_alias=False)  # a copy, as jnp.asarray makes
    return jnp.asarray(x)


def fail_if(
    x: _T, bad, msg: str, *, detail: Callable[[], str] | None = None, error: type[Exception] = LvflowError
) -> _T:
    """Refuse `x` where the boolean (array) `bad` has a true entry.

    With known values (`bad` concrete) the error is raised at once; under a JAX transformation
    `bad` is traced and the check is attached to the returned `x` by `equinox.error_if` (it runs
    when the values exist, and only if the return value is used). Gradients pass through.

    **Arguments:**

    - `x`: the array (or PyTree of arrays) the check guards.
    - `bad`: the predicate, computed from `x` with operations numpy and JAX share.
    - `msg`: the one-line message (`"{input}: {problem}"`).
    - `detail`: a message with values in it, used instead of `msg` when the values are known.
    - `error`: the exception raised with known values (an `LvflowError` subclass, or `SolverError`).

    **Returns:** `x`, carrying the check when traced.

    **Raises:** `error` when `bad` is concrete and has a true entry.
    """
    if isinstance(bad, Tracer):
        return eqx.error_if(x, bad, msg)
    if np.any(bad):
        raise error(msg if detail is None else detail())
    return x


def is_diagonal(C: np.ndarray) -> bool:
    """Whether the concrete square matrix `C` has no non-zero off-diagonal entry (O(K²) reads, no copy
    when `C` is contiguous)."""
    K = C.shape[0]
    # The off-diagonal entries, as a strided view: flat[1:] in rows of K + 1, minus the last column.
    return K < 2 or not np.any(np.ascontiguousarray(C).ravel()[1:].reshape(K - 1, K + 1)[:, :-1])


def as_array(
    name: str, x, *, ndim: int | tuple[int, ...] | None = None, allow_bool: bool = True
) -> np.ndarray | jax.Array:
    """`x` as a numeric array (a numpy array, or the JAX array itself when traced), finite, with the
    given number of dimensions.

    **Arguments:** `name` (the input, for the message); `x`; `ndim`: the allowed numbers of
    dimensions (`None`: any); `allow_bool`: whether booleans are accepted (`True` is no growth rate).

    **Returns:** the array, carrying the finiteness check when traced (see `fail_if`).

    **Raises:** `LvflowError` for `None`, a non-numeric, boolean (with `allow_bool=False`) or complex
    dtype, another number of dimensions, or a NaN or infinite entry.
    """
    if x is None:
        raise LvflowError(f"{name}: is None, expected an array")
    a: np.ndarray | jax.Array = _namespace(*jax.tree_util.tree_leaves(x)).asarray(x)
    if a.dtype == bool and not allow_bool:
        raise LvflowError(f"{name}: boolean values, expected numbers")
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        raise LvflowError(f"{name}: not a numeric array (dtype {a.dtype})")
    if np.issubdtype(a.dtype, np.complexfloating):
        raise LvflowError(f"{name}: complex values are not supported (dtype {a.dtype})")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if a.ndim not in allowed:
            raise LvflowError(f"{name}: expected {' or '.join(map(str, allowed))} dimensions, got shape {a.shape}")
    if a.dtype == bool or np.issubdtype(a.dtype, np.integer):
        return a
    finite = abs(a) < np.inf  # False for NaN and ±inf, with numpy or JAX
    return fail_if(
        a,
        ~finite,
        f"{name}: contains non-finite values (NaN or inf)",
        detail=lambda: (
            f"{name}: contains {int(np.size(finite) - np.count_nonzero(finite))} non-finite value(s) (NaN or inf)"
        ),
    )


def check_symmetric(name: str, a: _A, *, rtol: float = 1e-8) -> _A:
    """Last two axes of `a` symmetric to `rtol` of its scale.

    **Returns:** `a`, carrying the check when traced (see `fail_if`).

    **Raises:** `SymmetryError` naming `max |a − aᵀ|` and the scale.
    """
    if np.size(a) == 0:
        return a
    xp = _namespace(a)
    arr = xp.asarray(a)
    scale = xp.maximum(abs(arr).max(), np.finfo(float).tiny)
    err = abs(arr - xp.swapaxes(arr, -1, -2)).max()
    return fail_if(
        a,
        err > rtol * scale,
        f"{name}: not symmetric",
        detail=lambda: f"{name}: not symmetric (max |a - aᵀ| = {float(err):.3g}, scale {float(scale):.3g})",
        error=SymmetryError,
    )


def check_psd(name: str, a: _A, *, rtol: float = 1e-8, attach: _A | None = None) -> _A:
    """`a` symmetric positive semi-definite, up to `rtol` of its largest eigenvalue.

    A concrete diagonal matrix is checked on its diagonal (O(K), no eigenvalues).

    **Arguments:** `name`; `a`, a `(p, p)` matrix (or a stack); `rtol`; `attach`: the array that
    carries the check when traced (default `a`; e.g. `M` when `a = M − μμᵀ/d` is a derived matrix).

    **Returns:** `attach` (or `a`), carrying the check when traced (see `fail_if`).

    **Raises:** `SymmetryError` when `a` is not symmetric, `NotPSDError` when an eigenvalue is below
    `−rtol · max |λ|`.
    """
    target = a if attach is None else attach
    xp = _namespace(a)
    arr = xp.asarray(a, dtype=float)
    if arr.size == 0:
        return target
    if xp is np and arr.ndim == 2 and arr.shape[0] == arr.shape[1] and is_diagonal(np.asarray(arr)):
        lo = float(np.min(np.diagonal(arr)))
        if lo < 0:
            raise NotPSDError(f"{name}: not positive semi-definite (diagonal entry {lo:.3g} < 0)")
        return target
    arr = check_symmetric(name, arr, rtol=max(rtol, 1e-10))
    eig = xp.linalg.eigvalsh((arr + xp.swapaxes(arr, -1, -2)) / 2)
    scale = xp.maximum(abs(eig).max(), np.finfo(float).tiny)
    lo = eig.min()
    return fail_if(
        target,
        lo < -rtol * scale,
        f"{name}: not positive semi-definite",
        detail=lambda: (
            f"{name}: not positive semi-definite (smallest eigenvalue {float(lo):.3g}, largest {float(scale):.3g})"
        ),
        error=NotPSDError,
    )


def check_nonnegative(
    name: str, x, *, ndim: int | tuple[int, ...] | None = None, what: str = "non-negative"
) -> np.ndarray | jax.Array:
    """`as_array(name, x, ndim=ndim)` with every entry `≥ 0`.

    **Returns:** the array, carrying the checks when traced (see `fail_if`).

    **Raises:** `LvflowError` as `as_array`, or `"{name}: must be non-negative, got v"` (the smallest entry).
    """
    a = as_array(name, x, ndim=ndim)
    return fail_if(
        a,
        a < 0,
        f"{name}: must be {what}",
        detail=lambda: f"{name}: must be {what}, got {float(np.min(a)):g}",
    )


def check_in_open_interval(name: str, v, lo: float, hi: float) -> float:
    """A float scalar strictly inside (lo, hi)."""
    v = float(as_array(name, v, ndim=0))
    if not (lo < v < hi):
        raise LvflowError(f"{name}: must lie in ({lo:g}, {hi:g}), got {v:g}")
    return v


def check_positive(name: str, v, *, allow_zero: bool = False) -> float:
    """A float scalar `> 0` (or `≥ 0` with `allow_zero`)."""
    v = float(as_array(name, v, ndim=0))
    if v < 0 or (v == 0 and not allow_zero):
        raise LvflowError(f"{name}: must be {'non-negative' if allow_zero else 'positive'}, got {v:g}")
    return v


def check_positive_int(name: str, v, *, minimum: int = 1, what: str | None = None) -> int:
    """An integer `≥ minimum` (booleans refused: `True` is not a count)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        need = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise LvflowError(f"{name}: must be {need}{f' ({what})' if what else ''}, got {v!r}")
    return int(v)
