"""`lvflow.sweep`: `predict` over a grid or list of configurations, batched, sharded, resumable."""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._core.errors import LvflowError
from .._workflow.io import save_json
from .base import Schedule
from .families import resolve
from .grid import PARAMETERS, Object, expand, make_chunks, spec_hash
from .horizon import has_architectures
from .result import Assembler, SweepResult, load_sweep
from .run import (
    CURVE,
    PER_MODE,
    Runner,
    chunk_columns,
    chunk_path,
    exists,
    make_mesh,
    manifest,
    manifest_difference,
    progress_bar,
    read_manifest,
    read_spec_file,
    remove_stale_temporaries,
    sweep_directory,
    write_chunk,
    write_manifest,
)
from .summary import plot_summary, summarize

DEFAULT_CHUNK_SIZE = 4096
_OPTIONS = ("curve", "schedule", "chunk_size", "batch_size", "max_steps", "horizon")


def load_spec(spec) -> dict[str, Any]:
    """A spec from a TOML or JSON file (or a mapping): `grid` (a table, or an array of tables: each
    a grid), `configs` (an array of tables: one configuration each) and `options` (`curve`,
    `schedule`, `chunk_size`, `batch_size`, `max_steps`, `horizon`)."""
    data = dict(spec) if isinstance(spec, Mapping) else read_spec(spec)
    unknown = set(data) - {"grid", "configs", "options"}
    if unknown:
        raise LvflowError(f"spec: unknown section(s) {sorted(unknown)}; use grid, configs, options")
    opts = data.get("options", {}) or {}
    bad = set(opts) - set(_OPTIONS)
    if bad:
        raise LvflowError(f"spec: unknown option(s) {sorted(bad)}; known: {', '.join(_OPTIONS)}")
    grids = data.get("grid", [])
    grids = [grids] if isinstance(grids, Mapping) else list(grids)
    return {"grids": grids, "configs": list(data.get("configs", []) or []), "options": dict(opts)}


def read_spec(path) -> dict[str, Any]:
    """A spec file as `run.read_spec_file` reads and checks it, with the relative file names in it
    made relative to the spec file's directory.

    **Raises:** `LvflowError` naming the file (see `run.read_spec_file`).
    """
    p = Path(os.fspath(path))
    return _relative_to(read_spec_file(p), p.parent)


def _relative_to(data: dict, base: Path) -> dict:
    files = [n for n, p in PARAMETERS.items() if isinstance(p.kind, Object)]

    def fix(entry):
        if not isinstance(entry, Mapping):
            return entry
        out = dict(entry)
        for k, v in entry.items():
            if k in files:
                fixv = lambda s: str(base / s) if isinstance(s, str) and not os.path.isabs(s) else s
                out[k] = [fixv(s) for s in v] if isinstance(v, list) else fixv(v)
        return out

    data = dict(data)
    if isinstance(data.get("grid"), Mapping):
        data["grid"] = fix(data["grid"])
    elif isinstance(data.get("grid"), list):
        data["grid"] = [fix(g) for g in data["grid"]]
    if isinstance(data.get("configs"), list):
        data["configs"] = [fix(c) for c in data["configs"]]
    return data


#: The `coordinator` that lets `jax.distributed` find the cluster itself (SLURM, Cloud TPU, ...).
AUTO = "auto"
#: Seconds `jax.distributed` is given to reach the coordinator and the other processes, unless
#: told otherwise (`lvflow sweep --coordinator-timeout`).
COORDINATOR_TIMEOUT = 120.0


