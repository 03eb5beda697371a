"""`lvflow.predict` against closed forms (Thm 6, Eq. 158, Eq. 168), scipy, and plain gradient
descent; its saved results; the initial-scale rules."""

import json
import math

import numpy as np
import pytest
from _cli import main
from hypothesis import given, settings, strategies as st
from scipy.integrate import solve_ivp

import lvflow
from lvflow import NQF, LotkaVolterra, LvflowError, predict

# internal on purpose: predict's helpers (initial scale, ε_merge) and the CLI's system builders, tested directly


def t_star_158(r, Ckk, c, eps, rho):
    """Eq. 158 with a = 1, ζ_k = r_k, C_k = C_kk (exact for diagonal C, Thm 6); 0 for a mode that
    starts at or above its target ρ z_k(∞) (there Eq. 158's logarithm turns negative)."""
    t = (math.log(1 / eps) - np.log(Ckk * c / (r - Ckk * c * eps) * (1 - rho) / rho)) / r
    return np.maximum(t, 0.0)


def z_thm6(t, r, Ckk, z0):
    """Thm 6: z_k(t) = r z0 / (C z0 + (r − C z0) e^{−r t})."""
    t = np.asarray(t)[:, None]
    return r * z0 / (Ckk * z0 + (r - Ckk * z0) * np.exp(-r * t))


N = 400  # the default curve length, and K = 3, throughout: each new shape costs a compile


@pytest.fixture(scope="module")
def three():
    lv = LotkaVolterra(np.array([0.25, 1.0, 0.5]), np.diag([2.0, 1.0, 0.5]))
    return lv, predict(lv, eps=1e-4, c=np.array([1.0, 2.0, 0.5]), learning_rate=0.01, rho=0.3, num_points=N)


def test_diagonal_matches_closed_forms(three):
    lv, p = three
    r, Ckk, c = np.array([0.25, 1.0, 0.5]), np.array([2.0, 1.0, 0.5]), np.array([1.0, 2.0, 0.5])
    assert p.method == "lv" and np.array_equal(p.order, [1, 2, 0])  # ignition order: r descending
    ref = t_star_158(r, Ckk, c, 1e-4, 0.3)[[1, 2, 0]]
    np.testing.assert_allclose(p.t_star, ref, rtol=1e-6)
    np.testing.assert_allclose(p.steps_star, ref / 0.01, rtol=1e-6)
    np.testing.assert_allclose(p.tau_star, 1 / r[[1, 2, 0]], rtol=1e-6)  # Eq. 168: τ*_k = 1/r_k
    V = r**2 / (8 * Ckk)
    np.testing.assert_allclose(p.V, V[[1, 2, 0]], rtol=1e-12)
    # Plateau before the k-th ignition: the drops still to come (Eq. 168).
    np.testing.assert_allclose(p.plateau_loss, np.cumsum(V[[1, 2, 0]][::-1])[::-1], rtol=1e-6)
    # The loss curve: Eq. 163 with Thm 6's z_k(t), E = Σ V_k (1 − z_k/z_k∞)².
    z = z_thm6(np.asarray(p.ts), r, Ckk, 1e-4 * c)
    E = np.sum(V * (1 - z / (r / Ckk)) ** 2, axis=1)
    np.testing.assert_allclose(p.excess_loss, E, rtol=1e-6, atol=1e-12)
    assert np.all(np.isnan(p.loss))  # y2 unknown for a bare (r, C): only the excess loss is defined


@settings(max_examples=6, deadline=None)
@given(st.lists(st.floats(0.05, 3.0), min_size=3, max_size=3, unique=True), st.floats(1e-9, 1e-2), st.floats(0.1, 0.9))
def test_switch_on_times_hypothesis(r, eps, rho):
    r = np.array(r)
    Ckk = 1.0 + r  # any positive diagonal
    p = predict(LotkaVolterra(r, np.diag(Ckk)), eps=eps, rho=rho, num_points=N)  # K, N fixed: no recompiles
    np.testing.assert_allclose(np.sort(p.t_star), np.sort(t_star_158(r, Ckk, np.ones_like(r), eps, rho)), rtol=1e-6)
    assert np.all(np.diff(np.asarray(p.t_star)) >= 0)


