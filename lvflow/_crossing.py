"""Switch-on crossings inside one accepted step: bisection on the step's interpolant (Thm 8)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

_BISECTION_STEPS = 60  # halves [0, 1] down to 1e-18: below float64 resolution of any step


def _hermite(ga, gb, da, db, s):
    """The cubic through `g(0) = ga`, `g(1) = gb` with slopes `da`, `db` (in units of the step), at `s`."""
    s2, s3 = s * s, s * s * s
    return (2 * s3 - 3 * s2 + 1) * ga + (s3 - 2 * s2 + s) * da + (3 * s2 - 2 * s3) * gb + (s3 - s2) * db


def _hermite_root(ga, gb, da, db):
    """The first `s ∈ [0, 1]` (up to bisection's resolution) where the Hermite cubic turns
    non-negative, given `ga < 0 ≤ gb`."""
    return _bisect(lambda s: _hermite(ga, gb, da, db, s), ga)


def _bisect(g, like):
    """A root of `g` on `[0, 1]` for every entry, given `g(0) < 0 ≤ g(1)`: bisection keeps the sign
    change bracketed, down to below float64 resolution of the step."""

    def step(_, lohi):
        lo, hi = lohi
        mid = (lo + hi) / 2
        up = g(mid) >= 0
        return jnp.where(up, lo, mid), jnp.where(up, mid, hi)

    lo, hi = jax.lax.fori_loop(0, _BISECTION_STEPS, step, (jnp.zeros_like(like), jnp.ones_like(like)))
    return (lo + hi) / 2
