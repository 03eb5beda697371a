"""`predict`'s validity horizon per configuration of a sweep (issue 31): for a configuration whose
system is an architecture on data, the horizon is read off the sweep's own evaluation of the
configuration (its curve and `z(t)`, `Group.horizon_points`) by `predict`'s own function for a
gLV reduced from an NQF (`predict._lv_horizon`: the probed times, `M(t) = P diag(z(t)) Pᵀ`, the
next term's ratio); every other configuration has NaN."""

from __future__ import annotations

import math

import numpy as np

from .._workflow.predict import _lv_horizon
from .._workflow.predict_horizon import HORIZON_FRACTION
from .._workflow.predict_inputs import beta_init
from .base import Init
from .families import Resolved, TableFamily, c_matrix

#: the horizon's columns (one scalar per configuration)
HORIZON_COLUMNS = ("horizon_t", "horizon_step", "horizon_floor_t")


def has_architectures(res: Resolved) -> bool:
    """Whether any configuration's system is an architecture on data (then every chunk of the sweep
    gets the `HORIZON_COLUMNS`)."""
    return any(
        isinstance(g.family, TableFamily) and any(s.source is not None for s in g.family.systems) for g in res.groups
    )


def _z0(res: Resolved, g: int, rows: np.ndarray) -> np.ndarray:
    """`z_k0 = ε c_k` for configurations `rows` of group `g`, shape `(B, K)`, as the evaluation's."""
    K = res.groups[g].family.K
    init = res.groups[g].init
    if init is Init.ARRAY:
        c = c_matrix(res, rows, K)
    elif init is Init.BETA:  # c_k = k^-β, as lvflow predict --beta
        c = np.stack([beta_init(float(b), K) for b in res.plan.column("beta")[rows]])
    else:
        c = np.ones((rows.size, K))
    return res.eps[rows, None] * c


def horizon_columns(
    res: Resolved, g: int, rows: np.ndarray, success: np.ndarray, path: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Per configuration `rows` of group `g`: `horizon_t` (`Prediction.horizon.t`: the first time
    Thm 13's next term reaches 10 % of the NQF's output along the predicted `M(t)`; inf: not within
    the prediction), `horizon_step` (`horizon_t/η`, NaN without a learning rate) and
    `horizon_floor_t` (the time the predicted loss reaches the NQF's floor, `PredictionHorizon.floor_t`).

    **Arguments:** `success` (the evaluation's, per configuration) and `path`, the evaluation's
    `ts`, `loss`, `excess_loss` (shape `(B, T)`) and `zs` (`(B, T, K)`), present for a group with
    `horizon_points`.

    NaN for a configuration that is not an architecture on data, for a network that is exactly its
    NQF (no horizon: its group has no `horizon_points`), and where the solve failed (`success`
    False). The network and its inputs are built once per system and width (`SystemInfo.network`).
    """
    out = {k: np.full(rows.size, np.nan) for k in HORIZON_COLUMNS}
    fam = res.groups[g].family
    if not isinstance(fam, TableFamily) or "zs" not in path:
        return out
    plan = res.plan
    z0 = _z0(res, g, rows)
    for j, row in enumerate(rows):
        info = fam.systems[int(res.local_system[row])]
        if info.source is None or not bool(success[j]):
            continue
        width = int(plan.column("width")[row]) if plan.has("width")[row] else None
        network, inputs = info.network(width)
        probe = (network, inputs, network.d, HORIZON_FRACTION)  # `predict`'s: the network's width is `width`
        ts, loss, excess, zs = (path[k][j] for k in ("ts", "loss", "excess_loss", "zs"))
        h = _lv_horizon(info.lv, probe, z0[j], ts, loss, excess, zs)
        if h is None:
            continue
        lr = float(plan.column("learning_rate")[row]) if plan.has("learning_rate")[row] else None
        out["horizon_t"][j] = h.t
        out["horizon_step"][j] = h.t / lr if lr else math.nan
        out["horizon_floor_t"][j] = h.floor_t
    return out
