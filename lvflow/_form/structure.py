"""Structure matrices by automatic differentiation (Thm 1, Eq. 2; Thm 12, Eq. 196)."""

from __future__ import annotations

from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._core.errors import LvflowError, SymmetryError, ZGZError
from .._core.validate import check_positive_int, fail_if


def _max_abs(*arrays) -> Float[Array, ""]:
    """`max |a|` over the entries of `arrays` (0 when they are all empty)."""
    return jnp.max(jnp.stack([jnp.zeros(())] + [jnp.max(jnp.abs(a)) for a in arrays if jnp.size(a)]))


def structure_matrix(
    unit: Callable,
    x,
    p: int,
    *,
    batched: bool = False,
    atol: float = 1e-10,
) -> Float[Array, "... p p"]:
    """The structure matrix `A(x) = ½ ∇²_w unit(w, x) |_{w=0}` of a sum-form module (Eq. 2).

    A module `f_x(W) = Σ_i unit(w_i, x)` with `d` interchangeable neurons `w_i ∈ R^p` is, near
    `W = 0`, the neural quadratic form `f_x(0) + Tr[W Wᵀ A(x)]` (Thm 1), provided each unit
    has zero gradient at zero (ZGZ).

    **Arguments:**

    - `unit`: `unit(w, x)` for one neuron `w` of shape `(p,)`; returns a scalar, or a vector of
      `k` outputs (Cor. 1: one `A⁽ᶜ⁾` per output).
    - `x`: one input, or a batch of inputs stacked on axis 0 when `batched=True` (vmapped).
    - `p`: the neuron size.
    - `batched`: whether `x` carries a leading sample axis.
    - `atol`: tolerance of the ZGZ and `unit(0, x) = 0` checks, relative to `max(1, |A|)`.

    **Returns:** `A` of shape `(p, p)`, `(k, p, p)`, or with a leading `(m,)` when batched.

    **Raises:** `ZGZError` when `∇_w unit(0, x) ≠ 0` (a bias, or `φ(0) ≠ 0`), naming the gradient
    norm; `LvflowError` when `unit(0, x) ≠ 0`, when `unit` is not twice differentiable at `w = 0`
    (`relu(w·x)²`: its Hessian jumps there), when `unit` cannot be evaluated at `w` of shape `(p,)`
    and `x` (`p` not the neuron size), for complex `x`, or when `p` is not a positive integer.
    """
    check_positive_int("p", p, what="the neuron size")
    for leaf in jax.tree_util.tree_leaves(x):
        if np.iscomplexobj(leaf):  # reads the dtype: traced or not
            raise LvflowError(f"x: complex values are not supported (dtype {jnp.result_type(leaf)})")
    try:
        A, finite, gnorm, f0max, scale = _derivatives_at_zero(unit, x, p, batched)
    except (TypeError, ValueError) as e:
        shapes = [np.shape(leaf) for leaf in jax.tree_util.tree_leaves(x)]
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LvflowError(
            f"unit: cannot be evaluated at a neuron w of shape ({p},) and x of shape "
            f"{shapes[0] if len(shapes) == 1 else shapes}{' (batched)' if batched else ''}: {first}; "
            "is p the neuron size?"
        ) from None
    A = fail_if(A, ~finite, "unit: its Hessian at w = 0 is not finite")
    # `~(a <= b)` so that a NaN gradient fails the check instead of passing it.
    A = fail_if(
        A,
        ~(gnorm <= atol * scale),
        "unit: violates ZGZ (zero gradient at zero): ∇_w unit(0, x) ≠ 0; a bias term or an activation with "
        "φ(0) ≠ 0 breaks the NQF expansion (Thm 1)",
        detail=lambda: (
            f"unit: violates ZGZ (zero gradient at zero): max |∇_w unit(0, x)| = {float(gnorm):.3g}; "
            "a bias term or an activation with φ(0) ≠ 0 breaks the NQF expansion (Thm 1)"
        ),
        error=ZGZError,
    )
    A = fail_if(
        A,
        ~(f0max <= atol * scale),
        "unit: unit(0, x) ≠ 0; a sum-form unit must vanish at w = 0",
        detail=lambda: f"unit: unit(0, x) = {float(f0max):.3g} ≠ 0; a sum-form unit must vanish at w = 0",
    )
    return _check_twice_differentiable(unit, x, p, batched, A)


