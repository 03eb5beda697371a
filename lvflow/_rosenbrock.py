"""RODAS5P, a stiffly accurate Rosenbrock method, for the gLV in `ln z` with structured stage solves."""

from __future__ import annotations

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ._crossing import _bisect
from ._interaction import _Interaction, _exp
from ._solution import LVSolution, finish_solution, switch_on_target


class _RosenbrockTableau(eqx.Module):
    """A stiffly accurate Rosenbrock method in Hairer–Wanner's transformed form (*Solving ODEs
    II*, §IV.7): stage `i` solves `(1/(hγ) − J) U_i = f(u0 + Σ_j a_ij U_j) + Σ_j (c_ij/h) U_j`, and
    `u1 = u0 + Σ_j a_sj U_j + U_s` (the last stage's argument plus the last stage); the embedded
    solution of one order lower differs by `U_s` alone, the error estimate. Dense output:
    `u(t0 + θh) = (1−θ) u0 + θ (u1 + (1−θ)(k₁ + θ (k₂ + θ k₃)))`, `k_m = Σ_j dense_mj U_j`."""

    gamma: float = eqx.field(static=True)
    a: tuple = eqx.field(static=True)
    c: tuple = eqx.field(static=True)
    dense: tuple = eqx.field(static=True)
    order: int = eqx.field(static=True)  # of the embedded solution + 1: step control exponent 1/order


# RODAS5P (Steinebach 2023; the coefficients of OrdinaryDiffEq.jl's Rodas5P): 8 stages, order
# 5(4), L-stable, dense output of order 4. Chosen over Di Marzo's RODAS5, whose embedded estimate
# vanishes like h⁷ in the gLV's growth phase (u̇ ≈ r): it let steps grow until the true error was
# 100x the tolerance (1e-6 global error at rtol 1e-10). RODAS4 (6 stages) took 2.3x the steps.
_RODAS5P_A6 = (-7.502846399306121, 2.561846144803919, -11.627539656261098, -0.18268767659942256, 0.030198172008377946)
_RODAS5P = _RosenbrockTableau(
    gamma=0.21193756319429014,
    a=(
        (),
        (3.0,),
        (2.849394379747939, 0.45842242204463923),
        (-6.954028509809101, 2.489845061869568, -10.358996098473584),
        (2.8029986275628964, 0.5072464736228206, -0.3988312541770524, -0.04721187230404641),
        _RODAS5P_A6,
        _RODAS5P_A6 + (1.0,),
        _RODAS5P_A6 + (1.0, 1.0),
    ),
    c=(
        (),
        (-14.155112264123755,),
        (-17.97296035885952, -2.859693295451294),
        (147.12150275711716, -1.41221402718213, 71.68940251302358),
        (165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306),
        (24.854864614690072, -3.0009227002832186, 47.4931110020768, 5.5814197821558125, -0.6610691825249471),
        (30.91273214028599, -3.1208243349937974, 77.79954646070892, 34.28646028294783, -19.097331116725623,
         -28.087943162872662),
        (37.80277123390563, -3.2571969029072276, 112.26918849496327, 66.9347231244047, -40.06618937091002,
         -54.66780262877968, -9.48861652309627),
    ),
    dense=(
        (25.948786856663858, -2.5579724845846235, 10.433815404888879, -2.3679251022685204, 0.524948541321073,
         1.1241088310450404, 0.4272876194431874, -0.17202221070155493),
        (-9.91568850695171, -0.9689944594115154, 3.0438037242978453, -24.495224566215796, 20.176138334709044,
         15.98066361424651, -6.789040303419874, -6.710236069923372),
        (11.419903575922262, 2.8879645146136994, 72.92137995996029, 80.12511834622643, -52.072871366152654,
         -59.78993625266729, -0.15582684282751913, 4.883087185713722),
    ),
    order=5,
)


def _rodas_dense(ua, ub, ks, theta):
    k1, k2, k3 = ks
    return (1 - theta) * ua + theta * (ub + (1 - theta) * (k1 + theta * (k2 + theta * k3)))


_SAFETY, _FAC_MIN, _FAC_MAX = 0.9, 0.2, 6.0  # step-size factor bounds (rodas.f: 1/6 … 5)
_DENSE_ROSENBROCK_MAX_K = 100  # above this a dense C's O(K³) LU per step costs more than Dopri5's extra steps


def _rodas_step(tableau, field, op, u0, z0, f0, h):
    """One Rosenbrock step from `u0` (`z0 = e^{u0}`, `f0 = f(u0)`): `(u1, error estimate, dense-output
    coefficients)`;
    `J = −C Diag(z0)` enters only through `op.shifted_solver` (`(1/(hγ)) I − J`)."""
    solve = op.shifted_solver(1.0 / (h * tableau.gamma), z0)
    inv_h = 1.0 / h
    U = []
    arg = u0
    for i in range(len(tableau.a)):
        if i:
            arg = u0 + sum(a * Uj for a, Uj in zip(tableau.a[i], U))
        # (Σ c_ij U_j)/h, not Σ (c_ij/h) U_j: on XLA's CPU runtime the 28 scalar divisions were
        # 28 of a 1000-mode step's 180 kernels (jax.profiler)
        rhs = f0 if i == 0 else field(_exp(arg))
        if i:
            rhs = rhs + inv_h * sum(c * Uj for c, Uj in zip(tableau.c[i], U))
        U.append(solve(rhs))
    ks = tuple(sum(w * Uj for w, Uj in zip(row, U)) for row in tableau.dense)
    return arg + U[-1], U[-1], ks


