"""matrix_flow (Eq. 27–28, Thm 12, Prop 7) against scipy solves of Ẇ = −∇L and of the gLV."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.integrate import solve_ivp
from scipy.stats import ortho_group

import lvflow
from lvflow import NQF, matrix_flow


def _sym(a):
    return (a + np.swapaxes(a, -1, -2)) / 2


def direct_loss(W, A, y, f0, g, B):
    mu = W.sum(axis=1)
    f = f0 + jnp.einsum("mij,ia,ja->m", A, W, W) + g @ mu + jnp.einsum("mij,i,j->m", B, mu, mu)
    return jnp.mean((f - y) ** 2)


def test_matches_scipy_flow_on_W_with_mu_terms_and_weight_decay():
    rng = np.random.default_rng(0)
    m, p, d, gamma = 5, 4, 3, 0.05
    A, B = _sym(rng.normal(size=(m, p, p))), 0.3 * _sym(rng.normal(size=(m, p, p)))
    g, y, f0 = 0.5 * rng.normal(size=(m, p)), rng.normal(size=m), 0.1 * rng.normal(size=m)
    nqf = NQF(A, y, f0=f0, g=g, B=B)
    W0 = 0.4 * rng.normal(size=(p, d))
    grad = jax.jit(jax.grad(direct_loss))

    def rhs(t, w):  # Ẇ = −∇_W [L + (γ/2)|W|²]
        W = w.reshape(p, d)
        return -(np.asarray(grad(W, A, y, f0, g, B)) + gamma * W).ravel()

    ts = np.linspace(0.0, 20.0, 6)
    ref = solve_ivp(rhs, (0, 20), W0.ravel(), method="DOP853", t_eval=ts, rtol=1e-12, atol=1e-14)
    Ws = ref.y.T.reshape(-1, p, d)
    sol = matrix_flow(nqf, W0 @ W0.T, ts, mu0=W0.sum(1), d=d, weight_decay=gamma, rtol=1e-10)
    M_ref = np.einsum("tia,tja->tij", Ws, Ws)
    assert np.max(np.abs(sol.M - M_ref)) < 1e-9 * np.max(np.abs(M_ref))  # measured 2e-11
    assert np.max(np.abs(sol.mu - Ws.sum(2))) < 1e-9 * np.max(np.abs(Ws.sum(2)))
    loss_ref = [float(direct_loss(W, A, y, f0, g, B)) for W in Ws]
    np.testing.assert_allclose(sol.loss, loss_ref, rtol=1e-9)
    assert loss_ref[-1] < 0.1 * loss_ref[0]  # it moved: the comparison is not vacuous


def test_prop7_off_diagonals_are_slaved_and_modes_follow_the_glv():
    """Commuting A_μ = P Λ_μ Pᵀ (Assumption 1): z_k = (PᵀMP)_kk solves ż = z(r − Cz) (Eq. 32) and
    m_kj / √(z_k z_j) is constant (Prop 7, Eq. 30), from a tiny init with off-diagonals."""
    rng = np.random.default_rng(4)
    m, p, eps = 6, 4, 1e-8
    P = ortho_group.rvs(p, random_state=5)
    lam = rng.uniform(0.2, 1.0, size=(m, p))
    A = np.einsum("ik,mk,jk->mij", P, lam, P)
    y = rng.uniform(0.5, 1.5, size=m)
    L = np.tril(rng.uniform(0.5, 1.0, size=(p, p)))
    Mt0 = eps * L @ L.T  # PᵀM0P: positive definite, off-diagonals of the same order as z
    ts = np.linspace(0.0, 12.0, 7)
    sol = matrix_flow(NQF(A, y), P @ Mt0 @ P.T, ts, rtol=1e-10)

    r = 8 / m * y @ lam
    C = 8 / m * lam.T @ lam
    ref = solve_ivp(  # in ln z, so that z ~ 1e-8 is resolved to relative accuracy
        lambda t, u: r - C @ np.exp(u),
        (0, 12),
        np.log(np.diag(Mt0)),
        method="DOP853",
        t_eval=ts,
        rtol=1e-12,
        atol=1e-12,
    )
    Mt = np.einsum("ik,tij,jl->tkl", P, np.asarray(sol.M), P)
    z = np.diagonal(Mt, axis1=1, axis2=2)
    np.testing.assert_allclose(z, np.exp(ref.y.T), rtol=1e-8)  # measured 1e-10
    ratio = Mt / np.sqrt(z[:, :, None] * z[:, None, :])
    np.testing.assert_allclose(ratio, np.broadcast_to(ratio[0], ratio.shape), rtol=1e-8, atol=1e-9)
    assert z[-1].max() > 1e5 * eps  # the modes grew out of the small-init regime


@st.composite
def _problems(draw):  # the shapes of the Prop 7 test, so that the compiled solve is reused
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    A = _sym(rng.normal(size=(6, 4, 4)))
    L = rng.normal(size=(4, draw(st.integers(1, 4)))) * 10.0 ** draw(st.integers(-6, 0))
    return NQF(A, rng.normal(size=6)), L @ L.T


@settings(max_examples=10, deadline=None)
@given(_problems())
def test_flow_keeps_M_psd_and_never_raises_the_loss(problem):
    nqf, M0 = problem
    sol = matrix_flow(nqf, M0, np.linspace(0.0, 3.0, 7))
    eig = np.linalg.eigvalsh(np.asarray(sol.M))
    assert np.all(eig.min(axis=1) >= -1e-8 * eig.max(axis=1))
    loss = np.asarray(sol.loss)
    assert np.all(np.diff(loss) <= 1e-9 * loss[0])


@pytest.mark.bad_input
def test_errors():
    rng = np.random.default_rng(0)
    A = _sym(rng.normal(size=(3, 2, 2)))
    zgz, mu_nqf = NQF(A, np.ones(3)), NQF(A, np.ones(3), g=np.ones((3, 2)))
    ts = np.linspace(0, 1, 3)
    M0 = np.eye(2)
    Err = lvflow.LvflowError
    with pytest.raises(lvflow.NotPSDError, match="M0: not positive semi-definite"):
        matrix_flow(zgz, np.diag([1.0, -1.0]), ts)
    with pytest.raises(lvflow.SymmetryError, match="M0: not symmetric"):
        matrix_flow(zgz, np.array([[1.0, 0.5], [0.0, 1.0]]), ts)
    with pytest.raises(Err, match=r"M0: shape \(3, 3\), expected \(2, 2\)"):
        matrix_flow(zgz, np.eye(3), ts)
    with pytest.raises(Err, match="M0: contains 1 non-finite"):
        matrix_flow(zgz, np.diag([1.0, np.nan]), ts)
    with pytest.raises(Err, match="ts: must be strictly increasing"):
        matrix_flow(zgz, M0, [0.0, 1.0, 1.0])
    with pytest.raises(Err, match="ts: expected 1 dimensions"):
        matrix_flow(zgz, M0, 1.0)
    with pytest.raises(Err, match="d: required"):
        matrix_flow(mu_nqf, M0, ts, mu0=np.zeros(2))
    with pytest.raises(Err, match="mu0: required"):
        matrix_flow(mu_nqf, M0, ts, d=2)
    with pytest.raises(Err, match=r"mu0: shape \(3,\)"):
        matrix_flow(mu_nqf, M0, ts, d=2, mu0=np.zeros(3))
    with pytest.raises(Err, match="weight_decay: must be non-negative"):
        matrix_flow(zgz, M0, ts, weight_decay=-0.1)
    with pytest.raises(Err, match="solver: expected a diffrax solver"):
        matrix_flow(zgz, M0, ts, solver="rk45")
    with pytest.raises(lvflow.SolverError, match="maximum number of solver steps"):
        matrix_flow(zgz, M0, np.array([0.0, 100.0]), max_steps=2)


def _quadratic_net(p=4, m=12, seed=0):
    """A quadratic network's NQF (`A_μ = x_μ x_μᵀ / p`, Table 3): the A_μ do not commute."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((m, p))
    A = np.einsum("mi,mj->mij", X, X) / p
    y = 0.5 * rng.standard_normal(m) ** 2 + 0.1
    M0 = 1e-3 * np.eye(p) + 1e-4 * np.outer(X[0], X[0])
    return A, y, M0, rng


