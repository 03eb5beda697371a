"""How closely a network follows its NQF: recovered singular values and history comparisons (Fig 2)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._core.errors import LvflowError


def recovered_singular_values(teacher, source) -> Float[Array, "*n r"]:
    """`ŝ_j = u_jᵀ Θ̂ v_j`: the teacher's singular directions read off a model's learned map.

    `Θ̂` is the least-squares fit of the model's outputs on the teacher's inputs by the
    architecture's linear features (`LowRankTeacher`), so a network and its NQF twin are
    measured the same way, from outputs only.

    **Arguments:**

    - `teacher`: a `LowRankTeacher` (`lvflow.low_rank_teacher`).
    - `source`: a model (callable on one input), or its outputs on `teacher.X`, shape
      `(m, [k])` or with leading time axes `(n, m, [k])`.

    **Returns:** `ŝ`, shape `(r,)` or `(n, r)`. On the teacher's own labels it is `s`.
    """
    if callable(source):
        return teacher.recovered(source)
    out = jnp.asarray(source)
    want = tuple(teacher.y.shape)
    if tuple(out.shape[-len(want) :]) != want:
        raise LvflowError(
            f"source: outputs of shape {tuple(out.shape)} do not end with the teacher's label shape {want}"
        )
    return teacher.singular_values(out)


class Agreement(eqx.Module):
    """Distance between two training histories recorded at the same steps.

    - `sv_gap`: `max_{t,k} |ŝ_k¹(t)/s_k − ŝ_k²(t)/s_k|` (NaN when no `ŝ` was compared).
    - `sv_gap_per_mode`: `max_t` of the same, per mode `k`.
    - `sv_gap_t`: `max_k` of the same, per recorded step.
    - `loss_gap`: `max_t |L¹(t) − L²(t)| / max(L¹(0), L²(0))` (relative to the initial loss).
    - `loss_gap_t`: the same per recorded step.
    - `final_loss`: `(L¹, L²)` at the last step.
    """

    sv_gap: Float[Array, ""]
    sv_gap_per_mode: Float[Array, " r"] | None
    sv_gap_t: Float[Array, " n"] | None
    loss_gap: Float[Array, ""]
    loss_gap_t: Float[Array, " n"]
    final_loss: tuple


def _s_hat(h, extra):
    ex = h.extras
    if isinstance(ex, dict):
        if extra not in ex:
            raise LvflowError(f"extra: history has no recorded {extra!r} (recorded: {sorted(ex)})")
        ex = ex[extra]
    if ex is None:
        raise LvflowError("h1, h2: no ŝ recorded; train with record=teacher.recovered (or a dict holding it)")
    return jnp.asarray(ex)


def compare_histories(h1, h2, *, s=None, extra: str = "s_hat") -> Agreement:
    """Compare two `TrainHistory`s (typically a network and its NQF twin) step by step.

    **Arguments:**

    - `h1`, `h2`: histories recorded at the same steps.
    - `s`: teacher singular values `(r,)`; then the recovered `ŝ` (each history's `extras`,
      or `extras[extra]` when a dict was recorded) are compared as `ŝ_k/s_k`.
    - `extra`: the key of `ŝ` in a dict of extras.
    """
    st1, st2 = np.asarray(h1.steps), np.asarray(h2.steps)
    if st1.shape != st2.shape or not np.array_equal(st1, st2):
        raise LvflowError(f"h2: recorded at different steps than h1 ({st1.shape[0]} vs {st2.shape[0]} records)")
    L1, L2 = jnp.asarray(h1.loss), jnp.asarray(h2.loss)
    scale = jnp.maximum(jnp.maximum(L1[0], L2[0]), jnp.finfo(L1.dtype).tiny)
    loss_gap_t = jnp.abs(L1 - L2) / scale
    if s is None:
        gap, per_mode, gap_t = jnp.asarray(jnp.nan), None, None
    else:
        s = jnp.asarray(s)
        a, b = _s_hat(h1, extra), _s_hat(h2, extra)
        if a.shape != b.shape or a.shape[-1] != s.shape[0]:
            raise LvflowError(f"s: {s.shape[0]} singular values, but recorded ŝ have shapes {a.shape} and {b.shape}")
        diff = jnp.abs(a - b) / jnp.broadcast_to(s, a.shape)
        gap, per_mode, gap_t = jnp.max(diff), jnp.max(diff, axis=0), jnp.max(diff, axis=1)
    return Agreement(
        sv_gap=gap,
        sv_gap_per_mode=per_mode,
        sv_gap_t=gap_t,
        loss_gap=jnp.max(loss_gap_t),
        loss_gap_t=loss_gap_t,
        final_loss=(L1[-1], L2[-1]),
    )