def test_coupled_system_against_scipy():
    r = np.array([1.0, 0.6, 0.3])
    G = np.array([[1.0, 0.3, 0.0], [0.2, 1.0, 0.4], [0.1, 0.0, 1.0]])
    C = G @ G.T  # a Gram matrix: PSD with competition
    eps = 1e-6
    p = predict(LotkaVolterra(r, C), eps=eps, t1=200.0, num_points=N)
    zinf = np.linalg.solve(C, r)  # all > 0 here: the interior equilibrium is z(∞)
    assert np.all(zinf > 0.05)
    # Independent: scipy's Radau on ln z, then the ρ = ½ crossings of z_k(∞) on its dense output.
    sol = solve_ivp(
        lambda t, u: r - C @ np.exp(u),
        (0, 1000.0),
        np.full(3, math.log(eps)),
        method="Radau",
        rtol=1e-11,
        atol=1e-12,
        dense_output=True,
    )
    np.testing.assert_allclose(np.exp(sol.y[:, -1]), zinf, rtol=1e-6)
    tt = np.linspace(0, 100, 1_000_001)
    z = np.exp(sol.sol(tt))
    for i, k in enumerate(np.asarray(p.order)):
        cross = tt[np.argmax(z[k] >= 0.5 * zinf[k])]
        assert abs(float(p.t_star[i]) - cross) < 2e-4, (k, float(p.t_star[i]), cross)
    np.testing.assert_allclose(p.z_inf, zinf, rtol=1e-10)
    assert any("not diagonal" in n for n in p.notes)


def test_power_law_exponent_and_merging():
    k = np.arange(1, 4.0)
    p = predict(lvflow.power_law_lv(alpha1=2.0, alpha2=0.8, modes=3), eps=1e-6, alpha=(2.0, 0.8), num_points=N)
    assert p.exponent == pytest.approx((2.0 - 1) / 0.8)  # Thm 9
    r, V = k**-0.8, k**-2.0
    np.testing.assert_allclose(p.r, r, rtol=1e-12)
    np.testing.assert_allclose(p.V, V, rtol=1e-12)
    np.testing.assert_allclose(p.C_diag, r**2 / (8 * V), rtol=1e-12)
    # ε_merge is where `resolved_steps` (independent code, _scaling.py) flips for that pair.
    em = np.asarray(p.eps_merge)
    for j in range(2):
        assert lvflow.resolved_steps(r, em[j] * 0.99, C=r**2 / (8 * V)).resolved[j]
        assert not lvflow.resolved_steps(r, em[j] * 1.01, C=r**2 / (8 * V)).resolved[j]
    # Leading order: ln(1/ε_merge) = ln 9 (1/ζ_k + 1/ζ_{k+1}) / (1/ζ_{k+1} − 1/ζ_k), up to O(1) terms.
    lead = np.log(9) * (1 / r[:-1] + 1 / r[1:]) / (1 / r[1:] - 1 / r[:-1])
    np.testing.assert_allclose(-np.log(em), lead, rtol=0.35)


def test_eps_merge_flips_resolution():
    zeta = np.array([1.0, 0.5, 0.25, 0.24])
    C, c = np.array([1.0, 2.0, 1.0, 1.0]), np.ones(4)
    em = lvflow.eps_merge(zeta, C=C, c=c)
    from lvflow import resolved_steps

    for k, e in enumerate(em):
        assert resolved_steps(zeta, e * 0.999, C=C).resolved[k]
        assert not resolved_steps(zeta, e * 1.001, C=C).resolved[k]
    assert em[2] < 1e-30  # nearly equal rates merge unless ε is astronomically small
    assert np.isnan(lvflow.eps_merge(np.array([1.0, 1.0]), C=np.ones(2), c=np.ones(2))[0])
    # Rates 0.1 % apart stay merged down to ε = 1e-304: reported as 0, and indeed unresolved there.
    assert lvflow.eps_merge(np.array([1.0, 0.999]), C=np.ones(2), c=np.ones(2))[0] == 0.0
    assert not resolved_steps(np.array([1.0, 0.999]), 1e-300, C=np.ones(2)).resolved[0]


