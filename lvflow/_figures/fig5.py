"""Fig 5: a feature-wise power law in a trained network.

The Fourier MLP `f(x) = (1/√P) Σ_k W_k tanh(s_k a_k ψ_k(x))` (Eq. 50), `ψ_k = √2 cos(2πkx)` on
the grid `x ∈ {0, 1/M, …}` (M = 256, P = 64), `s_k = k^{−θ}`, learns the target
`y = Σ_k k^{−β} ψ_k` (β = 1.5) by full-batch GD from `N(0, ε²)` (ε = 1e-4). Its NQF
(Eq. 296), `A_k = s_k/(2√P) [[0, ψ_k], [ψ_k, 0]]`, decouples into one logistic mode per
frequency with `ζ_k = 4 s_k k^{−β}/√P ∝ k^{−(θ+β)}` and `V_k ∝ k^{−2β}`, so (Thm 9, Eq. 298)
`E(t) ∝ t^{−(2β−1)/(θ+β)}`, steepened at finite ε as Eq. 292 says. A plain 256-unit tanh MLP on
the raw `x` has a single NQF mode: no power law.

Panels as the paper's: (a) θ = 1, the network, its NQF, the plain MLP and the predicted slope;
(b) the network for θ ∈ {0, ½, 1} with the predicted slopes. Curves are `L(t)/L(0)` against the
gradient-flow time `t = lr × step`. Beside the figure's own run, the setup App. C states (GD lr
0.02 for 30000 steps, `t = 600`) is run too and drawn in grey: the summary says how many modes
it switches on. The summary's `claims` check each of the paper's statements about the figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from .._schedule import scaling as _scaling
from .._training.twin import nqf_twin
from ..architectures import MLP, FourierMLP
from . import _style
from ._gd import gd_losses, gd_losses_vector

TITLE = "Fourier MLP (θ = 0, ½, 1) vs its NQF: E ∝ t^−(2β−1)/(θ+β); a plain MLP has no power law"

M_GRID, P, BETA, EPS = 256, 64, 1.5, 1e-4
THETAS = (0.0, 0.5, 1.0)
STATED_LR, STATED_STEPS = 0.02, 30_000  # App. C, Fig 5: t = lr × steps = 600
MLP_WIDTH = 256
EXPONENT_TOL = 0.10  # "matches the theory": fitted exponent within 10 % of (2β−1)/(θ+β)
TRACK = 1.5  # "tracked by its NQF": network and NQF losses within this factor (0.18 decades) over the fit window
K_STATED = 8  # a power law needs this many modes switched on (our quick fit window ends at mode 8)
MLP_LR = 0.1  # the plain MLP's GD rate in the figure (App. C: 0.02), to reach the Fourier MLP's t
PLATEAU_DROP = 0.05  # a run has left its initial plateau once its loss has fallen by this many decades (ours)


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
    return x, psi, psi @ k**-BETA


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
        f = lambda a, W: jnp.tanh(F * (rootP * a)[None, :]) @ W / rootP
    return lambda p: jnp.mean((f(*p) - yj) ** 2), f


def _set_W(model, W):
    import equinox as eqx

    return eqx.tree_at(lambda m: m.W, model, W)


class _Theta:
    """One θ: the network's and the NQF's losses as functions of `(a, W)`, their inits, and the
    checks that the fast losses are the architecture's own outputs."""

    def __init__(self, theta: float, n_inits: int):
        import jax
        import jax.numpy as jnp

        self.theta = theta
        x, self.psi, y = _data()
        nets = [FourierMLP(P, theta=theta, key=jax.random.PRNGKey(s), init_scale=EPS) for s in range(n_inits)]
        self.a0 = jnp.stack([n.W[:P, 0] for n in nets])
        self.W0 = jnp.stack([n.W[P:, 0] for n in nets])
        self.loss_net, self.f_net = _fourier_loss(nets[0], x, y, quadratic=False)
        loss_nqf_data, f_nqf = _fourier_loss(nets[0], x, y, quadratic=True)
        self.c = np.asarray(nets[0].features(jnp.asarray(0.0))) / math.sqrt(2.0)  # s_k/√P
        kk = np.arange(1, P + 1, dtype=float)
        self.b = kk**-BETA
        c, b = jnp.asarray(self.c), jnp.asarray(self.b)
        # ψ_k are orthonormal on the grid, so the NQF loss is Σ_k (c_k a_k W_k − k^{−β})² exactly
        self.loss_modes = lambda p: jnp.sum((c * p[0] * p[1] - b) ** 2)
        probe = jax.random.normal(jax.random.PRNGKey(7), (2 * P, 1)) * 0.3
        model = _set_W(nets[0], probe)
        twin = nqf_twin(model, x=jnp.asarray(x[1]))
        pa, pW = probe[:P, 0], probe[P:, 0]
        X = jnp.asarray(x)
        self.checks = {
            f"network θ={theta:g}": float(jnp.max(jnp.abs(jax.vmap(model)(X) - self.f_net(pa, pW)))),
            f"nqf θ={theta:g}": float(jnp.max(jnp.abs(jax.vmap(twin)(X) - f_nqf(pa, pW)))),
            f"nqf mode-space loss θ={theta:g}": abs(float(self.loss_modes((pa, pW)) - loss_nqf_data((pa, pW)))),
        }

    def run(self, *, lr: float, steps: int, seeds_net: int, seeds_nqf: int, every: int) -> dict:
        """GD on `seeds_net` network inits and `seeds_nqf` NQF inits (the first `seeds_net` shared)."""
        import jax
        import jax.numpy as jnp

        # independent inits, one GD each: GD on the sum of their losses, averaged after
        batch = lambda loss: lambda p: jnp.sum(jax.vmap(lambda a, W: loss((a, W)))(*p))
        p_net = (self.a0[:seeds_net], self.W0[:seeds_net])
        t, E_net, fin_net = gd_losses(batch(self.loss_net), p_net, lr=lr, steps=steps, every=every)
        per_seed = lambda p: jax.vmap(lambda a, W: self.loss_modes((a, W)))(*p)
        p_nqf = (self.a0[:seeds_nqf], self.W0[:seeds_nqf])
        _, E_nqf_all, fin_nqf = gd_losses_vector(per_seed, p_nqf, lr=lr, steps=steps, every=every)
        # Fourier coefficients of the final functions: (1/M) Σ_x f(x) ψ_k(x), and c_k a_k W_k
        f_fin = np.asarray(jax.vmap(self.f_net)(*fin_net))  # (seeds, M)
        coef_net = f_fin @ self.psi / M_GRID
        coef_nqf = self.c[None, :] * np.asarray(fin_nqf[0]) * np.asarray(fin_nqf[1])
        return dict(
            t=t,
            E_net=E_net / seeds_net,
            E_nqf=E_nqf_all.mean(1),
            E_nqf_same=E_nqf_all[:, :seeds_net].mean(1),
            on_net=float(np.mean(np.sum(coef_net >= self.b[None, :] / 2, axis=1))),
            on_nqf=float(np.mean(np.sum(coef_nqf >= self.b[None, :] / 2, axis=1))),
        )

    def nqf_flow_check(self, *, lr: float, steps: int, seeds: int, every: int, refine: int = 10) -> np.ndarray:
        """The NQF's mean loss at `lr / refine` (`refine ×` the steps, the same times): a
        gradient-flow reference for the figure's learning rate."""
        import jax

        per_seed = lambda p: jax.vmap(lambda a, W: self.loss_modes((a, W)))(*p)
        _, E, _ = gd_losses_vector(
            per_seed, (self.a0[:seeds], self.W0[:seeds]), lr=lr / refine, steps=steps * refine, every=every * refine
        )
        return E.mean(1)


