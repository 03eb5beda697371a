"""Appendix theory (Prop 8, Thm 7 at γ = 0, Cor 3, Prop 9, Thm 11) against independent computations:
autodiff of the real network, scipy's ODE solver, plain gradient descent on W written here."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.integrate import solve_ivp

import lvflow

# ---------------------------------------------------------------------------------------------
# Prop 8 (Eq. 245): the NTK from (M, μ) against the NTK of the real network by autodiff.


def _mlp(phi):
    """A two-layer MLP f(x; W) = Σ_i v_i φ(u_iᵀx), neuron w_i = [u_i, v_i] (column i of W)."""

    def f(W, x):
        return jnp.sum(W[-1] * phi(x @ W[:-1]))

    return f


def _empirical_ntk(f, W, xs):
    """Θ(x, x') = Σ_W ∂f(x)/∂W ∂f(x')/∂W, by jax.jacrev on the real network."""
    J = jax.vmap(jax.jacrev(f), in_axes=(None, 0))(W, xs)  # (m, p, d)
    return np.asarray(jnp.einsum("aij,bij->ab", J, J))


def _mlp_nqf(phi, xs, y):
    """The MLP's NQF: A(x) = φ'(0)/2 [[0, x], [xᵀ, 0]] (Prop 1, Table 3), written out here."""
    m, n = xs.shape
    slope = float(jax.grad(phi)(0.0))
    A = np.zeros((m, n + 1, n + 1))
    A[:, :n, n] = A[:, n, :n] = slope / 2 * xs
    return lvflow.NQF(A, y)


@pytest.mark.parametrize(("phi", "order"), [(jnp.tanh, 2), (jax.nn.silu, 1)])
def test_ntk_matches_real_network_to_the_predicted_order(phi, order):
    # Θ_net − Θ_NQF = O(|W|³) while Θ = O(|W|²): relative error O(scale) for a generic φ (silu,
    # φ''(0) ≠ 0), O(scale²) for an odd φ (tanh: each unit is odd in its neuron, no cubic term).
    rng = np.random.default_rng(0)
    m, n, d = 6, 3, 5
    xs = rng.normal(size=(m, n))
    nqf = _mlp_nqf(phi, xs, rng.normal(size=m))
    W1 = rng.normal(size=(n + 1, d))
    f = _mlp(phi)
    errs = []
    for scale in (1e-1, 1e-2, 1e-3):
        W = scale * W1
        ref = _empirical_ntk(f, jnp.asarray(W), jnp.asarray(xs))
        got = np.asarray(lvflow.ntk(nqf, W @ W.T, W.sum(1)))
        assert got.shape == (m, m)
        errs.append(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    slopes = np.log10(np.array(errs[:-1]) / np.array(errs[1:]))
    assert errs[-1] < 10.0 ** (-3 * order + 1)
    np.testing.assert_allclose(slopes, order, atol=0.1)


def test_ntk_with_mu_terms_matches_softplus_mlp():
    # softplus(0) = ln 2 ≠ 0 breaks ZGZ: the NQF gains g (and B from the cross-neuron Hessian, here 0).
    # The expansion comes from lvflow.expand (autodiff at W = 0); the NTK Θ = O(1) is matched to
    # O(|W|²) (gradient error O(|W|²) from φ''(0) ≠ 0).
    rng = np.random.default_rng(1)
    m, n, d = 5, 3, 4
    xs = rng.normal(size=(m, n))
    f = _mlp(jax.nn.softplus)
    ex = lvflow.expand(f, jnp.asarray(xs), n + 1, d, batched=True)
    assert float(jnp.max(jnp.abs(ex.g))) > 0.1
    nqf = lvflow.NQF(ex.A, rng.normal(size=m), f0=ex.f0, g=ex.g, B=ex.B)
    W1 = rng.normal(size=(n + 1, d))
    errs = []
    for scale in (1e-2, 1e-3, 1e-4):
        W = scale * W1
        ref = _empirical_ntk(f, jnp.asarray(W), jnp.asarray(xs))
        got = np.asarray(lvflow.ntk(nqf, W @ W.T, W.sum(1), d=d))
        errs.append(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    slopes = np.log10(np.array(errs[:-1]) / np.array(errs[1:]))
    np.testing.assert_allclose(slopes, 2.0, atol=0.1)
    assert errs[-1] < 1e-7


def _quadratic_model(A, g, B):
    """An exact NQF written neuron by neuron: f = gᵀ(W1) + Σ_i w_iᵀ A w_i + (W1)ᵀ B (W1) (Eq. 93)."""

    def f(W, idx):
        mu = W.sum(1)
        return g[idx] @ mu + jnp.einsum("...ij,ia,ja->...", A[idx], W, W) + mu @ B[idx] @ mu

    return f


def _sym(a):
    return (a + np.swapaxes(a, -1, -2)) / 2


def test_ntk_exact_for_a_quadratic_model_vector_outputs_and_factored_form():
    # For a model that *is* an NQF, Eq. 245 is exact at any scale; vector outputs give (m, k, m, k).
    rng = np.random.default_rng(2)
    m, k, p, d = 4, 2, 3, 5
    A = _sym(rng.normal(size=(m, k, p, p)))
    g, B = rng.normal(size=(m, k, p)), _sym(rng.normal(size=(m, k, p, p)))
    W = rng.normal(size=(p, d))
    f = _quadratic_model(jnp.asarray(A), jnp.asarray(g), jnp.asarray(B))
    J = jax.vmap(jax.jacrev(f), in_axes=(None, 0))(jnp.asarray(W), jnp.arange(m))  # (m, k, p, d)
    ref = np.asarray(jnp.einsum("acij,bdij->acbd", J, J))
    nqf = lvflow.NQF(A, rng.normal(size=(m, k)), g=g, B=B)
    got = np.asarray(lvflow.ntk(nqf, W @ W.T, W.sum(1), d=d))
    assert got.shape == (m, k, m, k)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.max(np.abs(ref)))

    # ZGZ, factored A = Σ_D Φ E_D (per-output features, and a basis per output): the same kernel.
    D = 3
    E = _sym(rng.normal(size=(D, p, p)))
    Phi = rng.normal(size=(m, k, D))
    dense = np.einsum("mcd,dij->mcij", Phi, E)
    y = rng.normal(size=(m, k))
    want = np.asarray(lvflow.ntk(lvflow.NQF(dense, y), W @ W.T))
    got = np.asarray(lvflow.ntk(lvflow.NQF(y=y, features=Phi, basis=E), W @ W.T))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.max(np.abs(want)))
    Ek = _sym(rng.normal(size=(k, D, p, p)))
    Phi1 = rng.normal(size=(m, D))
    dense = np.einsum("md,cdij->mcij", Phi1, Ek)
    want = np.asarray(lvflow.ntk(lvflow.NQF(dense, y), W @ W.T))
    got = np.asarray(lvflow.ntk(lvflow.NQF(y=y, features=Phi1, basis=Ek), W @ W.T))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.max(np.abs(want)))
    # Jit-able: the same value under jax.jit.
    np.testing.assert_allclose(np.asarray(jax.jit(lambda M: lvflow.ntk(lvflow.NQF(dense, y), M))(W @ W.T)), want)


@pytest.mark.bad_input
def test_ntk_errors():
    rng = np.random.default_rng(0)
    A = _sym(rng.normal(size=(3, 2, 2)))
    nqf = lvflow.NQF(A, np.zeros(3), g=np.ones((3, 2)))
    Err = lvflow.LvflowError
    with pytest.raises(Err, match="mu: required"):
        lvflow.ntk(nqf, np.eye(2), d=3)
    with pytest.raises(Err, match="d: required"):
        lvflow.ntk(nqf, np.eye(2), np.zeros(2))
    with pytest.raises(Err, match=r"M: shape \(3, 3\)"):
        lvflow.ntk(lvflow.NQF(A, np.zeros(3)), np.eye(3))
    with pytest.raises(lvflow.NotPSDError):
        lvflow.ntk(lvflow.NQF(A, np.zeros(3)), -np.eye(2))


# ---------------------------------------------------------------------------------------------
# Thm 7 at γ_k = 0: z_k(t) = z_k0 / (1 + 8c z_k0 t) (the γ = 0 case of Thm 16, Eq. 257, κ = 4c).


def test_isotropic_modes_at_zero_gamma_vs_scipy():
    c = 0.3
    z0 = np.array([1e-6, 0.2, 5.0])
    ts = np.linspace(0.0, 50.0, 26)
    got = np.asarray(lvflow.isotropic_modes(np.zeros(3), c, z0, ts))
    np.testing.assert_allclose(got, z0 / (1 + 8 * c * z0 * ts[:, None]), rtol=1e-14)
    # ż = 2z(γ − 4cz) at γ = 0, integrated by scipy.
    ref = solve_ivp(lambda t, z: -8 * c * z**2, (0, 50), z0, t_eval=ts, method="DOP853", rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(got, ref.y.T, rtol=1e-10)


def _general_mp(gamma, c, z0, t):
    """Thm 7's general formula γ z0 / (4c z0 + (γ − 4c z0) e^{−2γt}) in 80-digit arithmetic."""
    import mpmath

    with mpmath.workdps(80):
        g, c, z0, t = (mpmath.mpf(v) for v in (gamma, c, z0, t))
        return g * z0 / (4 * c * z0 + (g - 4 * c * z0) * mpmath.exp(-2 * g * t))


