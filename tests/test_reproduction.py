"""`figures/REPRODUCTION.md` is the figures' JSON, written by `lvflow figures`: the committed file is
what the committed JSON renders to, every claim's measured values are in it verbatim, and the
README's count of claims that hold is the JSON's."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from lvflow.figures import FIGURES, reproduction

NAME = "REPRODUCTION.md"

ROOT = Path(__file__).resolve().parents[1]


def _claims():
    for name in FIGURES:
        path = ROOT / "figures" / f"{name}.json"
        if path.exists():
            yield from json.loads(path.read_text()).get("claims", [])


def test_committed_reproduction_is_the_json(tmp_path):
    text = (ROOT / "figures" / NAME).read_text()
    for name in FIGURES:
        if (ROOT / "figures" / f"{name}.json").exists():
            shutil.copy(ROOT / "figures" / f"{name}.json", tmp_path)
    assert text == reproduction(tmp_path).read_text()  # regenerate with `lvflow figures`
    claims = list(_claims())
    holds = sum(c["holds"] is True for c in claims)
    assert f"**{holds} of the {len(claims)} claims hold**" in text
    for c in claims:
        assert json.dumps(c.get("measured", {}), ensure_ascii=False, sort_keys=True).replace("|", "\\|") in text


def test_readme_count_is_the_json():
    claims = list(_claims())
    holds = sum(c["holds"] is True for c in claims)
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"(\d+) of the (\d+) claims hold", readme)
    assert m is not None and (int(m.group(1)), int(m.group(2))) == (holds, len(claims))


def test_write_is_atomic_and_covers_what_is_there(tmp_path):
    (tmp_path / "fig4.json").write_text((ROOT / "figures" / "fig4.json").read_text())
    path = reproduction(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME, "fig4.json"]  # no temporaries left
    text = path.read_text()
    assert "## fig4:" in text and "## fig2:" not in text
