"""Compression to `k_V + 1` neurons with identical training dynamics (Thm 3), and the error bound
of compressing to fewer (Cor 3, Eq. 237)."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Real

from .._core.errors import LvflowError
from .._core.validate import as_array, check_nonnegative, check_positive, check_positive_int, check_psd
from .flow import check_state
from .nqf import NQF


class Compressed(eqx.Module):
    """A `d'`-neuron model whose GD outputs equal the original's at every step (Thm 3).

    - `nqf`: the compressed NQF, `Ã = (d'/d) A` (`f0`, `g`, `B` unchanged).
    - `W`: `W' ∈ R^{p×d'}` realising the matched state: `W'W'ᵀ = M'`, `W'1 = μ'`.
    - `M`: `M' = (d/d') Π M Π`.
    - `mu`: `μ' = Π μ`; `None` when no `μ` was given.
    - `lr`: `η̃ = (d/d') η`.
    - `d`: `d' = k_V + 1`.
    - `k_V`: `dim V`, `V = span{g, Col A, Col B}` over all samples and outputs.
    - `basis`: an orthonormal basis of `V`, shape `(p, k_V)`; `Π = basis basisᵀ`.
    """

    nqf: NQF
    W: Float[Array, "p dp"]
    M: Float[Array, "p p"]
    mu: Float[Array, " p"] | None
    lr: float = eqx.field(static=True)
    d: int = eqx.field(static=True)
    k_V: int = eqx.field(static=True)
    basis: Float[Array, "p k"]


def span_basis(nqf: NQF, *, rtol: float | None = None) -> np.ndarray:
    """Orthonormal basis `(p, k_V)` of `V = span{g_μ, Col A_μ, Col B_μ}` over all samples/outputs.

    The numerical rank counts singular values above `rtol · σ_max` (default
    `max(shape) · eps`, numpy's `matrix_rank` convention).
    """
    p = nqf.p
    # Rows of the symmetric A_μ, B_μ are their columns; g_μ are vectors.
    parts = [np.asarray(nqf.A).reshape(-1, p)]
    if nqf.B is not None:
        parts.append(np.asarray(nqf.B).reshape(-1, p))
    if nqf.g is not None:
        parts.append(np.asarray(nqf.g).reshape(-1, p))
    Z = np.concatenate(parts)
    _, s, Vt = np.linalg.svd(Z, full_matrices=False)
    if s.size == 0 or s[0] == 0:
        return np.zeros((p, 0))
    tol = (max(Z.shape) * np.finfo(Z.dtype).eps if rtol is None else rtol) * s[0]
    return Vt[: int(np.sum(s > tol))].T


def compress(
    nqf: NQF,
    M: Float[ArrayLike, "p p"],
    *,
    d: int,
    lr: float,
    mu: Float[ArrayLike, " p"] | None = None,
    rtol: float | None = None,
) -> Compressed:
    """Compress a `d`-neuron module to `d' = k_V + 1` neurons with the same outputs along GD (Thm 3).

    Let `Π` project on `V = span{g, Col A, Col B}`, `k_V = dim V`. The model with `d'` neurons,
    `Ã = (d'/d) A`, `η̃ = (d/d') η`, started from

    `M' = (d/d') Π M Π`,   `μ' = Π μ`,

    has `Tr[M'Ã] = Tr[ΠMΠ A] = Tr[MA]`, `gᵀμ' = gᵀμ`, `μ'ᵀBμ' = μᵀBμ` (as `ΠAΠ = A`, `Πg = g`,
    `ΠBΠ = B`), hence the same residuals, the same `v`, and `H̃ = (d'/d) H`. Substituting in
    Thm 2, `Δμ' = Π Δμ` and `ΠΔM'Π = (d/d') ΠΔMΠ` term by term (every term carries `v ∈ V` or
    `H = ΠHΠ` on both sides, and the `η` and `η²` terms pick up `d/d'` exactly once), so the
    matched relation persists and the outputs agree at every step. The component of `μ` outside
    `V` never moves and never enters an output; dropping it (`μ' = Πμ` rather than `μ`) makes
    `(M', μ')` realisable by `d'` neurons: `M' − μ'μ'ᵀ/d' = (1/d') Π (dM − μμᵀ) Π` is PSD with
    rank ≤ `k_V = d' − 1`. With weight decay `γ`, use `γ̃ = (d'/d) γ` (so that `η̃γ̃ = ηγ`).

    **Arguments:**

    - `nqf`: the `NQF` of the `d`-neuron module.
    - `M`, `mu`: its current `M = WWᵀ`, `μ = W1` (`mu` required when the NQF has μ-terms).
    - `d`: its number of neurons.
    - `lr`: its learning rate `η`.
    - `rtol`: relative tolerance of the numerical rank `k_V` (see `span_basis`).

    **Returns:** a `Compressed`, including `W'` with `W'W'ᵀ = M'`, `W'1 = μ'`.
    """
    check_positive_int("d", d, what="the number of neurons")
    M, mu, _ = check_state(nqf, M, mu, d, M_name="M", mu_name="mu")
    lr = check_positive("lr", lr)
    if rtol is not None:
        rtol = check_positive("rtol", rtol)
    E = span_basis(nqf, rtol=rtol)
    k_V = E.shape[1]
    dp = k_V + 1
    mu_c = np.zeros(nqf.p) if mu is None else E @ (E.T @ mu)
    M_c = d / dp * E @ (E.T @ M @ E) @ E.T
    M_c = (M_c + M_c.T) / 2

    # W' = U + μ'1ᵀ/d' with U1 = 0 and UUᵀ = S = M' − μ'μ'ᵀ/d', S supported on V:
    # S = R Rᵀ with R = E Z √s (p×k_V), and U = R Qᵀ with Q (d'×k_V) an orthonormal basis of 1^⊥.
    mu_E = E.T @ mu_c
    S_E = d / dp * (E.T @ M @ E) - np.outer(mu_E, mu_E) / dp
    s, Z = np.linalg.eigh((S_E + S_E.T) / 2)
    R = E @ Z * np.sqrt(np.clip(s, 0.0, None))
    Q = np.linalg.svd(np.ones((1, dp)))[2][1:].T  # rows 1.. of Vᵀ are orthogonal to 1
    W_c = R @ Q.T + np.outer(mu_c, np.ones(dp)) / dp
    return Compressed(
        nqf=nqf.scaled(dp / d),
        W=jnp.asarray(W_c),
        M=jnp.asarray(M_c),
        mu=None if mu is None else jnp.asarray(mu_c),
        lr=d / dp * lr,
        d=dp,
        k_V=k_V,
        basis=jnp.asarray(E),
    )


def compression_bound(
    M: Float[ArrayLike, "p p"],
    mu: Float[ArrayLike, " p"] | None = None,
    *,
    d: int,
    width: int,
    lr: float = 0.0,
    lipschitz: float = 0.0,
    steps: Real[ArrayLike, "*n"] = 0,  # noqa: F821 (jaxtyping's variadic dims)
) -> Float[Array, "*n"]:  # noqa: F821 (jaxtyping's variadic dims)
    """The error bound of compressing a `d`-neuron NQF to `width = d'` neurons (Cor 3, Eq. 237):

    `‖(d'/d) M̃_t − M_t‖_F + ‖μ̃_t − μ_t‖₂  ≤  √(Σ_{k ≥ d'} λ_k²) · exp(η L t)`,

    where `λ_1 ≥ … ≥ λ_p` are the eigenvalues of `C = (d/d') (M − μμᵀ/d)` at the start of training
    (the sum runs over `k = d', …, p`, the eigenvalues a `d'`-neuron model cannot hold), `η` the
    learning rate and `L` a Lipschitz constant of the update `(Δμ, ΔM)/η` of Thm 2 along both
    trajectories. The compressed model is the one of Cor 3's proof: `μ̃ = μ`, `W̃ = U + μ1ᵀ/d'` with
    `U1 = 0` and `UUᵀ` the best rank-`(d' − 1)` approximation of `C`, trained with `Ã = (d'/d) A`
    and `η̃ = (d/d') η` as in Thm 3, so that `((d'/d) M̃, μ̃)` follows the same map as `(M, μ)`.
    Its error at `t = 0` is `(d'/d)` times the bound (Eq. 240 drops this factor, which is at most
    1 for `d' ≤ d`). For `d' > p` nothing is dropped and the bound is 0.

    **Arguments:**

    - `M`: the initial `M = W Wᵀ`, symmetric PSD `(p, p)`.
    - `mu`: the initial `μ = W 1`, shape `(p,)`; `None` for `μ = 0`.
    - `d`: the number of neurons of the original model.
    - `width`: `d'`, the number of neurons of the compressed model, `1 ≤ d' ≤ d`.
    - `lr`: the learning rate `η ≥ 0` (0 gives the bound at `t = 0`).
    - `lipschitz`: the Lipschitz constant `L ≥ 0`.
    - `steps`: the training step(s) `t ≥ 0`, a scalar or an array.

    **Returns:** the bound, shaped like `steps`.

    **Raises:** `LvflowError` for shapes that do not match, `width` outside `[1, d]`, negative
    `lr`, `lipschitz` or `steps`, or `M − μμᵀ/d` not PSD (no `d`-neuron `W` realises `M`, `μ`);
    `NotPSDError` when `M` is not PSD.
    """
    d = check_positive_int("d", d, what="the number of neurons")
    width = check_positive_int("width", width, what="the compressed number of neurons")
    if width > d:
        raise LvflowError(f"width: must be at most d = {d} (a compression), got {width}")
    M = as_array("M", M, ndim=2)
    if M.shape[0] != M.shape[1]:
        raise LvflowError(f"M: expected a square (p, p) matrix, got shape {M.shape}")
    p = M.shape[0]
    M = check_psd("M", M)
    mu = as_array("mu", jnp.zeros(p) if mu is None else mu, ndim=1)
    if mu.shape != (p,):
        raise LvflowError(f"mu: shape {mu.shape}, expected ({p},) to match M")
    # C = M − μμᵀ/d, PSD iff some W with d columns has W Wᵀ = M, W 1 = μ
    C = check_psd("M - mu muᵀ/d (no W with d columns realises them)", M - mu[:, None] * mu[None, :] / d)
    rate = check_nonnegative("lr", lr, ndim=0)
    lip = check_nonnegative("lipschitz", lipschitz, ndim=0)
    t = check_nonnegative("steps", steps, what=">= 0")
    f = lambda x: jnp.asarray(x, dtype=float)  # noqa: E731
    return _compression_bound(f(C), d, width, f(rate), f(lip), f(t))


@eqx.filter_jit
def _compression_bound(C, d, width, lr, lipschitz, steps):
    C = d / width * C
    lam = jnp.linalg.eigvalsh((C + C.T) / 2)[::-1]  # descending
    tail = jnp.where(jnp.arange(lam.shape[0]) >= width - 1, lam, 0.0)  # k = d', …, p (1-based)
    return jnp.sqrt(jnp.sum(tail**2)) * jnp.exp(lr * lipschitz * steps)