def test_gd_steps_match_gradient_descent():
    """End to end from data: a diagonal NQF (commuting A_μ), plain numpy GD on W with lr η,
    and the step at which each z_k = (PᵀWWᵀP)_kk crosses ½ z_k(∞)."""
    rng = np.random.default_rng(1)
    Q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    lam = Q * np.sqrt(3 / 8)  # Σ_μ λ_μk λ_μj = (3/8) δ_kj ⇒ C = (8/m)·(3/8) I = I  (m = 3)
    A = np.stack([np.diag(l) for l in lam])
    r_target = np.array([1.0, 0.5, 0.25])
    y = np.linalg.solve(8 / 3 * lam.T, r_target)  # r_k = (8/m) Σ_μ y_μ λ_μk
    nqf = NQF(A, y)
    eta, eps = 0.01, 1e-4
    p = predict(nqf, eps=eps, learning_rate=eta, num_points=N)
    np.testing.assert_allclose(np.sort(np.asarray(p.r))[::-1], r_target, rtol=1e-10)
    W = math.sqrt(eps) * np.eye(3)
    z_hist = []
    for _ in range(int(p.steps_star[-1] * 1.3)):
        M = W @ W.T
        res = np.einsum("mij,ij->m", A, M) - y
        H = 4 / 3 * np.einsum("m,mij->ij", res, A)
        W = W - eta * H @ W  # ∇_W L = (4/m) Σ Δ_μ A_μ W = H W (Eq. 27)
        z_hist.append(np.diag(W @ W.T))
    z_hist = np.array(z_hist)
    for i in range(3):
        k = int(np.argmin(np.abs(r_target - float(p.r[i]))))  # the coordinate of this mode (P = I)
        gd_step = int(np.argmax(z_hist[:, k] >= 0.5 * r_target[k])) + 1  # z_k(∞) = r_k / C_kk, C = I
        assert abs(gd_step - float(p.steps_star[i])) / gd_step < 0.02, (i, gd_step, float(p.steps_star[i]))


