"""Fig 4: sample-wise plateaus (Thm 5, Thm 10).

`m = 4` samples whose structure matrices are diagonal with disjoint supports (blocks of `K = 3`
entries `λ = (1, 1.5, 2)`), so `A_μ A_ν = 0` for `μ ≠ ν`: each sample is learnt on its own, by
the ξ-ODE of Thm 5, `ξ̇_μ = Σ_k λ_{μ,k} z_k0 e^{−(8/m) λ_{μ,k} ξ_μ} − y_μ`,
`z_k = z_k0 e^{−(8/m) Σ_ν ξ_ν λ_{ν,k}}`. Its loss drops once, at
`t*_μ ≈ ln(1/ε)/ζ_μ`, `ζ_μ = (8/m) λ_{μ,max} y_μ` (Thm 10); with targets `y_μ = 2^{−μ+1}` the
four drops are spread over time. Full-batch GD on `W` (from `W(0) = √ε I`) is compared with the
ξ-ODE, and the measured drops with Eq. 158 (ρ = ½, the leading mode of each sample).

The leading mode of sample μ is a logistic with `ζ_μ`, `C = (8/m) λ_max²` and `z_0 = ε`, so Eq. 158
puts its drop at `[ln(1/ε) − ln(λ_max/y_μ)]/ζ_μ` (up to `O(ε)`): *earlier* than the paper's dashed
`ln(1/ε)/ζ_μ` (Eq. 47) by the fraction `ln(λ_max/y_μ)/ln(1/ε) = ln(2/y_μ)/ln(1/ε)`, a finite-ε
correction that vanishes as ε → 0. At our ε = 1e-6 and `y = (1, ½, ¼, ⅛)` that is 5–20 %, so the
third claim fails its 10 % criterion; it would pass for every sample only at ε ≲ 9e-13.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .._form.nqf import NQF
from .._glv.closed_forms import ignition_time, orthogonal_samples
from . import _style
from ._gd import gd_trajectory

TITLE = "sample-wise plateaus (m = 4 orthogonal samples, ξ-ODE vs GD)"

LAM = np.array([1.0, 1.5, 2.0])
Y = 0.5 ** np.arange(4)
EPS = 1e-6


def _nqf() -> NQF:
    return NQF(np.stack([np.diag(row) for row in _lam()]), Y)


def _lam() -> np.ndarray:
    """`λ_{μ,k}`, shape `(m, mK)`: sample μ's eigenvalues on its own block of modes."""
    m, K = Y.size, LAM.size
    lam = np.zeros((m, m * K))
    for mu in range(m):
        lam[mu, mu * K : (mu + 1) * K] = LAM
    return lam


