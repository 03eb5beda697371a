"""`lvflow.sweep` and `lvflow sweep`: configurations expanded and chunked exactly once each, results
equal to independent computations (Eq. 158, Eq. 168, `predict`, `plateau_schedule`), sharded
results bitwise equal to serial ones (4 virtual CPU devices, in a subprocess), and a sweep killed
with SIGKILL resumes to the same results with nothing evaluated twice and no duplicate rows."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from _cli import main
from hypothesis import given, settings, strategies as st

import lvflow
from lvflow._sweep.grid import expand, make_chunks, values_of

ROOT = Path(__file__).resolve().parents[1]
K_ODE = 6


def _eq158(r, C, c, eps, rho=0.5):
    """Thm 6 solved for z_k = ρ r_k/C_kk (numpy, independent of lvflow)."""
    z0 = c * eps
    return np.log((r - C * z0) / (C * z0) * rho / (1 - rho)) / r


def _system_files(d: Path) -> list[str]:
    """Three C = Diag(d) + UUᵀ systems (files r, d, U) and one dense C (r, C), K_ODE modes each."""
    rng = np.random.default_rng(0)
    k = np.arange(1, K_ODE + 1.0)
    r = k**-0.8
    dg = r**2 / (8 * k**-2.0)
    files = []
    for i in range(3):
        U = 0.25 * r[:, None] * rng.standard_normal((K_ODE, 2)) / np.sqrt(2)
        files.append(d / f"lowrank{i}.npz")
        np.savez(files[-1], r=r, d=dg, U=U)
    U = 0.25 * r[:, None] * rng.standard_normal((K_ODE, 2))
    files.append(d / "dense.npz")
    np.savez(files[-1], r=r, C=np.diag(dg) + U @ U.T)
    return [str(f) for f in files]


def _mixed(files: list[str]) -> dict:
    """Power-law spectra (closed form) and coupled systems (ODE; low-rank and dense) in one sweep."""
    grid = {"alpha1": 2.0, "alpha2": [0.6, 0.9], "modes": 20, "eps": [1e-4, 1e-6, 1e-8]}
    configs = [{"system": f, "eps": e} for f in files for e in (1e-5, 1e-7)]
    return {"grid": grid, "configs": configs, "chunk_size": 5}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    d = tmp_path_factory.mktemp("systems")
    files = _system_files(d)
    spec = _mixed(files)
    return files, spec, lvflow.sweep(spec["grid"], configs=spec["configs"], chunk_size=5, progress=False)


# --------------------------------------------------------------------------------------------
# Configurations and chunks
# --------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_grid_is_the_product_in_itertools_order(sizes):
    names = ["eps", "alpha2", "rho", "t1"][: len(sizes)]
    lists = {n: [0.1 * (i + 1) + 0.01 * j for j in range(s)] for i, (n, s) in enumerate(zip(names, sizes))}
    plan = expand([lists])
    assert plan.n == int(np.prod(sizes))
    for i, combo in enumerate(itertools.product(*lists.values())):
        assert tuple(plan.columns[n][i] for n in names) == combo


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.integers(1, 7))
def test_chunks_cover_every_configuration_once(groups, size):
    g = np.array(groups)
    chunks = make_chunks(g, size)
    rows = np.concatenate([c.rows for c in chunks])
    assert np.array_equal(np.sort(rows), np.arange(g.size))  # each configuration exactly once
    assert [c.id for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert 1 <= c.rows.size <= size and np.all(g[c.rows] == c.group)
        assert np.all(np.diff(c.rows) > 0)


def test_values_lists_and_ranges():
    assert values_of("eps", "1e-4, 1e-6") == [1e-4, 1e-6]
    np.testing.assert_allclose(values_of("eps", "log:1e-8:1e-2:4"), [1e-8, 1e-6, 1e-4, 1e-2], rtol=1e-12)
    assert values_of("modes", "lin:10:40:4") == [10, 20, 30, 40]
    assert values_of("kernel", "3x3,5x5") == ["3x3", "5x5"]
    z0 = np.ones(3)
    assert values_of("z0", z0)[0] is z0  # an array is one value of an array parameter
    with pytest.raises(lvflow.LvflowError, match="^modes: must be an integer"):
        values_of("modes", 2.5)
    with pytest.raises(lvflow.LvflowError, match="^eps: a log range needs"):
        values_of("eps", "log:0:1:3")


# --------------------------------------------------------------------------------------------
# Results against independent computations
# --------------------------------------------------------------------------------------------


def test_power_law_rows_are_eq158_and_eq168(mixed):
    _, _, res = mixed
    rows = np.flatnonzero(res["modes"] == 20)
    assert rows.size == 6 and np.array_equal(rows, np.arange(6))  # the grid's configurations come first
    k = np.arange(1, 21.0)
    for i in rows:
        a2, eps = res["alpha2"][i], res["eps"][i]
        r, V = k**-a2, k**-2.0
        C = r**2 / (8 * V)
        np.testing.assert_allclose(res["t_star"][i], _eq158(r, C, 1.0, eps), rtol=1e-12)
        np.testing.assert_allclose(res["tau_star"][i], 1 / r, rtol=1e-15)  # Eq. 168, τ*_k = 1/r_k
        np.testing.assert_allclose(res["plateau_loss"][i], np.cumsum(V[::-1])[::-1], rtol=1e-12)
        assert res["exponent"][i] == pytest.approx(1 / a2)  # Thm 9: (α₁ − 1)/α₂
        assert res["t_first"][i] == pytest.approx(_eq158(r, C, 1.0, eps)[0], rel=1e-12)
        assert res["n_on"][i] == 20 and res["success"][i]
    # ε → 0: the initial plateau grows as τ*₁ ln(1/ε) (slope 1 here: r₁ = 1)
    law = np.polyfit(res["ln_inv_eps"][rows[:3]], res["t_first"][rows[:3]], 1)[0]
    assert law == pytest.approx(1.0, abs=1e-4)


def _scipy_switch_on(r, C, z0, z_inf, t1, rho=0.5):
    """Switch-on times of ż = z(r − Cz) by scipy's events (independent of lvflow's solver)."""
    from scipy.integrate import solve_ivp

    events = [lambda t, z, k=k: z[k] - rho * z_inf[k] for k in range(r.size)]
    sol = solve_ivp(lambda t, z: z * (r - C @ z), (0, t1), z0, method="DOP853", rtol=1e-12, atol=1e-300, events=events)
    return np.array([e[0] if e.size else np.inf for e in sol.t_events])


def test_coupled_rows_against_scipy_and_the_schedule(mixed):
    """Low-rank and dense coupled systems (the ODE path): switch-on times against scipy, z(∞) against
    the equilibrium's defining identity, τ* against plateau_schedule, t1 as predict chooses it."""
    files, _, res = mixed
    for j, f in enumerate(files):
        z = np.load(f)
        C = np.diag(z["d"]) + z["U"] @ z["U"].T if "U" in z else z["C"]
        r = z["r"]
        lv = lvflow.LotkaVolterra(r, C)
        sched = lvflow.plateau_schedule(lv, 1e-5)
        for i, eps in ((6 + 2 * j, 1e-5), (7 + 2 * j, 1e-7)):
            z_inf = res["z_inf"][i, :K_ODE]
            np.testing.assert_allclose(C @ z_inf, r, rtol=1e-10)  # all modes survive: C z∞ = r
            t = _scipy_switch_on(r, C, np.full(K_ODE, eps), z_inf, res["t1"][i])
            np.testing.assert_allclose(res["t_star"][i, :K_ODE], t, rtol=1e-7)
            np.testing.assert_allclose(res["tau_star"][i, :K_ODE], sched.tau_star, rtol=1e-12)
            # predict's horizon: 1.2 × the latest ignition estimate + 8 e-folds of the slowest mode
            t_iso = np.log(np.maximum(r / (np.diag(C) * eps), np.e)) / r
            t1 = 1.2 * max(t_iso.max(), float(np.max(sched.tau_star)) * np.log(1 / eps)) + 8 / r.min()
            assert res["t1"][i] == pytest.approx(t1, rel=1e-12)
    assert np.all(res["num_steps"][6:] > 0) and np.all(res["success"])
    assert np.all(np.isnan(res["t_star"][6:, K_ODE:]))  # narrower systems are NaN-padded


