"""`lvflow predict` through the console entry point: bad input gives exit code 2 and ONE line on
stderr naming the input; good input gives the table, JSON, plot and saved files."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lvflow._cli import main

R3 = np.array([1.0, 0.5, 0.25])
C3 = np.eye(3)


def cli(capsys, *argv):
    rc = main(["predict", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(capsys, argv, *needles):
    """Runs the CLI expecting a bad-input failure; checks exit 2 and a single stderr line."""
    try:
        rc, out, err = cli(capsys, *argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
        out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture()
def good(tmp_path):
    f = tmp_path / "sys.npz"
    np.savez(f, r=R3, C=C3)
    return f


def test_file_errors(capsys, tmp_path, good):
    one_line_error(capsys, ["--system", tmp_path / "missing.npz", "--eps", "1e-5"], "--system", "file not found")
    (tmp_path / "s.json").write_text("{}")
    one_line_error(capsys, ["--system", tmp_path / "s.json", "--eps", "1e-5"], "--system", "unsupported file type")
    evil = tmp_path / "evil.npy"
    np.save(evil, np.array([object()], dtype=object), allow_pickle=True)
    one_line_error(capsys, ["--system", evil, "--eps", "1e-5"], "--system", "pickled")
    evilz = tmp_path / "evil.npz"
    np.savez(evilz, r=np.array([None, 1], dtype=object), C=C3)
    one_line_error(capsys, ["--system", evilz, "--eps", "1e-5"], "--system", "pickled")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--z0", tmp_path / "nope.npy"], "--z0", "file not found")
    one_line_error(capsys, ["--architecture", "mlp", "--data", tmp_path / "nope.csv", "--eps", "0.1"], "--data", "not found")


def test_shape_and_value_errors(capsys, tmp_path, good):
    bad = tmp_path / "bad.npz"
    np.savez(bad, r=R3, C=np.eye(2))
    one_line_error(capsys, ["--system", bad, "--eps", "1e-5"], "--system", "shape (2, 2)", "(3, 3)")
    np.savez(bad, r=R3, C=np.array([[1, 0, np.nan], [0, 1, 0], [0, 0, 1]]))
    one_line_error(capsys, ["--system", bad, "--eps", "1e-5"], "--system", "C", "non-finite")
    np.savez(bad, r=np.array([1.0, np.inf, 0.2]), C=C3)
    one_line_error(capsys, ["--system", bad, "--eps", "1e-5"], "--system", "r", "non-finite")
    np.savez(bad, r=R3, C=np.array([[1, 0.5, 0], [0, 1, 0], [0, 0, 1]]))
    one_line_error(capsys, ["--system", bad, "--eps", "1e-5"], "--system", "C", "not symmetric")
    np.savez(bad, r=R3, C=np.array([[1, 2, 0], [2, 1, 0], [0, 0, 1]]))
    one_line_error(capsys, ["--system", bad, "--eps", "1e-5"], "--system", "C", "not positive semi-definite")
    np.savez(bad, r=R3, K=C3)
    one_line_error(capsys, ["--system", bad, "--eps", "1e-5"], "--system", "expected arrays 'r' and 'C'")
    np.savez(bad, zeta=R3, V=np.array([1.0, 0.0, 1.0]))
    one_line_error(capsys, ["--system", bad, "--eps", "1e-5"], "--system", "V must be positive")
    (tmp_path / "s.csv").write_text("1,1,0\n0.5,0,1\n")  # (2, 3): fine; (2, 2) is not
    (tmp_path / "t.csv").write_text("1,1\n0.5,0\n")
    one_line_error(capsys, ["--system", tmp_path / "t.csv", "--eps", "1e-5"], "--system", "(K, K+1)")
    np.save(tmp_path / "z0.npy", np.array([1e-3, 1e-3]))
    one_line_error(capsys, ["--system", good, "--z0", tmp_path / "z0.npy"], "--z0", "shape (2,)", "(3,)")
    np.save(tmp_path / "z0.npy", np.array([1e-3, -1e-3, 1e-3]))
    one_line_error(capsys, ["--system", good, "--z0", tmp_path / "z0.npy"], "--z0", "positive")


@pytest.mark.parametrize("eps", ["0", "-1e-3", "1", "2.5", "nan", "inf"])
def test_eps_out_of_range(capsys, good, eps):
    line = one_line_error(capsys, ["--system", good, f"--eps={eps}"], "--eps")
    assert "(0, 1)" in line or "non-finite" in line


def test_option_errors(capsys, good, tmp_path):
    one_line_error(capsys, ["--system", good], "--eps", "required")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--rho", "1"], "--rho", "(0, 1)")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--lr", "0"], "--lr", "positive")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--t1", "-3"], "--t1", "positive")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--init-std", "0.1"], "only one of")
    one_line_error(capsys, ["--system", good, "--init-std", "0.1"], "--width", "required")
    one_line_error(capsys, ["--system", good, "--init-std", "0.1", "--width", "100"], "--init-std", "(0, 1)")
    one_line_error(capsys, ["--system", good, "--eps", "0.9"], "--eps", "too large")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--save", tmp_path / "o.txt"], "--save", ".json or .npz")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--plot", tmp_path / "o.jpg"], "--plot", ".png")
    one_line_error(capsys, ["--eps", "1e-5"], "give exactly one of")
    one_line_error(capsys, ["--system", good, "--alpha1", "2", "--eps", "1e-5"], "give exactly one of")
    one_line_error(capsys, ["--alpha1", "2", "--alpha2", "0.8", "--eps", "1e-5"], "--modes", "required")
    one_line_error(capsys, ["--alpha1", "2", "--alpha2", "0.8", "--modes", "0", "--eps", "1e-5"], "--modes", "positive")
    one_line_error(capsys, ["--architecture", "resnet", "--data", good, "--eps", "0.1"], "architecture", "unknown 'resnet'")
    one_line_error(capsys, ["--system", good, "--eps", "abc"], "--eps", "invalid float")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--bogus"], "unrecognized arguments")


def test_non_commuting_data_with_force_lv(capsys, tmp_path):
    # A two-layer MLP's A(x) = ½[[0, x],[xᵀ, 0]] for different x do not commute.
    rng = np.random.default_rng(0)
    f = tmp_path / "xy.npz"
    np.savez(f, x=rng.normal(size=(6, 3)), y=rng.normal(size=6))
    one_line_error(capsys, ["--architecture", "mlp", "--data", f, "--eps", "1e-3", "--force-lv", "--quiet"],
                   "--data", "--force-lv", "share no eigenbasis")
    np.savez(f, x=rng.normal(size=(6, 3)), y=rng.normal(size=5))
    one_line_error(capsys, ["--architecture", "mlp", "--data", f, "--eps", "1e-3"], "--data", "6 samples", "5")
    np.savez(f, x=np.full((6, 3), np.nan), y=rng.normal(size=6))
    one_line_error(capsys, ["--architecture", "mlp", "--data", f, "--eps", "1e-3"], "--data", "x", "non-finite")


def test_debug_shows_traceback(capsys, tmp_path):
    with pytest.raises(Exception, match="file not found"):
        main(["predict", "--system", str(tmp_path / "missing.npz"), "--eps", "1e-5", "--debug"])
