"""The configurations of a sweep: its parameters (the inputs of `predict`), value lists, the expansion
of grids and lists into columns, the spec's hash, and the chunks.

A *spec* is one or more grids (each the Cartesian product of its value lists, the last parameter
varying fastest, as `itertools.product`) followed by an explicit list of configurations (for lists
that are not grids). Expanding it gives a `Plan`: one column per parameter, one row per
configuration, in that order; the row number is the configuration's `index` everywhere after.
Grids are expanded with index arithmetic, never a Python loop per configuration, so a 10⁶-point grid
costs milliseconds.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import math
import os
import typing
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from .._core.errors import LvflowError
from .._core.memory import check_memory, curve_bytes


class Kind(abc.ABC):
    """How a parameter's values are read from a spec, held in a column and marked missing."""

    #: the column's fill for a configuration that leaves the parameter out
    missing: Any = -1
    #: the column's dtype
    dtype: Any = np.int64

    @abc.abstractmethod
    def scalar(self, name: str, v: Any) -> Any:
        """One value, checked for this kind (not yet for its range).

        **Raises:** `LvflowError` naming `name` for a value of the wrong kind.
        """

    def items(self, v: Any) -> list:
        """The values a grid entry stands for, before each is read by `scalar`: a list or tuple
        is a list of values, a string may hold comma-separated values, anything else is one."""
        if isinstance(v, (list, tuple)):
            return list(v)
        if isinstance(v, str):
            return [s.strip() for s in v.split(",")]
        return [v]

    def values(self, name: str, item: Any) -> list:
        """The values one item stands for (several for a range)."""
        return [self.scalar(name, item)]

    def present(self, col: np.ndarray) -> np.ndarray:
        """Which entries of a column hold a value."""
        return col != self.missing

    def column(self, name: str, values: list, objects: dict[str, list], index: dict[tuple, int]) -> np.ndarray:
        """The column of `values` (configurations that give the parameter)."""
        return np.array(values, dtype=self.dtype)

    def shown(self, plan: Plan, name: str) -> np.ndarray:
        """The parameter's column as a table shows it (a file or Python value by its name)."""
        return plan.column(name)

    def entry(self, name: str, objects: dict[str, list], v: Any) -> Any:
        """A column entry as the configuration's value."""
        return v.item()

    def canon(self, v: Any) -> Any:
        """A JSON value that identifies `v` (for the spec's hash)."""
        return v


class _Number(Kind):
    """Numbers: also 1-D arrays of numbers and `lin:`/`log:` ranges."""

    #: "a number" / "an integer": what a text that does not parse is not
    noun: str = "a number"
    #: "a float" / "an int": what a value of another type was expected to be
    type_name: str = "a float"

    def items(self, v):
        if isinstance(v, np.ndarray) and v.ndim == 1:
            return list(v)
        return super().items(v)

    def values(self, name, item):
        if isinstance(item, str) and item.split(":", 1)[0] in _RANGES and ":" in item:
            return [self.scalar(name, x) for x in _range(name, item)]
        return [self.scalar(name, item)]

    @abc.abstractmethod
    def number(self, name: str, v: int | float | np.integer | np.floating) -> int | float:
        """`v` checked for this kind of number."""

    def parse(self, v: str) -> int | float:
        return float(v)

    def scalar(self, name, v):
        if isinstance(v, str):
            try:
                v = self.parse(v)
            except ValueError:
                raise LvflowError(f"{name}: not {self.noun}: {v!r}") from None
        if isinstance(v, np.ndarray) and v.ndim == 0:
            return self.scalar(name, v.item())
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise LvflowError(f"{name}: expected {self.type_name}, got {type(v).__name__}")
        return self.number(name, v)


@typing.final
class Float(_Number):
    """A real number (finite)."""

    missing = np.nan
    dtype = np.float64

    def number(self, name, v):
        if not math.isfinite(float(v)):
            raise LvflowError(f"{name}: must be finite, got {v!r}")
        return float(v)

    def present(self, col):
        return ~np.isnan(col)


@typing.final
class Int(_Number):
    """An integer within int64."""

    noun = "an integer"
    type_name = "an int"

    def parse(self, v):
        return int(v)

    def number(self, name, v):
        if not isinstance(v, (int, np.integer)) and not (math.isfinite(v) and float(v) == int(v)):
            raise LvflowError(f"{name}: must be an integer, got {v!r}")
        if not -(2**63) <= int(v) < 2**63:
            raise LvflowError(f"{name}: {v} is beyond a 64-bit integer's range (its size at most 2^63 - 1)")
        return int(v)

    def present(self, col):
        return col >= 0


