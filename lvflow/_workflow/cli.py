"""The `lvflow` console command: `lvflow demo | predict | fit | sweep | figures | bench`, each with `--help`."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import importlib.util
import os
import re
import signal
import sys
import threading
import time
import warnings
from typing import NamedTuple

from .. import _dependency_error
from .._core.errors import LvflowError, SolverError
from . import plot_worker


class Command(NamedTuple):
    """A subcommand: `options`, a module with `add_arguments(parser)` and `FLAGS` (the API names its
    errors may start with → the flags the user typed) that imports nothing heavy, so that `--help`
    is fast; `runner`, a module with `run(args) -> int`, imported once the flags are parsed (and the
    plot process started, before JAX); `help`, its line in `lvflow --help`; `plots`: it has `--plot`
    (drawn by the plot process); `resumable`: rerun, an interrupted run resumes; `times_itself`: it
    times cold starts in its own processes, so the garbage collector, the teardown, equinox's error
    mode and JAX's persistent cache are left as they are; `in_checkout`: its modules live in the
    repository's checkout, not in the installed package."""

    options: str
    runner: str
    help: str
    plots: bool = False
    resumable: bool = False
    times_itself: bool = False
    in_checkout: bool = False


# Modules are imported only when their command is named. Errors are reported here, one line each.
_COMMANDS = {
    "demo": Command(
        "lvflow._workflow.demo",
        "lvflow._workflow.demo",
        "Predict the plateaus of the paper's Fig 3 system (a two-minute tour).",
        plots=True,
    ),
    "predict": Command(
        "lvflow._workflow.predict_cli",
        "lvflow._workflow.predict_command",
        "Predict the plateaus and switch-on times of a training run.",
        plots=True,
    ),
    "fit": Command(
        "lvflow._fit.cli",
        "lvflow._fit.command",
        "Fit a training log: the spectrum behind it, the drops to come, the final loss.",
    ),
    "sweep": Command(
        "lvflow._sweep.cli",
        "lvflow._sweep.command",
        "Predict over a grid of configurations, sharded over devices and hosts, resumable.",
        resumable=True,
    ),
    "figures": Command(
        "lvflow._figures.cli",
        "lvflow._figures.command",
        "Regenerate the paper's figures (PNG, PDF and JSON summaries).",
    ),
    "bench": Command(
        "benchmarks.__main__",
        "benchmarks.__main__",
        "Run the benchmarks against scipy and gradient descent.",
        times_itself=True,
        in_checkout=True,
    ),
}


def main(argv: list[str] | None = None) -> int:
    """Run `lvflow COMMAND …` (`argv`, default `sys.argv[1:]`); returns the exit status: 0, 2 for
    bad input, 1 for a failed solve or an internal error, 130 when interrupted (Ctrl-C).

    As the `lvflow` command (`argv` None), an interrupted run leaves at once after its one line
    (`os._exit(130)`, stdout and stderr flushed): the interpreter's teardown would race XLA's
    compilation threads (a segmentation fault) or wait for them (a hang). Files are written
    atomically, so nothing half-written is left behind either way.

    As the command, the garbage collector is off while JAX, equinox and the command's modules load,
    and their objects are then left out of its collections (`gc.freeze`, `_run_reporting`): they live
    as long as the process. Once it has returned and Python has run the usual exit functions (JAX's
    among them) and joined its threads, the process ends without the interpreter's teardown
    (`_exit_without_teardown`). Neither for `bench`, which times in its own process; what each
    saves is measured in `docs/devdocs/cold_start.md`."""
    if argv is not None:
        return _main(list(argv))
    name = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in _COMMANDS else ""
    prog = f"lvflow {name}" if name else "lvflow"
    _guard_interrupts(prog)
    if not (name and _COMMANDS[name].times_itself):
        gc.disable()  # until the command's modules are loaded (`_run_reporting`)
        atexit.register(_exit_without_teardown)  # before JAX is imported: runs after JAX's exit functions
    try:
        code = _main(sys.argv[1:])
    except KeyboardInterrupt:  # before the command ran (`_run_reporting` reports one while it runs)
        code = 130
    finally:
        gc.enable()  # (where the command did not get to load)
    _FINISHED.set()  # the watcher leaves the exit to this thread now
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # no KeyboardInterrupt in the teardown (death by SIGINT)
    if code == 130:
        _leave_now(prog, 130)
    if _INTERRUPTED.is_set():  # Ctrl-C as the command finished: its outputs are complete
        _leave_now(prog, code, say=False)
    _RETURNED.append(code)
    return code


