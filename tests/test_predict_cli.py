"""`lvflow predict` through the console entry point: bad input gives exit code 2 and ONE line on
stderr naming the input; good input gives the table, JSON, plot and saved files."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from _cli import main
from scipy.optimize import brentq, minimize_scalar

# internal on purpose: the `lvflow` command's entry point ([project.scripts]), run in-process

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
    one_line_error(capsys, ["--system", good, "--z0", tmp_path / "nope.npy"], "--z0", "file not found")
    one_line_error(
        capsys, ["--architecture", "mlp", "--data", tmp_path / "nope.csv", "--eps", "0.1"], "--data", "not found"
    )


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
    one_line_error(capsys, ["--system", good], "--eps", "required", "--z0", "--init-std with --width")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--rho", "1"], "--rho", "(0, 1)")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--lr", "0"], "--lr", "positive")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--t1", "-3"], "--t1", "positive")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--init-std", "0.1"], "only one of")
    one_line_error(capsys, ["--system", good, "--init-std", "0.1"], "--width", "required with --init-std")
    one_line_error(capsys, ["--system", good, "--init-std", "0.1", "--width", "100"], "--init-std", "(0, 1)")
    one_line_error(capsys, ["--system", good, "--eps", "0.9"], "--eps", "too large")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--save", tmp_path / "o.txt"], "--save", ".json or .npz")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--plot", tmp_path / "o.jpg"], "--plot", ".png")
    one_line_error(capsys, ["--eps", "1e-5"], "give exactly one of")
    one_line_error(capsys, ["--system", good, "--alpha1", "2", "--eps", "1e-5"], "give exactly one of")
    one_line_error(capsys, ["--alpha1", "2", "--alpha2", "0.8", "--eps", "1e-5"], "--modes", "required")
    one_line_error(capsys, ["--alpha1", "2", "--alpha2", "0.8", "--modes", "0", "--eps", "1e-5"], "--modes", "positive")
    one_line_error(
        capsys, ["--architecture", "resnet", "--data", good, "--eps", "0.1"], "architecture", "unknown 'resnet'"
    )
    one_line_error(capsys, ["--system", good, "--eps", "abc"], "--eps", "invalid float")
    one_line_error(capsys, ["--system", good, "--eps", "1e-5", "--bogus"], "unrecognized arguments")


def test_non_commuting_data_with_force_lv(capsys, tmp_path):
    # A two-layer MLP's A(x) = ½[[0, x],[xᵀ, 0]] for different x do not commute.
    rng = np.random.default_rng(0)
    f = tmp_path / "xy.npz"
    np.savez(f, x=rng.normal(size=(6, 3)), y=rng.normal(size=6))
    one_line_error(
        capsys,
        ["--architecture", "mlp", "--data", f, "--eps", "1e-3", "--force-lv", "--quiet"],
        "--data",
        "--force-lv",
        "share no eigenbasis",
    )
    np.savez(f, x=rng.normal(size=(6, 3)), y=rng.normal(size=5))
    one_line_error(capsys, ["--architecture", "mlp", "--data", f, "--eps", "1e-3"], "--data", "6 samples", "5")
    np.savez(f, x=np.full((6, 3), np.nan), y=rng.normal(size=6))
    one_line_error(capsys, ["--architecture", "mlp", "--data", f, "--eps", "1e-3"], "--data", "x", "non-finite")


def test_debug_shows_traceback(capsys, tmp_path):
    with pytest.raises(Exception, match="file not found"):
        main(["predict", "--system", str(tmp_path / "missing.npz"), "--eps", "1e-5", "--debug"])


# The README's worked example ("Predict the plateaus of your own model"), verbatim.
README_CSV = """\
r,C0,C1,C2
1.0,1,0,0
0.5,0,1,0
0.25,0,0,1
"""
README_CMD = "--system sys.csv --eps 1e-6 --lr 0.01 --plot loss.png --save out.json"
README_OUTPUT = """\
lvflow predict: 3-mode gLV from sys.csv
method lv, eps = 1e-06 (ln 1/eps = 13.8155), rho = 0.5, learning rate 0.01, horizon t1 = 98.3145
drops of the predicted excess loss (t: where it crosses the midpoint between the plateaus):
#      t  step  excess loss before  excess loss after  modes
1  12.94  1294              0.1641             0.0383      1
2  24.59  2459              0.0383           0.007558      2
3  46.41  4641            0.007558                  0      3
directions (modes) in switch-on order (t*_k: z_k at rho = 0.5 of its final value):
#  mode   r_k  V_k alone     t*_k  steps*_k  tau*_k  plateau loss       drop    eps merge
1     1     1      0.125  13.8155   1381.55       1      0.164062      0.125  0.000342583
2     2   0.5    0.03125  26.2447   2624.47       2     0.0390625    0.03125  0.000171292
3     3  0.25  0.0078125  49.7168   4971.68       4     0.0078125  0.0078125            -
saved: out.json
plot: loss.png
"""
README_DROPS = README_OUTPUT.splitlines()[4:7]  # the drops table's 3 rows
README_TABLE = "\n".join(README_OUTPUT.splitlines()[8:12])  # the directions table: header + 3 rows


@pytest.mark.smoke
def test_readme_example(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sys.csv").write_text(README_CSV)
    rc, out, err = cli(capsys, *README_CMD.split())
    assert rc == 0, err
    assert out == README_OUTPUT  # exactly what the README shows
    assert "%|" not in err  # diagonal C: the exact solution (Thm 6) takes no steps, so no bar
    # Every number of the tables against its closed form, to the printed digits.
    r, eps, eta = np.array([1.0, 0.5, 0.25]), 1e-6, 0.01
    t_star = np.log((r - eps) / eps) / r  # Eq. 158, a = 1, C_kk = c_k = 1, ρ = ½
    V = r**2 / 8  # V_k = r_k² / (8 C_kk)

    def z(t):  # Thm 6: z_k = r_k / (1 + ((r_k − ε)/ε) e^{−r_k t})
        return r / (1 + (r - eps) / eps * np.exp(-r * t))

    def excess(t):  # Σ_k (r_k − z_k)²/8
        return float(np.sum((r - z(t)) ** 2) / 8)

    def rate(x):  # the fall per e-fold of time, −t dL/dt, at t = e^x
        t = math.exp(x)
        return float(t * np.sum((r - z(t)) / 4 * r * z(t) * (1 - z(t) / r)))

    # the closed form's plateaus: where it falls slowest between switch-ons; then the crossings
    flat = [minimize_scalar(rate, bounds=tuple(np.log(t_star[k : k + 2])), method="bounded").x for k in range(2)]
    levels = [excess(0.0)] + [excess(math.exp(x)) for x in flat] + [0.0]
    for k, row in enumerate(ln.split() for ln in README_DROPS):
        mid = 0.5 * (levels[k] + levels[k + 1])
        t_mid = brentq(lambda t: excess(t) - mid, 1e-3, t_star[k] + 5 / r[k], xtol=1e-12)
        assert float(row[1]) == pytest.approx(t_mid, rel=2e-3) and row[5] == str(k + 1)
        assert float(row[2]) == pytest.approx(t_mid / eta, rel=2e-3)
        assert float(row[3]) == pytest.approx(levels[k], rel=0.01)
        assert float(row[4]) == pytest.approx(levels[k + 1], rel=0.01, abs=1e-12)
    rows = [ln.split() for ln in README_TABLE.splitlines()[1:]]
    for k, row in enumerate(rows):
        assert float(row[3]) == float(f"{V[k]:.6g}")
        assert float(row[4]) == float(f"{t_star[k]:.6g}")
        assert float(row[5]) == float(f"{t_star[k] / eta:.6g}")
        assert float(row[6]) == float(f"{1 / r[k]:.6g}")  # τ*_k = 1/r_k (Eq. 168)
        assert float(row[7]) == float(f"{V[k:].sum():.6g}")  # the drops still to come
        assert float(row[8]) == float(f"{V[k]:.6g}")  # this switch-on's drop: V_k for diagonal C
    from lvflow import resolved_steps

    for k in range(2):  # at eps_merge the pair's steps stop being resolved
        e = float(rows[k][9])
        assert resolved_steps(r, e * 0.999, C=np.ones(3)).resolved[k]
        assert not resolved_steps(r, e * 1.001, C=np.ones(3)).resolved[k]
    saved = json.loads((tmp_path / "out.json").read_text())
    np.testing.assert_allclose([m["t_star"] for m in saved["directions"]], t_star, rtol=1e-7)
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(os.listdir(tmp_path)) == ["loss.png", "out.json", "sys.csv"]  # no temporaries left


def test_progress_bar_on_coupled_solves_and_quiet(capsys, tmp_path):
    f = tmp_path / "coupled.npz"
    C = np.array([[1.0, 0.4, 0.0], [0.4, 1.0, 0.3], [0.0, 0.3, 1.0]])
    np.savez(f, r=np.array([1.0, 0.5, 0.25]), C=C)
    rc, out, err = cli(capsys, "--system", f, "--eps", "1e-4", "--json", "--progress")
    assert rc == 0 and "100.00%" in err  # the ODE solve's progress meter, on stderr
    rc, out, err = cli(capsys, "--system", f, "--eps", "1e-4", "--json", "--quiet")
    assert rc == 0 and err == ""
    # stderr is not a terminal here (a redirected log): no bar unless asked
    rc, out, err = cli(capsys, "--system", f, "--eps", "1e-4", "--json")
    assert rc == 0 and err == ""


def test_json_quiet_and_npz(capsys, tmp_path):
    f = tmp_path / "zv.npz"
    np.savez(f, zeta=np.array([1.0, 0.5, 0.25]), V=np.array([0.5, 0.1, 0.05]))
    rc, out, err = cli(capsys, "--system", f, "--eps", "1e-4", "--json", "--quiet", "--save", tmp_path / "o.npz")
    assert rc == 0 and err == ""  # --quiet: no progress bar
    d = json.loads(out)
    zeta, V = np.array([1.0, 0.5, 0.25]), np.array([0.5, 0.1, 0.05])
    Ckk = zeta**2 / (8 * V)
    t_ref = (np.log(1e4) - np.log(Ckk / (zeta - Ckk * 1e-4))) / zeta  # Eq. 158
    np.testing.assert_allclose([m["t_star"] for m in d["directions"]], t_ref, rtol=1e-7)
    np.testing.assert_allclose([m["V"] for m in d["directions"]], V, rtol=1e-12)
    assert d["learning_rate"] is None and d["curve"]["steps"] is None
    with np.load(tmp_path / "o.npz", allow_pickle=False) as z:
        np.testing.assert_allclose(z["t_star"], t_ref, rtol=1e-7)
    # With y2 = (1/m) Σ y² the absolute loss is defined: L − E = L(z*) = y2 − Σ_k V_k (Eq. 168).
    np.savez(f, zeta=zeta, V=V, y2=np.array(1.0))
    # An explicit z0: ε = max z0, c = z0/ε in Eq. 158.
    z0 = np.array([1e-4, 3e-5, 2e-4])
    np.savetxt(tmp_path / "z0.csv", z0, delimiter=",")
    rc, out, err = cli(capsys, "--system", f, "--z0", tmp_path / "z0.csv", "--json", "--quiet")
    assert rc == 0, err
    d = json.loads(out)
    assert d["eps"] == 2e-4
    np.testing.assert_allclose(np.array(d["curve"]["loss"]) - d["curve"]["excess_loss"], 1.0 - V.sum(), rtol=1e-12)
    t_ref = np.log((zeta - Ckk * z0) / (Ckk * z0)) / zeta
    np.testing.assert_allclose([m["t_star"] for m in d["directions"]], t_ref[np.argsort(-zeta)], rtol=1e-7)


def test_power_law_and_init_std(capsys):
    rc, out, err = cli(
        capsys,
        "--alpha1",
        "2",
        "--alpha2",
        "0.8",
        "--modes",
        "3",
        "--init-std",
        "1e-3",
        "--width",
        "100",
        "--beta",
        "1.2",
        "--json",
    )
    assert rc == 0, err
    d = json.loads(out)
    assert d["exponent"] == pytest.approx(1.25)  # (α₁ − 1)/α₂, Thm 9
    assert d["eps"] == pytest.approx(100 * 1e-6)  # ε = d σ²
    r, V = np.arange(1, 4.0) ** -0.8, np.arange(1, 4.0) ** -2.0
    C = r**2 / (8 * V)
    z0 = 1e-4 * np.arange(1, 4.0) ** -1.2  # z_k0 = ε c_k, c_k = k^-β
    np.testing.assert_allclose(d["c"], np.arange(1, 4.0) ** -1.2, rtol=1e-12)
    np.testing.assert_allclose([m["t_star"] for m in d["directions"]], np.log((r - C * z0) / (C * z0)) / r, rtol=1e-7)


def test_architecture_route(capsys, tmp_path):
    """A diagonal linear net, A(x) = ¼ Diag(x) (commuting), on an orthogonal design:
    C = (8/m) Σ_μ λ_μ λ_μᵀ = I, so Eq. 158 holds exactly for the reduced gLV."""
    rng = np.random.default_rng(2)
    Q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    x = 4 * np.sqrt(3 / 8) * Q  # λ_μ = x_μ / 4, Σ_μ λ_μk λ_μj = (3/8) δ_kj
    r = np.array([1.0, 0.4, 0.2])
    y = np.linalg.solve(8 / 3 * (x / 4).T, r)  # r_k = (8/m) Σ_μ y_μ λ_μk
    csv = tmp_path / "xy.csv"
    csv.write_text("x0,x1,x2,y\n" + "\n".join(",".join(f"{v:.17g}" for v in (*x[i], y[i])) for i in range(3)) + "\n")
    rc, out, err = cli(
        capsys, "--architecture", "diagonal", "--data", csv, "--eps", "1e-5", "--force-lv", "--json", "--quiet"
    )
    assert rc == 0, err
    d = json.loads(out)
    assert d["method"] == "lv"
    np.testing.assert_allclose([m["r"] for m in d["directions"]], r, rtol=1e-9)
    np.testing.assert_allclose([m["t_star"] for m in d["directions"]], np.log((r - 1e-5) / 1e-5) / r, rtol=1e-7)


def test_console_script(tmp_path):
    """The installed `lvflow` entry point (one real subprocess)."""
    exe = os.path.join(os.path.dirname(sys.executable), "lvflow")
    # internal on purpose: without the installed script, the command's module ([project.scripts]) is run
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "lvflow._workflow.cli"]
    p = subprocess.run(
        [*cmd, "predict", "--system", str(tmp_path / "none.npz"), "--eps", "1e-4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"lvflow predict: error: --system: file not found: {tmp_path / 'none.npz'}"
    ]


def test_help_does_not_import_jax():
    # `lvflow --help` and `import lvflow` load no JAX (public names load on first use), while
    # JAX imported afterwards still runs in float64.
    # the command's own module, imported as the console script does
    code = (
        "import sys; import lvflow; "
        "from importlib.metadata import entry_points; main = entry_points(group='console_scripts')['lvflow'].load(); "
        "assert 'jax' not in sys.modules; "
        "import os; assert 'JAX_ENABLE_X64' not in os.environ; "
        "import jax.numpy as jnp; assert jnp.asarray(1.0).dtype == jnp.float64; print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"},
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_closed_form_predict_does_not_import_diffrax(tmp_path):
    # Issue 15 (cold start): the README's example (diagonal C, solved in closed form, Thm 6) and
    # `lvflow.predict` of a diagonal gLV import neither diffrax nor optimistix nor lineax (≈ 0.3 s);
    # a coupled C still integrates the ODE (and imports them then). A fresh process: the test
    # session has imported diffrax long before.
    (tmp_path / "sys.csv").write_text(README_CSV)
    code = f"""