def make(out: Path, *, quick: bool = False) -> dict:
    nqf = _nqf()
    m, K = Y.size, LAM.size
    zeta = 8.0 / m * LAM.max() * Y  # Thm 10
    Cl = 8.0 / m * LAM.max() ** 2  # the leading mode's self-interaction
    t_lead = math.log(1 / EPS) / zeta
    t_eq158 = np.asarray(ignition_time(zeta, Cl, 1.0, EPS, rho=0.5))  # Eq. 158 for each leading mode
    lr = 0.004 if quick else 0.001  # GD's growth rate per unit time is ζ(1 − lr ζ/4 + …)
    t_end = 1.4 * t_lead[-1]
    t, M = gd_trajectory(
        nqf, math.sqrt(EPS) * np.eye(m * K), lr=lr, steps=int(round(t_end / lr)), every=max(1, int(round(0.02 / lr)))
    )
    z = np.diagonal(M, axis1=1, axis2=2)  # M stays diagonal
    f = np.einsum("mij,tij->tm", np.asarray(nqf.A), M)
    loss_mu = (f - Y) ** 2 / m
    loss_xi = np.asarray(orthogonal_samples(_lam(), Y, np.full(m * K, EPS), t).losses) / m  # Thm 5
    # a sample has dropped when its residual is halved: the leading mode at half its plateau
    t_meas = np.array([_style.crossing_time(t, loss_mu[:, mu], (Y[mu] / 2) ** 2 / m) for mu in range(m)])
    t_meas_xi = np.array([_style.crossing_time(t, loss_xi[:, mu], (Y[mu] / 2) ** 2 / m) for mu in range(m)])
    total, total_xi = loss_mu.sum(1), loss_xi.sum(1)
    tau = t / math.log(1 / EPS)
    step = np.array([np.sum(Y**2 * (ti < 1 / zeta)) / m for ti in tau])  # Thm 10's limit

    cols = _style.mode_colors(m)
    ls = {1.0: ":", 1.5: "--", 2.0: "-"}
    with _style.style():
        fig, axs = _style.subplots(3, width=3.5, height=2.9)
        ax = axs[0]
        for mu in range(m):
            ax.semilogy(
                t,
                loss_mu[:, mu],
                color=cols[mu],
                lw=_style.NETWORK_WIDTH,
                label=f"sample {mu + 1}: $y$ = {Y[mu]:g}, $\\zeta$ = {zeta[mu]:g}",
            )
            ax.semilogy(t, loss_xi[:, mu], **_style.THEORY)
            ax.axvline(t_eq158[mu], color=cols[mu], ls=":", lw=1.0)
        ax.plot([], [], **_style.THEORY, label="ξ-ODE (Thm 5)")
        ax.plot([], [], color="0.4", ls=":", label="$t^*_\\mu$ (Eq. 158)")
        ax.set(
            xlabel="time $t$ = lr × step",
            ylabel="per-sample loss $(f_\\mu - y_\\mu)^2/m$",
            title="each sample's loss drops once",
        )
        ax.set_ylim(1e-9, 3e2)
        ax.legend(loc="upper right", fontsize=6.5)
        _style.panel_label(ax, "a")

        ax = axs[1]
        ax.semilogy(tau, total, color="tab:blue", lw=_style.NETWORK_WIDTH, label="GD")
        ax.semilogy(tau, total_xi, **_style.THEORY, label="ξ-ODE (Thm 5)")
        ax.semilogy(
            tau,
            np.maximum(step, 1e-30),
            color="tab:red",
            lw=1.0,
            alpha=0.8,
            label=r"$\frac{1}{m}\sum_\mu y_\mu^2 \mathbb{1}(\tau < 1/\zeta_\mu)$",
        )
        for mu in range(m):
            ax.axvline(1 / zeta[mu], color=cols[mu], ls=":", lw=1.0)
        ax.set(
            xlabel=r"rescaled time $\tau = t/\ln(1/\varepsilon)$",
            ylabel="training loss",
            title=f"m = {m} plateaus (ε = {EPS:g})",
        )
        ax.set_ylim(1e-4, 1.0)
        ax.legend(loc="upper right")
        _style.panel_label(ax, "b")

        ax = axs[2]
        for mu in range(m):
            for k in range(K):
                ax.semilogy(t, z[:, mu * K + k], color=cols[mu], ls=ls[LAM[k]], lw=1.3)
        for lam in LAM:
            ax.plot([], [], color="0.3", ls=ls[lam], label=f"$\\lambda$ = {lam:g}")
        ax.set(
            xlabel="time $t$ = lr × step",
            ylabel="eigenvalues of $WW^T$",
            title="only each block's top mode switches on",
        )
        ax.set_ylim(EPS / 3, 1.0)
        ax.legend(loc="lower right", title="colour: sample")
        _style.panel_label(ax, "c")
        _style.save(fig, out, "fig4")

    summary = {
        "figure": "fig4",
        "quick": quick,
        "m": m,
        "K": K,
        "lambda": LAM,
        "y": Y,
        "eps": EPS,
        "lr": lr,
        "zeta": zeta,
        "t_star_leading_order": t_lead,
        "t_star_eq158": t_eq158,
        "t_measured_gd": t_meas,
        "t_measured_xi_ode": t_meas_xi,
        "rel_err_gd_vs_eq158": _style.rel_err(t_meas, t_eq158),
        "rel_err_xi_ode_vs_eq158": _style.rel_err(t_meas_xi, t_eq158),
        "rel_err_gd_vs_leading_order": _style.rel_err(t_meas, t_lead),
        "max_abs_dev_total_loss_gd_vs_xi_ode": float(np.max(np.abs(total - total_xi))),
        "choices": {"y_and_eps": "the paper gives neither y nor ε; ours are listed above"},
    }
    lead = _style.rel_err(t_meas, t_lead)
    # Eq. 158 vs Eq. 47 for the leading mode: the drop comes earlier by ln(λ_max/y_μ)/ln(1/ε) (up to O(ε))
    gap = np.log(LAM.max() / Y) / math.log(1 / EPS)
    summary["claims"] = [
        _style.claim(
            "the GD trajectories match the analytical curves of Thm 5 (the ξ-ODE, Eq. 36)",
            summary["max_abs_dev_total_loss_gd_vs_xi_ode"] <= 0.01 * float(np.mean(np.asarray(Y) ** 2)),
            "max over time of |L_GD − L_ξ-ODE| ≤ 1 % of the initial loss (1/m) Σ y_μ²",
            max_abs_dev=summary["max_abs_dev_total_loss_gd_vs_xi_ode"],
        ),
        _style.claim(
            "the total loss passes m sequential plateaus, one drop per sample, in the order of ζ_μ",
            bool(np.all(np.diff(t_meas) > 0)),
            "the per-sample drops come one after another",
            t_measured=t_meas,
        ),
        _style.claim(
            "each drop matches its timescale t*_μ = ln(1/ε)/ζ_μ (Eq. 47, the dashed lines)",
            bool(np.max(lead) <= 0.10),
            "measured drop within 10 % of ln(1/ε)/ζ_μ (Eq. 158's finite-ε time is reported beside). "
            f"Why it fails here: the drops come {100 * np.min(lead):.0f}–{100 * np.max(lead):.0f} % earlier than "
            "Eq. 47; Eq. 158 (ρ = ½) for each sample's leading mode is [ln(1/ε) − ln(λ_max/y_μ)]/ζ_μ, so the "
            "relative gap is ln(λ_max/y_μ)/ln(1/ε) = ln(2/y_μ)/ln(1/ε), set by our choice of y and "
            f"ε = {EPS:g}: a finite-ε correction that vanishes as ε → 0 (below 10 % for every sample only "
            f"at ε ≲ {(Y.min() / LAM.max()) ** 10:.1g}); the measured drops sit within "
            f"{100 * np.max(_style.rel_err(t_meas, t_eq158)):.1f} % of Eq. 158",
            verdict=f"{'holds' if np.max(lead) <= 0.10 else 'fails'} at our ε = {EPS:g}, y = (1, ½, ¼, ⅛) and 10 % "
            f"bound: the drops come {100 * np.min(lead):.1f}–{100 * np.max(lead):.1f} % before Eq. 47, the "
            f"finite-ε term ln(2/y_μ)/ln(1/ε) = {100 * np.min(gap):.1f}–{100 * np.max(gap):.1f} % set by our y and "
            f"ε (within {100 * np.max(_style.rel_err(t_meas, t_eq158)):.1f} % of Eq. 158); holds at these y for "
            f"ε ≲ {(Y.min() / LAM.max()) ** 10:.1g}, or at this ε for a bound ≥ {100 * np.max(lead):.1f} %",
            rel_err_leading_order=lead,
            rel_err_eq158=_style.rel_err(t_meas, t_eq158),
            signed_rel_diff_vs_eq47=t_meas / t_lead - 1,
            gap_ln_lammax_over_y_over_ln_inv_eps=gap,
        ),
    ]
    _style.write_summary(out, "fig4", summary)
    return summary
