"""The figures' quick run (`lvflow figures --quick`): files written, and the JSON summaries agree
with the closed forms they illustrate."""

import json
import math

import numpy as np
import pytest
from _cli import main

import lvflow
import lvflow.figures
from lvflow._figures import fig3, fig5

NAMES = ("fig3", "fig4", "fig5", "limit")


@pytest.fixture(scope="session")  # once per worker, even if xdist interleaves another module's tests
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    rc = main(["figures", "--quick", "--out", str(out), "--only", ",".join(NAMES)])
    summaries = {n: json.loads((out / f"{n}.json").read_text()) for n in NAMES if (out / f"{n}.json").exists()}
    return out, rc, summaries


@pytest.mark.slow
def test_quick_run_writes_every_file(quick):
    out, rc, summaries = quick
    assert rc == 0
    for n in NAMES:
        for ext in ("png", "pdf", "json"):
            assert (out / f"{n}.{ext}").stat().st_size > 1000, f"{n}.{ext}"
        assert summaries[n]["figure"] == n and summaries[n]["quick"] is True
        for c in summaries[n].get("claims", []):  # every claim: its words, a verdict, a criterion, numbers
            assert set(c) == {"claim", "holds", "verdict", "criterion", "measured"}
            assert c["holds"] in (True, False, None)  # None: not tested
            head = {True: "holds", False: "fails", None: "not tested"}[c["holds"]]
            assert c["verdict"].startswith(head), c
    # the run writes REPRODUCTION.md from the summaries it made (one section per figure)
    text = (out / "REPRODUCTION.md").read_text()
    assert all(f"## {n}:" in text for n in NAMES)


@pytest.mark.slow
def test_fig3_plateaus_at_switch_on_times_and_power_law(quick):
    s = quick[2]["fig3"]
    left, right = s["left"], s["right"]
    assert left["C_offdiag_max"] < 1e-12 and left["r_from_data_max_err"] < 1e-12  # C diagonal, r as set
    # GD's eigenvalues of WWᵀ and its loss drops at t*_k = ln(r_k/(C_kk ε))/r_k (Eq. 158)
    assert max(left["rel_err_eigenvalues"]) < 0.02
    assert max(left["rel_err_loss"]) < 0.02
    # Thm 9: E ∝ t^{−(α₁−1)/α₂} = t^{−1.25}; with z_k0 ∝ k^{−(α₁−α₂)} Eq. 292 has no finite-ε shift
    assert right["exponent_predicted"] == pytest.approx(1.25)
    assert right["alpha1_from_spectrum"] == pytest.approx(2.0) and right["alpha2_from_spectrum"] == pytest.approx(0.8)
    assert right["rel_err_fitted_vs_predicted"] < 0.10
    assert right["k_eff_eq292"] == pytest.approx(1.25, rel=1e-9)
    assert right["t_star_first"] < right["fit_window"][0] and right["fit_window"][1] < right["t_star_last"]
    # the paper's statements about Fig 3: all hold but App. C's "the steepening is a finite-initialisation
    # effect": more modes take the slope on the same window to 1.25 (1.296 → 1.256 from K = 10³ to 10⁴),
    # a smaller ε does not move it (within 0.002 from ε = 1e-4 to 1e-8)
    assert [c["holds"] for c in s["claims"]] == [True, True, True, True, False, False]
    steep = right["steepening"]
    by_K = [steep["slope_by_K"][str(K)] for K in steep["K"]]
    assert by_K[0] == pytest.approx(1.296, abs=2e-3) and by_K[-1] == pytest.approx(1.256, abs=2e-3)
    for K in (steep["K"][0], steep["K"][-1]):
        by_eps = [steep["slope_by_eps"][f"{e:g}"][str(K)] for e in steep["eps"]]
        assert max(by_eps) - min(by_eps) < 2e-3
    assert steep["slope_flat_init"][str(steep["K"][-1])] > 1.4  # z_k0 = ε for every mode: the finite-ε steepening
    # GD on App. C's construction tracks the closed form before the cutoff (quick: lr 0.02)
    assert right["gd_max_rel_dev_from_closed_form_before_cutoff"] < 0.05
    assert right["exponent_fitted_gd"] == pytest.approx(right["exponent_fitted_closed_form_on_gd_times"], abs=0.01)


