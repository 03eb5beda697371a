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


#: Bytes of one float64.
_F64 = 8
_GIB = 2.0**30


def available_memory() -> int | None:
    """The bytes this process can still allocate without swapping or being killed: the least of
    the kernel's estimate of available memory (`MemAvailable` in `/proc/meminfo`, else free pages
    by `sysconf`), what a cgroup (v2 or v1) memory limit leaves, and the address-space limit
    (`ulimit -v`) less what is mapped now; `None` where none of them can be read.

    **Returns:** the bytes, or `None`.
    """
    import os
    import resource

    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, AttributeError):
            pass
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            with open(limit_file, encoding="ascii") as f:
                limit = f.read().strip()
            with open(usage_file, encoding="ascii") as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:  # "max" (v2) or a huge number (v1): no limit
            found.append(max(int(limit) - used, 0))
        break
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm", encoding="ascii") as f:
                mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            found.append(max(soft - mapped, 0))
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    return min(found) if found else None


def check_memory(name: str, nbytes: float, what: str) -> None:
    """Refuse, before allocating, an input whose run needs more memory than this machine has
    available (`available_memory`): one line naming the input, the estimate and what is there.

    **Arguments:**

    - `name`: the input that sets the size (an API name; the CLI shows its flag).
    - `nbytes`: the estimated peak bytes of the run (may be a float beyond any integer type).
    - `what`: the size in words, e.g. `"a curve of 2e8 samples of 2 modes"`.

    **Raises:** `LvflowError` `"{name}: {what} needs about N GiB, this machine has M GiB
    available"` when `nbytes` exceeds the memory available (nothing when it cannot be read).
    """
    avail = available_memory()
    if avail is None or not nbytes > avail:
        return
    raise LvflowError(f"{name}: {what} needs about {_gib(nbytes)} GiB, this machine has {_gib(avail)} GiB available")


def _gib(nbytes: float) -> str:
    """Bytes as GiB for a message: 3 significant digits, `1.2e+04` style beyond a million GiB."""
    return f"{nbytes / _GIB:.3g}"


def curve_bytes(modes: int, points: int) -> float:
    """The peak bytes `predict` (one configuration's `lvflow._sweep.evaluate.configuration`) needs
    for `modes` modes and a curve of `2·points − 1` samples: per sample, the modes' trajectories
    (about three float64 copies of every mode: measured 2.7 at 20000 modes) and about 16 float64
    for the times, the loss, the excess loss and the drops found on them (measured: 100 bytes a
    sample at 2 modes); about 1 KiB per mode for the schedule and the table. Exact Python
    integers: no overflow for any input.

    **Arguments:** `modes` (K), `points` (`num_points`).

    **Returns:** the bytes, as a float.
    """
    samples = max(2 * int(points) - 1, 2)
    return float(_F64 * (samples * (3 * int(modes) + 16) + 128 * int(modes)))