def test_coupled_calls_side_by_side_against_scipy(mixed, monkeypatch):
    """On a CPU with several cores the ODE group's device calls run in threads side by side: the
    switch-on times agree with scipy and equal those of one call at a time, bit for bit."""
    from lvflow._sweep import run as R

    files = mixed[0][:3]
    systems = [lvflow.LowRankLotkaVolterra(z["r"], z["d"], z["U"]) for z in map(np.load, files)]
    configs = [{"system": lv, "eps": eps} for lv in systems for eps in (1e-5, 1e-7)]
    threads = set()
    device_outputs = R.Runner.device_outputs

    def recording(self, g, x):
        threads.add(threading.get_ident())
        return device_outputs(self, g, x)

    monkeypatch.setattr(R.Runner, "device_outputs", recording)
    res = lvflow.sweep(configs=configs, schedule="none", batch_size=1, progress=False)  # 6 calls
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert len(threads) >= min(cores, 2)
    monkeypatch.setattr(R.Runner, "concurrent_calls", lambda self, g: 1)
    threads.clear()
    one = lvflow.sweep(configs=configs, schedule="none", batch_size=1, progress=False)
    assert len(threads) == 1
    for k, v in res.columns.items():
        assert np.array_equal(v, one[k], equal_nan=v.dtype.kind == "f"), k
    for i, cfg in enumerate(configs):
        lv = cfg["system"]
        r, C = np.asarray(lv.r), np.asarray(lv.C)
        t = _scipy_switch_on(r, C, np.full(K_ODE, cfg["eps"]), res["z_inf"][i], res["t1"][i])
        np.testing.assert_allclose(res["t_star"][i], t, rtol=1e-7)


