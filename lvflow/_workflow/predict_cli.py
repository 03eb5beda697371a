"""`lvflow predict`: the drops table, directions table, loss curve and saved results of a training run.

Exit codes: 0 success, 2 bad input (one line on stderr naming the input and the problem),
1 a solver failure or an internal error (one line; `--debug` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys

from .cli import check_output_names, write_outputs

EXAMPLES = """\
output:
  drops       one row per drop of the predicted loss curve: t (and step) where the loss crosses
              the midpoint between the plateaus before and after it, those plateau levels, and
              the modes/directions that switch on within it (several when they switch on too
              close together for a plateau between them)
  directions  one row per mode (gLV) or direction of M: t* is when its strength reaches rho of
              its final value; it is not when the loss drops (that is the drops table)

examples:
  lvflow predict --system sys.npz --eps 1e-5 --lr 0.01          # r, C (or zeta, V) from a file
  lvflow predict --alpha1 2 --alpha2 0.8 --modes 50 --eps 1e-6  # power-law spectrum (Thm 9)
  lvflow predict --architecture diagonal --data xy.npz --init-std 1e-3 --width 100
  lvflow predict --system sys.csv --eps 1e-5 --plot loss.png --save out.json --quiet
"""

# Names used by the Python API, as the flags the user typed (`lvflow` reports errors with them).
FLAGS = {
    "eps": "--eps",
    "z0": "--z0",
    "c": "--c",
    "init_std": "--init-std",
    "width": "--width",
    "rho": "--rho",
    "t1": "--t1",
    "learning_rate": "--lr",
    "num_points": "--points",
    "alpha1": "--alpha1",
    "alpha2": "--alpha2",
    "modes": "--modes",
    "beta": "--beta",
    "value_size": "--value-size",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `lvflow predict`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    src = parser.add_argument_group("the system (give one)")
    src.add_argument(
        "--system",
        metavar="FILE",
        help="gLV system: .npz with arrays r and C (or zeta and V: diagonal C_kk = zeta_k²/(8 V_k); "
        "optional y2), .npy/.csv of shape (K, K+1) = [r | C], or .csv with header 'r,C0,C1,…' or 'zeta,V'",
    )
    src.add_argument(
        "--architecture", metavar="NAME", help="a built-in architecture (see --list-architectures); needs --data"
    )
    src.add_argument(
        "--data",
        metavar="FILE",
        help="inputs and targets for --architecture: .npz with arrays x (m, …) and y (m,) or (m, k); "
        ".csv with header 'x0,x1,…,y' (or no header: last column y)",
    )
    src.add_argument("--kernel", type=int, nargs=2, metavar=("KH", "KW"), help="kernel shape for --architecture cnn")
    src.add_argument(
        "--value-size", type=int, default=1, metavar="DV", help="value size d_v of a head, --architecture attention"
    )
    src.add_argument("--alpha1", type=float, help="power-law spectrum: V_k = k^-alpha1 (Thm 9)")
    src.add_argument("--alpha2", type=float, help="power-law spectrum: r_k = zeta_k = k^-alpha2")
    src.add_argument("--modes", type=int, help="power-law spectrum: number of modes K")
    src.add_argument("--list-architectures", action="store_true", help="list the built-in architectures and exit")
    init = parser.add_argument_group("initial scale z_k(0) = eps c_k (give one of --eps, --z0, --init-std)")
    init.add_argument("--eps", type=float, help="eps in (0, 1)")
    init.add_argument("--c", metavar="FILE", help="c_k per mode (.npy/.csv/.npz); default 1")
    init.add_argument("--beta", type=float, help="c_k = k^-beta (Thm 9's initialisation)")
    init.add_argument("--z0", metavar="FILE", help="z_k(0) per mode; eps = max z0")
    init.add_argument(
        "--init-std",
        type=float,
        metavar="SIGMA",
        help="weights ~ N(0, sigma²) with --width d: z_k(0) ≈ d sigma² (E[W Wᵀ] = d sigma² I)",
    )
    init.add_argument("--width", type=int, metavar="D", help="number of neurons d, with --init-std")
    run = parser.add_argument_group("run")
    run.add_argument(
        "--lr",
        "--learning-rate",
        dest="learning_rate",
        type=float,
        help="GD learning rate eta: report steps = t/eta as well as time t (on non-commuting data, "
        "iterate GD's exact map of M at this eta instead of the flow)",
    )
    run.add_argument(
        "--rho", type=float, default=0.5, help="switch-on fraction: t*_k is when z_k = rho z_k(inf) (default 0.5)"
    )
    run.add_argument("--t1", type=float, help="horizon in gradient-flow time (default: past the last switch-on)")
    run.add_argument("--points", type=int, default=400, help="samples of the loss curve (default 400)")
    run.add_argument(
        "--force-lv", action="store_true", help="refuse non-commuting data instead of falling back to the full M-flow"
    )
    out = parser.add_argument_group("output")
    out.add_argument("--plot", metavar="FILE", help="write the loss curve, linear and log time (.png/.pdf/.svg)")
    out.add_argument("--save", metavar="FILE", help="write every result, atomically (.json or .npz)")
    out.add_argument("--json", action="store_true", help="print JSON to stdout instead of the table")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    out.add_argument(
        "--progress", action="store_true", help="draw the progress bar even when stderr is not a terminal (a log file)"
    )
    out.add_argument("--debug", action="store_true", help="show tracebacks")


def _build(args):
    """The system, the keyword arguments of `predict` and the `--data` arrays (`None` without
    `--architecture`) from the parsed flags."""
    import numpy as np

    from .._core.errors import LvflowError, NotCommutingError
    from .._core.validate import as_array
    from .._glv.lv import AbstractLotkaVolterra
    from .._glv.reduce import reduce_to_lv
    from .io import load_array, load_arrays
    from .predict_data import input_side_shape, nqf_from_data
    from .predict_inputs import check_below_plateau, lv_from_arrays, power_law_lv

    power = [a for a in ("alpha1", "alpha2", "modes") if getattr(args, a) is not None]
    given = [
        n
        for n, on in (
            ("--system", args.system),
            ("--architecture", args.architecture),
            ("--alpha1/--alpha2/--modes", power),
        )
        if on
    ]
    if len(given) != 1:
        raise LvflowError(
            "input: give exactly one of --system FILE, --architecture NAME --data FILE, "
            f"or --alpha1 --alpha2 --modes (got {', '.join(given) or 'none'})"
        )
    if args.data is not None and args.architecture is None:
        raise LvflowError("--data: only used with --architecture")
    if args.eps is None and args.z0 is None and args.init_std is None:
        raise LvflowError("--eps: required (or give --z0 FILE, or --init-std with --width)")
    if args.init_std is not None and args.width is None and args.eps is None and args.z0 is None:
        raise LvflowError("--width: required with --init-std (the number of neurons d; ε = d σ²)")
    kw = dict(
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
    if args.kernel is not None and args.architecture != "cnn":
        raise LvflowError(f"--kernel: only used with --architecture cnn (got {args.architecture or 'no architecture'})")
    arrays = None
    if args.system is not None:
        system = lv_from_arrays(load_arrays(args.system, name="--system"), name="--system")
        kw["source"] = f"{system.K}-mode gLV from {args.system}"
    elif args.architecture is not None:
        if args.data is None:
            raise LvflowError("--data: required with --architecture (a file of inputs x and targets y)")
        arrays = load_arrays(args.data, name="--data")
        system = nqf_from_data(args.architecture, arrays, kernel=args.kernel, value_size=args.value_size, name="--data")
        kw["source"] = f"{args.architecture} on {args.data} ({system.m} samples)"
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
    else:
        missing = [f"--{a}" for a in ("alpha1", "alpha2", "modes") if getattr(args, a) is None]
        if missing:
            raise LvflowError(f"{missing[0]}: required for a power-law spectrum (with --alpha1, --alpha2, --modes)")
        system = power_law_lv(alpha1=args.alpha1, alpha2=args.alpha2, modes=args.modes)
        kw["alpha"] = (args.alpha1, args.alpha2) if args.alpha1 > 1 else None
        kw["source"] = f"power law alpha1 = {args.alpha1:g}, alpha2 = {args.alpha2:g}, {args.modes} modes"
    K = system.K if isinstance(system, AbstractLotkaVolterra) else None  # an NQF has no modes yet
    if args.z0 is not None:
        kw["z0"] = load_array(args.z0, name="--z0").reshape(-1)
    if args.c is not None and args.beta is not None:
        raise LvflowError("--c: give either --c or --beta, not both")
    if args.c is not None:
        kw["c"] = load_array(args.c, name="--c").reshape(-1)
    if args.beta is not None:
        beta = float(as_array("--beta", args.beta, ndim=0))
        with np.errstate(over="ignore"):
            kw["c"] = np.exp(-beta * np.log(np.arange(1, K + 1, dtype=float)))
        if not np.all((kw["c"] > 0) & np.isfinite(kw["c"])):
            raise LvflowError(f"--beta: c_k = k^-beta leaves float64's range for {K} modes (beta = {beta:g})")
    if "c" in kw and args.eps is not None:
        check_below_plateau(system, args.eps, kw["c"], name="--beta" if args.beta is not None else "--c")
    return system, kw, arrays


def run(args: argparse.Namespace) -> int:
    """Run `lvflow predict`; returns the exit code (errors are reported by `lvflow`'s `main`)."""
    if args.list_architectures:
        from .predict_data import architecture_inputs

        shapes = architecture_inputs()
        width = max(map(len, shapes))
        print("\n".join(f"{name.ljust(width)}  {s}" for name, s in shapes.items()))
        return 0
    from .._core.errors import NotCommutingError
    from .predict import predict

    check_output_names(args)
    system, kw, arrays = _build(args)
    try:
        pred = predict(system, **kw)
    except NotCommutingError as e:
        raise NotCommutingError(
            f"--data: {args.architecture} on {args.data} does not reduce to a gLV (--force-lv): {e}; "
            "drop --force-lv to integrate the full M-flow instead"
        ) from None
    if args.architecture is not None:
        pred = _note_nqf_floor(pred, args, arrays)
    write_outputs(pred, args)
    return 0


def _note_nqf_floor(pred, args, arrays):
    """`pred` with a note when a network that is not exactly its NQF (a next term in Thm 13's
    expansion, Eq. 200) is predicted to level off at the NQF's floor (least squares over its
    features): the network itself can learn below it once it leaves its NQF."""
    import dataclasses
    import math

    import numpy as np

    from .predict_data import architecture_next_order

    floor = float(pred.matrix.loss_floor) if pred.matrix is not None else math.nan
    loss = np.asarray(pred.loss)
    if not (math.isfinite(floor) and loss.size and loss[0] > floor):
        return pred
    if (loss[-1] - floor) > 0.01 * (loss[0] - floor):
        return pred  # the prediction does not reach the floor
    order = architecture_next_order(args.architecture, arrays, kernel=args.kernel, value_size=args.value_size)
    if order is None:
        return pred
    note = (
        f"the predicted loss levels off at {floor:.4g}, the least loss of this network's NQF (least squares over "
        f"its features); the {args.architecture} itself is its NQF only to second order in its weights (Thm 13's "
        f"next term is of order {order}), so once its weights grow it can keep learning below {floor:.4g}; "
        "lvflow.nqf_horizon estimates from when (a rough estimate: 33-42 % early on two tanh MLPs)"
    )
    return dataclasses.replace(pred, notes=(*pred.notes, note))