def test_isotropic_modes_continuous_at_zero_gamma():
    import mpmath

    c, z0, t = 0.3, 0.2, 2.0
    zero = z0 / (1 + 8 * c * z0 * t)
    # The general formula tends to the γ = 0 one (exact arithmetic, so no cancellation).
    assert float(_general_mp(1e-30, c, z0, t)) == pytest.approx(zero, rel=1e-25)
    f = jax.jit(lambda g: lvflow.isotropic_modes(g[None], c, jnp.array([z0]), t)[0])
    for gamma in (-1e-2, -1e-5, -1e-9, 1e-12, 1e-9, 1e-5, 1e-2):
        assert float(f(gamma)) == pytest.approx(float(_general_mp(gamma, c, z0, t)), rel=1e-14)
    assert float(f(0.0)) == pytest.approx(zero, rel=1e-15)
    # Derivatives too: ∂z/∂γ and ∂²z/∂γ² at γ = 0 equal the general formula's limit.
    with mpmath.workdps(80):  # central differences of the general formula about γ = 0 (h = 1e-12, 80 digits)
        h = mpmath.mpf("1e-12")
        up, down = _general_mp(h, c, z0, t), _general_mp(-h, c, z0, t)
        d1 = (up - down) / (2 * h)
        d2 = (up - 2 * _general_mp(mpmath.mpf("1e-40"), c, z0, t) + down) / h**2
    assert float(jax.grad(f)(0.0)) == pytest.approx(float(d1), rel=1e-12)
    assert float(jax.grad(jax.grad(f))(0.0)) == pytest.approx(float(d2), rel=1e-10)
    for gamma in (-1e-6, 1e-6):  # and no jump between γ = 0 and its neighbours
        assert float(jax.grad(f)(gamma)) == pytest.approx(float(d1), rel=1e-5)


