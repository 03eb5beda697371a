"""RODAS5P, a stiffly accurate L-stable Rosenbrock method of order 5(4), as a diffrax solver."""

from __future__ import annotations

from typing import ClassVar

import diffrax as dfx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, PyTree

from .._core.errors import LvflowError
from .term import LogLotkaVolterraTerm

# RODAS5P (Steinebach 2023; the coefficients of OrdinaryDiffEq.jl's Rodas5PTableau), in Hairer and
# Wanner's transformed form (Solving ODEs II, §IV.7): stage i solves
#   (1/(hγ) I − J) U_i = f(t0 + c_i h, u0 + Σ_j a_ij U_j) + h d_i ∂f/∂t + (Σ_j C_ij U_j)/h,
# u1 = u0 + Σ_j a_8j U_j + U_8 (stiffly accurate: the last stage's argument plus the last stage),
# and the embedded order-4 solution differs by U_8 alone, the error estimate.
_GAMMA = 0.21193756319429014
_A6 = (-7.502846399306121, 2.561846144803919, -11.627539656261098, -0.18268767659942256, 0.030198172008377946)
_A = (
    (),
    (3.0,),
    (2.849394379747939, 0.45842242204463923),
    (-6.954028509809101, 2.489845061869568, -10.358996098473584),
    (2.8029986275628964, 0.5072464736228206, -0.3988312541770524, -0.04721187230404641),
    _A6,
    _A6 + (1.0,),
    _A6 + (1.0, 1.0),
)
_C = (
    (),
    (-14.155112264123755,),
    (-17.97296035885952, -2.859693295451294),
    (147.12150275711716, -1.41221402718213, 71.68940251302358),
    (165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306),
    (24.854864614690072, -3.0009227002832186, 47.4931110020768, 5.5814197821558125, -0.6610691825249471),
    (
        30.91273214028599,
        -3.1208243349937974,
        77.79954646070892,
        34.28646028294783,
        -19.097331116725623,
        -28.087943162872662,
    ),
    (
        37.80277123390563,
        -3.2571969029072276,
        112.26918849496327,
        66.9347231244047,
        -40.06618937091002,
        -54.66780262877968,
        -9.48861652309627,
    ),
)
_NODES = (0.0, 0.6358126895828704, 0.4095798393397535, 0.9769306725060716, 0.4288403609558664, 1.0, 1.0, 1.0)
_D = (
    0.21193756319429014,
    -0.42387512638858027,
    -0.3384627126235924,
    1.8046452872882734,
    2.325825639765069,
    0.0,
    0.0,
    0.0,
)
# Dense output u(t0 + θh) = (1−θ) u0 + θ (u1 + (1−θ)(k₁ + θ (k₂ + θ k₃))), k_m = Σ_j H_mj U_j.
_H = (
    (
        25.948786856663858,
        -2.5579724845846235,
        10.433815404888879,
        -2.3679251022685204,
        0.524948541321073,
        1.1241088310450404,
        0.4272876194431874,
        -0.17202221070155493,
    ),
    (
        -9.91568850695171,
        -0.9689944594115154,
        3.0438037242978453,
        -24.495224566215796,
        20.176138334709044,
        15.98066361424651,
        -6.789040303419874,
        -6.710236069923372,
    ),
    (
        11.419903575922262,
        2.8879645146136994,
        72.92137995996029,
        80.12511834622643,
        -52.072871366152654,
        -59.78993625266729,
        -0.15582684282751913,
        4.883087185713722,
    ),
)


def _ode_term(terms: dfx.AbstractTerm) -> dfx.ODETerm | LogLotkaVolterraTerm:
    """The ODE term inside the terms a solver is handed: `diffrax.diffeqsolve` wraps the user's term
    in a term of its own (the direction of integration), so each wrapper holding exactly one term is
    looked through (as a pytree: its sub-terms are its leaves) until an `ODETerm` or a
    `LogLotkaVolterraTerm` is reached.

    **Raises:** `LvflowError` naming the term when it is no ODE (none, or several, inside).
    """
    term = terms
    while not isinstance(term, (dfx.ODETerm, LogLotkaVolterraTerm)):
        outer = term
        leaves = jtu.tree_leaves(outer, is_leaf=lambda x: x is not outer and isinstance(x, dfx.AbstractTerm))
        inner = [x for x in leaves if isinstance(x, dfx.AbstractTerm)]
        if len(inner) != 1:
            raise LvflowError(
                f"terms: Rodas5P solves ODEs (diffrax.ODETerm or LogLotkaVolterraTerm), got {type(outer).__name__}"
            )
        term = inner[0]
    return term


class Rodas5PInterpolation(dfx.AbstractLocalInterpolation):
    """RODAS5P's dense output on one step, of order 4:
    `y(t0 + θh) = (1−θ) y0 + θ (y1 + (1−θ)(k₁ + θ (k₂ + θ k₃)))`, `θ = (t − t0)/(t1 − t0)`.

    **Fields:** `t0`, `t1` (the step), `y0`, `y1` (its ends), `k` (the three coefficients, stacked
    on a leading axis of size 3 of every leaf of `y`). Each leaf is interpolated entry by entry.
    """

    t0: Array
    t1: Array
    y0: PyTree[Array]
    y1: PyTree[Array]
    k: PyTree[Array]

    def evaluate(self, t0, t1=None, left: bool = True) -> PyTree[Array]:
        del left
        if t1 is not None:
            return jtu.tree_map(jnp.subtract, self.evaluate(t1), self.evaluate(t0))
        h = self.t1 - self.t0
        theta = jnp.where(h == 0, 1.0, (t0 - self.t0) / jnp.where(h == 0, 1.0, h))

        def one(a, b, k):
            return (1 - theta) * a + theta * (b + (1 - theta) * (k[0] + theta * (k[1] + theta * k[2])))

        return jtu.tree_map(one, self.y0, self.y1, self.k)


