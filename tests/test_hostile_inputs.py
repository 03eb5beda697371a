"""Hostile but realistic inputs to `lvflow predict`, `fit` and `sweep` (issue 32): sizes whose run
would not fit in memory, an unreachable coordinator, names and nesting beyond the file system's and
Python's limits, Ctrl-C, two API sweeps into one directory, a system whose loss overflows, and a
property test over arbitrary flag values. Each refusal is one line on stderr and exit status 2,
before any computation, and leaves no file behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _cli import cli_env, main, one_line
from hypothesis import HealthCheck, given, settings, strategies as st

import lvflow
from lvflow._core import memory  # the memory this machine reports, replaced by a fixed one

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


@pytest.fixture
def system(tmp_path) -> Path:
    """A 2-mode diagonal gLV system file."""
    p = tmp_path / "sys.csv"
    p.write_text("r,C0,C1\n1,1,0\n0.5,0,1\n")
    return p


@pytest.fixture
def log(tmp_path) -> Path:
    """A clean gradient-descent log of two decoupled modes (step, loss)."""
    r, z, lr, rows = np.array([1.0, 0.5]), np.full(2, 1e-4), 0.05, []
    for step in range(600):
        rows.append(f"{step},{np.sum(r**2 / 8 - (r * z) / 4 + z**2 / 8):.12g}")
        z = z + lr * z * (r - z)
    p = tmp_path / "log.csv"
    p.write_text("step,loss\n" + "\n".join(rows) + "\n")
    return p


# -- class 9: memory from a flag ----------------------------------------------------------------


def test_sizes_beyond_memory_are_refused_before_the_run(tmp_path, system, log, monkeypatch, capsys):
    """A size flag whose run needs more memory than is available is refused at once, with the
    estimate and what is available (computed from the input, not a fixed cap); an integer beyond
    int64 is one line too, not an `OverflowError`."""
    monkeypatch.setattr(memory, "available_memory", lambda: 8 * GIB)  # the same on any machine
    out = tmp_path / "out"
    sweep = ["sweep", "--system", str(system), "--quiet", "--out", str(out)]
    cases = [
        (["fit", str(log), "--max-modes", "1000"], "--max-modes"),
        (["fit", str(log), "--bins", "100000000"], "--bins"),
        (["fit", str(log), "--modes", "1000000"], "--modes"),
        (["predict", "--alpha1", "2", "--alpha2", "1", "--modes", str(10**12), "--eps", "1e-9"], "--modes"),
        ([*sweep, "--eps", "log:1e-8:1e-3:100000000"], "--eps"),
        ([*sweep, "--eps", "log:1e-8:1e-3:20000", "--rho", "lin:0.1:0.9:20000"], "--eps"),
        ([*sweep, "--eps", "1e-4", "--points", "100000000", "--curve"], "--points"),
        (["predict", "--system", str(system), "--eps", "1e-4", "--points", "100000000"], "--points"),
        (
            ["sweep", "--alpha1", "2", "--alpha2", "1", "--modes", str(10**12), "--eps", "1e-6", "--out", str(out)],
            "--modes",
        ),
    ]
    for argv, flag in cases:
        t0 = time.perf_counter()
        assert main(argv) == 2, argv
        line = one_line(capsys.readouterr().err)
        assert line.startswith(f"lvflow {argv[0]}: error: {flag}: "), line
        assert "needs about" in line and "this machine has 8 GiB available" in line, line
        assert time.perf_counter() - t0 < 30, argv  # refused, not attempted
        assert not out.exists(), argv
    for argv, flag in [
        (["predict", "--alpha1", "2", "--alpha2", "1", "--modes", "99999999999999999999", "--eps", "1e-4"], "--modes"),
        ([*sweep, "--eps", "1e-4", "--chunk-size", "99999999999999999999"], "--chunk-size"),
        ([*sweep, "--eps", "1e-4", "--modes", "99999999999999999999"], "--modes"),
    ]:
        assert main(argv) == 2, argv
        line = one_line(capsys.readouterr().err)
        assert line.startswith(f"lvflow {argv[0]}: error: {flag}: ") and "64-bit" in line, line
        assert not out.exists(), argv
    monkeypatch.undo()
    avail = memory.available_memory()
    assert avail is None or avail > 0
    assert memory.curve_bytes(2, 10**8) > 8 * GIB > memory.curve_bytes(2, 400)


# -- class 10: an unreachable coordinator -------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_coordinator_times_out_withone_line(tmp_path, system):
    """A coordinator nobody runs: exit 2 within `--coordinator-timeout` (plus start-up), one line
    naming it, no C++ stack trace, no directory made (XLA alone waits 300 s, then aborts)."""
    out = tmp_path / "out"
    address = f"127.0.0.1:{_free_port()}"
    argv = ["sweep", "--system", str(system), "--eps", "1e-4", "--out", str(out), "--quiet"]
    argv += ["--coordinator", address, "--num-processes", "2", "--process-id", "1", "--coordinator-timeout", "2"]
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "lvflow", *argv], capture_output=True, text=True, env=cli_env(), timeout=60
    )
    elapsed = time.perf_counter() - t0
    assert done.returncode == 2, done
    line = one_line(done.stderr)
    assert line.startswith("lvflow sweep: error: --coordinator: not connected within 2 s"), line
    assert address in line and "connection refused" in line, line
    assert elapsed < 20, elapsed
    assert not out.exists()


# -- class 11: Python's and the file system's limits --------------------------------------------


def test_names_and_nesting_beyond_the_limits(tmp_path, system, log, capsys):
    """An output name longer than the file system allows is refused before the solve; a JSON
    log or spec nested deeper than Python's parser can go is one line, not a `RecursionError`."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    long = tmp_path / ("x" * (name_max + 1) + ".json")
    for argv in (
        ["predict", "--system", str(system), "--eps", "1e-4", "--save", str(long), "--quiet"],
        ["predict", "--system", str(system), "--eps", "1e-4", "--plot", str(long)[:-5] + ".png", "--quiet"],
        ["fit", str(log), "--save", str(long)],
    ):
        t0 = time.perf_counter()
        assert main(argv) == 2, argv
        line = one_line(capsys.readouterr().err)
        assert (
            line.startswith(f"lvflow {argv[0]}: error: --")
            and f"bytes long; the file system allows at most {name_max}" in line
        ), line
        assert time.perf_counter() - t0 < 5  # before the solve
    # a name just within the limit is written (its temporary file's name is shortened)
    ok = tmp_path / ("y" * (name_max - 5) + ".json")
    assert main(["predict", "--system", str(system), "--eps", "1e-4", "--save", str(ok), "--quiet"]) == 0
    assert ok.is_file() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    capsys.readouterr()
    out = tmp_path / ("d" * (name_max + 1))
    assert main(["sweep", "--system", str(system), "--eps", "1e-4", "--out", str(out), "--quiet"]) == 2
    assert f"the file system allows at most {name_max}" in one_line(capsys.readouterr().err)

    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "deep.json").write_text(deep)
    (tmp_path / "spec.json").write_text('{"grid": ' + deep + "}")
    for argv in (
        ["fit", str(tmp_path / "deep.json")],
        ["sweep", "--spec", str(tmp_path / "spec.json"), "--out", str(tmp_path / "o")],
    ):
        assert main(argv) == 2, argv
        assert "nested too deeply to read" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()