def test_isotropic_riccati_at_zero_Y_vs_scipy():
    # Y = 0: Ṁ = −8cM², M(t) = M0 (I + 8c t M0)⁻¹.
    rng = np.random.default_rng(3)
    p, c = 3, 0.7
    G = rng.normal(size=(p, p))
    M0 = G @ G.T
    ts = np.array([0.0, 0.1, 1.0, 10.0])
    got = np.asarray(lvflow.isotropic_riccati(np.zeros((p, p)), c, M0, ts))
    closed = np.array([M0 @ np.linalg.inv(np.eye(p) + 8 * c * t * M0) for t in ts])
    np.testing.assert_allclose(got, closed, rtol=1e-12, atol=1e-14)
    flat = lambda t, y: (-8 * c * y.reshape(p, p) @ y.reshape(p, p)).ravel()
    ref = solve_ivp(flat, (0, 10), M0.ravel(), t_eval=ts, method="DOP853", rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(got, ref.y.T.reshape(-1, p, p), rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Cor 3 (Eq. 237): the compression error bound, against the compressed model of its proof trained
# by plain GD on W next to the original.

P, NS, DN, STEPS = 4, 6, 6, 60  # neuron size, samples, original neurons, GD steps


def _outputs(W, A, f0, g, B):
    mu = W.sum(axis=1)
    return f0 + jnp.einsum("mij,ia,ja->m", A, W, W) + g @ mu + jnp.einsum("mij,i,j->m", B, mu, mu)


@functools.partial(jax.jit, static_argnames="steps")
def _gd_stats(W0, A, y, f0, g, B, lr, *, steps):
    """(M_t, μ_t) along plain GD on W (autodiff of the mean squared loss), t = 0..steps."""
    loss = lambda W: jnp.mean((_outputs(W, A, f0, g, B) - y) ** 2)

    def step(W, _):
        return W - lr * jax.grad(loss)(W), (W @ W.T, W.sum(1))

    W, (Ms, mus) = jax.lax.scan(step, W0, None, length=steps)
    return jnp.concatenate([Ms, (W @ W.T)[None]]), jnp.concatenate([mus, W.sum(1)[None]])


def _update(state, A, y, f0, g, B, lr, d):
    """(ΔM, Δμ)/η of Thm 2 for the mean loss (ℓ' = 2Δ/m), written out from the theorem."""
    M, mu = state[: P * P].reshape(P, P), state[P * P :]
    res = f0 + g @ mu + jnp.einsum("mij,ij->m", A, M) + jnp.einsum("mij,i,j->m", B, mu, mu) - y
    lp = 2 * res / y.shape[0]
    v = jnp.einsum("m,mi->i", lp, g) + 2 * jnp.einsum("m,mij,j->i", lp, B, mu)
    H = 2 * jnp.einsum("m,mij->ij", lp, A)
    dmu = -(d * v + H @ mu)
    dM = -(jnp.outer(v, mu) + jnp.outer(mu, v) + H @ M + M @ H) + lr * (
        d * jnp.outer(v, v) + jnp.outer(v, mu) @ H + H @ jnp.outer(mu, v) + H @ M @ H
    )
    return jnp.concatenate([dM.ravel(), dmu])


@jax.jit
def _lipschitz(a, b, A, y, f0, g, B, lr, d):
    """A Lipschitz constant of the update on the segments between the two trajectories, in the norm
    ‖X‖_F + ‖x‖₂: √2 · max ‖D update‖₂ over 9 points per segment (‖·‖₂ ≤ that norm ≤ √2 ‖·‖₂)."""
    s = jnp.linspace(0.0, 1.0, 9)
    pts = (a[:, None] * (1 - s[None, :, None]) + b[:, None] * s[None, :, None]).reshape(-1, a.shape[-1])
    jac = jax.vmap(jax.jacfwd(lambda z: _update(z, A, y, f0, g, B, lr, d)))(pts)
    return jnp.sqrt(2.0) * jnp.max(jnp.linalg.norm(jac, ord=2, axis=(1, 2)))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), width=st.integers(1, P + 1), scale=st.floats(0.05, 0.6))
