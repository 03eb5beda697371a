"""`structure_matrix` (Thm 1, Eq. 2) and `expand` (Thm 12, Eq. 196) on modules whose expansion
is known in closed form, against finite differences and direct evaluation, and their errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import lvflow
import lvflow.architectures as la

P, D = 3, 3


def _parts(seed, p=P):
    r = np.random.default_rng(seed)
    return r.normal(size=p), r.normal(size=p), r.normal(size=(p, p)), r.normal(size=p)


def _module(b, S, c):
    """`f(W, x) = exp(bᵀμ) + Σ_i xᵀw_i + Σ_i w_iᵀ S w_i + Σ_i (cᵀw_i)³`, `μ = Σ_i w_i`.

    Closed form (Thm 12): `f0 = 1`, `g = b + x`, `A = Sym(S)`, `B = b bᵀ/2`; remainder O(|W|³).
    """

    def f(W, x):
        return jnp.exp(b @ W.sum(1)) + jnp.sum(x @ W) + jnp.einsum("ai,ab,bi->", W, S, W) + jnp.sum((c @ W) ** 3)

    return f


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_expand_closed_form(seed):
    b, x, S, c = _parts(seed)
    e = lvflow.expand(_module(b, S, c), x, P, D)
    np.testing.assert_allclose(e.f0, 1.0, atol=1e-13)
    np.testing.assert_allclose(e.g, b + x, atol=1e-12)
    np.testing.assert_allclose(e.A, (S + S.T) / 2, atol=1e-12)
    np.testing.assert_allclose(e.B, np.outer(b, b) / 2, atol=1e-12)


def test_expand_convention_against_direct_evaluation():
    """`f = f0 + gᵀμ + Tr[M A] + μᵀ B μ + O(|W|³)` with `M = W Wᵀ`, `μ = W 1` (Eq. 196): the
    remainder at `W = t W₁` falls like t³."""
    b, x, S, c = _parts(1)
    f = _module(b, S, c)
    e = lvflow.expand(f, x, P, D)
    W1 = jnp.asarray(np.random.default_rng(2).normal(size=(P, D)))

    @jax.jit
    @jax.vmap
    def remainder(t):
        W = t * W1
        mu = W.sum(1)
        quad = e.f0 + e.g @ mu + jnp.sum((W @ W.T) * e.A) + mu @ e.B @ mu
        return f(W, x) - quad

    ts = [0.04, 0.02, 0.01]
    r = np.abs(np.asarray(remainder(jnp.array(ts))))
    slopes = np.log2(r[:-1] / r[1:])
    np.testing.assert_allclose(slopes, 3.0, atol=0.1)
    # the convention matters: with B = H_ij instead of ½ H_ij an O(t²) error survives
    W = ts[-1] * W1
    mu = W.sum(1)
    wrong = e.f0 + e.g @ mu + jnp.sum((W @ W.T) * e.A) + 2 * mu @ e.B @ mu
    assert abs(float(f(W, x) - wrong)) > 10 * r[-1]


def test_expand_vector_and_batched():
    b, _, S, c = _parts(3)
    T = np.random.default_rng(4).normal(size=(P, P))
    f = _module(b, S, c)
    fk = lambda W, x: jnp.stack([f(W, x), jnp.einsum("ai,ab,bi->", W, T, W)])
    xs = np.random.default_rng(5).normal(size=(4, P))
    e = lvflow.expand(fk, xs, P, D, batched=True)
    assert (e.f0.shape, e.g.shape, e.A.shape, e.B.shape) == ((4, 2), (4, 2, P), (4, 2, P, P), (4, 2, P, P))
    np.testing.assert_allclose(e.f0, np.tile([1.0, 0.0], (4, 1)), atol=1e-13)
    np.testing.assert_allclose(e.g[:, 0], b + xs, atol=1e-12)
    np.testing.assert_allclose(e.g[:, 1], 0.0, atol=1e-13)
    np.testing.assert_allclose(e.A[:, 0], np.broadcast_to((S + S.T) / 2, (4, P, P)), atol=1e-12)
    np.testing.assert_allclose(e.A[:, 1], np.broadcast_to((T + T.T) / 2, (4, P, P)), atol=1e-12)
    np.testing.assert_allclose(e.B[:, 0], np.broadcast_to(np.outer(b, b) / 2, (4, P, P)), atol=1e-12)
    np.testing.assert_allclose(e.B[:, 1], 0.0, atol=1e-13)


def test_expand_of_a_zgz_architecture():
    """For a ZGZ network `g = 0`, `B = 0` and `A` is the closed form of Table 3."""
    model = la.MLP(3, 2, key=jax.random.key(0))
    net = lambda W, x: eqx.tree_at(lambda m: m.W, model, W)(x)
    x = jnp.array([0.3, -1.2, 0.7])
    e = lvflow.expand(net, x, model.p, model.d)
    np.testing.assert_allclose(e.g, 0.0, atol=1e-14)
    np.testing.assert_allclose(e.B, 0.0, atol=1e-14)
    np.testing.assert_allclose(e.A, model.structure(x), atol=1e-14)


def _unit(S):
    """A ZGZ unit with two outputs: `[wᵀ S w + (xᵀw)², sin(xᵀw)·(w₀ + w₁)]`."""
    return lambda w, x: jnp.stack([w @ S @ w + (x @ w) ** 2, jnp.sin(x @ w) * (w[0] + w[1])])


def test_structure_matrix_vector_batched_and_finite_differences():
    S = np.random.default_rng(6).normal(size=(P, P))
    xs = np.random.default_rng(7).normal(size=(5, P))
    unit = _unit(S)
    A = lvflow.structure_matrix(unit, xs, P, batched=True)
    assert A.shape == (5, 2, P, P)
    e01 = np.zeros(P)
    e01[:2] = 1.0
    for x, a in zip(xs, np.asarray(A)):
        np.testing.assert_allclose(a[0], (S + S.T) / 2 + np.outer(x, x), atol=1e-12)
        np.testing.assert_allclose(a[1], (np.outer(x, e01) + np.outer(e01, x)) / 2, atol=1e-12)
    # independent: ½ × central finite-difference Hessian at w = 0, unbatched call
    x = xs[0]
    A0 = np.asarray(lvflow.structure_matrix(unit, x, P))
    assert A0.shape == (2, P, P)
    h, I = 1e-4, np.eye(P)
    f = lambda w: np.asarray(unit(jnp.asarray(w), x))
    H = np.array(
        [
            [
                (f(h * (I[i] + I[j])) - f(h * (I[i] - I[j])) - f(h * (I[j] - I[i])) + f(-h * (I[i] + I[j])))
                / (4 * h * h)
                for j in range(P)
            ]
            for i in range(P)
        ]
    )  # (P, P, 2)
    np.testing.assert_allclose(A0, np.moveaxis(H, -1, 0) / 2, atol=1e-7)


def test_symmetry_error_names_the_broken_block():
    S = np.eye(P)
    diag = lambda W, x: sum((i + 1) * W[:, i] @ S @ W[:, i] for i in range(D))  # H_ii = 2(i+1) I
    with pytest.raises(lvflow.SymmetryError, match="diagonal Hessian blocks H_ii differ across neurons by 4"):
        lvflow.expand(diag, np.zeros(P), P, D)
    grad = lambda W, x: jnp.sum(jnp.arange(1.0, D + 1)[None, :] * W)
    with pytest.raises(lvflow.SymmetryError, match="gradient columns"):
        lvflow.expand(grad, np.zeros(P), P, D)
    pair = lambda W, x: W[:, 0] @ W[:, 1]  # only neurons 0 and 1 interact
    with pytest.raises(lvflow.SymmetryError, match="off-diagonal blocks H_ij"):
        lvflow.expand(pair, np.zeros(P), P, D)


def test_zgz_error_names_the_gradient_norm():
    a = np.array([0.5, -2.25, 1.0])
    with pytest.raises(lvflow.ZGZError, match=r"max \|∇_w unit\(0, x\)\| = 2\.25"):
        lvflow.structure_matrix(lambda w, x: a @ w + w @ w, np.zeros(P), P)
    # a nonzero value at w = 0 is a different mistake (not ZGZ): an LvflowError, not a ZGZError
    with pytest.raises(lvflow.LvflowError, match=r"unit\(0, x\) = 1 ≠ 0") as info:
        lvflow.structure_matrix(lambda w, x: 1.0 + w @ w, np.zeros(P), P)
    assert not isinstance(info.value, lvflow.ZGZError)
    with pytest.raises(lvflow.LvflowError, match="Hessian at w = 0 is not finite"):
        lvflow.structure_matrix(lambda w, x: jnp.sqrt(w @ w) * (w @ w) ** 0.25, np.zeros(P), P)


@pytest.mark.parametrize("p", [0, -2, 2.5, "3", None, True])
def test_bad_p_raises(p):
    with pytest.raises(lvflow.LvflowError, match="p: must be a positive integer"):
        lvflow.structure_matrix(lambda w, x: w @ w, np.zeros(2), p)
    with pytest.raises(lvflow.LvflowError, match="p: must be a positive integer"):
        lvflow.expand(lambda W, x: jnp.sum(W * W), np.zeros(2), p, 2)


def test_bad_d_raises():
    with pytest.raises(lvflow.LvflowError, match="d: must be an integer ≥ 2"):
        lvflow.expand(lambda W, x: jnp.sum(W * W), np.zeros(2), 2, 1)


def test_expand_checks_pair_swap_symmetry_at_d2():
    S = np.array([[0.0, 1.0], [0.0, 0.0]])  # w_0ᵀ S w_1 with S ≠ Sᵀ: not invariant under swapping
    with pytest.raises(lvflow.SymmetryError, match="H_ij"):
        lvflow.expand(lambda W, x: W[:, 0] @ S @ W[:, 1], np.zeros(1), 2, 2)


def test_nan_gradient_is_not_accepted_as_zgz():
    with pytest.raises(lvflow.LvflowError):
        lvflow.structure_matrix(lambda w, x: jnp.sum(w) * x[0], np.array([np.nan]), 2)


def test_expand_non_finite_derivatives_named_as_such():
    with pytest.raises(lvflow.LvflowError, match="not finite"):
        lvflow.expand(lambda W, x: jnp.sum(jnp.sqrt(jnp.abs(W))), np.zeros(1), 2, 2)


# ---- issue 16: inputs that used to end in raw exceptions or a silent A = 0 --------------------


@pytest.mark.parametrize(
    "unit",
    [
        lambda w, x: jax.nn.relu(w @ x) ** 2,
        lambda w, x: jnp.maximum(w @ x, 0.0) ** 2,
        lambda w, x: w[0] * jax.nn.relu(w[1:] @ x[1:]),
    ],
)
def test_not_twice_differentiable_unit_is_refused(unit):
    # relu(s)² has second derivative 0 for s < 0 and 2 for s > 0: Eq. 2's Hessian at w = 0 does not exist.
    with pytest.raises(lvflow.LvflowError, match="not twice differentiable"):
        lvflow.structure_matrix(unit, np.array([1.0, -0.5, 2.0]), 3)


def test_smooth_units_with_vanishing_or_large_hessians_pass():
    x = np.array([1.0, -0.5, 2.0])
    # relu(s)³ and |s|^2.5 are C² at 0 with Hessian 0 there: A = 0 is right.
    for unit in (lambda w, x: jax.nn.relu(w @ x) ** 3, lambda w, x: jnp.abs(w @ x) ** 2.5):
        np.testing.assert_array_equal(lvflow.structure_matrix(unit, x, 3), np.zeros((3, 3)))
    # A smooth unit at a large input scale: A = x xᵀ (the quadratic term of tanh(s)² + s³ is s²).
    X = 300.0 * x
    np.testing.assert_allclose(
        lvflow.structure_matrix(lambda w, x: jnp.tanh(w @ x) ** 2 + (w @ x) ** 3, X, 3), np.outer(X, X), rtol=1e-12
    )


@pytest.mark.bad_input
def test_structure_matrix_input_errors():
    unit = lambda w, x: (w @ x) ** 2
    with pytest.raises(lvflow.LvflowError, match=r"unit: cannot be evaluated .*\(4,\).*\(3,\).*neuron size"):
        lvflow.structure_matrix(unit, np.ones(3), 4)
    with pytest.raises(lvflow.LvflowError, match="x: complex"):
        lvflow.structure_matrix(unit, np.ones(3) + 1j, 3)
