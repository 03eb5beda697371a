"""`lvflow fit LOG`'s options (the command itself is `command.py`): fit a training curve, predict
the drops to come and the final loss.

Exit codes: 0 success, 2 bad input (one line on stderr naming the input and the problem),
1 an internal error (one line; `--debug` shows the traceback).
"""

from __future__ import annotations

import argparse

EXAMPLES = """\
examples:
  lvflow fit train.csv --lr 0.01                      # columns step,loss (optional lr)
  lvflow fit train.json --until 8000 --plot fit.png   # fit the first 8000 steps, compare with the rest
  lvflow fit train.csv --family power-law --offset 0 --save fit.json
"""

# API names as the flags the user typed (`lvflow` reports errors with them).
FLAGS = {
    "learning_rate": "--lr",
    "until": "--until",
    "modes": "--modes",
    "max_modes": "--max-modes",
    "offset": "--offset",
    "beta": "--beta",
    "bins": "--bins",
    "level": "--level",
    "horizon": "--horizon",
    "family": "--family",
    "criterion": "--criterion",
    "prior_width": "--prior-width",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `lvflow fit`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument(
        "log",
        metavar="LOG",
        help="training log: .csv with a header naming step and loss columns (optional lr), or .json "
        "(a list of records or an object of columns)",
    )
    m = parser.add_argument_group("model")
    m.add_argument(
        "--family",
        choices=("auto", "modes", "power-law"),
        default="auto",
        help="decoupled modes, a power-law spectrum, or whichever the criterion prefers (default auto)",
    )
    m.add_argument("--modes", type=int, help="a fixed number of modes (default: chosen by the criterion)")
    m.add_argument("--max-modes", type=int, default=8, help="the most decoupled modes tried (default 8)")
    m.add_argument("--offset", type=float, help="fix the final loss L_inf (e.g. 0 for a target the model fits exactly)")
    m.add_argument("--beta", type=float, help="fix the power law's initialisation exponent (default fitted)")
    m.add_argument("--criterion", choices=("bic", "aic"), default="bic", help="information criterion (default bic)")
    m.add_argument("--prior-width", type=float, help="width of the prior on ln c_k (default: from the data)")
    d = parser.add_argument_group("data")
    d.add_argument(
        "--lr",
        "--learning-rate",
        dest="learning_rate",
        type=float,
        help="learning rate: time t = lr * step (default: the log's lr column, else t = step)",
    )
    d.add_argument("--until", type=float, metavar="STEP", help="fit the log up to this step; the rest is held out")
    d.add_argument("--bins", type=int, default=200, help="bins of log-time the log is reduced to (default 200)")
    d.add_argument(
        "--no-robust",
        dest="robust",
        action="store_false",
        help="plain least squares (default: the Cauchy loss; spikes count only logarithmically)",
    )
    o = parser.add_argument_group("output")
    o.add_argument("--horizon", type=float, metavar="STEP", help="extrapolate to this step (default: past the drops)")
    o.add_argument("--level", type=float, default=0.95, help="coverage of the intervals (default 0.95)")
    o.add_argument("--plot", metavar="FILE", help="write the observed, fitted and extrapolated curve (.png/.pdf/.svg)")
    o.add_argument("--save", metavar="FILE", help="write every result, atomically (.json or .npz)")
    o.add_argument("--json", action="store_true", help="print JSON to stdout instead of the table")
    o.add_argument("--debug", action="store_true", help="show tracebacks")