@typing.final
class Name(Kind):
    """A non-empty name (an architecture)."""

    missing = ""
    dtype = str

    def scalar(self, name, v):
        if not isinstance(v, str) or not v:
            raise LvflowError(f"{name}: expected a name, got {v!r}")
        return v


@typing.final
class Kernel(Kind):
    """A kernel shape: a pair `(KH, KW)` or the text `KHxKW`, held as `KHxKW`."""

    missing = ""
    dtype = str

    def items(self, v):
        return [v] if isinstance(v, tuple) else super().items(v)

    def scalar(self, name, v):
        if isinstance(v, str):
            try:
                kh, kw = (int(x) for x in v.lower().split("x"))
            except ValueError:
                raise LvflowError(f"{name}: a kernel shape is KHxKW (for example 3x3), got {v!r}") from None
            v = (kh, kw)
        if not (isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, (int, np.integer)) for x in v)):
            raise LvflowError(f"{name}: a kernel shape is a pair (KH, KW) or 'KHxKW', got {v!r}")
        return f"{int(v[0])}x{int(v[1])}"


@typing.final
class Object(Kind):
    """A file name, or (from Python) an array, a gLV system or a mapping of arrays; the column
    holds the value's number among the parameter's distinct values (`Plan.objects`)."""

    def items(self, v):
        if isinstance(v, str) and "," not in v:
            return [v]
        return super().items(v)

    def scalar(self, name, v):
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        if isinstance(v, str) and not v:
            raise LvflowError(f"{name}: empty file name")
        return v

    def present(self, col):
        return col >= 0

    def shown(self, plan: Plan, name: str) -> np.ndarray:
        return plan.labels(name)

    def column(self, name, values, objects, index):
        return np.array([_intern(objects, index, name, v) for v in values], dtype=np.int64)

    def entry(self, name, objects, v):
        return objects[name][int(v)]

    def canon(self, v):
        if isinstance(v, str):
            try:
                digest = _sha(Path(v).read_bytes())
            except OSError:
                digest = None  # reported when the file is loaded
            return {"file": v, "sha256": digest}
        if isinstance(v, np.ndarray) or np.isscalar(v):
            return {"array": _array_sha(v)}
        if isinstance(v, Mapping):
            return {"arrays": {str(k): _array_sha(x) for k, x in sorted(v.items())}}
        import jax

        leaves = [x for x in jax.tree_util.tree_leaves(v) if isinstance(x, (np.ndarray, np.generic, jax.Array))]
        return {"object": type(v).__name__, "sha256": _sha("".join(_array_sha(x) for x in leaves).encode())}


FLOAT, INT, NAME, KERNEL, OBJECT = Float(), Int(), Name(), Kernel(), Object()


class Param(NamedTuple):
    """A sweepable input: its name in the Python API, its kind, the `lvflow sweep` flag, and help."""

    name: str
    kind: Kind
    flag: str
    help: str


#: The parameters of a configuration: the inputs of `predict` (and `solve_lv`'s tolerances).
PARAMETERS: dict[str, Param] = {
    p.name: p
    for p in (
        Param("alpha1", FLOAT, "--alpha1", "power-law spectrum: V_k = k^-alpha1 (Thm 9)"),
        Param("alpha2", FLOAT, "--alpha2", "power-law spectrum: r_k = k^-alpha2"),
        Param("modes", INT, "--modes", "power-law spectrum: number of modes K"),
        Param("system", OBJECT, "--system", "gLV system file(s) as for lvflow predict (r and C, or zeta and V)"),
        Param("architecture", NAME, "--architecture", "built-in architecture(s), with --data"),
        Param("data", OBJECT, "--data", "data file(s) (x, y) for --architecture"),
        Param("kernel", KERNEL, "--kernel", "kernel shape(s) KHxKW for --architecture cnn"),
        Param("value_size", INT, "--value-size", "value size d_v of a head, --architecture attention (default 1)"),
        Param("eps", FLOAT, "--eps", "initial scale eps in (0, 1): z_k(0) = eps c_k"),
        Param("beta", FLOAT, "--beta", "c_k = k^-beta (Thm 9's initialisation)"),
        Param("c", OBJECT, "--c", "file(s) of c_k per mode"),
        Param("z0", OBJECT, "--z0", "file(s) of z_k(0) per mode; eps = max z0"),
        Param("init_std", FLOAT, "--init-std", "weights ~ N(0, sigma^2) with --width d: eps = d sigma^2"),
        Param("width", INT, "--width", "number of neurons d, with --init-std"),
        Param("learning_rate", FLOAT, "--lr", "GD learning rate eta: steps = t/eta"),
        Param("rho", FLOAT, "--rho", "switch-on fraction (default 0.5)"),
        Param("t1", FLOAT, "--t1", "horizon (default: past the last switch-on, as predict)"),
        Param("num_points", INT, "--points", "samples of the loss curve, with --curve (default 400)"),
        Param("rtol", FLOAT, "--rtol", "relative tolerance of the ODE solve on ln z (default 1e-10)"),
        Param("atol", FLOAT, "--atol", "absolute tolerance of the ODE solve on ln z (default 1e-12)"),
    )
}

