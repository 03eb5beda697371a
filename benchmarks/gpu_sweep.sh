#!/usr/bin/env bash
# The sweep benchmark on a GPU machine (prepared; not yet run on one: see benchmarks/README.md).
#
#   bash benchmarks/gpu_sweep.sh [OUT.json]        # from the repository root, jax[cuda] installed
#
# What it does, in about 5 minutes on one recent GPU (sizes grow on a GPU, see benchmarks/sweep.py):
#   1. checks that JAX sees a GPU and prints the devices;
#   2. runs `python -m benchmarks --only sweep`: 10^6 diagonal configurations x 100 modes
#      (100 alpha2 x 10^4 eps) and 10^4 coupled systems x 100 modes (ODE), each against a Python
#      loop over scipy LSODA timed on a subset of configurations and scaled; then the same on
#      1, 2, ... of the local GPUs (in-process, `lvflow.sweep(devices=k)`);
#   3. checks the sharded result against a single-device one, bit for bit, on a small grid.
# Exit code 0 when everything ran; the rows (with their targets) are in OUT.json.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-benchmarks/results-gpu-sweep.json}"
export LVFLOW_CACHE_DIR="${LVFLOW_CACHE_DIR:-off}"
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"

python - <<'EOF'
import jax
print("devices:", jax.devices())
assert jax.default_backend() == "gpu", f"no GPU visible to JAX (backend {jax.default_backend()!r})"
EOF

python -m benchmarks --only sweep --repeats 3 --out "$OUT"

python - <<'EOF'
import numpy as np
import jax
import lvflow

grid = {"alpha1": 2.0, "alpha2": "lin:0.5:1.2:16", "modes": 100, "eps": "log:1e-8:1e-4:64"}
coupled = [
    {"system": lvflow.LowRankLotkaVolterra(0.9 ** np.arange(50), np.ones(50), 0.1 * np.random.default_rng(i).standard_normal((50, 2))),
     "eps": 1e-6}
    for i in range(64)
]
one = lvflow.sweep(grid, configs=coupled, devices=1, progress=False, chunk_size=512)
every = lvflow.sweep(grid, configs=coupled, progress=False, chunk_size=512)
for k, v in one.columns.items():
    assert np.array_equal(v, every[k], equal_nan=v.dtype.kind == "f"), k
print(f"sharded over {every.stats['devices']} GPU(s) == 1 GPU, bit for bit, on {len(every)} configurations")
EOF
echo "wrote $OUT"