def test_save_roundtrip(three, tmp_path):
    _, p = three
    p.save(tmp_path / "o.json")
    d = json.loads((tmp_path / "o.json").read_text())
    assert d["eps"] == 1e-4 and d["method"] == "lv" and len(d["directions"]) == 3
    np.testing.assert_allclose([m["t_star"] for m in d["directions"]], p.t_star, rtol=1e-15)
    assert d["curve"]["loss"][0] is None  # NaN → null: strict JSON
    np.testing.assert_allclose(d["curve"]["steps"], np.asarray(p.ts) / 0.01)
    p.save(tmp_path / "o.npz")
    with np.load(tmp_path / "o.npz", allow_pickle=False) as z:
        np.testing.assert_array_equal(z["t_star"], p.t_star)
        np.testing.assert_array_equal(z["excess_loss"], p.excess_loss)
        assert str(z["method"]) == "lv" and float(z["learning_rate"]) == 0.01
    with pytest.raises(LvflowError, match="save: unsupported"):
        p.save(tmp_path / "o.txt")
    p.plot(tmp_path / "o.png")
    assert (tmp_path / "o.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _initial_scale(K, **kw):
    """`predict`'s `ε` and `c` (`z_k0 = ε c_k`) for a `K`-mode system and the initial-scale arguments `kw`."""
    p = predict(LotkaVolterra(np.linspace(1.0, 0.5, K), np.eye(K)), t1=1.0, num_points=8, **kw)
    return p.eps, np.asarray(p.c)


def test_initial_scale_rules():
    assert _initial_scale(2, eps=1e-3)[0] == 1e-3
    e, c = _initial_scale(2, z0=np.array([1e-4, 4e-4]))
    assert e == 4e-4 and np.allclose(c, [0.25, 1.0])
    # init_std σ, width d: E[W Wᵀ] = d σ² I, so every mode starts near d σ² ...
    e, c = _initial_scale(2, init_std=1e-3, width=200)
    assert e == pytest.approx(200 * 1e-6) and np.all(c == 1)
    # ... which a sampled W confirms for a random mode basis P (relative spread √(2/d) = 0.1).
    rng = np.random.default_rng(0)
    P, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    z0 = np.mean([np.diag(P.T @ (W := 1e-3 * rng.normal(size=(4, 200))) @ W.T @ P) for _ in range(200)], axis=0)
    np.testing.assert_allclose(z0, e, rtol=0.03)
    for kw, msg in [
        (dict(eps=0.0), "eps: must lie in"),
        (dict(eps=1.0), "eps: must lie in"),
        (dict(eps=1e-3, z0=np.ones(2)), "only one of"),
        (dict(init_std=0.1), "width: required"),
        (dict(init_std=0.1, width=100), "init_std"),
        (dict(eps=1e-3, c=np.array([1.0, -1.0])), "c: every entry must be positive"),
        (dict(z0=np.array([0.5, 2.0])), "z0: max entry"),
    ]:
        with pytest.raises(LvflowError, match=msg):
            _initial_scale(2, **kw)


def test_system_file_forms(tmp_path, capsys):
    """`lvflow predict --system` reads `zeta`/`V` (`C_kk = ζ²/(8V)`), a header-less table `[r | C]`
    and refuses a `C` that is not PSD, naming the flag."""

    def directions(path):
        assert main(["predict", "--system", str(path), "--eps", "1e-8", "--json", "--quiet"]) == 0
        return json.loads(capsys.readouterr().out)["directions"]

    np.savez(tmp_path / "zv.npz", zeta=np.array([1.0, 0.5]), V=np.array([0.25, 0.125]))
    rows = directions(tmp_path / "zv.npz")
    np.testing.assert_allclose([d["C_kk"] for d in rows], [1 / 2, 0.25 / 1.0], rtol=1e-15)  # ζ²/(8V)
    np.testing.assert_allclose([d["V"] for d in rows], [0.25, 0.125], rtol=1e-15)
    r, C = np.array([1.0, 0.5]), np.array([[2.0, 0.5], [0.5, 1.0]])
    np.save(tmp_path / "table.npy", np.column_stack([r, C]))
    rows = sorted(directions(tmp_path / "table.npy"), key=lambda d: d["mode"])
    np.testing.assert_allclose([d["r"] for d in rows], r)
    np.testing.assert_allclose([d["C_kk"] for d in rows], [2, 1])
    # the coupling is read too: the drops add up to the minimum loss's depth r·C⁻¹r/8 (not Σ r²/(8 C_kk))
    assert sum(d["drop"] for d in rows) == pytest.approx(r @ np.linalg.solve(C, r) / 8, rel=1e-6)
    np.save(tmp_path / "bad.npy", np.column_stack([np.ones(2), [[1.0, 2.0], [2.0, 1.0]]]))
    assert main(["predict", "--system", str(tmp_path / "bad.npy"), "--eps", "1e-3"]) == 2
    assert "--system: C: not positive" in capsys.readouterr().err


def test_matrix_flow_fallback():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(5, 2)), rng.normal(size=5)
    nqf = lvflow.nqf_from_data("mlp", {"x": x, "y": y})
    with pytest.raises(lvflow.NotCommutingError):
        predict(nqf, eps=1e-3, force_lv=True)
    p = predict(nqf, eps=1e-3, num_points=N)
    assert p.method == "matrix_flow" and p.order.shape == (0,) and "do not commute" in p.notes[0]
    # At t = 0, M = ε I: f_μ = ε Tr A_μ = 0 for the MLP's off-diagonal A, so L = mean(y²).
    assert float(p.loss[0]) == pytest.approx(np.mean(y**2), rel=1e-9)
    assert np.all(np.diff(np.asarray(p.loss)) <= 1e-12)  # gradient flow never increases the loss


def test_low_rank_system_predicts_as_its_dense_twin():
    # predict takes every gLV representation: a LowRankLotkaVolterra gives the same switch-on
    # times, ε → 0 schedule, plateau losses and loss curve as the LotkaVolterra with the dense
    # C = Diag(d) + UUᵀ; its (Woodbury) equilibrium solves C z* = r, checked here in numpy.
    rng = np.random.default_rng(3)
    K, q = 6, 2
    r = np.sort(rng.uniform(0.3, 1.0, K))[::-1]
    d = rng.uniform(0.8, 1.2, K)
    U = 0.25 * rng.standard_normal((K, q))
    low = lvflow.LowRankLotkaVolterra(r, d, U)
    dense = LotkaVolterra(r, np.diag(d) + U @ U.T)
    z_low = np.asarray(low.equilibrium())
    np.testing.assert_allclose((np.diag(d) + U @ U.T) @ z_low, r, rtol=1e-12)
    a = predict(low, eps=1e-6)
    b = predict(dense, eps=1e-6)
    for name in ("t_star", "tau_star", "plateau_loss", "excess_loss", "C_diag", "V", "z_inf"):
        np.testing.assert_allclose(
            np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), rtol=1e-7, atol=1e-14, err_msg=name
        )
    assert a.notes == b.notes


