"""`predict`'s validity horizon per configuration of a sweep (issue 31): for a configuration whose
system is an architecture on data, `predict` itself is called on the host with the configuration's
inputs, the network and its inputs (`Prediction.horizon`, `PredictionHorizon`), so the sweep's
horizon is `predict`'s by construction; every other configuration has NaN."""

from __future__ import annotations

import math

import jax
import numpy as np

from .._core.errors import LvflowError, SolverError
from .._workflow.predict import predict
from .._workflow.predict_data import architecture_network
from .._workflow.predict_inputs import beta_init
from .base import Init
from .families import Resolved, TableFamily, _load_vector

#: the horizon's columns (one scalar per configuration)
HORIZON_COLUMNS = ("horizon_t", "horizon_step", "horizon_floor_t")

#: the configuration's parameters passed to `predict` as they are (the initial scale apart)
_AS_GIVEN = ("learning_rate", "rho", "t1", "num_points", "rtol", "atol", "init_std", "width", "eps")
_INTS = ("num_points", "width")


def has_architectures(res: Resolved) -> bool:
    """Whether any configuration's system is an architecture on data (then every chunk of the sweep
    gets the `HORIZON_COLUMNS`)."""
    return any(
        isinstance(g.family, TableFamily) and any(s.source is not None for s in g.family.systems) for g in res.groups
    )


def _predict_kwargs(res: Resolved, row: int) -> dict:
    """`predict`'s keyword arguments for configuration `row`, as the configuration gives them."""
    plan = res.plan
    kw = {}
    for name in _AS_GIVEN:
        if plan.has(name)[row]:
            v = plan.column(name)[row]
            kw[name] = int(v) if name in _INTS else float(v)
    for name in ("c", "z0"):
        if plan.has(name)[row]:
            j = int(plan.column(name)[row])
            v = plan.objects[name][j]
            kw[name] = _load_vector(name, v, f"{name} {v}" if isinstance(v, str) else f"{name}[{j}]")
    if res.groups[int(res.group_of[row])].init is Init.BETA:  # c_k = k^-β, as lvflow predict --beta
        kw["c"] = beta_init(float(plan.column("beta")[row]), int(res.K[row]))
    return kw


def horizon_columns(res: Resolved, g: int, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Per configuration `rows` of group `g`: `horizon_t` (`Prediction.horizon.t`: the first time
    Thm 13's next term reaches 10 % of the NQF's output along the predicted `M(t)`; inf: not within
    the prediction), `horizon_step` (`horizon_t/η`, NaN without a learning rate) and
    `horizon_floor_t` (the time the predicted loss reaches the NQF's floor, `PredictionHorizon.floor_t`).
    NaN for a configuration that is not an architecture on data, for a network that is exactly its
    NQF (no horizon), and where `predict` refuses the configuration (the sweep's row says why: its
    `success`). The network and its inputs are built once per system and width
    (`SystemInfo.networks`).
    """
    out = {k: np.full(rows.size, np.nan) for k in HORIZON_COLUMNS}
    fam = res.groups[g].family
    if not isinstance(fam, TableFamily):
        return out
    for j, row in enumerate(rows):
        info = fam.systems[int(res.local_system[row])]
        if info.source is None:
            continue
        architecture, arrays, kernel, value_size, nqf = info.source
        kw = _predict_kwargs(res, int(row))
        width = kw.get("width")
        if width not in info.networks:
            info.networks[width] = architecture_network(
                architecture, arrays, kernel=kernel, value_size=value_size, width=width
            )
        network, inputs = info.networks[width]
        if network.next_order(jax.tree_util.tree_map(lambda a: np.asarray(a)[0], inputs)) is None:
            continue  # exactly its NQF: predict reports no horizon (and is not called)
        try:
            h = predict(nqf, network=network, inputs=inputs, **kw).horizon
        except (LvflowError, SolverError):
            continue
        if h is None:
            continue
        lr = kw.get("learning_rate")
        out["horizon_t"][j] = h.t
        out["horizon_step"][j] = h.t / lr if lr else math.nan
        out["horizon_floor_t"][j] = h.floor_t
    return out
