"""`lvflow demo`: predict the plateaus of the paper's Fig 3 system and check them against Eq. 158."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import lvflow

from .io import PLOT_SUFFIXES, check_suffix
from .predict_cli import FLAGS as FLAGS  # the same options as `lvflow predict`


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--eps", type=float, default=1e-5, help="initial scale ε, z_k(0) = ε (default 1e-5)")
    parser.add_argument(
        "--plot", type=Path, default=None, help="write the predicted loss curve here (.png, .pdf, .svg)"
    )


def run(args: argparse.Namespace) -> int:
    if args.plot is not None:
        check_suffix("--plot", args.plot, PLOT_SUFFIXES)
    # Fig 3 (left/middle): five decoupled modes, r = 2^{-k}, C_kk = 1, GD with lr 0.01.
    r = 0.5 ** np.arange(5)
    system = lvflow.LotkaVolterra(r, np.eye(5), y2=float(np.sum(r**2) / 8))
    pred = lvflow.predict(system, eps=args.eps, learning_rate=0.01)
    print(f"Five modes r_k = {', '.join(f'{v:g}' for v in r)}, C = I, z_k(0) = ε = {args.eps:g}, lr 0.01\n")
    print(pred.table())
    print(pred.direction_table())
    # Independent check: Thm 6 is exact here, so Eq. 158 must reproduce the solver's times.
    eq158 = np.asarray(lvflow.ignition_time(r, np.ones(5), np.ones(5), args.eps))
    t_star = np.asarray(pred.t_star)[np.argsort(np.asarray(pred.order))]
    # relative where the closed form is positive; a mode that starts above its target has t* = 0
    scale = np.where(eq158 > 0, eq158, 1.0)
    err = float(np.max(np.abs(t_star - eq158) / scale))
    print(f"\nmax relative difference from the closed form (Eq. 158): {err:.1e}")
    if args.plot is not None:
        pred.plot(args.plot, title="lvflow demo: the paper's Fig 3 system")
        print(f"predicted loss curve written to {args.plot}")
    return 0
