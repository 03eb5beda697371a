"""From a `Plan` to groups of equal shapes: each configuration's system (a power-law spectrum, a file,
a Python object, or an architecture on data), its initial scale, checks of every scalar input, and
the group it is evaluated in.

Everything here runs once per sweep on the host, vectorised over configurations; each distinct
system file or architecture + data is loaded (and reduced to its gLV) once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from .._core.errors import LvflowError, NotCommutingError
from .._core.validate import as_array
from .._form.expansion import _base_network, _batch
from .._glv.interaction import AbstractInteraction, DenseInteraction, DiagonalInteraction, LowRankInteraction
from .._glv.lv import LotkaVolterra, LowRankLotkaVolterra
from .._glv.reduce import reduce_to_lv
from .._schedule.schedule import plateau_schedule
from .._workflow.io import load_array, load_arrays
from .._workflow.predict_data import architecture_network, nqf_from_data
from .._workflow.predict_inputs import lv_from_arrays, power_law_lv
from .._workflow.predict_kernel import loss_floor, switch_off_levels
from .._workflow.spec import Configurations, check_initial_scale, check_ranges, check_source
from .base import AbstractFamily, Init, System
from .grid import DEFAULTS, Plan


def _where(rows: np.ndarray) -> str:
    i = int(np.flatnonzero(rows)[0])
    more = int(np.count_nonzero(rows)) - 1
    return f"(configuration {i}{f' and {more} more' if more else ''})"


# --------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------

#: the structure of `C` as the sweep's outputs name it (`"structure"` of a group in the manifest)
STRUCTURE_NAMES: dict[type[AbstractInteraction], str] = {
    DiagonalInteraction: "diagonal",
    LowRankInteraction: "lowrank",
    DenseInteraction: "dense",
}


class PowerLawFamily(AbstractFamily):
    """Thm 9's independent modes, `r_k = k^{−α₂}`, `V_k = k^{−α₁}`, `C_kk = r_k²/(8V_k)`, built on the
    device from each row's `(α₁, α₂)` (as `lvflow predict --alpha1 --alpha2 --modes`)."""

    #: the structure of `C`: the interaction class the family's systems have
    interaction: type[AbstractInteraction] = DiagonalInteraction
    structure = STRUCTURE_NAMES[DiagonalInteraction]

    def __init__(self, K: int):
        self.K = K

    @property
    def key(self) -> tuple:
        return ("power", self.K)

    def inputs(self, rows, res):
        return {
            "alpha1": res.plan.column("alpha1")[rows],
            "alpha2": res.plan.column("alpha2")[rows],
            "log_eps": np.log(res.eps[rows]),  # ln ε on the host: a subnormal ε reads as 0 on a device
        }

    #: `r_k = k^{−α₂}` strictly decreases (α₂ > 0): the modes ignite in index order, `τ*_k = 1/r_k`.
    ascending_tau = True

    def system(self, x):
        # k^{−α} as exp(−α ln k): one exp per entry instead of a pow (equal to 1e-15)
        lk = jnp.log(jnp.arange(1, self.K + 1, dtype=float))
        r = jnp.exp(-x["alpha2"] * lk)
        return r, jnp.exp((x["alpha1"] - 2 * x["alpha2"]) * lk) / 8, None  # C_kk = r_k²/(8 V_k)

    def host_system(self, row, res):
        plan = res.plan
        return power_law_lv(
            alpha1=float(plan.column("alpha1")[row]),
            alpha2=float(plan.column("alpha2")[row]),
            modes=int(plan.column("modes")[row]),
        )


