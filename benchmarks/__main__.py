"""`python -m benchmarks` / `lvflow bench`: run the benchmarks, print the table, write the JSON."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from ._harness import environment, table
from .config import Config

FLAGS: dict[str, str] = {}  # errors name no API argument (the `lvflow bench` contract)

#: benchmark name → module (run in this order).
BENCHMARKS = {
    "glv": "benchmarks.glv",
    "gd": "benchmarks.gd",
    "batch": "benchmarks.batch",
    "schedule": "benchmarks.schedule",
    "train": "benchmarks.train",
    "limit": "benchmarks.limit",
    "grad": "benchmarks.grad",
    "fit": "benchmarks.fit",
    "fit_calibration": "benchmarks.fit_calibration",
    "sweep": "benchmarks.sweep",
    "realdata": "benchmarks.realdata",
    "predict_train": "benchmarks.predict_train",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmarks run, not their speed")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BENCHMARKS),
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--case",
        action="append",
        default=None,
        metavar="TEXT",
        help="realdata: run only the cases whose name contains TEXT (repeatable; e.g. 'QK', 'one-hot')",
    )
    parser.add_argument("--out", default=None, help="write the rows and the environment as JSON to this file")
    parser.add_argument("--repeats", type=int, default=3, help="warm timings: best of this many runs (default 3)")
    parser.add_argument(
        "--rtol", type=float, default=1e-8, help="relative tolerance on ln z, lvflow and scipy (default 1e-8)"
    )
    parser.add_argument("--atol", type=float, default=1e-10, help="absolute tolerance on ln z (default 1e-10)")
    parser.add_argument("--no-cold", dest="cold", action="store_false", help="skip the cold (compile-included) timings")
    parser.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads for numpy/scipy (default 1: multi-threaded OpenBLAS collapses under load "
        "on a shared machine; 0 leaves the library default)",
    )


def run(args: argparse.Namespace) -> int:
    import lvflow  # noqa: F401  (float64)

    if args.repeats < 1:
        print("benchmarks: --repeats must be ≥ 1", file=sys.stderr)
        return 2
    cfg = Config(
        smoke=args.smoke,
        repeats=args.repeats,
        rtol=args.rtol,
        atol=args.atol,
        cold=args.cold,
        cases=tuple(args.case or ()),
    )
    names = args.only or list(BENCHMARKS)
    limiter = None
    if args.blas_threads > 0:
        from threadpoolctl import threadpool_limits

        limiter = threadpool_limits(limits=args.blas_threads, user_api="blas")
    rows, seconds = [], {}
    env = environment()
    try:
        for name in names:
            t = time.perf_counter()
            new = importlib.import_module(BENCHMARKS[name]).run(cfg)
            seconds[name] = time.perf_counter() - t
            rows += new
            print(table(new).split("\n", 2)[-1] if rows is not new and len(rows) > len(new) else table(new), flush=True)
    finally:
        if limiter is not None:
            limiter.restore_original_limits()
    env["loadavg_after"] = environment()["loadavg_1_5_15"]
    print(f"\n{table(rows)}\n")
    if args.out:
        from lvflow._workflow.io import save_json

        save_json(
            args.out,
            {"config": vars(args), "environment": env, "bench_seconds": seconds, "rows": [r.as_dict() for r in rows]},
        )
        print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
