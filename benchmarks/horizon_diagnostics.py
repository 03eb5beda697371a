"""Why `nqf_horizon`'s loss-gap estimate misses the measured departure (benchmarks/README.md,
"Validity horizon"): `python -m benchmarks.horizon_diagnostics --case NAME [--perturbation]`.

For a case of `benchmarks.horizon`, trains the network and its NQF twin by full-batch GD from the
same init and, at 1/2 and 3/4 of the measured departure on the twin's path, prints the RMS of Thm 13's
next term and of the exact remainder `f_net − f_NQF`, the null-space rate `|Π⊥ g_T|²` with each
(`g_T = (2/m) Σ Δ_μ ∇T_μ`, `Π⊥` off the row space of the NQF's Jacobian; per unit of flow time, in
units of `L(0)`), and the measured gap's slope there (±20 steps). With `--perturbation`, also GD on
the first- and second-order perturbations `δW₁`, `δW₂` of the network along the twin's path (the
exact remainder as the perturbation), `L_net(W + δW₁ [+ δW₂]) − L_NQF(W)`, against the measured gap.
"""

from __future__ import annotations

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import lvflow

from .horizon import _gd, cases


def _setup(name):
    for case in cases(False):
        if case[0] == name:
            return case
    raise SystemExit(f"--case: unknown {name!r}; known: {', '.join(c[0] for c in cases(False))}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--perturbation", action="store_true")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    name, net, X, y, lr, steps, _ = _setup(args.case)
    twin = lvflow.nqf_twin(net, x=X[0])
    f_net = lambda W: jax.vmap(eqx.tree_at(lambda m: m.W, net, W))(X)  # noqa: E731
    f_nqf = lambda W: jax.vmap(eqx.tree_at(lambda m: m.network.W, twin, W))(X)  # noqa: E731
    order = net.next_order(jax.tree_util.tree_map(lambda a: a[0], X))
    f_next = lambda W: jax.vmap(lambda x: eqx.tree_at(lambda m: m.W, net, W).expansion_term(x, order))(X)  # noqa: E731
    L_net, _ = _gd(f_net, net.W, y, lr, steps)
    L_nqf, W_nqf = _gd(f_nqf, net.W, y, lr, steps)
    L0, m = L_net[0], y.shape[0]
    gap = (L_net - L_nqf) / L0
    if not np.any(np.abs(gap) >= 0.1):
        raise SystemExit(f"{name}: no departure within {steps} steps")
    measured = int(np.argmax(np.abs(gap) >= 0.1))
    print(f"{name}: measured departure at step {measured}")
    for s in (measured // 2, 3 * measured // 4):
        W = jnp.asarray(W_nqf[s])
        J = np.asarray(jax.jacfwd(f_nqf)(W)).reshape(m, -1)
        _, S, Vt = np.linalg.svd(J, full_matrices=False)
        V = Vt[: int(np.sum(S > S[0] * 1e-10))]
        D = f_nqf(W) - y
        row = []
        for T in (f_next, lambda V_: f_net(V_) - f_nqf(V_)):
            g = np.asarray(jax.grad(lambda V_: 2 / m * jnp.sum(D * T(V_)))(W)).reshape(-1)
            g_perp = g - V.T @ (V @ g)
            row.append((float(jnp.sqrt(jnp.mean(T(W) ** 2))), float(g_perp @ g_perp) / L0))
        hi = min(s + 20, steps - 1)
        slope = -(gap[hi] - gap[s - 20]) / (lr * (hi - s + 20))
        print(
            f"step {s}: RMS next term {row[0][0]:.3g}, exact remainder {row[1][0]:.3g}; |Π⊥ g_T|² next term "
            f"{row[0][1]:.3g}, exact remainder {row[1][1]:.3g}; measured rate {slope:.3g}; "
            f"NQF loss {L_nqf[s] / L0:.3f} L(0)"
        )
    if args.perturbation:
        _perturbation(f_net, f_nqf, y, lr, W_nqf, gap, L0)


def _perturbation(f_net, f_nqf, y, lr, W_nqf, gap, L0):
    L_net = lambda W: jnp.mean((f_net(W) - y) ** 2)  # noqa: E731
    L_nqf = lambda W: jnp.mean((f_nqf(W) - y) ** 2)  # noqa: E731
    g_nqf, g_rest = jax.grad(L_nqf), jax.grad(lambda W: L_net(W) - L_nqf(W))

    def step(c, W):
        d1, d2 = c
        second = jax.jvp(lambda V: jax.jvp(g_nqf, (V,), (d1,))[1], (W,), (d1,))[1] / 2
        n1 = d1 - lr * (jax.jvp(g_nqf, (W,), (d1,))[1] + g_rest(W))
        n2 = d2 - lr * (jax.jvp(g_nqf, (W,), (d2,))[1] + second + jax.jvp(g_rest, (W,), (d1,))[1])
        return (n1, n2), (L_net(W + d1) - L_nqf(W), L_net(W + d1 + d2) - L_nqf(W))

    zero = jnp.zeros(W_nqf.shape[1:])
    _, (p1, p2) = jax.jit(lambda Ws: jax.lax.scan(step, (zero, zero), Ws))(jnp.asarray(W_nqf))
    p1, p2 = np.asarray(p1) / L0, np.asarray(p2) / L0
    for s in range(0, gap.shape[0], max(1, gap.shape[0] // 16)):
        print(f"step {s}: measured gap {gap[s]:+.4f} L(0), first order {p1[s]:+.4f}, second order {p2[s]:+.4f}")


if __name__ == "__main__":
    main()