@dataclasses.dataclass
class SystemInfo:
    """A concrete gLV of the sweep, loaded once: its arrays on the host, the structure of `C` (the
    class of `lv.interaction()`),
    `z_inf` (the loss's minimiser over `z ≥ 0`, `predict_kernel.loss_floor`; `unique` False when the
    flow's limit depends on `z0`, the minimum does not) and, on first use, `z_on`
    (`predict_kernel.switch_off_levels`: the plateau level of each mode a competitor later switches off)."""

    lv: System
    label: str
    interaction: type[AbstractInteraction]
    r: np.ndarray
    Ckk: np.ndarray
    z_inf: np.ndarray
    unique: bool
    y2: float
    #: for an architecture on data: `(architecture, arrays, kernel, value_size, nqf)`, from which
    #: `network` builds the network for `predict`'s validity horizon; else `None`
    source: tuple | None = None
    #: the network and its inputs per width (`network`), built on first use
    networks: dict = dataclasses.field(default_factory=dict)
    _z_on: np.ndarray | None = None

    def network(self, width: int | None) -> tuple:
        """For an architecture on data, the sum-form module with `width` neurons (default `p`) and
        its batch of inputs, as `predict` takes them (`network=`, `inputs=`), built once per width."""
        if width not in self.networks:
            assert self.source is not None
            architecture, arrays, kernel, value_size, _ = self.source
            net, inputs = architecture_network(architecture, arrays, kernel=kernel, value_size=value_size, width=width)
            self.networks[width] = (_base_network(net), _batch(inputs))
        return self.networks[width]

    @property
    def has_horizon(self) -> bool:
        """An architecture on data that is not exactly its NQF (Thm 13 has a next term,
        `next_order`): `predict` reports a validity horizon for it."""
        if self.source is None:
            return False
        net, X = self.network(None)
        return net.next_order(jax.tree_util.tree_map(lambda a: np.asarray(a)[0], X)) is not None

    @property
    def z_on(self) -> np.ndarray:
        if self._z_on is None:
            self._z_on = np.zeros(self.K)
            if np.any(self.z_inf <= 0):  # only a mode that ends at 0 can be switched off
                # the ε → 0 schedule from z_k0 = Θ(ε) does not depend on ε
                self._z_on = switch_off_levels(self.lv, plateau_schedule(self.lv, 1e-8), self.z_inf)
        return self._z_on

    @property
    def K(self) -> int:
        return self.r.shape[0]

    @property
    def q(self) -> int:
        if isinstance(self.lv, LowRankLotkaVolterra) and self.interaction is LowRankInteraction:
            return int(self.lv.U.shape[1])
        return 0


class TableFamily(AbstractFamily):
    """Systems given one by one (files, Python objects, architectures on data) with equal `K`,
    structure and rank; each row gathers its system's arrays by the system's number."""

    def __init__(
        self, systems: list[SystemInfo], interaction: type[AbstractInteraction], K: int, q: int, z_inf_known: bool
    ):
        self.systems, self.interaction, self.K, self.q = systems, interaction, K, q
        self.structure = STRUCTURE_NAMES[interaction]
        self.z_inf_known = z_inf_known
        self._tables: dict[str, np.ndarray] | None = None

    @property
    def key(self) -> tuple:
        return ("table", self.structure, self.K, self.q, self.z_inf_known)

    def _table(self) -> dict[str, np.ndarray]:
        if self._tables is None:
            s = self.systems
            t = {"r": np.stack([x.r for x in s]), "Ckk": np.stack([x.Ckk for x in s])}
            if self.interaction is not DiagonalInteraction:
                t["z_floor"] = np.stack([x.z_inf for x in s])
                t["z_on"] = np.stack([x.z_on for x in s])
            if self.interaction is LowRankInteraction:
                lr = [x.lv for x in s if isinstance(x.lv, LowRankLotkaVolterra)]  # all: a low-rank interaction
                t["d"] = np.stack([np.asarray(x.d, dtype=float) for x in lr])
                t["U"] = np.stack([np.asarray(x.U, dtype=float) for x in lr])
            elif self.interaction is DenseInteraction:
                t["C"] = np.stack([np.asarray(x.lv.C, dtype=float) for x in s])
            self._tables = t
        return self._tables

    def inputs(self, rows, res):
        local = res.local_system[rows]
        out = {k: v[local] for k, v in self._table().items()}
        out["log_eps"] = np.log(res.eps[rows])  # ln ε on the host: a subnormal ε reads as 0 on a device
        return out

    def system(self, x):
        r = x["r"]
        if self.interaction is DiagonalInteraction:
            return r, x["Ckk"], None
        if self.interaction is LowRankInteraction:
            return r, x["Ckk"], LowRankLotkaVolterra(r, x["d"], x["U"])
        return r, x["Ckk"], LotkaVolterra(r, x["C"], check=False)

    def host_system(self, row, res):
        return self.systems[int(res.local_system[row])].lv


