"""Fig 5: a feature-wise power law in a trained network.

The Fourier MLP `f(x) = (1/√P) Σ_k W_k tanh(s_k a_k ψ_k(x))`, `ψ_k = √2 cos(2πkx)` on the grid
`x ∈ {0, 1/M, …}` (M = 256, P = 64), `s_k = k^{−θ}`, learns the target `y = Σ_k k^{−β} ψ_k`
(β = 1.5) by full-batch GD from `N(0, ε²)` (ε = 1e-4). Its NQF, `A_k = s_k/(2√P) [[0, ψ_k],
[ψ_k, 0]]`, decouples into one logistic mode per frequency with
`ζ_k = 4 s_k k^{−β}/√P ∝ k^{−(θ+β)}` and `V_k = k^{−2β}`, so (Thm 9, `α₁ = 2β`, `α₂ = θ + β`)

`E(t) ∝ t^{−(2β−1)/(θ+β)}`,

steepened at finite ε as Eq. 292 says (`α₁ − α₂ = β − θ > 0`). A plain 256-unit tanh MLP on the
raw `x` has a single NQF mode (`A = ½[[0, x],[x, 0]]`): one drop, then a plateau, no power law.

Time is `t = lr × step`. The run of each θ lasts until about `K_LEARN` modes have switched on
(`t*_k = ln(z_k∞/z_k0)/ζ_k`), which for θ = 1 is far beyond the paper's 30000 steps at lr 0.02;
the quick run uses a larger learning rate for the same gradient-flow time (GD's error is
O(lr ζ₁) ≈ 5 % on the first mode only).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .. import _scaling
from . import _style

TITLE = "Fourier MLP (θ = 0, ½, 1) vs its NQF: E ∝ t^−(2β−1)/(θ+β); a plain MLP has no power law"

M_GRID, P, BETA, EPS = 256, 64, 1.5, 1e-4
THETAS = (0.0, 0.5, 1.0)


def zeta(k, theta):
    """NQF growth rate of mode `k`: `4 s_k k^{−β}/√P` (rate of `z = (a_k + W_k)²/2`)."""
    return 4.0 * k ** -(theta + BETA) / math.sqrt(P)


def z_inf(k, theta):
    """Plateau of mode `k`: `s_k a W/√P = k^{−β}` with `a = W`, so `z = 2 a² = 2√P k^{θ−β}`."""
    return 2.0 * math.sqrt(P) * k ** (theta - BETA)


def t_star(k, theta):
    """Eq. 158 (ρ = ½, leading order) with `z_k0 = ε²`, the mean of `(a_k + W_k)²/2` at init."""
    return np.log(z_inf(k, theta) / EPS**2) / zeta(k, theta)


def _data():
    x = np.arange(M_GRID) / M_GRID
    k = np.arange(1, P + 1)
    psi = math.sqrt(2.0) * np.cos(2 * np.pi * k[None, :] * x[:, None])
    return x, psi @ k**-BETA


def _fourier_loss(net, X, y, *, quadratic: bool):
    """The loss (Eq. 26) of the FourierMLP `net` (or, with `quadratic`, of its NQF
    `Σ_k a_k W_k s_k ψ_k(x)/√P`) as a function of `(a, W)`, with the features `s_k ψ_k(x)/√P`
    evaluated once from `net.features` (the model's `__call__` recomputes them at every step)."""
    import jax
    import jax.numpy as jnp

    F = jax.vmap(net.features)(jnp.asarray(X))  # (M, P)
    rootP = math.sqrt(net.num_modes)
    yj = jnp.asarray(y)
    if quadratic:
        f = lambda a, W: (F * a[None, :]) @ W
    else:
        f = lambda a, W: jnp.tanh(F * rootP * a[None, :]) @ W / rootP
    return lambda p: jnp.mean((f(*p) - yj) ** 2), f


def eqx_set_W(model, W):
    """`model` with its neuron array replaced by `W`."""
    import equinox as eqx

    return eqx.tree_at(lambda m: m.W, model, W)


def make(out: Path, *, quick: bool = False) -> dict:
    import jax
    import jax.numpy as jnp

    from .._training.twin import nqf_twin
    from ..architectures import MLP, FourierMLP
    from ._gd import gd_losses, gd_losses_vector

    # fit window: from the switch-on of mode K1 (after the coarse first steps) to that of K2
    K1, K2 = 3, (8 if quick else 12)
    lr = 0.5 if quick else 0.25
    seeds_net = 4 if quick else 8  # network runs (data space, the costly part)
    seeds_nqf = 64  # NQF runs in mode space: the same first `seeds_net` inits, and more
    x, y = _data()
    kk = np.arange(1, P + 1, dtype=float)
    runs = {}
    checks = {}
    for theta in THETAS:
        window = (float(t_star(K1, theta)), float(t_star(K2, theta)))
        steps = int(math.ceil(1.15 * window[1] / lr))
        every = max(1, steps // 1500)
        nets = [FourierMLP(P, theta=theta, key=jax.random.PRNGKey(s), init_scale=EPS) for s in range(seeds_nqf)]
        a0 = jnp.stack([n.W[:P, 0] for n in nets])
        W0 = jnp.stack([n.W[P:, 0] for n in nets])
        loss_net, f_net = _fourier_loss(nets[0], x, y, quadratic=False)
        loss_nqf_data, f_nqf = _fourier_loss(nets[0], x, y, quadratic=True)
        c = np.asarray(nets[0].features(0.0)) / math.sqrt(2.0)  # s_k/√P
        # ψ_k are orthonormal on the grid, so the NQF loss is Σ_k (c_k a_k W_k − k^{−β})² exactly
        loss_modes = lambda p: jnp.sum((c * p[0] * p[1] - kk**-BETA) ** 2)
        # the fast losses are the model's and its twin's own outputs (checked at a generic point)
        probe = jax.random.normal(jax.random.PRNGKey(7), (2 * P, 1)) * 0.3
        model = eqx_set_W(nets[0], probe)
        twin = nqf_twin(model, x=x[1])
        pa, pW = probe[:P, 0], probe[P:, 0]
        checks[f"network θ={theta:g}"] = float(jnp.max(jnp.abs(jax.vmap(model)(jnp.asarray(x)) - f_net(pa, pW))))
        checks[f"nqf θ={theta:g}"] = float(jnp.max(jnp.abs(jax.vmap(twin)(jnp.asarray(x)) - f_nqf(pa, pW))))
        checks[f"nqf mode-space loss θ={theta:g}"] = abs(float(loss_modes((pa, pW)) - loss_nqf_data((pa, pW))))
        # independent inits, one GD each: GD on the sum of their losses, averaged after
        batch = lambda loss: lambda p: jnp.sum(jax.vmap(lambda a, W: loss((a, W)))(*p))
        t, E_net, _ = gd_losses(batch(loss_net), (a0[:seeds_net], W0[:seeds_net]), lr=lr, steps=steps, every=every)
        E_net = E_net / seeds_net
        per_seed = lambda p: jax.vmap(lambda a, W: loss_modes((a, W)))(*p)
        _, E_nqf_all, _ = gd_losses_vector(per_seed, (a0, W0), lr=lr, steps=steps, every=every)
        E_nqf_same = E_nqf_all[:, :seeds_net].mean(1)
        E_nqf = E_nqf_all.mean(1)
        fit = _scaling.fit_power_law(t[1:], E_net[1:], window=window)
        fit_nqf = _scaling.fit_power_law(t[1:], E_nqf[1:], window=window)
        kappa = _scaling.predicted_exponent(alpha1=2 * BETA, alpha2=theta + BETA)
        # finite-ε exponent (Eq. 292) at the mode switching on mid-window, z_k0 = ε²
        k_mid = math.sqrt(K1 * K2)
        zk, zi = zeta(k_mid, theta), z_inf(k_mid, theta)
        k_eff = float(
            _scaling.effective_exponent(k_mid, EPS**2, alpha1=2 * BETA, alpha2=theta + BETA, zeta=zk, C=zk / zi)
        )
        runs[theta] = dict(
            t=t,
            E_net=E_net,
            E_nqf=E_nqf,
            E_nqf_same=E_nqf_same,
            fit=fit,
            fit_nqf=fit_nqf,
            kappa=kappa,
            k_eff=k_eff,
            k_mid=k_mid,
            steps=steps,
            t_star=t_star(kk, theta),
        )

    # the plain MLP on raw x: the paper's lr 0.02 (it is unstable at the Fourier runs' lr) and an
    # init of 0.1 (from 1e-4 its single NQF mode, with rate ∝ mean(x y) ≈ 0, never grows in this time)
    lr_mlp, steps_mlp = 0.02, (10_000 if quick else 30_000)
    mlp = MLP(1, 256, key=jax.random.PRNGKey(1), init_scale=0.1)
    u0, v0 = mlp.W[0], mlp.W[1]  # neuron i = (u_i, v_i): f(x) = Σ_i v_i tanh(u_i x)
    X1, yj = jnp.asarray(x), jnp.asarray(y)
    f_mlp = lambda u, v: jnp.tanh(X1[:, None] * u[None, :]) @ v
    checks["plain_mlp"] = float(jnp.max(jnp.abs(jax.vmap(mlp)(X1[:, None]) - f_mlp(u0, v0))))
    t_mlp, E_mlp, _ = gd_losses(
        lambda p: jnp.mean((f_mlp(*p) - yj) ** 2), (u0, v0), lr=lr_mlp, steps=steps_mlp, every=steps_mlp // 1000
    )
    try:
        fit_mlp = _scaling.fit_power_law(t_mlp[1:], E_mlp[1:])
        mlp_fit = dict(exponent=fit_mlp.exponent, window=list(fit_mlp.window), decades=fit_mlp.decades)
    except Exception as e:  # no power-law window at all: what this panel shows
        mlp_fit = dict(exponent=None, reason=str(e))
    mlp_drop_decades = math.log10(E_mlp[0] / E_mlp[-1])

    cols = dict(zip(THETAS, ["tab:blue", "tab:orange", "tab:green"]))
    with _style.style():
        fig, axs = _style.subplots(2, width=3.9, height=3.1)
        ax = axs[0]
        for theta, R in runs.items():
            c, fit = cols[theta], R["fit"]
            ax.loglog(
                R["t"][1:],
                R["E_net"][1:],
                color=c,
                lw=_style.NETWORK_WIDTH,
                label=f"θ = {theta:g}: fit −{fit.exponent:.2f}, NQF −{R['fit_nqf'].exponent:.2f}, "
                f"theory −{R['kappa']:.2f}",
            )
            ax.loglog(R["t"][1:], R["E_nqf_same"][1:], color=c, ls="--", lw=1.0, alpha=0.9)
            tw = np.geomspace(*fit.window, 30)
            ax.loglog(tw, fit(tw) / 2.2, color=c, ls=(0, (1, 1)), lw=2.0)
        ax.plot([], [], color="0.3", ls="--", lw=1.0, label="its NQF (same inits)")
        ax.plot([], [], color="0.4", ls=(0, (1, 1)), lw=2.0, label="power-law fit (shifted)")
        ax.set(
            xlabel="time $t$ = lr × step",
            ylabel="training loss",
            title=r"Fourier MLP: $E \propto t^{-(2\beta-1)/(\theta+\beta)}$",
        )
        ax.set_ylim(top=30)
        ax.legend(loc="upper right", fontsize=6.5)
        _style.panel_label(ax, "a")

        ax = axs[1]
        ax.loglog(
            t_mlp[1:], E_mlp[1:], color="tab:purple", lw=_style.NETWORK_WIDTH, label="tanh MLP, 256 units, raw $x$"
        )
        R0 = runs[0.0]
        ax.loglog(R0["t"][1:], R0["E_net"][1:], color=cols[0.0], lw=1.0, alpha=0.6, label="Fourier MLP, θ = 0")
        ax.set(xlabel="time $t$ = lr × step", ylabel="training loss", title="plain MLP on raw $x$: no power law")
        ax.legend(loc="lower left")
        _style.panel_label(ax, "b")
        _style.save(fig, out, "fig5")

    summary = {
        "figure": "fig5",
        "quick": quick,
        "M": M_GRID,
        "P": P,
        "beta": BETA,
        "eps": EPS,
        "lr": lr,
        "seeds_network": seeds_net,
        "seeds_nqf": seeds_nqf,
        "fit_window_modes": [K1, K2],
        "theta": {
            f"{theta:g}": {
                "steps": R["steps"],
                "exponent_predicted": R["kappa"],
                "exponent_fitted_network": R["fit"].exponent,
                "exponent_fitted_nqf": R["fit_nqf"].exponent,
                "rel_err_nqf_vs_predicted": abs(R["fit_nqf"].exponent - R["kappa"]) / R["kappa"],
                "rel_err_nqf_vs_k_eff": abs(R["fit_nqf"].exponent - R["k_eff"]) / R["k_eff"],
                "fit_window": list(R["fit"].window),
                "fit_decades": R["fit"].decades,
                "k_eff_eq292": R["k_eff"],
                "k_at_window_middle": R["k_mid"],
                "rel_err_fitted_vs_predicted": abs(R["fit"].exponent - R["kappa"]) / R["kappa"],
                "rel_err_fitted_vs_k_eff": abs(R["fit"].exponent - R["k_eff"]) / R["k_eff"],
                "max_rel_dev_network_vs_nqf_loss": float(np.max(np.abs(R["E_net"] / R["E_nqf_same"] - 1))),
            }
            for theta, R in runs.items()
        },
        "max_abs_dev_fast_loss_vs_model_outputs": checks,
        "plain_mlp": {
            "lr": lr_mlp,
            "steps": steps_mlp,
            "init_scale": 0.1,
            "fit": mlp_fit,
            "loss_drop_decades": mlp_drop_decades,
            "final_loss": float(E_mlp[-1]),
            "initial_loss": float(E_mlp[0]),
        },
    }
    _style.write_summary(out, "fig5", summary)
    return summary