#: Other spellings accepted in specs (the flags of `lvflow predict`).
ALIASES = {"lr": "learning_rate", "points": "num_points", "init-std": "init_std", "learning-rate": "learning_rate"}

#: Defaults of `predict` for parameters a configuration leaves out.
DEFAULTS = {"rho": 0.5, "num_points": 400, "rtol": 1e-10, "atol": 1e-12}


def canonical_name(name: str) -> str:
    """The parameter's API name; `LvflowError` for an unknown one."""
    key = ALIASES.get(name, name)
    if key not in PARAMETERS:
        raise LvflowError(f"{name}: not a sweep parameter; known: {', '.join(PARAMETERS)}")
    return key


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


def _range(name: str, text: str) -> list[float]:
    """`lin:a:b:n` (n evenly spaced values from a to b) or `log:a:b:n` (log-spaced, a, b > 0)."""
    parts = text.split(":")
    if len(parts) != 4:
        raise LvflowError(f"{name}: a range is lin:START:STOP:COUNT or log:START:STOP:COUNT, got {text!r}")
    try:
        a, b, n = float(parts[1]), float(parts[2]), int(parts[3])
    except ValueError:
        raise LvflowError(f"{name}: cannot read the range {text!r} (START, STOP numbers, COUNT an integer)") from None
    if n < 1:
        raise LvflowError(f"{name}: a range needs COUNT ≥ 1, got {n}")
    check_values_memory(name, n, f"a range of {n} values")
    spacing = _RANGES.get(parts[0])
    if spacing is None:
        raise LvflowError(f"{name}: a range starts with lin: or log:, got {text!r}")
    if spacing is np.geomspace and not (a > 0 and b > 0):
        raise LvflowError(f"{name}: a log range needs START, STOP > 0, got {text!r}")
    return spacing(a, b, n).tolist()


_RANGES = {"lin": np.linspace, "log": np.geomspace}


def values_of(name: str, v: Any) -> list:
    """The list of values a grid entry stands for: a list/tuple (or 1-D array of numbers) is a list
    of values; a string may hold comma-separated values or a `lin:`/`log:` range; anything else is
    one value. For file/array parameters (`system`, `data`, `c`, `z0`) an array is *one* value (a
    vector `c` or `z0`); give several as a list. `kernel` takes `(KH, KW)` pairs or `'KHxKW'`."""
    kind = PARAMETERS[name].kind
    out = [x for item in kind.items(v) for x in kind.values(name, item)]
    if not out:
        raise LvflowError(f"{name}: no values given")
    if name == "modes" and all(isinstance(K, int) for K in out):
        K = max(out)
        check_memory(name, curve_bytes(K, 2), f"a power-law spectrum of {K} modes")
    return out


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------

#: Bytes a value of a range costs while it is read (a Python float in two lists), described (the
#: canonical spec, its JSON for the hash and the manifest) and held (the parameter's column).
VALUE_BYTES = 200
#: The least bytes a configuration costs from its expansion to the `SweepResult`: its columns in
#: the plan and the resolved sweep, and about 40 result columns (scalars and one mode's), read
#: back from the chunks and concatenated (twice). `run.Runner` refines it with the modes and curve.
ROW_BYTES = 2 * 8 * 48