# --------------------------------------------------------------------------------------------
# Loading systems
# --------------------------------------------------------------------------------------------


def _system_from_value(v: Any, label: str) -> System:
    """A `system` value: a file (as `lvflow predict --system`), a gLV object, or a mapping of arrays
    (`r` and `C`, `zeta` and `V`, or `r`, `d` and `U` for `Diag(d) + UUᵀ`; optional `y2`)."""

    if isinstance(v, (LotkaVolterra, LowRankLotkaVolterra)):
        return v
    if isinstance(v, str):
        arrays = load_arrays(v, name=label)
    elif isinstance(v, Mapping):
        arrays = {str(k): np.asarray(x, dtype=float) for k, x in v.items()}
    else:
        raise LvflowError(
            f"{label}: expected a file name, a LotkaVolterra/LowRankLotkaVolterra or a mapping of arrays, "
            f"got {type(v).__name__}"
        )
    arrays = dict(arrays)
    y2 = arrays.pop("y2", None)
    y2 = 0.0 if y2 is None else float(np.reshape(y2, ()))
    if {k.lower() for k in arrays} == {"r", "d", "u"}:
        keys = {k.lower(): k for k in arrays}
        return LowRankLotkaVolterra(arrays[keys["r"]], arrays[keys["d"]], arrays[keys["u"]], y2=y2)
    lv = lv_from_arrays(arrays, name=label)
    return LotkaVolterra(lv.r, lv.C, y2=y2, check=False) if y2 else lv


def _system_from_data(architecture: str, data: Any, kernel: str, value_size: int, label: str) -> tuple[System, tuple]:
    """The gLV of `architecture` on `data`, and its source `(architecture, arrays, kernel, value_size,
    nqf)` (`SystemInfo.source`)."""
    arrays = load_arrays(data, name=label) if isinstance(data, str) else data
    if not isinstance(arrays, Mapping):
        raise LvflowError(f"{label}: expected a file name or a mapping with arrays x and y, got {type(data).__name__}")
    k = tuple(int(x) for x in kernel.split("x")) if kernel else None
    nqf = nqf_from_data(architecture, arrays, kernel=k, value_size=value_size, name=label)
    try:
        return reduce_to_lv(nqf), (architecture, arrays, k, value_size, nqf)
    except NotCommutingError as e:
        raise LvflowError(
            f"{label}: {architecture} on this data does not reduce to a gLV ({e}); a sweep needs commuting "
            "structure matrices (use lvflow predict for the full M-flow)"
        ) from None


def system_info(lv: System, label: str) -> SystemInfo:
    """The host-side facts about `lv` a sweep needs (arrays, the structure it was built with, `z(∞)`)."""
    r = np.asarray(lv.r, dtype=float)
    y2 = float(np.asarray(lv.y2))
    if isinstance(lv, LowRankLotkaVolterra):  # on the host: no device dispatch per system
        d, U = np.asarray(lv.d, dtype=float), np.asarray(lv.U, dtype=float)
        Ckk = d + np.sum(U**2, axis=-1)
    else:
        Ckk = np.diagonal(np.asarray(lv.C, dtype=float)).copy()
    z_inf, unique = loss_floor(lv)
    z_inf = np.asarray(z_inf, dtype=float)
    unique = bool(unique) and bool(np.all(np.isfinite(z_inf)))
    interaction = type(lv.interaction())
    return SystemInfo(lv, label, interaction, r, Ckk, z_inf, unique, y2)


# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Group:
    """Configurations evaluated by one compiled function: a family, how `c` is given (`Init`), the
    curve's length (0: none)
    and the solver tolerances; `horizon_points`: for an architecture on data with `predict`'s
    validity horizon, the curve's `num_points` the horizon is read from (the evaluation then also
    returns the loss and `z` on the curve; without a curve in the results, `points` stays 0), else 0."""

    family: AbstractFamily
    init: Init
    points: int
    rtol: float
    atol: float
    horizon_points: int = 0

    @property
    def key(self) -> tuple:
        return (self.family.key, self.init, self.points, self.rtol, self.atol, self.horizon_points)