def test_power_law_row_equals_predict(mixed):
    _, _, res = mixed
    pred = lvflow.predict(lvflow.power_law_lv(alpha1=2.0, alpha2=0.6, modes=20), eps=1e-4)
    o = np.asarray(pred.order)
    for k in ("t_star", "tau_star", "plateau_loss", "r", "V"):
        np.testing.assert_allclose(res[k][0][o], getattr(pred, k), rtol=1e-12, err_msg=k)
    assert res["t1"][0] == pytest.approx(pred.t1, rel=1e-14)


def test_coupled_schedule_is_plateau_schedule(mixed):
    files, _, res = mixed
    z = np.load(files[0])
    lv = lvflow.LowRankLotkaVolterra(z["r"], z["d"], z["U"])
    sched = lvflow.plateau_schedule(lv, 1e-5)
    np.testing.assert_allclose(res["tau_star"][6, :K_ODE], sched.tau_star, rtol=1e-12)


def test_initial_scales_as_predict():
    z0 = 1e-6 * np.linspace(1, 3, 12)
    cfgs = [
        {"alpha1": 2, "alpha2": 0.8, "modes": 12, "init_std": 1e-3, "width": 10},
        {"alpha1": 2, "alpha2": 0.8, "modes": 12, "eps": 1e-6, "beta": 1.2, "lr": 0.01},
        {"alpha1": 2, "alpha2": 0.8, "modes": 12, "z0": z0, "rho": 0.3},
    ]
    res = lvflow.sweep(configs=cfgs, progress=False)
    k = np.arange(1, 13.0)
    r, C = k**-0.8, (k**-0.8) ** 2 / (8 * k**-2.0)
    np.testing.assert_allclose(res["t_star"][0], _eq158(r, C, 1.0, 1e-5), rtol=1e-12)  # ε = width σ²
    np.testing.assert_allclose(res["t_star"][1], _eq158(r, C, k**-1.2, 1e-6), rtol=1e-12)
    np.testing.assert_allclose(res["t_star"][2], _eq158(r, C, z0 / z0.max(), z0.max(), rho=0.3), rtol=1e-12)
    assert res["eps"][2] == z0.max() and res["steps_first"][1] == pytest.approx(res["t_first"][1] / 0.01)
    # predict's horizon from z0: 1.2 × max(Eq. 158 estimate, τ* ln(1/ε)) + 8 e-folds of the slowest mode
    eps, c = z0.max(), z0 / z0.max()
    t1 = (
        1.2 * max(np.max(np.log(np.maximum(r / (C * c * eps), np.e)) / r), np.max(1 / r) * np.log(1 / eps))
        + 8 / r.min()
    )
    assert res["t1"][2] == pytest.approx(t1, rel=1e-12)


