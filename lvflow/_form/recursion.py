"""The exact discrete GD/SGD map on `(M, μ)` (Thm 2), and Polyak momentum on the Gram of `[W, V]` (Cor. 2)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .._core.errors import DivergenceError, LvflowError
from .._core.validate import check_in_open_interval, check_positive, check_positive_int
from .flow import check_state, gradient_terms
from .nqf import NQF


class RecursionResult(eqx.Module):
    """The state recorded every `record_every` steps, step 0 included.

    - `steps`: the step numbers, shape `(n,)`.
    - `M`: `M_t = W_t W_tᵀ`, shape `(n, p, p)`.
    - `mu`: `μ_t = W_t 1`, shape `(n, p)`; `None` when no `mu0` was given (ZGZ modules).
    - `loss`: the full-data loss `L(M_t, μ_t)` (Eq. 26; weight decay not included), shape `(n,)`.
    """

    steps: Int[Array, " n"]
    M: Float[Array, "n p p"]
    mu: Float[Array, "n p"] | None
    loss: Float[Array, " n"]


def _sym(X):
    return (X + X.T) / 2


def _gd_step(nqf: NQF, M, mu, d, lr, gamma):
    """One GD step, Thm 2: `Δμ = −η(d v + Hμ)`,
    `ΔM = −η(vμᵀ + μvᵀ + HM + MH) + η²(d vvᵀ + vμᵀH + Hμvᵀ + HMH)`.

    Evaluated as the Gram of `W' = P W + u1ᵀ` with `P = I − ηH`, `u = −ηv`:
    `M' = P M Pᵀ + (Pμ)uᵀ + u(Pμ)ᵀ + d uuᵀ`, the same polynomial, but symmetric PSD by construction.
    """
    H, v = gradient_terms(nqf, M, mu, gamma)
    P = jnp.eye(nqf.p, dtype=M.dtype) - lr * H
    u = -lr * v
    Pmu = P @ mu
    X = jnp.outer(Pmu, u)
    return _sym(P @ M @ P.T + X + X.T + d * jnp.outer(u, u)), Pmu + d * u


def _gram(a, b, state, d):
    """`X X'ᵀ` for `X = P_W W + P_V V + u1ᵀ` (maps `a = (P_W, P_V, u)`, `b` likewise for `X'`),
    from the Gram state `(M, N, Q, μ, ν) = (WWᵀ, WVᵀ, VVᵀ, W1, V1)` of `d` neurons."""
    (PW, PV, u), (QW, QV, u2) = a, b
    M, N, Q, mu, nu = state
    return (
        PW @ M @ QW.T
        + PW @ N @ QV.T
        + PV @ N.T @ QW.T
        + PV @ Q @ QV.T
        + jnp.outer(PW @ mu + PV @ nu, u2)
        + jnp.outer(u, QW @ mu + QV @ nu + d * u2)
    )


def _momentum_step(nqf: NQF, state, d, lr, gamma, beta):
    """Polyak momentum (Cor. 2), `W_{t+1} = W_t − η∇L_t + β V_t`, `V_t = W_t − W_{t−1}`:

    `W_{t+1} = (I − ηH)W + βV − ηv1ᵀ`,   `V_{t+1} = −ηH W + βV − ηv1ᵀ`,

    both of the form `P_W W + P_V V + u1ᵀ`, so the Gram state of `[W, V]` maps to itself.
    """
    M, N, Q, mu, nu = state
    H, v = gradient_terms(nqf, M, mu, gamma)
    eye = jnp.eye(nqf.p, dtype=M.dtype)
    u = -lr * v
    xw = (eye - lr * H, beta * eye, u)
    xv = (-lr * H, beta * eye, u)
    one = lambda x: x[0] @ mu + x[1] @ nu + d * x[2]  # X 1
    return (
        _sym(_gram(xw, xw, state, d)),
        _gram(xw, xv, state, d),
        _sym(_gram(xv, xv, state, d)),
        one(xw),
        one(xv),
    )


@eqx.filter_jit
def _run(nqf, M0, mu0, d, lr, gamma, beta, batches, n_records, record_every, use_momentum):
    p = nqf.p
    zero = jnp.zeros((p, p), dtype=M0.dtype)
    state0 = (M0, zero, zero, mu0, jnp.zeros_like(mu0)) if use_momentum else (M0, mu0)

    def step(state, idx):
        data = nqf if idx is None else nqf.subset(idx)  # minibatch: ℓ' = 2Δ/b
        if use_momentum:
            return _momentum_step(data, state, d, lr, gamma, beta), None
        M, mu = state
        return _gd_step(data, M, mu, d, lr, gamma), None

    def record(state, idx_block):
        state, _ = jax.lax.scan(step, state, idx_block, length=record_every)
        M, mu = state[0], state[-2 if use_momentum else 1]
        return state, (M, mu, nqf.loss(M, mu))

    blocks = None if batches is None else batches.reshape(n_records, record_every, -1)
    _, (Ms, mus, losses) = jax.lax.scan(record, state0, blocks, length=n_records)
    cat = lambda x0, xs: jnp.concatenate([x0[None], xs])
    return cat(M0, Ms), cat(mu0, mus), cat(nqf.loss(M0, mu0), losses)


def gd_recursion(
    nqf: NQF,
    M0: Float[ArrayLike, "p p"],
    *,
    steps: int,
    lr: float,
    mu0: Float[ArrayLike, " p"] | None = None,
    d: float | None = None,
    batches: Int[ArrayLike, "steps b"] | None = None,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    record_every: int = 1,
) -> RecursionResult:
    """Gradient descent of a `d`-neuron module, run exactly on `(M, μ)` (Thm 2).

    A GD step `W' = W − η(v1ᵀ + HW)` (`H = (4/m)Σ Δ_μ A_μ`, `v = Σ ℓ'_μ(g_μ + 2B_μμ)`, `ℓ' = 2Δ/m`)
    maps `M = WWᵀ`, `μ = W1` to

    `Δμ = −η(d·v + Hμ)`,
    `ΔM = −η(vμᵀ + μvᵀ + HM + MH) + η²(d·vvᵀ + vμᵀH + Hμvᵀ + HMH)`,

    with no approximation: the discrete dynamics of every width-`d` network with this NQF.

    **Arguments:**

    - `nqf`: the `NQF`.
    - `M0`: `M_0`, `p×p` symmetric PSD.
    - `steps`: the number of steps.
    - `lr`: the learning rate `η > 0`.
    - `mu0`, `d`: `μ_0` and the number of neurons; required when the NQF has μ-terms.
    - `batches`: SGD minibatches, an integer array `(steps, b)` of sample indices; step `t` uses
      the loss averaged over `batches[t]` (so `ℓ' = 2Δ/b`). `None`: full batch.
    - `weight_decay`: `γ ≥ 0`, the penalty `(γ/2)|W|²` (replaces `H` by `H + γI`; optax's
      convention, `γ_paper = 2γ` in the paper's `−γM`, see `matrix_flow`).
    - `momentum`: Polyak's `β ∈ [0, 1)`: `W_{t+1} = W_t − η∇L_t + β(W_t − W_{t−1})`, `W_{−1} = W_0`.
      It closes on the Gram matrix of `[W, V]`, `V_t = W_t − W_{t−1}` (Cor. 2).
    - `record_every`: record every this many steps; must divide `steps`.

    **Returns:** a `RecursionResult` at steps `0, record_every, …, steps`.

    **Raises:** `LvflowError` for bad input; `DivergenceError` if the iterates overflow (`lr` too
    large).
    """
    M0, mu0, d = check_state(nqf, M0, mu0, d)
    check_positive_int("steps", steps)
    if isinstance(record_every, bool) or not (
        isinstance(record_every, (int, np.integer)) and record_every > 0 and steps % record_every == 0
    ):
        raise LvflowError(f"record_every: must be a positive integer dividing steps={steps}, got {record_every!r}")
    lr = check_positive("lr", lr)
    gamma = check_positive("weight_decay", weight_decay, allow_zero=True)
    beta = 0.0 if momentum == 0 else check_in_open_interval("momentum", momentum, 0.0, 1.0)
    if batches is not None:
        b = np.asarray(batches)
        if b.ndim != 2 or b.shape[0] != steps or b.shape[1] == 0:
            raise LvflowError(f"batches: expected shape (steps={steps}, b) with b ≥ 1, got {b.shape}")
        if not np.issubdtype(b.dtype, np.integer):
            raise LvflowError(f"batches: expected integer sample indices, got dtype {b.dtype}")
        if b.min() < 0 or b.max() >= nqf.m:
            raise LvflowError(f"batches: indices must lie in [0, {nqf.m}), got range [{b.min()}, {b.max()}]")
        batches = jnp.asarray(b)

    mu_init = jnp.zeros(nqf.p) if mu0 is None else jnp.asarray(mu0, dtype=jnp.float64)
    f = lambda x: jnp.asarray(x, dtype=jnp.float64)
    M, mu, loss = _run(
        nqf,
        f(M0),
        mu_init,
        f(d),
        f(lr),
        f(gamma),
        f(beta),
        batches,
        steps // record_every,
        int(record_every),
        beta != 0.0,
    )
    if not bool(jnp.all(jnp.isfinite(M))):
        bad = int(np.argmin(np.all(np.isfinite(np.asarray(M)), axis=(1, 2))))
        raise DivergenceError(
            f"gd_recursion: the iterates diverged (non-finite M by step {bad * record_every}); lr={lr:g} is too large",
            step=bad * record_every,
        )
    return RecursionResult(steps=jnp.arange(0, steps + 1, record_every), M=M, mu=None if mu0 is None else mu, loss=loss)