#: The `lvflow` command's exit status, once `main` has returned it.
_RETURNED: list[int] = []


def _exit_without_teardown() -> None:
    """The last exit function of the `lvflow` command (registered first): after the others ran and
    Python joined its threads, end the process with the status `main` returned, without the
    interpreter's teardown. Nothing is left to do there (every file is written and closed, the plot
    process waited for) but free the modules' objects and run XLA's destructors.
    Where `main` did not return (an exception, e.g. with `--debug`), Python ends the process as usual."""
    if _RETURNED:
        _leave_now("lvflow", _RETURNED[-1], say=False)


#: Set once SIGINT arrived (the `lvflow` command only).
_INTERRUPTED = threading.Event()
#: Set while a `KeyboardInterrupt` raised for it is on its way up (not swallowed).
_RAISED = threading.Event()
#: Set once the command returned: the main thread ends the process.
_FINISHED = threading.Event()
#: Set once the one line saying so is written.
_REPORTED = threading.Event()
#: Seconds the main thread has, after Ctrl-C, to unwind (remove its temporary files) and leave;
#: then the interrupt watcher ends the process itself.
_GRACE_S = 1.5


def _guard_interrupts(prog: str) -> None:
    """Make Ctrl-C end the `lvflow` command within `_GRACE_S` seconds with one line and status 130,
    whatever the main thread is doing.

    A Python handler marks the interrupt and raises `KeyboardInterrupt`, except inside an import
    (where it could be printed, or turned into an `ImportError`). A watcher thread, woken through
    `signal.set_wakeup_fd` even while the main thread runs compiled XLA code, interrupts the main
    thread again every 0.1 s while no `KeyboardInterrupt` is on its way up (one deferred in an
    import, or swallowed: JAX's garbage-collection callback ignores exceptions), and ends the
    process itself, removing the temporary files of writes in progress
    (`io.remove_pending_temporaries`), if it is still there after the grace period."""
    import _thread

    def handler(signum, frame):
        _INTERRUPTED.set()
        while frame is not None:  # inside an import an exception can be printed, or become another
            if frame.f_code.co_filename.startswith("<frozen importlib"):
                return  # the watcher interrupts again
            frame = frame.f_back
        _RAISED.set()
        raise KeyboardInterrupt

    def unraisable(u, default=sys.unraisablehook):
        if issubclass(u.exc_type, KeyboardInterrupt):  # swallowed, silently: the watcher interrupts again
            _RAISED.clear()
        else:
            default(u)

    try:
        signal.signal(signal.SIGINT, handler)
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError, AttributeError):  # not the main thread, or no pipes: Python's default
        return
    sys.unraisablehook = unraisable

    def watch():
        while signal.SIGINT not in os.read(read, 64):
            pass
        _INTERRUPTED.set()
        deadline = time.monotonic() + _GRACE_S
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if _FINISHED.is_set():
                return
            if not _RAISED.is_set():
                _thread.interrupt_main(signal.SIGINT)
        if _FINISHED.is_set():
            return
        io = sys.modules.get(f"{__package__}.io")  # not loaded: no write under way
        if io is not None:
            io.remove_pending_temporaries()
        _leave_now(prog, 130)

    threading.Thread(target=watch, name="lvflow-interrupt", daemon=True).start()


def _leave_now(prog: str, code: int, *, say: bool = True) -> None:
    """Say `interrupted` (once; unless `say` is False), flush stdout and stderr and end the
    process with `code`, skipping the interpreter's teardown: it would race XLA's compilation
    threads (a segmentation fault) or wait for them (a hang)."""
    if say and not _REPORTED.is_set():
        _say_interrupted(prog)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream
            pass
    os._exit(code)