def test_curve_as_predict():
    lv = lvflow.power_law_lv(alpha1=2.0, alpha2=0.8, modes=12)
    res = lvflow.sweep({"alpha1": 2, "alpha2": 0.8, "modes": 12, "eps": 1e-5, "points": 30}, curve=True, progress=False)
    pred = lvflow.predict(lv, eps=1e-5, num_points=30)
    assert res["ts"].shape == (1, 59)
    np.testing.assert_allclose(res["ts"][0], pred.ts, rtol=1e-13, atol=1e-13 * float(pred.t1))
    np.testing.assert_allclose(res["excess_loss"][0], pred.excess_loss, rtol=1e-9, atol=1e-15)
    assert len(res.row(0)["excess_loss"]) == 59 and len(res.row(0)["t_star"]) == 12


def test_architecture_on_data_as_predict(tmp_path):
    rng = np.random.default_rng(2)
    Q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    x = 4 * np.sqrt(3 / 8) * Q  # orthogonal design: C = I for the diagonal network
    r = np.array([1.0, 0.4, 0.2])
    y = np.linalg.solve(8 / 3 * (x / 4).T, r)
    np.savez(tmp_path / "xy.npz", x=x, y=y)
    res = lvflow.sweep({"architecture": "diagonal", "data": str(tmp_path / "xy.npz"), "eps": [1e-5, 1e-7]})
    for i, eps in enumerate((1e-5, 1e-7)):
        np.testing.assert_allclose(np.sort(res["t_star"][i]), np.sort(np.log((r - eps) / eps) / r), rtol=1e-7)
    assert list(res["data"]) == [str(tmp_path / "xy.npz")] * 2


@pytest.mark.slow
def test_attention_value_size_as_predict(tmp_path):
    """`value_size` reaches the architecture (one-token, one-feature sequences: the structure
    matrices commute), and the switch-on times are `predict`'s for the same NQF."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 1, 1)), rng.normal(size=6)
    np.savez(tmp_path / "seq.npz", x=x, y=y)
    res = lvflow.sweep(
        {"architecture": "attention", "data": str(tmp_path / "seq.npz"), "value_size": [1, 2], "eps": 1e-6},
        progress=False,
        horizon=False,  # predict's validity horizon: tests/test_sweep_horizon.py
    )
    for i, dv in enumerate((1, 2)):
        pred = lvflow.predict(lvflow.nqf_from_data("attention", {"x": x, "y": y}, value_size=dv), eps=1e-6)
        assert res["modes"][i] == 2 * dv  # K grows with the value size
        want = np.sort(np.asarray(pred.t_star)[np.isfinite(np.asarray(pred.t_star))])
        got = np.sort(res["t_star"][i][np.isfinite(res["t_star"][i])])
        np.testing.assert_allclose(got, want, rtol=1e-7)
    with pytest.raises(lvflow.LvflowError, match="^value_size: only used with architecture"):
        lvflow.sweep({"alpha1": 2, "alpha2": 0.8, "modes": 5, "eps": 1e-4, "value_size": 2}, progress=False)


# --------------------------------------------------------------------------------------------
# Devices: sharded = serial, bit for bit; the batch axis is sharded
# --------------------------------------------------------------------------------------------

_SHARDED = """
import json, sys
import numpy as np
import jax
import lvflow
from lvflow._sweep import run as R
from lvflow._sweep.families import resolve
from lvflow._sweep.grid import expand