def _distributed(
    coordinator, num_processes, process_id, *, timeout: float = COORDINATOR_TIMEOUT, flags=None
) -> tuple[int, int, bool]:
    """`(process index, process count, jax.distributed in use)`, initialising `jax.distributed`
    for a `coordinator` (`"host:port"` or `"auto"`).

    XLA ends the process (SIGABRT, a C++ stack trace) when the coordinator or the other processes
    do not answer within its own timeout. So XLA is given `timeout` + 60 s, and a watchdog thread
    ends the process first, after `timeout` seconds, with one line on stderr naming the
    coordinator and what did not answer, and exit status 2 (`jax.distributed.initialize` cannot
    be interrupted: the process cannot go on either way).

    **Arguments:** `coordinator`, `num_processes`, `process_id` as `sweep`'s; `timeout`: the
    seconds to wait (positive); `flags`: the names to use in messages for `coordinator` and
    `timeout` (default `("coordinator", "coordinator_timeout")`; the CLI passes its flags).

    **Raises:** `LvflowError` for inconsistent process numbers, a bad timeout, or an
    initialisation that fails with an error (rather than a timeout).
    """
    import jax

    if coordinator is not None:
        if not jax.distributed.is_initialized():
            name, timeout_name = flags or ("coordinator", "coordinator_timeout")
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
                raise LvflowError(f"{timeout_name}: must be a positive number of seconds, got {timeout!r}")
            address = None if coordinator == AUTO else coordinator  # None: jax.distributed detects the cluster
            kw = {}
            if address is not None:
                kw = dict(coordinator_address=address, num_processes=num_processes, process_id=process_id)
            watchdog = _Watchdog(address, num_processes, float(timeout), name, timeout_name)
            try:
                jax.distributed.initialize(**kw, initialization_timeout=int(math.ceil(timeout)) + 60)
            except (RuntimeError, ValueError, TypeError) as e:
                hint = ""
                if "before any JAX" in str(e):
                    hint = (
                        "; JAX was already in use (e.g. systems built as Python objects): call "
                        "jax.distributed.initialize(...) first thing in the script, and lvflow.sweep uses it"
                    )
                raise LvflowError(f"{name}: jax.distributed.initialize failed: {e}{hint}") from None
            finally:
                watchdog.cancel()
        return jax.process_index(), jax.process_count(), True
    if jax.distributed.is_initialized():
        return jax.process_index(), jax.process_count(), True
    if num_processes is None and process_id is None:
        return 0, 1, False
    if num_processes is None or process_id is None:
        raise LvflowError("num_processes/process_id: give both (or a coordinator)")
    if isinstance(num_processes, bool) or not isinstance(num_processes, (int, np.integer)) or num_processes < 1:
        raise LvflowError(f"num_processes: must be a positive integer, got {num_processes!r}")
    if isinstance(process_id, bool) or not isinstance(process_id, (int, np.integer)):
        raise LvflowError(f"process_id: must be an integer, got {process_id!r}")
    if not 0 <= process_id < num_processes:
        raise LvflowError(f"process_id: must lie in [0, {num_processes}), got {process_id}")
    return int(process_id), int(num_processes), False


class _Watchdog:
    """Ends the process with one line and exit status 2 unless cancelled within `timeout` s: a
    `jax.distributed.initialize` still waiting then (it releases the GIL while it waits)."""

    def __init__(self, address: str | None, num_processes, timeout: float, name: str, timeout_name: str):
        self.address, self.num_processes, self.timeout = address, num_processes, timeout
        self.name, self.timeout_name = name, timeout_name
        self.done = threading.Event()
        self.timer = threading.Timer(timeout, self.expire)
        self.timer.daemon = True
        self.timer.start()

    def cancel(self) -> None:
        self.done.set()
        self.timer.cancel()

    def expire(self) -> None:
        if self.done.is_set():
            return
        prog = "lvflow sweep" if self.name.startswith("--") else "lvflow.sweep"
        sys.stderr.write(
            f"{prog}: error: {self.name}: not connected within {self.timeout:g} s ({self.timeout_name}): "
            f"{self.why()}; start every process of the sweep with the same coordinator address, or check it\n"
        )
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(2)

    def why(self) -> str:
        """What did not answer: nothing listening, no answer at all, or missing processes."""
        import socket

        host, _, port = str(self.address).rpartition(":")
        if self.address is None or not port.isdigit():
            return f"jax.distributed did not connect to the coordinator ({self.address or AUTO})"
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
        except ConnectionRefusedError:
            return f"nothing listens on {self.address} (connection refused)"
        except OSError:
            return f"no answer from {self.address}"
        n = f"all {self.num_processes}" if self.num_processes else "all the"
        return f"{self.address} answers, but not {n} processes joined"


