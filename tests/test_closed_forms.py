"""Closed forms (Thm 4, 5, 6, 7, 16, Eq. 158) against independent integrations and identities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.integrate import solve_ivp

import lvflow
from lvflow import (
    ignition_time,
    isotropic_modes,
    isotropic_riccati,
    log_orthogonal_features,
    orthogonal_features,
    orthogonal_samples,
    projector_modes,
    proportional_samples,
)


def test_orthogonal_features_vs_scipy():
    # Growing, neutral (r = 0) and decaying modes; C_kk = 0 with r < 0 too.
    r = np.array([1.0, 0.3, 0.0, -0.4, -0.2])
    c = np.array([1.0, 5.0, 2.0, 1.0, 0.0])
    z0 = np.array([1e-3, 0.2, 0.5, 0.3, 0.1])
    ts = np.linspace(0, 30, 61)
    ref = solve_ivp(lambda t, z: z * (r - c * z), (0, 30), z0, t_eval=ts, method="DOP853", rtol=1e-12, atol=1e-300)
    got = np.asarray(orthogonal_features(r, c, z0, ts))
    np.testing.assert_allclose(got, ref.y.T, rtol=1e-9)
    # r = 0: z0 / (1 + C z0 t) exactly.
    np.testing.assert_allclose(got[:, 2], z0[2] / (1 + c[2] * z0[2] * ts), rtol=1e-14)


@jax.jit
def _value_and_rate(r, c, z0, t):
    # ln z and d ln z/dt from the log form (a derivative of z itself underflows for z0 ~ 1e-300).
    f = lambda s: log_orthogonal_features(r[None], c[None], jnp.log(z0)[None], s)[0]
    z = orthogonal_features(r[None], c[None], z0[None], jnp.stack([0.0 * t, t]))[:, 0]
    return z, *jax.jvp(f, (t,), (jnp.ones_like(t),))


@settings(max_examples=25, deadline=None)
@given(
    r=st.floats(-2, 2),
    c=st.floats(1e-3, 10),
    log10_z0=st.floats(-300, 1),
    t=st.floats(0, 1e3),
)
def test_orthogonal_features_solves_the_ode(r, c, log10_z0, t):
    # z(0) = z0 and d ln z/dt = r − C z at any t: the formula solves ż = z(r − Cz) (Thm 6).
    z0 = 10.0**log10_z0
    z, logz, rate = _value_and_rate(*map(jnp.asarray, (r, c, z0, float(t))))
    z_start, z = float(z[0]), float(z[1])
    assert z_start == pytest.approx(z0, rel=1e-14)
    assert np.isfinite(z) and z >= 0
    # Both forms agree (up to the 1e-16·|ln z| rounding of exp in the log form).
    assert float(jnp.exp(logz)) == pytest.approx(z, rel=1e-12, abs=1e-300)
    assert float(rate) == pytest.approx(r - c * float(jnp.exp(logz)), rel=1e-9, abs=1e-12 * (abs(r) + 1))


def _isotropic_nqf(p, s, rng):
    # A_μ = s E_μ, {E_μ} a Frobenius-orthonormal basis of Sym(p): (1/m) Σ A_ij A_kl = c/2 (δδ + δδ), c = s²/m.
    E = []
    for i in range(p):
        for j in range(i, p):
            e = np.zeros((p, p))
            e[i, j] = e[j, i] = 1.0 if i == j else 1 / np.sqrt(2)
            E.append(e)
    A = s * np.array(E)
    m = len(E)
    y = rng.normal(size=m)
    return lvflow.NQF(A, y), s**2 / m


def test_isotropic_riccati_vs_scipy_and_matrix_flow():
    rng = np.random.default_rng(1)
    p = 4
    nqf, c = _isotropic_nqf(p, 2.0, rng)
    Y = np.asarray(nqf.Y)
    # The operator identity behind Thm 7: K(X) = 4c X for symmetric X.
    X = rng.normal(size=(p, p))
    X = X + X.T
    np.testing.assert_allclose(np.asarray(nqf.K(X)), 4 * c * X, rtol=1e-12, atol=1e-12)
    B = rng.normal(size=(p, 2))
    M0 = 1e-3 * B @ B.T  # rank 2: the formula must not need M0⁻¹
    ts = np.linspace(0, 4, 9)

    def rhs(t, m):
        M = m.reshape(p, p)
        return (Y @ M + M @ Y - 8 * c * M @ M).ravel()

    ref = solve_ivp(rhs, (0, 4), M0.ravel(), t_eval=ts, method="DOP853", rtol=1e-12, atol=1e-15).y.T.reshape(-1, p, p)
    got = np.asarray(isotropic_riccati(Y, c, M0, ts))
    scale = np.max(np.abs(ref), axis=(1, 2), keepdims=True)
    assert np.max(np.abs(got - ref) / scale) < 1e-9
    flow = lvflow.matrix_flow(nqf, M0, ts, rtol=1e-11)
    assert np.max(np.abs(got - np.asarray(flow.M)) / scale) < 1e-7


def test_isotropic_riccati_singular_Y_and_codiagonal_modes():
    # Y with a zero and a negative eigenvalue (Φ's Y⁻¹ must not be formed), M0 diagonal in Y's basis.
    gamma = np.array([0.7, 0.0, -0.5])
    c = 0.3
    z0 = np.array([1e-4, 0.2, 0.1])
    Q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    Y = Q @ np.diag(gamma) @ Q.T
    M0 = Q @ np.diag(z0) @ Q.T
    ts = np.array([0.0, 0.5, 3.0, 20.0])
    M = np.asarray(isotropic_riccati(Y, c, M0, ts))
    z = np.einsum("ik,nij,jk->nk", Q, M, Q)
    # ż = 2z(γ − 4cz): the logistic written out independently of the library.
    g, cc = 2 * gamma, 8 * c
    with np.errstate(divide="ignore", invalid="ignore"):
        logistic = np.where(
            g == 0, z0 / (1 + cc * z0 * ts[:, None]), g * z0 / (cc * z0 + (g - cc * z0) * np.exp(-g * ts[:, None]))
        )
    # Rotating back from the original basis costs relative accuracy only below ~1e-16 of |M|.
    np.testing.assert_allclose(z, logistic, rtol=1e-10, atol=1e-14 * np.max(logistic))
    np.testing.assert_allclose(np.asarray(isotropic_modes(gamma, c, z0, ts)), logistic, rtol=1e-12)
    # Projector form (Thm 16): ż = 2z(γ − κz) is the same logistic with κ = 4c.
    np.testing.assert_allclose(np.asarray(projector_modes(gamma, 4 * c, z0, ts)), logistic, rtol=1e-12)


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9])
def test_ignition_time_hits_rho_of_saturation(rho):
    # Eq. 158 inverts Thm 6 (a = 1) and Thm 7 (a = 2) exactly.
    zeta = np.array([1.0, 0.3, 2e-3])
    Ck = np.array([1.0, 4.0, 0.5])
    ck = np.array([1.0, 0.2, 3.0])
    eps = 1e-9
    t = np.asarray(ignition_time(zeta, Ck, ck, eps, rho=rho))
    z = np.diagonal(np.asarray(orthogonal_features(zeta, Ck, ck * eps, t)))
    np.testing.assert_allclose(z, rho * zeta / Ck, rtol=1e-10)
    t2 = np.asarray(ignition_time(zeta, Ck, ck, eps, a=2, rho=rho))
    z2 = np.diagonal(np.asarray(isotropic_modes(zeta, Ck / 4, ck * eps, t2)))
    np.testing.assert_allclose(z2, rho * zeta / Ck, rtol=1e-10)
    # The leading behaviour t* ~ ln(1/ε)/(a ζ) as ε → 0 (Thm 8); corrections are O(1/ln(1/ε)).
    t_tiny = np.asarray(ignition_time(zeta, Ck, ck, 1e-300, rho=rho))
    np.testing.assert_allclose(t_tiny * zeta / np.log(1e300), 1, atol=0.02)


@pytest.mark.parametrize("rho", [1 - 1e-6, 1 - 1e-13, 1 - 2**-52, 1 - 2**-53])
def test_eq158_as_rho_tends_to_one_against_mpmath(rho):
    # 1 − ρ is exact in float64; Eq. 158's ln((1−ρ)/ρ) must not be formed from ln T by cancellation
    # (a mode reported as never switching on, or a time off by 1e-3). Against 50-digit mpmath, over
    # rates and couplings from 1e-300 to 1e300: ignition_time, solve_lv's closed form and its
    # derivative (finite).
    import mpmath as mp

    mp.mp.dps = 50

    def eq158(zeta, C, z0):
        zeta, C, z0, p = (mp.mpf(float(v)) for v in (zeta, C, z0, rho))
        return float((mp.log(p * zeta / (C * z0)) + mp.log((zeta - C * z0) / (zeta * (1 - p)))) / zeta)

    for zeta in (1e-300, 1e-3, 1.0, 1e300):
        for C in (1e-300, 1.0, 1e300):
            for eps in (5e-324, 1e-12):
                if mp.mpf(eps) >= mp.mpf(rho) * mp.mpf(zeta) / mp.mpf(C):  # starts on: t = 0 (tested below)
                    continue
                got = float(ignition_time(zeta, C, 1.0, eps, rho=rho))
                assert got == pytest.approx(eq158(zeta, C, eps), rel=1e-13)
    rng = np.random.default_rng(0)
    r, c = 10 ** rng.uniform(-3, 3, 50), 10 ** rng.uniform(-3, 3, 50)
    z0 = np.full(50, 1e-12)

    def t_star(r):
        system = lvflow.LotkaVolterra(r, np.diag(c))
        return lvflow.solve_lv(system, z0, 1e9, ts=[0.0, 1e9], rho=rho).switch_on_times

    want = [eq158(*v) for v in zip(r, c, z0)]
    np.testing.assert_allclose(np.asarray(t_star(r)), want, rtol=1e-13)
    assert np.all(np.isfinite(np.asarray(jax.grad(lambda r: jnp.sum(t_star(r)))(jnp.asarray(r)))))


def test_ignition_time_edge_cases():
    t = np.asarray(ignition_time(np.array([0.0, -1.0, 1.0, 1.0]), 1.0, np.array([1, 1, 0.9, 0.2]), 1.0))
    assert np.isinf(t[0]) and np.isinf(t[1])  # ζ ≤ 0: never switches on
    assert t[2] == 0.0  # z0 = 0.9 ≥ ρ z(∞) = 0.5: already on
    assert t[3] > 0


def test_proportional_samples_vs_flow_on_W():
    # A_μ = c_μ A: integrate Ẇ = −(4/m) Σ Δ_μ A_μ W directly (Eq. 27) and compare W(t) and ξ.
    rng = np.random.default_rng(3)
    p, d = 3, 2
    S = rng.normal(size=(p, p))
    A = (S + S.T) / 2
    cm = np.array([1.0, 0.5, -0.8, 1.2])
    y = np.array([0.5, 0.2, -0.3, 0.7])
    W0 = 0.05 * rng.normal(size=(p, d))
    m = len(cm)

    def rhs(t, w):
        W = w.reshape(p, d)
        delta = cm * np.trace(W @ W.T @ A) - y
        return (-(4 / m) * np.sum(delta * cm) * A @ W).ravel()

    ts = np.linspace(0, 6, 13)
    ref = solve_ivp(rhs, (0, 6), W0.ravel(), t_eval=ts, method="DOP853", rtol=1e-12, atol=1e-14).y.T.reshape(-1, p, d)
    sol = proportional_samples(A, cm, y, W0, ts)
    np.testing.assert_allclose(np.asarray(sol.W), ref, rtol=1e-8, atol=1e-10)
    delta = cm[None] * np.einsum("npd,nqd,pq->n", ref, ref, A)[:, None] - y
    np.testing.assert_allclose(np.asarray(sol.loss), np.mean(delta**2, axis=1), rtol=1e-8)


def test_orthogonal_samples_vs_gd_on_W():
    # Fig 4: m = 4 samples, diagonal A_μ on disjoint blocks of 3 entries (1, 1.5, 2).
    m, Kb = 4, 3
    p = m * Kb
    lam = np.zeros((m, p))
    for mu in range(m):
        lam[mu, mu * Kb : (mu + 1) * Kb] = [1.0, 1.5, 2.0]
    y = np.array([1.0, 0.5, 0.25, 0.125])
    eps = 1e-4
    ts = np.linspace(0, 40, 41)
    sol = orthogonal_samples(lam, y, np.full(p, eps), ts)
    # Plain numpy gradient descent on W (p × p), W0 = √ε I, lr η, t = η · step.
    eta = 1e-3
    W = np.sqrt(eps) * np.eye(p)
    A = np.array([np.diag(l) for l in lam])
    losses = []
    for n in range(int(ts[-1] / eta) + 1):
        if n % int(1 / eta) == 0:
            delta = np.einsum("mij,ij->m", A, W @ W.T) - y
            losses.append(delta**2)
        delta = np.einsum("mij,ij->m", A, W @ W.T) - y
        W = W - eta * (4 / m) * np.einsum("m,mij->ij", delta, A) @ W
    losses = np.array(losses)
    # GD is the flow up to O(η): within 1% of the loss scale at every time.
    assert np.max(np.abs(np.asarray(sol.losses) - losses)) < 0.01 * np.max(y**2)
    # Each sample's loss drops once, from y² to ~0, in the predicted order (ζ_μ ∝ y_μ).
    drop = np.argmax(np.asarray(sol.losses) < 0.5 * y**2, axis=0)
    assert np.all(np.diff(drop) > 0) and np.all(np.asarray(sol.losses)[-1] < 1e-6 * y**2)


def test_errors():
    with pytest.raises(lvflow.LvflowError, match="rho"):
        ignition_time(1.0, 1.0, 1.0, 1e-3, rho=1.0)
    with pytest.raises(lvflow.LvflowError, match="eps"):
        ignition_time(1.0, 1.0, 1.0, 0.0)
    # values out of range: equinox's run-time error (eagerly and under jit), naming the input
    with pytest.raises(Exception, match="z0: must be > 0"):
        orthogonal_features([1.0], [1.0], [0.0], 1.0)
    with pytest.raises(Exception, match="z0: must be > 0"):
        jax.jit(orthogonal_features)(jnp.ones(1), jnp.ones(1), jnp.zeros(1), 1.0)
    with pytest.raises(Exception, match="c_diag: must be >= 0"):
        orthogonal_features([1.0], [-1.0], [0.1], 1.0)
    with pytest.raises(Exception, match="c_diag: must be >= 0"):
        log_orthogonal_features([1.0], [-1.0], [-3.0], 1.0)
    with pytest.raises(Exception, match="c: must be >= 0"):
        lvflow.isotropic_modes([1.0], -1.0, [0.1], 1.0)
    with pytest.raises(Exception, match="z0: must be > 0"):
        orthogonal_samples(np.eye(2), [1.0, 1.0], [0.1, 0.0], [0.0, 0.5])
    with pytest.raises(lvflow.LvflowError, match="r"):
        orthogonal_features([np.nan], [1.0], [0.1], 1.0)
    with pytest.raises(lvflow.SymmetryError, match="Y"):
        isotropic_riccati(np.array([[0.0, 1.0], [0.0, 0.0]]), 1.0, np.eye(2), 1.0)
    with pytest.raises(Exception, match="c: must be >= 0"):
        isotropic_riccati(np.eye(2), -1.0, np.eye(2), 1.0)
    with pytest.raises(Exception, match="ts: must be non-negative and non-decreasing"):
        orthogonal_samples(np.eye(2), [1.0, 1.0], [0.1, 0.1], [1.0, 0.5])
    with pytest.raises(lvflow.LvflowError, match="ts: is empty"):
        orthogonal_samples(np.eye(2), [1.0, 1.0], [0.1, 0.1], [])


# ---- issue 16: subnormal ε in logs, mismatched shapes and booleans named -----------------------


@pytest.mark.parametrize("eps", [1e-310, 1e-320, 5e-324])
def test_ignition_time_with_subnormal_eps(eps):
    # Eq. 158 with ε below the smallest normal double (C_k c_k ε subnormal or zero as a product):
    # t* = (1/ζ)[ln(1/ε) − ln(C c/(ζ − C c ε) · (1−ρ)/ρ)], evaluated here with mpmath.
    import mpmath as mp

    mp.mp.dps = 40
    zeta, C, c = np.array([1.0, 0.5]), np.array([2.0, 1e300]), np.array([1.0, 3.0])
    got = np.asarray(lvflow.ignition_time(zeta, C, c, eps))
    e = mp.mpf(eps)
    ref = [
        float((-mp.log(e) - mp.log(mp.mpf(Ck) * ck / (z - mp.mpf(Ck) * ck * e))) / z) for z, Ck, ck in zip(zeta, C, c)
    ]
    np.testing.assert_allclose(got, ref, rtol=1e-14)


@pytest.mark.bad_input
def test_ignition_time_input_errors():
    with pytest.raises(lvflow.LvflowError, match="do not broadcast"):
        lvflow.ignition_time(np.ones(3), np.ones(2), 1.0, 1e-3)
    with pytest.raises(lvflow.LvflowError, match="zeta: boolean"):
        lvflow.ignition_time(np.array([True, False]), 1.0, 1.0, 1e-3)
    with pytest.raises(lvflow.LvflowError, match="r: boolean"):
        lvflow.LotkaVolterra(np.array([True, False]), np.eye(2))