@pytest.mark.slow
def test_fig3_eq295_local_exponents(quick):
    # App. C's "κ_eff grows with t" (Eq. 295): the local exponents the summary reports against a least-squares
    # fit of ln E on ln t in each part, with E of Eq. 163 written out from Thm 6 in numpy here
    right = quick[2]["fig3"]["right"]
    G, window = right["eq295"], right["fit_window"]
    k = np.arange(1, G["K"] + 1.0)
    r, V = k**-0.8, k**-2.0
    C = r**2 / (8 * V)
    t = np.geomspace(window[0], window[1], 240)
    for name, beta in (("figure_init", 1.2), ("z0_eps", 0.0)):
        z0 = right["eps"] * k**-beta
        E = np.zeros_like(t)
        for i in range(0, G["K"], 2000):
            s_ = slice(i, i + 2000)
            z = r[s_] * z0[s_] / (C[s_] * z0[s_] + (r[s_] - C[s_] * z0[s_]) * np.exp(-np.outer(t, r[s_])))
            E += np.sum(V[s_] * (1 - z * C[s_] / r[s_]) ** 2, axis=1)
        edges = np.geomspace(window[0], window[1], 4)
        ours = [-np.polyfit(np.log(t[(t >= a) & (t <= b)]), np.log(E[(t >= a) & (t <= b)]), 1)[0] for a, b in
                zip(edges[:-1], edges[1:])]  # fmt: skip
        assert np.allclose(G[name]["3"], ours, atol=2e-3), (name, G[name]["3"], ours)
    # with the figure's z_k0 = ε k^−1.2 every mode's ln(ζ_k/(C_k z_k0)) = ln(8/ε): no drift after the first part;
    # with z_k0 = ε the exponent grows part to part, as Eq. 295 says
    assert abs(G["figure_init"]["3"][1] - 1.25) < 0.005 and G["figure_init"]["3"][0] > G["figure_init"]["3"][1]
    assert np.all(np.diff(G["z0_eps"]["3"]) > 0) and np.all(np.diff(G["z0_eps"]["4"]) > 0)
    claim = quick[2]["fig3"]["claims"][5]
    assert claim["holds"] is False and claim["measured"]["holds_with_z0_eps"] is True


def test_fig3_right_gd_is_plain_gradient_descent_on_app_c_construction():
    # App. C's A, y for K modes: (8/m) Σ_μ y_μ A_μ,kk = r_k and (8/m) Σ_μ A_μ,kk² = C_kk, loss 0 at z = r/C;
    # GD on W = diag(w) against a plain numpy loop on the same loss, and Eq. 163 against Thm 6 written out
    K, eps, lr, steps = 6, 1e-3, 0.05, 400
    k = np.arange(1, K + 1.0)
    r, V = k**-0.8, k**-2.0
    C = r**2 / (8 * V)
    A = np.sqrt(C * K / 8)
    y = K * r / (8 * A)
    assert np.allclose(8 / K * y * A, r) and np.allclose(8 / K * A**2, C)
    t, loss = fig3.gd_right(K, eps, lr=lr, t_end=lr * steps, n_records=30)
    w = np.sqrt(eps * k**-1.2)
    by_step = {}
    for n in range(1, steps + 1):
        w = w - lr * (4 / K) * A * w * (A * w**2 - y)  # ∇ of mean((A w² − y)²)
        by_step[n] = np.mean((A * w**2 - y) ** 2)
    assert np.allclose(loss, [by_step[int(round(s / lr))] for s in t], rtol=1e-10)
    z0 = eps * k**-1.2
    z = r * z0 / (C * z0 + (r - C * z0) * np.exp(-np.outer(t, r)))  # Thm 6
    assert np.allclose(fig3.excess_loss(K, eps, t, chunk=4), np.sum(V * (1 - z * C / r) ** 2, axis=1), rtol=1e-12)


