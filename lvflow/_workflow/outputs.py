"""The outputs every `lvflow` command writes alike: the table (or JSON) on stdout, then `--save`
and `--plot`, with their file names checked before the computation."""

from __future__ import annotations

import argparse
import sys

from .._core.errors import LvflowError
from .io import PLOT_SUFFIXES, check_suffix, check_writable

_OUTPUTS = (("save", (".json", ".npz")), ("plot", PLOT_SUFFIXES))


def check_output_names(args: argparse.Namespace) -> None:
    """Refuse a `--save`/`--plot` file before a long computation, not after it: its type, its
    directory (missing or not writable) and a directory given as the file name.

    **Raises:** `LvflowError` naming the flag and the path.
    """
    for flag, suffixes in _OUTPUTS:
        path = getattr(args, flag)
        if path is None:
            continue
        check_suffix(f"--{flag}", path, suffixes)
        check_writable(path, f"--{flag}")


def write_outputs(result, args: argparse.Namespace) -> None:
    """The summary (or with `--json` the JSON) on stdout first, so that a failed write loses no
    result; then `--save` and `--plot`, and the files written.

    **Raises:** `LvflowError` naming the flag and the user's path when a write fails (a full disk).
    """
    if args.json:
        sys.stdout.write(result.to_json())
    else:
        print(result.summary(), flush=True)
    for flag, label, write in (("save", "saved", result.save), ("plot", "plot", result.plot)):
        path = getattr(args, flag)
        if not path:
            continue
        try:
            write(path)
        except LvflowError as e:
            head, sep, rest = str(e).partition(": ")
            raise LvflowError(f"--{flag}: {rest if sep and head == 'output' else e}") from None
        except Exception as e:  # noqa: BLE001 — matplotlib refusing the data (NaN or non-positive on a log axis)
            if flag != "plot":
                raise
            kept = "the numbers above" + (f" and --save {args.save}" if args.save else "") + " are complete"
            raise LvflowError(f"--plot: the figure could not be drawn ({' '.join(str(e).split())}); {kept}") from None
        if not args.json:
            print(f"{label}: {path}")