spec = json.loads(sys.argv[1])
res = lvflow.sweep(spec["grid"], configs=spec["configs"], chunk_size=5, progress=False)
np.savez(sys.argv[2], **res.columns)
# one device call of the coupled low-rank group: where its rows live
resolved = resolve(expand([spec["grid"]], spec["configs"]), curve=False)
runner = R.Runner(
    resolved, mesh=R.make_mesh(), schedule=R.Schedule.LIMIT, max_steps=16384, batch_size=None, chunk_size=5
)
g = int(resolved.group_of[6])
b = runner.slice_rows(g)
rows = np.flatnonzero(resolved.group_of == g)
x = runner.inputs(g, rows)
idx = np.minimum(np.arange(4 * b), rows.size - 1)
y = runner.device_outputs(g, {k: v[idx] for k, v in x.items()})["t_star"]
print(json.dumps({
    "devices": jax.device_count(),
    "result_devices": res.stats["devices"],
    "sharding_devices": len(y.sharding.device_set),
    "spec_is_batch": y.sharding.spec == jax.sharding.PartitionSpec("batch"),
    "shards": sorted([list(s.data.shape) for s in y.addressable_shards]),
    "b": b,
}))
"""


def _python(code: str, *args, env=None, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LVFLOW_CACHE_DIR": "off", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.mark.slow
def test_four_devices_equal_serial_bit_for_bit(mixed, tmp_path):
    files, spec, serial = mixed
    p = _python(
        _SHARDED,
        json.dumps({"grid": spec["grid"], "configs": spec["configs"]}),
        str(tmp_path / "sharded.npz"),
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    info = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["devices"] == info["result_devices"] == info["sharding_devices"] == 4
    assert info["spec_is_batch"]
    assert info["shards"] == [[info["b"], K_ODE]] * 4  # each device holds one slice of the batch
    with np.load(tmp_path / "sharded.npz") as z:
        sharded = {k: z[k] for k in z.files}
    assert set(sharded) == set(serial.columns)
    for k, v in serial.columns.items():
        assert v.dtype == sharded[k].dtype, k
        assert np.array_equal(v, sharded[k], equal_nan=v.dtype.kind == "f"), k


# --------------------------------------------------------------------------------------------
# Files: chunks, resumption after kill -9, manifest, processes
# --------------------------------------------------------------------------------------------

_KILLED = """
import os, signal, sys
import lvflow
grid = {"alpha1": 2.0, "alpha2": [0.6, 0.7, 0.8, 0.9], "modes": 30, "eps": "log:1e-9:1e-4:6"}
done = []
def on_chunk(cid, path):
    done.append(cid)
    if len(done) == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9, right after a chunk was renamed into place