# -- class 7: Ctrl-C ----------------------------------------------------------------------------


def test_ctrl_c_leaves_with_130_and_no_partial_file(tmp_path, system, log):
    """SIGINT while JAX imports, compiles or solves (no compilation cache): exit status 130 with
    one line (or 0 when the run had finished), never a signal's death (a negative status: the
    segmentation fault of a teardown racing XLA's threads) nor a hang, and no partial output."""
    runs = [(["predict", "--system", str(system), "--eps", "1e-4", "--quiet"], d) for d in (0.5, 1.5, 3.0)]
    runs.append((["fit", str(log), "--modes", "20"], 4.0))  # was a 120 s hang
    for i, (command, delay) in enumerate(runs):
        out = tmp_path / f"run{i}"
        out.mkdir()
        argv = [*command, "--save", str(out / "p.json")]
        p = subprocess.Popen(
            [sys.executable, "-m", "lvflow", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        t0 = time.perf_counter()
        stdout, stderr = p.communicate(timeout=60)
        assert time.perf_counter() - t0 < 10, delay
        assert p.returncode in (0, 130), (delay, p.returncode, stderr)
        if p.returncode == 130:
            assert one_line(stderr) == f"lvflow {command[0]}: interrupted", stderr
        # nothing half-written: no temporary file, and a result only if complete
        left = sorted(f.name for f in out.iterdir())
        assert left in ([], ["p.json"]), (delay, left)
        assert p.returncode == 130 or left == ["p.json"], (delay, left)
        if left:
            assert json.loads((out / "p.json").read_text())


# -- the API's lock ------------------------------------------------------------------------------


def test_two_api_sweeps_into_one_directory(tmp_path, system):
    """`lvflow.sweep(..., out=D)` holds D's lock itself: a second sweep into D while the first
    runs (another thread here) is refused with an `lvflow.LvflowError`, and the first completes whole."""
    out = tmp_path / "D"
    first_running, second_done = threading.Event(), threading.Event()
    result: dict = {}

    def hold(chunk_id, path):
        first_running.set()
        second_done.wait(timeout=120)

    def first():
        try:
            result["first"] = lvflow.sweep(
                {"system": str(system), "eps": "log:1e-8:1e-3:6"}, out=out, chunk_size=3, on_chunk=hold, progress=False
            )
        except BaseException as e:  # noqa: BLE001 — reported below
            result["first"] = e

    t = threading.Thread(target=first)
    t.start()
    try:
        assert first_running.wait(timeout=120)
        with pytest.raises(lvflow.LvflowError, match="in use by another lvflow sweep"):
            lvflow.sweep({"system": str(system), "eps": "log:1e-9:1e-3:6"}, out=out, progress=False)
    finally:
        second_done.set()
        t.join(timeout=120)
    assert not isinstance(result["first"], BaseException), result["first"]
    back = lvflow.load_sweep(out)
    np.testing.assert_allclose(back["eps"], np.geomspace(1e-8, 1e-3, 6))  # the first sweep's, whole
    # the lock is released: the same sweep again resumes (nothing to evaluate)
    again = lvflow.sweep({"system": str(system), "eps": "log:1e-8:1e-3:6"}, out=out, chunk_size=3, progress=False)
    assert again.stats["chunks_evaluated"] == 0


# -- overflow of derived quantities --------------------------------------------------------------


def test_system_whose_loss_overflows_is_refused(tmp_path, capsys):
    """`r = 1e200` gives a finite plateau `r/C` but a loss drop `V = r²/(8 C)` beyond float64:
    refused with one line naming the input (the mode, r_k and C_kk), by predict and sweep alike."""
    p = tmp_path / "big.csv"
    p.write_text("r,C0,C1\n1e200,1,0\n0.5,0,1\n")
    for argv in (
        ["predict", "--system", str(p), "--eps", "1e-4", "--quiet"],
        ["sweep", "--system", str(p), "--eps", "1e-4", "--out", str(tmp_path / "o"), "--quiet"],
    ):
        assert main(argv) == 2, argv
        line = one_line(capsys.readouterr().err)
        assert "system" in line and "mode 1's loss drop V_k = r_k²/(8 C_kk)" in line, line
        assert "r_k = 1e+200" in line and "overflows float64" in line, line
    assert not (tmp_path / "o").exists()


# -- a property test over the flags --------------------------------------------------------------

_TEXT = st.one_of(
    st.sampled_from(["0", "-1", "1e-4", "0.5", "1", "2", "1e308", "1e-320", "nan", "inf", "-inf", "", "abc", "1,2"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**22), max_value=10**22).map(str),
    st.text(alphabet="0123456789.e-+:,lingox", max_size=12),
)
_FLAGS = {
    "predict": ["--eps", "--t1", "--rho", "--lr", "--points"],
    "fit": ["--lr", "--until", "--bins", "--modes", "--offset", "--level", "--horizon"],
    "sweep": ["--eps", "--t1", "--rho", "--lr", "--points", "--chunk-size", "--max-steps"],
}


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    command=st.sampled_from(sorted(_FLAGS)),
    values=st.lists(st.tuples(st.integers(0, 7), _TEXT), min_size=1, max_size=3),
)
def test_any_flag_value_exits_0_or_2(tmp_path_factory, command, values):
    """`lvflow predict|fit|sweep` on a tiny system or log with arbitrary values for a handful of
    flags: exit 0 or 2 (never 1, never a traceback), and no file left behind on exit 2."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("prop")
    (tmp / "sys.csv").write_text("r,C0,C1\n1,1,0\n0.5,0,1\n")
    rows = [f"{s},{0.2 * np.exp(-0.01 * s) + 0.05 * np.exp(-0.002 * s) + 1e-3:.10g}" for s in range(0, 400, 4)]
    (tmp / "log.csv").write_text("step,loss\n" + "\n".join(rows) + "\n")
    out = tmp / "out"
    out.mkdir()
    base = {
        "predict": [
            "predict",
            "--system",
            str(tmp / "sys.csv"),
            "--eps",
            "1e-4",
            "--save",
            str(out / "p.json"),
            "--quiet",
        ],
        # one mode over 20 bins: a fit that succeeds costs seconds, not a minute
        "fit": [
            "fit",
            str(tmp / "log.csv"),
            "--family",
            "modes",
            "--modes",
            "1",
            "--bins",
            "20",
            "--save",
            str(out / "f.json"),
        ],
        "sweep": [
            "sweep",
            "--system",
            str(tmp / "sys.csv"),
            "--eps",
            "1e-4",
            "--out",
            str(out / "s"),
            "--quiet",
            "--no-summary",
        ],
    }[command]
    flags = _FLAGS[command]
    argv = list(base)
    for i, v in values:
        flag = flags[i % len(flags)]
        if flag in argv:  # replace the base's value
            argv[argv.index(flag) + 1] = v
        else:
            argv += [f"{flag}={v}"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's refusal of a value its type cannot read
            code = e.code
    text = err.getvalue()
    assert code in (0, 2), (argv, code, text)
    assert "Traceback" not in text, (argv, text)
    if code == 2:
        assert len(text.strip().splitlines()) == 1, (argv, text)
        left = [p for p in out.rglob("*") if p.is_file()]
        assert left == [], (argv, left)


def test_fit_offset_above_the_log_is_refused(log, capsys):
    """Class 5: a floor L_inf above where the log ends contradicts a loss that falls towards it."""
    L = np.loadtxt(log, delimiter=",", skiprows=1)[:, 1]
    end = float(np.median(L[-max(1, L.size // 10) :]))
    assert main(["fit", str(log), "--offset", "1"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("lvflow fit: error: --offset: 1 is above where the log ends") and f"{end:.4g}" in line


def test_fit_api_refuses_a_size_beyond_memory(log, monkeypatch):
    """The memory check is `fit`'s own, so the Python API refuses what the CLI refuses."""
    monkeypatch.setattr(memory, "available_memory", lambda: 8 * GIB)
    L = np.loadtxt(log, delimiter=",", skiprows=1)
    with pytest.raises(lvflow.LvflowError, match=r"^max_modes: .*needs about .* 8 GiB available"):
        lvflow.fit(L[:, 0], L[:, 1], max_modes=1000)


def test_predict_api_refuses_an_overflowing_system():
    """The same check guards `lvflow.predict` on a system built in Python, not only files."""
    lv = lvflow.LotkaVolterra(np.array([1e200, 1.0]), np.eye(2))
    with pytest.raises(lvflow.LvflowError, match=r"^system: mode 1's loss drop V_k .* overflows float64"):
        lvflow.predict(lv, eps=1e-4)