@dataclasses.dataclass
class Resolved:
    """A `Plan` resolved: per configuration its group, `K`, `eps` and (table systems) the system's
    number within its family; the groups; and the loaded `c`/`z0` arrays."""

    plan: Plan
    groups: list[Group]
    group_of: np.ndarray
    K: np.ndarray
    eps: np.ndarray
    local_system: np.ndarray
    c_arrays: dict[tuple[str, int], np.ndarray]


def _load_vector(name: str, v: Any, label: str) -> np.ndarray:

    a = load_array(v, name=label) if isinstance(v, str) else as_array(label, v)
    if a.ndim > 1:
        a = a.reshape(-1)
    return np.asarray(a, dtype=float)


def resolve(plan: Plan, *, curve: bool, horizon: bool = False) -> Resolved:
    """Check every configuration and assign it a group (with `horizon`, an architecture on data's
    group has `horizon_points`).

    **Raises:** `LvflowError` naming the parameter, the problem and the (first) configuration.
    """
    n = plan.n
    has = plan.has
    cfg = Configurations(plan.has, plan.column, where=lambda bad: f" {_where(bad)}")
    check_source(cfg)
    check_initial_scale(cfg)
    check_ranges(cfg)
    power = has("alpha1") | has("alpha2") | has("modes")
    table = has("system")
    arch = has("architecture") | has("data")

    # The systems given one by one, each loaded once.
    infos: list[SystemInfo] = []
    sys_of = np.full(n, -1, dtype=np.int64)
    sys_col, data_col = plan.column("system"), plan.column("data")
    for j in np.unique(sys_col[table]):
        v = plan.objects["system"][int(j)]
        label = v if isinstance(v, str) else f"system[{int(j)}]"
        lv = _system_from_value(v, f"system {label}" if isinstance(v, str) else label)
        sys_of[table & (sys_col == j)] = len(infos)
        infos.append(system_info(lv, label))
    if np.any(arch):
        rows = np.flatnonzero(arch)
        dv = np.where(has("value_size"), plan.column("value_size"), 1)
        combos = np.stack(
            [plan.column("architecture"), data_col.astype(str), plan.column("kernel"), dv.astype(str)], axis=1
        )[rows]
        uniq, inv = np.unique(combos, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        for u, (name, j, kernel, value_size) in enumerate(uniq):
            v = plan.objects["data"][int(j)]
            label = f"{name} on {v if isinstance(v, str) else f'data[{int(j)}]'}"
            lv, source = _system_from_data(str(name), v, str(kernel), int(value_size), f"data {label}")
            sys_of[rows[inv == u]] = len(infos)
            infos.append(dataclasses.replace(system_info(lv, label), source=source))
    K = np.where(power, plan.column("modes"), 0)
    K[~power] = np.array([info.K for info in infos], dtype=np.int64)[sys_of[~power]] if infos else 0

    eps, c_arrays, init = _initial_scales(plan, K)

    points = np.where(has("num_points"), plan.column("num_points"), DEFAULTS["num_points"])
    horizon_points = np.zeros(n, dtype=np.int64)
    if horizon and infos:  # an architecture on data with a next term: its curve and z(t) for the horizon
        nonlinear = np.array([info.has_horizon for info in infos])
        with_next = arch & nonlinear[np.maximum(sys_of, 0)]
        horizon_points[with_next] = points[with_next]
    points = points if curve else np.zeros(n, dtype=np.int64)
    rtol = np.where(has("rtol"), plan.column("rtol"), DEFAULTS["rtol"])
    atol = np.where(has("atol"), plan.column("atol"), DEFAULTS["atol"])

    # Families: power-law spectra by K; table systems by structure, K, rank and whether z(∞) is known.
    families: list[AbstractFamily] = []
    fam_code = np.empty(n, dtype=np.int64)
    local = np.full(n, -1, dtype=np.int64)
    if np.any(power):
        Ks, inv = np.unique(K[power], return_inverse=True)
        fam_code[power] = len(families) + inv.reshape(-1)
        families += [PowerLawFamily(int(k)) for k in Ks]
    by_key: dict[tuple, list[int]] = {}
    for s, info in enumerate(infos):
        by_key.setdefault((info.interaction, info.K, info.q, info.unique), []).append(s)
    sys_local = np.empty(len(infos), dtype=np.int64)
    sys_fam = np.empty(len(infos), dtype=np.int64)
    for (interaction, Kt, q, unique), ss in by_key.items():
        sys_local[ss] = np.arange(len(ss))
        sys_fam[ss] = len(families)
        families.append(TableFamily([infos[s] for s in ss], interaction, Kt, q, unique))
    rows_t = np.flatnonzero(~power)
    fam_code[rows_t] = sys_fam[sys_of[rows_t]]
    local[rows_t] = sys_local[sys_of[rows_t]]

    # One group per distinct (family, init, points, rtol, atol, horizon points), numbered by first appearance.
    init_code = init.astype(np.float64)
    combo = np.stack(
        [fam_code.astype(np.float64), init_code, points.astype(np.float64), rtol, atol, horizon_points], axis=1
    )
    _, first, inverse = np.unique(combo, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    group_of = rank[inverse.reshape(-1)]
    groups = [
        Group(
            families[fam_code[i]],
            _INITS[int(init_code[i])],
            int(points[i]),
            float(rtol[i]),
            float(atol[i]),
            int(horizon_points[i]),
        )
        for i in first[order]
    ]
    return Resolved(plan, groups, group_of, K.astype(np.int64), eps, local, c_arrays)


#: the `Init` of each code `_initial_scales` returns
_INITS = (Init.ONES, Init.BETA, Init.ARRAY)

#: The per-mode arrays that set the initial scale, and whether each gives `z_k(0)` itself (`z0`:
#: `ε` is its largest entry and `c = z0/ε`) or relative to `ε` (`c`: `z_k(0) = ε c_k`, where one
#: entry stands for every mode).
_PER_MODE = {"c": False, "z0": True}


def _initial_scales(plan: Plan, K: np.ndarray):
    """`ε` per configuration and, where `c` is given per mode (`c` or `z0` arrays), the arrays;
    `init` is the index in `_INITS` of each configuration's `Init` (as `predict`'s `initial_scale`);
    the configurations obey `check_initial_scale` and `check_ranges`."""
    has = plan.has
    eps = np.where(has("eps"), plan.column("eps"), np.nan)
    std = has("init_std")
    eps[std] = plan.column("width")[std] * plan.column("init_std")[std] ** 2
    init = np.where(has("c") | has("z0"), _INITS.index(Init.ARRAY), np.where(has("beta"), _INITS.index(Init.BETA), 0))
    c_arrays: dict[tuple[str, int], np.ndarray] = {}
    for name, absolute in _PER_MODE.items():
        col = plan.column(name)
        for j, v in enumerate(plan.objects.get(name, [])):
            rows = col == j
            if not np.any(rows):
                continue
            label = f"{name} {v}" if isinstance(v, str) else f"{name}[{j}]"
            a = _load_vector(name, v, label)
            for Kr in np.unique(K[rows]):
                if not (a.shape == (Kr,) or (not absolute and a.size == 1)):
                    where = _where(rows & (K == Kr))
                    raise LvflowError(f"{label}: shape {a.shape}, expected ({Kr},) (one entry per mode) {where}")
            if np.any(a <= 0):
                raise LvflowError(f"{label}: every entry must be positive, got min {a.min():g} {_where(rows)}")
            if absolute:
                e = float(np.max(a))
                eps[rows] = e
                c_arrays[(name, j)] = a / e
            else:
                c_arrays[(name, j)] = a
    bad = ~((eps > 0) & (eps < 1))
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        what = "eps" if plan.has("eps")[i] else ("z0: max entry (ε)" if plan.has("z0")[i] else "init_std: ε = width·σ²")
        raise LvflowError(f"{what}: must lie in (0, 1), got {eps[i]:g} {_where(bad)}")
    return eps, c_arrays, init


def c_matrix(res: Resolved, rows: np.ndarray, K: int) -> np.ndarray:
    """`c` per mode for configurations `rows` of an `Init.ARRAY` group, shape `(B, K)`."""
    plan = res.plan
    out = np.empty((rows.size, K))
    for name in _PER_MODE:
        col = plan.column(name)[rows]
        for j in np.unique(col[col >= 0]):
            out[col == j] = np.broadcast_to(res.c_arrays[(name, int(j))], (K,))
    return out
