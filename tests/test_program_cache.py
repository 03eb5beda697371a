"""The `lvflow` command keeps the compiled programs of `predict --architecture mlp` and of `fit` in
its cache directory (`$LVFLOW_CACHE_DIR/programs`, issue 27 item 4, issue 28 item 5): the next
process loads them instead of tracing and lowering them again; a corrupt file is compiled again,
and the output stays the same."""

import re
import subprocess
import sys

import numpy as np
import pytest
from _cli import cli_env

# internal on purpose: the names JAX logs for predict's five compiled programs (the MLP's features,
# the network check, Y with L(M0), GD's chunk, the validity horizon's ratio)
_TRACED = re.compile(r"Finished tracing (_factors|_both_outputs|_start|_gd_chunk|_ratio_terms) ")


def _predict(tmp_path, cache):
    """`lvflow predict --architecture mlp` on a small tabular data set in a fresh process, with the
    cache in `cache`: the programs it traced and the JSON it saved."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 4))
    data = tmp_path / "data.npz"
    np.savez(data, x=X, y=np.sign(X @ np.array([1.0, -0.5, 0.25, 0.0]) + 0.1))
    saved = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "lvflow", "predict", "--architecture", "mlp", "--data", str(data)]
    cmd += ["--init-std", "1e-3", "--width", "16", "--lr", "0.01", "--quiet", "--save", str(saved)]
    env = {**cli_env(), "LVFLOW_CACHE_DIR": str(cache), "JAX_LOG_COMPILES": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return sorted(_TRACED.findall(out.stderr)), saved.read_bytes()


def test_the_next_process_loads_the_kept_programs_and_compiles_a_corrupt_one_again(tmp_path):
    cache = tmp_path / "cache"
    traced, first = _predict(tmp_path, cache)
    assert traced == sorted(["_factors", "_both_outputs", "_start", "_gd_chunk", "_ratio_terms"])
    files = sorted((cache / "programs").glob("*.bin"))
    assert len(files) == 5
    kept = {f: f.read_bytes() for f in files}
    # two files spoilt: one cut short (a write cut off), one with a byte changed
    files[0].write_bytes(kept[files[0]][: len(kept[files[0]]) // 2])
    spoilt = bytearray(kept[files[1]])
    spoilt[len(spoilt) // 2] ^= 0xFF
    files[1].write_bytes(bytes(spoilt))

    traced, second = _predict(tmp_path, cache)
    assert second == first  # the same output, byte for byte
    assert len(traced) == 2  # the three intact programs were loaded, not traced
    # the two spoilt ones were compiled again and written anew (the same program: the same file)
    assert sorted((cache / "programs").glob("*.bin")) == files
    assert files[0].read_bytes()[:16] == kept[files[0]][:16] and len(files[0].read_bytes()) > len(kept[files[0]]) // 2
    assert files[1].read_bytes() != bytes(spoilt)


# internal on purpose: the names JAX logs for the fit engine's compiled programs (the
# Levenberg–Marquardt solver, the Jacobian, the reported numbers with their Jacobian)
_FIT_TRACED = re.compile(r"Finished tracing (_solve_many|_jac|summaries_and_jac) ")


def _fit(log, cache):
    """`lvflow fit LOG` in a fresh process with the cache in `cache`: the engine's programs it
    traced and its report."""
    env = {**cli_env(), "LVFLOW_CACHE_DIR": str(cache), "JAX_LOG_COMPILES": "1"}
    cmd = [sys.executable, "-m", "lvflow", "fit", str(log), "--lr", "0.01", "--modes", "2", "--offset", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return sorted(set(_FIT_TRACED.findall(out.stderr))), out.stdout


@pytest.mark.slow
def test_the_next_fit_loads_the_kept_solver(tmp_path):
    # two logistic modes (Thm 6, r = 1 and 1/4, V = r²/8, z(0) = 1e-4), no offset
    steps = np.linspace(0, 8000, 200)
    t, r = 0.01 * steps, np.array([1.0, 0.25])
    z = 1.0 / (1.0 + (r / 1e-4 - 1.0) * np.exp(-r * t[:, None]))  # z_k(t)/z_k(∞)
    loss = np.sum(r**2 / 8 * (1 - z) ** 2, axis=1)
    log = tmp_path / "log.csv"
    log.write_text("step,loss\n" + "".join(f"{s!r},{v!r}\n" for s, v in zip(steps.tolist(), loss.tolist())))
    traced, first = _fit(log, tmp_path / "cache")
    assert traced == ["_jac", "_solve_many", "summaries_and_jac"]
    # the next process loads the solver (it calls LAPACK's QR: set up before the program runs)
    traced, second = _fit(log, tmp_path / "cache")
    assert traced == [] and second == first