def test_compression_bound_holds_along_gd(seed, width, scale):
    width = min(width, DN)
    rng = np.random.default_rng(seed)
    A = _sym(rng.normal(size=(NS, P, P)))
    g, B = 0.5 * rng.normal(size=(NS, P)), 0.3 * _sym(rng.normal(size=(NS, P, P)))
    y, f0 = rng.normal(size=NS), 0.1 * rng.normal(size=NS)
    W = scale * rng.normal(size=(P, DN))
    M, mu = W @ W.T, W.sum(1)
    lr = 0.005  # small enough that GD stays bounded on every instance drawn (Cor 3 assumes it)

    # Cor 3's compressed model: μ̃ = μ, W̃ = U + μ1ᵀ/d', U1 = 0, UUᵀ the top d'−1 eigenpairs of C.
    C = DN / width * (M - np.outer(mu, mu) / DN)
    lam, Q = np.linalg.eigh(C)
    lam, Q = lam[::-1][: width - 1], Q[:, ::-1][:, : width - 1]
    ones_perp = np.linalg.svd(np.ones((1, width)))[2][1:].T  # (d', d'−1), orthonormal, ⊥ 1
    Wc = (Q * np.sqrt(np.clip(lam, 0, None))) @ ones_perp.T + np.outer(mu, np.ones(width)) / width

    args = tuple(map(jnp.asarray, (A, y, f0, g, B)))
    Ms, mus = (np.asarray(a) for a in _gd_stats(jnp.asarray(W), *args, lr, steps=STEPS))
    small = (jnp.asarray(width / DN * A), *args[1:])
    Mc, muc = (np.asarray(a) for a in _gd_stats(jnp.asarray(Wc), *small, DN / width * lr, steps=STEPS))
    err = np.linalg.norm(width / DN * Mc - Ms, axis=(1, 2)) + np.linalg.norm(muc - mus, axis=1)

    state = np.concatenate([Ms.reshape(STEPS + 1, -1), mus], axis=1)
    state_c = np.concatenate([(width / DN * Mc).reshape(STEPS + 1, -1), muc], axis=1)
    L = float(_lipschitz(jnp.asarray(state), jnp.asarray(state_c), *args, lr, DN))
    bound = np.asarray(
        lvflow.compression_bound(M, mu, d=DN, width=width, lr=lr, lipschitz=L, steps=np.arange(STEPS + 1))
    )
    e0 = float(lvflow.compression_bound(M, mu, d=DN, width=width))
    tol = 1e-10 * (1 + np.max(np.abs(Ms)))
    # At t = 0 the construction's error is exactly (d'/d) × the bound (Eckart–Young; Eq. 240 drops d'/d).
    assert err[0] == pytest.approx(width / DN * e0, rel=1e-8, abs=tol)
    assert bound[0] == pytest.approx(e0, rel=1e-14)
    assert np.all(err <= bound + tol)
    if width > P:  # nothing dropped: the compressed model is exact (Thm 3)
        assert np.max(err) < tol


