"""What `predict` starts from: a gLV system (Eq. 32) built from named arrays or a power-law
spectrum (Thm 9), and the initial scale `z_k(0) = ε c_k` (Thm 8)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .._errors import LvflowError, NotPSDError, SymmetryError
from .._glv.lv import LotkaVolterra
from .._validate import as_array, check_in_open_interval, check_positive, check_positive_int, check_psd

_positive_int = check_positive_int


def lv_from_arrays(arrays: Mapping[str, Any], *, name: str = "system") -> LotkaVolterra:
    """A gLV system from named arrays: `r` and `C`, or `zeta` and `V`; optionally `y2`.

    With `zeta` and `V` (the rates and loss drops of independent modes, Thm 6) the system is
    diagonal with `r_k = ζ_k` and `C_kk = ζ_k² / (8 V_k)`, so that `V_k = r_k²/(8 C_kk)`.
    An unnamed array (an `.npy` or a header-less `.csv`) of shape `(K, K+1)` is read as the
    columns `[r | C]`. `y2 = (1/m) Σ y_μ²` (the loss at `z = 0`, `≥ 0`) is one number; a CSV column
    `y2` (which the CSV reader files under `y`) holds it in every row.

    **Raises:** `LvflowError` naming `name` and the problem (missing, unexpected or doubly given
    keys, shapes, NaN/inf, `V ≤ 0`, `y2 < 0`); `SymmetryError` / `NotPSDError` when `C` is not
    symmetric PSD.
    """
    keys = {k.lower(): k for k in arrays}
    if set(keys) == {""}:
        a = as_array(name, arrays[keys[""]], ndim=2)
        K = a.shape[0]
        if a.shape != (K, K + 1):
            raise LvflowError(
                f"{name}: an unnamed array must have shape (K, K+1) holding the columns [r | C], got {a.shape}"
            )
        arrays, keys = {"r": a[:, 0], "C": a[:, 1:]}, {"r": "r", "c": "C"}
    if {"r", "c"} <= set(keys) and {"zeta", "v"} <= set(keys):
        raise LvflowError(f"{name}: holds both r, C and zeta, V; give one pair")
    extra = sorted(set(keys) - {"r", "c", "zeta", "v", "y2", "y"})
    if extra and ({"r", "c"} <= set(keys) or {"zeta", "v"} <= set(keys)):
        raise LvflowError(
            f"{name}: unexpected arrays {[keys[k] for k in extra]}; expected r and C (or zeta and V), and optionally y2"
        )
    y2 = _y2(name, arrays, keys)
    if "r" in keys and "c" in keys:
        r = as_array(f"{name}: r", arrays[keys["r"]], ndim=1)
        C = as_array(f"{name}: C", arrays[keys["c"]], ndim=2)
        if C.shape != (r.shape[0],) * 2:
            raise LvflowError(
                f"{name}: C has shape {C.shape}, expected {(r.shape[0],) * 2} to match r of shape {r.shape}"
            )
        _check_C(name, C)
        return LotkaVolterra(r, C, y2=y2, check=False)
    if "zeta" in keys and "v" in keys:
        zeta = as_array(f"{name}: zeta", arrays[keys["zeta"]], ndim=1)
        V = as_array(f"{name}: V", arrays[keys["v"]], ndim=1)
        if zeta.shape != V.shape:
            raise LvflowError(f"{name}: zeta has shape {zeta.shape} but V has shape {V.shape}")
        if np.any(V <= 0):
            raise LvflowError(f"{name}: V must be positive (the loss drop of each mode), got min {V.min():g}")
        return LotkaVolterra(zeta, np.diag(zeta**2 / (8 * V)), y2=y2, check=False)
    raise LvflowError(f"{name}: expected arrays 'r' and 'C', or 'zeta' and 'V'; found {sorted(arrays) or 'none'}")


def _y2(name: str, arrays: Mapping[str, Any], keys: dict) -> float:
    """`y2` from the key `y2`, or from `y` (a CSV column `y2`): one value, repeated in a column; 0 if absent."""
    k = keys.get("y2", keys.get("y"))
    if k is None:
        return 0.0
    if "y2" in keys and "y" in keys:
        raise LvflowError(f"{name}: holds both y2 and y; give y2 once")
    v = as_array(f"{name}: y2", arrays[k], ndim=(0, 1)).reshape(-1)
    if v.size == 0 or np.any(v != v[0]):
        raise LvflowError(f"{name}: y2 must be one number (the same in every CSV row), got {v[:4].tolist()}")
    if v[0] < 0:
        raise LvflowError(f"{name}: y2 must be ≥ 0 (the mean of the squared targets), got {v[0]:g}")
    return float(v[0])


def _check_C(name: str, C: np.ndarray) -> None:
    # Same checks as `LotkaVolterra`, re-labelled with the input's name for the CLI's one line.
    try:
        check_psd("C", C)
    except (NotPSDError, SymmetryError) as e:
        raise type(e)(f"{name}: {e}") from None


def power_law_lv(*, alpha1: float, alpha2: float, modes: int) -> LotkaVolterra:
    """Independent modes with a power-law spectrum (Thm 9): `ζ_k = r_k = k^{−α₂}`,
    `V_k = k^{−α₁}`, hence `C_kk = r_k² / (8 V_k) = k^{α₁ − 2α₂} / 8`, `k = 1..modes`.

    The excess loss then falls as `E(τ) = Θ(τ^{−(α₁−1)/α₂})` for `α₁ > 1` (Thm 9).
    """
    a1 = float(as_array("alpha1", alpha1, ndim=0))
    a2 = check_positive("alpha2", alpha2)
    k = np.arange(1, _positive_int("modes", modes) + 1, dtype=np.float64)
    r, V = k**-a2, k**-a1
    return LotkaVolterra(r, np.diag(r**2 / (8 * V)), check=False)


def initial_scale(
    K: int,
    *,
    eps: float | None = None,
    c=None,
    z0=None,
    init_std: float | None = None,
    width: int | None = None,
) -> tuple[float, np.ndarray]:
    """The initial condition `z_k(0) = ε c_k` from one of three specifications.

    - `eps` (and optionally `c`, default `c_k = 1`): `z_k0 = ε c_k` (Thm 8).
    - `z0`: the initial modes themselves; then `ε = max_k z_k0` and `c_k = z_k0 / ε`.
    - `init_std` σ and `width` d: a weight matrix `W ∈ R^{p×d}` with i.i.d. `N(0, σ²)` entries
      has `E[M] = E[W Wᵀ] = d σ² I`, so every mode starts at `z_k0 = p_kᵀ M p_k ≈ d σ²`
      (relative fluctuations `√(2/d)`): `ε = d σ²`, and `c` as with `eps`.

    **Raises:** `LvflowError` unless exactly one is given and `0 < ε < 1`, `c_k > 0`.
    """
    given = [n for n, v in (("eps", eps), ("z0", z0), ("init_std", init_std)) if v is not None]
    if len(given) > 1:
        raise LvflowError(f"initial scale: give only one of eps, z0, init_std (got {', '.join(given)})")
    if init_std is None and width is not None:
        raise LvflowError("width: only meaningful together with init_std")
    if z0 is not None:
        if c is not None:
            raise LvflowError("c: give either z0 or c (with eps), not both")
        z0 = as_array("z0", z0, ndim=1)
        if z0.shape != (K,):
            raise LvflowError(f"z0: shape {z0.shape}, expected ({K},) (one entry per mode)")
        if np.any(z0 <= 0):
            raise LvflowError(f"z0: every entry must be positive, got min {z0.min():g}")
        e = float(np.max(z0))
        check_in_open_interval("z0: max entry (ε)", e, 0.0, 1.0)
        return e, z0 / e
    if init_std is not None:
        s = check_positive("init_std", init_std)
        if width is None:
            raise LvflowError("width: required with init_std (the number of neurons d; ε = d σ²)")
        eps = _positive_int("width", width) * s**2
        if not eps < 1:
            raise LvflowError(
                f"init_std: ε = width·σ² = {eps:g} must lie in (0, 1): the theory needs a small initialisation"
            )
    if eps is None:
        raise LvflowError("eps: required (or give z0, or init_std with width)")
    eps = check_in_open_interval("eps", eps, 0.0, 1.0)
    if c is None:
        return eps, np.ones(K)
    c = as_array("c", c, ndim=(0, 1))
    c = np.broadcast_to(c, (K,)).astype(np.float64) if c.ndim == 0 else c
    if c.shape != (K,):
        raise LvflowError(f"c: shape {c.shape}, expected ({K},)")
    if np.any(c <= 0):
        raise LvflowError(f"c: every entry must be positive, got min {c.min():g}")
    return eps, np.asarray(c, dtype=np.float64)