def _check_twice_differentiable(unit, x, p, batched, A):
    """Thm 1's `A(x) = ½∇²unit(0, x)` needs `unit` twice continuously differentiable at `w = 0`;
    autodiff returns *a* number at a kink (`relu(w·x)²`: 0, or half the one-sided values), so
    compare the Hessians at `w = ±δv` (a fixed direction `v`) with each other and with `2A`, at two
    radii `δ` 1000× apart: for a `C²` unit the gap shrinks with `δ`, at a kink it stays.

    **Returns:** `A`, carrying the check when traced.

    **Raises:** `LvflowError` naming the jump.
    """
    v = np.random.default_rng(0).standard_normal(p)
    gap_far, gap_near, scale = _hessian_gaps(unit, x, jnp.asarray(v / np.linalg.norm(v)), batched, A)
    return fail_if(
        A,
        (gap_near > 1e-6 * scale) & (gap_near > 0.5 * gap_far),
        "unit: not twice differentiable at w = 0 (its Hessian jumps across w = 0; e.g. relu(w·x)²): "
        "A(x) = ½∇²unit(0, x) (Eq. 2) is undefined; use a smooth unit",
        detail=lambda: (
            f"unit: not twice differentiable at w = 0 (its Hessian jumps by {float(gap_near):.3g}, "
            f"scale {float(scale):.3g}, across w = 0; e.g. relu(w·x)²): A(x) = ½∇²unit(0, x) (Eq. 2) is undefined; "
            "use a smooth unit"
        ),
    )


@eqx.filter_jit
def _hessian_gaps(unit, x, v, batched, A):
    """`(gap at δ = 1e-4, gap at δ = 1e-7, scale)`: the gap is the largest entry of `H(δv) − H(−δv)`
    and of `H(δv) + H(−δv) − 4A`, the scale the largest of `2A` and the Hessians; `w·x` moves by
    about `δ` whatever the scale of `x` (`v` is divided by `max(1, max |x|)`)."""
    xs = [jnp.max(jnp.abs(jnp.asarray(leaf, dtype=float))) for leaf in jax.tree_util.tree_leaves(x) if jnp.size(leaf)]
    v = v / jnp.nanmax(jnp.stack([jnp.ones(()), *xs]))
    A2 = 2 * A
    scale, gaps = _max_abs(A2), []
    for delta in (1e-4, 1e-7):
        Hp, Hm = _hessians_at(unit, x, delta * v, batched)
        scale = jnp.maximum(scale, _max_abs(Hp, Hm))
        gaps.append(jnp.maximum(_max_abs(Hp - Hm), _max_abs(Hp + Hm - 2 * A2)) if A2.size else jnp.zeros(()))
    return gaps[0], gaps[1], scale


@eqx.filter_jit
def _hessians_at(unit, x, v, batched):
    """The symmetrised Hessians of `unit` at `w = v` and `w = −v`."""

    def one(xi):
        h = jax.hessian(unit)
        sym = lambda a: 0.5 * (a + jnp.swapaxes(a, -1, -2))
        return sym(h(v, xi)), sym(h(-v, xi))

    return jax.vmap(one)(x) if batched else one(x)


@eqx.filter_jit
def _derivatives_at_zero(unit, x, p, batched):
    """`(A, whether A is finite, max |∇unit(0, x)|, max |unit(0, x)|, max(1, max |A|))`."""
    # filter_jit caches on the unit's identity and shapes, so repeated calls do not recompile.
    w0 = jnp.zeros((p,))

    def one(xi):
        f0 = unit(w0, xi)
        g = jax.jacfwd(unit)(w0, xi)
        h = jax.hessian(unit)(w0, xi)
        return f0, g, 0.25 * (h + jnp.swapaxes(h, -1, -2))

    f0, g, A = jax.vmap(one)(x) if batched else one(x)
    scale = jnp.maximum(1.0, _max_abs(A))
    return A, jnp.all(jnp.isfinite(A)), _max_abs(g), _max_abs(f0), scale


@eqx.filter_jit
def _blocks_at_zero(module, x, p, d, batched):
    W0 = jnp.zeros((p, d))

    def one(xi):
        f0 = module(W0, xi)
        G = jax.jacfwd(module)(W0, xi)  # (*k, p, d)
        H = jax.hessian(module)(W0, xi)  # (*k, p, d, p, d)
        idx = jnp.arange(d)
        Hii = H[..., :, idx, :, idx]  # (d, *k, p, p)
        Hij = H[..., :, idx, :, (idx + 1) % d]  # one off-diagonal block per neuron
        return f0, G, Hii, Hij

    return jax.vmap(one)(x) if batched else one(x)