@pytest.mark.slow
def test_fig4_sample_plateaus(quick):
    s = quick[2]["fig4"]
    assert max(s["rel_err_gd_vs_eq158"]) < 0.02
    assert max(s["rel_err_xi_ode_vs_eq158"]) < 0.02
    # the drops come in the order of ζ_μ = (8/m) λ_max y_μ, at ≈ ln(1/ε)/ζ_μ to leading order
    assert s["zeta"] == pytest.approx([8 / 4 * 2 * y for y in s["y"]])
    assert np.all(np.diff(s["t_measured_gd"]) > 0)
    tau = np.array(s["t_measured_gd"]) * np.array(s["zeta"]) / math.log(1 / s["eps"])
    assert np.all(np.abs(tau - 1) < 0.25)
    # the drops come 5–20 % earlier than the paper's dashed lines ln(1/ε)/ζ_μ (Eq. 47) at this ε (the
    # committed full run: 5.1, 10.2, 15.3, 20.4 %), the finite-ε gap ln(2/y_μ)/ln(1/ε) of Eq. 158, which
    # vanishes as ε → 0: the summary says the third claim does not hold, while Eq. 158's times are within 2 %
    holds = [c["holds"] for c in s["claims"]]
    assert holds == [True, True, False] and max(s["claims"][2]["measured"]["rel_err_leading_order"]) > 0.1
    # the verdict says the failure is set by our ε and y, and where it would hold: at ε* = (y_min/λ_max)^10
    # = (1/16)^10 the smallest sample's gap ln(2/y)/ln(1/ε*) is exactly the 10 % bound
    eps_star = (1 / 16) ** 10
    assert math.log(16) / math.log(1 / eps_star) == pytest.approx(0.10)
    v = s["claims"][2]["verdict"]
    assert v.startswith("fails at our ε = 1e-06") and f"ε ≲ {eps_star:.1g}" in v
    assert f"bound ≥ {100 * max(s['claims'][2]['measured']['rel_err_leading_order']):.1f} %" in v


def _fig5_t_star(k, theta, *, P=64, beta=1.5, eps=1e-4):
    """Eq. 158 (ρ = ½) for the Fourier MLP's NQF, by hand: mode k grows at ζ_k = 4 s_k b_k/√P
    from z_k0 = ε² to z_k(∞) = 2√P b_k/s_k (s_k = k^−θ, b_k = k^−β)."""
    s_k, b_k = k**-theta, k**-beta
    zeta, z_inf = 4 * s_k * b_k / math.sqrt(P), 2 * math.sqrt(P) * b_k / s_k
    return np.log(z_inf / eps**2) / zeta


@pytest.mark.slow
def test_fig5_fourier_exponents(quick):
    s = quick[2]["fig5"]
    for key, th in s["max_abs_dev_fast_loss_vs_model_outputs"].items():
        assert th < 1e-12, key  # the fast losses are the architectures' own outputs
    claims = {c["claim"]: c for c in s["claims"]}
    for theta, r in s["theta"].items():
        kappa = (2 * 1.5 - 1) / (float(theta) + 1.5)  # Eq. 298
        assert r["exponent_predicted"] == pytest.approx(kappa)
        assert r["rel_err_nqf_vs_predicted"] < 0.10, theta
        # finite ε steepens the law (Eq. 292, α₁ − α₂ = β − θ > 0): the NQF sides with k_eff
        # where that shift (3–6 %) stands above the seed noise
        if float(theta) < 1:
            assert r["rel_err_nqf_vs_k_eff"] < r["rel_err_nqf_vs_predicted"], theta
    # Fig 5 left: θ = 1 descends as the predicted power law (within 10 %), and the figure says so
    assert s["theta"]["1"]["rel_err_fitted_vs_predicted"] < 0.10
    assert claims["θ = 1: the Fourier MLP descends as the predicted power law t^−(2β−1)/(θ+β) (Fig 5 left)"]["holds"]
    # ... but at θ = 0 the network falls faster than its NQF and than Eq. 292 allows (its first modes
    # saturate tanh): the paper's "finite-initialisation effect" does not explain it, and the figure says so
    r0 = s["theta"]["0"]
    assert r0["exponent_fitted_network"] > 1.1 * r0["exponent_predicted"]
    assert r0["rel_err_fitted_vs_k_eff"] > 0.10
    key = [c for c in claims if c.startswith("θ = 0: the steepening")][0]
    assert not claims[key]["holds"]
    # App. C's stated setup (lr 0.02 × 30000 steps, t = 600) switches on only the modes whose Eq. 158
    # switch-on time is below 600 (counted here by hand): too few for a power law
    for theta, st in s["stated_setup"].items():
        k = np.arange(1, 65, dtype=float)
        n_pred = int(np.sum(_fig5_t_star(k, float(theta)) <= st["t_end"]))
        assert st["t_end"] == pytest.approx(600.0)
        assert st["modes_predicted_eq158"] == n_pred
        assert abs(st["modes_on_nqf"] - n_pred) <= 1, theta
        assert st["modes_on_network"] < 8 and st["auto_power_law_fit"]["exponent"] is None
    assert [n for n in (s["stated_setup"][t]["modes_predicted_eq158"] for t in ("0", "0.5", "1"))] == [6, 3, 2]
    assert not claims["App. C's setup (full-batch GD, lr 0.02, 30000 steps, ε = 1e-4) produces the power law"]["holds"]
    # the figure's larger learning rate is the same gradient flow: against a 10× smaller one the NQF's
    # loss moves by < 5 % in the fit window and its exponent by < 0.02
    for theta, d in s["lr_vs_flow"].items():
        assert d["max_rel_dev_nqf_loss_in_window"] < 0.05 and d["exponent_shift"] < 0.02, theta
    # the plain MLP on raw x runs as long as the Fourier MLP's longest run; it leaves its plateau there
    # (at ε = 1e-4 only after t ≈ 5e3, far past App. C's t = 600) and shows no power-law window
    t_fourier = max(r["steps"] for r in s["theta"].values()) * s["lr"]
    for m in s["plain_mlp"].values():
        assert m["t_end"] == pytest.approx(t_fourier, rel=0.01)
        assert m["fit"]["exponent"] is None
    assert s["plain_mlp"]["eps=0.0001"]["t_leaves_plateau"] > 600
    c = claims["a standard tanh MLP trained on the raw input x does not exhibit a power law"]
    assert c["holds"] and c["measured"]["tested_per_eps"] == {"0.0001": True, "0.1": True}


