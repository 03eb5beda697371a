"""Timing, result rows, the table and the JSON record shared by every benchmark."""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from typing import Any, Callable

import jax
import numpy as np


@dataclasses.dataclass
class Row:
    """One line of the table: lvflow's time against a reference on the same problem.

    `ratio` is oriented so that larger is better for lvflow (speed-up, or for the physical
    limit `ideal / lvflow`); `target` is the ratio the issue asks for (None: informative row).
    """

    bench: str
    case: str
    lvflow_s: float
    reference: str
    reference_s: float
    ratio: float
    target: float | None = None
    note: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def met(self) -> bool | None:
        return None if self.target is None else bool(self.ratio >= self.target)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["met"] = self.met
        return d


def block(x):
    """Wait for every JAX array in `x` (asynchronous dispatch would otherwise time nothing)."""
    return jax.block_until_ready(x)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds for one call of `fn()` with its outputs ready, and the output."""
    t = time.perf_counter()
    out = block(fn())
    return time.perf_counter() - t, out


def best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float], Any]:
    """The best of `repeats` timed calls (the least disturbed by other load on a shared
    machine, as `timeit` advises), every time, and the last output."""
    times, out = [], None
    for _ in range(max(1, repeats)):
        s, out = timed(fn)
        times.append(s)
    return min(times), times, out


def cold(fn: Callable[[], Any]) -> tuple[float, Any]:
    """One call with JAX's compilation caches emptied first: tracing and compiling included."""
    jax.clear_caches()
    return timed(fn)


def max_rel_diff(a, b) -> float:
    """`max |a/b − 1|` over entries finite in both; inf if the finite patterns differ."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    fa, fb = np.isfinite(a), np.isfinite(b)
    if np.any(fa != fb):
        return float("inf")
    if not fa.any():
        return 0.0
    return float(np.max(np.abs(a[fa] / b[fa] - 1.0)))


def _git() -> dict[str, Any]:
    """The commit measured, and the lvflow and benchmark files that differ from it (a shared
    working tree)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "lvflow", "benchmarks"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return {}
    paths = [ln[3:] for ln in dirty if ln.strip()]
    return {
        "git_commit": head,
        **{f"{d}_uncommitted": [p for p in paths if p.startswith(d + "/")] for d in ("lvflow", "benchmarks")},
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def environment() -> dict[str, Any]:
    """What the numbers were measured on."""
    import scipy

    la = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "scipy": scipy.__version__,
        "numpy": np.__version__,
        "jax_backend": jax.default_backend(),
        "cpu_count": os.cpu_count(),
        "loadavg_1_5_15": la,
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        **_git(),
    }


def _fmt_s(s: float) -> str:
    if not np.isfinite(s):
        return "—"
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def _fmt_ratio(x: float) -> str:
    if not np.isfinite(x):
        return "—"
    return f"{x:.3g}×"


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (also what is printed)."""
    head = "| bench | case | lvflow | reference | reference time | ratio | target | met | note |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        tgt = "" if r.target is None else f"≥ {r.target:g}×"
        met = {None: "", True: "yes", False: "**no**"}[r.met]
        lines.append(
            f"| {r.bench} | {r.case} | {_fmt_s(r.lvflow_s)} | {r.reference} | {_fmt_s(r.reference_s)} "
            f"| {_fmt_ratio(r.ratio)} | {tgt} | {met} | {r.note} |"
        )
    return "\n".join(lines)
