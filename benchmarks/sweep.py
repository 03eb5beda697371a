"""Row 8: `lvflow.sweep` — many configurations end to end (grid expansion, grouping, batched
evaluation, sharding, per-configuration numbers) against a Python loop over scipy, and its scaling
with the number of (virtual) devices.

- *Diagonal*: 10⁵ power-law spectra × 100 modes, the grid `α₂ ∈ [0.5, 1.2]` (100 values) ×
  `ε ∈ [10⁻⁸, 10⁻⁴]` (1000, log-spaced), `α₁ = 2` (Thm 9): per configuration every `t*_k`
  (Eq. 158), `τ*_k`, the plateau losses (Eq. 168), the horizon and the summary scalars; in memory,
  and written to disk in chunks (atomic, fsync'ed).
- *Coupled*: 10³ systems × 100 modes, the `problems.batch` family (`C = Diag(d) + UUᵀ`, rank 4,
  one random coupling each) as a list of configurations, ODE solves (RODAS5P) at `rtol = 1e-8`,
  `atol = 1e-10`, the switch-on times (`schedule="none"`: the same deliverable as scipy's).

scipy: LSODA per configuration (the faster method at this size, row 1), the same tolerances,
switch-on times by the same dense-output root finding; its cost is linear in the number of
configurations, so it is timed on `n_loop` of them (spread over the grid) and scaled.

Work-precision (the coupled family): the two sides' switch-on times are also compared with an
independent tighter solve (LSODA at `rtol = 1e-12`, `atol = 1e-14`, itself checked against Radau
on two systems), and lvflow's sweep is timed once more at the loosest `rtol` of a short ladder
whose error is still at most LSODA's at the benchmark's tolerance: the ratio at equal accuracy.

Devices: a CPU is one JAX device unless split (`--xla_force_host_platform_device_count=N`, set
before JAX starts), so the scaling rows run each device count in a subprocess
(`python -m benchmarks.sweep worker`); on a GPU machine the local GPUs are used in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import problems
from ._harness import Row, max_rel_diff
from .config import Config
from .scipy_glv import solve_scipy

NAME = "sweep"
TARGET_DIAGONAL = 1000.0
TARGET_COUPLED = 10.0
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="


def diagonal_grid(n_alpha: int, n_eps: int, K: int) -> dict:
    return {"alpha1": 2.0, "alpha2": f"lin:0.5:1.2:{n_alpha}", "modes": K, "eps": f"log:1e-8:1e-4:{n_eps}"}


def coupled_configs(n: int, K: int, rtol: float, atol: float) -> tuple[list[dict], list[problems.Problem]]:
    """The `problems.batch` systems as sweep configurations: `z_k0 = 10⁻⁶ k^{−1.2}` is `eps = 1e-6`,
    `beta = 1.2`; their common horizon `t1`."""
    import lvflow

    probs = problems.batch(n, K)
    cfgs = [
        {
            "system": lvflow.LowRankLotkaVolterra(p.r, p.d, p.U),
            "eps": 1e-6,
            "beta": 1.2,
            "t1": p.t1,
            "rtol": rtol,
            "atol": atol,
        }
        for p in probs
    ]
    return cfgs, probs


_LADDER = (1.0, 2.0, 3.0, 5.0)  # lvflow's rtol, as multiples of the benchmark's, for equal accuracy


def equal_accuracy(probs, loop_c, cfg: Config, *, K: int, n_coupled: int, repeats: int, ladder=_LADDER) -> dict:
    """The coupled sweep at equal accuracy: both sides' switch-on times against LSODA at
    `rtol = 1e-12` (checked against Radau on `min(2, n)` systems), lvflow on the `probs` systems at
    each `rtol` of `ladder` (× `cfg.rtol`), and the full `n_coupled` sweep timed at the loosest one
    whose max relative error is at most LSODA's (`loop_c`, at `cfg.rtol`); then both errors on
    the timed run's next `len(probs)` systems, which did not choose the `rtol`."""
    import lvflow

    def reference(systems, method="LSODA", rtol=1e-12, atol=1e-14):
        return [solve_scipy(p, method=method, rtol=rtol, atol=atol).switch_on_times for p in systems]

    ref = reference(probs)
    radau = reference(probs[:2], method="Radau")
    out = {
        "reference_err_vs_radau": max(max_rel_diff(a, b) for a, b in zip(ref, radau)),
        "lsoda_err": max(max_rel_diff(r.switch_on_times, b) for r, b in zip(loop_c, ref)),
        "lvflow_err": {},
    }
    for f in ladder:
        cfgs, _ = coupled_configs(len(probs), K, f * cfg.rtol, cfg.atol)
        res = lvflow.sweep(configs=cfgs, schedule="none", progress=False)
        out["lvflow_err"][f * cfg.rtol] = max(max_rel_diff(res["t_star"][i], ref[i]) for i in range(len(probs)))
    ok = [rtol for rtol, e in out["lvflow_err"].items() if e <= out["lsoda_err"]]
    if not ok:
        return out
    out["rtol"] = max(ok)
    cfgs, timed = coupled_configs(n_coupled, K, out["rtol"], cfg.atol)
    lvflow.sweep(configs=cfgs, schedule="none", progress=False)  # compile
    out["seconds"], out["seconds_all"], res = _best(
        lambda: lvflow.sweep(configs=cfgs, schedule="none", progress=False), max(1, min(repeats, 2))
    )
    out["steps_mean"] = float(np.mean(res["num_steps"]))
    # held out: the timed run's next len(probs) systems, which did not choose the rtol
    n = len(probs)
    held = timed[n : 2 * n]
    if held:
        ref_h = reference(held)
        lsoda_h = reference(held, rtol=cfg.rtol, atol=cfg.atol)
        out["held_out_systems"] = len(held)
        out["lsoda_err_held_out"] = max(max_rel_diff(a, b) for a, b in zip(lsoda_h, ref_h))
        out["lvflow_err_held_out"] = max(max_rel_diff(res["t_star"][n + i], b) for i, b in enumerate(ref_h))
    return out


