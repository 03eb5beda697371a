"""Memory checks before a run: what this machine can still allocate, and what a run needs.

Standard library only (no numpy, no JAX), so that argument parsing (`lvflow sweep`'s grid) can
refuse a size before the numerical stack is imported.
"""

from __future__ import annotations

import os

from .errors import LvflowError

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
    import resource  # POSIX only: imported where used

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
    """The peak bytes `predict` (one configuration's `lvflow._workflow.predict_kernel.configuration`) needs
    for `modes` modes and a curve of `2·points − 1` samples: per sample, the modes' trajectories
    (three float64 copies of every mode) and 16 float64 for the times, the loss, the excess loss
    and the drops found on them; 1 KiB per mode for the schedule and the table
    (`docs/devdocs/memory.md` has the measurements behind these counts). Exact Python integers: no
    overflow for any input.

    **Arguments:** `modes` (K), `points` (`num_points`).

    **Returns:** the bytes, as a float.
    """
    samples = max(2 * int(points) - 1, 2)
    return float(_F64 * (samples * (3 * int(modes) + 16) + 128 * int(modes)))
