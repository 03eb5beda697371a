"""Every mode's first upward crossing of its switch-on threshold (Thm 8), tracked inside a diffrax
solve in `O(K)` memory and root-found afterwards, with implicit-function derivatives."""

from __future__ import annotations

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optimistix as optx
from jaxtyping import Array, Bool, Float, PyTree

from .._core.errors import LvflowError

_BISECTION_STEPS = 64  # halves [0, 1] down to 5e-20: below float64 resolution of any step
# g(θ) < 0 at θ = 0 and ≥ 0 at θ = 1 (flip=False); tolerances on θ at float64 resolution
_BISECTION = optx.Bisection(rtol=1e-16, atol=1e-20, flip=False)


class SwitchOnState(eqx.Module):
    """`SwitchOnTracker`'s state beside the wrapped solver's (`inner`): per mode, whether it started
    at or above its threshold (`above0`), whether it is still below it (`pending`), and the first
    accepted step in which it reached it: `ta`, `tb` and the step's dense-output information
    (`dense_info`, each leaf's last axis the mode)."""

    inner: PyTree
    above0: Bool[Array, " K"]
    pending: Bool[Array, " K"]
    ta: Float[Array, " K"]
    tb: Float[Array, " K"]
    dense_info: PyTree[Array]


class SwitchOnTracker(dfx.AbstractWrappedSolver):
    """Wraps any diffrax solver of a state `y` of shape `(K,)` and records, for every mode `k`, the
    accepted step in which `y_k` first reaches `threshold_k` (for the gLV in `u = ln z`, Thm 8's
    `ln(ρ z_k(∞))`): the step's ends and its dense-output information, `O(K)` memory whatever the
    number of steps. diffrax keeps a solver's state from accepted steps only, so a rejected step
    never records a crossing. After the solve (`diffrax.SaveAt(solver_state=True)`),
    `crossing_times` finds each crossing on its step's dense output.

    Every `isinstance` check (adaptive, implicit, …) is forwarded to the wrapped solver, as for
    `diffrax.HalfSolver`.

    **Fields:**

    - `solver`: the wrapped diffrax solver (for example `lvflow.Rodas5P()`).
    - `threshold`: shape `(K,)`; `+inf` for a mode never to be tracked.
    """

    solver: dfx.AbstractSolver
    threshold: Float[Array, " K"]

    def __check_init__(self):
        if not isinstance(self.solver, dfx.AbstractSolver):
            raise LvflowError(f"solver: expected a diffrax solver, got {type(self.solver).__name__}")
        if jnp.ndim(self.threshold) != 1:
            raise LvflowError(f"threshold: expected shape (K,), got {jnp.shape(self.threshold)}")

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    # diffrax declares it a ClassVar (a callable class), forwarded here as diffrax's HalfSolver does
    def interpolation_cls(self):  # pyright: ignore[reportIncompatibleMethodOverride]
        return self.solver.interpolation_cls

    @property
    def term_compatible_contr_kwargs(self):
        return self.solver.term_compatible_contr_kwargs

    @property
    def root_finder(self):
        solver = self.solver
        assert isinstance(solver, dfx.AbstractImplicitSolver)  # diffrax reads it for an implicit solver only
        return solver.root_finder

    @property
    def scan_kind(self):
        solver = self.solver
        # diffrax reads it for a Runge–Kutta (or SRK) wrapped solver only, under some adjoints
        assert isinstance(solver, (dfx.AbstractRungeKutta, dfx.AbstractSRK))
        return solver.scan_kind

    def order(self, terms):
        return self.solver.order(terms)

    def strong_order(self, terms):
        return self.solver.strong_order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def init(self, terms, t0, t1, y0, args) -> SwitchOnState:
        if jnp.shape(y0) != jnp.shape(self.threshold):
            raise LvflowError(
                f"y0: shape {jnp.shape(y0)} does not match SwitchOnTracker's threshold {jnp.shape(self.threshold)}"
            )
        inner = self.solver.init(terms, t0, t1, y0, args)
        shapes = eqx.filter_eval_shape(self.solver.step, terms, t0, t1, y0, args, inner, False)[2]
        info = jtu.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        above0 = y0 >= self.threshold
        zeros = jnp.zeros(jnp.shape(y0), dtype=jnp.result_type(t0, float))
        return SwitchOnState(inner=inner, above0=above0, pending=~above0, ta=zeros, tb=zeros, dense_info=info)

    def step(self, terms, t0, t1, y0, args, solver_state: SwitchOnState, made_jump):
        y1, y_error, dense_info, inner, result = self.solver.step(
            terms, t0, t1, y0, args, solver_state.inner, made_jump
        )
        cross = solver_state.pending & (y1 >= self.threshold)
        keep = lambda new, old: jnp.where(cross, new, old)  # noqa: E731
        state = SwitchOnState(
            inner=inner,
            above0=solver_state.above0,
            pending=solver_state.pending & ~cross,
            ta=keep(t0, solver_state.ta),
            tb=keep(t1, solver_state.tb),
            dense_info=jtu.tree_map(keep, dense_info, solver_state.dense_info),
        )
        return y1, y_error, dense_info, state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)

    def crossing_times(self, state: SwitchOnState) -> Float[Array, " K"]:
        """`t*_k`, the first time `y_k(t) = threshold_k`, from the tracker's final state: `0` for a
        mode that started at or above its threshold, `inf` for one that never reached it, else the
        root of the recorded step's dense output minus the threshold.

        The root is found by `optimistix.root_find` with `optimistix.Bisection` on the step's
        fraction `θ ∈ [0, 1]` (below the threshold at 0, at or above it at 1), halved down to
        float64 resolution of the step; its derivative is the implicit-function one
        (`optimistix.ImplicitAdjoint`), `dt* = −∂y_k(t*)/∂θ / ẏ_k(t*)` (both from the dense output),
        so `jax.jvp` and `jax.grad` of `t*` are those of the crossing itself, not of the bisection.
        At a tangential crossing (`ẏ_k(t*) = 0`, where the true derivative is unbounded) the
        derivative is 0 (the pseudo-inverse of the zero slope). Forward in time only (`t1 > t0`).
        """
        crossed = ~state.above0 & ~state.pending
        # Modes that never crossed get a harmless placeholder step [0, 1] (masked below).
        ta = jnp.where(crossed, state.ta, 0.0)
        tb = jnp.where(crossed, state.tb, 1.0)
        threshold = jnp.where(crossed, self.threshold, 0.0)
        interp_cls = self.solver.interpolation_cls

        def g(theta, args):
            ta_k, tb_k, info_k, thr_k = args
            return interp_cls(t0=ta_k, t1=tb_k, **info_k).evaluate(ta_k + theta * (tb_k - ta_k)) - thr_k

        def one(ta_k, tb_k, info_k, thr_k):
            # Bisection's stopping rule also asks |g| < atol, which float64 rounding of g may never
            # meet: the halvings stop at `_BISECTION_STEPS` (the bracket then lies within rounding
            # of θ*), and the value is the bracket's midpoint whatever the flag.
            sol = optx.root_find(
                g,
                _BISECTION,
                jnp.asarray(0.5, dtype=ta_k.dtype),
                args=(ta_k, tb_k, info_k, thr_k),
                options=dict(lower=0.0, upper=1.0),
                max_steps=_BISECTION_STEPS,
                adjoint=optx.ImplicitAdjoint(),
                throw=False,
            )
            return ta_k + sol.value * (tb_k - ta_k)

        info = jtu.tree_map(lambda a: jnp.moveaxis(a, -1, 0), state.dense_info)
        t_star = jax.vmap(one)(ta, tb, info, threshold)
        return jnp.where(state.above0, 0.0, jnp.where(crossed, t_star, jnp.inf))