# ---------------------------------------------------------------------------------------------
# Prop 9: lazy training vs feature learning, against the NTK's measured change during plain GD on W.

MP, PP = 4, 3  # samples, neuron size


def _nqf_outputs(W, A, g, B):
    mu = W.sum(1)
    return g @ mu + jnp.einsum("mij,ia,ja->m", A, W, W) + jnp.einsum("mij,i,j->m", B, mu, mu)


@functools.partial(jax.jit, static_argnames="steps")
def _ntk_before_after(W0, A, g, B, y, lr, *, steps):
    """The NTK (jax.jacrev of the outputs) before and after `steps` of GD on W, and the losses."""
    loss = lambda W: jnp.mean((_nqf_outputs(W, A, g, B) - y) ** 2)

    def kernel(W):
        J = jax.jacrev(_nqf_outputs)(W, A, g, B)
        return jnp.einsum("aij,bij->ab", J, J)

    W = jax.lax.fori_loop(0, steps, lambda i, W: W - lr * jax.grad(loss)(W), W0)
    return kernel(W0), kernel(W), loss(W0), loss(W)


def _ntk_change(d, alpha_A, alpha_B, seed=0, time=1.0, lr=0.01):
    """Relative change of the NTK over gradient-flow time 1, for g ∝ d^{−1/2}, A ∝ d^{−α_A},
    B ∝ d^{−α_B} and W(0) ~ N(0, 1/d)."""
    rng = np.random.default_rng(seed)
    A0, B0, g0 = _sym(rng.normal(size=(MP, PP, PP))), _sym(rng.normal(size=(MP, PP, PP))), rng.normal(size=(MP, PP))
    y = rng.normal(size=MP)
    W0 = rng.normal(size=(PP, d)) / np.sqrt(d)
    A, g = A0 * d**-alpha_A, g0 / np.sqrt(d)
    B = 0 * B0 if alpha_B == np.inf else B0 * d**-alpha_B
    t0, t1, l0, l1 = _ntk_before_after(*map(jnp.asarray, (W0, A, g, B, y)), lr, steps=round(time / lr))
    assert float(l1) < 0.5 * float(l0)  # the loss moves by O(1) in that time
    return float(jnp.linalg.norm(t1 - t0) / jnp.linalg.norm(t0))