lvflow.sweep(grid, out=sys.argv[1], chunk_size=4, progress=False, on_chunk=on_chunk)
"""
_KILLED_GRID = {"alpha1": 2.0, "alpha2": [0.6, 0.7, 0.8, 0.9], "modes": 30, "eps": "log:1e-9:1e-4:6"}


def test_killed_sweep_resumes_without_recomputing(tmp_path):
    out = tmp_path / "run"
    p = _python(_KILLED, str(out), "3")
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    chunks = sorted(out.glob("chunk-*.npz"))
    assert [c.name for c in chunks] == [f"chunk-00000{i}.npz" for i in range(3)]  # 3 of 6 chunks done
    before = {c.name: (c.stat().st_ino, c.stat().st_mtime_ns) for c in chunks}
    (out / ".chunk-000003.npz.x1y2z3.tmp").write_bytes(b"half a chunk")  # what a kill mid-write leaves
    with pytest.raises(lvflow.LvflowError, match="3 of 6 chunks are missing"):
        lvflow.load_sweep(out)
    seen = []
    res = lvflow.sweep(_KILLED_GRID, out=out, progress=False, on_chunk=lambda cid, path: seen.append(cid))
    assert seen == [3, 4, 5]  # the finished chunks are not evaluated again
    assert res.stats["chunks_skipped"] == 3 and res.stats["configs_evaluated"] == 12
    assert {c.name: (c.stat().st_ino, c.stat().st_mtime_ns) for c in chunks} == before
    assert not list(out.glob(".chunk-*.tmp"))
    assert res.complete and np.array_equal(res["index"], np.arange(24))  # no duplicate, none missing
    fresh = lvflow.sweep(_KILLED_GRID, progress=False, chunk_size=4)
    for k, v in fresh.columns.items():
        assert np.array_equal(v, res[k], equal_nan=v.dtype.kind == "f"), k
    again = lvflow.sweep(_KILLED_GRID, out=out, progress=False)  # a third run evaluates nothing
    assert again.stats["chunks_evaluated"] == 0 and again.stats["configs_evaluated"] == 0
    loaded = lvflow.load_sweep(out)
    assert np.array_equal(loaded["t_star"], res["t_star"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_configs"] == 24 and set(summary["swept"]) == {"alpha2", "eps"}
    assert (out / "summary.png").stat().st_size > 0


def test_resume_keeps_the_recorded_batches(tmp_path):
    out = tmp_path / "run"

    class Stop(Exception):
        pass

    def stop(cid, path):
        raise Stop

    with pytest.raises(Stop):  # stopped after its first chunk, evaluated in batches of 2
        lvflow.sweep(_KILLED_GRID, out=out, chunk_size=4, batch_size=2, progress=False, on_chunk=stop)
    manifest = json.loads((out / "manifest.json").read_text())
    assert [g["batch"] for g in manifest["groups"]] == [2]  # the default here would be 4
    with pytest.raises(lvflow.LvflowError, match=r"batch_size: .* batches of 2 configurations \(group 0\), not 4"):
        lvflow.sweep(_KILLED_GRID, out=out, batch_size=4, progress=False)
    seen = []
    res = lvflow.sweep(_KILLED_GRID, out=out, progress=False, on_chunk=lambda cid, path: seen.append(cid))
    assert seen == [1, 2, 3, 4, 5] and res.complete
    fresh = lvflow.sweep(_KILLED_GRID, progress=False, chunk_size=4, batch_size=2)
    for k, v in fresh.columns.items():
        assert np.array_equal(v, res[k], equal_nan=v.dtype.kind == "f"), k


def test_processes_write_their_shares(tmp_path):
    grid = {"alpha1": 2.0, "alpha2": [0.6, 0.8], "modes": 30, "eps": "log:1e-9:1e-4:6"}
    out = tmp_path / "shared"
    first = lvflow.sweep(grid, out=out, chunk_size=4, num_processes=2, process_id=1, progress=False)
    assert not first.complete and sorted(p.name for p in out.glob("chunk-*")) == ["chunk-000001.npz"]
    assert not (out / "summary.json").exists()
    last = lvflow.sweep(grid, out=out, chunk_size=4, num_processes=2, process_id=0, progress=False)
    assert last.complete and last.stats["chunks_evaluated"] == 2 and (out / "summary.json").exists()
    serial = lvflow.sweep(grid, chunk_size=4, progress=False)
    for k, v in serial.columns.items():
        assert np.array_equal(v, last[k], equal_nan=v.dtype.kind == "f"), k


_HOST = """
import json, sys
import lvflow
grid = {"alpha1": 2.0, "alpha2": [0.6, 0.8], "modes": 10, "eps": "log:1e-9:1e-4:6"}
res = lvflow.sweep(grid, out=sys.argv[1], chunk_size=2, progress=False, coordinator=sys.argv[2],
                   num_processes=2, process_id=int(sys.argv[3]))
print(json.dumps({k: res.stats[k] for k in ("process_index", "process_count", "chunks_evaluated")}))
"""


@pytest.mark.slow
def test_two_hosts_with_jax_distributed(tmp_path):
    """Two processes (two "hosts") joined by jax.distributed write disjoint shares of one sweep."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LVFLOW_CACHE_DIR": "off"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _HOST, str(out), f"127.0.0.1:{port}", str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (so, se) in zip(procs, outs):
        assert p.returncode == 0, se[-2000:]
    stats = [json.loads(so.strip().splitlines()[-1]) for so, _ in outs]
    assert [(s["process_index"], s["process_count"], s["chunks_evaluated"]) for s in stats] == [(0, 2, 3), (1, 2, 3)]
    res = lvflow.load_sweep(out)
    serial = lvflow.sweep({"alpha1": 2.0, "alpha2": [0.6, 0.8], "modes": 10, "eps": "log:1e-9:1e-4:6"}, chunk_size=2)
    for k, v in serial.columns.items():
        assert np.array_equal(v, res[k], equal_nan=v.dtype.kind == "f"), k
    assert (out / "summary.json").exists()


def test_chunk_holds_the_configuration_beside_results(tmp_path):
    lvflow.sweep({"alpha1": 2.0, "alpha2": 0.8, "modes": 10, "eps": [1e-4, 1e-6]}, out=tmp_path, progress=False)
    with np.load(tmp_path / "chunk-000000.npz", allow_pickle=False) as z:
        assert z["index"].tolist() == [0, 1] and z["eps"].tolist() == [1e-4, 1e-6]
        assert z["alpha2"].tolist() == [0.8, 0.8] and z["t_star"].shape == (2, 10)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["n_configs"] == 2 and m["chunks"][0]["file"] == "chunk-000000.npz"
    with pytest.raises(lvflow.LvflowError, match="^out: .* holds a different sweep"):
        lvflow.sweep({"alpha1": 2.0, "alpha2": 0.9, "modes": 10, "eps": 1e-4}, out=tmp_path, progress=False)


