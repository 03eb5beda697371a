"""`lvflow figures`: regenerate the paper's figures (PNG + PDF + JSON summary each)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import FIGURES, load

FLAGS: dict[str, str] = {}  # errors name no API argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="figures", type=Path, help="output folder (default: figures/)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="reduced sizes: all figures in under 5 minutes on 2 cores (default: the paper's sizes)",
    )
    parser.add_argument(
        "--only", default=None, metavar="NAMES", help=f"comma-separated subset of: {', '.join(FIGURES)} (default: all)"
    )


def selected(only: str | None) -> list[str]:
    """Figure names from `--only` (validated), in registry order."""
    from .._core.errors import LvflowError

    if only is None:
        return list(FIGURES)
    names = [n.strip() for n in only.split(",") if n.strip()]
    bad = [n for n in names if n not in FIGURES]
    if bad or not names:
        raise LvflowError(
            f"--only: unknown figure(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(FIGURES)}"
        )
    return [n for n in FIGURES if n in names]


def run(args: argparse.Namespace) -> int:
    from .._core.errors import LvflowError

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
    from .reproduction import write

    print(f"{write(out)}: every figure's claims, choices and measured values", flush=True)
    print(
        f"{len(names) - len(failed)}/{len(names)} figure(s) in {time.perf_counter() - t_all:.1f} s"
        + (f"; failed: {', '.join(failed)}" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0
