"""`lvflow sweep`'s options (the command itself is `command.py`): `lvflow predict`'s inputs, each
with one value or a list, swept as a grid (or from a TOML/JSON spec), batched and sharded over
devices and hosts, written to resumable chunks.

Exit codes: 0 success, 2 bad input (one line on stderr naming the input and the problem; also an
output directory in use by another sweep, or holding a different one), 1 a configuration whose
solve failed (after the summary; the rows are kept, with `success` False) or an internal error (one
line; `--debug` shows the traceback).
"""

from __future__ import annotations

import argparse

from .grid import ALIASES, PARAMETERS

# API names as the flags the user typed (`lvflow` reports errors with them).
FLAGS = {name: p.flag for name, p in PARAMETERS.items()} | {
    "chunk_size": "--chunk-size",
    "batch_size": "--batch-size",
    "max_steps": "--max-steps",
    "devices": "--devices",
    "num_processes": "--num-processes",
    "process_id": "--process-id",
    "coordinator": "--coordinator",
    "coordinator_timeout": "--coordinator-timeout",
    "out": "--out",
}

EXAMPLES = """\
values: one value, a comma-separated list (0.6,0.8,1.0), or a range lin:START:STOP:COUNT /
log:START:STOP:COUNT; the sweep is the grid of all combinations (the last flag varying fastest).

results (columns of lvflow.load_sweep(DIR) and of DIR/chunk-*.npz; one row per configuration):
  index, the parameters given, eps, modes, rho, group
              the configuration: its number; the parameters given, by their API names (lr is
              learning_rate, points num_points; files by name); eps, K and rho as used; the
              group of equal shapes it was evaluated in
  t1, success, num_steps
              the horizon; whether the solve succeeded; the ODE's steps (0: closed form)
  n_on, t_first, t_last, steps_first
              modes that switch on by t1; the first and last switch-on time t* (a mode at rho of
              its final strength: not when the loss drops, see the drop columns); t_first/lr
  tau_first, ln_inv_eps
              the first eps -> 0 ignition (t_first ~ tau_first ln(1/eps)); ln(1/eps)
  exponent, exponent_fit
              Thm 9's loss exponent (alpha1 - 1)/alpha2; the one the finite-eps staircase shows
  per mode (K columns): t_star; tau_star and plateau_loss (the --schedule's ignition time and
              excess loss before the mode switches on); z_inf; r; V = r²/(8 C_kk)
  with --curve: ts, excess_loss (the curve, on predict's time grid), n_drops (its drops, as
              lvflow predict's drops table reads them), and for drops j = 1..3 (NaN where fewer):
              drop{j}_t, drop{j}_step (where the loss crosses the midpoint between the plateaus
              on either side; t/lr), drop{j}_excess_loss_before/_after (those plateaus' excess
              loss), drop{j}_complete (false: still falling at t1)
  with --architecture/--data: horizon_t, horizon_step, horizon_floor_t (lvflow predict's validity
              horizon for the configuration, from the sweep's own solve: when Thm 13's next term
              reaches 10 % of the NQF's output, inf: not within the prediction; t/lr; when the
              predicted loss reaches the NQF's floor; NaN for other systems or a network that
              is exactly its NQF; costs the curve with z(t) and the next term's ratio on the
              host per configuration; --no-horizon skips them)
  summary.json holds the scalars per configuration (up to 10^4), the plateau law and exponents.

examples:
  lvflow sweep --alpha1 2 --alpha2 0.6,0.8,1.0 --modes 100 --eps 1e-4,1e-6,1e-8 --out sweep1
  lvflow sweep --system a.npz,b.npz --eps log:1e-10:1e-3:15 --lr 0.01 --out sweep2
  lvflow sweep --spec sweep.toml --out sweep3          # lists that are not grids
  lvflow sweep ... --out DIR                           # again after a crash: resumes
  lvflow sweep ... --cpu-devices 2 --out DIR           # the CPU as 2 virtual devices (sharding on one machine)
  lvflow sweep ... --coordinator host0:1234 --num-processes 2 --process-id 0 --out /shared/DIR
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `lvflow sweep`: `lvflow predict`'s inputs as lists, and the sweep's own."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    grid = parser.add_argument_group("the configurations (lvflow predict's inputs; each V or V1,V2,… or a range)")
    for name, p in PARAMETERS.items():
        # the spec's other spellings (`lvflow predict`'s flags) as flags too
        flags = dict.fromkeys([p.flag] + [f"--{alias}" for alias, to in ALIASES.items() if to == name])
        grid.add_argument(*flags, dest=name, metavar="V", help=p.help)
    grid.add_argument("--spec", metavar="FILE", help="TOML/JSON spec: [grid] tables, [[configs]] lists, [options]")
    run = parser.add_argument_group("the sweep")
    run.add_argument("--out", metavar="DIR", required=True, help="output directory (chunks, manifest, summary)")
    run.add_argument(
        "--curve",
        action="store_true",
        help="also store every configuration's excess-loss curve and its drops (see results below)",
    )
    run.add_argument(
        "--no-horizon",
        action="store_true",
        help="skip predict's validity horizon for --architecture/--data (the curve with z(t) and the next term's ratio "
        "on the host per configuration)",
    )
    run.add_argument(
        "--schedule",
        choices=("limit", "corrected", "none"),
        help="the eps -> 0 schedule (default limit, as predict), the finite-eps corrected one, or none",
    )
    run.add_argument("--chunk-size", type=int, metavar="N", help="configurations per chunk file (default 4096)")
    run.add_argument("--batch-size", type=int, metavar="N", help="configurations per device per call")
    run.add_argument("--max-steps", type=int, metavar="N", help="step budget of each ODE solve (default 16384)")
    dev = parser.add_argument_group("devices and hosts")
    dev.add_argument("--devices", type=int, metavar="N", help="use the first N local devices (default all)")
    dev.add_argument(
        "--cpu-devices",
        type=int,
        metavar="N",
        help=(
            "split the CPU into N virtual devices, to try sharding on one machine (not needed for speed: "
            "one device already runs the batches on every core)"
        ),
    )
    dev.add_argument("--coordinator", metavar="HOST:PORT", help="jax.distributed coordinator ('auto': detect)")
    dev.add_argument(
        "--coordinator-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="wait this long for the coordinator and every process to join, then exit 2 with one line (default 120)",
    )
    dev.add_argument("--num-processes", type=int, metavar="P", help="number of processes (one per host)")
    dev.add_argument("--process-id", type=int, metavar="I", help="this process's number, 0…P-1")
    out = parser.add_argument_group("output")
    out.add_argument("--no-summary", action="store_true", help="skip summary.json and summary.png")
    out.add_argument("--json", action="store_true", help="print the summary JSON to stdout")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    out.add_argument("--debug", action="store_true", help="show tracebacks")