class Rodas5P(dfx.AbstractAdaptiveSolver):
    """RODAS5P (Steinebach 2023): a Rosenbrock method with 8 stages, order 5 with an embedded
    order-4 error estimate, L-stable and stiffly accurate, with a dense output of order 4
    (`Rodas5PInterpolation`). For stiff ODEs: each step solves eight linear systems with one
    matrix `I/(hγ) − J` and no Newton iteration.

    For an `lvflow.LogLotkaVolterraTerm` the Jacobian `J = −C Diag(e^u)` is exact and the solves use
    `C`'s structure: `O(K)` for a diagonal `C`, `O(K q²)` by Woodbury for `Diag(d) + UUᵀ`, `O(K³)`
    by LU for a dense `C`. For any other ODE term (for example `diffrax.ODETerm`) `J` is formed by
    forward-mode autodiff and factorised by LU once per step, and a time-dependent vector field gets
    the method's `∂f/∂t` terms. Works with every diffrax step-size controller (`PIDController` is
    the one to use: error order 5), `SaveAt`, adjoint and progress meter. ODEs only
    (`diffrax.ODETerm` or `LogLotkaVolterraTerm`; any other term raises `LvflowError`).

    A step whose stage solves give a non-finite value returns `diffrax.RESULTS.singular`: an
    adaptive controller rejects such a step (its error estimate is not finite) and retries a
    shorter one, so the flag ends a solve only under a constant step size.

    Example:

    ```python
    term = lvflow.LogLotkaVolterraTerm.from_system(system)
    sol = diffrax.diffeqsolve(term, lvflow.Rodas5P(), 0.0, 100.0, None, jnp.log(z0),
                              stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10))
    ```
    """

    term_structure: ClassVar = dfx.AbstractTerm
    interpolation_cls: ClassVar = Rodas5PInterpolation

    def order(self, terms) -> int:
        return 5

    def error_order(self, terms) -> int:
        return 5

    def init(self, terms, t0, t1, y0, args) -> None:
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del solver_state, made_jump
        inner = _ode_term(terms)
        h = terms.contr(t0, t1)  # the step in the term's own variable (diffeqsolve's direction)
        # A zero-length step (diffrax runs the body for finished members of a vmapped batch) is
        # computed with h = 1 and then discarded: 1/h would put inf·0 = NaN into its derivative.
        zero = h == 0
        h = jnp.where(zero, 1.0, h)
        ht = t1 - t0
        alpha = 1.0 / (h * _GAMMA)
        if isinstance(inner, LogLotkaVolterraTerm) and isinstance(y0, jax.Array) and y0.shape == inner.r.shape:
            # Autonomous, with its structured solve (the wrapped term's Jacobian in y is the same).
            u0, unravel = y0, lambda v: v

            def f_term(t, u: Array) -> Array:
                return terms.vf(t, u, args)

            f = f_term

            solve = inner.shifted_solver(alpha, u0)
            dfdt = None
        else:
            u0, unravel = ravel_pytree(y0)

            def f_flat(t, u: Array) -> Array:
                return ravel_pytree(terms.vf(t, unravel(u), args))[0]

            f = f_flat

            J = jax.jacfwd(lambda u: f(t0, u))(u0)
            lu = jax.scipy.linalg.lu_factor(alpha * jnp.eye(u0.shape[0], dtype=J.dtype) - J)

            def lu_solve(b: Array) -> Array:
                return jax.scipy.linalg.lu_solve(lu, b)

            solve = lu_solve

            dfdt = jax.jvp(lambda t: f(t, u0), (t0,), (jnp.ones_like(t0),))[1]

        inv_h = 1.0 / h
        U = []
        arg = u0
        for i in range(len(_A)):
            if i:
                arg = u0 + sum(a * Uj for a, Uj in zip(_A[i], U))
            rhs = f(t0 + _NODES[i] * ht, arg)
            if dfdt is not None and _D[i] != 0.0:
                rhs = rhs + (_D[i] * ht) * dfdt
            if i:
                rhs = rhs + inv_h * sum(c * Uj for c, Uj in zip(_C[i], U))
            U.append(solve(rhs))
        # every stage feeds the last (all of its C_8j are non-zero): a non-finite stage shows in U_8
        finite = jnp.all(jnp.isfinite(U[-1]))
        # `singular` is inherited from optimistix.RESULTS: an equinox Enumeration's inherited items are
        # items of the subclass, which pyright's enum model does not know
        result = dfx.RESULTS.where(
            zero | finite,
            dfx.RESULTS.successful,
            dfx.RESULTS.singular,  # pyright: ignore[reportArgumentType]
        )
        u1 = jnp.where(zero, u0, arg + U[-1])
        err = jnp.where(zero, 0.0, U[-1])
        k = jnp.where(zero, 0.0, jnp.tensordot(jnp.asarray(_H, dtype=u0.dtype), jnp.stack(U), axes=1))
        y1 = unravel(u1)
        dense_info = dict(y0=y0, y1=y1, k=jax.vmap(unravel)(k))
        return y1, unravel(err), dense_info, None, result

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)
