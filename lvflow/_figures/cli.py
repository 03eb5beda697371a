"""`lvflow figures`' options (the command itself is `command.py`): regenerate the paper's figures
(PNG + PDF + JSON summary each)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._core.errors import LvflowError
from . import FIGURES

FLAGS: dict[str, str] = {}  # errors name no API argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="figures", type=Path, help="output folder (default: figures/)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="reduced sizes: all figures in a few minutes (times: docs/howto/figures.md; default: the paper's sizes)",
    )
    parser.add_argument(
        "--only", default=None, metavar="NAMES", help=f"comma-separated subset of: {', '.join(FIGURES)} (default: all)"
    )


def selected(only: str | None) -> list[str]:
    """Figure names from `--only` (validated), in registry order."""
    if only is None:
        return list(FIGURES)
    names = [n.strip() for n in only.split(",") if n.strip()]
    bad = [n for n in names if n not in FIGURES]
    if bad or not names:
        raise LvflowError(
            f"--only: unknown figure(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(FIGURES)}"
        )
    return [n for n in FIGURES if n in names]