@eqx.filter_jit
def _symmetry_stats(f0, G, Hii, Hij, d):
    """`(finite, (dev_g, dev_ii, dev_ij), scale)`: whether every derivative is finite, how far the
    gradient columns, the diagonal blocks and the off-diagonal blocks are from all equal (neurons on
    the leading axis of `Hii`, `Hij`; `Hij` also from symmetric, the swap symmetry of `d = 2`), and
    `max(1, max |G|, max |H|)`."""
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in (f0, G, Hii, Hij)]))
    dev_g = _max_abs(G - G[..., :1])
    dev_ii = _max_abs(Hii - Hii[:1])
    # With d = 2 there is one pair; swap symmetry then needs H_01 = H_01ᵀ.
    dev_ij = jnp.maximum(_max_abs(Hij - Hij[:1]) if d > 2 else jnp.zeros(()), _max_abs(Hij - jnp.swapaxes(Hij, -1, -2)))
    return finite, jnp.stack([dev_g, dev_ii, dev_ij]), jnp.maximum(1.0, _max_abs(G, Hii, Hij))


class Expansion(eqx.Module):
    """Second-order expansion of a permutation-symmetric module about `W = 0` (Thm 12) in the form of Eq. 20:

    `f_x(W) = f0(x) + g(x)ᵀ μ + Tr[M A(x)] + μᵀ B(x) μ + O(|W|³)`, with `M = W Wᵀ`, `μ = W 1`.

    Then `∇²_{w_i} f = 2(A + B)` and `∇_{w_i} ∇_{w_j} f = 2B` (i ≠ j): `B = ½ H_ij` and
    `A = ½ (H_ii − H_ij)` (Eq. 20's `A` is Eq. 196's `A` minus `B`). For a ZGZ module `g = 0` and `B = 0`.
    """

    f0: Array
    g: Array
    A: Array
    B: Array


def expand(
    module: Callable,
    x,
    p: int,
    d: int,
    *,
    batched: bool = False,
    atol: float = 1e-8,
) -> Expansion:
    """Expand a general permutation-symmetric module `module(W, x)`, `W ∈ R^{p×d}`, about `W = 0`.

    Returns `Expansion(f0, g, A, B)` of Thm 12 (Eq. 20's form), shapes `()`, `(p,)`, `(p, p)`, `(p, p)`
    (each with a leading `k` for vector outputs and a leading `m` when `batched`).

    **Arguments:**

    - `module`: `module(W, x)`, scalar or `(k,)` output, invariant under permuting columns of `W`.
    - `x`: one input, or inputs stacked on axis 0 with `batched=True`.
    - `p`, `d`: neuron size and number of neurons (`d ≥ 2`, so that `B` is defined).
    - `atol`: tolerance, relative to the derivatives' scale, of the symmetry checks.

    **Raises:** `SymmetryError` when the gradient columns or the Hessian blocks `H_ii`, `H_ij`
    are not all equal (the module is not permutation-symmetric), naming the largest deviation.
    """
    check_positive_int("d", d, minimum=2, what="2 neurons at least separate A from B")
    check_positive_int("p", p, what="the neuron size")
    f0, G, Hii, Hij = _blocks_at_zero(module, x, p, d, batched)
    # Fancy indexing puts the neuron axis first (after the batch axis, when batched).
    ax = 1 if batched else 0
    Hii, Hij = jnp.moveaxis(Hii, ax, 0), jnp.moveaxis(Hij, ax, 0)
    stats = _symmetry_stats(f0, G, Hii, Hij, d)
    f0, G, Hii, Hij = fail_if((f0, G, Hii, Hij), ~stats[0], "module: its derivatives at W = 0 are not finite")
    dev, scale = jnp.max(stats[1]), stats[2]
    which = ["gradient columns", "diagonal Hessian blocks H_ii", "off-diagonal blocks H_ij"]
    f0, G, Hii, Hij = fail_if(
        (f0, G, Hii, Hij),
        ~(dev <= atol * scale),
        "module: not permutation-symmetric: its gradient columns or Hessian blocks differ across neurons",
        detail=lambda: (
            f"module: not permutation-symmetric: its {which[int(np.argmax(stats[1]))]} differ across "
            f"neurons by {float(dev):.3g}"
        ),
        error=SymmetryError,
    )
    g = G[..., 0]
    Hii, Hij = Hii[0], Hij[0]
    sym = lambda a: 0.5 * (a + jnp.swapaxes(a, -1, -2))
    B = 0.5 * sym(Hij)
    A = 0.5 * sym(Hii) - B
    return Expansion(f0=f0, g=g, A=A, B=B)
