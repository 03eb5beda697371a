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

`python -m benchmarks.horizon --figure PATH` instead draws the how-to's figure
(`docs/howto/trust_fig6.png`, `figure_data` and `draw_figure`): Fig 6's MLP in the paper's
published setup (online SGD, batch 64, lr 0.05, ε = 1e-3, fresh Gaussian samples of a standard
Gaussian tanh teacher 20→100→1, 5 runs; the seeds of `lvflow figures`' Fig 6) at quick size (1000
steps instead of 2000, losses on 256 fixed fresh samples per run instead of 2048), the network and
its NQF twin on the same batches, with `lvflow.predict`'s validity horizon (its output-ratio step,
from the NQF of each run's 256 samples) and the measured departure (first step at which the
run-averaged `L/L(0)` of the two differ by ≥ 0.1) marked.
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


#: Fig 6's MLP (THEORY.md §5): a tanh MLP 20→100→1 learns a standard-Gaussian tanh teacher 20→100→1
#: by online SGD, batch 64, lr 0.05, init N(0, ε²) with ε = 1e-3
FIG6_IN, FIG6_WIDTH, FIG6_LR, FIG6_EPS, FIG6_BATCH = 20, 100, 0.05, 1e-3, 64


def _figure_run(run: int, steps: int, eval_size: int, every: int, opt) -> dict:
    """Run `run` of `figure_data`: both losses on the run's fixed samples, and `predict`'s horizon."""
    k_student, k_teacher, _ = jax.random.split(jax.random.PRNGKey(100 + run), 3)
    net = arch.MLP(FIG6_IN, FIG6_WIDTH, None, key=k_student, init_scale=FIG6_EPS)
    teacher = arch.MLP(FIG6_IN, FIG6_WIDTH, None, key=k_teacher, init_scale=1.0)
    stream = lvflow.TeacherStream(teacher, (FIG6_IN,))
    X, y = stream(jax.random.PRNGKey(10_000 + run), eval_size)
    kw = dict(batch_size=FIG6_BATCH, key=jax.random.PRNGKey(20_000 + run), record_every=every, record_M=False)
    h_net = lvflow.train(net, stream, opt, steps, eval_data=(X, y), progress=False, **kw)
    h_nqf = lvflow.train(lvflow.nqf_twin(net, x=X[0]), stream, opt, steps, eval_data=(X, y), progress=False, **kw)
    nqf = lvflow.nqf_from_data("mlp", {"x": np.asarray(X), "y": np.asarray(y)})
    pred = lvflow.predict(
        nqf, init_std=FIG6_EPS, width=FIG6_WIDTH, learning_rate=FIG6_LR, t1=FIG6_LR * steps, network=net, inputs=X
    )
    h = pred.horizon
    assert h is not None  # tanh: Thm 13's next term is of order 4
    L0 = float(h_net.loss[0])
    return dict(
        steps=np.asarray(h_net.steps),
        net=np.asarray(h_net.loss) / L0,
        nqf=np.asarray(h_nqf.loss) / L0,
        horizon=h.t / FIG6_LR,
        floor=h.floor_t / FIG6_LR,
        order=h.order,
    )