def test_rodas5p_matches_scipy_radau_through_convergence():
    # The stiff option: Rodas5P on the (M) flow of a non-commuting NQF out to t = 2000, far past
    # convergence, against scipy's Radau on Ṁ = −HM − MH written here in numpy.
    A, y, M0, _ = _quadratic_net()
    p, m = M0.shape[0], len(y)
    ts = np.array([0.0, 1.0, 10.0, 100.0, 2000.0])

    def rhs(t, x):
        M = x.reshape(p, p)
        H = 4.0 / m * np.einsum("m,mij->ij", np.einsum("mij,ij->m", A, M) - y, A)
        return -(H @ M + M @ H).ravel()

    ref = solve_ivp(rhs, (0, ts[-1]), M0.ravel(), method="Radau", t_eval=ts, rtol=1e-12, atol=1e-16).y.T.reshape(
        -1, p, p
    )
    sol = matrix_flow(NQF(A, y), M0, ts, rtol=1e-9, atol=1e-14, solver=lvflow.Rodas5P())
    np.testing.assert_allclose(np.asarray(sol.M), ref, rtol=1e-6, atol=1e-10)
    tsit = matrix_flow(NQF(A, y), M0, ts, rtol=1e-9, atol=1e-14)
    assert int(sol.num_steps) < int(tsit.num_steps) / 3  # stiff near convergence: fewer steps


