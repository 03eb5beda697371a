"""The benchmark harness: its baselines against closed forms and plain numpy, and a smoke run.

Timings are not asserted (the machine is shared); what is asserted is that every baseline computes
the right thing, so the speed ratios compare equal work.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import gd, problems
from benchmarks.__main__ import BENCHMARKS, main
from benchmarks.scipy_glv import _illinois, solve_scipy


def test_problems_closed_form_and_equilibrium():
    p = problems.fig3_right(50)
    t = problems.switch_on_closed_form(p)
    # Thm 6 evaluated at t* gives ρ z(∞), independently of how t* was solved for.
    c, r, z0 = p.d, p.r, p.z0
    z = r * z0 / (c * z0 + (r - c * z0) * np.exp(-r * t))
    np.testing.assert_allclose(z, p.rho * p.z_inf, rtol=1e-10)
    assert p.t1 > t.max()
    q = problems.coupled(50)
    assert np.linalg.eigvalsh(q.C).min() > 0
    np.testing.assert_allclose(q.C @ q.z_inf, q.r, rtol=1e-10, atol=1e-14)  # Woodbury solve
    assert np.all(q.z_inf > 0)
    np.testing.assert_allclose(q.Cz(q.z0), q.C @ q.z0, rtol=1e-12)


def test_illinois_vectorised_roots():
    roots = np.array([0.3, 1.7, 2.5])
    f = lambda t: t**3 - roots**3  # noqa: E731
    a, b = np.zeros(3), np.full(3, 3.0)
    np.testing.assert_allclose(_illinois(f, a, b, f(a), f(b)), roots, rtol=1e-13)


@pytest.mark.parametrize("method", ["LSODA", "Radau"])
def test_scipy_switch_on_times_match_eq158(method):
    p = problems.fig3_right(20)
    res = solve_scipy(p, method=method, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.switch_on_times, problems.switch_on_closed_form(p), rtol=1e-7)
    np.testing.assert_allclose(np.exp(res.u1), p.z_inf, rtol=1e-8)


def test_scipy_coupled_matches_dense_rhs_independent_solve():
    from scipy.integrate import solve_ivp

    p = problems.coupled(8)
    res = solve_scipy(p, method="LSODA", rtol=1e-10, atol=1e-12)
    C = p.C
    ref = solve_ivp(
        lambda t, z: z * (p.r - C @ z), (0, p.t1), p.z0, method="DOP853", rtol=1e-12, atol=1e-300, dense_output=True
    )
    # z at lvflow-free switch-on times equals ρ z(∞) on an independent solve in z (not ln z)
    zs = np.array([ref.sol(t)[k] for k, t in enumerate(res.switch_on_times)])
    np.testing.assert_allclose(zs, p.rho * p.z_inf, rtol=1e-6)


def test_gd_scan_matches_numpy_gradient_descent():
    p = problems.coupled(6)
    W0 = np.diag(np.sqrt(p.z0)) + 1e-4 * np.random.default_rng(0).standard_normal((6, 6))
    steps, lr = 200, 0.01
    W, _ = gd.gd(jnp.asarray(W0), *gd._args(p), steps=steps, lr=lr)
    # plain numpy GD on L(W) = (1/m) Σ_μ (Tr[WWᵀA_μ] − y_μ)², A_μ = Diag(λ_μ), C = (8/m)ΛᵀΛ, y = Λ z∞
    m = 6 + p.U.shape[1]
    Lam = np.sqrt(m / 8) * np.vstack([np.diag(np.sqrt(p.d)), p.U.T])
    y = Lam @ p.z_inf
    Wn = W0.copy()
    for _ in range(steps):
        res = Lam @ np.sum(Wn**2, axis=1) - y
        H = 4 / m * np.diag(Lam.T @ res)  # H = (4/m) Σ Δ_μ A_μ (Eq. 27), ∇L = HW
        Wn = Wn - lr * H @ Wn
    np.testing.assert_allclose(np.asarray(W), Wn, rtol=1e-10, atol=1e-14)


def test_gd_switch_on_times_within_euler_error_of_eq158():
    p = problems.fig3_right(10)
    _, t_on = gd.gd(jnp.sqrt(jnp.asarray(p.z0))[:, None], *gd._args(p), steps=int(p.t1 / gd.LR))
    exact = problems.switch_on_closed_form(p)
    # GD is the Euler map of the flow in W: per step ln z grows by 2 ln(1 + η r/2) ≈ η r (1 − η r/4),
    # so t* is longer by a relative ≈ η r_k / 4 (≤ 2.5e-3; less near saturation, where the rate drops)
    rel = np.asarray(t_on) / exact - 1
    bound = gd.LR * p.r / 4
    assert np.all(rel > 0.5 * bound) and np.all(rel < bound)


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCHMARKS)
def test_smoke_run_writes_its_rows(name, tmp_path):
    """Each benchmark runs at smoke size and writes its rows (one test per benchmark, so that the
    suite's workers share them out)."""
    out = tmp_path / "bench.json"
    assert main(["--smoke", "--no-cold", "--repeats", "1", "--only", name, "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["rows"] and {r["bench"] for r in rec["rows"]} == {name}
    for r in rec["rows"]:
        assert r["lvflow_s"] > 0
    if name == "glv":
        assert all(r["data"]["LSODA"]["switch_on_max_rel_diff_vs_lvflow"] < 1e-5 for r in rec["rows"] if r["data"])


@pytest.mark.slow
def test_trust_figure_tiny(tmp_path):
    """`python -m benchmarks.horizon --figure` (docs/howto/trust.md's figure) on a tiny size: both
    curves start at L(0) (network and NQF twin from the same small weights), predict's horizon is
    finite, and the PNG is written."""
    import jax

    from benchmarks import horizon

    jax.config.update("jax_enable_x64", True)
    d = horizon.figure_data(steps=30, eval_size=32, runs=1)
    assert d["steps"][0] == 0 and d["steps"][-1] == 30
    np.testing.assert_allclose([d["net"][0], d["nqf"][0]], 1.0, rtol=1e-6)  # f = O(ε²) at ε = 1e-3
    assert d["order"] == 4 and np.all(np.isfinite(d["horizons"])) and np.all(d["horizons"] > 0)
    horizon.draw_figure(d, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
