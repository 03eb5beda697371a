"""The README's Python examples run as written, and their printed times match Eq. 158."""

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.slow
def test_readme_python_examples_run(tmp_path, monkeypatch):
    import lvflow

    monkeypatch.chdir(tmp_path)
    blocks = _python_blocks()
    assert len(blocks) >= 2
    spaces = [{} for _ in blocks]
    for code, ns in zip(blocks, spaces):
        exec(compile(code, str(README), "exec"), ns)
    # The first example's solver times are the exact ignition times (Thm 6 makes Eq. 158 exact).
    first = spaces[0]
    eq158 = np.asarray(lvflow.ignition_time(first["r"], np.ones(5), np.ones(5), first["eps"]))
    np.testing.assert_allclose(np.asarray(first["sol"].switch_on_times), eq158, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(first["sched"].tau_star), 1 / first["r"], rtol=1e-12)


def test_readme_derivative_example_against_finite_differences(tmp_path, monkeypatch):
    # The derivatives example: ∂t*/∂r against central differences of tight solves, and z(200)
    # against the equilibrium C⁻¹r solved here in numpy.
    import lvflow

    monkeypatch.chdir(tmp_path)
    code = next(b for b in _python_blocks() if "jax.jacrev(switch_on)" in b)
    ns = {}
    exec(compile(code, str(README), "exec"), ns)
    d, U, r, z0 = ns["d"], ns["U"], np.asarray(ns["r"]), ns["z0"]

    def tstar(r):
        system = lvflow.LowRankLotkaVolterra(r, d, U)
        return np.asarray(lvflow.solve_lv(system, z0, 200.0, ts=[0.0, 200.0], rtol=1e-12, atol=1e-14).switch_on_times)

    h = 1e-6
    fd = np.stack([(tstar(r + h * e) - tstar(r - h * e)) / (2 * h) for e in np.eye(3)], axis=1)
    np.testing.assert_allclose(np.asarray(ns["dt_dr"]), fd, rtol=1e-5, atol=1e-5 * np.abs(fd).max())
    C = np.diag(d) + U @ U.T
    np.testing.assert_allclose(np.exp(np.asarray(ns["sol"].ys[-1])), np.linalg.solve(C, r), rtol=1e-7)