def _holding_out_lock(fn):
    """`sweep` inside `run.sweep_directory`: with `out`, the directory is created, locked for the
    whole sweep (a second sweep into it, from any process or thread, is refused) and, should the
    sweep fail before a chunk exists, left as it was. `jax.distributed` starts first (its process
    number names the lock)."""

    @functools.wraps(fn)
    def locked(*args, out=None, coordinator=None, num_processes=None, process_id=None, **kw):
        call = dict(out=out, coordinator=coordinator, num_processes=num_processes, process_id=process_id)
        if out is None:
            return fn(*args, **call, **kw)
        try:
            out_dir = Path(os.fspath(out))
        except TypeError:
            raise LvflowError(f"out: expected a directory name, got {type(out).__name__}") from None
        index = _distributed(coordinator, num_processes, process_id)[0]
        with sweep_directory(out_dir, index, alone=coordinator is None and num_processes is None):
            return fn(*args, **call, **kw)

    return locked


def _barrier(name: str, timeout_s: float = 24 * 3600.0) -> None:
    """Wait for every process (jax.distributed's key-value store; no device collectives needed)."""
    from jax._src import distributed

    client = distributed.global_state.client
    if client is not None:
        client.wait_at_barrier(name, int(timeout_s * 1000))


def _recorded_batches(existing, out_dir, batch_size, runner: Runner) -> dict[int, int]:
    """The per-group batches a resumed sweep's manifest records (none for a new sweep, or a
    manifest written before they were recorded): the same batches give the same numbers bit for bit.

    **Raises:** `LvflowError` when `batch_size` is given and would evaluate a group in batches
    other than those recorded.
    """
    if existing is None:
        return {}
    groups = existing.get("groups", [])[: len(runner.res.groups)]
    recorded = {g: int(x["batch"]) for g, x in enumerate(groups) if "batch" in x}
    if batch_size is not None:
        for g, b in recorded.items():
            now = runner.slice_rows(g)
            if now != b:
                raise LvflowError(
                    f"batch_size: {out_dir} was evaluated in batches of {b} configurations (group {g}), not "
                    f"{now}; rerun without a batch size to resume it with its own"
                )
    return recorded


