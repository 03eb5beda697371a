"""The validity horizon (`lvflow.nqf_horizon`) against the measured departure of a network from its NQF.

`python -m benchmarks.horizon [--quick]`: for each case, full-batch GD on a fixed data set trains the
network and its NQF twin (`lvflow.nqf_twin`) from the same small init; the measured departure is the
first step at which `|L_net − L_NQF| ≥ 0.1 L(0)`. `nqf_horizon` gets the twin's recorded neurons (`W`)
or only `M = W Wᵀ` (`M`, representative neurons), and returns the step at which the output ratio
reaches 0.1 and the step at which its estimated loss gap reaches 0.1 L(0). The error is
`estimate / measured − 1`. Cases (the figures' architectures at quick sizes, GD instead of the
figures' online SGD / Adam because the loss-gap estimate is for gradient flow):

- `wine`: tanh MLP 13→20→1 on scikit-learn's wine (cultivar 2 vs the rest), σ = 0.01, lr 0.05;
- `fig6-mlp`: tanh MLP 20→100→1 on 256 fixed samples of a standard-Gaussian tanh teacher 20→100→1,
  ε = 1e-3, lr 0.05;
- `fig6-qk`: QK-only attention (D = 16, N = 10, d_k = 8, 4 heads) on 256 fixed samples of its
  standard-Gaussian teacher with the same readout, ε = 1e-3, lr 0.02;
- `fig7-mlp`, `fig7-cnn`, `fig7-attention`: odd vs even 8×8 digits (500 images): tanh MLP 64→20→1;
  tanh CNN with 8 channels of 5×5 kernels; QK-only attention (8 rows as tokens, d_k = 8, 4 heads);
  σ = 0.01.
"""

from __future__ import annotations

import argparse
import math
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import lvflow
from lvflow import architectures as arch

LEVEL = 0.1


def _wine():
    from sklearn.datasets import load_wine

    data, target = load_wine(return_X_y=True)
    X = (data - data.mean(0)) / data.std(0)
    return jnp.asarray(X), jnp.asarray(np.where(target == 1, 1.0, -1.0))


def _teacher(teacher, shape, m, key):
    X = jax.random.normal(key, (m, *shape))
    return X, jax.vmap(teacher)(X)


def cases(quick: bool):
    """(name, network, X, y, learning rate, steps, stride)."""
    k = jax.random.PRNGKey
    digits = lambda layout: lvflow.digits_parity(layout=layout, m=200 if quick else 500)
    out = []
    X, y = _wine()
    out.append(("wine", arch.MLP(13, 20, key=k(1), init_scale=0.01), X, y, 0.05, 800, 40))
    teacher = arch.MLP(20, 100, key=k(2), init_scale=1.0)
    X, y = _teacher(teacher, (20,), 256, k(3))
    out.append(("fig6-mlp", arch.MLP(20, 100, key=k(4), init_scale=1e-3), X, y, 0.05, 400, 20))
    c = jax.random.normal(k(5), (16,))
    teacher = arch.QKAttention(16, 8, 4, key=k(6), init_scale=1.0, readout=c)
    X, y = _teacher(teacher, (16, 10), 256, k(7))
    out.append(("fig6-qk", arch.QKAttention(16, 8, 4, key=k(8), init_scale=1e-3, readout=c), X, y, 0.02, 400, 20))
    ds = digits("flat")
    out.append(("fig7-mlp", arch.MLP(64, 20, key=k(1), init_scale=0.01), ds.X, ds.y, 0.01, 3200, 200))
    ds = digits("image")
    out.append(("fig7-cnn", arch.CNN((8, 8), (5, 5), 8, key=k(1), init_scale=0.01), ds.X, ds.y, 0.01, 3200, 200))
    ds = digits("sequence")
    net = arch.QKAttention(8, 8, 4, key=k(1), init_scale=0.01)
    out.append(("fig7-attention", net, ds.X, ds.y, 0.01, 3200, 200))
    return out


def _gd(f, W0, y, lr, steps):
    """Full-batch GD on `(1/m) Σ (f(W)_μ − y_μ)²`: the loss and `W` before each step."""

    def body(W, _):
        L, G = jax.value_and_grad(lambda W: jnp.mean((f(W) - y) ** 2))(W)
        return W - lr * G, (L, W)

    _, (L, Ws) = jax.jit(lambda W0: jax.lax.scan(body, W0, None, length=steps))(W0)
    return np.asarray(L), np.asarray(Ws)


def run_case(name, net, X, y, lr, steps, stride) -> dict:
    twin = lvflow.nqf_twin(net, x=X[0])
    f_net = lambda W: jax.vmap(eqx.tree_at(lambda m: m.W, net, W))(X)
    f_nqf = lambda W: jax.vmap(eqx.tree_at(lambda m: m.network.W, twin, W))(X)
    t0 = time.perf_counter()
    L_net, _ = _gd(f_net, net.W, y, lr, steps)
    L_nqf, W_nqf = _gd(f_nqf, net.W, y, lr, steps)
    gap = np.abs(L_net - L_nqf) / L_net[0]
    measured = int(np.argmax(gap >= LEVEL)) if np.any(gap >= LEVEL) else math.inf
    t1 = time.perf_counter()
    if not math.isfinite(measured):
        print(f"{name}: no departure within {steps} steps", flush=True)
    idx = np.arange(0, steps, stride)
    t = lr * idx
    from_W = lvflow.nqf_horizon(net, X, y, W=W_nqf[idx], times=t, f0=None)
    M = np.einsum("tpd,tqd->tpq", W_nqf[idx], W_nqf[idx])
    from_M = lvflow.nqf_horizon(net, X, y, M=M, times=t, f0=None)
    t2 = time.perf_counter()
    err = lambda s: s / measured - 1.0 if math.isfinite(measured) and measured > 0 else math.nan
    return dict(
        case=name,
        order=from_W.order,
        measured=measured,
        floor=float(L_nqf[-1] / L_net[0]),
        ratio_W=from_W.time / lr,
        ratio_M=from_M.time / lr,
        gap_W=from_W.departure / lr,
        gap_M=from_M.departure / lr,
        err_gap_W=err(from_W.departure / lr),
        err_gap_M=err(from_M.departure / lr),
        err_ratio_W=err(from_W.time / lr),
        gd_s=t1 - t0,
        horizon_s=t2 - t1,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="digits cases on 200 images instead of 500")
    parser.add_argument("--case", action="append", default=None, help="run only the cases containing TEXT")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    print("| case | order | measured departure (step) | loss gap, W: step (error) | loss gap, M: step (error) "
          "| output ratio 0.1, W / M (step) | GD s | horizon s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, net, X, y, lr, steps, stride in cases(args.quick):
        if args.case and not any(c in name for c in args.case):
            continue
        r = run_case(name, net, X, y, lr, steps, stride)
        print(
            f"| {r['case']} | {r['order']} | {r['measured']} | {r['gap_W']:.0f} ({r['err_gap_W']:+.0%}) "
            f"| {r['gap_M']:.0f} ({r['err_gap_M']:+.0%}) | {r['ratio_W']:.0f} / {r['ratio_M']:.0f} "
            f"| {r['gd_s']:.1f} | {r['horizon_s']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