@pytest.mark.slow
def test_fig5_eq295_and_bounded_verdicts(quick):
    s = quick[2]["fig5"]
    claims = {c["claim"]: c for c in s["claims"]}
    for theta, r in s["theta"].items():
        # 3 equal log-time parts of the fit window; their exponents average to the whole window's
        a, b = r["fit_window"]
        assert r["local_exponent_t"] == pytest.approx([a * (b / a) ** ((i + 0.5) / 3) for i in range(3)])
        # Eq. 295 by hand, ε → z_k0 = ε² = 1e-8, α₁ = 2β = 3, α₂ = θ + β, its constant 0
        a1, a2, L = 3.0, float(theta) + 1.5, math.log(1e8)
        al = (a1 - a2) / a2
        t = np.array(r["local_exponent_t"])
        eq295 = (a1 - 1) / a2 * (1 + al / (L + al * math.log(L) - al * np.log(t)))
        assert r["local_exponent_eq295_const0"] == pytest.approx(eq295, rel=1e-12)
        # every exponent verdict says where it holds: "holds for a bound ≥ x %" with x the measured deviation
        c = claims[f"θ = {theta}: the network's power-law exponent matches the theory (Fig 5 right)"]
        assert f"holds for a bound ≥ {100 * r['rel_err_fitted_vs_predicted']:.1f}%" in c["verdict"]
    # Eq. 295 is tested only where its growth over the window exceeds the part-to-part spread of the NQF's own
    # exponents; at 64 modes (5–9 in the window) it never does: Eq. 295 moves the exponent by < 0.01 across it
    c = claims["the effective exponent κ_eff grows with t at finite ε (App. C, Eq. 295)"]
    for theta, r in s["theta"].items():
        growth = r["local_exponent_eq295_const0"][-1] - r["local_exponent_eq295_const0"][0]
        spread = np.max(np.abs(np.diff(r["local_exponent_nqf"])))
        assert c["measured"]["eq295_growth"][theta] == pytest.approx(growth)
        assert 0 < growth < 0.01 < spread, theta
    assert c["holds"] is None and c["verdict"].startswith("not tested for θ = 0, 0.5, 1")


def test_fig5_plain_mlp_on_its_plateau_is_not_tested():
    # 2000 steps at App. C's lr 0.02 from ε = 1e-4: its loss has not moved (by hand: ≤ 1e-6 decades)
    flat = fig5._plain_mlp(1e-4, t_end=40.0)
    assert flat["t_leaves_plateau"] is None and math.log10(flat["E"][0] / flat["E"].min()) < 1e-6
    c = fig5.plain_mlp_claim({1e-4: flat})
    assert c["holds"] is None and c["verdict"].startswith("not tested (never leaves its plateau by t = 40")
    # from ε = 0.1 it leaves the plateau at once (loss 0.05 decades down, found here by hand), and the
    # claim is then tested on that run alone
    moving = fig5._plain_mlp(0.1, t_end=200.0, lr=0.1)
    t_left = moving["t"][np.argmax(moving["E"] <= moving["E"][0] * 10**-0.05)]
    assert moving["t_leaves_plateau"] == pytest.approx(t_left) and t_left < 200
    c = fig5.plain_mlp_claim({1e-4: flat, 0.1: moving})
    assert c["holds"] is True and c["measured"]["tested_per_eps"] == {"0.0001": None, "0.1": True}
    assert "ε = 0.0001: not tested (never leaves its plateau by t = 40" in c["verdict"]


