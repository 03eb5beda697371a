"""`lvflow predict`'s options (the command itself is `predict_command.py`): the drops table,
directions table, loss curve and saved results of a training run.

Exit codes: 0 success, 2 bad input (one line on stderr naming the input and the problem),
1 a solver failure or an internal error (one line; `--debug` shows the traceback).
"""

from __future__ import annotations

import argparse

EXAMPLES = """\
output (--save's .json holds these numbers under the names in brackets; its .npz holds the drops
as drops_t_mid, drops_loss_before, drops_loss_after, drops_complete):
  drops       one row per drop of the predicted loss curve [drops]:
                #            the drop's number, in time order [rank]
                t, step      where the loss crosses the midpoint between the plateaus before and
                             after the drop, in gradient-flow time and in GD steps t/lr [t, steps]
                loss before, loss after
                             those plateau levels [loss_before, loss_after] ("excess loss", loss
                             minus its minimum, when the loss's constant y2 is unknown); "(still
                             falling)": the curve has not levelled off by t1 [complete false]
                modes / directions
                             the modes (gLV, input numbering) or rows of the directions table
                             that switch on within the drop: several when they switch on too
                             close together for a plateau between them
  directions  one row per mode (gLV) or direction of M, in switch-on order [directions]: t* is
              when its strength reaches rho of its final value; it is not when the loss drops
              (that is the drops table).
                gLV: mode (input numbering); r_k; V_k alone = r_k²/(8 C_kk), the loss the
                mode would remove alone; t*_k, steps*_k = t*_k/lr; tau*_k, the eps -> 0
                ignition time in t/ln(1/eps); plateau loss, the excess loss on the plateau
                just before it switches on; drop, the excess loss its switch-on removes at this
                eps; eps merge, the eps above which its drop and the next row's merge into one
                matrix flow: t*, steps*; strength, u·M·u at the end; dim, directions of equal
                strength; output direction, the largest entries of its output side

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
    "system": "--system",
    "architecture": "--architecture",
    "data": "--data",
    "kernel": "--kernel",
    "horizon_fraction": "--horizon-fraction",
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
        "--value-size", type=int, metavar="DV", help="value size d_v of a head, --architecture attention (default 1)"
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
        "--horizon-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="with --architecture: the validity horizon is where Thm 13's next term reaches F of the NQF's output "
        "along the predicted M (default 0.1)",
    )
    run.add_argument("--no-horizon", action="store_true", help="with --architecture: skip the validity horizon")
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
