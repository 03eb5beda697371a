"""The `lvflow` command under a hostile environment: a JAX or XLA setting that would stop every
command, or warnings turned into errors, is one line naming the setting and exit 2."""

import os
import subprocess
import sys

import pytest

SYSTEM = "r,C0,C1,C2\n1,1,0,0\n0.5,0,1,0\n0.25,0,0,1\n"


def _lvflow(tmp_path, *argv, **env):
    (tmp_path / "sys3.csv").write_text(SYSTEM)
    full = {**os.environ, "LVFLOW_CACHE_DIR": "off", **env}
    cmd = [sys.executable, "-m", "lvflow", *argv]
    return subprocess.run(cmd, cwd=tmp_path, env=full, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "env, named",
    [
        ({"JAX_PLATFORMS": "bogus"}, "JAX_PLATFORMS='bogus'"),
        ({"XLA_FLAGS": "--bogus_flag"}, "XLA_FLAGS='--bogus_flag'"),
    ],
)
def test_an_unusable_jax_setting_is_one_line_and_exit_2(tmp_path, env, named):
    out = _lvflow(tmp_path, "predict", "--system", "sys3.csv", "--eps", "1e-4", "--save", "out.json", **env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"lvflow predict: error: {named}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sys3.csv"]  # nothing written


def test_a_warning_turned_into_an_error_is_one_line_and_exit_2(tmp_path):
    # η = 5 > 2/λ_max = 2: predict warns that gradient descent is unstable at the last plateau
    argv = ("predict", "--system", "sys3.csv", "--eps", "1e-4", "--lr", "5")
    out = _lvflow(tmp_path, *argv, PYTHONWARNINGS="error")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "a warning became an error under PYTHONWARNINGS" in out.stderr and "learning rate 5" in out.stderr
    assert _lvflow(tmp_path, *argv).returncode == 0  # without it: the warning is a note


def test_plots_need_no_display_backend_and_a_failed_plot_is_one_line(tmp_path):
    # the commands write files only: a misspelt MPLBACKEND (which stops matplotlib's import) is ignored
    out = _lvflow(tmp_path, "predict", "--system", "sys3.csv", "--eps", "1e-4", "--plot", "p.png", MPLBACKEND="bogus")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    # a learning rate so small that the steps overflow: matplotlib refuses the data after the solve
    argv = ("predict", "--system", "sys3.csv", "--eps", "1e-4", "--lr", "1e-320", "--plot", "q.png", "--quiet")
    out = _lvflow(tmp_path, *argv)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if "lvflow predict" in ln]
    assert len(lines) == 1 and lines[0].startswith("lvflow predict: error: --plot: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png", "sys3.csv"]  # no figure, no temporary
