"""`lvflow sweep`: `lvflow predict`'s inputs, each with one value or a list, swept as a grid (or from a
TOML/JSON spec), batched and sharded over devices and hosts, written to resumable chunks.

Exit codes: 0 success, 2 bad input (one line on stderr naming the input and the problem; also an
output directory in use by another sweep, or holding a different one), 1 a configuration whose
solve failed (after the summary; the rows are kept, with `success` False) or an internal error (one
line; `--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys

from .grid import PARAMETERS

# API names as the flags the user typed (`lvflow` reports errors with them).
FLAGS = {name: p.flag for name, p in PARAMETERS.items()} | {
    "chunk_size": "--chunk-size",
    "batch_size": "--batch-size",
    "max_steps": "--max-steps",
    "devices": "--devices",
    "num_processes": "--num-processes",
    "process_id": "--process-id",
    "coordinator": "--coordinator",
    "coordinator_timeout": "--coordinator-timeout",
    "out": "--out",
}

EXAMPLES = """\
values: one value, a comma-separated list (0.6,0.8,1.0), or a range lin:START:STOP:COUNT /
log:START:STOP:COUNT; the sweep is the grid of all combinations (the last flag varying fastest).

examples:
  lvflow sweep --alpha1 2 --alpha2 0.6,0.8,1.0 --modes 100 --eps 1e-4,1e-6,1e-8 --out sweep1
  lvflow sweep --system a.npz,b.npz --eps log:1e-10:1e-3:15 --lr 0.01 --out sweep2
  lvflow sweep --spec sweep.toml --out sweep3          # lists that are not grids
  lvflow sweep ... --out DIR                           # again after a crash: resumes
  lvflow sweep ... --cpu-devices 2 --out DIR           # the CPU as 2 virtual devices (sharding on one machine)
  lvflow sweep ... --coordinator host0:1234 --num-processes 2 --process-id 0 --out /shared/DIR
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `lvflow sweep`: `lvflow predict`'s inputs as lists, and the sweep's own."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    grid = parser.add_argument_group("the configurations (lvflow predict's inputs; each V or V1,V2,… or a range)")
    for name, p in PARAMETERS.items():
        flags = [p.flag] + (["--learning-rate"] if name == "learning_rate" else [])
        grid.add_argument(*flags, dest=name, metavar="V", help=p.help)
    grid.add_argument("--spec", metavar="FILE", help="TOML/JSON spec: [grid] tables, [[configs]] lists, [options]")
    run = parser.add_argument_group("the sweep")
    run.add_argument("--out", metavar="DIR", required=True, help="output directory (chunks, manifest, summary)")
    run.add_argument("--curve", action="store_true", help="also store the excess-loss curve of every configuration")
    run.add_argument(
        "--schedule",
        choices=("limit", "corrected", "none"),
        help="the eps -> 0 schedule (default limit, as predict), the finite-eps corrected one, or none",
    )
    run.add_argument("--chunk-size", type=int, metavar="N", help="configurations per chunk file (default 4096)")
    run.add_argument("--batch-size", type=int, metavar="N", help="configurations per device per call")
    run.add_argument("--max-steps", type=int, metavar="N", help="step budget of each ODE solve (default 16384)")
    dev = parser.add_argument_group("devices and hosts")
    dev.add_argument("--devices", type=int, metavar="N", help="use the first N local devices (default all)")
    dev.add_argument(
        "--cpu-devices",
        type=int,
        metavar="N",
        help=(
            "split the CPU into N virtual devices, to try sharding on one machine (not needed for speed: "
            "one device already runs the batches on every core)"
        ),
    )
    dev.add_argument("--coordinator", metavar="HOST:PORT", help="jax.distributed coordinator ('auto': detect)")
    dev.add_argument(
        "--coordinator-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="wait this long for the coordinator and every process to join, then exit 2 with one line (default 120)",
    )
    dev.add_argument("--num-processes", type=int, metavar="P", help="number of processes (one per host)")
    dev.add_argument("--process-id", type=int, metavar="I", help="this process's number, 0…P-1")
    out = parser.add_argument_group("output")
    out.add_argument("--no-summary", action="store_true", help="skip summary.json and summary.png")
    out.add_argument("--json", action="store_true", help="print the summary JSON to stdout")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    out.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    """Run `lvflow sweep`; returns the exit code (errors are reported by `lvflow`'s `main`).

    The output directory is locked while the sweep runs (by `lvflow.sweep` itself,
    `run.sweep_directory`); a sweep that fails before writing a chunk leaves no file behind.

    **Raises:** `LvflowError` for bad input, a directory in use or holding a different sweep;
    `SolverError` (after the summary is printed) when a configuration's solve failed.
    """
    from pathlib import Path

    from .._core.errors import LvflowError

    if args.cpu_devices is not None:
        if args.cpu_devices < 1:
            raise LvflowError("--cpu-devices: must be a positive integer")
        from .._workflow.cli import configure_jax

        try:  # before JAX starts its CPU backend
            configure_jax(jax_num_cpu_devices=int(args.cpu_devices))
        except RuntimeError as e:
            raise LvflowError(f"--cpu-devices: too late to split the CPU ({e})") from None
    grid = {name: getattr(args, name) for name in PARAMETERS if getattr(args, name) is not None}
    if grid and args.spec:
        raise LvflowError("--spec: give either a spec file or the grid as flags, not both")
    if not grid and not args.spec:
        raise LvflowError(
            "input: give the configurations as flags (e.g. --alpha1 2 --alpha2 0.8 --modes 100 "
            "--eps 1e-4,1e-6) or --spec FILE"
        )
    from .sweep import read_spec

    spec = read_spec(args.spec) if args.spec else None
    if args.coordinator is not None:  # before anything touches a device; within --coordinator-timeout
        from .sweep import _distributed

        _distributed(
            args.coordinator,
            args.num_processes,
            args.process_id,
            timeout=args.coordinator_timeout,
            flags=("--coordinator", "--coordinator-timeout"),
        )
    return _report(args, _sweep(args, grid, spec, Path(args.out)))


def _sweep(args: argparse.Namespace, grid: dict, spec: dict | None, out):
    """`lvflow.sweep` with the command's options."""
    from .sweep import sweep

    return sweep(
        grid or None,
        spec=spec,
        out=out,
        curve=True if args.curve else None,
        schedule=args.schedule,
        chunk_size=args.chunk_size,
        batch_size=args.batch_size,
        max_steps=args.max_steps,
        devices=args.devices,
        progress=False if args.quiet else None,
        summary=not args.no_summary,
        coordinator=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
    )


def _report(args: argparse.Namespace, res) -> int:
    """Print the summary (or with `--json` the summary JSON); 0, or `SolverError` when a
    configuration's solve failed (its row is kept, with `success` False)."""
    import numpy as np

    from .._core.errors import SolverError

    st = res.stats
    n = len(res)
    failed = np.flatnonzero(~res["success"].astype(bool)) if n else np.zeros(0, dtype=int)
    if args.json and res.complete and not args.no_summary:
        with open(os.path.join(args.out, "summary.json"), encoding="utf-8") as f:
            sys.stdout.write(f.read())
        sys.stdout.flush()
    else:
        share = f" (process {st['process_index']} of {st['process_count']})" if st["process_count"] > 1 else ""
        count = f"{n if res.complete else '…'} configurations" + (f" ({failed.size} failed)" if failed.size else "")
        print(f"lvflow sweep: {count}, {st['chunks']} chunks → {args.out}{share}")
        print(
            f"evaluated {st['chunks_evaluated']} chunks ({st['configs_evaluated']} configurations), "
            f"skipped {st['chunks_skipped']} already done, in {st['seconds']:.3g} s on {st['devices']} device(s)"
        )
        if res.complete:
            if not args.no_summary:
                print(f"summary: {os.path.join(args.out, 'summary.json')}, {os.path.join(args.out, 'summary.png')}")
            print(f'load: lvflow.load_sweep("{args.out}")')
        else:
            print(f"{st.get('chunks_missing', 0)} chunks still missing (other processes); rerun to finish")
        sys.stdout.flush()
    if failed.size:
        first = ", ".join(str(int(i)) for i in res["index"][failed[:5]]) + (", …" if failed.size > 5 else "")
        where = "" if args.no_summary or not res.complete else f" (listed in {os.path.join(args.out, 'summary.json')})"
        raise SolverError(
            f"{failed.size} of {n} configurations failed (their ODE solve did not finish; e.g. --max-steps too "
            f"small): configuration(s) {first}; recorded with success = False in {args.out}/chunk-*.npz{where}"
        )
    return 0