import sys
import numpy as np
import lvflow
from importlib.metadata import entry_points; main = entry_points(group="console_scripts")["lvflow"].load()

ODE = ("diffrax", "optimistix", "lineax")
assert main({["predict", *README_CMD.split()]!r}) == 0
assert not [m for m in ODE if m in sys.modules], [m for m in ODE if m in sys.modules]
pred = lvflow.predict(lvflow.LotkaVolterra(np.array([1.0, 0.5]), np.diag([1.0, 2.0])), eps=1e-4)
assert "t*_k" in pred.summary()
sol = lvflow.solve_lv(lvflow.LotkaVolterra(np.array([1.0, 0.5]), np.eye(2)), np.full(2, 1e-4), 50.0)
assert bool(sol.success)
assert not [m for m in ODE if m in sys.modules], [m for m in ODE if m in sys.modules]
import diffrax
assert sol.result == diffrax.RESULTS.successful
coupled = lvflow.predict(lvflow.LotkaVolterra(np.array([1.0, 0.5]), np.array([[1.0, 0.3], [0.3, 1.0]])), eps=1e-4)
assert np.all(np.isfinite(coupled.t_star)) and "t*_k" in coupled.summary()
assert all(m in sys.modules for m in ODE)
print("ok")
"""
    import lvflow

    root = os.path.dirname(os.path.dirname(os.path.abspath(lvflow.__file__)))  # the checkout under test
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr


@pytest.mark.slow
def test_persistent_compilation_cache(tmp_path):
    # A command fills the cache directory it is given; LVFLOW_CACHE_DIR=off leaves it alone.
    system = tmp_path / "sys.csv"
    system.write_text("r,C0,C1\n1.0,1,0.2\n0.5,0.2,1\n")
    cache = tmp_path / "cache"
    # internal on purpose: the command's module ([project.scripts]), run as a real process
    cmd = [sys.executable, "-m", "lvflow._workflow.cli", "predict", "--system", str(system), "--eps", "1e-4", "--quiet"]

    def run(setting):
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LVFLOW_CACHE_DIR": setting})
        assert out.returncode == 0, out.stderr
        return len(list(cache.glob("*"))) if cache.exists() else 0

    filled = run(str(cache))
    assert filled > 0
    assert run("off") == filled
    # the coupled system's ODE solve is among them: the command runs equinox's checks as NaN, not as
    # host callbacks, which JAX never writes to the cache (with EQX_ON_ERROR=raise it is missing)
    # (predict's one compiled per-configuration program, `_configuration_jit`, holds the solve)
    assert any(p.name.startswith("jit__configuration_jit-") for p in cache.iterdir())


# ---- issue 16: bad input named right, outputs checked before solving, scale --------------------


def test_wrong_input_is_named(capsys, tmp_path, good):
    one_line_error(capsys, ["--system", good, "--eps", "1e-3", "--beta", "-50"], "--beta", "plateau")
    one_line_error(capsys, ["--system", good, "--eps", "1e-3", "--beta", "nan"], "--beta", "non-finite")
    one_line_error(capsys, ["--alpha1", "400", "--alpha2", "0.8", "--modes", "50", "--eps", "1e-6"], "--alpha1")
    big = tmp_path / "big.npz"
    np.savez(big, r=np.array([1e200, 1.0]), C=np.diag([1e-200, 1.0]))
    one_line_error(capsys, ["--system", big, "--eps", "1e-6"], "--system", "overflows")
    empty = tmp_path / "empty.npz"
    np.savez(empty, r=np.zeros(0), C=np.zeros((0, 0)))
    one_line_error(capsys, ["--system", empty, "--eps", "1e-6"], "--system", "no modes")
    bad_y2 = tmp_path / "y2.npz"
    np.savez(bad_y2, r=R3, C=C3, y2=np.ones(3))
    one_line_error(capsys, ["--system", bad_y2, "--eps", "1e-6"], "--system", "y2")
    data = tmp_path / "xy.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((20, 3)), y=np.ones(20))
    one_line_error(
        capsys, ["--architecture", "diagonal", "--data", data, "--eps", "1e-3", "--kernel", 2, 2], "--kernel"
    )


def test_beta_with_an_architecture_uses_its_modes(capsys, tmp_path):
    # --beta on data: c_k = k^-beta over the reduced modes, as with --c of those values.
    data = tmp_path / "xy.npz"
    rng = np.random.default_rng(1)
    np.savez(data, x=rng.standard_normal((30, 3)), y=rng.standard_normal(30))
    rc, out, err = cli(capsys, "--architecture", "diagonal", "--data", data, "--eps", "1e-3", "--beta", 1, "--json")
    assert rc == 0, err
    assert np.allclose(json.loads(out)["c"], 1.0 / np.arange(1, 4))


def test_outputs_checked_before_solving_and_table_printed_first(capsys, tmp_path, good, monkeypatch):
    (tmp_path / "adir.json").mkdir()
    one_line_error(capsys, ["--system", good, "--eps", "1e-3", "--save", tmp_path / "adir.json"], "--save", "directory")
    one_line_error(capsys, ["--system", good, "--eps", "1e-3", "--plot", tmp_path / "no" / "x.png"], "--plot", "no")

    # A failed write (a full disk) after the solve: the table is already on stdout, the error names
    # the user's path (not the temporary file), and no temporary is left behind.
    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)  # ENOSPC when the atomic write flushes its temporary file
    target = tmp_path / "out.json"
    rc, out, err = cli(capsys, "--system", good, "--eps", "1e-3", "--save", target)
    assert rc == 2 and "t*_k" in out
    assert err.strip() == f"lvflow predict: error: --save: cannot write {target}: No space left on device"
    assert sorted(os.listdir(tmp_path)) == ["adir.json", "sys.npz"]


def test_subnormal_eps_gives_the_exact_times(capsys, tmp_path):
    # eps below the smallest normal double: Eq. 158 in logs, t*_k = (1/r)[ln(T/z0) + ln((r − C z0)/(r − C T))]
    f = tmp_path / "s.npz"
    r = np.array([1.0, 0.5])
    np.savez(f, r=r, C=1e300 * np.eye(2))
    for eps in (1e-310, 5e-324):
        rc, out, err = cli(capsys, "--system", f, "--eps", eps, "--json", "--quiet")
        assert rc == 0, err
        T = 0.5 * r / 1e300
        exact = (np.log(T) - np.log(eps) + np.log((r - 1e300 * eps) / (r - 1e300 * T))) / r
        np.testing.assert_allclose([m["t_star"] for m in json.loads(out)["directions"]], exact, rtol=1e-7)


def test_many_modes_are_held_diagonal(capsys):
    # 20000 modes: a dense C would be 3.2 GB; the diagonal representation solves in O(K).
    rc, out, err = cli(capsys, "--alpha1", 2, "--alpha2", 0.8, "--modes", 20000, "--eps", 1e-6, "--json", "--quiet")
    assert rc == 0, err
    modes = json.loads(out)["directions"]
    assert len(modes) == 20000
    k = np.array([m["mode"] for m in modes[:5]])
    r = k**-0.8
    Ckk = k ** (2 - 1.6) / 8
    T = 0.5 * r / Ckk
    exact = (np.log(T / 1e-6) + np.log((r - Ckk * 1e-6) / (r - Ckk * T))) / r  # Eq. 158
    np.testing.assert_allclose([m["t_star"] for m in modes[:5]], exact, rtol=1e-12)


@pytest.mark.parametrize("header", ["\ufeffr,C0,C1,C2", '"r","C0","C1","C2"'])
def test_spreadsheet_csv_headers(capsys, tmp_path, header):
    f = tmp_path / "s.csv"
    rows = "\n".join(",".join(map(str, [R3[i], *C3[i]])) for i in range(3))
    f.write_text(header + "\n" + rows + "\n", encoding="utf-8")
    rc, out, err = cli(capsys, "--system", f, "--eps", "1e-3", "--json", "--quiet")
    assert rc == 0, err
    np.testing.assert_allclose([m["r"] for m in json.loads(out)["directions"]], R3)


def test_sigterm_during_save_leaves_no_temporary(tmp_path):
    # SIGTERM while the atomic write is under way: the hidden temporary file is removed, exit 143.
    code = (
        "import sys, time\n"
        "from lvflow._workflow.io import atomic_write\n"
        "def slow(f):\n"
        "    f.write(b'x' * 1000); f.flush(); print('writing', flush=True); time.sleep(30)\n"
        "atomic_write(sys.argv[1], slow)\n"
    )
    import signal

    for sig in (signal.SIGTERM, signal.SIGHUP):
        p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "out.npz")], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"writing"
        assert any(n.startswith(".out.npz.") for n in os.listdir(tmp_path))
        p.send_signal(sig)
        assert p.wait(timeout=30) == 128 + sig
        assert os.listdir(tmp_path) == []


def test_y2_in_system_files(capsys, tmp_path):
    # A CSV column y2 (the loss at z = 0) is read, not dropped: the curve starts at it.
    f = tmp_path / "s.csv"
    f.write_text("r,C0,C1,y2\n1.0,1,0,0.2\n0.5,0,1,0.2\n")
    rc, out, err = cli(capsys, "--system", f, "--eps", "1e-4", "--json", "--quiet")
    assert rc == 0, err
    d = json.loads(out)
    assert d["curve"]["loss"][0] == pytest.approx(0.2 - (1e-4 * 1.5) / 4 + 2e-8 / 8, rel=1e-12)
    # y2 ≥ rᵀz*/8 is what the modes can remove (0.15625 here); the loss never goes below 0
    assert min(d["curve"]["loss"]) >= 0.2 - 0.15625 - 1e-12


@pytest.mark.parametrize(
    "content, needles",
    [
        ("r,C0,C1,y2\n1.0,1,0,-0.2\n0.5,0,1,-0.2\n", ["--system", "y2 must be ≥ 0"]),
        ("r,C0,C1,y2\n1.0,1,0,0.2\n0.5,0,1,0.3\n", ["--system", "y2 must be one number"]),
        ("r,C0,C1,y2\n1.0,1,0,0.1\n0.5,0,1,0.1\n", ["y2", "below rᵀz*/8"]),
        ("r,C0,C1,w\n1.0,1,0,0.1\n0.5,0,1,0.1\n", ["--system", "unexpected arrays ['w']"]),
    ],
)
def test_bad_y2_and_extra_columns(capsys, tmp_path, content, needles):
    f = tmp_path / "s.csv"
    f.write_text(content)
    one_line_error(capsys, ["--system", f, "--eps", "1e-4"], *needles)


def test_both_parametrisations_refused(capsys, tmp_path):
    f = tmp_path / "s.npz"
    np.savez(f, r=R3, C=C3, zeta=R3, V=np.ones(3))
    one_line_error(capsys, ["--system", f, "--eps", "1e-4"], "--system", "both r, C and zeta, V")


def test_beta_far_apart_is_not_called_merged(capsys):
    # --beta 500: switch-ons at t* ≈ 11, 622, 1347 (Eq. 158), far apart: no merging sentence.
    rc, out, err = cli(capsys, "--alpha1", 2, "--alpha2", 0.8, "--modes", 3, "--eps", 1e-4, "--beta", 500, "--quiet")
    assert rc == 0, err
    assert "merge" not in out.split("\n#")[0] and "stands apart" not in out
    r = np.arange(1, 4.0) ** -0.8
    C = r**2 / (8 * np.arange(1, 4.0) ** -2.0)
    c = np.arange(1, 4.0) ** -500.0
    t = (np.log(1 / 1e-4) - np.log(C * c / (r - C * c * 1e-4))) / r  # Eq. 158, ρ = ½
    table = out.split("directions (modes)")[1]
    rows = [ln.split() for ln in table.splitlines() if ln[:2].strip().isdigit()]
    np.testing.assert_allclose([float(x[4]) for x in rows], t, rtol=1e-5)


def test_unstable_learning_rate_is_noted(capsys):
    with pytest.warns(UserWarning, match="eta·lambda_max"):
        rc, out, err = cli(capsys, "--alpha1", 2, "--alpha2", 0.8, "--modes", 3, "--eps", 1e-4, "--lr", 100, "--quiet")
    assert rc == 0
    # diagonal C: the loss Hessian at z∞ in w = √z is Diag(r_k): λ_max = r_1 = 1
    assert "note: learning rate 100: eta·lambda_max = 100 > 2" in out


def test_signed_diagonal_decaying_modes_listed_last(capsys, tmp_path):
    rng = np.random.default_rng(0)
    f = tmp_path / "d.npz"
    np.savez(f, x=rng.standard_normal((3, 5)), y=rng.standard_normal(3))
    rc, out, err = cli(capsys, "--architecture", "signed-diagonal", "--data", f, "--eps", 1e-4, "--json", "--quiet")
    assert rc == 0, err
    modes = json.loads(out)["directions"]
    t = [m["t_star"] for m in modes]
    n_on = sum(x is not None for x in t)
    assert 0 < n_on < len(t) and all(x is None for x in t[n_on:])  # switch-ons first, decaying modes last
    notes = json.loads(out)["notes"]
    decay = next(n for n in notes if "end at or below their start" in n)
    assert all(str(m["mode"]) in decay for m in modes[n_on:])
    # a t* of 0 only for a mode that starts above its target, and said so
    zero = [m["mode"] for m in modes if m["t_star"] == 0.0]
    assert all(any("start at or above" in n and str(k) in n for n in notes) for k in zero)


# ---- the plot process: `--plot` drawn in a child forked before JAX is imported -----------------


def test_plot_drawn_in_the_plot_process_equals_the_in_process_one(tmp_path, capsys):
    system = tmp_path / "sys.csv"
    system.write_text("r,C0,C1,C2\n1.0,1,0,0\n0.5,0,1,0\n0.25,0,0,1\n")
    args = ["predict", "--system", str(system), "--eps", "1e-4", "--lr", "0.01", "--plot"]
    # internal on purpose: the command's module ([project.scripts]), run as a real process, where
    # JAX is not imported yet and the plot process is started
    out = subprocess.run(
        [sys.executable, "-m", "lvflow._workflow.cli", *args, str(tmp_path / "a.png")], text=True, capture_output=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith(f"plot: {tmp_path / 'a.png'}")
    assert main([*args, str(tmp_path / "b.png")]) == 0  # here JAX is imported: drawn in this process
    capsys.readouterr()
    a, b = (tmp_path / "a.png").read_bytes(), (tmp_path / "b.png").read_bytes()
    assert a[:8] == b"\x89PNG\r\n\x1a\n"
    assert a == b


def test_plot_process_errors_and_early_exits(tmp_path):
    # a failed write in the plot process comes back as the same one-line error; a bad input found
    # before the plot ends the plot process with the command (exit 2, one line, nothing left running)
    code = (
        "import sys, numpy as np\n"
        "from lvflow._workflow import plot_worker\n"
        "plot_worker.start()\n"
        "import lvflow\n"
        "pred = lvflow.predict(lvflow.LotkaVolterra(np.array([1.0, 0.5]), np.eye(2)), eps=1e-4)\n"
        "try:\n"
        "    pred.plot(sys.argv[1])\n"
        "except lvflow.LvflowError as e:\n"
        "    print('refused:', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "missing" / "x.png")], text=True, capture_output=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"refused: output: directory does not exist: {tmp_path / 'missing'}"
    system = tmp_path / "sys.csv"
    system.write_text("r,C0,C1\n1.0,1,0\n0.5,0,1\n")
    cmd = [sys.executable, "-m", "lvflow._workflow.cli", "predict", "--system", str(system), "--eps", "2"]
    out = subprocess.run([*cmd, "--plot", str(tmp_path / "c.png")], text=True, capture_output=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == "lvflow predict: error: --eps: must lie in (0, 1), got 2"
    assert not (tmp_path / "c.png").exists()
