import re

# internal on purpose: the `lvflow` command's entry point ([project.scripts]), run in-process
from lvflow._workflow.cli import main


def test_demo_matches_eq158_and_writes_plot(tmp_path, capsys):
    out = tmp_path / "demo.png"
    assert main(["demo", "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    err = float(re.search(r"closed form \(Eq\. 158\): (\S+)", text).group(1))
    assert err < 1e-6
    assert out.stat().st_size > 10_000


def test_cli_help_lists_commands(capsys):
    assert main([]) == 0
    text = capsys.readouterr().out
    for cmd in ("demo", "predict", "figures", "bench"):
        assert cmd in text
