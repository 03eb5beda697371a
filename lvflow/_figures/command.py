"""`lvflow figures` (its options are `cli.py`): makes the figures named, then REPRODUCTION.md."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .._core.errors import LvflowError
from . import load
from .cli import selected
from .reproduction import write


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        names = selected(args.only)
        try:  # the folder before minutes of figures, not after
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file of that name, no permission
            raise LvflowError(f"--out: cannot create the folder {out}: {e.strerror or e}") from None
        if not os.access(out, os.W_OK | os.X_OK):
            raise LvflowError(f"--out: folder is not writable (permission denied): {out}")
    except LvflowError as e:
        print(f"lvflow figures: error: {e}", file=sys.stderr)
        return 2
    failed = []
    t_all = time.perf_counter()
    for i, name in enumerate(names, 1):
        mod = load(name)
        print(f"[{i}/{len(names)}] {name}: {mod.TITLE} ...", flush=True)
        t0 = time.perf_counter()
        try:
            summary = mod.make(out, quick=args.quick)
        except Exception as e:  # one failing figure must not stop the others
            failed.append(name)
            print(f"[{i}/{len(names)}] {name}: FAILED ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
            continue
        print(
            f"[{i}/{len(names)}] {name}: done in {time.perf_counter() - t0:.1f} s -> "
            f"{out / (name + '.png')}, .pdf, .json",
            flush=True,
        )
        for c in summary.get("claims", []):
            print(f"    - {c['claim']}\n      {c['verdict']}", flush=True)
    print(f"{write(out)}: every figure's claims, choices and measured values", flush=True)
    print(
        f"{len(names) - len(failed)}/{len(names)} figure(s) in {time.perf_counter() - t_all:.1f} s"
        + (f"; failed: {', '.join(failed)}" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0
