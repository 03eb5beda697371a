"""What `predict` starts from: a gLV system (Eq. 32) built from named arrays or a power-law
spectrum (Thm 9), and the initial scale `z_k(0) = ε c_k` (Thm 8)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from .._core.errors import LvflowError, NotPSDError, SymmetryError
from .._core.memory import check_memory, curve_bytes
from .._core.validate import as_array, check_in_open_interval, check_positive, check_positive_int, check_psd
from .._glv.lv import AbstractLotkaVolterra, LotkaVolterra, LowRankLotkaVolterra
from .spec import Configurations, check_initial_scale

if TYPE_CHECKING:
    import jax

_positive_int = check_positive_int


def lv_from_arrays(arrays: Mapping[str, Any], *, name: str = "system") -> LotkaVolterra | LowRankLotkaVolterra:
    """A gLV system from named arrays: `r` and `C`, or `zeta` and `V`; optionally `y2`.

    With `zeta` and `V` (the rates and loss drops of independent modes, Thm 6) the system is
    diagonal with `r_k = ζ_k` and `C_kk = ζ_k² / (8 V_k)`, so that `V_k = r_k²/(8 C_kk)`, held as
    its diagonal (`O(K)`). An unnamed array (an `.npy` or a header-less `.csv`) of shape `(K, K+1)`
    is read as the columns `[r | C]`. `y2 = (1/m) Σ y_μ²` (the loss at `z = 0`, `≥ 0`) is one
    number; a CSV column `y2` (which the CSV reader files under `y`) holds it in every row.

    **Raises:** `LvflowError` naming `name` and the problem (missing, unexpected or doubly given
    keys, no modes, shapes, NaN/inf, `V ≤ 0`, `y2 < 0` or not one number, plateaus `r_k/C_kk`
    or loss drops `V_k = r_k²/(8 C_kk)` (and their sum, the loss's scale) beyond float64);
    `SymmetryError` / `NotPSDError` when `C` is not symmetric PSD.
    """
    keys = {k.lower(): k for k in arrays}
    lv = _lv_from_keys(arrays, keys, name)
    if lv.K == 0:
        raise LvflowError(f"{name}: the system has no modes (r is empty)")
    r, Ckk = np.asarray(lv.r), np.asarray(lv.C_diagonal)
    with np.errstate(divide="ignore", over="ignore"):
        plateau = np.where((r > 0) & (Ckk > 0), r / np.where(Ckk > 0, Ckk, 1.0), 0.0)
    if not np.all(np.isfinite(plateau)):
        k = int(np.flatnonzero(~np.isfinite(plateau))[0])
        raise LvflowError(
            f"{name}: mode {k + 1}'s plateau z_k = r_k/C_kk = {r[k]:.3g}/{Ckk[k]:.3g} overflows float64; "
            "rescale r and C (the loss is then too large to represent)"
        )
    check_drops_finite(name, r, Ckk)
    return lv


def check_drops_finite(name: str, r: np.ndarray, Ckk: np.ndarray) -> None:
    """Refuse a system whose loss drops `V_k = r_k²/(8 C_kk)` overflow float64, or whose loss
    (`Σ_k V_k`, and `8 V_k = C_kk z_k²` on the plateaus, summed while the curve is computed) does.

    **Raises:** `LvflowError` naming `name`, the first mode to blame and its `r_k`, `C_kk`.
    """
    grow = (r > 0) & (Ckk > 0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        V = np.where(grow, r**2 / (8 * np.where(grow, Ckk, 1.0)), 0.0)
        total = 16 * np.sum(V)
    if np.all(np.isfinite(V)) and np.isfinite(total):
        return
    bad = np.flatnonzero(~np.isfinite(V))
    k = int(bad[0]) if bad.size else int(np.argmax(V))
    what = "overflows float64" if bad.size else "is too close to float64's largest number for the loss's sums"
    raise LvflowError(
        f"{name}: mode {k + 1}'s loss drop V_k = r_k²/(8 C_kk) with r_k = {r[k]:.3g}, C_kk = {Ckk[k]:.3g} {what}; "
        "rescale r and C (divide r by a factor s and C by s: the same dynamics in time units of 1/s)"
    )


def _lv_from_keys(arrays: Mapping[str, Any], keys: dict[str, str], name: str) -> LotkaVolterra | LowRankLotkaVolterra:
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
        if np.any(zeta == 0):
            k = int(np.flatnonzero(zeta == 0)[0])
            raise LvflowError(f"{name}: zeta_{k + 1} = 0 with V_{k + 1} > 0; a mode with zeta = 0 drops no loss")
        with np.errstate(over="ignore", under="ignore"):
            d = zeta**2 / (8 * V)
        if np.any(d <= 0) or not np.all(np.isfinite(d)):
            raise LvflowError(f"{name}: C_kk = zeta_k²/(8 V_k) leaves float64's range; rescale zeta and V")
        return LowRankLotkaVolterra(zeta, d, np.zeros((zeta.shape[0], 0)), y2=y2)
    raise LvflowError(f"{name}: expected arrays 'r' and 'C', or 'zeta' and 'V'; found {sorted(arrays) or 'none'}")


def _y2(name: str, arrays: Mapping[str, Any], keys: dict) -> float:
    """`y2` from the key `y2`, or from `y` (a CSV column `y2`): one value, repeated in a column; 0 if absent."""
    k = keys.get("y2", keys.get("y"))
    if k is None:
        return 0.0
    if "y2" in keys and "y" in keys:
        raise LvflowError(f"{name}: holds both y2 and y; give y2 once")
    v = as_array(f"{name}: y2", arrays[k], ndim=(0, 1)).reshape(-1)
    if "y2" in keys and v.size != 1:
        raise LvflowError(f"{name}: y2 must be one number (the mean squared target), got shape {v.shape}")
    if v.size == 0 or np.any(v != v[0]):
        raise LvflowError(f"{name}: y2 must be one number (the same in every CSV row), got {v[:4].tolist()}")
    if v[0] < 0:
        raise LvflowError(f"{name}: y2 must be ≥ 0 (the mean of the squared targets), got {v[0]:g}")
    return float(v[0])


def _check_C(name: str, C: np.ndarray | jax.Array) -> None:
    # Same checks as `LotkaVolterra`, re-labelled with the input's name for the CLI's one line.
    try:
        check_psd("C", C)
    except (NotPSDError, SymmetryError) as e:
        raise type(e)(f"{name}: {e}") from None


def power_law_lv(*, alpha1: float, alpha2: float, modes: int) -> LowRankLotkaVolterra:
    """Independent modes with a power-law spectrum (Thm 9): `ζ_k = r_k = k^{−α₂}`,
    `V_k = k^{−α₁}`, hence `C_kk = r_k² / (8 V_k) = k^{α₁ − 2α₂} / 8`, `k = 1..modes`.

    The excess loss then falls as `E(τ) = Θ(τ^{−(α₁−1)/α₂})` for `α₁ > 1` (Thm 9). `C` is held as
    its diagonal (a `LowRankLotkaVolterra` with no low-rank columns): `O(K)` memory and time.

    **Raises:** `LvflowError` naming `alpha1`/`alpha2` when `r_k`, `V_k` or `C_kk` leave float64's
    normal range (computed as `exp(−α ln k)`, so the message is not an overflow warning), naming
    `modes` when this machine lacks the memory for that many modes (`check_memory`).
    """
    a1 = float(as_array("alpha1", alpha1, ndim=0))
    a2 = check_positive("alpha2", alpha2)
    K = _positive_int("modes", modes)
    check_memory("modes", curve_bytes(K, 2), f"a power-law spectrum of {K} modes")
    lk = np.log(np.arange(1, K + 1, dtype=np.float64))
    limit = math.log(np.finfo(np.float64).tiny)  # −708.4: below it a value is subnormal, then 0
    for name, a, what in (("alpha2", a2, "r_k = k^-alpha2"), ("alpha1", a1, "V_k = k^-alpha1")):
        if abs(a) * lk[-1] > -limit:
            raise LvflowError(
                f"{name}: {what} leaves float64's range at k = {K} (|{name}| ln K = {abs(a) * lk[-1]:.4g} > 708); "
                f"use fewer modes or a smaller |{name}|"
            )
    lC = (a1 - 2 * a2) * lk - math.log(8.0)
    if np.max(np.abs(lC)) > -limit:
        raise LvflowError(
            f"alpha1: C_kk = k^(alpha1 - 2 alpha2)/8 leaves float64's range at k = {K}; "
            "use fewer modes or alpha1 closer to 2 alpha2"
        )
    return LowRankLotkaVolterra(np.exp(-a2 * lk), np.exp(lC), np.zeros((K, 0)))


def check_curve_memory(K: int, num_points: int, *, modes_name: str = "modes") -> None:
    """Refuse, before the solve, a prediction whose curve (`2·num_points − 1` samples of every
    one of `K` modes) needs more memory than this machine has available (`check_memory`).

    **Arguments:**

    - `K`: the system's modes (an `NQF`'s: its neurons' count, or 1 when not known yet).
    - `num_points`: `predict`'s `num_points`.
    - `modes_name`: the input that set `K` (`"modes"`, `"--system"`), named when the modes
      rather than the curve's length are to blame.

    **Raises:** `LvflowError` `"num_points: a curve of … needs about N GiB, this machine has M GiB
    available"` (or naming `modes_name` when `num_points` is at most predict's default, 400).
    """
    K, n = int(K), int(num_points)
    if n < 2 or K < 1:
        return  # `predict` names these
    name = "num_points" if n > 400 else modes_name
    check_memory(name, curve_bytes(K, n), f"a curve of {2 * n - 1} samples of {K} mode{'s' * (K != 1)}")


def check_below_plateau(lv: AbstractLotkaVolterra, eps, c, *, name: str = "c") -> None:
    """Refuse initial values at or above a growing mode's plateau: `C_kk ε c_k ≥ r_k` (the theory
    is about small initialisation, Thm 8), naming `name`, the input that set `c`.

    **Raises:** `LvflowError` naming `name` (and not `eps` when `c` is to blame).
    """
    eps, c = float(eps), np.asarray(c, dtype=np.float64)
    if not (0 < eps < 1) or c.shape not in ((), (lv.K,)) or not np.all(np.isfinite(c) & (c > 0)):
        return  # `initial_scale` names these
    c = np.broadcast_to(c, (lv.K,))
    r, Ckk = np.asarray(lv.r), np.asarray(lv.C_diagonal)
    with np.errstate(over="ignore"):
        start = Ckk * eps * c
    bad = np.flatnonzero((r > 0) & (start >= r))
    if bad.size:
        k = int(bad[0])
        raise LvflowError(
            f"{name}: mode {k + 1} starts at or above its plateau (C_kk eps c_k = {start[k]:.3g} ≥ r_k = {r[k]:.3g}, "
            f"c_k = {c[k]:.3g}); the theory describes small initialisation"
        )


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
    if K == 0:
        raise LvflowError("system: has no modes (K = 0), so there is nothing to predict")
    check_initial_scale(Configurations.one({"eps": eps, "c": c, "z0": z0, "init_std": init_std, "width": width}))
    if z0 is not None:
        z0 = as_array("z0", z0, ndim=1)
        if z0.shape != (K,):
            raise LvflowError(f"z0: shape {z0.shape}, expected ({K},) (one entry per mode)")
        if np.any(z0 <= 0):
            raise LvflowError(f"z0: every entry must be positive, got min {z0.min():g}")
        e = float(np.max(z0))
        check_in_open_interval("z0: max entry (ε)", e, 0.0, 1.0)
        return e, np.asarray(z0, dtype=np.float64) / e
    if init_std is not None:
        s = check_positive("init_std", init_std)
        eps = _positive_int("width", width) * s**2
        if not eps < 1:
            raise LvflowError(
                f"init_std: ε = width·σ² = {eps:g} must lie in (0, 1): the theory needs a small initialisation"
            )
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


def beta_init(beta: float, K: int) -> np.ndarray:
    """Thm 9's initialisation `c_k = k^{−β}`, `k = 1…K` (float64; `0` or `inf` where it leaves
    float64's range, for the caller to refuse)."""
    with np.errstate(over="ignore"):
        return np.exp(-float(beta) * np.log(np.arange(1, int(K) + 1, dtype=float)))