def _say_interrupted(prog: str) -> None:
    """The one line of an interrupted command `prog` (`lvflow NAME`; a sweep resumes from its
    finished chunks)."""
    _REPORTED.set()
    command = _COMMANDS.get(prog.partition(" ")[2])
    resumes = command is not None and command.resumable
    try:
        sys.stderr.write(f"{prog}: interrupted" + (" (rerun the same command to resume)" if resumes else "") + "\n")
    except (OSError, ValueError):
        pass


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lvflow",
        description="Neural quadratic forms: predict plateaus, sudden drops and power laws of training.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in _COMMANDS.items():
        sub.add_parser(name, help=command.help, add_help=False)
    if not argv or argv[0] not in _COMMANDS:
        if argv and argv[0] in ("-h", "--help"):
            parser.print_help()
            return 0
        parser.print_usage(sys.stderr)
        sys.stderr.write(
            f"lvflow: error: {'name a command' if not argv else f'unknown command {argv[0]!r}'}"
            f" ({', '.join(_COMMANDS)}; `lvflow --help` says what each does)\n"
        )
        return 2
    command = _COMMANDS[argv[0]]
    if command.in_checkout and not _benchmarks_importable():
        print(
            f"lvflow {argv[0]}: error: the benchmarks are not installed with the package; run this from a "
            "checkout of the lvflow repository (or `python -m benchmarks` there)",
            file=sys.stderr,
        )
        return 2
    try:
        options = importlib.import_module(command.options)
    except Exception as e:
        if _INTERRUPTED.is_set():  # Ctrl-C inside an extension's import can come out as ImportError
            raise KeyboardInterrupt from None
        return _missing_dependency(f"lvflow {argv[0]}", e)
    if _INTERRUPTED.is_set():  # Ctrl-C during the import (`_guard_interrupts` defers it)
        raise KeyboardInterrupt
    sp = argparse.ArgumentParser(prog=f"lvflow {argv[0]}", description=command.help)
    options.add_arguments(sp)
    sp.error = _one_line_error(sp.prog)  # one line, not usage + message
    args = sp.parse_args(_negative_values_attached(argv[1:]))
    beyond = _beyond_int64(sp, args)
    if beyond is not None:
        sys.stderr.write(f"{sp.prog}: error: {beyond}\n")
        return 2
    if not command.times_itself and not getattr(args, "debug", False) and "equinox" not in sys.modules:
        # equinox's runtime checks inside compiled programs (diffrax's checks of its own save
        # times, lineax's of its outputs) give NaN, which lvflow reports as a failed solve, instead
        # of a host callback: a program with a callback is never kept in the persistent cache. (The
        # command modules import no equinox, so it is not loaded yet; `--debug` as parsed, any
        # abbreviation argparse accepts included, keeps equinox's default.)
        os.environ.setdefault("EQX_ON_ERROR", "nan")
    if os.environ.get("MPLBACKEND", "").lower() not in ("", "agg"):
        # the commands only write files (no window): any other backend, or a misspelt one that
        # would stop matplotlib's import, is irrelevant to them
        os.environ["MPLBACKEND"] = "agg"
    if command.plots and args.plot:
        # matplotlib's import and first drawing overlap JAX's import and the solve
        plot_worker.start()
    try:
        bad = _bad_environment(f"lvflow {argv[0]}")
        if bad is not None:
            return bad
        directory = None if command.times_itself else _persistent_cache()
        with _keeping_programs(directory):
            return _run_reporting(f"lvflow {argv[0]}", command.runner, options.FLAGS, args)
    finally:
        plot_worker.stop()  # (if it was started and not used: an error came first)


def _one_line_error(prog: str):
    def error(message: str):
        sys.stderr.write(f"{prog}: error: {message}\n")
        raise SystemExit(2)

    return error


def _flagged(msg: str, flags: dict[str, str]) -> str:
    """`eps: must lie …` → `--eps: must lie …`: the user typed flags, not API names."""
    head, sep, rest = msg.partition(":")
    return flags[head] + sep + rest if sep and head in flags else msg


