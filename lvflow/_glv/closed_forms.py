"""The paper's exactly solvable cases: Thm 4, 5, 6, 7, 16 and the ignition time (Eq. 158)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._core.errors import LvflowError
from .._core.validate import _namespace, as_array, check_positive, check_symmetric, fail_if


def _phi(a, t):
    """`∫₀ᵗ e^{−aτ} dτ = −expm1(−a t)/a`, equal to `t` at `a = 0` and accurate near it, in value and
    in derivatives (`∂φ/∂a = −t²/2` at `a = 0`): for `|a t| < 1e-3` its Taylor series
    `t (1 − x/2 + x²/6 − x³/24 + x⁴/120)`, `x = a t` (truncation error below `x⁵/720 ≈ 1.4e-18` relative)."""
    x = a * t
    small = jnp.abs(x) < 1e-3
    xs = jnp.where(small, x, 0.0)
    series = t * (1 - xs / 2 * (1 - xs / 3 * (1 - xs / 4 * (1 - xs / 5))))
    safe = jnp.where(small, 1.0, a)
    return jnp.where(small, series, -jnp.expm1(-jnp.where(small, 1.0, x)) / safe)


#: `ln` of the smallest normal float64 (2.2e-308): compiled code reads a smaller value as 0
_LOG_TINY = float(np.log(np.finfo(np.float64).tiny))
_LN2 = float(np.log(2.0))


def host_log(x: ArrayLike) -> Float[Array, "..."] | Float[np.ndarray, "..."]:
    """`ln x` in float64: by numpy on the host for a Python or numpy value (a subnormal `x` keeps its
    exact logarithm, where compiled code reads `x` as 0 and gives `−inf`), by `jnp.log` for a JAX
    array (traced or not). `−inf` for `x = 0`, NaN for `x < 0`."""
    if isinstance(x, jax.Array):
        return jnp.log(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log(np.asarray(x, dtype=np.float64)))


def thm6(r, c, z0, t, log_z0=None):
    """Thm 6, `z_k(t) = r_k z_k0 / (C_kk z_k0 + (r_k − C_kk z_k0) e^{−r_k t})` (`z_k0/(1 + C_kk z_k0 t)`
    at `r_k = 0`), entry by entry on broadcast arrays, in the algebraically equal form of each sign
    that never overflows (values and derivatives): `z_k0 / (e^{−r_k t} + C_kk z_k0 φ(r_k, t))` for
    `r_k > 0`, `z_k0 e^{r_k t} / (1 + C_kk z_k0 φ(−r_k, t))` otherwise, `φ(a, t) = (1 − e^{−at})/a`.

    A growing mode with `C_kk z_k0` or `z_k0` below float64's normal range has numerator and
    denominator multiplied by `2^m`, `m` from `ln(C_kk z_k0)` and `ln z_k0`: with `log_z0` given, a
    subnormal `z_k0` (read as 0 by compiled code) is taken from its logarithm.

    **Arguments:** `r`, `c` (`C_kk ≥ 0`), `z0` (`> 0`), `t`: broadcastable arrays, unchecked;
    `log_z0`: `ln z0` (default `jnp.log(z0)`), exact where `z0` is subnormal.

    **Returns:** `z_k(t)`, their broadcast shape.
    """
    lz0 = jnp.log(z0) if log_z0 is None else log_z0
    grow = r > 0
    # each branch with its own signed rate (not |r|: its derivative at r = 0 would have the wrong sign)
    rp = jnp.where(grow, r, 1.0)
    rn = jnp.where(grow, 0.0, r)
    live = grow & (c > 0)
    lcz = jnp.log(jnp.where(live, c, 1.0)) + lz0
    m = jnp.where(live & (lcz < -690.0), jnp.floor(-lcz / _LN2), 0.0)
    normal = z0 > 0  # false where compiled code reads a subnormal z_k0 as 0
    # a subnormal z_k0 times 2^m (at least) normal
    m = jnp.where(grow & ~normal, jnp.maximum(m, jnp.ceil((_LOG_TINY - lz0) / _LN2)), m)
    cz = jnp.where(live & (m > 0), jnp.exp(lcz + m * _LN2), c * z0)
    z0m = jnp.where(normal, jnp.ldexp(z0, m.astype(int)), jnp.exp(jnp.where(normal, 0.0, lz0) + m * _LN2))
    growing = z0m / (jnp.exp(-rp * t + m * _LN2) + cz * _phi(rp, t))
    other = z0 * jnp.exp(rn * t) / (1 + c * z0 * _phi(-rn, t))
    return jnp.where(grow, growing, other)


def _on_time_grid(*per_mode: ArrayLike, t: Array) -> tuple[Array, ...]:
    """The per-mode arrays broadcast together, and with a time axis in front when `t` is `(n,)`:
    `(*per_mode, t)` shaped `(K,)` and `()`, or `(1, K)` and `(n, 1)`."""
    arrays = jnp.broadcast_arrays(*per_mode)
    if t.ndim == 1:
        return (*(x[None] for x in arrays), t[:, None])
    return (*arrays, jnp.broadcast_to(t, arrays[0].shape))


def orthogonal_features(r: ArrayLike, c_diag: ArrayLike, z0: ArrayLike, t: ArrayLike) -> Float[Array, "*n K"]:
    """Thm 6: the gLV with diagonal `C` (orthogonal features), mode by mode,

    `z_k(t) = r_k z_k0 / (C_kk z_k0 + (r_k − C_kk z_k0) e^{−r_k t})`,  and `z_k0/(1 + C_kk z_k0 t)` if `r_k = 0`.

    Evaluated as `z_k0 / (e^{−r_k t} + C_kk z_k0 (1 − e^{−r_k t})/r_k)` for `r_k > 0` and as
    `z_k0 e^{r_k t} / (1 + C_kk z_k0 (e^{r_k t} − 1)/r_k)` otherwise: the same expression, exact at
    `r_k = 0`, free of cancellation near it and of overflow at large `|r_k| t` (also in derivatives).

    **Arguments:** `r`, `c_diag` (`C_kk ≥ 0`), `z0` (`> 0`), shape `(K,)` (or broadcastable); `t`, a
    scalar or shape `(n,)`. Returns shape `(K,)` or `(n, K)`.
    """
    r, c, z0 = (jnp.asarray(as_array(n, v), dtype=float) for n, v in (("r", r), ("c_diag", c_diag), ("z0", z0)))
    t = jnp.asarray(as_array("t", t, ndim=(0, 1)), dtype=float)
    c = eqx.error_if(c, jnp.any(c < 0), "c_diag: must be >= 0 (C is PSD)")
    z0 = eqx.error_if(z0, jnp.any(z0 <= 0), "z0: must be > 0")
    r, c, z0, t = _on_time_grid(r, c, z0, t=t)
    return thm6(r, c, z0, t)


def log_orthogonal_features(r: ArrayLike, c_diag: ArrayLike, log_z0: ArrayLike, t: ArrayLike) -> Float[Array, "*n K"]:
    """`ln z_k(t)` of Thm 6 from `ln z_k0`: `ln z0 − ln(e^{−rt} + C z0 (1 − e^{−rt})/r)` (`r > 0`), else
    `ln z0 + rt − ln(1 + C z0 (e^{rt} − 1)/r)`. For initial values below the float64 range
    (`z0 < 1e-308`) and for derivatives, which stay well scaled in the logarithm."""
    r, c, lz0 = (
        jnp.asarray(as_array(n, v), dtype=float) for n, v in (("r", r), ("c_diag", c_diag), ("log_z0", log_z0))
    )
    t = jnp.asarray(as_array("t", t, ndim=(0, 1)), dtype=float)
    c = eqx.error_if(c, jnp.any(c < 0), "c_diag: must be >= 0 (C is PSD)")
    r, c, lz0, tt = _on_time_grid(r, c, lz0, t=t)
    z0 = jnp.exp(lz0)
    grow = r > 0
    rp = jnp.where(grow, r, 1.0)
    rn = jnp.where(grow, 0.0, r)
    phi = _phi(rp, tt)
    direct = lz0 - jnp.log(jnp.exp(-rp * tt) + c * z0 * phi)
    # Where C z0 lies below float64's normal range: ln(e^{−rt} + C z0 φ) = logaddexp(−rt, ln C + ln z0 + ln φ).
    tiny = (c > 0) & (phi > 0) & (c * z0 < 1e-300)
    log_term = jnp.log(jnp.where(tiny, c, 1.0)) + lz0 + jnp.log(jnp.where(tiny, phi, 1.0))
    growing = jnp.where(tiny, lz0 - jnp.logaddexp(-rp * tt, log_term), direct)
    other = lz0 + rn * tt - jnp.log1p(c * z0 * _phi(-rn, tt))
    return jnp.where(grow, growing, other)


def isotropic_modes(gamma: ArrayLike, c: ArrayLike, z0: ArrayLike, t: ArrayLike) -> Float[Array, "*n K"]:
    """Thm 7, co-diagonal case (`M0` diagonal in `Y`'s eigenbasis): the solution of
    `ż_k = 2 z_k (γ_k − 4c z_k)` (Thm 6 with `r → 2γ`, `C → 8c`),

    `z_k(t) = γ_k z_k0 / (4c z_k0 + (γ_k − 4c z_k0) e^{−2γ_k t})`,   and for `γ_k = 0`
    `z_k(t) = z_k0 / (1 + 8c z_k0 t)`

    (the γ = 0 case of Thm 16, Eq. 257, with `κ = 4c`). The two are one expression, evaluated
    without cancellation near `γ_k = 0`: the value and its derivatives are continuous there
    (`∂z_k/∂γ_k` at `γ_k = 0` is the limit of the general formula's).

    **Arguments:** `gamma` (eigenvalues `γ_k` of `Y`), `c ≥ 0`, `z0` (`> 0`), shape `(K,)` (or
    broadcastable); `t`, a scalar or shape `(n,)`.

    **Returns:** `z_k(t)`, shape `(K,)` or `(n, K)`.

    **Raises:** `LvflowError` for non-finite input; a run-time error (`equinox.error_if`) for `c < 0`
    or `z0 ≤ 0`."""
    c = jnp.asarray(as_array("c", c), dtype=float)
    c = eqx.error_if(c, jnp.any(c < 0), "c: must be >= 0")
    return orthogonal_features(2 * jnp.asarray(gamma, dtype=float), 8 * c, z0, t)


def projector_modes(gamma: ArrayLike, kappa: ArrayLike, z0: ArrayLike, t: ArrayLike) -> Float[Array, "*n K"]:
    """Thm 16: for `M = Σ_a z_a Π_a` with orthogonal projectors obeying `YΠ_a + Π_aY = 2γ_aΠ_a` and
    `K(Π_b)Π_a + Π_aK(Π_b) = 2κ_a δ_ab Π_a`, each strength obeys `ż_a = 2 z_a (γ_a − κ_a z_a)`, the
    logistic `z_a(t) = γ_a z_a0 / (κ_a z_a0 + (γ_a − κ_a z_a0) e^{−2γ_a t})`. (Saxe et al.'s
    deep-linear solution, Cor. 4, `ρ̇ = 4ρ(τ − cρ)`, is `projector_modes(2τ, 2c, ρ0, t)`.)"""
    return orthogonal_features(2 * jnp.asarray(gamma, dtype=float), 2 * jnp.asarray(kappa, dtype=float), z0, t)


def isotropic_riccati(Y: ArrayLike, c: ArrayLike, M0: ArrayLike, t: ArrayLike) -> Float[Array, "*n p p"]:
    """Thm 7: the solution of the matrix Riccati flow `Ṁ = YM + MY − 8cM²` (isotropic samples,
    `(1/m) Σ_μ (A_μ)_ij (A_μ)_kl = c/2 (δ_ik δ_jl + δ_il δ_jk)`),

    `M(t) = e^{Yt} M0 [I + 8c Φ(t) M0]⁻¹ e^{Yt}`,   `Φ(t) = ∫₀ᵗ e^{2Yτ} dτ = ½ Y⁻¹ (e^{2Yt} − I)`.

    Evaluated in `Y`'s eigenbasis (`Y = Q diag(γ) Qᵀ`) as `M = X (I + 8c G X)⁻¹` with
    `X = e^{Yt} M0 e^{Yt}` and `G = e^{−Yt} Φ e^{−Yt} = diag((1 − e^{−2γt})/(2γ))`: the same
    matrix, with `G → t` exactly on zero eigenvalues of `Y` and no `e^{Yt} · e^{−Yt}` cancellation.
    Valid while `e^{γ t}` is representable (`γ t ≲ 350`).

    **Arguments:** `Y` symmetric `(p, p)`; `c ≥ 0`; `M0` symmetric PSD `(p, p)`; `t` scalar or `(n,)`.
    """
    Y = as_array("Y", Y, ndim=2)
    M0 = as_array("M0", M0, ndim=2)
    check_symmetric("Y", Y)
    check_symmetric("M0", M0)
    if np.shape(Y) != np.shape(M0):
        raise LvflowError(f"M0: shape {np.shape(M0)} does not match Y's {np.shape(Y)}")
    c = jnp.asarray(as_array("c", c, ndim=0), dtype=float)
    c = eqx.error_if(c, c < 0, "c: must be >= 0")
    t = jnp.asarray(as_array("t", t, ndim=(0, 1)), dtype=float)
    return _riccati(jnp.asarray(Y, dtype=float), c, jnp.asarray(M0, dtype=float), t)


@jax.jit
def _riccati(Y, c, M0, t):
    gamma, Q = jnp.linalg.eigh(Y)
    Mt0 = Q.T @ M0 @ Q
    p = gamma.shape[0]

    def at(s):
        e = jnp.exp(gamma * s)
        X = e[:, None] * Mt0 * e[None, :]
        G = _phi(2 * gamma, s)
        Mt = jnp.linalg.solve(jnp.eye(p) + 8 * c * X * G[None, :], X)  # (I + 8c X G)⁻¹ X = X (I + 8c G X)⁻¹
        Mt = (Mt + Mt.T) / 2
        return Q @ Mt @ Q.T

    return jax.vmap(at)(t) if t.ndim == 1 else at(t)


def _log1mexp(x, xp):
    """`ln(1 − eˣ)` for `x < 0`, accurate at both ends (`ln(−expm1 x)` near 0, `log1p(−eˣ)` below
    `−ln 2`); each branch sees only its own arguments, so neither puts a NaN into the derivative."""
    near = x > -_LN2
    return xp.where(near, xp.log(-xp.expm1(xp.where(near, x, -1.0))), xp.log1p(-xp.exp(xp.where(near, -1.0, x))))


def switch_on_time(
    r: Float[ArrayLike, "..."],
    log_c: Float[ArrayLike, "..."],
    log_z0: Float[ArrayLike, "..."],
    log_T: Float[ArrayLike, "..."],
    xp=jnp,
    *,
    log_gap_T: Float[ArrayLike, "..."] | None = None,
) -> Float[ArrayLike, "..."]:
    """Eq. 158, Thm 6 inverted: the time `z_k` of `ż_k = z_k (r_k − c_k z_k)` takes from `z_k0` to
    `T_k`, `t = (1/r_k) [ln(T_k/z_k0) + ln(1 − c_k z_k0/r_k) − ln(1 − c_k T_k/r_k)]`, from the
    logarithms of `c_k`, `z_k0`, `T_k` (exact where `z_k0` or `c_k z_k0` is subnormal; `ln c_k = −inf`
    for `c_k = 0`). The one implementation behind `ignition_time` and `solve_lv`'s closed form.

    **Arguments:**

    - `r`, `log_c`, `log_z0`, `log_T`: broadcastable arrays, finite (`log_c` may be `−inf`).
    - `xp`: `numpy` or `jax.numpy`.
    - `log_gap_T`: `ln(1 − c_k T_k/r_k)` where the caller knows it exactly (a target `T_k = ρ r_k/c_k`:
      `log1p(−ρ)`, exact for `ρ` near 1, where it would be formed from `ln T_k` by cancellation);
      by default formed from `log_T`.

    **Returns:** `t`: 0 where `z_k0 ≥ T_k`, `inf` where `z_k` never reaches `T_k` (`r_k ≤ 0` or
    `c_k T_k ≥ r_k`).
    """
    grows = r > 0
    safe_r = xp.where(grows, r, 1.0)
    log_r = xp.log(safe_r)
    x_T = log_c + log_T - log_r  # ln(c T / r) < 0: T below the saturation r/c
    above = log_z0 >= log_T
    below_saturation = (x_T < 0) if log_gap_T is None else (log_gap_T > -xp.inf)
    reached = grows & below_saturation & ~above
    x_0 = xp.where(reached, log_c + log_z0 - log_r, -1.0)  # ln(c z0 / r) < ln(c T / r)
    if log_gap_T is None:
        gap_T = _log1mexp(xp.where(reached, x_T, -1.0), xp)
    else:
        gap_T = xp.where(reached, log_gap_T, 0.0)
    t = (log_T - log_z0 + _log1mexp(x_0, xp) - gap_T) / safe_r
    return xp.where(above, 0.0, xp.where(reached, xp.maximum(t, 0.0), xp.inf))


def ignition_time(zeta: ArrayLike, C_k: ArrayLike, c_k: ArrayLike, eps: ArrayLike, *, a: float = 1, rho=0.5):
    """The switch-on time of Thm 8 (Eq. 158): with `z_k0 = c_k ε`, the time `z_k` reaches `ρ z_k(∞)`,

    `t*_k = (1/(a ζ_k)) [ ln(1/ε) − ln( C_k c_k / (ζ_k − C_k c_k ε) · (1−ρ)/ρ ) ]  ~  ln(1/ε)/(a ζ_k)`,

    exact for Thm 6 (`a = 1`, `ζ_k = r_k`, `C_k = C_kk`) and Thm 7 (`a = 2`, `ζ_k = γ_k`, `C_k = 4c`).
    Returns `inf` for `ζ_k ≤ 0` (the mode never switches on) and `0` for a mode that starts at or
    above its target (`c_k ε ≥ ρ ζ_k / C_k`). Evaluated from the logarithms `ln ε`, `ln C_k`,
    `ln c_k` (`host_log`: in float64 on the host for Python or numpy input), so a subnormal `ε` or
    `C_k c_k ε` gives the exact time; by numpy for known values, by JAX (differentiable) under a
    transformation.

    **Arguments:** `zeta`, `C_k`, `c_k`, `eps`, broadcastable to one shape; `a > 0`; `rho ∈ (0, 1)`.

    **Returns:** `t*_k`, an array of the broadcast shape.

    **Raises:** `LvflowError` naming the input: shapes that do not broadcast, booleans, NaN/inf,
    `C_k`, `c_k` or `eps` not positive, `rho` outside `(0, 1)` (under `jit`, the value checks are
    run-time errors, `equinox.error_if`).
    """
    rho = as_array("rho", rho, ndim=0)
    rho = fail_if(
        rho,
        (rho <= 0) | (rho >= 1),
        "rho: must lie in (0, 1)",
        detail=lambda: f"rho: must lie in (0, 1), got {float(rho):g}",
    )
    a = check_positive("a", a)
    names = ("zeta", "C_k", "c_k", "eps")
    vals = [as_array(n, v, allow_bool=False) for n, v in zip(names, (zeta, C_k, c_k, eps))]
    try:
        shape = np.broadcast_shapes(*(np.shape(v) for v in vals))
    except ValueError:
        raise LvflowError(
            "zeta, C_k, c_k, eps: shapes " + ", ".join(str(np.shape(v)) for v in vals) + " do not broadcast together"
        ) from None
    zeta, C_k, c_k, eps = vals
    C_k, c_k, eps = (fail_if(v, v <= 0, f"{n}: must be > 0") for n, v in (("C_k", C_k), ("c_k", c_k), ("eps", eps)))
    # ln C_k, ln(c_k ε): C_k c_k ε (or ε itself) may be subnormal, their logs are not
    log_C, log_z0 = host_log(C_k), host_log(c_k) + host_log(eps)
    xp = _namespace(zeta, log_C, log_z0, rho)  # numpy for known values: no compilation per shape
    rates, log_C, log_z0 = (xp.broadcast_to(xp.asarray(v, dtype=float), shape) for v in (zeta, log_C, log_z0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        live = rates > 0
        log_T = xp.log(rho) + xp.log(xp.where(live, rates, 1.0)) - log_C  # T_k = ρ ζ_k/C_k
        # c T / r = ρ exactly: ln(1 − ρ) from ρ, not from ln T (cancellation as ρ → 1)
        t = switch_on_time(rates, log_C, log_z0, log_T, xp, log_gap_T=xp.log1p(-rho))
        return xp.where(live, t / a, xp.inf)


class XiSolution(eqx.Module):
    """Solution of a ξ-ODE (Thm 4 or Thm 5): `ts`, `xi` (`(n,)` or `(n, m)`), mode strengths `zs`
    `(n, K)`, and for Thm 4 the weights `W` `(n, p, d)` (`None` for Thm 5); `losses` `(n, m)` are the
    per-sample squared residuals `Δ_μ²`, and `loss` their mean (Eq. 26)."""

    ts: Float[Array, " n"]
    xi: Float[Array, "n *m"]  # noqa: F821 (jaxtyping's variadic dims)
    zs: Float[Array, "n K"]
    W: Float[Array, "n p d"] | None
    losses: Float[Array, "n m"]
    loss: Float[Array, " n"]


def _solve_xi(field, xi0: Array, ts: Array, rtol, atol, max_steps) -> Array:
    """`ξ(ts)` of `ξ̇ = field(t, ξ, None)` from `ξ(0) = xi0` (Dopri5, a PID controller)."""
    import diffrax as dfx  # here: `ignition_time` (`lvflow predict`, `eps_merge`) does not pay its import

    sol = dfx.diffeqsolve(
        dfx.ODETerm(field),
        dfx.Dopri5(),
        0.0,
        ts[-1],
        None,
        xi0,
        saveat=dfx.SaveAt(ts=ts),
        stepsize_controller=dfx.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps,
    )
    assert isinstance(sol.ys, jax.Array)  # SaveAt(ts=ts) of an array state
    return sol.ys


def _check_ts(ts: ArrayLike) -> Float[Array, " n"]:
    ts = as_array("ts", ts, ndim=1)
    if np.size(ts) == 0:
        raise LvflowError("ts: is empty")
    ts = jnp.asarray(ts, dtype=float)
    bad = (ts[0] < 0) | jnp.any(jnp.diff(ts) < 0)
    return eqx.error_if(ts, bad, "ts: must be non-negative and non-decreasing")


def proportional_samples(
    A: ArrayLike, c: ArrayLike, y: ArrayLike, W0: ArrayLike, ts: ArrayLike, *, rtol=1e-10, atol=1e-12, max_steps=16384
) -> XiSolution:
    """Thm 4 (proportional samples, `A_μ = c_μ A`, `A = P Λ Pᵀ`): gradient flow (Eq. 27) keeps
    `W(t) = P e^{−ξ(t) Λ} Pᵀ W0`, with the scalar `ξ(t) = ∫₀ᵗ h` of `H = h A` obeying

    `ξ̇ = α Σ_j λ_j z_j0 e^{−2 λ_j ξ} − β`,   `α = (4/m) Σ_μ c_μ²`,  `β = (4/m) Σ_μ c_μ y_μ`,

    (equivalently `t = ∫₀^ξ ds / (α Σ_j λ_j z_j0 e^{−2λ_j s} − β)`), `z_j0 = (Pᵀ W0 W0ᵀ P)_jj`;
    the mode strengths are `z_j(t) = z_j0 e^{−2 λ_j ξ(t)}`.

    **Arguments:** `A` symmetric `(p, p)`; `c`, `y` shape `(m,)`; `W0` `(p, d)`; save times `ts`
    (from 0). Returns an `XiSolution` with `W`.
    """
    A = as_array("A", A, ndim=2)
    check_symmetric("A", A)
    c = jnp.asarray(as_array("c", c, ndim=1), dtype=float)
    y = jnp.asarray(as_array("y", y, ndim=1), dtype=float)
    W0 = jnp.asarray(as_array("W0", W0, ndim=2), dtype=float)
    if c.shape != y.shape:
        raise LvflowError(f"y: shape {y.shape} does not match c's {c.shape}")
    if W0.shape[0] != np.shape(A)[0]:
        raise LvflowError(f"W0: shape {W0.shape} does not match A's {np.shape(A)} (need (p, d))")
    ts = _check_ts(ts)
    m = c.shape[0]
    lam, P = jnp.linalg.eigh(jnp.asarray(A, dtype=float))
    z0 = jnp.sum((P.T @ W0) ** 2, axis=1)
    alpha, beta = 4.0 / m * jnp.sum(c**2), 4.0 / m * jnp.sum(c * y)
    logz0 = jnp.log(jnp.where(z0 > 0, z0, 1.0))

    def field(t, xi, args):
        return alpha * jnp.sum(jnp.where(z0 > 0, lam * jnp.exp(logz0 - 2 * lam * xi), 0.0)) - beta

    xi = _solve_xi(field, jnp.zeros(()), ts, rtol, atol, max_steps)
    zs = z0[None] * jnp.exp(-2 * lam[None] * xi[:, None])
    W = jnp.einsum("pk,nk,qk,qd->npd", P, jnp.exp(-xi[:, None] * lam[None]), P, W0)
    out = c[None, :] * (zs @ lam)[:, None]
    losses = (out - y[None]) ** 2
    return XiSolution(ts=ts, xi=xi, zs=zs, W=W, losses=losses, loss=jnp.mean(losses, axis=1))


def orthogonal_samples(
    lam: ArrayLike, y: ArrayLike, z0: ArrayLike, ts: ArrayLike, *, rtol=1e-10, atol=1e-12, max_steps=16384
) -> XiSolution:
    """Thm 5 (orthogonal samples, `A_μ A_ν = 0` for `μ ≠ ν`): with `ξ_μ(t) = ∫₀ᵗ Δ_μ`,

    `z_k = z_k0 exp(−(8/m) Σ_ν ξ_ν λ_{ν,k})`,   `ξ̇_μ = Σ_k λ_{μ,k} z_k − y_μ`,

    which for disjoint supports decouples into one ODE per sample,
    `ξ̇_μ = Σ_k λ_{μ,k} z_k0 e^{−(8/m) λ_{μ,k} ξ_μ} − y_μ`, so each sample's loss drops once (Fig 4).
    (The coupled form is solved, so it is exact under Assumption 1 even without disjoint supports.)

    **Arguments:** `lam` `(m, K)`, the eigenvalues `λ_{μ,k}` of each `A_μ` in the shared basis;
    `y` `(m,)`; `z0` `(K,)`, `> 0`; save times `ts`.
    """
    lam = jnp.asarray(as_array("lam", lam, ndim=2), dtype=float)
    y = jnp.asarray(as_array("y", y, ndim=1), dtype=float)
    z0 = jnp.asarray(as_array("z0", z0, ndim=1), dtype=float)
    m, K = lam.shape
    if y.shape != (m,) or z0.shape != (K,):
        raise LvflowError(f"y, z0: shapes {y.shape}, {z0.shape} do not match lam's {lam.shape} (need (m,), (K,))")
    z0 = eqx.error_if(z0, jnp.any(z0 <= 0), "z0: must be > 0")
    ts = _check_ts(ts)

    def z_of(xi):
        return jnp.exp(jnp.log(z0) - 8.0 / m * (xi @ lam))

    def field(t, xi, args):
        return lam @ z_of(xi) - y

    xi = _solve_xi(field, jnp.zeros(m), ts, rtol, atol, max_steps)
    zs = jax.vmap(z_of)(xi)
    losses = (zs @ lam.T - y[None]) ** 2
    return XiSolution(ts=ts, xi=xi, zs=zs, W=None, losses=losses, loss=jnp.mean(losses, axis=1))
