"""The `lvflow` command keeps the compiled programs of `predict --architecture mlp` in its cache
directory (`$LVFLOW_CACHE_DIR/programs`, issue 27 item 4): the next process loads them instead of
tracing and lowering them again; a corrupt file is compiled again, and the output stays the same."""

import re
import subprocess
import sys

import numpy as np
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