def _run_reporting(prog: str, runner: str, flags: dict[str, str], args: argparse.Namespace) -> int:
    """`run(args)` of the module `runner` (imported here), with every failure as one line on
    stderr: exit 2 for bad input (`LvflowError`, its API names swapped for the user's `flags`) or a
    missing dependency, 1 for a solver failure or an internal error (`--debug`: the traceback)."""
    try:
        module = importlib.import_module(runner)
        if not gc.isenabled():  # the `lvflow` command (`main`): its modules stay loaded to the end
            gc.freeze()
            gc.enable()
        return int(module.run(args) or 0)
    except SystemExit:
        raise
    except KeyboardInterrupt:  # a sweep resumes from its finished chunks when rerun
        if not _REPORTED.is_set():
            _say_interrupted(prog)
        return 130
    except Warning as e:  # PYTHONWARNINGS=error (or -W error) turns a warning into an exception
        sys.stderr.write(
            f"{prog}: error: a warning became an error under PYTHONWARNINGS/-W error: "
            f"{type(e).__name__}: {' '.join(str(e).split())}\n"
        )
        return 2
    except BrokenPipeError:  # `lvflow predict … | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as e:  # noqa: BLE001 — one line per failure, the traceback only on request
        if _INTERRUPTED.is_set():  # Ctrl-C turned into another exception (an extension's ImportError)
            if not _REPORTED.is_set():
                _say_interrupted(prog)
            return 130
        if getattr(args, "debug", False):
            raise
        if isinstance(e, ImportError) and _dependency_error(e) is not None:  # a package imported lazily
            return _missing_dependency(prog, e)
        msg = " ".join(str(e).split()) or type(e).__name__
        if isinstance(e, LvflowError):
            sys.stderr.write(f"{prog}: error: {_flagged(msg, flags)}\n")
            return 2
        if isinstance(e, SolverError):
            sys.stderr.write(f"{prog}: solver failed: {msg}\n")
            return 1
        sys.stderr.write(f"{prog}: internal error: {type(e).__name__}: {msg} (rerun with --debug for the traceback)\n")
        return 1


def _bad_environment(prog: str) -> int | None:
    """JAX settings from the environment that would stop every command: a `JAX_PLATFORMS` with no
    usable backend, an `XLA_FLAGS` that XLA aborts on (checked in a child process, since XLA
    ends the process). One line naming the variable and exit 2; `None` when both are fine."""
    flags = os.environ.get("XLA_FLAGS", "").strip()
    if flags:
        import subprocess

        check = "import jax; jax.devices()"
        out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            lines = [ln for ln in out.stderr.splitlines() if "XLA_FLAGS" in ln] or out.stderr.splitlines()[-1:]
            why = lines[0].split("] ", 1)[-1] if lines else f"exit status {out.returncode}"
            sys.stderr.write(f"{prog}: error: XLA_FLAGS={flags!r}: {why}\n")
            return 2
    if os.environ.get("JAX_PLATFORMS", "").strip():
        import jax

        try:
            jax.devices()
        except RuntimeError as e:
            why = " ".join(str(e).split())
            sys.stderr.write(f"{prog}: error: JAX_PLATFORMS={os.environ['JAX_PLATFORMS']!r}: {why}\n")
            return 2
    return None


def _missing_dependency(prog: str, error: Exception) -> int:
    """A dependency that is not installed or fails to import: one line naming it, exit 2."""
    missing = _dependency_error(error)
    if missing is None:
        raise error
    sys.stderr.write(f"{prog}: error: {missing}\n")
    return 2


_INT64 = (-(2**63), 2**63 - 1)