def _rosenbrock_run(r, op, u0, t1, ts, target, rtol, atol, max_steps, tableau=_RODAS5P, meter=None):
    """Adaptive RODAS5P (by default) on `u̇ = r − C e^u` from 0 to `t1` in one `lax.while_loop`,
    saving at `ts` and catching, per accepted step, every mode's first upward crossing of `target`
    (its step's end values and dense-output coefficients kept for a root search after the loop):
    no step history.

    `meter`: a diffrax progress meter driven with `t/t1` after every step, exactly as
    `diffrax.diffeqsolve` drives it (`init` before the loop, `step` in its body, `close` after);
    `None` (or `diffrax.NoProgressMeter`) leaves the loop without callbacks."""
    meter = dfx.NoProgressMeter() if meter is None else meter
    K = u0.shape[-1]
    n = ts.shape[0]

    def field(z):
        return r - op.Cz(z)

    def save(j, zs, t_hi, t_lo, h, ua, ub, ks):
        # every ts[j] ≤ t_hi not yet saved lies in [t_lo, t_hi]: the step's dense output
        def cond(c):
            return (c[0] < n) & (ts[jnp.minimum(c[0], n - 1)] <= t_hi)

        def body(c):
            j, zs = c
            s = jnp.where(h > 0, (ts[j] - t_lo) / jnp.where(h > 0, h, 1.0), 1.0)
            u = _rodas_dense(ua, ub, ks, s)
            return j + 1, jax.lax.dynamic_update_index_in_dim(zs, jnp.exp(u), j, 0)

        return jax.lax.while_loop(cond, body, (j, zs))

    z0 = _exp(u0)
    f0 = field(z0)
    scale0 = atol + rtol * jnp.abs(u0)
    d0, d1 = jnp.max(jnp.abs(u0) / scale0), jnp.max(jnp.abs(f0) / scale0)
    h0 = jnp.where((d0 > 1e-5) & (d1 > 1e-5), 0.01 * d0 / jnp.where(d1 > 0, d1, 1.0), 1e-6)
    # A power of two: the guess is rough anyway, and rounding it makes the step sequence immune to
    # last-bit differences in d0/d1 (e.g. constant folding under an enclosing jit).
    h0 = jnp.minimum(2.0 ** jnp.floor(jnp.log2(h0)), t1)
    zeros = jnp.zeros(K)
    j0, zs0 = save(0, jnp.full((n, K), jnp.inf), 0.0, 0.0, 0.0, u0, u0, (zeros,) * 3)
    at0 = u0 >= target
    # bracket of each mode's first crossing: step start, length, g = u − target at both ends, and
    # the step's dense-output coefficients
    bracket = (zeros, zeros, zeros - 1.0, zeros, zeros, zeros, zeros)
    # controller memory: last accepted step and its error (h_acc = 0 before the first), last rejected
    ctrl = (jnp.asarray(0.0), jnp.asarray(1.0), jnp.asarray(False))
    counts = (jnp.asarray(0), jnp.asarray(0), jnp.asarray(False))  # accepted, rejected, step underflow
    # The meter's state rides in the loop carry; NoProgressMeter's is `None`, an empty pytree.
    state = (jnp.asarray(0.0), u0, z0, f0, h0, ctrl, j0, zs0, ~at0, bracket) + counts + (meter.init(),)

    def cond(st):
        t, *_, n_acc, n_rej, bad, _ = st
        return (t < t1) & (n_acc + n_rej < max_steps) & ~bad

    def body(st):
        t, u, z, f, h, (h_acc, err_acc, rejected), j, zs, pending, bracket, n_acc, n_rej, bad, meter_state = st
        last = h >= t1 - t
        h = jnp.where(last, t1 - t, h)
        u1, err_u, ks = _rodas_step(tableau, field, op, u, z, f, h)
        z1 = _exp(u1)
        f1 = field(z1)
        err = jnp.max(jnp.abs(err_u) / (atol + rtol * jnp.maximum(jnp.abs(u), jnp.abs(u1))))
        finite = jnp.isfinite(err) & jnp.all(jnp.isfinite(f1))
        accept = finite & (err <= 1.0)
        k = tableau.order
        fac = jnp.clip(_SAFETY * jnp.where(finite, err, jnp.inf) ** (-1.0 / k), _FAC_MIN, _FAC_MAX)
        # Gustafsson's predictive controller (as in Hairer's rodas.f/radau5.f) on accepted steps:
        # the smaller of the plain factor and one extrapolated from the last two errors, never a
        # growth right after a rejection. Fewer rejected steps than the plain controller.
        safe_err = jnp.maximum(jnp.where(finite, err, 1.0), 1e-10)
        gus = _SAFETY * (h / jnp.where(h_acc > 0, h_acc, 1.0)) * (err_acc / safe_err**2) ** (1.0 / k)
        fac_acc = jnp.where(h_acc > 0, jnp.minimum(fac, jnp.clip(gus, _FAC_MIN, _FAC_MAX)), fac)
        fac_acc = jnp.where(rejected, jnp.minimum(fac_acc, 1.0), fac_acc)
        h_next = h * jnp.where(accept, fac_acc, jnp.minimum(fac, 1.0))
        ctrl = (jnp.where(accept, h, h_acc), jnp.where(accept, jnp.maximum(err, 1e-2), err_acc), ~accept)
        t_new = jnp.where(last, t1, t + h)
        j, zs = jax.lax.cond(accept, lambda: save(j, zs, t_new, t, h, u, u1, ks), lambda: (j, zs))
        cross = accept & pending & (u1 >= target)
        new = (jnp.full(K, t), jnp.full(K, h), u - target, u1 - target) + ks
        bracket = tuple(jnp.where(cross, a, b) for a, b in zip(new, bracket))
        t_next = jnp.where(accept, t_new, t)
        return (
            t_next,
            jnp.where(accept, u1, u),
            jnp.where(accept, z1, z),
            jnp.where(accept, f1, f),
            h_next,
            ctrl,
            j,
            zs,
            pending & ~cross,
            bracket,
            n_acc + accept,
            n_rej + ~accept,
            h_next <= 1e-14 * jnp.maximum(jnp.abs(t), 1.0),  # step size underflow
            meter.step(meter_state, t_next / t1),  # progress = t/t1 (diffrax: (t − t0)/(t1 − t0))
        )

    t, u, _, _, _, _, _, zs, pending, bracket, n_acc, n_rej, bad, meter_state = jax.lax.while_loop(cond, body, state)
    meter.close(meter_state)
    ta, hb, ga, gb, *ks = bracket
    crossed = ~at0 & ~pending
    ga, gb = jnp.where(crossed, ga, -1.0), jnp.where(crossed, gb, 1.0)
    s = _bisect(lambda s: _rodas_dense(ga, gb, ks, s), ga)
    t_star = jnp.where(at0, 0.0, jnp.where(crossed, ta + s * hb, jnp.inf))
    result = dfx.RESULTS.where(
        t >= t1,
        dfx.RESULTS.successful,
        dfx.RESULTS.where(bad, dfx.RESULTS.dt_min_reached, dfx.RESULTS.max_steps_reached),
    )
    return zs, u, t_star, n_acc, n_rej, result


