"""Benchmarks of lvflow against scipy, gradient descent and the machine's arithmetic limit.

Run `python -m benchmarks` (or `lvflow bench`); `--smoke` for tiny sizes, `--only NAME` for one
benchmark, `--out FILE.json` for the record. One module per benchmark:

| name | module | what |
|---|---|---|
| `glv` | `glv.py` | `solve_lv` vs scipy LSODA / Radau, 1000 modes, switch-on times included |
| `gd` | `gd.py` | the same prediction vs gradient descent on the NQF to the same time |
| `batch` | `batch.py` | 1024 systems × 100 modes, one vmapped call vs a Python loop over scipy |
| `schedule` | `schedule.py` | `plateau_schedule` time vs K, fitted complexity |
| `train` | `train.py` | `lvflow.train` steps/s vs a per-step Python loop (Fig 2 MLP) |
| `limit` | `limit.py` | solve flops vs the measured float64 matmul rate |
| `grad` | `grad.py` | reverse-mode gradient of all 1000 switch-on times vs the forward solve |

Shared pieces: `problems.py` (the gLVs), `scipy_glv.py` (the scipy baseline), `_harness.py`
(timing, rows, table), `config.py` (options).
"""