@_holding_out_lock
def sweep(
    grid: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    *,
    configs: Sequence[Mapping[str, Any]] | None = None,
    spec=None,
    out=None,
    curve: bool | None = None,
    schedule: str | None = None,
    horizon: bool | None = None,
    chunk_size: int | None = None,
    batch_size: int | None = None,
    max_steps: int | None = None,
    devices=None,
    progress: bool | None = None,
    summary: bool = True,
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    on_chunk: Callable[[int, Path | None], None] | None = None,
) -> SweepResult:
    """`predict` over a grid or a list of configurations: batched with `jax.vmap`, sharded over
    devices (and hosts), written in resumable chunks.

    ```python
    res = lvflow.sweep({"alpha1": 2, "alpha2": [0.6, 0.8, 1.0], "modes": 100,
                        "eps": "log:1e-8:1e-4:5"}, out="sweep-dir")
    res["t_first"], res["exponent_fit"]      # one row per configuration
    lvflow.load_sweep("sweep-dir")           # the same, read back
    ```

    **Configurations.** Each has the inputs of `predict` (its API names; `lr` and `points` are
    accepted too): the system — `alpha1`, `alpha2`, `modes` (a power-law spectrum, Thm 9), or
    `system` (a file as `lvflow predict --system`, a `LotkaVolterra` / `LowRankLotkaVolterra`, or a
    mapping of arrays `r`, `C` / `zeta`, `V` / `r`, `d`, `U`), or `architecture` with `data` (and
    `kernel`) — the initial scale — `eps` with `beta` (`c_k = k^{−β}`) or `c`, or `z0`, or
    `init_std` with `width` — and `learning_rate`, `rho`, `t1`, `num_points`, and the ODE's `rtol`,
    `atol` (`predict`'s defaults: 1e-10, 1e-12). `grid` maps each to one value or a list (also
    `"a,b,c"`, `"lin:a:b:n"`, `"log:a:b:n"`) and sweeps their product (the last varying fastest);
    several grids may be given as a list; `configs` lists configurations that are not a grid; a
    `spec` file (TOML or JSON: sections `grid`, `configs`, `options`) holds either.

    **What is computed**, per configuration (columns of the `SweepResult`): per mode `t_star` (the
    finite-ε switch-on time, Eq. 158 for diagonal `C`, the ODE otherwise), `tau_star` and
    `plateau_loss` (the ε → 0 schedule, Eq. 168), `z_inf`, `r`, `V`; and `t1`, `success`,
    `num_steps`, `n_on`, `t_first` (the first switch-on time `t*`; the loss's first drop, read off
    the curve, comes earlier: `drop1_t` with `curve=True`), `t_last`, `steps_first`
    (`t_first/η`), `tau_first`, `exponent` (Thm 9's `(α₁−1)/α₂`) and `exponent_fit` (the slope of
    −ln(plateau loss) against ln t* over the 2nd to ⌈K/10⌉-th switch-ons: the exponent a finite-ε run
    shows); with `curve=True` also the curve and its drops as `predict`'s drops table reads them
    (`loss_drops`): `n_drops`, and for the first three drops `drop{j}_t`, `drop{j}_step`,
    `drop{j}_excess_loss_before`, `drop{j}_excess_loss_after`, `drop{j}_complete` (see
    `SweepResult`); for an architecture on data, `predict`'s validity horizon `horizon_t`,
    `horizon_step` and `horizon_floor_t` (`predict`'s, read off the sweep's own curve and `z(t)` on
    the host, one ratio evaluation per configuration; NaN for the other systems). They
    are `predict`'s numbers for the same inputs, its time grid included: both evaluate
    one function (`lvflow._workflow.predict_kernel.configuration`), `predict` once and the sweep vmapped (a
    mode switched on and later off by a competitor gets its switch-on time in both; the excess
    loss is measured from the loss's true minimum, also for a singular `C`); a failed ODE solve is
    a row with `success = False`, not an exception.

    **How.** Configurations of equal shapes (the same `K`, structure of `C`, `c` given or not,
    curve length and tolerances) form a group; each group is evaluated in batches by one compiled,
    vmapped function, each batch sharded over the local devices along a 1-D mesh axis `"batch"`
    (padded to a multiple of the device count within its group; the padding is dropped); on a
    CPU the batches of an ODE group run side by side in threads, one per core the devices leave.
    A diagonal `C` is the closed form (Thm 6), a coupled one `solve_lv`; a coupled system's ε → 0
    schedule is computed once on the host (it does not depend on ε).

    **Files** (with `out`): `manifest.json`, then `chunk-NNNNNN.npz` of `chunk_size`
    configurations each (the configuration beside its results), each written atomically; when all
    exist, `summary.json` and `summary.png`. Run the same sweep again into the same directory after
    a crash or `kill -9` and it resumes: finished chunks are skipped, none is evaluated twice.
    The directory is locked while the sweep runs (`run.sweep_directory`): a second sweep into it,
    from another process or thread, is refused with an `LvflowError`; a sweep that fails before
    writing a chunk leaves no file behind. Without `out` nothing is written.

    **Arguments** (besides `grid`, `configs`, `spec`, `out`):

    - `curve`: also the excess-loss curve at `predict`'s `2·num_points − 1` times, and its drops
      (default False).
    - `horizon`: for the configurations of an architecture on data, `predict`'s validity horizon
      (`horizon_t`, `horizon_step`, `horizon_floor_t`; default True; for a network that is not
      exactly its NQF, the curve is evaluated with `z(t)` and the next term's ratio at up to 16 of
      its times on the host, per configuration).
    - `schedule`: `"limit" (the ε → 0 schedule, as `predict`; default), `"corrected"` (the
      finite-ε corrected schedule, one host `plateau_schedule` per configuration) or `"none"`.
    - `chunk_size`: configurations per chunk file (default 4096; a rerun takes the manifest's).
    - `batch_size`: configurations per device per call (default 4096 for the closed form; for the
      ODE 32 on a CPU, 1024 on an accelerator). It does not depend on the device count, so the
      numbers do not either, bit for bit. The manifest records it per group, and a rerun keeps
      those batches (a `batch_size` that would change them is refused).
    - `max_steps`: the ODE's step budget (default 16384).
    - `devices`: the local devices to shard over (default all; an int takes the first that many).
    - `progress`: a progress bar with an ETA (default: only on a terminal).
    - `summary`: write `summary.json` and `summary.png` when complete (default True).
    - `coordinator`, `num_processes`, `process_id`: several processes (one per host). With a
      `coordinator` (`"host:port"`, or `"auto"` for a cluster JAX detects) `jax.distributed` is
      initialised; without one each process just takes its share. Process `p` of `P` evaluates
      and writes chunks `c` with `c mod P = p` into the shared `out`; the summary comes once all
      exist. `jax.distributed` waits at most `COORDINATOR_TIMEOUT` (120 s) for the coordinator and
      the other processes, then ends the process with one line and exit status 2 (call
      `jax.distributed.initialize` first for another timeout).
    - `on_chunk`: called as `on_chunk(chunk_id, path)` after each chunk is written (`path` None
      in memory).

    **Returns:** a `SweepResult` (all configurations; with several processes and no coordinator,
    those present when this process finished — `complete` says which).

    **Raises:** `LvflowError` naming the input and configuration for bad input (also a
    configuration `predict` would refuse, e.g. ε above a mode's plateau), for an `out` holding a
    different sweep or locked by another sweep running, for a sweep whose results need more
    memory than this machine has, and for a spec without configurations.
    """
    t_start = time.perf_counter()
    grids: list = []
    if spec is not None:
        sp = load_spec(spec)
        grids, configs_spec, opts = sp["grids"], sp["configs"], sp["options"]
    else:
        configs_spec, opts = [], {}
    if grid is not None:
        grids += [grid] if isinstance(grid, Mapping) else list(grid)
    all_configs = list(configs_spec) + list(configs or [])
    curve = bool(opts.get("curve", False) if curve is None else curve)
    horizon = opts.get("horizon", True) if horizon is None else horizon
    if not isinstance(horizon, (bool, np.bool_)):
        raise LvflowError(f"horizon: must be True or False, got {horizon!r}")
    schedule = opts.get("schedule", "limit") if schedule is None else schedule
    names = [s.value for s in Schedule]
    if schedule not in names:
        raise LvflowError(f"schedule: must be one of {', '.join(names)}, got {schedule!r}")
    max_steps = int(opts.get("max_steps", 16384) if max_steps is None else max_steps)
    if max_steps < 1:
        raise LvflowError(f"max_steps: must be a positive integer, got {max_steps}")
    batch_size = opts.get("batch_size") if batch_size is None else batch_size
    if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or batch_size < 1):
        raise LvflowError(f"batch_size: must be a positive integer, got {batch_size!r}")
    batch_size = None if batch_size is None else int(batch_size)
    chunk_size = opts.get("chunk_size") if chunk_size is None else chunk_size
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
    ):
        raise LvflowError(f"chunk_size: must be a positive integer, got {chunk_size!r}")
    if progress is not None and not isinstance(progress, bool):
        raise LvflowError(f"progress: must be True, False or None, got {progress!r}")

    out_dir = None if out is None else Path(os.fspath(out))
    existing = None
    if out_dir is not None:
        if out_dir.exists() and not out_dir.is_dir():
            raise LvflowError(f"out: {out_dir} exists and is not a directory")
        existing = read_manifest(out_dir) if out_dir.is_dir() else None
        if chunk_size is None and existing is not None:
            chunk_size = int(existing.get("options", {}).get("chunk_size", DEFAULT_CHUNK_SIZE))
    chunk_size = int(chunk_size or DEFAULT_CHUNK_SIZE)

    # jax.distributed must start before anything touches a JAX device (loading systems does)
    p_index, p_count, dist = _distributed(coordinator, num_processes, process_id)
    if out_dir is None and p_count > 1:
        raise LvflowError("out: a sweep over several processes needs a shared output directory")

    plan = expand(grids, all_configs)
    res = resolve(plan, curve=curve, horizon=bool(horizon))
    chunks = make_chunks(res.group_of, chunk_size)
    options = {
        "curve": curve,
        "schedule": schedule,
        "max_steps": max_steps,
        "chunk_size": chunk_size,
        "parameters": list(plan.columns),
    }
    with_horizon = bool(horizon) and has_architectures(res)
    if has_architectures(res):  # (the hash of a sweep without architectures is as before)
        options["horizon"] = bool(horizon)
    digest = spec_hash(plan.definition, options)

    mine = [c for c in chunks if c.id % p_count == p_index]

    if out_dir is not None:
        if existing is not None and existing.get("spec_hash") != digest:
            made = existing.get("options", {}).get("chunk_size")
            if (
                made != chunk_size
                and spec_hash(plan.definition, {**options, "chunk_size": made}) == existing["spec_hash"]
            ):
                raise LvflowError(f"chunk_size: {out_dir} holds this sweep in chunks of {made}, not {chunk_size}")
            differs = manifest_difference(existing, plan.definition, options)
            differs = differs or f"spec hash {existing.get('spec_hash')}, this one {digest}"
            raise LvflowError(
                f"out: {out_dir} holds a different sweep ({differs}); use a new directory, or delete that one"
            )
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file on the path, no permission, a read-only file system
            raise LvflowError(f"out: cannot create the directory {out_dir}: {e.strerror or e}") from None
        if not os.access(out_dir, os.W_OK | os.X_OK):
            raise LvflowError(f"out: directory is not writable (permission denied): {out_dir}")
    runner = Runner(
        res,
        mesh=make_mesh(devices),
        schedule=Schedule(schedule),
        max_steps=max_steps,
        batch_size=batch_size,
        chunk_size=chunk_size,
    )
    runner.group_batches = _recorded_batches(existing, out_dir, batch_size, runner)
    if out_dir is not None:
        if existing is None:
            # every process writes the same manifest (atomically): no process waits for another
            batches = [runner.slice_rows(g) for g in range(len(res.groups))]
            write_manifest(
                out_dir,
                manifest(res, chunks, spec_hash=digest, definition=plan.definition, options=options, batches=batches),
            )
        remove_stale_temporaries(out_dir, {c.id for c in mine})
    todo = [c for c in mine if out_dir is None or not exists(chunk_path(out_dir, c))]
    skipped = len(mine) - len(todo)
    bar = progress_bar(
        progress, sum(c.rows.size for c in mine), sum(c.rows.size for c in mine) - sum(c.rows.size for c in todo)
    )
    widths = {
        **dict.fromkeys(PER_MODE, int(res.K.max())),
        **dict.fromkeys(CURVE, max(2 * g.points - 1 for g in res.groups)),
    }
    table = Assembler(plan.n, widths)  # the results in memory, filled without `out`
    try:
        for c in todo:
            cols = chunk_columns(res, c.group, c.rows, runner.evaluate(c.group, c.rows), horizon=with_horizon)
            path = None
            if out_dir is None:
                table.add(cols)
            else:
                path = chunk_path(out_dir, c)
                write_chunk(path, cols, digest)
            if bar is not None:
                bar.update(c.rows.size)
            if on_chunk is not None:
                on_chunk(c.id, path)
    finally:
        if bar is not None:
            bar.close()
    stats = {
        "chunks": len(chunks),
        "chunks_mine": len(mine),
        "chunks_evaluated": len(todo),
        "chunks_skipped": skipped,
        "configs_evaluated": int(runner.evaluated_rows),
        "seconds": 0.0,
        "devices": runner.n_dev,
        "process_index": p_index,
        "process_count": p_count,
    }
    params = tuple(plan.columns)
    if out_dir is None:
        stats["seconds"] = time.perf_counter() - t_start
        return SweepResult(table.result(), stats, None, True, params)
    if dist and p_count > 1:
        _barrier(f"lvflow-sweep-{digest}")
    complete = all(exists(chunk_path(out_dir, c)) for c in chunks)
    result = load_sweep(out_dir, partial=not complete)
    if complete and summary and (p_index == 0 or not dist):
        save_json(out_dir / "summary.json", summarize(result))
        plot_summary(result, out_dir / "summary.png")
    stats["seconds"] = time.perf_counter() - t_start
    stats["chunks_missing"] = result.stats.get("chunks_missing", 0)
    return SweepResult(result.columns, stats, str(out_dir), complete, params)
