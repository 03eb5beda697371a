"""One neuron's terms of the symmetric expansion beyond the NQF (Thm 13, Eq. 200/203): the order-`k`
Taylor term of a sum-form module's unit and the lowest order that does not vanish, which every
built-in architecture provides (`lvflow/architectures/_base.py`) and `next_order` reads. JAX and
numpy only: the architectures import it, and `_form/expansion.py` imports the architectures."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

#: the highest order `taylor_term` probes when it looks for the first term beyond the NQF
MAX_ORDER = 6


def taylor_term(unit, w: Float[ArrayLike, " p"], x, order: int) -> Float[Array, "*k"]:
    """One neuron's order-`k` term of Thm 13, `T_(k)(x)[w^{⊗k}] = (1/k!) dᵏ/dsᵏ unit(s w, x)|_{s=0}`.

    For a sum-form module `f_x(W) = Σ_i unit(w_i, x)` every partition of Eq. 200 with two or more
    distinct neurons has a zero derivative tensor, so the order-`k` part of `f_x(W)` is
    `Σ_i T_(k)(x)[w_i^{⊗k}]` (Eq. 203 with `λ = (k)`, `C_λ = 1`). Computed by `k` nested
    forward-mode derivatives along `w` (cost about `2ᵏ` forward passes).

    **Arguments:** `unit`: `unit(w, x)`; `w`: one neuron `(p,)`; `x`: one input; `order`: `k ≥ 0`.

    **Returns:** the term, shaped like `unit`'s output.
    """
    w = jnp.asarray(w)
    f = lambda s: unit(s * w, x)
    for _ in range(order):
        f = (lambda g: lambda s: jax.jvp(g, (s,), (jnp.ones_like(s),))[1])(f)
    return f(jnp.zeros((), dtype=w.dtype)) / math.factorial(order)


def probe_order(unit, x, p: int, *, seed: int = 0, rtol: float = 1e-9) -> int | None:
    """The lowest order `k ≥ 3` at which `unit`'s Taylor series at `w = 0` does not vanish (Thm 13),
    or `None` when it vanishes up to `MAX_ORDER` (an exactly quadratic unit).

    Probed at one random neuron `w` (fixed `seed`) and the input `x`: a coefficient counts as zero
    when it is below `rtol` times the largest of the orders 2..`MAX_ORDER`.
    """
    w = np.random.default_rng(seed).standard_normal(p) / math.sqrt(p)
    w = jnp.asarray(w)
    c = [float(np.max(np.abs(np.asarray(taylor_term(unit, w, x, k))), initial=0.0)) for k in range(2, MAX_ORDER + 1)]
    scale = max(c)
    for k, ck in zip(range(3, MAX_ORDER + 1), c[1:]):
        if ck > rtol * scale:
            return k
    return None
