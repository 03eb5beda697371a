"""Beyond the quadratic form: the next term of the symmetric expansion (Thm 13, Eq. 200/203), and
the time up to which an NQF describes its network (the validity horizon)."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._core.errors import LvflowError
from .._core.programs import persistent_jit
from .._core.validate import as_array, check_positive, to_jax
from ..architectures import AbstractSumForm
from ..architectures._base import AbstractTwin


def _base_network(network):
    """The sum-form module itself (a twin, e.g. `NQFModel`, is replaced by the network it expands)."""
    if isinstance(network, AbstractTwin):
        network = network.network
    if not isinstance(network, AbstractSumForm):
        raise LvflowError(
            "network: expected a sum-form module (lvflow.architectures.AbstractSumForm, e.g. lvflow.architectures.MLP) "
            f"or its NQF twin, got a {type(network).__name__}"
        )
    return network


def _with_W(network, W):
    if W is None:
        return network
    W = jnp.asarray(as_array("W", W, ndim=2), dtype=network.W.dtype)
    if W.shape[0] != network.p:
        raise LvflowError(f"W: expected {network.p} rows (the neuron size p), got shape {tuple(W.shape)}")
    return eqx.tree_at(lambda m: m.W, network, W)


def _batch(X):
    leaves = jax.tree_util.tree_leaves(X)
    if not leaves or any(np.ndim(leaf) < 1 or np.shape(leaf)[0] < 1 for leaf in leaves):
        raise LvflowError("X: expected a batch of inputs stacked on axis 0 (at least one sample)")
    return jax.tree_util.tree_map(to_jax, X)


class NextOrder(eqx.Module):
    """The first term of Thm 13's expansion beyond the NQF, on a batch of inputs.

    - `order`: its order `k` in the weights (3 for an MLP with `φ''(0) ≠ 0`, 4 for tanh and for
      attention's softmax), or `None` for a module that is exactly quadratic (then `term` is 0).
    - `term`: `Σ_i T_(k)(x_μ)[w_i^{⊗k}]` per sample, shape `(m, [k_out])`.
    - `nqf`: the quadratic term `Σ_i w_iᵀ A(x_μ) w_i` at the same `W`, same shape.
    """

    order: int | None = eqx.field(static=True)
    term: Float[Array, "m *k"]  # noqa: F821 (jaxtyping's variadic dims)
    nqf: Float[Array, "m *k"]  # noqa: F821 (jaxtyping's variadic dims)


def next_order(network, X, W: Float[ArrayLike, "p d"] | None = None) -> NextOrder:
    """The network's next term beyond its neural quadratic form at weights `W` (Thm 13, Eq. 200/203).

    For a sum-form module `f_x(W) = Σ_i unit(w_i, x)` (ZGZ) Thm 13 reads

    `f_x(W) = f_x(0) + Σ_i w_iᵀ A(x) w_i + Σ_i T_(k)(x)[w_i^{⊗k}] + O(|W|^{k+1})`,

    `T_(k)(x)[w^{⊗k}] = (1/k!) dᵏ/dsᵏ unit(s w, x)|_{s=0}`, with `k ≥ 3` the first order whose
    tensor is not identically zero (the cross-neuron partitions of Eq. 200 vanish for a sum form).
    Closed forms (the architectures' `next_order` and `expansion_term`):

    - MLP `Σ_i v_i φ(u_iᵀx)` and CNN `Σ_i v_i Σ_q φ(k_iᵀx_q)`: `k = j + 1` for the first `j ≥ 2` with
      `φ⁽ʲ⁾(0) ≠ 0`, term `Σ_i v_i φ⁽ʲ⁾(0)/j! Σ_q (u_iᵀx_q)ʲ`: order 3, `v φ''(0)/2 (uᵀx)²`, for
      silu or a shifted softplus; order 4, `v φ'''(0)/6 (uᵀx)³`, for an odd `φ` such as tanh.
    - multi-head attention `Σ_i v_iᵀ W_iᴠ X softmax(s_i)`: order 4, `Σ_i v_iᵀ W_iᴠ X (s_i − s̄_i)/N`
      (the softmax's first term, `s` being quadratic in `Wᑫ, Wᴷ`).
    - query–key attention `Σ_i cᵀ X (softmax(s_i) − 1/N)`: order 4,
      `Σ_i cᵀ X ((s_i − s̄_i)² − mean((s_i − s̄_i)²))/(2N)` (the softmax's second term).
    - exactly quadratic modules (matrix sensing, diagonal nets, attention logits): none.
    - any other sum form: `T_(k)` by nested forward-mode differentiation of `unit`, `k` found by
      probing orders 3..6 at a random neuron.

    **Arguments:**

    - `network`: a sum-form module (`lvflow.architectures.AbstractSumForm`) or its NQF twin.
    - `X`: a batch of inputs, samples on axis 0.
    - `W`: the neurons `(p, d)` at which to evaluate (default: the network's own `W`).

    **Returns:** a `NextOrder` (`order`, `term`, and the quadratic term `nqf`), per sample.

    **Raises:** `LvflowError` for a `network` that is not a sum form, `W` with the wrong number of
    rows, or an `X` without a sample axis.
    """
    network = _with_W(_base_network(network), W)
    X = _batch(X)
    x0 = jax.tree_util.tree_map(lambda a: a[0], X)
    order = network.next_order(x0)
    nqf = _quadratic_terms(network, X)
    if order is None:
        return NextOrder(order=None, term=jnp.zeros_like(nqf), nqf=nqf)
    return NextOrder(order=order, term=_next_terms(network, X, order), nqf=nqf)


@eqx.filter_jit
def _next_terms(network, X, order):
    return jax.vmap(lambda x: network.expansion_term(x, order))(X)


@eqx.filter_jit
def _quadratic_terms(network, X):
    """The network's NQF output `Tr[W Wᵀ A(x_μ)]` (Thm 13's order-2 term) for each sample of `X`."""
    return jax.vmap(lambda x: network.expansion_term(x, 2))(X)


class Horizon(eqx.Module):
    """How far along a trajectory the NQF describes its network (see `nqf_horizon`).

    - `times`: the trajectory's times `(T,)` (steps, or gradient-flow time, as given).
    - `ratio`: `‖next-order term‖ / ‖NQF output‖` at each time (RMS over samples and outputs), `(T,)`.
    - `fraction`: the threshold.
    - `time`: the first time `ratio` reaches `fraction` (log-linear interpolation between the grid
      points that bracket it; the first time when it starts above); `inf` when it never does.
    - `index`: the first grid index with `ratio ≥ fraction`, or `None`.
    - `order`: the order `k` of the next term (Thm 13), `None` for an exactly quadratic module
      (then `ratio` is 0 and there is no horizon).
    - `loss_gap`: with targets, the estimated `L_network − L_NQF` at each time, in units of the NQF's
      loss at the first time `L(0)` (`None` without targets); see `nqf_horizon`.
    - `loss_fraction`: the threshold on `|loss_gap|`.
    - `departure`: the first time `|loss_gap|` reaches `loss_fraction` (linear interpolation), `inf`
      when it never does (or without targets).
    """

    times: Float[np.ndarray, " T"]
    ratio: Float[np.ndarray, " T"]
    fraction: float = eqx.field(static=True)
    time: float = eqx.field(static=True)
    index: int | None = eqx.field(static=True)
    order: int | None = eqx.field(static=True)
    loss_gap: Float[np.ndarray, " T"] | None = None
    loss_fraction: float = eqx.field(static=True, default=0.1)
    departure: float = eqx.field(static=True, default=math.inf)


def representative_neurons(M: Float[ArrayLike, "p p"], d: int, *, seed: int = 0) -> Float[Array, "p d"]:
    """`d` neurons whose order parameter is `M`, drawn as the NQF's own dynamics leaves them.

    Under the NQF's gradient flow (or GD) `W(t) = P(t) W(0)` with a deterministic `P(t)`
    (`Ẇ = −H W`, Eq. 27; Cor. 2, Eq. 212), so from i.i.d. Gaussian neurons `W(0)` with
    `E[M(0)] = M(0)` the neurons stay i.i.d. Gaussian, `w_i(t) ~ N(0, M(t)/d)`. This returns one such
    draw, `W = M^{1/2} G/√d` with `G` standard Gaussian `(p, d)` from `seed`, orthonormalised
    (`W = M^{1/2} (G Gᵀ)^{−1/2} G`, so that `W Wᵀ = M` exactly) when `d ≥ p`.
    """
    M = np.asarray(M, dtype=float)
    return jnp.asarray(_sqrtm(M) @ _gaussian_factor(M.shape[0], d, seed))


def _gaussian_factor(p: int, d: int, seed: int) -> np.ndarray:
    """`G/√d`, or `(G Gᵀ)^{−1/2} G` when `d ≥ p`, for `G` standard Gaussian `(p, d)` from `seed`
    (`representative_neurons` is `M^{1/2}` times this)."""
    G = np.random.default_rng(seed).standard_normal((p, d))
    if d >= p:
        s, U = np.linalg.eigh(G @ G.T)
        return (U / np.sqrt(s)) @ U.T @ G
    return G / math.sqrt(d)


def horizon_ratio(network, X, M: Float[ArrayLike, "T p p"], *, order: int, width: int, seed: int = 0) -> np.ndarray:
    """`nqf_horizon`'s output ratio `ρ` at each `M` of a trajectory, all times in one compiled map
    (no targets, no loss gap): the next term from `width` representative neurons
    (`representative_neurons`, same `seed` at every time), the NQF's output `Tr[M A]` exactly.

    `network` must be a sum form that is not exactly quadratic and `order` its next order (the
    caller's `network.next_order(x_0)`, not `None`); `X` a batch; `M` symmetric PSD `(T, p, p)`.
    Returns `ρ`, shape `(T,)`.
    """
    network, X = _base_network(network), _batch(X)
    M = np.asarray(M, dtype=float)
    lam, V = np.linalg.eigh((M + np.swapaxes(M, 1, 2)) / 2)
    roots = (V * np.sqrt(np.clip(lam, 0.0, None))[:, None, :]) @ np.swapaxes(V, 1, 2)
    G = _gaussian_factor(M.shape[1], int(width), seed)
    num, den = _ratio_terms(network, X, to_jax(roots @ G), to_jax(roots), order)
    num, den = np.asarray(num), np.asarray(den)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num == 0, 0.0, np.inf))


@persistent_jit
def _ratio_terms(network, X, W_next, W_quad, order):
    """RMS of the next term (neurons `W_next[t]`) and of the NQF's output (neurons `W_quad[t]`) per time."""

    def one(Ws):
        net = lambda W: eqx.tree_at(lambda m: m.W, network, W)  # noqa: E731
        term = _next_terms(net(Ws[0]), X, order)
        quad = _quadratic_terms(net(Ws[1]), X)
        return jnp.sqrt(jnp.mean(term**2)), jnp.sqrt(jnp.mean(quad**2))

    return jax.lax.map(one, (W_next, W_quad))


def nqf_horizon(
    network,
    X,
    y: ArrayLike | None = None,
    *,
    M: ArrayLike | None = None,
    W: ArrayLike | None = None,
    times: ArrayLike | None = None,
    f0: ArrayLike | None = None,
    fraction: float = 0.1,
    loss_fraction: float = 0.1,
    width: int | None = None,
    seed: int = 0,
) -> Horizon:
    """The validity horizon of an NQF along a trajectory: when Thm 13's next term stops being small.

    **The output ratio.** At each time `t`

    `ρ(t) = RMS_μ Σ_i T_(k)(x_μ)[w_i(t)^{⊗k}] / RMS_μ Tr[W(t) W(t)ᵀ A(x_μ)]`

    (the next-order term of Thm 13, Eq. 200, over the NQF's own output `Tr[M A]`, Eq. 2, without
    `f_x(0)`; `next_order`), and `time` is the first time `ρ` reaches `fraction`. The paper bounds the
    error as `O(|W|^k)` without a constant, so which `ρ` matters is a matter of measurement: on the
    tanh MLPs measured (`docs/theory.md`) `ρ` reaches 0.1 while the NQF fits, well before the loss
    parts from the NQF's, because the loss gap builds up over time.

    **The loss gap** (with targets `y`; first order in the next term, beyond the paper). The network
    is `f = f_NQF + T` with `T` the next term, so at the NQF's weights its loss differs by the static
    `δL = (1/m) Σ_μ [(Δ_μ + T_μ)² − Δ_μ²]` (`Δ` the NQF's residual), and its gradient by
    `g_T = (2/m) Σ_μ Δ_μ ∇_W T_μ`. The part of `g_T` in the row space of the NQF's Jacobian
    `J = ∂ Tr[W Wᵀ A(x_μ)]/∂W` moves the NQF's outputs and is held back by the NQF's own loss; the part
    in its null space, `Π⊥ g_T`, is not, and gradient flow descends along it at the rate `|Π⊥ g_T|²`.
    So `L_network(t) − L_NQF(t) ≈ δL(t) − ∫₀ᵗ |Π⊥ g_T|² dτ` (`loss_gap`, in units of `L(0)`), and
    `departure` is the first time `|loss_gap|` reaches `loss_fraction`. `times` must then be
    gradient-flow time `t` (GD: learning rate × steps) for the loss `L = (1/m) Σ_μ |f_μ − y_μ|²` (Eq. 26).
    Costs a Jacobian of shape `(m·k, p·d)` and a least-squares solve per time.

    **Neurons.** The next term depends on the neurons `W`, not only on `M = W Wᵀ`. Give the neurons
    themselves (`W`, e.g. recorded from training the NQF twin), or the order parameter (`M`, e.g.
    predicted by `matrix_flow` or `predict`). With `M`, the neurons are a representative draw
    (`representative_neurons`): the columns of `W(t)` i.i.d. `N(0, M(t)/d)`, which is exact for the
    NQF's gradient flow from i.i.d. Gaussian initial neurons with `M(0)` at its mean (e.g. `M(0) = ε I`
    for `N(0, ε/d)` entries), because that flow is linear in `W(0)`: `W(t) = P(t) W(0)` (Eq. 27, 212).
    The draw uses the same `seed` at every time; for small widths its ratio fluctuates around the
    ensemble's by `O(1/√d)`, and the loss gap, which depends on the realisation through `Π⊥ g_T`, more.
    The NQF's output `Tr[M A]` (the ratio's denominator and the residual `Δ`) is exact, from the `p`
    neurons `M^{1/2}`, whatever the width.

    **Arguments:**

    - `network`: a sum-form module (`lvflow.architectures.AbstractSumForm`) or its NQF twin; only its
      configuration is used (its `W` is replaced by the trajectory's).
    - `X`: the inputs, samples on axis 0 (the data the NQF was built from).
    - `y`: the targets, shape `(m,)` or `(m, k)` (optional: without them no loss gap).
    - `M`: the trajectory of `M = W Wᵀ`, shape `(T, p, p)` (one of `M`, `W`).
    - `W`: the trajectory of the neurons, shape `(T, p, d)`.
    - `times`: the time of each entry (default `0, 1, …, T−1`); gradient-flow time for the loss gap.
    - `f0`: the outputs at `W = 0`, shaped like `y` (default 0; `nqf.f0` of an `NQF`).
    - `fraction`: the threshold on `ρ`, `> 0`.
    - `loss_fraction`: the threshold on `|loss_gap|`, `> 0`.
    - `width`: `d` for the representative neurons of an `M` trajectory (default: the network's).
    - `seed`: the seed of the representative draw.

    **Returns:** a `Horizon` (`times`, `ratio`, `time`, `index`, `order`, `fraction`, and with `y`
    `loss_gap`, `departure`, `loss_fraction`).

    **Raises:** `LvflowError` when neither or both of `M`, `W` are given, for shapes that do not
    match the network (`p`), the samples (`y`, `f0`) or `times`, a non-positive `fraction`,
    `loss_fraction` or `width`, or non-increasing `times`.
    """
    network = _base_network(network)
    X = _batch(X)
    if (M is None) == (W is None):
        raise LvflowError("M, W: give exactly one trajectory (M of shape (T, p, p), or W of shape (T, p, d))")
    fraction = check_positive("fraction", fraction)
    loss_fraction = check_positive("loss_fraction", loss_fraction)
    p = network.p
    if W is not None:
        path = np.asarray(as_array("W", W, ndim=3), dtype=float)
        if path.shape[1] != p:
            raise LvflowError(f"W: expected shape (T, {p}, d) (p = {p} the neuron size), got {path.shape}")
        neurons = lambda i: (path[i], path[i])
    else:
        path = np.asarray(as_array("M", M, ndim=3), dtype=float)
        if path.shape[1:] != (p, p):
            raise LvflowError(f"M: expected shape (T, {p}, {p}) (p = {p} the neuron size), got {path.shape}")
        d = network.d if width is None else int(as_array("width", width, ndim=0))
        if d < 1:
            raise LvflowError(f"width: must be a positive integer, got {width}")
        # the next term from `d` representative neurons; the NQF's output `Tr[M A]` (and so its
        # residual) exactly, from the `p` neurons `M^{1/2}`, whatever `d`
        neurons = lambda i: (representative_neurons(path[i], d, seed=seed), _sqrtm(path[i]))
    T = path.shape[0]
    if times is None:
        t = np.arange(T, dtype=float)
    else:
        t = np.asarray(as_array("times", times, ndim=1), dtype=float)
        if t.shape != (T,):
            raise LvflowError(f"times: expected {T} entries (one per trajectory entry), got {t.shape[0]}")
        if T > 1 and not np.all(np.diff(t) > 0):
            raise LvflowError("times: must be strictly increasing")
    x0 = jax.tree_util.tree_map(lambda a: a[0], X)
    order = network.next_order(x0)
    out_shape = jax.eval_shape(lambda: _quadratic_terms(network, X)).shape
    if y is not None:
        y = jnp.asarray(as_array("y", y, ndim=(1, 2)), dtype=float)
        if y.shape != out_shape:
            raise LvflowError(f"y: expected shape {out_shape} (samples, outputs), got {tuple(y.shape)}")
        f0 = jnp.zeros_like(y) if f0 is None else jnp.asarray(as_array("f0", f0), dtype=float)
        if f0.shape != out_shape:
            raise LvflowError(f"f0: expected shape {out_shape} (samples, outputs), got {tuple(f0.shape)}")
    if order is None:
        gap = None if y is None else np.zeros(T)
        return Horizon(
            times=t, ratio=np.zeros(T), fraction=fraction, time=math.inf, index=None, order=None, loss_gap=gap,
            loss_fraction=loss_fraction,
        )  # fmt: skip
    ratio, static, rate, L = np.empty(T), np.zeros(T), np.zeros(T), np.zeros(T)
    for i in range(T):
        W_next, W_quad = neurons(i)
        net, net_quad = _with_W(network, W_next), _with_W(network, W_quad)
        quad = _quadratic_terms(net_quad, X)
        if y is None:
            term = _next_terms(net, X, order)
        else:
            term, static[i], rate[i], L[i] = _loss_terms(net, X, y, f0 + quad, order)
        den = float(jnp.sqrt(jnp.mean(quad**2)))
        num = float(jnp.sqrt(jnp.mean(term**2)))
        ratio[i] = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    index, time = _first_crossing(t, ratio, fraction, log=True)
    gap, departure = None, math.inf
    if y is not None:
        integral = np.concatenate([[0.0], np.cumsum(0.5 * (rate[1:] + rate[:-1]) * np.diff(t))])
        gap = (static - integral) / L[0] if L[0] > 0 else np.zeros(T)
        departure = _first_crossing(t, np.abs(gap), loss_fraction, log=False)[1]
    return Horizon(
        times=t, ratio=ratio, fraction=fraction, time=time, index=index, order=order, loss_gap=gap,
        loss_fraction=loss_fraction, departure=departure,
    )  # fmt: skip


def _first_crossing(t, r, level, *, log: bool) -> tuple[int | None, float]:
    """The first index with `r ≥ level` and the interpolated time it is reached (`inf`: never)."""
    hit = np.flatnonzero(r >= level)
    if hit.size == 0:
        return None, math.inf
    i = int(hit[0])
    if i == 0 or not np.isfinite(r[i]) or (log and r[i - 1] <= 0):
        return i, float(t[i])
    a, b, c = (np.log(v) for v in (r[i - 1], r[i], level)) if log else (r[i - 1], r[i], level)
    return i, float(t[i - 1] + (t[i] - t[i - 1]) * (c - a) / (b - a))


@eqx.filter_jit
def _loss_terms(network, X, y, f, order):
    """The next term, `δL`, `|Π⊥ g_T|²` and the NQF's loss (outputs `f`) at `network.W` (`nqf_horizon`)."""
    net_at = lambda W: eqx.tree_at(lambda m: m.W, network, W)
    W = network.W
    term = _next_terms(network, X, order)
    D = f - y
    m = D.shape[0]
    static = (jnp.sum((D + term) ** 2) - jnp.sum(D**2)) / m
    g = jax.grad(lambda V: 2.0 / m * jnp.sum(D * _next_terms(net_at(V), X, order)))(W).reshape(-1)
    J = jax.jacfwd(lambda V: _quadratic_terms(net_at(V), X))(W).reshape(D.size, -1)
    coef = jnp.linalg.lstsq(J.T, g)[0]
    g_perp = g - J.T @ coef
    return term, static, jnp.sum(g_perp**2), jnp.sum(D**2) / m


def _sqrtm(M) -> np.ndarray:
    """The symmetric PSD square root of `M` (negative eigenvalues, round-off, clipped to 0)."""
    lam, V = np.linalg.eigh((M + M.T) / 2)
    return (V * np.sqrt(np.clip(lam, 0.0, None))) @ V.T