@pytest.mark.parametrize(("alpha_A", "alpha_B"), [(1.0, 2.0), (0.0, np.inf), (1.0, 1.0)])
def test_ntk_regime_matches_measured_ntk_change(alpha_A, alpha_B):
    regime = lvflow.ntk_regime(alpha_A, alpha_B)
    widths = np.array([16, 64, 256, 1024])
    change = np.array([_ntk_change(int(d), alpha_A, alpha_B) for d in widths])
    slope = np.polyfit(np.log(widths), np.log(change), 1)[0]
    # The relative change scales as d^e, e = max(1 − α_B, −α_A) (Prop 9's Θ̇ = O(d^{1−α_B} + d^{−α_A})).
    assert slope == pytest.approx(regime.drift_exponent, abs=0.15)
    if regime.lazy:
        assert change[-1] < 0.01
    else:
        assert change[-1] > 0.3


def test_ntk_regime_table():
    assert lvflow.ntk_regime(1.0, 2.0) == lvflow.NTKRegime(lazy=True, drift_exponent=-1.0)
    assert lvflow.ntk_regime(0.5) == lvflow.NTKRegime(lazy=True, drift_exponent=-0.5)
    assert lvflow.ntk_regime(0.0) == lvflow.NTKRegime(lazy=False, drift_exponent=0.0)
    assert lvflow.ntk_regime(2.0, 0.75) == lvflow.NTKRegime(lazy=False, drift_exponent=0.25)
    assert not lvflow.ntk_regime(1.0, 1.0).lazy


@pytest.mark.bad_input
def test_ntk_regime_errors():
    with pytest.raises(lvflow.LvflowError, match="alpha_A: must be >= 0"):
        lvflow.ntk_regime(-0.1)
    with pytest.raises(lvflow.LvflowError, match="alpha_B: must be >= 1/2"):
        lvflow.ntk_regime(1.0, 0.25)
    with pytest.raises(lvflow.LvflowError, match="alpha_A"):
        lvflow.ntk_regime(float("nan"))


# ---------------------------------------------------------------------------------------------
# Thm 11 (sample-wise scaling law): with orthogonal rank-one samples A_μ = λ_μ e_μ e_μᵀ (Thm 5) the
# NQF's gradient flow decouples into ż_μ = (8/m) λ_μ z_μ (y_μ − λ_μ z_μ) (z_μ = M_μμ); with
# y_μ = μ^{−γ₁} and ζ_μ = (8/m) λ_μ y_μ = μ^{−γ₂} the loss in rescaled time τ = t/ln(1/ε) decays as
# τ^{−(2γ₁−1)/γ₂}. The flow is integrated here by scipy (in s = ln z, from z_μ(0) = ε), and the
# exponent read off by a log–log least-squares fit while the ignited samples μ*(τ) = τ^{1/γ₂} run
# from 4 to 100 of m = 1000 (far from the truncation at m).


@pytest.mark.parametrize(("gamma1", "gamma2"), [(1.0, 1.0), (1.0, 0.5), (1.5, 1.0)])
def test_sample_wise_exponent_matches_the_flow(gamma1, gamma2):
    m, eps = 1000, 1e-100
    mu = np.arange(1, m + 1, dtype=float)
    y = mu**-gamma1
    lam = m / 8 * mu ** (gamma1 - gamma2)
    # ds/dt = (8/m) λ (y − λ eˢ); the clip only guards trial steps (s ≤ ln(y/λ) < 0 on the solution)
    rhs = lambda t, s: 8 / m * lam * (y - lam * np.exp(np.minimum(s, 0.0)))
    tau = np.logspace(np.log10(4**gamma2), np.log10(100**gamma2), 40)
    log_eps = np.log(1 / eps)
    sol = solve_ivp(rhs, (0, tau[-1] * log_eps), np.full(m, -log_eps), t_eval=tau * log_eps, rtol=1e-6, atol=1e-8)
    assert sol.success
    loss = np.sum((lam * np.exp(sol.y.T) - y) ** 2, axis=1)  # Thm 11's unnormalised Σ_μ Δ_μ²
    measured = -np.polyfit(np.log(tau), np.log(loss), 1)[0]
    predicted = lvflow.predicted_exponent(gamma1=gamma1, gamma2=gamma2)
    assert predicted == pytest.approx((2 * gamma1 - 1) / gamma2, rel=1e-15)
    assert measured == pytest.approx(predicted, rel=0.05)
