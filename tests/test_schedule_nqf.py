"""The ε → 0 schedule of an NQF whose data need not commute (`plateau_schedule(nqf, eps)`).

References: on commuting data, the gLV schedule of `reduce_to_lv` (an independent algorithm on
the reduced system, with its own closed form for diagonal `C`); on non-commuting data, the
finite-ε flow `matrix_flow` from `M0 = ε I` over a geometric range of ε, and the global minimum
of the convex loss over PSD matrices found by scipy L-BFGS on a full factor.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from hypothesis import example, given, settings, strategies as st

import lvflow

# --- commuting data: the gLV schedule -------------------------------------------------------


def _commuting(seed, p=4, m=10, coupled=True):
    """`A_μ = P diag(λ_μ) Pᵀ`; `coupled` correlates the λ's (competition: modes switch off)."""
    rng = np.random.default_rng(seed)
    P = np.linalg.qr(rng.standard_normal((p, p)))[0]
    if coupled:
        lam = rng.standard_normal((m, 2)) @ rng.standard_normal((2, p)) + 0.3 * rng.standard_normal((m, p))
        y = lam @ rng.uniform(-0.5, 1.0, p) + 0.3 * rng.standard_normal(m)
    else:
        lam = rng.standard_normal((m, p))
        y = lam @ rng.uniform(0.2, 1.0, p) + 0.3 * rng.standard_normal(m)
    return lvflow.NQF(np.einsum("ik,nk,jk->nij", P, lam, P), y)


def _events_by_mode(sched, P):
    """`(τ, ignites, mode)` per event, the mode the event's direction is (up to sign)."""
    ov = np.abs(np.asarray(sched.direction) @ P)
    modes = np.argmax(ov, axis=1)
    assert np.allclose(ov[np.arange(modes.size), modes], 1.0, atol=1e-8)
    return list(zip(np.asarray(sched.tau), np.asarray(sched.ignites), modes))


def _assert_matches_glv(nqf):
    lv = lvflow.reduce_to_lv(nqf)
    ref = lvflow.plateau_schedule(lv, 1e-6)
    got = lvflow.plateau_schedule(nqf, 1e-6)
    assert isinstance(got, lvflow.NQFPlateauSchedule)
    P = np.asarray(lv.P)
    a = sorted(_events_by_mode(got, P), key=lambda e: (round(e[0], 8), e[1], e[2]))
    b = sorted(
        zip(np.asarray(ref.tau), np.asarray(ref.ignites), np.asarray(ref.mode)),
        key=lambda e: (round(e[0], 8), e[1], e[2]),
    )
    assert [(e[1], e[2]) for e in a] == [(bool(e[1]), int(e[2])) for e in b]
    np.testing.assert_allclose([e[0] for e in a], [e[0] for e in b], rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.asarray(got.loss), np.asarray(ref.loss), rtol=0, atol=1e-10)
    # the last plateau is the gLV equilibrium: z* = diag(Pᵀ M* P); the off-diagonal entries, which
    # the loss does not see (Prop 7) and the exact flow keeps at 0, follow the plateau flow's tolerance
    Mp = P.T @ np.asarray(got.M[-1]) @ P
    np.testing.assert_allclose(np.diagonal(Mp), np.asarray(ref.z_final), rtol=0, atol=1e-9)
    assert np.max(np.abs(Mp - np.diag(np.diagonal(Mp)))) < 1e-5
    return ref


@pytest.mark.parametrize("seed", [0, 1])
def test_commuting_data_give_the_glv_schedule(seed):
    _assert_matches_glv(_commuting(seed, coupled=False))


@pytest.mark.parametrize("seed", [26, 32])
def test_commuting_data_with_switch_offs_give_the_glv_schedule(seed):
    # seed 32: a mode switches off and ignites again later
    ref = _assert_matches_glv(_commuting(seed))
    assert not np.all(np.asarray(ref.ignites))


def test_commuting_vector_outputs_give_the_glv_schedule():
    # A of shape (m, k, p, p) (Cor. 1): the sums run over output components too
    rng = np.random.default_rng(3)
    p, m, k = 4, 8, 2
    P = np.linalg.qr(rng.standard_normal((p, p)))[0]
    lam = rng.standard_normal((m, k, p))
    y = lam @ rng.uniform(0.2, 1.0, p) + 0.2 * rng.standard_normal((m, k))
    _assert_matches_glv(lvflow.NQF(np.einsum("ia,nca,ja->ncij", P, lam, P), y))


def test_diagonal_network_with_an_untouched_and_two_degenerate_directions():
    # A = ¼ Diag(x) (Table 3) in p = 4: coordinates 0 and 1 have identical statistics (equal rates,
    # simultaneous ignition: a degenerate eigenspace of H), coordinate 3 is never touched.
    x = np.array([[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, -0.5, 0.0], [1.0, 0.0, 0.2, 0.0], [0.0, 1.0, 0.2, 0.0]])
    A = np.stack([np.diag(v) / 4 for v in x])
    y = np.array([1.0, 1.0, 0.3, 0.3])
    nqf = lvflow.NQF(A, y)
    ref = _assert_matches_glv(nqf)
    t = np.asarray(ref.tau)
    assert t.size >= 2 and t[0] == t[1]
    got = lvflow.plateau_schedule(nqf, 1e-4)
    assert np.all(np.abs(np.asarray(got.direction)[:, 3]) < 1e-12)  # never ignites


