"""`lvflow sweep` (its options are `cli.py`): runs the sweep the flags describe and reports it.

Exit codes: 0 success, 2 bad input (one line on stderr naming the input and the problem; also an
output directory in use by another sweep, or holding a different one), 1 a configuration whose
solve failed (after the summary; the rows are kept, with `success` False) or an internal error (one
line; `--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from .._core.errors import LvflowError, SolverError
from .._workflow.cli import configure_jax
from .cli import PARAMETERS
from .sweep import _distributed, read_spec, sweep


def run(args: argparse.Namespace) -> int:
    """Run `lvflow sweep`; returns the exit code (errors are reported by `lvflow`'s `main`).

    The output directory is locked while the sweep runs (by `lvflow.sweep` itself,
    `run.sweep_directory`); a sweep that fails before writing a chunk leaves no file behind.

    **Raises:** `LvflowError` for bad input, a directory in use or holding a different sweep;
    `SolverError` (after the summary is printed) when a configuration's solve failed.
    """
    if args.cpu_devices is not None:
        if args.cpu_devices < 1:
            raise LvflowError("--cpu-devices: must be a positive integer")
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
    spec = read_spec(args.spec) if args.spec else None
    if args.coordinator is not None:  # before anything touches a device; within --coordinator-timeout
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
    return sweep(
        grid or None,
        spec=spec,
        out=out,
        curve=True if args.curve else None,
        horizon=False if args.no_horizon else None,
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