def _best(fn, repeats: int) -> tuple[float, list[float], object]:
    times, out = [], None
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), times, out


def measure(
    *, n_alpha: int, n_eps: int, K: int, n_coupled: int, repeats: int, rtol: float, atol: float, devices=None
) -> dict:
    """Times of the diagonal sweep (in memory, cold and warm; to disk) and the coupled one, in
    this process, on `devices`."""
    import jax

    import lvflow

    grid = diagonal_grid(n_alpha, n_eps, K)
    out: dict = {"devices": len(jax.local_devices()) if devices is None else devices, "backend": jax.default_backend()}
    t0 = time.perf_counter()
    res = lvflow.sweep(grid, progress=False, devices=devices)
    out["diagonal_cold_s"] = time.perf_counter() - t0
    out["diagonal_s"], out["diagonal_s_all"], res = _best(
        lambda: lvflow.sweep(grid, progress=False, devices=devices), repeats
    )
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        lvflow.sweep(grid, progress=False, devices=devices, out=os.path.join(d, "s"), summary=False)
        out["diagonal_disk_s"] = time.perf_counter() - t0
    out["diagonal_n"] = len(res)
    if n_coupled:
        cfgs, _ = coupled_configs(n_coupled, K, rtol, atol)
        t0 = time.perf_counter()
        lvflow.sweep(configs=cfgs, schedule="none", progress=False, devices=devices)
        out["coupled_cold_s"] = time.perf_counter() - t0
        out["coupled_s"], out["coupled_s_all"], cres = _best(
            lambda: lvflow.sweep(configs=cfgs, schedule="none", progress=False, devices=devices),
            max(1, min(repeats, 2)),
        )
        out["coupled_steps_min_max"] = [int(cres["num_steps"].min()), int(cres["num_steps"].max())]
        out["coupled_steps_mean"] = float(np.mean(cres["num_steps"]))
        out["coupled_t_star_head"] = cres["t_star"][:4].tolist()
    out["diagonal_t_star_rows"] = {str(i): res["t_star"][i].tolist() for i in _spread(len(res), 4)}
    out["diagonal_t1_rows"] = {str(i): float(res["t1"][i]) for i in _spread(len(res), 4)}
    return out


def _spread(n: int, m: int) -> list[int]:
    return sorted({int(i) for i in np.linspace(0, n - 1, m)})