def _beyond_int64(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The first integer flag whose value lies outside a 64-bit integer's range (NumPy and JAX
    would raise `OverflowError` on it), as `"--flag: … "`; `None` when every one fits. (Sizes
    within the range are checked against the memory they need where they are used.)"""
    for action in parser._actions:
        if action.type is not int or not action.option_strings:
            continue
        value = getattr(args, action.dest, None)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not _INT64[0] <= v <= _INT64[1]:
                return (
                    f"{action.option_strings[0]}: {v} is beyond a 64-bit integer's range "
                    "(its size at most 2^63 - 1, about 9.2e18)"
                )
    return None


def _negative_values_attached(argv: list[str]) -> list[str]:
    """`--eps -1e-3` → `--eps=-1e-3`: argparse reads a negative number in exponent form as a flag
    (its own check knows only `-1` and `-0.5`), so `--eps -1e-3` would say "expected one argument"
    instead of the real problem with the value."""
    out: list[str] = []
    for tok in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NEGATIVE_NUMBER.fullmatch(tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


_NEGATIVE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?|-inf|-nan", re.IGNORECASE)


def _benchmarks_importable() -> bool:
    """Whether `benchmarks/` (in a checkout, beside `lvflow/`; not installed) can be imported;
    puts the checkout on `sys.path` when `lvflow` itself is imported from one."""
    if importlib.util.find_spec("benchmarks") is not None:
        return True
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.isfile(os.path.join(root, "benchmarks", "__main__.py")):
        return False
    sys.path.insert(0, root)
    return True


def _persistent_cache() -> str | None:
    """Keep XLA's compiled programs across processes (JAX's persistent compilation cache), so that
    a command run again skips compilation: in `$LVFLOW_CACHE_DIR`, else a directory already set
    for JAX, else `$XDG_CACHE_HOME/lvflow/jax` (default `~/.cache/lvflow/jax`); at most 1 GB
    (least recently used entries go first). `LVFLOW_CACHE_DIR=off` (or `0`, `none`) turns it
    off. Its `programs` subdirectory holds lvflow's own kept executables (`_keeping_programs`).

    **Returns:** the directory, or None where the cache is off or the directory cannot be made."""
    setting = os.environ.get("LVFLOW_CACHE_DIR", "")
    if setting.lower() in ("off", "0", "none", "false"):
        return None
    import jax

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    # JAX's options are attributes its `Config` adds at run time, unseen by a type checker
    set_dir = jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue]
    path = setting or set_dir or os.path.join(base, "lvflow", "jax")
    try:
        os.makedirs(path, exist_ok=True)
        _repair_cache(path)
    except OSError:
        return None  # an unwritable cache directory costs speed, not correctness
    # another process evicting entries at the same time makes JAX warn once per program; the cache
    # only saves time, so a failed read or write is not the user's business
    warnings.filterwarnings("ignore", message=r"Error (reading|writing) persistent compilation cache")
    configure_jax(
        jax_compilation_cache_dir=path,
        jax_persistent_cache_min_compile_time_secs=0.0,
        jax_compilation_cache_max_size=2**30,
    )
    return path


def _keeping_programs(directory: str | None) -> contextlib.AbstractContextManager:
    """While the command runs, lvflow's `persistent_jit` programs are kept in the cache `directory`
    (its `programs` subdirectory; `lvflow._core.programs`), so that the next process loads them
    instead of tracing and lowering them again; nothing where `directory` is None."""
    if directory is None:
        return contextlib.nullcontext()
    from .._core.programs import keep_programs_in  # imports JAX: not before the command runs

    return keep_programs_in(directory)


def configure_jax(**options) -> None:
    """Set JAX's configuration options (`jax.config.update` for each `name=value`): the one place
    the package changes JAX's configuration (the commands' compilation cache and device count;
    the library itself leaves JAX's configuration to its user).

    **Raises:** `RuntimeError` from JAX for an option that can no longer change (a backend started).
    """
    import jax

    for name, value in options.items():
        jax.config.update(name, value)


def _repair_cache(path: str) -> None:
    """Remove entries of JAX's cache whose access-time file is missing (a process killed between
    writing the two). JAX reads every entry's access time before each write, so one such entry
    makes every later write fail: nothing new would ever be cached."""
    names = set(os.listdir(path))
    for name in names:
        if name.endswith("-cache") and name.removesuffix("-cache") + "-atime" not in names:
            os.remove(os.path.join(path, name))


if __name__ == "__main__":
    sys.exit(main())
