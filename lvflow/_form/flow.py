"""Gradient flow on the order parameter `(M, μ)` (Eq. 27–28, Thm 12), integrated with diffrax."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int

from .._core.errors import LvflowError, SolverError
from .._core.validate import as_array, check_positive, check_positive_int, check_psd, fail_if
from .nqf import NQF

if TYPE_CHECKING:
    import diffrax  # imported where a flow is solved: `matrix_drops`' GD path never pays its import


class FlowSolution(eqx.Module):
    """The gradient flow sampled at the requested times.

    - `ts`: the times, shape `(n,)`.
    - `M`: `M(t) = W Wᵀ`, shape `(n, p, p)`.
    - `mu`: `μ(t) = W 1`, shape `(n, p)`; `None` when no `mu0` was given (ZGZ modules).
    - `loss`: the data loss `L(M, μ)` (Eq. 26; weight decay not included), shape `(n,)`.
    - `num_steps`: solver steps taken (accepted and rejected).
    """

    ts: Float[Array, " n"]
    M: Float[Array, "n p p"]
    mu: Float[Array, "n p"] | None
    loss: Float[Array, " n"]
    num_steps: Int[Array, ""]


def check_state(nqf: NQF, M0, mu0, d, *, M_name: str = "M0", mu_name: str = "mu0"):
    """Validate an initial `(M, μ)` for `nqf` and a width `d`; return `(M, μ, d)` as arrays.

    `M` must be `p×p`, finite and PSD. `μ` and `d` are required when the NQF has μ-terms
    (Thm 12). With both given, `M − μμᵀ/d` must be PSD: `W Wᵀ = U Uᵀ + μμᵀ/d` for
    `U = W − μ1ᵀ/d`, so otherwise no `W ∈ R^{p×d}` has `W Wᵀ = M`, `W 1 = μ`.
    For ZGZ modules `μ` does not feed back (`v = 0`), so `d` defaults to 1 there.
    """
    if not isinstance(nqf, NQF):
        raise LvflowError(f"nqf: expected an lvflow.NQF, got {type(nqf).__name__}")
    p = nqf.p
    M0 = as_array(M_name, M0, ndim=2)
    if M0.shape != (p, p):
        raise LvflowError(f"{M_name}: shape {M0.shape}, expected ({p}, {p}) to match the NQF")
    M0 = check_psd(M_name, M0)
    if mu0 is None and nqf.has_mu_terms:
        raise LvflowError(f"{mu_name}: required, the NQF has μ-terms (g or B, Thm 12)")
    if mu0 is not None:
        mu0 = as_array(mu_name, mu0, ndim=1)
        if mu0.shape != (p,):
            raise LvflowError(f"{mu_name}: shape {mu0.shape}, expected ({p},) to match the NQF")
    if d is None:
        if nqf.has_mu_terms:
            raise LvflowError("d: required (the number of neurons), the NQF has μ-terms (g or B, Thm 12)")
        return M0, mu0, 1.0
    d = check_positive("d", d)
    if mu0 is not None:
        name = f"{M_name} - {mu_name} {mu_name}ᵀ/d (no W with d columns realises them)"
        M0 = check_psd(name, M0 - mu0[:, None] * mu0[None, :] / d, attach=M0)
    return M0, mu0, d


def gradient_terms(nqf: NQF, M, mu, weight_decay) -> tuple[Float[Array, "p p"], Float[Array, " p"]]:
    """`(H + γI, v)`, so that `∇_W [L + (γ/2)|W|²] = v 1ᵀ + (H + γI) W` (Eq. 27, Thm 2).

    `H = (4/m) Σ_μ Δ_μ A_μ`, `v = Σ_μ ℓ'_μ (g_μ + 2 B_μ μ)`, `ℓ' = 2Δ/m`.
    """
    H = nqf.H(M, mu) + weight_decay * jnp.eye(nqf.p, dtype=M.dtype)
    return H, nqf.v(M, mu)


def _vector_field(t, y, args):
    # Ṁ = −(vμᵀ + μvᵀ + HM + MH), μ̇ = −(d v + Hμ) (Eq. 28 with the μ-terms of Thm 12).
    # Written as X + Xᵀ so that M stays exactly symmetric in floating point.
    nqf, d, gamma = args
    M, mu = y
    H, v = gradient_terms(nqf, M, mu, gamma)
    X = jnp.outer(v, mu) + H @ M
    return -(X + X.T), -(d * v + H @ mu)


@jax.jit
def _smallest_scale(M0: Float[Array, "p p"], mu0: Float[Array, " p"] | None) -> Float[Array, ""]:
    """The smallest significant eigenvalue of `M0` (above 1e-13 of the largest, i.e. above rounding).

    A mode starting at 1e-10 beside one at 1 must be resolved to relative accuracy: its
    ignition time depends on it. Falls back to `max μ0²`, then 1, when `M0 = 0`.
    """
    eig = jnp.linalg.eigvalsh(M0)
    top = jnp.max(eig)
    fallback = 1.0 if mu0 is None else jnp.where(jnp.any(mu0 != 0), jnp.max(mu0**2), 1.0)
    return jnp.where(top > 0, jnp.min(jnp.where(eig > 1e-13 * top, eig, jnp.inf)), fallback)


@eqx.filter_jit
def _integrate(nqf, M0, mu0, ts, d, gamma, rtol, atol, solver, adjoint, max_steps):
    import diffrax

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_vector_field),
        solver,
        ts[0],
        ts[-1],
        None,
        (M0, mu0),
        args=(nqf, d, gamma),
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps,
        throw=False,
        adjoint=adjoint,
    )
    M, mu = cast(tuple[Array, Array], sol.ys)  # saved at `ts`: never None
    loss = jax.vmap(nqf.loss)(M, mu)
    return M, mu, loss, sol.result, sol.stats["num_steps"]


def matrix_flow(
    nqf: NQF,
    M0: Float[ArrayLike, "p p"],
    ts: Float[ArrayLike, " n"],
    *,
    mu0: Float[ArrayLike, " p"] | None = None,
    d: float | None = None,
    weight_decay: float = 0.0,
    rtol: float = 1e-8,
    atol: float | None = None,
    solver: diffrax.AbstractSolver | None = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
    max_steps: int = 100_000,
) -> FlowSolution:
    """Gradient flow `Ẇ = −∇L` of a `d`-neuron module, closed on `M = WWᵀ`, `μ = W1`.

    For a ZGZ module (Eq. 27–28) `Ẇ = −HW` and

    `Ṁ = −H M − M H`,   `H = (4/m) Σ_μ Δ_μ A_μ`.

    With the μ-terms of Thm 12 (`g`, `B`), `Ẇ = −(v1ᵀ + HW)` with `v = Σ_μ ℓ'_μ(g_μ + 2B_μμ)`,
    `ℓ' = 2Δ/m`, and

    `μ̇ = −(d v + H μ)`,   `Ṁ = −(v μᵀ + μ vᵀ + H M + M H)`.

    Weight decay `γ` is the penalty `(γ/2)|W|²` added to the loss: it replaces `H` by `H + γI`
    (`Ẇ` gains `−γW`, `Ṁ` gains `−2γM`, `μ̇` gains `−γμ`). This is optax's convention
    (`optax.add_decayed_weights(γ)`, what `lvflow.train` runs); the paper's "weight decay adds
    `−γM`" is the same term with `γ_paper = 2γ`.

    **Arguments:**

    - `nqf`: the `NQF`.
    - `M0`: `M(t0)`, `p×p`, symmetric PSD. May be tiny (the small-init regime).
    - `ts`: increasing times; the flow starts at `ts[0]` and is returned at every entry.
    - `mu0`, `d`: `μ(t0)` and the number of neurons; required when the NQF has μ-terms.
      For a ZGZ module `μ` does not feed back; pass `mu0` only to follow it.
    - `weight_decay`: `γ ≥ 0`.
    - `rtol`, `atol`: the step-size controller's tolerances. `atol` defaults to
      `1e-3 · rtol · λ_min(M0)` (the smallest significant eigenvalue), so that a mode starting
      at 1e-10 is resolved to relative accuracy instead of being swamped by an absolute tolerance.
    - `solver`: a diffrax solver (default `Tsit5()`). Near convergence the flow is stiff (the
      loss Hessian's spectrum spreads): for long horizons pass `lvflow.Rodas5P()`, which forms
      the Jacobian of the `p² + p` state by autodiff and factorises it once per step (for
      moderate `p`; see `docs/devdocs/solvers.md` for measurements).
    - `adjoint`: a diffrax adjoint (default `diffrax.RecursiveCheckpointAdjoint()`, for
      `jax.grad`); `diffrax.ForwardMode()` for `jax.jvp`/`jax.jacfwd`.
    - `max_steps`: the solver's step budget.

    **Returns:** a `FlowSolution`.

    **Raises:** `LvflowError` for bad input; `SolverError` if the solve fails or leaves the finite
    numbers (under `jax.jit`, through `equinox.error_if`).

    Differentiable with respect to `M0`, `mu0` and the NQF's arrays; under `jax.jit` or a
    transformation the checks that need values are skipped (pass `atol` then, or it is computed
    from `M0` with its gradient stopped).

    `M` is integrated entry by entry in the given basis, so a mode far below the largest
    (`z ≲ 1e-16 · |M|`) is lost to rounding; below that use the Lotka–Volterra reduction in
    `ln z` (`reduce_to_lv`, `solve_lv`). Measured on a 6-mode commuting problem with modes from
    1e-1 down to 1e-10 (t ∈ [0, 40], through all ignitions): `Tsit5` at `rtol = 1e-8` takes 174
    steps, mode-wise relative error 5e-7 (rounding-limited); `Dopri8` 94 steps; `Kvaerno5`
    1528 steps and error 3e-5 — the flow is not stiff, so the implicit solver only costs.
    """
    M0, mu0, d = check_state(nqf, M0, mu0, d)
    ts = as_array("ts", ts, ndim=1)
    if ts.size == 0:
        raise LvflowError("ts: is empty, expected at least one time")
    ts = fail_if(ts, ts[1:] <= ts[:-1], "ts: must be strictly increasing")
    gamma = check_positive("weight_decay", weight_decay, allow_zero=True)
    rtol = check_positive("rtol", rtol)
    if atol is None:
        sg = lambda x: None if x is None else jax.lax.stop_gradient(jnp.asarray(x))  # noqa: E731
        atol = 1e-3 * rtol * _smallest_scale(sg(M0), sg(mu0))
    else:
        atol = check_positive("atol", atol)
    check_positive_int("max_steps", max_steps)
    import diffrax

    solver = diffrax.Tsit5() if solver is None else solver
    if not isinstance(solver, diffrax.AbstractSolver):
        raise LvflowError(f"solver: expected a diffrax solver, got {type(solver).__name__}")
    adjoint = diffrax.RecursiveCheckpointAdjoint() if adjoint is None else adjoint
    if not isinstance(adjoint, diffrax.AbstractAdjoint):
        raise LvflowError(f"adjoint: expected a diffrax adjoint, got {type(adjoint).__name__}")

    mu_init = jnp.zeros(nqf.p) if mu0 is None else jnp.asarray(mu0)
    f = lambda x: jnp.asarray(x, dtype=jnp.float64)
    M, mu, loss, result, num_steps = _integrate(
        nqf, f(M0), f(mu_init), f(ts), f(d), f(gamma), f(rtol), f(atol), solver, adjoint, int(max_steps)
    )
    M = fail_if(
        M,
        result != diffrax.RESULTS.successful,
        "matrix_flow: the ODE solve failed",
        detail=lambda: f"matrix_flow: the ODE solve failed: {diffrax.RESULTS[result]}",
        error=SolverError,
    )
    finite = jnp.all(jnp.isfinite(M)) & jnp.all(jnp.isfinite(mu))
    M = fail_if(M, ~finite, "matrix_flow: the state left the finite numbers (the flow diverged)", error=SolverError)
    return FlowSolution(ts=jnp.asarray(ts), M=M, mu=None if mu0 is None else mu, loss=loss, num_steps=num_steps)
