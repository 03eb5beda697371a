"""The `lvflow` console command: `lvflow predict | sweep | figures | bench`, each with `--help`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`;
# they are imported only when named, so `lvflow --help` stays fast.
_COMMANDS = {
    "demo": ("lvflow._workflow.demo", "Predict the plateaus of the paper's Fig 3 system (a two-minute tour)."),
    "predict": ("lvflow._workflow.predict_cli", "Predict the plateaus and switch-on times of a training run."),
    "sweep": ("lvflow._sweep.cli", "Predict over a grid of configurations, sharded over devices and hosts, resumable."),
    "figures": ("lvflow._figures.cli", "Regenerate the paper's figures (PNG, PDF and JSON summaries)."),
    "bench": ("benchmarks.__main__", "Run the benchmarks against scipy and gradient descent."),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="lvflow",
        description="Neural quadratic forms: predict plateaus, sudden drops and power laws of training.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_) in _COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    if not argv or argv[0] not in _COMMANDS:
        args = parser.parse_args(argv)  # prints help / errors
        parser.print_help()
        return 0 if not argv else 2
    mod = importlib.import_module(_COMMANDS[argv[0]][0])
    sp = argparse.ArgumentParser(prog=f"lvflow {argv[0]}", description=_COMMANDS[argv[0]][1])
    mod.add_arguments(sp)
    args = sp.parse_args(argv[1:])
    if argv[0] != "bench":  # benchmarks time cold starts themselves
        _persistent_cache()
    return int(mod.run(args) or 0)


def _persistent_cache() -> None:
    """Keep XLA's compiled programs across processes (JAX's persistent compilation cache), so that
    a command run again skips compilation: in `$LVFLOW_CACHE_DIR`, else a directory already set
    for JAX, else `$XDG_CACHE_HOME/lvflow/jax` (default `~/.cache/lvflow/jax`); at most 1 GB
    (least recently used entries go first). `LVFLOW_CACHE_DIR=off` (or `0`, `none`) turns it
    off."""
    setting = os.environ.get("LVFLOW_CACHE_DIR", "")
    if setting.lower() in ("off", "0", "none", "false"):
        return
    import jax

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = setting or jax.config.jax_compilation_cache_dir or os.path.join(base, "lvflow", "jax")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return  # an unwritable cache directory costs speed, not correctness
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_compilation_cache_max_size", 2**30)


if __name__ == "__main__":
    sys.exit(main())
