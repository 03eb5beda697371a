"""The paper's figures, regenerated from lvflow (`lvflow figures`, or `lvflow.figures`).

Adding a figure is one module and one line here. The module `lvflow/_figures/<name>.py`
defines

- `TITLE`: one line shown in the progress output and `--help`;
- `make(out: pathlib.Path, *, quick: bool = False) -> dict`: computes, draws through
  `_style` (which writes `<name>.png` and `<name>.pdf`), writes `<name>.json` with
  `_style.write_summary`, and returns that summary. `quick=True` runs reduced sizes
  (all quick figures together are meant to take minutes on 2 cores; measured in
  `docs/howto/figures.md`); the default runs the
  paper's setup (App. C).

A summary holds `claims`: each statement the paper makes about the figure as `_style.claim`
builds it (the claim, `holds` as measured or `None` where the run cannot test it, the criterion,
the numbers, and a `verdict` line that `lvflow figures` prints: where the verdict turns on a
threshold or a run length of ours it says so, with the range over which the claim holds); `deviations` where the
setup must differ from the paper's, with what that changes; `choices` for values the paper
leaves out. docs/howto/figures.md collects them.

Modules are imported only when their figure is made, so one figure's missing dependency
never blocks the others.
"""

from __future__ import annotations

import importlib

from .._core.errors import LvflowError

#: Figure name → module. Order is the order `lvflow figures` makes them in.
FIGURES: dict[str, str] = {
    "fig2": "lvflow._figures.fig2",
    "fig3": "lvflow._figures.fig3",
    "fig4": "lvflow._figures.fig4",
    "fig5": "lvflow._figures.fig5",
    "fig6": "lvflow._figures.fig6",
    "fig7": "lvflow._figures.fig7",
    "fig8": "lvflow._figures.fig8",
    "limit": "lvflow._figures.limit",
}


def load(name: str):
    """The module of figure `name` (see `FIGURES`)."""
    if name not in FIGURES:
        raise LvflowError(f"figure: unknown name {name!r}; choose from {', '.join(FIGURES)}")
    return importlib.import_module(FIGURES[name])
