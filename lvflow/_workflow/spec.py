"""The rules of a configuration of `predict`, written once: where its system comes from, how its
initial scale is given, and the ranges of its numbers.

The rules read configurations as columns (`Configurations`): `lvflow sweep` checks every
configuration of a plan at once, `predict()` and `lvflow predict` one (columns of length 1). Each
error names the input as the user wrote it (`spell`: the API name, or the command's flag) and, for
several configurations, the first that breaks the rule (`where`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._core.errors import LvflowError
from .._core.validate import as_array

#: The parameters that give a power-law spectrum (Thm 9), all three together.
POWER_LAW = ("alpha1", "alpha2", "modes")


def _nowhere(bad: np.ndarray) -> str:
    return ""


@dataclasses.dataclass(frozen=True)
class Configurations:
    """Configurations of `predict` as the rules read them.

    - `has(name)`: which configurations give parameter `name` (a boolean array of length `n`);
    - `column(name)`: its values (entries where it is not given are not read);
    - `spell(name)`: the parameter as the user wrote it (an API name, or a command-line flag);
    - `where(bad)`: the configurations `bad` (a boolean mask) in an error message, `""` for one.
    """

    has: Callable[[str], np.ndarray]
    column: Callable[[str], np.ndarray]
    spell: Callable[[str], str] = str
    where: Callable[[np.ndarray], str] = _nowhere

    @classmethod
    def one(cls, values: Mapping[str, Any], spell: Callable[[str], str] = str) -> Configurations:
        """One configuration from `values` (parameter → value; `None` is not given)."""

        def has(name: str) -> np.ndarray:
            return np.array([values.get(name) is not None])

        def column(name: str) -> np.ndarray:  # a finite real scalar, or one line naming the input
            v = values.get(name)
            return np.array([np.nan if v is None else float(as_array(spell(name), v, ndim=0))])

        return cls(has, column, spell)

    def fail(self, name: str, message: str, bad: np.ndarray) -> LvflowError:
        """The error for `bad` breaking the rule on `name`: `"{name}: {message}{where}"`."""
        return LvflowError(f"{self.spell(name)}: {message}{self.where(bad)}")


def check_source(cfg: Configurations) -> None:
    """Each configuration gives exactly one system: `system` (a gLV), `architecture` with `data`
    (an NQF, Eq. 17), or `alpha1`, `alpha2` and `modes` (a power-law spectrum, Thm 9); `kernel`
    and `value_size` only with an architecture.

    **Raises:** `LvflowError` naming the input and the (first) configuration that breaks a rule.
    """
    has, s = cfg.has, cfg.spell
    power = has("alpha1") | has("alpha2") | has("modes")
    arch = has("architecture") | has("data")
    count = power.astype(int) + has("system") + arch
    bad = count != 1
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        given = [s(n) for n in ("system", "architecture", "data", *POWER_LAW) if has(n)[i]]
        raise cfg.fail(
            "input",
            f"give exactly one of {s('system')}, {s('architecture')} with {s('data')}, or "
            f"{s('alpha1')}, {s('alpha2')} and {s('modes')} (got {', '.join(given) or 'none'})",
            bad,
        )
    for name in POWER_LAW:
        miss = power & ~has(name)
        if np.any(miss):
            others = ", ".join(s(n) for n in POWER_LAW)
            raise cfg.fail(name, f"required for a power-law spectrum ({others})", miss)
    miss = has("architecture") & ~has("data")
    if np.any(miss):
        raise cfg.fail("data", f"required with {s('architecture')} (a file of inputs x and targets y)", miss)
    for name in ("data", "kernel", "value_size"):
        lone = has(name) & ~has("architecture")
        if np.any(lone):
            raise cfg.fail(name, f"only used with {s('architecture')}", lone)


#: Pairs of parameters that set the same thing (`c_k`, or the initial scale): at most one of each.
_EXCLUSIVE = (("c", "z0"), ("c", "beta"), ("beta", "z0"))


def check_initial_scale(cfg: Configurations) -> None:
    """Each configuration gives its initial scale one way: `eps` (with `c` or `beta` for `c_k`),
    `z0`, or `init_std` with `width` (`ε = d σ²`).

    **Raises:** `LvflowError` naming the input and the (first) configuration that breaks a rule.
    """
    has, s = cfg.has, cfg.spell
    given = has("eps").astype(int) + has("z0") + has("init_std")
    if np.any(given > 1):
        raise cfg.fail("initial scale", f"give only one of {s('eps')}, {s('z0')}, {s('init_std')}", given > 1)
    if np.any(given == 0):
        raise cfg.fail("eps", f"required (or give {s('z0')}, or {s('init_std')} with {s('width')})", given == 0)
    lone = has("width") & ~has("init_std")
    if np.any(lone):
        raise cfg.fail("width", f"only meaningful together with {s('init_std')}", lone)
    miss = has("init_std") & ~has("width")
    if np.any(miss):
        raise cfg.fail("width", f"required with {s('init_std')} (the number of neurons d; ε = d σ²)", miss)
    for a, b in _EXCLUSIVE:
        both = has(a) & has(b)
        if np.any(both):
            raise cfg.fail(a, f"give either {s(a)} or {s(b)}, not both", both)


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric parameter may take: `ok(v)` elementwise, described by `what`."""

    ok: Callable[[np.ndarray], np.ndarray]
    what: str


def _open_unit(v):
    return (v > 0) & (v < 1)


def _positive(v):
    return v > 0


def _at_least(m: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda v: v >= m


#: The range of every numeric parameter of a configuration.
RANGES: dict[str, Range] = {
    "eps": Range(_open_unit, "must lie in (0, 1)"),
    "rho": Range(_open_unit, "must lie in (0, 1)"),
    "alpha2": Range(_positive, "must be positive"),
    "modes": Range(_at_least(1), "must be a positive integer"),
    "value_size": Range(_at_least(1), "must be a positive integer"),
    "width": Range(_at_least(1), "must be a positive integer"),
    "init_std": Range(_positive, "must be positive"),
    "learning_rate": Range(_positive, "must be positive"),
    "t1": Range(_positive, "must be positive"),
    "rtol": Range(_positive, "must be positive"),
    "atol": Range(_positive, "must be positive"),
    "num_points": Range(_at_least(2), "must be an integer ≥ 2"),
}


def check_ranges(cfg: Configurations, names: tuple[str, ...] = tuple(RANGES)) -> None:
    """Every given value of the parameters `names` lies in its `RANGES` entry.

    **Raises:** `LvflowError` `"{name}: {what}, got {v}"` for the first value out of range.
    """
    for name in names:
        rows = cfg.has(name)
        if not np.any(rows):
            continue
        v = cfg.column(name)
        with np.errstate(invalid="ignore"):
            bad = rows & ~np.asarray(RANGES[name].ok(np.where(rows, v, np.nan)), dtype=bool)
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise cfg.fail(name, f"{RANGES[name].what}, got {float(v[i]):g}", bad)


def check_configurations(cfg: Configurations) -> None:
    """`check_source`, `check_initial_scale` and `check_ranges`, in that order."""
    check_source(cfg)
    check_initial_scale(cfg)
    check_ranges(cfg)