def figure_data(*, steps: int = 1000, eval_size: int = 256, every: int = 1, runs: int = 5) -> dict:
    """Fig 6's MLP: for each of `runs` runs (teacher, init and data stream redrawn; the seeds of
    `lvflow figures`' Fig 6), the network and its NQF twin (`lvflow.nqf_twin`) trained by online SGD
    on the same batches from the same init, their losses over `L(0)` on `eval_size` fixed fresh
    samples every `every` steps, and `lvflow.predict`'s validity horizon for the NQF of those samples
    (GD on it at the same lr, ε = width·σ²). Returns the steps, the run-averaged `L/L(0)` of both
    (`net`, `nqf`), the measured departure (the first recorded step at which they differ by ≥ 0.1;
    `departure_stays`: the step from which on they do), and per run the predicted horizon and floor
    steps."""
    import optax

    opt = optax.sgd(FIG6_LR)  # one object: `train` compiles once per optimiser
    per = [_figure_run(r, steps, eval_size, every, opt) for r in range(runs)]
    s = per[0]["steps"]
    net, nqf = np.mean([p["net"] for p in per], axis=0), np.mean([p["nqf"] for p in per], axis=0)
    gap = np.abs(net - nqf)
    below = np.flatnonzero(gap < LEVEL)
    return dict(
        steps=s,
        net=net,
        nqf=nqf,
        departure=int(s[np.argmax(gap >= LEVEL)]) if np.any(gap >= LEVEL) else math.inf,
        departure_stays=int(s[below[-1] + 1]) if below.size and below[-1] + 1 < s.size else math.inf,
        horizons=np.array([p["horizon"] for p in per]),
        floors=np.array([p["floor"] for p in per]),
        order=per[0]["order"],
        eval_size=eval_size,
        runs=runs,
    )


def draw_figure(d: dict, path) -> None:
    """The how-to's figure from `figure_data`: both run-averaged losses against the step (log axes),
    the part beyond the predicted horizon (the runs' mean) shaded as `lvflow predict --plot` does,
    the measured departure dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = d["steps"]
    keep = s > 0
    runs = f"mean of {d['runs']} runs" if d["runs"] > 1 else "one run"
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    ax.plot(s[keep], d["net"][keep], color="C0", lw=1.6, label=f"tanh MLP {FIG6_IN}→{FIG6_WIDTH}→1, online SGD")
    ax.plot(s[keep], d["nqf"][keep], color="C1", lw=1.6, ls="--", label="its NQF twin (same batches)")
    h = float(np.mean(d["horizons"]))
    if math.isfinite(h) and h < s[-1]:
        lo, hi = float(np.min(d["horizons"])), float(np.max(d["horizons"]))
        ax.axvspan(
            h, s[-1], color="0.5", alpha=0.15, lw=0, label=f"beyond predict's validity horizon (step {lo:.0f}–{hi:.0f})"
        )
    if math.isfinite(d["departure"]):
        label = f"measured departure, |ΔL| ≥ 0.1 L(0) (step {d['departure']})"
        ax.axvline(d["departure"], color="k", lw=1.0, ls=":", label=label)
    if math.isfinite(d["departure_stays"]) and d["departure_stays"] != d["departure"]:
        label = f"... and from which on it stays ≥ 0.1 L(0) (step {d['departure_stays']})"
        ax.axvline(d["departure_stays"], color="k", lw=1.0, ls="-.", label=label)
    ax.set_xscale("log")
    ax.set_xlim(s[keep][0], s[-1])
    ax.set_xlabel("training step")
    ax.set_ylabel(f"loss / L(0) on {d['eval_size']} fixed fresh samples ({runs})", fontsize=9)
    ax.set_title("Fig 6's MLP at quick size: predict's horizon and where the network leaves its NQF", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="digits cases on 200 images instead of 500")
    parser.add_argument("--case", action="append", default=None, help="run only the cases containing TEXT")
    parser.add_argument("--figure", default=None, metavar="PATH", help="draw the how-to's figure (Fig 6's MLP) to PATH")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    if args.figure:
        t0 = time.perf_counter()
        d = figure_data()
        draw_figure(d, args.figure)
        print(
            f"{args.figure}: predicted horizon steps {np.round(d['horizons'], 1).tolist()} (order {d['order']}), "
            f"predicted floor steps {np.round(d['floors'], 1).tolist()}, measured departure step {d['departure']} "
            f"(run-averaged L/L(0); stays departed from step {d['departure_stays']}), "
            f"at the end L_net/L(0) {d['net'][-1]:.4f}, L_NQF/L(0) {d['nqf'][-1]:.4f} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
        return
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
