"""The neural tangent kernel of an NQF from its order parameters (Prop 8, Eq. 245), and whether it
stays fixed during training (Prop 9)."""

from __future__ import annotations

import math

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._core.errors import LvflowError
from .._core.validate import as_array
from .flow import check_state
from .nqf import NQF


def ntk(
    nqf: NQF,
    M: Float[ArrayLike, "p p"],
    mu: Float[ArrayLike, " p"] | None = None,
    *,
    d: float | None = None,
) -> Float[Array, "m *k m *k"]:  # noqa: F821 (jaxtyping's variadic dims)
    """The empirical neural tangent kernel over the NQF's samples, from `(M, μ)` alone (Prop 8, Eq. 245).

    For the NQF `f_x(W) = f0(x) + g(x)ᵀμ + Tr[M A(x)] + μᵀB(x)μ` (Eq. 20) the kernel
    `Θ(x, x') = ⟨∇_W f_x, ∇_W f_x'⟩_F` is

    `Θ(x, x') = d u(x)ᵀu(x') + 2 u(x)ᵀ A(x') μ + 2 μᵀ A(x) u(x') + 4 Tr[A(x) A(x') M]`,

    with `u(x) = g(x) + 2 B(x) μ`. For a ZGZ module (`g = B = 0`) it is `4 Tr[A(x) A(x') M]`. It
    equals the NTK of the network the NQF expands up to `O(|W|³)` (relative error `O(|W|)`, and
    `O(|W|²)` for units odd in their weights, such as a tanh MLP).

    **Arguments:**

    - `nqf`: the `NQF` (dense or factored `A`; scalar or vector outputs).
    - `M`: `M = W Wᵀ`, symmetric PSD, shape `(p, p)`.
    - `mu`: `μ = W 1`, shape `(p,)`; required when the NQF has μ-terms (`g` or `B`).
    - `d`: the number of neurons; required with μ-terms (the first term is `d u(x)ᵀu(x')`).

    **Returns:** `Θ` of shape `(m, m)`, or `(m, k, m, k)` for `k` outputs (`Θ[μ, c, ν, c']` pairs
    output `c` on sample `μ` with output `c'` on sample `ν`). Symmetric PSD.

    **Raises:** `LvflowError` when `M` or `mu` do not match the NQF's `p`, when `mu` or `d` is missing
    for an NQF with μ-terms, or when `M − μμᵀ/d` is not PSD (no `W` realises them); `NotPSDError`
    when `M` is not PSD.
    """
    M, mu, d = check_state(nqf, M, mu, d, M_name="M", mu_name="mu")
    M = jnp.asarray(M, dtype=float)
    mu = None if mu is None or not nqf.has_mu_terms else jnp.asarray(mu, dtype=float)
    return _ntk(nqf, M, mu, jnp.asarray(d, dtype=float))


@eqx.filter_jit
def _ntk(nqf, M, mu, d):
    p = M.shape[0]
    out = nqf.y.shape  # (m, *k)
    n = nqf.y.size
    if nqf.dense_A is not None:
        A = nqf.dense_A.reshape(n, p, p)
        theta = 4.0 * jnp.einsum("aij,bji->ab", A, A @ M)
        A_mu = jnp.zeros((n, p), M.dtype) if mu is None else A @ mu
    else:
        features, basis = nqf._factors()
        E = basis.reshape(-1, p, p)  # (n_E, p, p): the basis, per output when it has an output axis
        if basis.ndim == 4:  # shared features (m, D), a basis per output (k, D, p, p)
            k, D = basis.shape[:2]
            coef = jnp.einsum("md,ce->mced", features, jnp.eye(k)).reshape(n, k * D)
        else:
            coef = features.reshape(n, -1)
        gram = jnp.einsum("dij,eji->de", E, E @ M)  # Tr[E_d E_e M]
        theta = 4.0 * coef @ gram @ coef.T
        A_mu = jnp.zeros((n, p), M.dtype) if mu is None else coef @ (E @ mu)
    if mu is not None:
        u = jnp.zeros((n, p), dtype=M.dtype)
        if nqf.g is not None:
            u = u + nqf.g.reshape(n, p)
        if nqf.B is not None:
            u = u + 2.0 * nqf.B.reshape(n, p, p) @ mu
        theta = theta + d * u @ u.T + 2.0 * u @ A_mu.T + 2.0 * A_mu @ u.T
    theta = (theta + theta.T) / 2
    return theta.reshape(out + out)


class NTKRegime(eqx.Module):
    """The training regime of Prop 9.

    - `lazy`: whether the NTK stays fixed as the width `d → ∞` (lazy training: the NQF acts as a
      linear model); `False` is feature learning (the NTK moves by `O(1)` while the loss does).
    - `drift_exponent`: `e` in `Θ̇ = O(d^e)`, `e = max(1 − α_B, −α_A)`; the relative change of the
      NTK over an `O(1)` stretch of training scales as `d^e` (`e < 0`: lazy).
    """

    lazy: bool = eqx.field(static=True)
    drift_exponent: float = eqx.field(static=True)


def ntk_regime(alpha_A: float, alpha_B: float = math.inf) -> NTKRegime:
    """Lazy training or feature learning (Prop 9), from how the NQF's coefficients scale with width.

    With `d` neurons, `g(x) = Θ(d^{−1/2})` (so that the NTK of Eq. 245 is `Θ(1)`),
    `A(x) = Θ(d^{−α_A})`, `B(x) = Θ(d^{−α_B})` and an initialisation of variance `1/d`
    (`M(0)`, `μ(0)` of order 1), gradient flow changes the NTK at the rate
    `Θ̇ = O(d^{1−α_B} + d^{−α_A})`. It is **lazy** (constant NTK as `d → ∞`) when `α_A > 0` and
    `α_B > 1`, and **feature learning** when `α_A = 0` or `½ ≤ α_B ≤ 1`.

    **Arguments:**

    - `alpha_A`: the exponent `α_A ≥ 0` of `A`.
    - `alpha_B`: the exponent `α_B ≥ ½` of `B`; `inf` (the default) for a module without `B`.

    **Returns:** an `NTKRegime` (`lazy`, `drift_exponent`).

    **Raises:** `LvflowError` for `α_A < 0` or `α_B < ½` (outputs or gradients diverge with `d`), or NaN.
    """
    alpha_A = float(as_array("alpha_A", alpha_A, ndim=0, allow_bool=False))
    if not (isinstance(alpha_B, (int, float)) and not isinstance(alpha_B, bool) and alpha_B == math.inf):
        alpha_B = float(as_array("alpha_B", alpha_B, ndim=0, allow_bool=False))
    if not alpha_A >= 0:
        raise LvflowError(f"alpha_A: must be >= 0 (A = Θ(d^-alpha_A)), got {alpha_A}")
    if not alpha_B >= 0.5:
        raise LvflowError(f"alpha_B: must be >= 1/2 (B = Θ(d^-alpha_B)), got {alpha_B}")
    exponent = max(1.0 - alpha_B, -alpha_A) + 0.0  # + 0.0: no −0.0
    return NTKRegime(lazy=alpha_A > 0 and alpha_B > 1, drift_exponent=exponent)
