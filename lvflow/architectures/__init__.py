"""Built-in architectures: forward pass, per-neuron `unit(w, x)` and closed-form `structure(x)`.

Each is an `equinox.Module` holding the neuron array `W ∈ R^{p×d}` (columns are the `d`
interchangeable neurons). `model(x) = Σ_i model.unit(W[:, i], x)`, and near `W = 0`
`model(x) ≈ Tr[W Wᵀ model.structure(x)]` (Thm 1, Eq. 2; the structure matrices of Table 3).

The abstract bases say what each kind of module provides, so that you can add your own:

- `AbstractSumForm`: `W` and `unit(w, x)` — enough for `lvflow.nqf_twin` (give it a sample `x`).
- `AbstractArchitecture`: also `out_size`, the closed-form `structure(x)` and the shape of one
  input `sample_shape(seq_len=...)` (used by `lvflow.gaussian_inputs`).
- `AbstractLearnedMap`: also the learned map `Θ(W)` and features `Φ_c(x)` with
  `Tr[Wᵀ A_c(x) W] = ⟨Θ(W), Φ_c(x)⟩` (Eq. 17), and `draw_teacher` — what
  `lvflow.low_rank_teacher` needs. `AbstractSeparableMap`: each output reads its own slice of `Θ`.

The abstract bases load with the package; each built-in architecture loads on first use (PEP 562),
so that a command using one of them (`lvflow predict --architecture mlp`) does not pay the others'
import. `dir()` and `__all__` list them all.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

from ._base import (
    AbstractArchitecture as AbstractArchitecture,
    AbstractLearnedMap as AbstractLearnedMap,
    AbstractSeparableMap as AbstractSeparableMap,
    AbstractSumForm as AbstractSumForm,
)

#: built-in architecture → the private module that defines it
_EXPORTS = {
    "AttentionLogits": "._attention",
    "MultiHeadAttention": "._attention",
    "QKAttention": "._attention",
    "CNN": "._cnn",
    "FourierMLP": "._fourier",
    "MLP": "._mlp",
    "MixtureOfExperts": "._moe",
    "DiagonalLinear": "._simple",
    "MatrixSensing": "._simple",
    "QuadraticNet": "._simple",
    "RectangularSensing": "._simple",
    "SignedDiagonal": "._simple",
}

# computed: type checkers read the `name as name` imports below instead
__all__ = sorted(  # pyright: ignore[reportUnsupportedDunderAll]
    [*_EXPORTS, "AbstractArchitecture", "AbstractLearnedMap", "AbstractSeparableMap", "AbstractSumForm"]
)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if _TYPE_CHECKING:  # the same names, statically, for editors and type checkers (tests/test_exports.py)
    from ._attention import (
        AttentionLogits as AttentionLogits,
        MultiHeadAttention as MultiHeadAttention,
        QKAttention as QKAttention,
    )
    from ._cnn import CNN as CNN
    from ._fourier import FourierMLP as FourierMLP
    from ._mlp import MLP as MLP
    from ._moe import MixtureOfExperts as MixtureOfExperts
    from ._simple import (
        DiagonalLinear as DiagonalLinear,
        MatrixSensing as MatrixSensing,
        QuadraticNet as QuadraticNet,
        RectangularSensing as RectangularSensing,
        SignedDiagonal as SignedDiagonal,
    )