# ---- issue 16: subnormal initial scales and many modes -----------------------------------------


def test_predict_with_subnormal_eps_and_huge_C():
    # C = 1e300·I, ε = 1e-310: Thm 6 exactly (t* = 23.03, 44.67), not "never switches on".
    lv = LotkaVolterra(np.array([1.0, 0.5]), 1e300 * np.eye(2))
    p = predict(lv, eps=1e-310)
    r = np.array([1.0, 0.5])
    exact = (-math.log(1e-310) - np.log(1e300 / (r - 1e300 * 1e-310))) / r  # Eq. 158, ρ = ½, in logs
    np.testing.assert_allclose(p.t_star, exact, rtol=1e-12)
    np.testing.assert_allclose(p.t_star, [23.0258509, 44.6654075], rtol=1e-8)
    # the ODE path of the same flow (a coupled C forces it): the same times to its tolerance
    C = 1e300 * np.array([[1.0, 1e-9], [1e-9, 1.0]])
    sol = lvflow.solve_lv(LotkaVolterra(np.array([1.0, 0.5]), C), np.full(2, 1e-310), 100.0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sol.switch_on_times, [23.0258509, 44.6654075], rtol=1e-6)


def test_power_law_and_zeta_V_systems_are_diagonal(tmp_path, capsys):
    lv = lvflow.power_law_lv(alpha1=2.0, alpha2=0.8, modes=5)
    assert isinstance(lv, lvflow.LowRankLotkaVolterra) and lv.is_diagonal and lv.U.shape == (5, 0)
    k = np.arange(1, 6.0)
    np.testing.assert_allclose(lv.r, k**-0.8, rtol=1e-14)
    np.testing.assert_allclose(lv.V, k**-2.0, rtol=1e-13)
    # the same spectrum as a system file (ζ, V, y2): lvflow predict reads the same diagonal, and y2
    np.savez(tmp_path / "zv.npz", zeta=k**-0.8, V=k**-2.0, y2=np.array(3.0))
    assert main(["predict", "--system", str(tmp_path / "zv.npz"), "--eps", "1e-6", "--json", "--quiet"]) == 0
    d = json.loads(capsys.readouterr().out)
    rows = sorted(d["directions"], key=lambda row: row["mode"])
    np.testing.assert_allclose([row["C_kk"] for row in rows], lv.C_diagonal, rtol=1e-13)
    loss, excess = np.array(d["curve"]["loss"]), np.array(d["curve"]["excess_loss"])
    np.testing.assert_allclose(loss - excess, 3.0 - np.sum(k**-2.0), rtol=1e-12)  # the final loss y2 − Σ V_k


@pytest.mark.bad_input
def test_empty_system_is_named():
    with pytest.raises(LvflowError, match="no modes"):
        predict(LotkaVolterra(np.zeros(0), np.zeros((0, 0))), eps=1e-3)


# --- What the table says (issue 16): each against an independent computation -----------------------


def radau_ln_z(r, C, z0, T):
    """Independent reference: scipy Radau on u̇ = r − C eᵘ (u = ln z), dense output."""
    with np.errstate(over="ignore"):
        return solve_ivp(
            lambda t, u: r - C @ np.exp(u),
            (0, T),
            np.log(z0),
            method="Radau",
            jac=lambda t, u: -C * np.exp(u)[None, :],
            rtol=1e-11,
            atol=1e-12,
            dense_output=True,
        )


def first_crossing(sol, k, level, T, n=400_001):
    tt = np.linspace(0, T, n)
    z = np.exp(sol.sol(tt)[k])
    i = int(np.argmax(z >= level))
    return tt[i] if z[i] >= level else math.inf


