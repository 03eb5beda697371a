"""The abstract piece of a sweep: a *family* of gLV systems whose configurations share one shape.

A sweep's configurations are grouped by everything that fixes array shapes or compiled code (the
number of modes `K`, the structure of `C`, how `c` is given, the curve's length, the tolerances);
each group is evaluated in batches by one compiled, vmapped function. A family turns the rows of a
group into batched host arrays (`inputs`) and, inside that function, one row's arrays back into
the system's growth rates `r`, the diagonal `C_kk` and, for the ODE path, the system itself
(`system`). `families.py` has the two families: power-law spectra built on the device from
`(α₁, α₂)`, and systems given as files, Python objects or architecture + data.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from jaxtyping import Array, Float

from .._glv.interaction import AbstractInteraction
from .._glv.lv import LotkaVolterra, LowRankLotkaVolterra

if TYPE_CHECKING:
    from .families import Resolved

#: a concrete gLV a sweep evaluates: `C` dense or `Diag(d) + UUᵀ`
System = LotkaVolterra | LowRankLotkaVolterra


class Init(enum.Enum):
    """How a configuration gives `c` in `z_k0 = ε c_k` (Thm 8); the value names it in the manifest."""

    ONES = "ones"  # c_k = 1
    BETA = "beta"  # c_k = k^{−β} (Thm 9)
    ARRAY = "array"  # per mode, from `c` or `z0`


class Schedule(enum.Enum):
    """The ε → 0 schedule a sweep reports (`sweep(schedule=...)`, the value): `LIMIT` (as `predict`),
    `CORRECTED` (the finite-ε one, `plateau_schedule(corrected=True)` per configuration) or `NONE`."""

    LIMIT = "limit"
    CORRECTED = "corrected"
    NONE = "none"


class AbstractFamily(abc.ABC):
    """Systems of `K` modes with one structure of `C`, the class of their interaction:
    `DiagonalInteraction` (Thm 6, closed form), `LowRankInteraction` (`Diag(d) + UUᵀ`, `q`
    columns) or `DenseInteraction`; `structure` names it in the sweep's outputs.

    Subclasses provide `key` (hashable: part of the compiled function's identity), `inputs`,
    `system` and `host_system`.
    """

    K: int
    interaction: type[AbstractInteraction]
    structure: str
    q: int = 0
    #: the modes ignite in index order with `τ*_k = 1/r_k` (Eq. 168), so the ε → 0 schedule is
    #: computed on the device; otherwise it is `plateau_schedule` on the host
    ascending_tau: bool = False
    #: the loss's minimiser over `z ≥ 0` is unique, hence the flow's limit (`predict_kernel.loss_floor`);
    #: otherwise `z(∞)` is `z(t1)` of a first solve
    z_inf_known: bool = True

    @property
    @abc.abstractmethod
    def key(self) -> tuple:
        """What fixes shapes and code: equal keys share one compiled function."""

    @abc.abstractmethod
    def inputs(self, rows: np.ndarray, res: Resolved) -> dict[str, np.ndarray]:
        """Host arrays for configurations `rows` (leading axis: the batch)."""

    @abc.abstractmethod
    def system(self, x: Mapping[str, Array]) -> tuple[Float[Array, " K"], Float[Array, " K"], System | None]:
        """Inside the traced, vmapped evaluation: `(r, C_kk, lv)` for one row `x` of `inputs`;
        `lv` is the `AbstractLotkaVolterra` the ODE path integrates (`None` for a diagonal `C`)."""

    @abc.abstractmethod
    def host_system(self, row: int, res: Resolved) -> System:
        """The concrete system of configuration `row` (for host-side work: the ε → 0 schedule)."""
