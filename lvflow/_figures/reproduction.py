"""`figures/REPRODUCTION.md`: every figure's claims, our choices and the measured values, written
from the figures' JSON summaries (nothing typed by hand)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._workflow.io import atomic_write_bytes
from . import FIGURES, load

NAME = "REPRODUCTION.md"


def _cell(text: str) -> str:
    """A markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _verdict(claim: dict[str, Any]) -> str:
    holds = claim.get("holds")
    return "not tested" if holds is None else ("holds" if holds else "does not hold")


def counts(summaries: dict[str, dict[str, Any]]) -> dict[str, int]:
    """How many of the summaries' claims hold, do not hold, and were not tested."""
    out = {"holds": 0, "does not hold": 0, "not tested": 0}
    for s in summaries.values():
        for c in s.get("claims", []):
            out[_verdict(c)] += 1
    return out


def render(summaries: dict[str, dict[str, Any]]) -> str:
    """The document for these figure summaries (name → the figure's JSON), in registry order."""
    n = counts(summaries)
    total = sum(n.values())
    lines = [
        "# Reproducing the paper's figures",
        "",
        "Written by `lvflow figures` from the JSON summaries in this folder; every number below is the",
        "JSON's. Each claim of the paper is checked by a criterion of ours (its threshold or run length is",
        "our choice, named in the criterion); the verdict says where it holds beyond that choice.",
        "",
        f"**{n['holds']} of the {total} claims hold**, {n['does not hold']} do not at our criterion, "
        f"{n['not tested']} {'was' if n['not tested'] == 1 else 'were'} not tested.",
    ]
    for name in FIGURES:
        s = summaries.get(name)
        if s is None:
            continue
        quick = " (quick sizes)" if s.get("quick") else ""
        lines += ["", f"## {name}: {load(name).TITLE}{quick}", ""]
        choices = s.get("choices") or {}
        if choices:
            lines.append("Our choices and deviations from the paper's setup:")
            lines.append("")
            lines += [f"- `{k}`: {_cell(v if isinstance(v, str) else json.dumps(v))}" for k, v in choices.items()]
            lines.append("")
        claims = s.get("claims", [])
        if not claims:
            lines.append("(no claims recorded)")
            continue
        lines += ["| claim | criterion | measured | verdict |", "|---|---|---|---|"]
        for c in claims:
            measured = json.dumps(c.get("measured", {}), ensure_ascii=False, sort_keys=True)
            verdict = c.get("verdict") or _verdict(c)
            lines.append(
                f"| {_cell(c.get('claim', ''))} | {_cell(c.get('criterion', ''))} | {_cell(measured)} | "
                f"**{_verdict(c)}**: {_cell(verdict)} |"
            )
    return "\n".join(lines) + "\n"


def read_summaries(folder) -> dict[str, dict[str, Any]]:
    """The figure summaries (`<name>.json`) present in `folder`, by name."""
    folder = Path(folder)
    return {n: json.loads((folder / f"{n}.json").read_text()) for n in FIGURES if (folder / f"{n}.json").exists()}


def write(folder) -> Path:
    """Write `REPRODUCTION.md` into `folder` from the summaries there, atomically; returns its path."""
    path = Path(folder) / NAME
    return atomic_write_bytes(path, render(read_summaries(folder)).encode())
