"""`lvflow fit LOG` (its options are `cli.py`): fits the log, writes the table and files.

Exit codes: 0 success, 2 bad input (one line on stderr naming the input and the problem),
1 an internal error (one line; `--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import warnings

from .._workflow.outputs import check_output_names, write_outputs
from .fit import fit


def run(args: argparse.Namespace) -> int:
    """Run `lvflow fit`; returns the exit code (errors are reported by `lvflow`'s `main`)."""
    check_output_names(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the result's warnings are printed with the table
        result = fit(
            args.log,
            learning_rate=args.learning_rate,
            family=args.family.replace("-", "_"),
            until=args.until,
            modes=args.modes,
            max_modes=args.max_modes,
            offset=args.offset,
            beta=args.beta,
            criterion=args.criterion,
            bins=args.bins,
            robust=args.robust,
            prior_width=args.prior_width,
            level=args.level,
            horizon=args.horizon,
        )
    write_outputs(result, args)
    return 0
