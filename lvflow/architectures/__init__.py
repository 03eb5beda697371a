"""Built-in architectures: forward pass, per-neuron `unit(w, x)` and closed-form `structure(x)`.

Each is an `equinox.Module` holding the neuron array `W ∈ R^{p×d}` (columns are the `d`
interchangeable neurons). `model(x) = Σ_i model.unit(W[:, i], x)`, and near `W = 0`
`model(x) ≈ Tr[W Wᵀ model.structure(x)]` (Thm 1, Eq. 2; the structure matrices of Table 3).
"""

from ._attention import (
    AttentionLogits as AttentionLogits,
    MultiHeadAttention as MultiHeadAttention,
    QKAttention as QKAttention,
)
from ._base import AbstractArchitecture as AbstractArchitecture
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
