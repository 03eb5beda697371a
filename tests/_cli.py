"""Helpers shared by the tests that run the `lvflow` command in a subprocess or in-process."""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

#: The `lvflow` command's entry point as installed (the `lvflow` console script), run in-process.
(_script,) = entry_points(group="console_scripts", name="lvflow")
main = _script.load()

ROOT = Path(__file__).resolve().parents[1]


def cli_env() -> dict[str, str]:
    """The environment of a subprocess run of `lvflow` from this checkout, without the JAX cache."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "LVFLOW_CACHE_DIR": "off"}


def one_line(text: str) -> str:
    """The only line of `text` (fails when there are more: an error is one line)."""
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]
