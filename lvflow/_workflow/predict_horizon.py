"""`predict`'s validity horizon: how far along the predicted trajectory the NQF describes the
network, from the size of Thm 13's next term (Eq. 200/203) relative to the NQF's output
(`lvflow.nqf_horizon`'s output ratio, on a coarse grid of the predicted `M(t)`)."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, Float

from .._core.errors import LvflowError
from .._core.programs import persistent_jit
from .._core.validate import to_jax
from .._form.expansion import _base_network, _batch, _first_crossing, _quadratic_terms, horizon_ratio
from .._form.nqf import NQF

#: the fraction of the NQF's output at which Thm 13's next term ends the validity horizon, by
#: default (`predict`'s `horizon_fraction`, the sweep's horizon columns)
HORIZON_FRACTION = 0.1
#: at most this many times of the predicted curve are probed (each costs an eigendecomposition of
#: `M`, the most of the horizon's cost: see `benchmarks/README.md`)
GRID_POINTS = 16
#: the probed stretch starts where the predicted loss has fallen by this fraction of its whole fall,
#: and the loss "reaches the floor" where its excess is below this fraction of the initial excess
_FALL = 0.01
#: `check_network` compares the network's quadratic form with the NQF's on this many samples
_CHECKED = 16


class PredictionHorizon(eqx.Module):
    """The validity horizon of a prediction: up to when the NQF describes the network.

    Along the predicted `M(t)`, `ratio` is the RMS (over samples and outputs) of Thm 13's next term
    (Eq. 200, order `order` in the weights, from `width` representative neurons with `W Wᵀ = M`,
    `lvflow.representative_neurons`) over the RMS of the NQF's output `Tr[M A(x_μ)]`
    (`lvflow.nqf_horizon`'s output ratio). `t` is the first probed time at which it reaches
    `fraction` (log-linear interpolation), `inf` when it stays below within the prediction.

    The ratio is probed at up to 16 times of the predicted curve, log-spaced from where the loss has
    fallen by 1 % of its whole fall to the end (`times`): before that, on the initial plateau, both
    outputs are far below the targets and their ratio says nothing about the loss (at `M0 = ε I` an
    MLP's NQF output is exactly 0).

    **Fields:** `fraction`, `order`, `width`, `t`, `times`, `ratio` (as above); `floor_t`: the first
    time the predicted loss is within 1 % of its initial excess over the NQF's floor (the least
    loss over its features, or the gLV's saturated equilibrium), `inf` if it never is, NaN when the
    floor is not known.
    """

    fraction: float = eqx.field(static=True)
    order: int = eqx.field(static=True)
    width: int = eqx.field(static=True)
    t: float = eqx.field(static=True)
    floor_t: float = eqx.field(static=True)
    times: Float[Array, " G"]
    ratio: Float[Array, " G"]


def check_network(system, network, inputs):
    """The sum-form `network` and the batch `inputs` checked against the NQF `system` they claim to
    have built: the same neuron size `p`, one input per sample, and the same quadratic output
    `Tr[M A(x_μ)]` at a random `M` on the first 16 samples.

    **Raises:** `LvflowError` naming `network` or `inputs`.
    """
    if inputs is None:
        raise LvflowError("inputs: required with network= (the inputs x_μ the NQF was built from, samples on axis 0)")
    if not isinstance(system, NQF):
        raise LvflowError(
            f"network: only for an NQF system (the network's NQF), got a {type(system).__name__}; a gLV has no network"
        )
    network = _base_network(network)
    X = _batch(inputs)
    m = jax.tree_util.tree_leaves(X)[0].shape[0]
    if m != system.m:
        raise LvflowError(f"inputs: {m} samples, but the NQF has {system.m}")
    if network.p != system.p:
        raise LvflowError(f"network: neuron size p = {network.p}, but the NQF's M is {system.p}×{system.p}")
    G = np.random.default_rng(0).standard_normal((system.p, system.p)) / math.sqrt(system.p)
    net, few = eqx.tree_at(lambda n: n.W, network, to_jax(G)), min(m, _CHECKED)
    first = jax.tree_util.tree_map(lambda a: to_jax(np.asarray(a)[:few]), X)  # sliced in numpy: nothing compiled
    try:  # one compiled program (eager, its ~20 primitives would each compile one)
        mine, theirs = (np.asarray(a) for a in _both_outputs(net, first, system, to_jax(G @ G.T)))
    except (TypeError, ValueError) as e:
        raise LvflowError(f"inputs: the network cannot evaluate them ({e})") from None
    theirs = theirs[:few]
    if mine.shape != theirs.shape:
        raise LvflowError(f"network: output shape {mine.shape[1:]} per sample, the NQF's is {theirs.shape[1:]}")
    err = float(np.max(np.abs(mine - theirs), initial=0.0))
    if not err <= 1e-6 * max(float(np.max(np.abs(theirs), initial=0.0)), 1e-300):
        raise LvflowError(
            f"network: its quadratic form on inputs differs from the NQF's (max |difference| {err:.3g}); pass the "
            "network and the inputs the NQF was built from"
        )
    return network, X


@persistent_jit
def _both_outputs(network, X, system, M):
    """The network's NQF output for each sample of `X` (`_quadratic_terms`), and the NQF's quadratic
    output `Tr[M A_μ]` (Eq. 2) for every sample of the system's data: one compiled program."""
    return _quadratic_terms(network, X), system.predict(M) - system.f0


def probe_indices(ts, loss) -> np.ndarray:
    """Up to `GRID_POINTS` indices into the curve `(ts, loss)`, log-spaced in time from where the loss
    has fallen by 1 % of its whole fall (`L(0) − min L`) to the end; empty when it does not fall."""
    ts, loss = np.asarray(ts, dtype=float), np.asarray(loss, dtype=float)
    fall = loss[0] - np.min(loss)
    if not (np.isfinite(fall) and fall > 0):
        return np.zeros(0, dtype=int)
    start = int(np.flatnonzero(loss[0] - loss >= _FALL * fall)[0])
    t0 = max(ts[start], ts[ts > 0][0])
    want = np.geomspace(t0, ts[-1], GRID_POINTS) if ts[-1] > t0 else np.array([t0])
    idx = np.unique(np.clip(np.searchsorted(ts, want), start, ts.size - 1))
    return idx


def floor_time(ts, excess, known: bool) -> float:
    """The first time `excess` is within 1 % of its initial value (`inf`: never; NaN: floor unknown)."""
    if not known:
        return math.nan
    excess = np.asarray(excess, dtype=float)
    hit = np.flatnonzero(excess <= _FALL * excess[0])
    return float(np.asarray(ts)[hit[0]]) if hit.size and excess[0] > 0 else math.inf


def prediction_horizon(network, X, ts, Ms, *, width: int, fraction: float, floor_t: float) -> PredictionHorizon | None:
    """The horizon along the predicted `M` at times `ts` (`PredictionHorizon`), `None` for a network
    that is exactly its NQF (no next term in Thm 13's expansion)."""
    order = network.next_order(jax.tree_util.tree_map(lambda a: np.asarray(a)[0], X))
    if order is None:
        return None
    ts = np.asarray(ts, dtype=float)
    ratio = np.zeros(0)
    if ts.size:  # padded to GRID_POINTS times (the last repeated): one compilation per network and data
        Ms = np.asarray(Ms)
        pad = np.concatenate([Ms, np.repeat(Ms[-1:], max(GRID_POINTS - ts.size, 0), axis=0)])
        ratio = horizon_ratio(network, X, pad, order=order, width=width)[: ts.size]
    t = _first_crossing(ts, ratio, fraction, log=True)[1] if ts.size else math.inf
    return PredictionHorizon(
        fraction=float(fraction),
        order=int(order),
        width=int(width),
        t=float(t),
        floor_t=float(floor_t),
        times=to_jax(ts),  # copies, no conversion program compiled
        ratio=to_jax(ratio),
    )


def horizon_line(h: PredictionHorizon, learning_rate: float | None) -> str:
    """The report's line: up to when the NQF describes the network, and whether the floor comes first."""
    unit = (lambda t: f"step {t / learning_rate:.4g}") if learning_rate else (lambda t: f"t = {t:.4g}")
    why = (
        f"Thm 13's next term, of order {h.order} in the weights, reaches {100 * h.fraction:g} % of the NQF's output"
        f" at width {h.width}: an early warning, see docs/howto/trust.md"
    )
    if math.isfinite(h.t):
        line = f"the NQF describes this network up to about {unit(h.t)} ({why})"
    else:
        end = unit(float(np.asarray(h.times)[-1])) if h.times.shape[0] else "the end"
        line = (
            f"no validity horizon within the prediction: Thm 13's next term, of order {h.order} in the weights, stays "
            f"below {100 * h.fraction:g} % of the NQF's output up to its end ({end}) at width {h.width}"
        )
    if math.isnan(h.floor_t):
        return line
    if not math.isfinite(h.floor_t):
        return line + "; the predicted loss does not reach the NQF's floor"
    if not math.isfinite(h.t):
        return line + (
            f"; the predicted loss reaches the NQF's floor at {unit(h.floor_t)}: past it the network itself may keep "
            "learning below the floor, which the prediction does not describe"
        )
    if h.floor_t < h.t:
        return line + (
            f"; the predicted loss reaches the NQF's floor first, at {unit(h.floor_t)}: past it the network itself "
            "may keep learning below the floor, which the prediction does not describe"
        )
    return line + f"; the predicted loss reaches the NQF's floor after the horizon, at {unit(h.floor_t)}"
