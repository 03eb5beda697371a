"""`lvflow predict` (its options are `predict_cli.py`): builds the system from the flags, runs
`predict`, writes the tables and files.

Exit codes: 0 success, 2 bad input (one line on stderr naming the input and the problem),
1 a solver failure or an internal error (one line; `--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from .._core.errors import LvflowError, NotCommutingError
from .._core.validate import as_array
from .._glv.lv import AbstractLotkaVolterra
from .._glv.reduce import reduce_to_lv
from .io import load_array, load_arrays
from .outputs import check_output_names, write_outputs
from .predict import predict
from .predict_cli import FLAGS
from .predict_data import (
    architecture_inputs,
    architecture_network,
    input_side_shape,
    kernel_architectures,
    nqf_from_data,
)
from .predict_inputs import beta_init, check_below_plateau, lv_from_arrays, power_law_lv
from .spec import Configurations, check_configurations

#: The parameters of a configuration (`lvflow._workflow.spec`) that are flags of the same name.
_SAME_NAME = ("system", "architecture", "data", "kernel", "value_size", "alpha1", "alpha2", "modes", "eps", "c", "beta")
_SAME_NAME += ("z0", "init_std", "width", "learning_rate", "rho", "t1")


def _build(args):
    """The system, the keyword arguments of `predict` and the `--data` arrays (`None` without
    `--architecture`) from the parsed flags."""
    values = {name: getattr(args, name) for name in _SAME_NAME} | {"num_points": args.points}
    check_configurations(Configurations.one(values, spell=lambda name: FLAGS.get(name, name)))
    kw: dict[str, Any] = dict(
        eps=args.eps,
        init_std=args.init_std,
        width=args.width,
        learning_rate=args.learning_rate,
        rho=args.rho,
        t1=args.t1,
        num_points=args.points,
        force_lv=args.force_lv,
        # A bar redraws in place: on a terminal, or when asked; never flooding a redirected log.
        progress=not args.quiet and (args.progress or sys.stderr.isatty()),
    )
    kernels = kernel_architectures()
    if args.kernel is not None and args.architecture not in kernels:
        raise LvflowError(f"--kernel: only used with --architecture {' or '.join(kernels)} (got {args.architecture})")
    arrays = None
    if args.system is not None:
        system = lv_from_arrays(load_arrays(args.system, name="--system"), name="--system")
        kw["source"] = f"{system.K}-mode gLV from {args.system}"
    elif args.architecture is not None:
        arrays = load_arrays(args.data, name="--data")
        system = nqf_from_data(
            args.architecture, arrays, kernel=args.kernel, value_size=args.value_size or 1, name="--data"
        )
        kw["source"] = f"{args.architecture} on {args.data} ({system.m} samples)"
        if not args.no_horizon:  # the network itself, for the validity horizon (Thm 13's next term along M)
            kw["network"], kw["inputs"] = architecture_network(
                args.architecture, arrays, kernel=args.kernel, value_size=args.value_size or 1, width=args.width,
                name="--data",
            )  # fmt: skip
            kw["horizon_fraction"] = args.horizon_fraction
        x = arrays.get("x", arrays.get("X"))
        if x is not None:
            kw["input_shape"] = input_side_shape(args.architecture, np.shape(x), args.kernel)
        if args.beta is not None:  # c_k = k^-beta needs the modes: reduce now (Assumption 1)
            try:
                system = reduce_to_lv(system)
            except NotCommutingError as e:
                raise LvflowError(
                    f"--beta: needs modes, but {args.architecture} on {args.data} does not reduce to a gLV ({e})"
                ) from None
            for key in ("network", "inputs", "horizon_fraction"):  # a gLV has no network: no validity horizon
                kw.pop(key, None)
    else:
        system = power_law_lv(alpha1=args.alpha1, alpha2=args.alpha2, modes=args.modes)
        kw["alpha"] = (args.alpha1, args.alpha2) if args.alpha1 > 1 else None
        kw["source"] = f"power law alpha1 = {args.alpha1:g}, alpha2 = {args.alpha2:g}, {args.modes} modes"
    if args.z0 is not None:
        kw["z0"] = load_array(args.z0, name="--z0").reshape(-1)
    if args.c is not None:
        kw["c"] = load_array(args.c, name="--c").reshape(-1)
    if isinstance(system, AbstractLotkaVolterra):  # an NQF has no modes yet (with --beta it was reduced above)
        if args.beta is not None:
            beta = float(as_array("--beta", args.beta, ndim=0))
            kw["c"] = beta_init(beta, system.K)
            if not np.all((kw["c"] > 0) & np.isfinite(kw["c"])):
                raise LvflowError(
                    f"--beta: c_k = k^-beta leaves float64's range for {system.K} modes (beta = {beta:g})"
                )
        if "c" in kw and args.eps is not None:
            check_below_plateau(system, args.eps, kw["c"], name="--beta" if args.beta is not None else "--c")
    return system, kw, arrays


def run(args: argparse.Namespace) -> int:
    """Run `lvflow predict`; returns the exit code (errors are reported by `lvflow`'s `main`)."""
    if args.list_architectures:
        shapes = architecture_inputs()
        width = max(map(len, shapes))
        print("\n".join(f"{name.ljust(width)}  {s}" for name, s in shapes.items()))
        return 0
    check_output_names(args)
    system, kw, _ = _build(args)
    try:
        pred = predict(system, **kw)
    except NotCommutingError as e:
        raise NotCommutingError(
            f"--data: {args.architecture} on {args.data} does not reduce to a gLV (--force-lv): {e}; "
            "drop --force-lv to integrate the full M-flow instead"
        ) from None
    write_outputs(pred, args)
    return 0