def check_values_memory(name: str, count: int, what: str, *, per_value: int = VALUE_BYTES + ROW_BYTES) -> None:
    """Refuse `count` values or configurations before they are made, when a sweep of them needs
    more memory than this machine has available (`lvflow._core.memory.check_memory`); every
    value of a range becomes at least one configuration.

    **Raises:** `LvflowError` `"{name}: {what} needs about N GiB, this machine has M GiB available"`.
    """
    check_memory(name, float(count) * per_value, what)


# --------------------------------------------------------------------------------------------
# Expansion
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Plan:
    """Every configuration of a sweep, as columns.

    - `n`: the number of configurations; row `i` is configuration `index = i`.
    - `columns`: parameter → column of length `n` (float with NaN, int with −1, str with "" where a
      configuration leaves the parameter out; for a file/array parameter the index of its value
      in `objects`, −1 where absent).
    - `objects`: file/array parameter → its distinct values (file names or Python objects).
    - `definition`: the canonical, JSON-ready form of the spec (for the hash and the manifest).
    """

    n: int
    columns: dict[str, np.ndarray]
    objects: dict[str, list]
    definition: dict[str, Any]

    def has(self, name: str) -> np.ndarray:
        """Which configurations give `name`."""
        col = self.columns.get(name)
        if col is None:
            return np.zeros(self.n, bool)
        return PARAMETERS[name].kind.present(col)

    def column(self, name: str) -> np.ndarray:
        """The column of `name` (all missing if no configuration gives it)."""
        col = self.columns.get(name)
        if col is not None:
            return col
        kind = PARAMETERS[name].kind
        return np.full(self.n, kind.missing, dtype=kind.dtype)

    def labels(self, name: str) -> np.ndarray:
        """A file/array parameter as text: the file name, or `name[i]` for a Python value."""
        idx = self.column(name)
        names = np.array([_label(name, i, v) for i, v in enumerate(self.objects.get(name, []))] + [""], dtype=str)
        return names[idx]  # −1 → ""

    def shown(self, name: str) -> np.ndarray:
        """The column of `name` as a table shows it: files and Python values by name."""
        return PARAMETERS[name].kind.shown(self, name)

    def config(self, i: int) -> dict[str, Any]:
        """Configuration `i` as a dict of the parameters it gives."""
        out: dict[str, Any] = {}
        for name, col in self.columns.items():
            if not self.has(name)[i]:
                continue
            out[name] = PARAMETERS[name].kind.entry(name, self.objects, col[i])
        return out


def _label(name: str, i: int, v: Any) -> str:
    return v if isinstance(v, str) else f"{name}[{i}]"


def _intern(objects: dict[str, list], index: dict[tuple, int], name: str, v: Any) -> int:
    """`v`'s number among the objects of parameter `name`, appending it if new: a string is the
    same value as an equal string, anything else only itself (`is`). `index` maps `(name, key)`
    to the number, so that interning `n` values costs `O(n)`, not `O(n²)`."""
    lst = objects.setdefault(name, [])
    key = (name, "str", v) if type(v) is str else (name, "id", id(v))  # lst keeps v alive: ids stay unique
    i = index.get(key)
    if i is None:
        lst.append(v)
        i = index[key] = len(lst) - 1
    return i