def test_spec_files(tmp_path):
    np.savez(tmp_path / "sys.npz", r=[1.0, 0.5], C=np.eye(2))
    (tmp_path / "s.toml").write_text(
        '[grid]\nalpha1 = 2\nalpha2 = [0.6, 0.8]\nmodes = 8\neps = "1e-4,1e-6"\n\n'
        '[[configs]]\nsystem = "sys.npz"\neps = 1e-5\n\n[options]\nchunk_size = 2\n'
    )
    (tmp_path / "s.json").write_text(json.dumps({"configs": [{"system": "sys.npz", "eps": e} for e in (1e-5, 1e-9)]}))
    res = lvflow.sweep(spec=tmp_path / "s.toml", progress=False)
    assert len(res) == 5 and res["alpha2"].tolist()[:4] == [0.6, 0.6, 0.8, 0.8] and res["system"][4].endswith("sys.npz")
    np.testing.assert_allclose(res["t_star"][4, :2], _eq158(np.array([1.0, 0.5]), 1.0, 1.0, 1e-5), rtol=1e-12)
    res = lvflow.sweep(spec=tmp_path / "s.json", progress=False)
    assert res["eps"].tolist() == [1e-5, 1e-9]


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"grid": {"alpha1": 2, "alpha2": 0.8, "modes": 5, "eps": [1e-4, 2.0]}}, r"^eps: must lie in \(0, 1\), got 2"),
        ({"grid": {"alpha1": 2, "alpha2": 0.8, "eps": 1e-4}}, "^modes: required for a power-law spectrum"),
        ({"grid": {"alpha1": 2, "alpha2": 0.8, "modes": 5, "epsilon": 1e-4}}, "^epsilon: not a sweep parameter"),
        ({"grid": {"alpha1": 2, "alpha2": 0.8, "modes": 5, "eps": 1e-4, "init_std": 0.1}}, "^initial scale: give"),
        ({"grid": {"alpha1": 2, "alpha2": 0.8, "modes": 10, "eps": 0.9}}, "^eps: too large, mode 7 starts"),
        ({"grid": {"alpha1": 2, "alpha2": 0.8, "modes": 5, "eps": 1e-4}, "schedule": "x"}, "^schedule: must be"),
        ({"configs": [{"alpha1": 2, "alpha2": [0.8, 0.9], "modes": 5, "eps": 1e-4}]}, r"^configs\[0\]: alpha2: one"),
    ],
)
def test_bad_input_names_it(kw, message):
    with pytest.raises(lvflow.LvflowError, match=message):
        lvflow.sweep(kw.pop("grid", None), progress=False, **kw)


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def test_cli_sweeps_the_grid_of_its_flags(tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["sweep", "--alpha1", "2", "--alpha2", "0.6,0.8,1.0", "--modes", "10", "--eps", "1e-4,1e-6", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "6 configurations" in printed and 'lvflow.load_sweep("' in printed
    res = lvflow.load_sweep(out)
    assert res["alpha2"].tolist() == [0.6, 0.6, 0.8, 0.8, 1.0, 1.0] and res["eps"].tolist() == [1e-4, 1e-6] * 3
    assert main([*argv, "--out", str(out), "--json"]) == 0  # resumed: nothing to do, prints the summary
    assert json.loads(capsys.readouterr().out)["n_configs"] == 6


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    rc = main(["sweep", "--alpha1", "2", "--alpha2", "0.8", "--modes", "10", "--eps", "1e-4,3", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines() == ["lvflow sweep: error: --eps: must lie in (0, 1), got 3 (configuration 1)"]
    with pytest.raises(SystemExit) as e:
        main(["sweep", "--alpha1", "2"])  # --out missing: argparse, one line too
    assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_cli_unwritable_out_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "sub"  # a file where a directory must be
    rc = main(["sweep", "--alpha1", "2", "--alpha2", "0.8", "--modes", "10", "--eps", "1e-4", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--out" in err[0] and str(out) in err[0]