@eqx.filter_jit
def _rosenbrock_core(
    r: Float[Array, " K"],
    op: _Interaction,
    u0: Float[Array, " K"],
    t1: Float[Array, ""],
    ts: Float[Array, " n"],
    z_eq: Float[Array, " K"],
    eq_ok: Bool[Array, ""],
    rho: Float[Array, ""],
    y2: Float[Array, ""],
    rtol: Float[Array, ""],
    atol: Float[Array, ""],
    *,
    max_steps: int,
    progress: bool = False,
) -> LVSolution:
    """`_solve_core` with RODAS5P and structured stage solves instead of diffrax. `progress`
    (static) drives a `diffrax.TqdmProgressMeter` through the main pass; `False` compiles the loop
    without it. The first pass for a non-unique `z(∞)` (inside a `lax.cond`, which `vmap` may turn
    into a select of both branches) runs without a bar."""

    # z(∞) not unique: a first pass gives z(t1). `vmap` turns this cond on a batched predicate into
    # both branches and a select: the pass's horizon is 0 where z(∞) is unique, so that batched
    # its loop stops as soon as no member needs it, instead of a full extra solve per system.
    def z_at_t1():
        no_target = jnp.full_like(u0, jnp.inf)
        first_t1 = jnp.where(eq_ok, 0.0, t1)
        return jnp.exp(_rosenbrock_run(r, op, u0, first_t1, ts[:1], no_target, rtol, atol, max_steps)[1])

    z_inf = jax.lax.cond(eq_ok, lambda: z_eq, z_at_t1)
    live = z_inf > 0
    target = jnp.where(live, switch_on_target(z_inf, rho), jnp.inf)  # a dead mode never crosses
    meter = dfx.TqdmProgressMeter() if progress else dfx.NoProgressMeter()
    zs, u_end, t_star, n_acc, n_rej, result = _rosenbrock_run(
        r, op, u0, t1, ts, target, rtol, atol, max_steps, meter=meter
    )
    return finish_solution(
        ts=ts,
        zs=zs,
        Czs=op.Cz(zs),
        r=r,
        y2=y2,
        switch_on_times=jnp.where(live, t_star, jnp.inf),
        z_inf=z_inf,
        rho=rho,
        z_end=u_end,
        num_steps=n_acc + n_rej,
        num_accepted=n_acc,
        num_rejected=n_rej,
        result=result,
    )
