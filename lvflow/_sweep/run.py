"""Evaluating a sweep: batches of one group, `vmap`ped and sharded over the local devices; chunks
written atomically beside a manifest; resumption; the share of each process.

**Devices.** Each batch is padded (within its group, by repeating its last configuration; the
padding is dropped afterwards) to a multiple of the number of local devices and placed with
`NamedSharding(Mesh(devices, ("batch",)), PartitionSpec("batch"))`; the compiled function is a
`shard_map` of the vmapped evaluation, so each device runs its own slice (its own ODE loop, with no
cross-device synchronisation per step), and its result keeps that sharding. On a CPU an ODE
group's calls run side by side in threads, one per core the devices leave (`concurrent_calls`). A
configuration's numbers do not depend on the device count, the threads or its neighbours in the
batch.

**Files.** `out/manifest.json` (the spec, its hash, the chunks) is written first; each chunk
`out/chunk-NNNNNN.npz` holds its configurations (the parameters, and `index`, the configuration's
number) beside their results, and is written to a temporary file in `out/`, flushed to disk and
`os.replace`d, so it exists complete or not at all. A rerun of the same sweep skips every chunk
whose file exists: nothing is evaluated twice, and a chunk interrupted by a crash or `kill -9` is
evaluated again from scratch.

**Processes.** With `P` processes (one per host, `jax.distributed` or a plain process number),
process `p` evaluates the chunks `c` with `c mod P = p`, on its own devices, and writes only
those. The summary is written once every chunk exists.

**Locks.** `sweep_directory` (entered by `lvflow.sweep` itself, so the API and the CLI share it)
holds `out/.lvflow-sweep-p.lock` (an OS file lock, `out_lock`; `p` the process number) while a
sweep runs: a second sweep of the same share into the same directory, from another process or
thread, is refused, and a lock held by a killed process is released by the operating system.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import __version__
from .._core.errors import LvflowError
from .._core.memory import check_memory, curve_bytes
from .._glv.interaction import DenseInteraction, DiagonalInteraction
from .._schedule.schedule import plateau_schedule
from .._workflow.io import atomic_write, atomic_write_text, check_path_length, read_document, to_json
from .._workflow.predict import _schedule_per_mode
from .base import Init, Schedule
from .evaluate import batched, derived, drop_columns, make_member
from .families import Group, PowerLawFamily, Resolved, c_matrix
from .grid import ROW_BYTES, Chunk
from .horizon import horizon_columns

MANIFEST = "manifest.json"
_FUNCTIONS: dict[tuple, Callable] = {}
_CALLED: set[tuple] = set()  # keys of `_FUNCTIONS` called (compiled) at least once
FORMAT = "lvflow-sweep/1"

#: Columns with one entry per mode (shape `(n, K)`) and per curve time (shape `(n, T)`).
PER_MODE = ("t_star", "tau_star", "plateau_loss", "z_inf", "r", "V")
CURVE = ("ts", "excess_loss")


def make_mesh(devices=None) -> Mesh:
    """A 1-D mesh named `"batch"` over `devices` (default: this process's local devices; an int
    takes the first that many)."""
    local = jax.local_devices()
    if devices is None:
        devs = local
    elif isinstance(devices, (int, np.integer)):
        if not 1 <= devices <= len(local):
            raise LvflowError(f"devices: must lie in [1, {len(local)}] (the local devices), got {devices}")
        devs = local[: int(devices)]
    else:
        devs = list(devices)
        if not devs:
            raise LvflowError("devices: empty list")
    return Mesh(np.array(devs), ("batch",))


class Runner:
    """Evaluates configurations of a `Resolved` sweep, group by group, on a mesh."""

    def __init__(
        self,
        res: Resolved,
        *,
        mesh: Mesh,
        schedule: Schedule,
        max_steps: int,
        batch_size: int | None,
        chunk_size: int,
    ):
        self.res, self.mesh = res, mesh
        self.schedule, self.max_steps, self.batch_size, self.chunk_size = schedule, max_steps, batch_size, chunk_size
        self.group_batches: dict[int, int] = {}  # a resumed sweep's recorded batches (`slice_rows`)
        self.sharding = NamedSharding(mesh, PartitionSpec("batch"))
        self.n_dev = int(mesh.size)
        self.on_cpu = mesh.devices.flat[0].platform == "cpu"  # else an accelerator
        self._schedules: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.evaluated_rows = 0
        self.check_memory()

    def check_memory(self) -> None:
        """Refuse, before anything is evaluated or written, a sweep whose results (every
        configuration's columns: `grid.ROW_BYTES`, and per mode and curve sample 8 bytes in each
        of the `PER_MODE` and `CURVE` columns, read back and concatenated: twice) and largest
        device call (`curve_bytes` of the group's modes and samples per configuration; with the
        validity horizon, also a chunk's curves and `z` read back and concatenated: twice) need more
        memory than this machine has available (`lvflow._core.memory.check_memory`).

        **Raises:** `LvflowError` naming `num_points` or `modes` when the curve or the modes are
        most of the need, else the parameter with the longest value list (the configurations'
        count).
        """
        res = self.res
        K = res.K.astype(np.float64)
        samples = np.array([2.0 * g.points - 1 if g.points else 0.0 for g in res.groups])[res.group_of]
        modes_part = float(np.sum(2 * 8 * len(PER_MODE) * K))
        curve_part = float(np.sum(2 * 8 * len(CURVE) * samples))
        calls = [
            self.slice_rows(g) * self.n_dev * curve_bytes(group.family.K, max(group.points, group.horizon_points, 2))
            + 2 * 8 * (group.family.K + 3) * max(2.0 * group.horizon_points - 1, 0.0) * self.chunk_rows(g)
            for g, group in enumerate(res.groups)
        ]
        call = max(calls, default=0.0)
        need = ROW_BYTES * res.plan.n + modes_part + curve_part + call
        K_max, points = int(res.K.max()), max((g.points for g in res.groups), default=0)
        if curve_part + (call if points > 2 else 0) >= max(modes_part, ROW_BYTES * res.plan.n):
            name = "num_points"
        elif modes_part + call >= ROW_BYTES * res.plan.n:
            name = "modes"
        else:  # the longest value list makes the most configurations
            axes = [(len(v), k) for g in res.plan.definition.get("grids", []) for k, v in g if isinstance(v, list)]
            name = max(axes)[1] if axes else "configs"
        n = res.plan.n
        what = f"a sweep of {n} configuration{'s' * (n != 1)} of up to {K_max} mode{'s' * (K_max != 1)}" + (
            f" with curves of {2 * points - 1} samples" if points else ""
        )
        check_memory(name, need, what)

    # -- static choices per group ---------------------------------------------------------------

    def host_schedule(self, group: Group) -> bool:
        """Whether `τ*` and the plateau losses come from `plateau_schedule` on the host."""
        fam = group.family
        return self.schedule is Schedule.CORRECTED or (self.schedule is Schedule.LIMIT and not fam.ascending_tau)

    def per_member(self, group: Group) -> bool:
        """`lax.map` instead of `vmap` where the batch would run batched LAPACK on a CPU (see
        `evaluate.batched`): a dense coupled `C`, or a `z(∞)` not known in advance."""
        fam = group.family
        if not self.on_cpu or fam.interaction is DiagonalInteraction:
            return False
        return fam.interaction is DenseInteraction or not fam.z_inf_known

    def slice_rows(self, g: int) -> int:
        """Configurations per device per call, `b`. It depends on the group, never on the device
        count: a call gives each device one slice of exactly `b` rows, so a configuration is
        computed by the same program on the same shape whatever the mesh, and its numbers are
        bitwise the same (XLA's vectorised transcendental functions are not bitwise independent of
        the array shape). Default: 4096 for the closed form, 32 for the ODE on a CPU (lock-step
        batches of ODE solves gain nothing beyond that there), 1024 on an accelerator; at most the
        group's largest chunk, rounded up to a power of two. A resumed sweep keeps the `b` its
        manifest records for the group (`group_batches`)."""
        if g in self.group_batches:
            return int(self.group_batches[g])
        group = self.res.groups[g]
        if self.batch_size is not None:
            base = self.batch_size
        elif group.family.interaction is DiagonalInteraction:
            base = 4096
        else:
            base = 32 if self.on_cpu else 1024
        largest = self.chunk_rows(g)
        return int(min(base, 1 << max(0, math.ceil(math.log2(max(largest, 1))))))

    def chunk_rows(self, g: int) -> int:
        """The most configurations of group `g` in one chunk."""
        return min(self.chunk_size, int(np.count_nonzero(self.res.group_of == g)))

    def concurrent_calls(self, g: int) -> int:
        """Device calls in flight at once for group `g`: on a CPU, for a vmapped ODE group, one per
        core the mesh's devices leave (`cores // devices`, at least 1); otherwise 1.

        A vmapped RODAS5P step is a few hundred small kernels over `(b, K)` arrays, which XLA runs
        on one core at a time; calls from several threads run side by side (each call is the
        same program on its own rows, so the numbers do not change). The closed form's large
        kernels already use every core, and a `lax.map` group (batched LAPACK, `per_member`)
        keeps one call."""
        group = self.res.groups[g]
        if not self.on_cpu or group.family.interaction is DiagonalInteraction or self.per_member(group):
            return 1
        try:
            cores = len(os.sched_getaffinity(0))  # the cores this process may use (Linux)
        except AttributeError:  # macOS, Windows
            cores = os.cpu_count() or 1
        return max(1, cores // self.n_dev)

    def function_key(self, g: int) -> tuple:
        """What `function(g)` is compiled for: the group's shapes and options, the mesh's devices."""
        group = self.res.groups[g]
        devices = tuple(d.id for d in self.mesh.devices.flat)
        return (group.key, self.schedule, self.host_schedule(group), self.max_steps, self.per_member(group), devices)

    def function(self, g: int) -> Callable:
        """The compiled, sharded evaluation of group `g` (shared by every sweep in this process whose
        group has the same shapes and options: a notebook's second sweep does not recompile)."""
        group = self.res.groups[g]
        host = self.host_schedule(group)
        per_member = self.per_member(group)
        key = self.function_key(g)
        if key not in _FUNCTIONS:
            member = make_member(group, schedule=self.schedule, host_schedule=host, max_steps=self.max_steps)
            spec = PartitionSpec("batch")
            body = jax.shard_map(
                batched(member, per_member=per_member),
                mesh=self.mesh,
                in_specs=spec,
                out_specs=spec,
                check_vma=False,  # equinox's runtime checks (error_if) are not varying-annotated
            )
            _FUNCTIONS[key] = jax.jit(body, in_shardings=self.sharding, out_shardings=self.sharding)
        return _FUNCTIONS[key]

    # -- inputs ---------------------------------------------------------------------------------

    def inputs(self, g: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The host arrays of configurations `rows` (all in group `g`)."""
        res, plan = self.res, self.res.plan
        group = res.groups[g]
        fam = group.family
        x = dict(fam.inputs(rows, res))
        x["eps"] = res.eps[rows]
        x["rho"] = np.where(plan.has("rho")[rows], plan.column("rho")[rows], 0.5)
        x["t1"] = plan.column("t1")[rows].astype(np.float64)
        if group.init is Init.ARRAY:
            x["c"] = c_matrix(res, rows, fam.K)
        elif group.init is Init.BETA:
            x["beta"] = plan.column("beta")[rows]
        if self.host_schedule(group):
            x["tau_star"], x["plateau_loss"] = self._host_schedule(g, rows, x)
        return x

    def _host_schedule(self, g: int, rows: np.ndarray, x) -> tuple[np.ndarray, np.ndarray]:
        res = self.res
        fam = res.groups[g].family
        K = fam.K
        tau, plateau = np.empty((rows.size, K)), np.empty((rows.size, K))
        for j, row in enumerate(rows):
            if self.schedule is Schedule.CORRECTED:
                lv = fam.host_system(row, res)
                k = np.arange(1, K + 1, dtype=float)
                c = x["c"][j] if "c" in x else (k ** -x["beta"][j] if "beta" in x else np.ones(K))
                z0 = x["eps"][j] * c
                sched = plateau_schedule(lv, float(x["eps"][j]), z0=z0, corrected=True)
                tau[j], plateau[j] = _schedule_per_mode(sched, lv)
                continue
            # the ε → 0 schedule from z_k0 = Θ(ε) does not depend on ε: once per system
            s = int(res.local_system[row])
            key = (g, s)
            if key not in self._schedules:
                lv = fam.host_system(row, res)
                self._schedules[key] = _schedule_per_mode(plateau_schedule(lv, float(x["eps"][j])), lv)
            tau[j], plateau[j] = self._schedules[key]
        return tau, plateau

    # -- evaluation -----------------------------------------------------------------------------

    def device_outputs(self, g: int, x: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """One device call on `x`, whose rows are `n_dev` slices of `slice_rows(g)` rows: the results
        as JAX arrays sharded over the mesh along the batch axis (device `j` holds slice `j`)."""
        xp = jax.device_put({k: np.ascontiguousarray(v) for k, v in x.items()}, self.sharding)
        return self.function(g)(xp)

    def evaluate(self, g: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Results of configurations `rows` of group `g` (per-mode arrays, scalars), on the host.

        The rows are cut into slices of `b = slice_rows(g)`, the last padded by repeating its last
        configuration; `n_dev` slices go to the devices per call (a last call short of slices
        repeats its last slice); the padding is dropped."""
        x = self.inputs(g, rows)
        b, n = self.slice_rows(g), rows.size
        n_slices = -(-n // b)
        calls = []
        for s0 in range(0, n_slices, self.n_dev):
            real = min(self.n_dev, n_slices - s0)
            slices = np.minimum(np.arange(s0, s0 + self.n_dev), s0 + real - 1)
            calls.append((real, np.minimum((slices[:, None] * b + np.arange(b)).reshape(-1), n - 1)))

        def call(c: tuple[int, np.ndarray]) -> dict[str, np.ndarray]:
            real, idx = c
            y = self.device_outputs(g, {k: v[idx] for k, v in x.items()})
            return {k: np.asarray(v)[: real * b] for k, v in y.items()}

        workers = min(self.concurrent_calls(g), len(calls))
        key = self.function_key(g)
        self.function(g)
        parts = []
        if key not in _CALLED:  # the first call compiles: alone, so that no thread compiles it again
            parts.append(call(calls[0]))
            _CALLED.add(key)
        rest = calls[len(parts) :]
        if workers > 1 and len(rest) > 1:
            with ThreadPoolExecutor(workers) as pool:
                parts += list(pool.map(call, rest))
        else:
            parts += [call(c) for c in rest]
        out = {k: np.concatenate([p[k] for p in parts])[:n] for k in parts[0]}
        self.evaluated_rows += n
        bad = ~out.pop("valid")
        if np.any(bad):
            raise LvflowError(_refusal(self.res, g, int(rows[np.flatnonzero(bad)[0]]), int(np.count_nonzero(bad))))
        return out


def _refusal(res: Resolved, g: int, row: int, count: int) -> str:
    """`predict`'s message for a configuration it would refuse, naming the configuration."""
    fam = res.groups[g].family
    lv = fam.host_system(row, res)
    r, Ckk = np.asarray(lv.r), np.asarray(lv.C_diagonal)
    where = f"(configuration {row}{f' and {count - 1} more' if count > 1 else ''})"
    if np.any(Ckk <= 0):
        bad = np.flatnonzero(Ckk <= 0)
        return f"C: diagonal entries C_kk must be positive (modes {(bad + 1).tolist()[:5]} have C_kk ≤ 0) {where}"
    if not np.any(r > 0):
        return f"system: no mode has r_k > 0, so nothing is ever learned (the loss stays flat) {where}"
    plan = res.plan
    K = r.shape[0]
    if res.groups[g].init is Init.ARRAY:
        c = c_matrix(res, np.array([row]), K)[0]
    elif res.groups[g].init is Init.BETA:
        c = np.arange(1, K + 1, dtype=float) ** -plan.column("beta")[row]
    else:
        c = np.ones(K)
    z0 = res.eps[row] * c
    k = int(np.flatnonzero((r > 0) & (Ckk * z0 >= r))[0])
    return (
        f"eps: too large, mode {k + 1} starts at or above its plateau (C_kk z_k0 = {Ckk[k] * z0[k]:.3g} ≥ "
        f"r_k = {r[k]:.3g}); the theory describes small initialisation {where}"
    )


# --------------------------------------------------------------------------------------------
# Chunks: columns, files, manifest
# --------------------------------------------------------------------------------------------


def chunk_columns(
    res: Resolved, g: int, rows: np.ndarray, out: dict[str, np.ndarray], *, horizon: bool = False
) -> dict[str, np.ndarray]:
    """A chunk's table: the configuration (`index`, every parameter; files and Python values by
    name) beside its results; with `horizon`, `predict`'s validity horizon (`horizon.horizon_columns`)
    from the evaluation's own curve and `z` (kept out of the table, as is the curve of a group
    evaluated with one only for the horizon)."""
    plan = res.plan
    group = res.groups[g]
    out = dict(out)
    path = {k: out.pop(k) for k in ("loss", "zs") if k in out}  # the horizon's trajectory
    if path:
        path.update(ts=out["ts"], excess_loss=out["excess_loss"])
        if not group.points:  # the curve was evaluated for the horizon only
            del out["ts"], out["excess_loss"]
    cols: dict[str, np.ndarray] = {"index": rows.astype(np.int64)}
    for name in plan.columns:
        cols[name] = plan.shown(name)[rows]
    cols["eps"] = res.eps[rows]
    cols["modes"] = res.K[rows]
    cols["rho"] = np.where(plan.has("rho")[rows], plan.column("rho")[rows], 0.5)
    cols["group"] = np.full(rows.size, g, dtype=np.int64)
    lr = plan.column("learning_rate")[rows]
    alpha = None
    if isinstance(group.family, PowerLawFamily):
        alpha = (plan.column("alpha1")[rows], plan.column("alpha2")[rows])
    scalars = {k: v for k, v in out.items() if v.ndim == 1}
    cols.update(scalars)
    cols.update(derived(out, res.eps[rows], lr, alpha))
    excess = out.get("excess_loss")  # with curves
    if excess is not None:
        cols.update(drop_columns(out["ts"], excess, lr))
    if horizon:  # predict's validity horizon (every chunk of a sweep with architectures on data)
        cols.update(horizon_columns(res, g, rows, out["success"], path))
    cols.update({k: v for k, v in out.items() if v.ndim == 2})
    return cols


#: the entry of a chunk file that holds its sweep's `spec_hash` (every other entry is a column)
_CHUNK_HASH = "spec_hash"


def write_chunk(path: Path, cols: dict[str, np.ndarray], spec_hash: str) -> None:
    """Atomically write a chunk: an uncompressed `.npz` (a 10⁵-configuration sweep writes in
    seconds, not minutes; `numpy.load(..., allow_pickle=False)` reads it), streamed straight into
    `atomic_write`'s temporary file."""
    # `Any`: numpy's stub would match an unpacked `dict[str, ndarray]` against `allow_pickle: bool`
    arrays: dict[str, Any] = {_CHUNK_HASH: np.array(spec_hash), **cols}
    atomic_write(path, lambda f: np.savez(f, **arrays))


def read_chunk(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files if k != _CHUNK_HASH}


def manifest(
    res: Resolved, chunks: list[Chunk], *, spec_hash: str, definition, options: dict[str, Any], batches: list[int]
) -> dict[str, Any]:
    """The manifest of a sweep: its spec and hash, the options, per group its family, tolerances
    and `batch` (the configurations per device call, `Runner.slice_rows`, which a resumed sweep
    keeps), and the chunks."""
    groups = []
    for g, group in enumerate(res.groups):
        fam = group.family
        groups.append(
            {
                "family": fam.key[0],
                "modes": fam.K,
                "structure": fam.structure,
                "rank": fam.q,
                "c": group.init.value,
                "curve_points": group.points,
                "rtol": group.rtol,
                "atol": group.atol,
                "n_configs": int(np.count_nonzero(res.group_of == g)),
                "batch": int(batches[g]),
            }
        )
    return {
        "format": FORMAT,
        "lvflow": __version__,
        "spec_hash": spec_hash,
        "n_configs": res.plan.n,
        "options": options,
        "groups": groups,
        "chunks": [
            {"id": c.id, "file": c.file, "group": c.group, "n": int(c.rows.size), "first_index": int(c.rows[0])}
            for c in chunks
        ],
        "spec": definition,
    }


def _check_manifest(m: Any) -> bool:
    """Whether `m` has the fields and types of a manifest (`manifest`) that a sweep relies on."""
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        return False
    ints = lambda d, keys: all(isinstance(d.get(k), int) and not isinstance(d.get(k), bool) for k in keys)
    return (
        isinstance(m.get("spec_hash"), str)
        and ints(m, ("n_configs",))
        and isinstance(m.get("options"), dict)
        and isinstance(m.get("groups"), list)
        and all(isinstance(g, dict) and ints(g, ("modes", "curve_points")) for g in m["groups"])
        and isinstance(m.get("chunks"), list)
        and all(isinstance(c, dict) and ints(c, ("id", "group", "n", "first_index")) for c in m["chunks"])
    )


def read_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest in directory `out`, or `None` if it has none.

    **Raises:** `LvflowError` naming the file if it is unreadable or not an lvflow sweep manifest.
    """
    p = out / MANIFEST
    if not p.exists():
        return None
    m = read_document(p, f"out: {p}: ")
    if not _check_manifest(m):
        raise LvflowError(f"out: {p} is not an lvflow sweep manifest ({FORMAT})")
    return m


def write_manifest(out: Path, m: dict[str, Any]) -> None:
    atomic_write_text(out / MANIFEST, to_json(m))


def remove_stale_temporaries(out: Path, mine: set[int]) -> None:
    """Delete the temporary files a killed run of this process's share left behind
    (`.chunk-NNNNNN.npz.*.tmp`; never another process's, which may be writing now)."""
    for p in out.glob(".chunk-*.npz.*.tmp"):
        try:
            cid = int(p.name[len(".chunk-") :].split(".", 1)[0])
        except ValueError:
            continue
        if cid in mine:
            try:
                p.unlink()
            except OSError:
                pass


def progress_bar(enabled: bool | None, total: int, initial: int):
    """tqdm on stderr, shown only on a terminal (or when asked); a no-op otherwise."""
    show = sys.stderr.isatty() if enabled is None else bool(enabled)
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="config", desc="lvflow sweep", dynamic_ncols=True, smoothing=0.1)


def now() -> float:
    return time.perf_counter()


def chunk_path(out: Path, c: Chunk) -> Path:
    return out / c.file


def exists(path: Path) -> bool:
    return os.path.isfile(path)


# --------------------------------------------------------------------------------------------
# The directory's lock, the spec file, a different sweep described
# --------------------------------------------------------------------------------------------

_HELD: dict[tuple[str, int], list] = {}  # (lock file, thread) → [its FileLock, depth]: re-entrant


def lock_path(out: Path, process_index: int = 0) -> Path:
    """The lock file of process `process_index`'s share of the sweep in `out`."""
    return out / f".lvflow-sweep-{int(process_index)}.lock"


@contextlib.contextmanager
def out_lock(out: Path, process_index: int = 0) -> Iterator[Path]:
    """Hold the lock of process `process_index`'s share of the sweep in directory `out` (which
    must exist) for the duration of the block; re-entrant within a thread.

    The lock is an OS file lock (`filelock`): it is released when the process exits, also by
    `kill -9`, so it never blocks a resumed sweep.

    **Arguments:**

    - `out`: the sweep's directory.
    - `process_index`: the process's number among the sweep's processes (0 for one process).

    **Returns:** a context manager yielding the lock file's path.

    **Raises:** `LvflowError` naming `out` when another sweep holds the lock, or the lock file
    cannot be created.
    """
    from filelock import FileLock, Timeout

    path = lock_path(out, process_index)
    key = (os.path.realpath(path), threading.get_ident())
    held = _HELD.get(key)
    if held is not None:
        held[1] += 1
        try:
            yield path
        finally:
            held[1] -= 1
        return
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise LvflowError(
            f"out: {out} is in use by another lvflow sweep (it holds {path.name}); wait for it to finish, "
            "or give another directory"
        ) from None
    except OSError as e:
        raise LvflowError(f"out: cannot lock {out} ({path.name}): {e.strerror or e}") from None
    _HELD[key] = [lock, 1]
    try:
        yield path
    finally:
        del _HELD[key]
        lock.release()


@contextlib.contextmanager
def sweep_directory(out: Path, process_index: int = 0, *, alone: bool = True) -> Iterator[Path]:
    """The output directory of a sweep, for the duration of the block: created if missing (with
    its parents), locked (`out_lock`), and, should the block fail before a chunk exists, left as
    it was: the files it added removed (the manifest only when `alone`), then the lock file and
    the directories it created, if empty. A chunk on disk keeps everything: a rerun resumes.

    **Arguments:**

    - `out`: the sweep's directory.
    - `process_index`: this process's number among the sweep's processes (it names the lock).
    - `alone`: no other process writes to `out` (no coordinator, no process count).

    **Returns:** a context manager yielding `out`.

    **Raises:** `LvflowError` naming `out` when it is a file, cannot be created or written to, or
    another sweep holds its lock.
    """
    top = _make_directory(out)
    lock = None  # the lock file, once this sweep holds it, if this sweep created it
    try:
        fresh = not lock_path(out, process_index).exists()
        with out_lock(out, process_index) as path:
            lock = path if fresh else None
            before = set(os.listdir(out))
            try:
                yield out
            except BaseException:
                _remove_new_files(out, before, alone)
                raise
    except BaseException:
        _remove_new_directories(out, top, lock)
        raise


def _make_directory(out: Path) -> Path | None:
    """Create the directory `out` (and its parents) if missing.

    **Returns:** the topmost directory created (`out` or one of its parents), or `None`.

    **Raises:** `LvflowError` naming `out` when it is a file, a name is too long for the file
    system, or it cannot be created or written to.
    """
    check_path_length(out, "out")
    if out.exists() and not out.is_dir():
        raise LvflowError(f"out: {out} exists and is not a directory")
    top = None
    for d in (out, *out.parents):
        if d.exists():
            break
        top = d
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file on the path, no permission, a read-only file system, a long name
        raise LvflowError(f"out: cannot create the directory {out}: {e.strerror or e}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        _remove_new_directories(out, top, None)
        raise LvflowError(f"out: directory is not writable (permission denied): {out}")
    return top


def _has_chunks(out: Path) -> bool:
    try:
        return any(name.startswith("chunk-") for name in os.listdir(out))
    except OSError:
        return True  # cannot tell: remove nothing


def _remove_new_files(out: Path, before: set[str], alone: bool) -> None:
    """After a failed sweep, while it holds the lock: unless a chunk exists (a rerun resumes from
    it), remove the files not in `out` before (`before`), its manifest only if `alone` (no other
    process writes to `out`)."""
    if _has_chunks(out):
        return
    for name in set(os.listdir(out)) - before:
        if name == MANIFEST and not alone:
            continue
        try:
            os.remove(os.path.join(out, name))
        except OSError:
            pass


def _remove_new_directories(out: Path, top: Path | None, lock: Path | None) -> None:
    """After a failed sweep, its lock released: unless a chunk exists, remove the lock file it
    created (`lock`, or `None`) and the directories it created (`out` up to `top`), if empty."""
    if _has_chunks(out):
        return
    if lock is not None:
        try:
            os.remove(lock)
        except OSError:
            pass
    if top is None:
        return
    for d in (out, *out.parents):
        try:
            os.rmdir(d)
        except OSError:  # not empty: another process's files
            return
        if d == top:
            return


def _toml_loads(text: str) -> Any:
    import tomllib  # only for a TOML spec (a sweep given as Python objects does not read one)

    return tomllib.loads(text)


#: the spec files `read_spec_file` reads, by suffix: the parser and the format's name
_SPEC_FORMATS = {".json": (json.loads, "JSON"), ".toml": (_toml_loads, "TOML")}


def read_spec_file(path) -> dict[str, Any]:
    """A sweep spec from a `.toml` or `.json` file, with the types of its sections checked: a
    table (JSON object) at the top, holding `grid` (a table or a list of tables), `configs` (a list
    of tables) and `options` (a table). A leading byte-order mark is dropped.

    **Arguments:**

    - `path`: the spec file.

    **Returns:** the spec as a dict (file names in it as written).

    **Raises:** `LvflowError` naming the file: missing, unreadable, not TOML/JSON, nested too
    deeply, or a section of the wrong type.
    """
    p = Path(os.fspath(path))
    if not p.is_file():
        raise LvflowError(f"spec: file not found: {p}")
    parse = _SPEC_FORMATS.get(p.suffix.lower())
    if parse is not None:
        data = read_document(p, f"spec: {p}: ", *parse)
    else:
        raise LvflowError(f"spec: unsupported file type {p.suffix or '(none)'!r} for {p}; use .toml or .json")
    if not isinstance(data, dict):
        raise LvflowError(
            f"spec: {p} must hold a table (a JSON object) with sections grid, configs, options; "
            f"found {_json_type(data)}"
        )
    tables = lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v)
    for key, ok, want in (
        ("grid", lambda v: isinstance(v, dict) or tables(v), "a table or a list of tables"),
        ("configs", tables, "a list of tables"),
        ("options", lambda v: isinstance(v, dict), "a table"),
    ):
        if key in data and data[key] is not None and not ok(data[key]):
            raise LvflowError(f"spec: {p}: {key} must be {want}, found {_json_type(data[key])}")
    return data


def _json_type(v: Any) -> str:
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, bool):
        return "a boolean"
    return "null" if v is None else "a number"


def manifest_difference(m: Mapping[str, Any], definition: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """What differs between the sweep a manifest records and another one, in words (at most
    three differences, then how many more); empty if nothing does.

    **Arguments:**

    - `m`: a manifest (`read_manifest`).
    - `definition`: the other sweep's canonical spec (`Plan.definition`).
    - `options`: its options (as `manifest` records them).

    **Returns:** e.g. `"eps: 1500 values from 1e-09 to 0.001 here, 1500 values from 1e-08 to
    0.001 there"` (`here` the other sweep, `there` the manifest's).
    """
    new = json.loads(json.dumps({"spec": definition, "options": dict(options)}, allow_nan=True))
    opts, spec = m.get("options"), m.get("spec")
    old_opts: dict[str, Any] = opts if isinstance(opts, dict) else {}
    diffs = []
    for k in dict.fromkeys([*new["options"], *old_opts]):
        if k != "parameters" and new["options"].get(k) != old_opts.get(k):
            diffs.append(f"{k}: {new['options'].get(k)} here, {old_opts.get(k)} there")
    old_spec: dict[str, Any] = spec if isinstance(spec, dict) else {}
    old_grids, new_grids = list(old_spec.get("grids") or []), list(new["spec"].get("grids") or [])
    if len(old_grids) != len(new_grids):
        diffs.append(f"grids: {len(new_grids)} here, {len(old_grids)} there")
    for i, (a, b) in enumerate(zip(new_grids, old_grids)):
        where = f"grid {i + 1}: " if len(new_grids) > 1 else ""
        try:
            a, b = dict((str(k), v) for k, v in a), dict((str(k), v) for k, v in b)
        except (TypeError, ValueError):
            diffs.append(f"{where}the parameters")
            continue
        if list(a) != list(b):
            diffs.append(f"{where}parameters {', '.join(a) or 'none'} here, {', '.join(b) or 'none'} there")
            continue
        diffs += [f"{where}{k}: {_values(a[k])} here, {_values(b[k])} there" for k in a if a[k] != b[k]]
    old_configs, new_configs = old_spec.get("configs") or [], new["spec"].get("configs") or []
    if old_configs != new_configs:
        diffs.append(
            f"configs: {len(new_configs)} here, {len(old_configs)} there" + _first_change(new_configs, old_configs)
        )
    more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
    return "; ".join(diffs[:3]) + more


def _first_change(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f" (the first different: configs[{i}])"
    return ""


def _values(v: Any) -> str:
    """A short description of a canonical value list (numbers, names, files)."""
    if not isinstance(v, list):
        return _value(v)
    if len(v) <= 4:
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return f"{len(v)} values from {_value(v[0])} to {_value(v[-1])}"


def _value(x: Any) -> str:
    if isinstance(x, dict) and "file" in x:
        return f"{x['file']} (sha256 {str(x.get('sha256'))[:8]})"
    if isinstance(x, float):
        return f"{x:g}"
    text = json.dumps(x)
    return text if len(text) <= 40 else text[:37] + "..."
