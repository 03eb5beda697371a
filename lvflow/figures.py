"""The paper's figures as functions: each writes `<name>.png`, `<name>.pdf` and `<name>.json`
into `out` and returns the JSON summary (the quantities the figure shows: predicted vs
measured plateau times, fitted vs predicted exponents, ...). Each summary's `claims` lists the
paper's statements about the figure, each with `holds` (here, as measured), the criterion and the
numbers; `deviations` and `choices` say where the setup differs from App. C or fills a value it
leaves out (docs/howto/figures.md collects them).

`quick=True` runs reduced sizes; the default runs the paper's sizes. The same figures come from
the command line: `lvflow figures [--quick] [--out DIR] [--only fig3,fig5]`.
"""

from __future__ import annotations

from pathlib import Path

from ._core.errors import LvflowError
from ._figures import FIGURES, load
from ._figures.reproduction import write

__all__ = ["fig2", "fig3", "fig4", "fig5", "fig6", "fig7", "fig8", "limit", "make_all", "reproduction", "FIGURES"]


def _make(name: str, out, quick: bool) -> dict:
    return load(name).make(Path(out), quick=bool(quick))


def fig2(out="figures", *, quick: bool = False) -> dict:
    """Fig 2: network vs NQF twin (ŝ_k/s_k) for MLP, CNN, a single QK-only head and 4-head attention ×
    GD/momentum/Adam × σ = 0.01/0.2."""
    return _make("fig2", out, quick)


def fig3(out="figures", *, quick: bool = False) -> dict:
    """Fig 3: feature-wise plateaus (m = 5 modes, GD vs the gLV, switch-on times t*_k) and the
    1000-mode power law `E ∝ t^{−(α₁−1)/α₂}` with its finite-ε exponent."""
    return _make("fig3", out, quick)


def fig4(out="figures", *, quick: bool = False) -> dict:
    """Fig 4: sample-wise plateaus: m = 4 orthogonal samples, the ξ-ODE (Thm 5) vs GD, plateaus
    at t*_μ ≈ ln(1/ε)/ζ_μ."""
    return _make("fig4", out, quick)


def fig5(out="figures", *, quick: bool = False) -> dict:
    """Fig 5: Fourier-feature MLP (θ ∈ {0, ½, 1}) and its NQF: `E ∝ t^{−(2β−1)/(θ+β)}`; a plain
    tanh MLP on raw x shows no power law."""
    return _make("fig5", out, quick)


def fig6(out="figures", *, quick: bool = False) -> dict:
    """Fig 6: online SGD teacher–student (tanh MLP, QK-only attention), 5 runs with ±1 std bands: the
    NQF tracks, then departs."""
    return _make("fig6", out, quick)


def fig7(out="figures", *, quick: bool = False) -> dict:
    """Fig 7: odd-vs-even digits (scikit-learn's, upsampled to 28×28), the paper's MLP/CNN/attention vs
    their NQF (Adam, lr 1e-3, ε = 0.01)."""
    return _make("fig7", out, quick)


def fig8(out="figures", *, quick: bool = False) -> dict:
    """Fig 8: 4-layer MLP and 2-layer attention vs a 2-layer and a 1-layer NQF, under GD/momentum/Adam
    and two initial variances."""
    return _make("fig8", out, quick)


def limit(out="figures", *, quick: bool = False) -> dict:
    """The ε → 0 limit: loss vs τ = t/ln(1/ε) for ε = 1e-2 … 1e-32 converging onto the
    saddle-to-saddle step function of `plateau_schedule`, with a mode switching off."""
    return _make("limit", out, quick)


def make_all(out="figures", *, quick: bool = False, only=None) -> dict[str, dict]:
    """Every figure in `FIGURES` (or the names in `only`), in order: `{name: summary}`."""
    names = list(FIGURES) if only is None else [n for n in FIGURES if n in set(only)]
    unknown = set(only or ()) - set(FIGURES)
    if unknown:
        raise LvflowError(f"only: unknown figure(s) {', '.join(sorted(unknown))}; choose from {', '.join(FIGURES)}")
    return {n: _make(n, out, quick) for n in names}


def reproduction(out="figures") -> Path:
    """Write `REPRODUCTION.md` into `out` from the figures' JSON summaries there (each figure's
    claims with the criterion, the measured values and whether they hold, and how many hold), as
    `lvflow figures` does after making them; atomically. Returns its path."""
    return write(Path(out))


def __getattr__(name: str):
    # Figures registered in `_figures.FIGURES` without a function above (added later) are still
    # reachable as `lvflow.figures.<name>(out, quick=...)`.
    if name in FIGURES:

        def make(out="figures", *, quick: bool = False) -> dict:
            return _make(name, out, quick)

        make.__name__ = name
        make.__doc__ = getattr(load(name), "TITLE", name)
        return make
    raise AttributeError(f"module 'lvflow.figures' has no attribute {name!r}")