def restricted_excess(r, C, modes):
    """L(z*_S) − L(z∞) over z ≥ 0 restricted to `modes`, by scipy NNLS on a Cholesky factor of C
    (nonsingular here): L = |B z − b|²/8 + const with BᵀB = C, Bᵀb = r."""
    from scipy.optimize import nnls

    B = np.linalg.cholesky(C).T
    b = np.linalg.solve(B.T, r)

    def L(S):
        z = np.zeros(r.size)
        if len(S):
            z[S] = nnls(B[:, S], b)[0]
        return np.sum((B @ z - b) ** 2) / 8

    return L(list(modes)) - L(list(range(r.size)))


def test_decaying_modes_are_not_switch_ons():
    # A signed-diagonal-like NQF: features F and −F (C singular); the modes with r_k < 0 only decay.
    F = np.array([[1.0, 0.3], [0.2, 1.0], [0.5, -0.4]])
    y = np.array([1.0, 0.5, -0.3])
    lam = np.concatenate([F, -F], axis=1)
    m = 3
    r, C = 8 / m * lam.T @ y, 8 / m * lam.T @ lam
    eps, T = 1e-4, 150.0
    p = predict(LotkaVolterra(r, C, y2=float(np.mean(y**2))), eps=eps, t1=T, num_points=N)
    sol = radau_ln_z(r, C, np.full(4, eps), T)
    z_T = np.exp(sol.y[:, -1])
    decays = z_T <= eps  # never grows
    assert decays.any() and not decays.all()
    t, order = np.asarray(p.t_star), np.asarray(p.order)
    for i, k in enumerate(order):
        if decays[k]:
            assert t[i] == math.inf
        else:
            assert abs(t[i] - first_crossing(sol, k, 0.5 * z_T[k], T)) < 1e-3
    assert np.all(np.isfinite(t[: int((~decays).sum())]))  # switch-ons first, decaying modes last
    assert any("end at or below their start" in n for n in p.notes)


def test_mode_switched_off_later_keeps_its_switch_on():
    # The README's ε → 0 figure: mode 3 ignites first, modes 1 and 2 later switch it off.
    G = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.3]])
    G[2] /= np.linalg.norm(G[2])
    yt = np.array([1.0, 0.8, -0.2])
    r, C = G @ yt, G @ G.T
    eps, T = 1e-3, 60.0
    p = predict(LotkaVolterra(r, C, y2=float(yt @ yt) / 8), eps=eps, num_points=N)
    assert int(p.order[0]) == 2 and np.isfinite(p.t_star).all()
    sol = radau_ln_z(r, C, np.full(3, eps), 2000.0)
    assert np.exp(sol.y[2, -1]) < 1e-3 * np.exp(sol.sol(10.0)[2])  # switched off in the end
    # Its switch-on: half the plateau it ignites into (mode 3 alone: z_3 = r_3/C_33).
    assert float(p.t_star[0]) == pytest.approx(first_crossing(sol, 2, 0.5 * r[2] / C[2, 2], T), abs=1e-3)
    assert any("switch them off" in n for n in p.notes)
    # V_k (alone) overstate the drops of a coupled C; the drop column adds up to the total.
    total = restricted_excess(r, C, [])
    assert float(np.sum(p.V)) > total * 1.5
    assert float(np.sum(p.drop)) == pytest.approx(total, rel=1e-12)
    assert float(p.plateau_loss[0]) == pytest.approx(total, rel=1e-12)


