"""Options shared by the benchmarks (set from the command line)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Config:
    """**Fields:**

    - `smoke`: tiny sizes (seconds; for CI), not meaningful timings.
    - `repeats`: warm timings take the best of this many runs.
    - `rtol`, `atol`: tolerances on `u = ln z`, the same for lvflow and scipy.
    - `cold`: also time a first call with JAX's compilation caches emptied.
    - `cases`: realdata runs only the cases whose name contains one of these (all if empty; the
      fresh-process row only then).
    """

    smoke: bool = False
    repeats: int = 3
    rtol: float = 1e-8
    atol: float = 1e-10
    cold: bool = True
    cases: tuple[str, ...] = ()

    def size(self, full, smoke):
        return smoke if self.smoke else full
