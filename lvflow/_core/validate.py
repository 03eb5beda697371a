"""Input checks shared by every public entry point.

They run on concrete (non-traced) arrays only: inside `jit` the values are unknown,
so the checks are skipped there and the public wrappers call them before tracing.
"""

from __future__ import annotations

import jax
import numpy as np

from .errors import LvflowError, NotPSDError, SymmetryError


def _is_concrete(x) -> bool:
    """False for a JAX tracer (inside `jit`/`vmap`), whose values are unknown."""
    return not isinstance(x, jax.core.Tracer)


def as_array(
    name: str, x, *, ndim: int | tuple[int, ...] | None = None, allow_bool: bool = True
) -> np.ndarray | jax.Array:
    """`x` as a float array, finite, with the given number of dimensions (booleans refused with
    `allow_bool=False`: `True` is no growth rate)."""
    if x is None:
        raise LvflowError(f"{name}: is None, expected an array")
    if not _is_concrete(x):
        return x
    a = np.asarray(x)
    if a.dtype == bool and not allow_bool:
        raise LvflowError(f"{name}: boolean values, expected numbers")
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
        raise LvflowError(f"{name}: not a numeric array (dtype {a.dtype})")
    if np.iscomplexobj(a):
        raise LvflowError(f"{name}: complex values are not supported (dtype {a.dtype})")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if a.ndim not in allowed:
            raise LvflowError(f"{name}: expected {' or '.join(map(str, allowed))} dimensions, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
        raise LvflowError(f"{name}: contains {bad} non-finite value(s) (NaN or inf)")
    return a


def check_symmetric(name: str, a, *, rtol: float = 1e-8) -> None:
    """Last two axes of `a` symmetric to `rtol` of its scale."""
    if not _is_concrete(a):
        return
    a = np.asarray(a)
    scale = max(float(np.max(np.abs(a))), np.finfo(float).tiny) if a.size else 1.0
    err = float(np.max(np.abs(a - np.swapaxes(a, -1, -2)))) if a.size else 0.0
    if err > rtol * scale:
        raise SymmetryError(f"{name}: not symmetric (max |a - aᵀ| = {err:.3g}, scale {scale:.3g})")


def check_psd(name: str, a, *, rtol: float = 1e-8) -> None:
    """`a` symmetric positive semi-definite, up to `rtol` of its largest eigenvalue."""
    if not _is_concrete(a):
        return
    from .._glv.interaction import is_diagonal

    a = np.asarray(a, dtype=float)
    # O(K): a diagonal matrix is PSD iff its diagonal is ≥ 0 (no O(K³) eigenvalues)
    if a.ndim == 2 and a.shape[0] == a.shape[1] and is_diagonal(a):
        lo = float(np.min(np.diagonal(a))) if a.size else 0.0
        if lo < 0:
            raise NotPSDError(f"{name}: not positive semi-definite (diagonal entry {lo:.3g} < 0)")
        return
    check_symmetric(name, a, rtol=max(rtol, 1e-10))
    eig = np.linalg.eigvalsh((a + np.swapaxes(a, -1, -2)) / 2)
    scale = max(float(np.max(np.abs(eig))), np.finfo(float).tiny) if eig.size else 1.0
    lo = float(np.min(eig)) if eig.size else 0.0
    if lo < -rtol * scale:
        raise NotPSDError(f"{name}: not positive semi-definite (smallest eigenvalue {lo:.3g}, largest {scale:.3g})")


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