def _limit_events(r, C):
    """The ε → 0 events of this 3-mode system by hand: mode 3 ignites at 1/r_3 and saturates at
    r_3/C_33; mode 1 then grows at r_1 − C_13 z_3; mode 2 next, against z* on {1, 3}."""
    t1 = 1 / r[2]
    z = np.array([0.0, 0.0, r[2] / C[2, 2]])
    s = -1 + r * t1
    sl = r - C @ z
    t2 = t1 + -s[0] / sl[0]
    s = s + sl * (t2 - t1)
    idx = [0, 2]
    z = np.zeros(3)
    z[idx] = np.linalg.solve(C[np.ix_(idx, idx)], r[idx])
    sl = r - C @ z
    t3 = t2 + -s[1] / sl[1]
    return [t1, t2, t3]


@pytest.mark.slow
def test_limit_converges_to_schedule(quick):
    s = quick[2]["limit"]
    r, C = np.array(s["r"]), np.array(s["C"])
    assert s["tau_predicted_limit"] == pytest.approx(_limit_events(r, C), rel=1e-9)
    assert s["switch_offs"] == [2]  # mode 3 switches off when mode 2 ignites
    # z = (1, 0.8, 0) on the last plateau fits ỹ on e₁, e₂ exactly: loss |ỹ₃|²/8 = 0.005
    assert s["limit_plateau_loss"][-1] == pytest.approx(0.2**2 / 8, rel=1e-9)
    err = s["max_abs_err_limit"]
    assert err["1e-32"] < 0.15 and err["1e-32"] < 0.5 * err["1e-08"] < 0.5 * err["0.01"]
    # the figure's own claims: convergence like 1/ln(1/ε) (the exponent refitted here with numpy), the
    # switch-off, and the corrected schedule, better for modes 3 and 1 and worse for mode 2 at every ε
    conv, switch, corr = s["claims"]
    small = [e for e in s["eps"] if e <= 1e-8]
    p = -np.polyfit(np.log([math.log(1 / e) for e in small]), np.log([err[f"{e:g}"] for e in small]), 1)[0]
    assert conv["measured"]["convergence_exponent"] == pytest.approx(p, rel=1e-9) and conv["holds"] == (
        abs(p - 1) <= 0.2
    )
    assert switch["holds"] and switch["measured"]["tau_switch_off"] == pytest.approx(s["tau_predicted_limit"][2])
    ratios = corr["measured"]["error_ratio_corrected_to_limit"]
    for j, m in enumerate(s["ignition_modes"]):
        want = [
            abs(s["tau_measured"][f"{e:g}"][j] - s["tau_predicted_corrected"][f"{e:g}"][j])
            / abs(s["tau_measured"][f"{e:g}"][j] - s["tau_predicted_limit"][j])
            for e in s["eps"]
        ]
        assert ratios[f"mode {m + 1}"] == pytest.approx(want, rel=1e-12)
    assert max(ratios["mode 3"]) < 1 and max(ratios["mode 1"]) < 1 and min(ratios["mode 2"]) > 1
    assert corr["holds"] is False and "worse at every ε for mode 2" in corr["verdict"]


def test_figure_selection_errors(tmp_path, capsys):
    assert main(["figures", "--only", "fig3,nope", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("lvflow figures: error: --only: unknown figure(s) nope")
    (tmp_path / "afile").write_text("")  # a file where the output folder must be: refused before any figure
    assert main(["figures", "--only", "fig3", "--out", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lvflow figures: error: --out:") and "afile" in err[0]
    with pytest.raises(lvflow.LvflowError, match="only: unknown figure"):
        lvflow.figures.make_all(tmp_path, only=["fig9"])
    with pytest.raises(AttributeError):
        lvflow.figures.fig99
    assert callable(lvflow.figures.limit) and set(NAMES) <= set(lvflow.figures.FIGURES)