def _plain_mlp(init_scale: float, *, t_end: float, lr: float = STATED_LR) -> dict[str, Any]:
    """The plain tanh MLP 1 → 256 → 1 on raw `x`, full-batch GD at `lr` (App. C: 0.02) up to the
    gradient-flow time `t_end`."""
    import jax
    import jax.numpy as jnp

    x, _, y = _data()
    mlp = MLP(1, MLP_WIDTH, key=jax.random.PRNGKey(1), init_scale=init_scale)
    u0, v0 = mlp.W[0], mlp.W[1]  # neuron i = (u_i, v_i): f(x) = Σ_i v_i tanh(u_i x)
    X1, yj = jnp.asarray(x), jnp.asarray(y)
    f_mlp = lambda u, v: jnp.tanh(X1[:, None] * u[None, :]) @ v
    check = float(jnp.max(jnp.abs(jax.vmap(mlp)(X1[:, None]) - f_mlp(u0, v0))))
    steps = int(round(t_end / lr))
    every = max(1, steps // 1500)
    steps = every * (steps // every)
    t, E, _ = gd_losses(lambda p: jnp.mean((f_mlp(*p) - yj) ** 2), (u0, v0), lr=lr, steps=steps, every=every)
    left = np.flatnonzero(E <= E[0] * 10**-PLATEAU_DROP)
    return dict(
        t=t,
        E=E,
        fit=_auto_fit(t, E),
        check=check,
        drop_decades=math.log10(E[0] / E.min()),
        init_scale=init_scale,
        lr=lr,
        steps=steps,
        t_leaves_plateau=float(t[left[0]]) if left.size else None,
    )


def plain_mlp_claim(mlps: dict) -> dict:
    """The paper's "a standard tanh MLP on the raw input x does not exhibit a power law", from the
    plain-MLP runs `{ε: _plain_mlp(ε, ...)}`. A run that never leaves its initial plateau (its loss
    never falls by `PLATEAU_DROP` decades) cannot show a power law or its absence: the claim is
    not tested there. It holds where every run that leaves its plateau has no power-law window
    (`lvflow.fit_power_law`), and is not tested when none does."""
    per, parts = {}, []
    for eps, R in mlps.items():
        t_end = float(R["t"][-1])
        if R["t_leaves_plateau"] is None:
            per[eps] = None
            parts.append(
                f"ε = {eps:g}: not tested (never leaves its plateau by t = {t_end:.3g}; loss drop "
                f"{R['drop_decades']:.2g} decades)"
            )
            continue
        per[eps] = R["fit"]["exponent"] is None
        found = "no power-law window" if per[eps] else f"a power law, exponent {R['fit']['exponent']:.3g}"
        parts.append(
            f"ε = {eps:g}: {found} (leaves its plateau at t ≈ {R['t_leaves_plateau']:.3g}; loss drop "
            f"{R['drop_decades']:.2g} decades by t = {t_end:.3g})"
        )
    tested = [v for v in per.values() if v is not None]
    holds = all(tested) if tested else None
    if holds is None:
        t_end = max(float(R["t"][-1]) for R in mlps.values())
        verdict = (
            f"not tested (never leaves its plateau by t = {t_end:.3g}: "
            + ", ".join(f"ε = {eps:g} loss drop {R['drop_decades']:.2g} decades" for eps, R in mlps.items())
            + ")"
        )
    else:
        verdict = ("holds: " if holds else "fails: ") + "; ".join(parts)
    return _style.claim(
        "a standard tanh MLP trained on the raw input x does not exhibit a power law",
        holds,
        "no power-law window found (lvflow.fit_power_law) in a run that leaves its initial plateau (loss down by "
        f"≥ {PLATEAU_DROP:g} decades, our threshold), at the stated ε = {EPS:g} and at ε = 0.1, each run as long "
        "as the Fourier MLP's longest",
        verdict=verdict,
        tested_per_eps={f"{eps:g}": v for eps, v in per.items()},
        loss_drop_decades={f"{eps:g}": R["drop_decades"] for eps, R in mlps.items()},
        t_leaves_plateau={f"{eps:g}": R["t_leaves_plateau"] for eps, R in mlps.items()},
        t_end={f"{eps:g}": float(R["t"][-1]) for eps, R in mlps.items()},
    )


def _bounded(fitted: float, target: float, name: str, *, nqf: float, bound: float = EXPONENT_TOL) -> str:
    """The verdict of an exponent claim: at our `bound`, and the bound from which it holds."""
    dev = abs(fitted - target) / target
    return (
        f"{'holds' if dev <= bound else 'fails'} at our {bound:.0%} bound: fitted {fitted:.3f} against {name} = "
        f"{target:.3f} ({dev:.1%} off; the NQF's {nqf:.3f}); holds for a bound ≥ {dev:.1%}"
    )


def _eq295_claim(runs: dict) -> dict:
    """App. C's "κ_eff grows with t" (Eq. 295) on the Fourier MLP: the local exponents of each θ.
    It is tested where Eq. 295's growth over the window exceeds the part-to-part spread of the
    NQF's own local exponents (the theory's curve, whose single-mode staircase sets the resolution)."""
    fmt = lambda v: " / ".join(f"{x:.3f}" for x in v)
    growth = {theta: float(R["local_eq295"][-1] - R["local_eq295"][0]) for theta, R in runs.items()}
    spread = {theta: float(np.max(np.abs(np.diff(R["local_nqf"])))) for theta, R in runs.items()}
    resolved = [theta for theta in runs if growth[theta] > spread[theta]]
    grows = {theta: _style.increasing(runs[theta]["local_net"]) for theta in resolved}
    parts = "; ".join(
        f"θ = {theta:g}: network {fmt(R['local_net'])}, NQF {fmt(R['local_nqf'])}, Eq. 295 (constant 0) "
        f"{fmt(R['local_eq295'])}"
        for theta, R in runs.items()
    )
    unresolved = [theta for theta in runs if theta not in resolved]
    ok = all(grows.values()) if resolved else None
    head = "not tested" if ok is None else ("holds" if ok else "fails")
    why = (
        "Eq. 295's growth over the window ("
        + ", ".join(f"{growth[t]:.3f} at θ = {t:g}" for t in unresolved)
        + ") is below the part-to-part spread of the NQF's own exponents ("
        + ", ".join(f"{spread[t]:.3f}" for t in unresolved)
        + "), the staircase of the few modes in the window"
        if unresolved
        else ""
    )
    return _style.claim(
        "the effective exponent κ_eff grows with t at finite ε (App. C, Eq. 295)",
        ok,
        "the network's exponent fitted on each of 3 equal log-time parts of the fit window increases from part to "
        "part, for every θ where Eq. 295's growth over the window exceeds the part-to-part spread of the NQF's own "
        "exponents (the resolution its mode staircase allows)",
        verdict=f"{head}"
        + (f" for θ = {', '.join(f'{t:g}' for t in unresolved)}: {why}" if why else "")
        + f"; {parts}",
        eq295_growth={f"{t:g}": v for t, v in growth.items()},
        nqf_spread={f"{t:g}": v for t, v in spread.items()},
        grows_network={f"{t:g}": g for t, g in grows.items()},
    )


def _auto_fit(t, E) -> dict:
    try:
        f = _scaling.fit_power_law(t[1:], E[1:])
        return dict(exponent=f.exponent, window=list(f.window), decades=f.decades)
    except Exception as e:
        return dict(exponent=None, reason=str(e))


def make(out: Path, *, quick: bool = False) -> dict:
    # fit window: from the switch-on of mode K1 (after the coarse first steps) to that of K2
    K1, K2 = 3, (8 if quick else 12)
    lr = 0.5 if quick else 0.25
    seeds_net = 4 if quick else 8  # network runs (data space, the costly part)
    seeds_nqf = 16 if quick else 64  # NQF runs in mode space: the same first `seeds_net` inits, and more
    seeds_stated = 2 if quick else seeds_net
    kk = np.arange(1, P + 1, dtype=float)
    runs, stated, checks = {}, {}, {}
    for theta in THETAS:
        th = _Theta(theta, seeds_nqf)
        checks.update(th.checks)
        window = (float(t_star(K1, theta)), float(t_star(K2, theta)))
        steps = int(math.ceil(1.15 * window[1] / lr))
        every = max(1, steps // 1500)
        R = th.run(lr=lr, steps=steps, seeds_net=seeds_net, seeds_nqf=seeds_nqf, every=every)
        R["fit"] = _scaling.fit_power_law(R["t"][1:], R["E_net"][1:], window=window)
        R["fit_nqf"] = _scaling.fit_power_law(R["t"][1:], R["E_nqf"][1:], window=window)
        R["kappa"] = _scaling.predicted_exponent(alpha1=2 * BETA, alpha2=theta + BETA)
        # finite-ε exponent (Eq. 292) at the mode switching on mid-window, z_k0 = ε²
        k_mid = math.sqrt(K1 * K2)
        zk, zi = zeta(k_mid, theta), z_inf(k_mid, theta)
        R["k_eff"] = float(
            np.asarray(
                _scaling.effective_exponent(
                    np.array([k_mid]), EPS**2, alpha1=2 * BETA, alpha2=theta + BETA, zeta=zk, C=zk / zi
                )
            )[0]
        )
        R.update(window=window, steps=steps, k_mid=k_mid)
        # App. C, Eq. 295: the local exponent on 3 equal log-time parts of the window, network and NQF
        R["t_parts"], R["local_net"] = _style.local_exponents(R["t"][1:], R["E_net"][1:], window, 3)
        R["local_nqf"] = _style.local_exponents(R["t"][1:], R["E_nqf"][1:], window, 3)[1]
        R["local_eq295"] = np.asarray(
            _scaling.effective_exponent_time(R["t_parts"], EPS**2, alpha1=2 * BETA, alpha2=theta + BETA)
        )
        sel = (R["t"] >= window[0]) & (R["t"] <= window[1])
        ratio = R["E_net"][sel] / R["E_nqf_same"][sel]
        R["ratio_window"] = (float(ratio.min()), float(ratio.max()))
        # the learning rate against a 10× finer one (the gradient-flow reference), on the NQF
        E_fine = th.nqf_flow_check(lr=lr, steps=steps, seeds=seeds_net, every=every)
        R["lr_dev"] = float(np.max(np.abs(R["E_nqf_same"][sel] / E_fine[sel] - 1)))
        R["lr_exp_dev"] = abs(
            _scaling.fit_power_law(R["t"][1:], R["E_nqf_same"][1:], window=window).exponent
            - _scaling.fit_power_law(R["t"][1:], E_fine[1:], window=window).exponent
        )
        runs[theta] = R
        # the setup App. C states: lr 0.02 for 30000 steps (t = 600)
        steps_s = STATED_STEPS  # cheap: run as stated in the quick run too
        S = th.run(lr=STATED_LR, steps=steps_s, seeds_net=seeds_stated, seeds_nqf=seeds_nqf, every=steps_s // 600)
        S["predicted_on"] = int(np.sum(t_star(kk, theta) <= STATED_LR * steps_s))
        S["fit"] = _auto_fit(S["t"], S["E_net"])
        S["steps"] = steps_s
        stated[theta] = S

    # the control runs as long (in t = lr × step) as the Fourier MLP's longest run, at MLP_LR
    t_mlp = max(float(R["t"][-1]) for R in runs.values())
    mlps = {eps: _plain_mlp(eps, t_end=t_mlp, lr=MLP_LR) for eps in (EPS, 0.1)}
    for eps, R in mlps.items():
        checks[f"plain_mlp ε={eps:g}"] = R["check"]

    _draw(out, runs, stated, mlps)

    claims = []
    R1 = runs[1.0]
    claims.append(
        _style.claim(
            "θ = 1: the Fourier MLP descends as the predicted power law t^−(2β−1)/(θ+β) (Fig 5 left)",
            abs(R1["fit"].exponent - R1["kappa"]) <= EXPONENT_TOL * R1["kappa"],
            f"fitted exponent within {EXPONENT_TOL:.0%} of the prediction",
            fitted=R1["fit"].exponent,
            predicted=R1["kappa"],
        )
    )
    claims.append(
        _style.claim(
            "θ = 1: the Fourier MLP is tracked by its NQF approximation",
            1 / TRACK <= R1["ratio_window"][0] and R1["ratio_window"][1] <= TRACK,
            f"L_net/L_NQF within [1/{TRACK:g}, {TRACK:g}] over the fit window (same inits)",
            ratio_min=R1["ratio_window"][0],
            ratio_max=R1["ratio_window"][1],
        )
    )
    for theta, R in runs.items():
        claims.append(
            _style.claim(
                f"θ = {theta:g}: the network's power-law exponent matches the theory (Fig 5 right)",
                abs(R["fit"].exponent - R["kappa"]) <= EXPONENT_TOL * R["kappa"],
                f"fitted exponent within {EXPONENT_TOL:.0%} of (2β−1)/(θ+β)",
                verdict=_bounded(R["fit"].exponent, R["kappa"], "(2β−1)/(θ+β)", nqf=R["fit_nqf"].exponent),
                fitted=R["fit"].exponent,
                predicted=R["kappa"],
                nqf=R["fit_nqf"].exponent,
                k_eff_eq292=R["k_eff"],
                network_over_nqf_loss=list(R["ratio_window"]),
            )
        )
    for theta, R in runs.items():
        claims.append(
            _style.claim(
                f"θ = {theta:g}: the steepening relative to theory is the finite-initialisation effect (App. C, "
                "Eq. 292), which vanishes as ε → 0",
                abs(R["fit"].exponent - R["k_eff"]) <= EXPONENT_TOL / 2 * R["k_eff"],
                f"the network's fitted exponent within {EXPONENT_TOL / 2:.0%} of Eq. 292's k_eff (its NQF's "
                "exponent is reported beside)",
                verdict=_bounded(
                    R["fit"].exponent, R["k_eff"], "Eq. 292's κ_eff", nqf=R["fit_nqf"].exponent, bound=EXPONENT_TOL / 2
                ),
                fitted=R["fit"].exponent,
                k_eff_eq292=R["k_eff"],
                nqf=R["fit_nqf"].exponent,
            )
        )
    claims.append(_eq295_claim(runs))
    claims.append(plain_mlp_claim(mlps))
    claims.append(
        _style.claim(
            "App. C's setup (full-batch GD, lr 0.02, 30000 steps, ε = 1e-4) produces the power law",
            all(S["on_net"] >= K_STATED for S in stated.values()),
            f"at least {K_STATED} modes switched on (Fourier coefficient ≥ half its target) by t = 600",
            modes_on_network={f"{th:g}": S["on_net"] for th, S in stated.items()},
            modes_on_nqf={f"{th:g}": S["on_nqf"] for th, S in stated.items()},
            modes_predicted_eq158={f"{th:g}": S["predicted_on"] for th, S in stated.items()},
        )
    )

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
        "seeds_network_stated_setup": seeds_stated,
        "fit_window_modes": [K1, K2],
        "claims": claims,
        "deviations": {
            "learning_rate_and_steps": (
                f"App. C states GD lr {STATED_LR} for {STATED_STEPS} steps (t = 600); that switches on only the "
                "modes listed under 'stated_setup', too few for a power law. This figure runs lr "
                f"{lr} until mode {K2} has switched on (Eq. 158), the same gradient flow at fewer steps: "
                "'lr_vs_flow' measures the effect of the learning rate against a 10× smaller one."
            ),
        },
        "choices": {
            "plain_mlp_length": "the plain MLP runs as long in t = lr × step as the Fourier MLP's longest run (App. C "
            f"states 30000 steps at lr 0.02, t = 600, for every panel), at lr {MLP_LR:g}: at the stated 0.02 that "
            "is 1.1e6 steps per init at full size (about 9 min each on 2 shared cores). It counts as having left its "
            f"plateau once its loss is {PLATEAU_DROP:g} decades down",
        },
        "stated_setup": {
            f"{theta:g}": {
                "lr": STATED_LR,
                "steps": S["steps"],
                "t_end": STATED_LR * S["steps"],
                "modes_on_network": S["on_net"],
                "modes_on_nqf": S["on_nqf"],
                "modes_predicted_eq158": S["predicted_on"],
                "auto_power_law_fit": S["fit"],
            }
            for theta, S in stated.items()
        },
        "lr_vs_flow": {
            f"{theta:g}": {
                "max_rel_dev_nqf_loss_in_window": R["lr_dev"],
                "exponent_shift": R["lr_exp_dev"],
            }
            for theta, R in runs.items()
        },
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
                "network_over_nqf_loss_in_window": list(R["ratio_window"]),
                "max_rel_dev_network_vs_nqf_loss": float(np.max(np.abs(R["E_net"] / R["E_nqf_same"] - 1))),
                "local_exponent_t": R["t_parts"].tolist(),
                "local_exponent_network": R["local_net"].tolist(),
                "local_exponent_nqf": R["local_nqf"].tolist(),
                "local_exponent_eq295_const0": R["local_eq295"].tolist(),
            }
            for theta, R in runs.items()
        },
        "max_abs_dev_fast_loss_vs_model_outputs": checks,
        "plain_mlp": {
            f"eps={eps:g}": {
                "lr": R["lr"],
                "steps": R["steps"],
                "t_end": float(R["t"][-1]),
                "t_leaves_plateau": R["t_leaves_plateau"],
                "width": MLP_WIDTH,
                "init_scale": eps,
                "fit": R["fit"],
                "loss_drop_decades": R["drop_decades"],
                "final_loss": float(R["E"][-1]),
                "initial_loss": float(R["E"][0]),
            }
            for eps, R in mlps.items()
        },
    }
    _style.write_summary(out, "fig5", summary)
    return summary


def _draw(out: Path, runs: dict, stated: dict, mlps: dict) -> None:
    cols = dict(zip(THETAS, ["tab:blue", "tab:orange", "tab:green"]))

    def slope(ax, R, E, color, label=None):
        # the predicted law through the curve at the window's start, drawn over the window (shifted down)
        tw = np.geomspace(R["window"][0], R["window"][1], 30)
        E0 = np.interp(R["window"][0], R["t"], E)
        ax.loglog(tw, 0.45 * E0 * (tw / tw[0]) ** -R["kappa"], color=color, ls=(0, (1, 1.2)), lw=2.0, label=label)

    with _style.style():
        fig, axs = _style.subplots(2, width=3.9, height=3.1)
        ax = axs[0]
        R = runs[1.0]
        L0 = R["E_net"][0]
        ax.loglog(R["t"][1:], R["E_net"][1:] / L0, color="tab:blue", lw=_style.NETWORK_WIDTH, label="Fourier MLP")
        ax.loglog(R["t"][1:], R["E_nqf_same"][1:] / L0, **_style.THEORY, label="its NQF (same inits)")
        for eps, M, ls in ((EPS, mlps[EPS], "-"), (0.1, mlps[0.1], ":")):
            ax.loglog(
                M["t"][1:],
                M["E"][1:] / M["E"][0],
                color="tab:red",
                ls=ls,
                lw=1.4,
                label=f"tanh MLP on raw $x$, ε = {eps:g}",
            )
        S = stated[1.0]
        t_stated = S["t"][-1]
        ax.loglog(
            S["t"][1:],
            S["E_net"][1:] / S["E_net"][0],
            color="0.5",
            lw=1.2,
            zorder=5,
            label="App. C: lr 0.02 to t = 600",
        )
        ax.axvline(t_stated, **_style.PREDICTED_TIME)
        slope(ax, R, R["E_net"] / L0, "black", label=f"predicted $t^{{-{R['kappa']:.2f}}}$")
        ax.set(xlabel="time $t$ = lr × step", ylabel=r"$\mathcal{L}(t)/\mathcal{L}(0)$", title="θ = 1")
        ax.set_ylim(bottom=0.3 * min(R["E_net"][-1], R["E_nqf_same"][-1]) / L0, top=3)
        ax.legend(loc="lower left", fontsize=6.5)
        _style.panel_label(ax, "a")

        ax = axs[1]
        for theta, R in runs.items():
            c, L0 = cols[theta], R["E_net"][0]
            ax.loglog(
                R["t"][1:],
                R["E_net"][1:] / L0,
                color=c,
                lw=_style.NETWORK_WIDTH,
                label=f"θ = {theta:g}: fit −{R['fit'].exponent:.2f} (NQF −{R['fit_nqf'].exponent:.2f}), "
                f"theory −{R['kappa']:.2f}",
            )
            slope(ax, R, R["E_net"] / L0, "black")
        ax.plot([], [], color="black", ls=(0, (1, 1.2)), lw=2.0, label="predicted slopes (shifted)")
        ax.set(xlabel="time $t$ = lr × step", ylabel=r"$\mathcal{L}(t)/\mathcal{L}(0)$", title="Fourier MLP")
        ax.set_ylim(bottom=0.3 * min(R["E_net"][-1] / R["E_net"][0] for R in runs.values()), top=3)
        ax.legend(loc="upper right", fontsize=6.5)
        _style.panel_label(ax, "b")
        _style.save(fig, out, "fig5")