def _worker_run(n_dev: int, flags: str, sizes: dict, cfg: Config) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n_dev} {flags}".strip()
    env["PYTHONPATH"] = _ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("LVFLOW_CACHE_DIR", "off")
    args = [
        sys.executable,
        "-m",
        "benchmarks.sweep",
        "worker",
        json.dumps({**sizes, "rtol": cfg.rtol, "atol": cfg.atol}),
    ]
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800, cwd=_ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"benchmarks.sweep worker ({n_dev} devices) failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _scipy_diagonal(grid_rows: dict, n_alpha: int, n_eps: int, K: int, cfg: Config, n_loop: int):
    """LSODA on `n_loop` configurations spread over the grid (same spectra, ε, horizon)."""
    k = np.arange(1, K + 1, dtype=float)
    alphas = np.linspace(0.5, 1.2, n_alpha)
    epss = np.geomspace(1e-8, 1e-4, n_eps)
    seconds, diffs = 0.0, []
    picks = _spread(n_alpha * n_eps, n_loop)
    for i in picks:
        a2, eps = alphas[i // n_eps], epss[i % n_eps]
        r = k**-a2
        d = r**2 / (8 * k**-2.0)
        z0 = np.full(K, eps)
        t1 = grid_rows.get(str(i))
        if t1 is None:  # the horizon predict chooses (Eq. 158 estimate, τ* ln(1/ε), + 8 e-folds)
            t1 = 1.2 * max(np.max(np.log(np.maximum(r / (d * eps), np.e)) / r), np.max(1 / r) * np.log(1 / eps))
            t1 += 8 / r.min()
        p = problems.Problem("sweep", r, d, np.zeros((K, 0)), z0, float(t1))
        sr = solve_scipy(p, method="LSODA", rtol=cfg.rtol, atol=cfg.atol)
        seconds += sr.seconds
        diffs.append((i, sr.switch_on_times))
    return seconds, len(picks), diffs


def run(cfg: Config) -> list[Row]:
    import jax

    import lvflow  # noqa: F401  (float64)

    gpu = jax.default_backend() != "cpu"
    if cfg.smoke:
        n_alpha, n_eps, K, n_coupled, n_loop, n_loop_c = 4, 5, 10, 8, 4, 2
    elif gpu:
        n_alpha, n_eps, K, n_coupled, n_loop, n_loop_c = 100, 10000, 100, 10000, 64, 32
    else:
        n_alpha, n_eps, K, n_coupled, n_loop, n_loop_c = 100, 1000, 100, 1000, 64, 32
    sizes = dict(n_alpha=n_alpha, n_eps=n_eps, K=K, n_coupled=n_coupled, repeats=cfg.repeats)
    rows: list[Row] = []

    # This process, all local devices (one on a CPU).
    base = measure(**sizes, rtol=cfg.rtol, atol=cfg.atol)
    n_diag = n_alpha * n_eps

    # scipy, on a subset, scaled
    t_loop, m, sp = _scipy_diagonal(base["diagonal_t1_rows"], n_alpha, n_eps, K, cfg, n_loop)
    ref_diag = t_loop * n_diag / m
    check = [
        max_rel_diff(np.asarray(base["diagonal_t_star_rows"][str(i)]), ts)
        for i, ts in sp
        if str(i) in base["diagonal_t_star_rows"]
    ]
    diff_d = max(check) if check else float("nan")
    cfgs, probs = coupled_configs(n_loop_c, K, cfg.rtol, cfg.atol)
    loop_c = [solve_scipy(p, method="LSODA", rtol=cfg.rtol, atol=cfg.atol) for p in probs]
    ref_coup = sum(r.seconds for r in loop_c) * n_coupled / n_loop_c
    diff_c = max(
        max_rel_diff(np.asarray(base["coupled_t_star_head"][i]), loop_c[i].switch_on_times)
        for i in range(4)
        if i < n_loop_c
    )

    dev = f"{base['devices']} {base['backend']} device(s)"
    note_d = f"scipy timed on {m} configurations spread over the grid, ×{n_diag / m:g}; t* max rel diff {diff_d:.1e}"
    rows.append(
        Row(
            NAME,
            f"{n_diag} diagonal configs × {K} modes (grid {n_alpha} α₂ × {n_eps} ε), in memory, warm, {dev}",
            base["diagonal_s"],
            "Python loop, scipy LSODA",
            ref_diag,
            ref_diag / base["diagonal_s"],
            TARGET_DIAGONAL,
            note_d + "; every t*, τ*, plateau loss, horizon and summary scalar of each configuration",
            {k: v for k, v in base.items() if not k.endswith("_rows") and k != "coupled_t_star_head"},
        )
    )
    rows.append(
        Row(
            NAME,
            f"{n_diag} diagonal configs × {K} modes, written in chunks (atomic, fsync), {dev}",
            base["diagonal_disk_s"],
            "Python loop, scipy LSODA",
            ref_diag,
            ref_diag / base["diagonal_disk_s"],
            None,
            f"{n_diag * K * 6 * 8 / 1e6:.0f} MB of per-mode columns written",
        )
    )
    if cfg.cold:
        rows.append(
            Row(
                NAME,
                f"{n_diag} diagonal configs × {K} modes, cold (compile incl.)",
                base["diagonal_cold_s"],
                "Python loop, scipy LSODA",
                ref_diag,
                ref_diag / base["diagonal_cold_s"],
            )
        )
    steps = base.get("coupled_steps_min_max", [0, 0])
    note_c = (
        f"scipy timed on {n_loop_c} systems, ×{n_coupled / n_loop_c:g}; t* max rel diff {diff_c:.1e}; "
        f"steps {steps[0]}–{steps[1]}"
    )
    rows.append(
        Row(
            NAME,
            f"{n_coupled} coupled configs × {K} modes (rank 4, ODE), {dev}",
            base["coupled_s"],
            "Python loop, scipy LSODA",
            ref_coup,
            ref_coup / base["coupled_s"],
            TARGET_COUPLED,
            note_c,
            {"scipy_loop_measured_s": sum(r.seconds for r in loop_c), "scipy_systems": n_loop_c},
        )
    )
    acc = equal_accuracy(
        probs, loop_c, cfg, K=K, n_coupled=n_coupled, repeats=cfg.repeats, ladder=(1.0,) if cfg.smoke else _LADDER
    )
    errs = ", ".join(f"{e:.1e} at {r:g}" for r, e in acc["lvflow_err"].items())
    note_a = (
        f"t* max rel error against LSODA at rtol 1e-12 (itself {acc['reference_err_vs_radau']:.0e} from Radau) "
        f"on {n_loop_c} systems: LSODA at rtol {cfg.rtol:g} {acc['lsoda_err']:.1e}; lvflow {errs}"
    )
    held = ""
    if "held_out_systems" in acc:
        held = (
            f"; held out ({acc['held_out_systems']} more systems of the timed run): lvflow "
            f"{acc['lvflow_err_held_out']:.1e}, LSODA {acc['lsoda_err_held_out']:.1e}"
        )
    if "rtol" in acc:
        rows.append(
            Row(
                NAME,
                f"{n_coupled} coupled configs × {K} modes, equal accuracy (lvflow at rtol {acc['rtol']:g}, "
                f"LSODA at {cfg.rtol:g}), {dev}",
                acc["seconds"],
                "Python loop, scipy LSODA",
                ref_coup,
                ref_coup / acc["seconds"],
                None,
                note_a + held + f"; {acc['steps_mean']:.0f} steps on average",
                {k: v for k, v in acc.items() if k != "lvflow_err"} | {"lvflow_err": list(acc["lvflow_err"].items())},
            )
        )
    else:
        print(f"sweep: no lvflow rtol in the ladder reaches LSODA's accuracy ({note_a}); no equal-accuracy row")

    # Scaling with the number of devices.
    variants: list[tuple[str, dict]] = []
    if gpu:
        n = len(jax.local_devices())
        counts = sorted({1, n} | ({2} if n >= 2 else set()))
        for c in counts:
            variants.append((f"{c} GPU(s)", measure(**sizes, rtol=cfg.rtol, atol=cfg.atol, devices=c)))
    elif not cfg.smoke:
        for n_dev, flags, label in (
            (1, "", "1 CPU device (worker)"),
            (2, "", "2 virtual CPU devices"),
            (4, "", "4 virtual CPU devices"),
            (2, _YNN_OFF, "2 virtual CPU devices, XLA's YNN fusions off"),
        ):
            variants.append((label, _worker_run(n_dev, flags, sizes, cfg)))
    for label, v in variants:
        for fam, ref, target, n in (
            ("diagonal", ref_diag, None, n_diag),
            ("coupled", ref_coup, TARGET_COUPLED, n_coupled),
        ):
            t = v[f"{fam}_s"]
            rows.append(
                Row(
                    NAME,
                    f"{n} {fam} configs × {K} modes, {label}",
                    t,
                    "Python loop, scipy LSODA",
                    ref,
                    ref / t,
                    target if fam == "coupled" else None,
                    f"vs this process's single device: {base[f'{fam}_s'] / t:.2f}×",
                    {k: x for k, x in v.items() if not k.endswith("_rows") and k != "coupled_t_star_head"},
                )
            )
    return rows


def _worker(argv: list[str]) -> int:
    """`python -m benchmarks.sweep worker JSON`: `measure` in a fresh process (XLA_FLAGS set by the
    caller), printing its JSON."""
    from threadpoolctl import threadpool_limits

    import lvflow  # noqa: F401  (float64)

    kw = json.loads(argv[0])
    with threadpool_limits(limits=1, user_api="blas"):
        out = measure(**kw)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sweep")
    parser.add_argument("mode", choices=["worker"])
    parser.add_argument("json")
    a = parser.parse_args()
    sys.exit(_worker([a.json]))
