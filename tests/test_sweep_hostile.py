"""`lvflow sweep` and `lvflow fit` against hostile use: two sweeps on one output directory, a lock
left by a killed process, a different sweep into a used directory, failed rows, JSON at Python's
limits (a list at the top, deep nesting, a byte-order mark), and a failed sweep's files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from _cli import cli_env, main, one_line

ROOT = Path(__file__).resolve().parents[1]
POWER = ["--alpha1", "2", "--alpha2", "0.8", "--modes", "10", "--chunk-size", "2", "--quiet"]


_HOLDER = """
import sys
from pathlib import Path
from lvflow._sweep.run import out_lock
with out_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_one_directory_one_sweep_at_a_time(tmp_path, capsys):
    out = tmp_path / "D"
    grids = ["log:1e-8:1e-3:4", "log:1e-9:1e-3:4"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "lvflow", "sweep", *POWER, "--eps", eps, "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        for eps in grids
    ]
    done = [(p.wait(timeout=240), *p.communicate()) for p in procs]
    assert sorted(rc for rc, _, _ in done) == [0, 2], done
    (winner,) = [i for i, (rc, _, _) in enumerate(done) if rc == 0]
    refusal = one_line(done[1 - winner][2])  # running ("in use") or finished ("a different sweep")
    assert refusal.startswith(f"lvflow sweep: error: --out: {out} ") and ("in use" in refusal or "eps" in refusal)
    argv = ["sweep", *POWER, "--eps", grids[winner], "--out", str(out)]
    import lvflow

    assert lvflow.load_sweep(out)["eps"][0] == float(grids[winner].split(":")[1])  # the winner's grid, whole

    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLDER), str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert main(argv) == 2  # the same sweep, while another process holds the directory
        assert "is in use by another lvflow sweep" in one_line(capsys.readouterr().err)
    finally:
        holder.send_signal(signal.SIGKILL)  # kill -9: the OS drops its lock
        holder.wait(timeout=60)
    (out / "chunk-000001.npz").unlink()
    assert main(argv) == 0  # resumes: one chunk evaluated, one skipped
    assert "evaluated 1 chunks (2 configurations), skipped 1 already done" in capsys.readouterr().out

    assert main(["sweep", *POWER, "--eps", grids[1 - winner], "--out", str(out)]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"--out: {out} holds a different sweep (eps: " in err and "here" in err and "there" in err
    assert main(["sweep", *POWER, "--eps", grids[winner], "--max-steps", "5", "--out", str(out)]) == 2
    assert "(max_steps: 5 here, 16384 there)" in one_line(capsys.readouterr().err)


def test_failed_rows_are_counted_and_exit_1(tmp_path, capsys):
    np.savez(tmp_path / "compete.npz", r=[1.0, 0.6, 0.5], C=[[1, 0, 0], [0, 1, 0.9], [0, 0.9, 1]])
    out = tmp_path / "D"
    argv = ["sweep", "--system", str(tmp_path / "compete.npz"), "--eps", "1e-6,1e-4", "--quiet", "--out", str(out)]
    assert main([*argv, "--max-steps", "1"]) == 1
    cap = capsys.readouterr()
    assert "2 configurations (2 failed)" in cap.out
    err = one_line(cap.err)
    assert err.startswith("lvflow sweep: solver failed: 2 of 2 configurations failed")
    assert f"in {out}/chunk-*.npz" in err and "summary.json" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_failed"] == 2 and summary["failed"] == [0, 1]
    assert main([*argv, "--max-steps", "1", "--json"]) == 1  # resumed: still failed, still said
    assert json.loads(capsys.readouterr().out)["n_failed"] == 2


def test_json_at_pythons_limits_isone_line(tmp_path, capsys):
    deep = "[" * 5000 + "]" * 5000  # deeper than Python's recursion limit
    cases = {
        "list.json": '[{"grid": {"alpha1": 2}}]',
        "deep.json": '{"grid": ' + deep + "}",
        "deep.toml": "a = " + deep + "\n",
        "grid.json": '{"grid": 5}',
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        assert main(["sweep", "--spec", str(tmp_path / name), "--out", str(tmp_path / "D")]) == 2, name
        assert one_line(capsys.readouterr().err).startswith(f"lvflow sweep: error: spec: {tmp_path / name}")
    assert not (tmp_path / "D").exists()

    (tmp_path / "log.json").write_text(deep)
    assert main(["fit", str(tmp_path / "log.json")]) == 2
    assert "nested too deeply" in one_line(capsys.readouterr().err)
    rows = [{"step": s, "loss": 1.0 / (1 + s)} for s in range(5)]
    (tmp_path / "bom.json").write_text(json.dumps(rows), encoding="utf-8-sig")
    assert main(["fit", str(tmp_path / "bom.json")]) == 2  # read (the byte-order mark dropped), then refused:
    assert "only 5 logged point(s)" in one_line(capsys.readouterr().err)  # too short to fit, quickly


def test_failed_sweep_leaves_no_file(tmp_path, capsys):
    out = tmp_path / "new" / "D"
    assert main(["sweep", *POWER, "--eps", "1e-4,3", "--out", str(out)]) == 2
    assert "--eps: must lie in (0, 1)" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    assert main(["sweep", *POWER, "--eps", "1e-4,3", "--out", str(tmp_path / "empty")]) == 2
    assert os.listdir(tmp_path / "empty") == []