# --- non-commuting data: the finite-ε flow converges to the schedule -------------------------


def _quadratic_net(p=4, m=40, seed=0):
    """Quadratic network `A(x) = x xᵀ` on correlated Gaussian inputs, rank-3 teacher `y = xᵀ M_t x`."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((m, p)) @ np.linalg.cholesky(0.5 * np.eye(p) + 0.5 * np.ones((p, p))).T
    U = rng.standard_normal((p, 3))
    Mt = U @ np.diag([1.0, 0.5, 0.25]) @ U.T / p
    net = lvflow.architectures.QuadraticNet(p, 1, key=jax.random.PRNGKey(0))
    A = np.asarray(jax.vmap(net.structure)(jnp.asarray(X)))
    return lvflow.NQF(A, np.einsum("nij,ij->n", A, Mt)), Mt


def _crossing(ts, loss, level):
    i = int(np.flatnonzero(loss < level)[0])
    return ts[i - 1] + (ts[i] - ts[i - 1]) * (loss[i - 1] - level) / (loss[i - 1] - loss[i])


def test_finite_eps_flow_converges_to_the_schedule_on_non_commuting_data():
    nqf, Mt = _quadratic_net()
    with pytest.raises(lvflow.NotCommutingError):
        lvflow.reduce_to_lv(nqf)
    s = lvflow.plateau_schedule(nqf, 1e-6)
    tau, Ls = np.asarray(s.tau), np.asarray(s.loss)
    assert tau.size == 3 and np.all(np.asarray(s.ignites))
    np.testing.assert_allclose(np.asarray(s.M[-1]), Mt, atol=1e-9)  # the teacher, rank 3
    assert s.kkt_residual < 1e-7
    epss = [1e-3, 1e-4, 1e-6, 1e-8]
    errL, t_eps, plateau_err = [], [], []
    mids = np.concatenate([[tau[0] / 2], (tau[:-1] + tau[1:]) / 2])
    for eps in epss:
        L = -math.log(eps)
        ts = np.linspace(0.0, (1.3 * tau[-1] + 0.5) * L, 3000)
        loss = np.asarray(lvflow.matrix_flow(nqf, eps * np.eye(nqf.p), ts, rtol=1e-10).loss)
        # event time: the loss halfway between the plateaus before and after
        tk = np.array([_crossing(ts, loss, (Ls[k] + Ls[k + 1]) / 2) for k in range(tau.size)])
        t_eps.append(tk)
        errL.append((tk / L - tau) * L)
        plateau_err.append(np.abs(np.interp(mids * L, ts, loss) - Ls[:-1]))
    errL, t_eps, plateau_err = np.array(errL), np.array(t_eps), np.array(plateau_err)
    # |t_k/L − τ_k| · L roughly constant over ε (convergence like 1/ln(1/ε)) ...
    assert np.all(np.ptp(errL, axis=0) < 0.5), errL
    # ... so t_k(ε) is affine in L = ln(1/ε) with slope τ_k
    Lv = -np.log(epss)
    slope = np.polyfit(Lv, t_eps, 1)[0]
    np.testing.assert_allclose(slope, tau, rtol=0.05)
    # plateau losses approach the schedule's
    assert np.all(plateau_err[-1] < 1e-3) and np.all(plateau_err[-1] < plateau_err[0])
    # the step function agrees with the flow mid-plateau at the smallest ε
    np.testing.assert_allclose(np.asarray(s.loss_at(mids)), Ls[:-1])
    np.testing.assert_allclose(np.asarray(s.times(1e-8)), tau * -math.log(1e-8))


# --- invariants over small random problems --------------------------------------------------


def _global_min(nqf, seed):
    """min of the convex loss over PSD M = W Wᵀ, W square (no spurious minima), by L-BFGS."""
    p = nqf.p
    A, y = np.asarray(nqf.A), np.asarray(nqf.y)

    def f(w):
        W = w.reshape(p, p)
        r = np.einsum("nij,ij->n", A, W @ W.T) - y
        return float(r @ r) / y.size, (4.0 / y.size * np.einsum("n,nij->ij", r, A) @ W).ravel()

    rng = np.random.default_rng(seed)
    best = np.inf
    for _ in range(3):
        res = scipy.optimize.minimize(f, rng.standard_normal(p * p), jac=True, method="L-BFGS-B", tol=1e-14)
        best = min(best, res.fun)
    return best


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(3, 15), noise=st.floats(0.0, 0.5), kind=st.sampled_from(range(3)))
@example(seed=0, m=8, noise=1e-5, kind=0)  # a direction of rate 9e-6: its flow outlasts the old fixed horizon
def test_plateaus_are_kkt_points_and_the_loss_only_falls(seed, m, noise, kind):
    # matrix sensing Sym(S_a); a quadratic net on correlated inputs; a bilinear layer ½[[0, S], [Sᵀ, 0]]
    p = 4
    rng = np.random.default_rng(seed)
    if kind == 0:
        S = rng.standard_normal((m, p, p))
        A = (S + np.transpose(S, (0, 2, 1))) / 2
    elif kind == 1:
        X = rng.standard_normal((m, p)) @ np.linalg.cholesky(0.5 * np.eye(p) + 0.5 * np.ones((p, p))).T
        A = np.einsum("ni,nj->nij", X, X)
    else:
        A = np.zeros((m, p, p))
        A[:, :2, 2:] = rng.standard_normal((m, 2, 2)) / 2
        A = A + np.transpose(A, (0, 2, 1))
    U = rng.standard_normal((p, 2))
    y = np.einsum("nij,ij->n", A, U @ U.T) + noise * rng.standard_normal(m)
    nqf = lvflow.NQF(A, y)
    s = lvflow.plateau_schedule(nqf, 1e-5)
    loss = np.asarray(s.loss)
    assert np.all(np.diff(loss) <= 1e-12 * max(1.0, loss[0]))
    ign = np.asarray(s.ignites)
    assert ign.size == 0 or ign[0]
    scale = float(np.max(np.abs(np.asarray(nqf.Y))))
    for j, (M, tj) in enumerate(zip(np.asarray(s.M), np.asarray(s.plateau_tau))):
        size = max(1.0, float(np.max(np.abs(M))))
        assert np.linalg.eigvalsh(M)[0] >= -1e-10 * size
        H = np.asarray(nqf.H(M))
        # KKT of min L over PSD M with range in S = range M: H vanishes on S (H M = 0)
        assert np.linalg.norm(H @ M) <= 1e-9 * scale * size
        expected = loss[0] if j == 0 else float(s.loss_at(tj))
        np.testing.assert_allclose(float(nqf.loss(M)), expected, rtol=1e-12, atol=1e-14)
    # the last plateau: nothing grows (H ⪰ 0 on S⊥), so M* is the global minimum over all PSD M
    g_last = np.asarray(s.rates)[-1]
    assert np.all(g_last[np.isfinite(g_last)] <= 1e-8 * 2 * scale)
    assert abs(loss[-1] - _global_min(nqf, seed)) <= 1e-7 * max(1.0, loss[0])


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.bad_input
@pytest.mark.parametrize("eps", [0.0, 1.0, -0.5, float("nan")])
def test_eps_outside_the_open_interval(eps):
    nqf, _ = _quadratic_net(m=12)
    with pytest.raises(lvflow.LvflowError, match="eps"):
        lvflow.plateau_schedule(nqf, eps)


@pytest.mark.bad_input
def test_wrong_system_type_and_gLV_only_options():
    with pytest.raises(lvflow.LvflowError, match="system: expected"):
        lvflow.plateau_schedule("not a system", 1e-3)
    nqf, _ = _quadratic_net(m=12)
    with pytest.raises(lvflow.LvflowError, match="gLV-only"):
        lvflow.plateau_schedule(nqf, 1e-3, corrected=True)
    with pytest.raises(lvflow.LvflowError, match="max_events"):
        lvflow.plateau_schedule(nqf, 1e-3, max_events=0)
    mu_nqf = lvflow.NQF(np.asarray(nqf.A), np.asarray(nqf.y), g=np.ones((nqf.m, nqf.p)))
    with pytest.raises(lvflow.LvflowError, match="μ-terms"):
        lvflow.plateau_schedule(mu_nqf, 1e-3)
    s = lvflow.plateau_schedule(nqf, 1e-3)
    with pytest.raises(lvflow.LvflowError, match="tau"):
        s.loss_at(float("nan"))
    with pytest.raises(lvflow.LvflowError, match="eps"):
        s.times(2.0)


def test_both_schedules_share_one_abstract_base():
    # plateau_schedule returns a final subclass of one abstract base for a gLV and for an NQF: the
    # step-function loss, the event count and the real times are the base's, alike for both
    nqf, _ = _quadratic_net(m=12)
    a = lvflow.plateau_schedule(nqf, 1e-3)
    b = lvflow.plateau_schedule(lvflow.LotkaVolterra(np.array([1.0, 0.5]), np.eye(2)), 1e-3)
    (base,) = [c for c in type(a).__mro__ if c in type(b).__mro__ and c.__name__.startswith("Abstract")]
    assert base.loss_at is type(a).loss_at is type(b).loss_at
    for s in (a, b):
        tau, loss = np.asarray(s.tau), np.asarray(s.loss)
        mid = np.concatenate([[tau[0] / 2], (tau[:-1] + tau[1:]) / 2, [tau[-1] + 1]])
        np.testing.assert_array_equal(np.asarray(s.loss_at(mid)), loss)  # one plateau between events
        assert s.n_events == tau.size
        np.testing.assert_allclose(np.asarray(s.times(1e-6)), tau * np.log(1e6), rtol=1e-15)