@pytest.mark.parametrize("coupled", [False, True])
def test_plateau_loss_follows_this_eps_order(coupled):
    r = np.array([1.0, 0.9, 0.5])
    C = np.eye(3) + (0.2 * np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]]) if coupled else 0)
    c = np.array([1e-3, 1.0, 1.0])  # mode 1 starts lower: mode 2 switches on first at this ε
    p = predict(LotkaVolterra(r, C), eps=1e-4, c=c, num_points=N)
    order = np.asarray(p.order)
    assert order.tolist()[:2] == [1, 0]  # but τ* says mode 1 first
    assert float(p.tau_star[1]) < float(p.tau_star[0])
    assert any("another order" in n for n in p.notes)
    pl = np.asarray(p.plateau_loss)
    assert np.all(np.diff(pl) <= 0)
    for i in range(3):  # the restricted equilibrium on the rows above, by scipy NNLS
        assert pl[i] == pytest.approx(restricted_excess(r, C, order[:i]), rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(np.asarray(p.drop), -np.diff(np.append(pl, 0.0)), rtol=1e-12, atol=1e-15)
    # The ε → 0 staircase is the schedule's own, in τ order: mode 1 first.
    s = lvflow.plateau_schedule(LotkaVolterra(r, C), 1e-4)
    np.testing.assert_array_equal(p.limit_tau, s.tau)
    assert float(p.limit_excess[1]) == pytest.approx(restricted_excess(r, C, [0]), rel=1e-12)
    # by_mode: the rows back in the input's order
    np.testing.assert_array_equal(np.asarray(p.by_mode("t_star"))[order], np.asarray(p.t_star))


def test_small_rates_and_huge_drops_keep_their_digits():
    # A drop of 1.25e15 next to one of 0.125: the plateau between them is 0.125, not 0.
    r = np.array([1e8, 1.0])
    p = predict(LotkaVolterra(r, np.eye(2)), eps=1e-4, num_points=N)
    assert float(p.plateau_loss[1]) == 0.125 and float(p.plateau_loss[0]) == 1.25e15 + 0.125
    s = lvflow.plateau_schedule(LotkaVolterra(r, np.eye(2)), 1e-4)
    np.testing.assert_array_equal(s.excess, [1.25e15 + 0.125, 0.125, 0.0])


def test_unstable_learning_rate_warns():
    r = np.array([1.0, 0.5])
    C = np.array([[1.0, 0.3], [0.3, 1.0]])
    lv = LotkaVolterra(r, C)
    z = np.linalg.solve(C, r)

    # Independent: plain GD on w (z = w², L = y2 − rᵀz/4 + zᵀCz/8) from near the minimum.
    def gd(lr, n=400):
        w = np.sqrt(z) * 1.01
        for _ in range(n):
            zz = w**2
            w = w - lr * w * (C @ zz - r) / 2
            if not np.all(np.isfinite(w)) or np.max(np.abs(w)) > 1e6:
                return False
        return np.allclose(w**2, z, rtol=1e-6)

    lam = np.linalg.eigvalsh(np.sqrt(z)[:, None] * C * np.sqrt(z)[None, :])[-1]
    assert gd(1.9 / lam) and not gd(2.1 / lam)
    with pytest.warns(UserWarning, match="eta·lambda_max"):
        p = predict(lv, eps=1e-4, learning_rate=2.1 / lam, num_points=N)
    assert any("eta·lambda_max" in n for n in p.notes)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = predict(lv, eps=1e-4, learning_rate=1.9 / lam, num_points=N)
    assert not any("lambda_max" in n for n in p.notes)


def test_long_horizon_still_samples_the_switch_ons():
    r = np.array([0.25, 1.0, 0.5])
    Ckk, c = np.array([2.0, 1.0, 0.5]), np.ones(3)
    p = predict(LotkaVolterra(r, np.diag(Ckk)), eps=1e-4, t1=1e7, num_points=N)
    t = t_star_158(r, Ckk, c, 1e-4, 0.5)
    ts = np.asarray(p.ts)
    for tk in t:  # every switch-on has samples through its rise
        assert np.count_nonzero((ts > tk - 2 / r.min()) & (ts < tk + 2 / r.min())) >= 20
    z = z_thm6(ts, r, Ckk, 1e-4 * c)
    V = r**2 / (8 * Ckk)
    np.testing.assert_allclose(p.excess_loss, np.sum(V * (1 - z / (r / Ckk)) ** 2, axis=1), rtol=1e-6, atol=1e-12)


@pytest.mark.bad_input
def test_y2_must_bound_the_loss_below():
    r = np.array([1.0, 0.5])
    with pytest.raises(LvflowError, match="y2: must be ≥ 0"):
        predict(LotkaVolterra(r, np.eye(2), y2=-1.0), eps=1e-4)
    with pytest.raises(LvflowError, match="y2: .* below"):  # rᵀz*/8 = 0.15625
        predict(LotkaVolterra(r, np.eye(2), y2=0.1), eps=1e-4)
    p = predict(LotkaVolterra(r, np.eye(2), y2=0.15625), eps=1e-4, num_points=N)  # interpolating: ends at 0
    np.testing.assert_allclose(p.loss, p.excess_loss, rtol=0, atol=1e-15)  # L∞ = 0
    assert float(p.limit_excess[-1]) == 0.0
