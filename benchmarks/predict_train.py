"""Predicting against training (row 11, `python -m benchmarks --only predict_train`).

A prediction is worth running only if it is faster than training the network it describes. For
each case, both in a fresh process, as a user pays them:

- **lvflow**: `lvflow predict --architecture mlp --data D --init-std 1e-3 --width 64 --lr 0.01`
  with JAX's persistent compilation cache warm (one run first);
- **training**: a script that imports JAX, builds the same tanh MLP (`f(x) = Σ_i v_i tanh(u_iᵀx)`,
  W ~ N(0, 10⁻⁶)) and runs full-batch gradient descent (one jitted `lax.scan`) for as many steps as
  the prediction's horizon `t1/η`, with its own persistent cache warm too.

Both run with Python's bytecode cached (as on a user's machine), alternated (predict, training,
predict, …: a change in the machine's load hits both alike), `max(repeats, 5)` times each; a row
reports the medians and keeps every time in its data.

Cases: the README's digits parity MLP (1797 × 64) and a tabular MLP on scikit-learn's wine data
(178 × 13, standardised, class 0 against the rest). `ratio` = training / predict (> 1: predicting
is faster).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ._harness import Row
from .config import Config

_TRAIN = """
import sys, numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_compilation_cache_dir", sys.argv[3])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
d = np.load(sys.argv[1]); X = jnp.asarray(d["x"].reshape(len(d["y"]), -1)); y = jnp.asarray(d["y"])
steps, n = int(sys.argv[2]), X.shape[1]
W = 1e-3 * jax.random.normal(jax.random.PRNGKey(0), (n + 1, 64))

def loss(W):
    return jnp.mean((jnp.tanh(X @ W[:n]) @ W[n] - y) ** 2)

@jax.jit
def train(W):
    def step(W, _):
        return W - 0.01 * jax.grad(loss)(W), None
    return jax.lax.scan(step, W, None, length=steps)[0]

print(float(loss(train(W))))
"""


def _cases(tmp: Path) -> dict[str, Path]:
    from sklearn.datasets import load_wine

    import lvflow

    X, y = lvflow.digits_parity()
    digits = tmp / "digits.npz"
    np.savez(digits, x=np.asarray(X).reshape(-1, 8, 8), y=np.asarray(y))
    w = load_wine()
    Xw = (w.data - w.data.mean(0)) / w.data.std(0)
    wine = tmp / "wine.npz"
    np.savez(wine, x=Xw, y=np.where(w.target == 0, 1.0, -1.0))
    return {"digits parity MLP (1797 x 64, width 64)": digits, "wine MLP (178 x 13, width 64)": wine}


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()[-500:]}")
    return time.perf_counter() - t


def run(cfg: Config) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        # as on a user's machine: Python's bytecode cached (this VM sets PYTHONDONTWRITEBYTECODE,
        # which recompiles every source of lvflow and JAX in each process, ~1.9 s) for both sides
        env = dict(os.environ, LVFLOW_CACHE_DIR=str(tmp / "lvflow-cache"), PYTHONPYCACHEPREFIX=str(tmp / "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        script = tmp / "train.py"
        script.write_text(_TRAIN)
        cases = _cases(tmp)
        for case, data in cases.items():
            if cfg.smoke and "wine" not in case:
                continue  # the smaller case only: the smoke run checks that it runs
            saved = tmp / "p.json"
            predict = [sys.executable, "-m", "lvflow", "predict", "--architecture", "mlp", "--data", str(data)]
            predict += ["--init-std", "1e-3", "--width", "64", "--lr", "0.01", "--quiet", "--save", str(saved)]
            _wall(predict, env)  # fills the cache
            rec = json.loads(saved.read_text())
            steps = int(np.ceil(rec["t1"] / 0.01))
            train = [sys.executable, str(script), str(data), str(steps), str(tmp / "train-cache")]
            _wall(train, env)  # fills its cache
            t_preds, t_trains = [], []
            for _ in range(1 if cfg.smoke else max(cfg.repeats, 5)):
                t_preds.append(_wall(predict, env))
                t_trains.append(_wall(train, env))
            t_pred, t_train = statistics.median(t_preds), statistics.median(t_trains)
            rows.append(
                Row(
                    "predict_train",
                    case,
                    t_pred,
                    f"training to the horizon ({steps} GD steps), fresh process (medians)",
                    t_train,
                    t_train / t_pred,
                    1.0,
                    note=f"method {rec['method']}, {len(rec['drops'])} drops; "
                    f"best {min(t_preds):.2f} s vs {min(t_trains):.2f} s",
                    data={"steps": steps, "t1": rec["t1"], "predict_s": t_preds, "training_s": t_trains},
                )
            )
    return rows