def expand(grids: Sequence[Mapping[str, Any]] = (), configs: Sequence[Mapping[str, Any]] = ()) -> Plan:
    """The `Plan` of grids (each a mapping parameter → value or list of values; expanded as
    `itertools.product` in the mapping's order) followed by explicit configurations (each a
    mapping parameter → one value).

    **Raises:** `LvflowError` for an unknown parameter, a value of the wrong kind, or an empty spec.
    """
    objects: dict[str, list] = {}
    index: dict[tuple, int] = {}
    blocks: list[tuple[int, dict[str, np.ndarray]]] = []
    definition: dict[str, Any] = {"grids": [], "configs": []}
    for g in grids:
        if not isinstance(g, Mapping):
            raise LvflowError(f"grid: expected a mapping parameter → values, got {type(g).__name__}")
        axes = []
        for raw, v in g.items():
            name = canonical_name(str(raw))
            if any(name == a for a, _ in axes):
                raise LvflowError(f"{raw}: given twice in one grid")
            axes.append((name, values_of(name, v)))
        if not axes:
            continue
        sizes = [len(vals) for _, vals in axes]
        n = math.prod(sizes)  # a Python integer: no int64 overflow for a product of long lists
        if len(axes) > 1:
            check_values_memory(
                axes[int(np.argmax(sizes))][0],
                n,
                f"a grid of {' × '.join(map(str, sizes))} = {n} configurations",
                per_value=ROW_BYTES + 8 * len(axes),
            )
        cols = {}
        stride = n
        for (name, vals), s in zip(axes, sizes):
            stride //= s
            idx = (np.arange(n, dtype=np.int64) // stride) % s
            cols[name] = PARAMETERS[name].kind.column(name, vals, objects, index)[idx]
        blocks.append((n, cols))
        definition["grids"].append([[name, [_canon(name, v) for v in vals]] for name, vals in axes])
    if configs:
        rows: list[dict[str, Any]] = []
        for i, cfg in enumerate(configs):
            if not isinstance(cfg, Mapping):
                raise LvflowError(f"configs[{i}]: expected a mapping parameter → value, got {type(cfg).__name__}")
            row = {}
            for raw, v in cfg.items():
                name = canonical_name(str(raw))
                vals = values_of(name, v)
                if len(vals) != 1:
                    raise LvflowError(f"configs[{i}]: {raw}: one value per configuration (lists belong in a grid)")
                row[name] = vals[0]
            rows.append(row)
        names = list(dict.fromkeys(k for row in rows for k in row))
        cols = {}
        for name in names:
            kind = PARAMETERS[name].kind
            given = np.array([name in row for row in rows])
            col = np.full(len(rows), kind.missing, dtype=kind.dtype)
            if given.any():
                col[given] = kind.column(name, [row[name] for row in rows if name in row], objects, index)
            cols[name] = col
        blocks.append((len(rows), cols))
        definition["configs"] = [[[k, _canon(k, v)] for k, v in row.items()] for row in rows]
    n = sum(b[0] for b in blocks)
    if n == 0:
        raise LvflowError("spec: no configurations (give a grid or a list of configurations)")
    names = list(dict.fromkeys(k for _, cols in blocks for k in cols))
    columns = {}
    for name in names:
        kind = PARAMETERS[name].kind
        parts = [cols[name] if name in cols else np.full(m, kind.missing, dtype=kind.dtype) for m, cols in blocks]
        columns[name] = np.concatenate(parts)
    return Plan(n=n, columns=columns, objects=objects, definition=definition)


# --------------------------------------------------------------------------------------------
# The spec's hash
# --------------------------------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _array_sha(a) -> str:
    a = np.ascontiguousarray(np.asarray(a, dtype=np.float64))
    return _sha(repr(a.shape).encode() + a.tobytes())


def _canon(name: str, v: Any) -> Any:
    """A JSON value that identifies `v`: numbers and names as they are; a file by its name and the
    SHA-256 of its content (an edited file is a different sweep); a Python array or system by the
    SHA-256 of its arrays."""
    return PARAMETERS[name].kind.canon(v)


def spec_hash(definition: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """SHA-256 (first 16 hex digits) of the canonical spec and the options that shape results
    and chunks: two runs with the same hash produce the same chunk files."""
    text = json.dumps({"format": 1, "spec": definition, "options": options}, sort_keys=True, allow_nan=True)
    return _sha(text.encode())[:16]


# --------------------------------------------------------------------------------------------
# Chunks
# --------------------------------------------------------------------------------------------


class Chunk(NamedTuple):
    """A chunk: its number, its group, and the configurations (their `index`) it holds."""

    id: int
    group: int
    rows: np.ndarray

    @property
    def file(self) -> str:
        return f"chunk-{self.id:06d}.npz"


def make_chunks(group_of: np.ndarray, chunk_size: int) -> list[Chunk]:
    """Chunks of at most `chunk_size` configurations, each within one group (equal shapes), groups
    in order of their first configuration, configurations in index order. Every configuration is
    in exactly one chunk."""
    if chunk_size < 1:
        raise LvflowError(f"chunk_size: must be a positive integer, got {chunk_size}")
    group_of = np.asarray(group_of, dtype=np.int64)
    order = np.argsort(group_of, kind="stable")
    chunks = []
    bounds = np.flatnonzero(np.diff(group_of[order])) + 1
    for part in np.split(order, bounds):
        if part.size == 0:
            continue
        g = int(group_of[part[0]])
        for start in range(0, part.size, chunk_size):
            chunks.append(Chunk(len(chunks), g, part[start : start + chunk_size]))
    return chunks
