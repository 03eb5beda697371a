import re

import pytest
from _cli import main


@pytest.mark.smoke
def test_demo_matches_eq158_and_writes_plot(tmp_path, capsys):
    out = tmp_path / "demo.png"
    assert main(["demo", "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    err = float(re.search(r"closed form \(Eq\. 158\): (\S+)", text).group(1))
    assert err < 1e-6
    assert out.stat().st_size > 10_000


def test_cli_help_lists_commands(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for cmd in ("demo", "predict", "figures", "bench"):
        assert cmd in text
    # no command, or an unknown one, is a usage error: exit 2 and one line naming the commands
    for argv in ([], ["predcit"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("lvflow: error:") and "predict" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--eps", "2"], "--eps: must lie in (0, 1), got 2"),
        (["--eps", "0"], "--eps: must lie in (0, 1), got 0"),
        (["--eps", "-1e-3"], "--eps: must lie in (0, 1), got -0.001"),  # a negative exponent form is a value
        (["--eps", "nan"], "--eps: contains 1 non-finite value"),
        (["--plot", "x.jpg"], "--plot: unsupported file type for x.jpg"),
    ],
)
def test_demo_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().startswith(f"lvflow demo: error: {message}")
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_demo_writes_nothing_unasked_and_a_large_eps_has_a_finite_check(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # ε = 0.05: the slowest modes start above half their final value (t* = 0); the check stays finite
    assert main(["demo", "--eps", "0.05"]) == 0
    err = float(re.search(r"closed form \(Eq\. 158\): (\S+)", capsys.readouterr().out).group(1))
    assert err < 1e-6
    assert list(tmp_path.iterdir()) == []