@pytest.mark.parametrize(
    "solver", [pytest.param(None, id="tsit5", marks=pytest.mark.slow), pytest.param(lvflow.Rodas5P(), id="rodas5p")]
)
def test_derivatives_match_finite_differences(solver):
    # jax.grad (checkpointed adjoint) and jax.jvp (ForwardMode) of L(t) with respect to M0 and
    # the structure matrices A, against central differences of tight solves.
    import diffrax as dfx

    A, y, M0, rng = _quadratic_net()
    ts = np.array([0.0, 5.0, 20.0])

    def loss(M0, A, adjoint=None, rtol=1e-10):
        nqf = NQF(A, jnp.asarray(y))
        return matrix_flow(nqf, M0, ts, rtol=rtol, atol=1e-16, solver=solver, adjoint=adjoint).loss[-1]

    V = rng.standard_normal(M0.shape)
    V = V + V.T
    E = rng.standard_normal(A.shape)
    E = E + np.swapaxes(E, 1, 2)
    gM, gA = jax.grad(loss, argnums=(0, 1))(jnp.asarray(M0), jnp.asarray(A))
    jvp = jax.jvp(lambda M: loss(M, jnp.asarray(A), dfx.ForwardMode()), (jnp.asarray(M0),), (jnp.asarray(V),))[1]
    h = 1e-7
    fd_M = (loss(M0 + h * V, A, rtol=1e-12) - loss(M0 - h * V, A, rtol=1e-12)) / (2 * h)
    fd_A = (loss(M0, A + 1e-6 * E, rtol=1e-12) - loss(M0, A - 1e-6 * E, rtol=1e-12)) / 2e-6
    assert abs(float(jnp.sum(gM * V)) - fd_M) <= 1e-5 * abs(fd_M)
    assert abs(float(jvp) - fd_M) <= 1e-5 * abs(fd_M)
    assert abs(float(jnp.sum(gA * E)) - fd_A) <= 1e-5 * abs(fd_A)
