"""Fig 2: a network and its NQF twin trained side by side, across init, optimiser and architecture.

Each of four architectures of App. C — a tanh MLP 20→64→8 without bias, a one-layer CNN on
5×7 inputs (64 kernels 4×5, stride 1, no padding, global sum pool), a query–key-only attention
layer and 4-head attention (input 20, key size 8, sequence 16, `d_v` = 20), all with 8
outputs — learns a rank-4 NQF teacher (`lvflow._training.data.low_rank_teacher`, singular values
`s = (1, ½, ¼, ⅛)`) from 600 Gaussian samples, full batch. Beside each network its NQF twin
`Tr[Wᵀ A(x) W]` (Thm 1, Eq. 2; `lvflow._training.twin.nqf_twin`) starts from the SAME weights and is
trained by the same optimiser: gradient descent, Polyak momentum 0.9, or Adam, from
`W ~ N(0, σ²)` with σ = 0.01 (small) or 0.2 (large).

The curves are the recovered singular values `ŝ_k(t)/s_k` (`LowRankTeacher.recovered`, read
from each model's outputs alone, so network and NQF are measured the same way): network
solid, NQF dashed. At small init the two coincide (the network is its NQF up to
`O(|w_i|²)` per neuron); at large init they part.

Cost: the 6 runs (3 optimisers × 2 inits) of one architecture share one compiled program. The
network and its twin (`_bilinear.BilinearTwin`) are each evaluated on a stack of 6 neuron arrays
(`jax.vmap`, `_bundle.Stacked`), and `_bundle.sliced` applies optimiser `j` to slices
`j·2, j·2+1` of every stacked array — exact, because GD, momentum and Adam all act entrywise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import _style
from ._bilinear import BilinearTwin
from ._bundle import Bundle, Stacked, bundle_loss, bundle_losses, only_stacked_W, sliced

TITLE = "network vs NQF (ŝ_k/s_k): MLP, CNN, QK-only, 4-head attention × GD/momentum/Adam × σ = 0.01/0.2"

S = (1.0, 0.5, 0.25, 0.125)
SIGMAS = (0.01, 0.2)
OPTIMISERS = ("GD", "momentum", "Adam")
MOMENTUM = 0.9
N_TOKENS = 16
SMALL_INIT_BOUND = 0.05  # the gap the small-init runs must stay under (what Fig 2 shows)


class _Arch(eqx.Module):
    label: str
    build: Callable  # (sigma, key) -> network
    lr_gd: float  # GD learning rate; momentum uses lr_gd (1 − β) (the same effective step)
    lr_adam: float
    steps: int


def _archs() -> dict[str, _Arch]:
    from .. import architectures as arch

    # Rates and steps put all four switch-ons inside the run. The NQF's time scale is set by its
    # features: attention's are weaker (x̄ of 16 tokens; u = Σ_X c), so it gets larger GD rates.
    # The quick run trains on fewer samples (the cost is linear in them), for the same steps.
    return {
        "mlp": _Arch("MLP 20→64→8", lambda s, k: arch.MLP(20, 64, 8, key=k, init_scale=s), 0.02, 5e-4, 1000),
        "cnn": _Arch(
            "CNN 5×7, 64 kernels 4×5",
            lambda s, k: arch.CNN((5, 7), (4, 5), 64, 8, key=k, init_scale=s),
            0.01,
            5e-4,
            700,
        ),
        "qk": _Arch(
            "QK-only attention, 4 heads",
            lambda s, k: arch.QKAttention(20, 8, 4, 8, key=k, init_scale=s),
            0.3,
            5e-4,
            1200,
        ),
        "mha": _Arch(
            "4-head attention",
            lambda s, k: arch.MultiHeadAttention(20, 8, 20, 4, 8, key=k, init_scale=s),
            0.3,
            5e-4,
            800,
        ),
    }


def run_architecture(a: _Arch, *, m: int, records: int, seed: int = 0) -> dict:
    """Train network and NQF twin with the 3 optimisers from the 2 inits: `ŝ/s` of all 12 runs.

    Returns `steps (n,)`, `s_hat_net` and `s_hat_nqf` of shape `(n, 3 optimisers, 2 inits, r)`
    (divided by `s`), `loss_net`, `loss_nqf` `(n, 3, 2)`, and the `gap` `(3, 2)`:
    `max_{t,k} |ŝ_k^net/s_k − ŝ_k^NQF/s_k|`.
    """
    from .._training.data import low_rank_teacher
    from .._training.train import train
    from .._training.twin import nqf_twin

    key = jax.random.PRNGKey(seed)
    net = a.build(SIGMAS[0], key)
    teacher = low_rank_teacher(net, m, s=S, seq_len=N_TOKENS, seed=seed + 1)
    nqf_twin(net, seq_len=N_TOKENS)  # ZGZ check (raises ZGZError if the module is not an NQF)
    twin = BilinearTwin(net)
    # one init per σ, shared by the three optimisers and by network and twin
    W0 = {s: a.build(s, key).W for s in SIGMAS}
    Ws = jnp.stack([W0[s] for _ in OPTIMISERS for s in SIGMAS])  # slice = optimiser × init
    bundle = Bundle((Stacked(net, Ws), Stacked(twin, Ws)))
    opts = {
        "GD": optax.sgd(a.lr_gd),
        "momentum": optax.sgd(a.lr_gd * (1 - MOMENTUM), momentum=MOMENTUM),
        "Adam": optax.adam(a.lr_adam),
    }
    opt = sliced([opts[o] for o in OPTIMISERS], reps=len(SIGMAS))
    X, s = teacher.X, teacher.s

    def record(b):
        outs = jax.vmap(b)(X)  # (m, 6, k) each
        return tuple(teacher.singular_values(jnp.moveaxis(o, 0, 1)) for o in outs) + bundle_losses(b, X, teacher.y)

    every = max(1, a.steps // records)
    h = train(
        bundle,
        teacher,
        opt,
        a.steps,
        record_every=every,
        loss=bundle_loss,
        record=record,
        record_M=False,
        trainable=only_stacked_W(bundle),
        throw=False,
    )
    shape = (-1, len(OPTIMISERS), len(SIGMAS))
    sn, sq, ln, lq = (np.asarray(e) for e in h.extras)
    sn = sn.reshape(shape + (len(S),)) / np.asarray(s)
    sq = sq.reshape(shape + (len(S),)) / np.asarray(s)
    gap = np.max(np.abs(sn - sq), axis=(0, 3))  # NaN if a run diverged: max propagates it
    return dict(
        steps=np.asarray(h.steps),
        s_hat_net=sn,
        s_hat_nqf=sq,
        loss_net=ln.reshape(shape),
        loss_nqf=lq.reshape(shape),
        gap=gap,
    )


def make(out: Path, *, quick: bool = False) -> dict:
    archs = _archs()
    m, records = (128, 40) if quick else (600, 150)
    runs = {name: run_architecture(a, m=m, records=records) for name, a in archs.items()}
    cols = _style.mode_colors(len(S))
    with _style.style():
        fig, axs = _style.subplots(len(OPTIMISERS) * len(SIGMAS), len(archs), width=2.25, height=1.75, sharey=True)
        for i, (name, a) in enumerate(archs.items()):
            R = runs[name]
            for j, o in enumerate(OPTIMISERS):
                for l, sigma in enumerate(SIGMAS):
                    ax = axs[i, j * len(SIGMAS) + l]
                    for k in range(len(S)):
                        ax.plot(R["steps"], R["s_hat_net"][:, j, l, k], color=cols[k], lw=_style.NETWORK_WIDTH)
                        ax.plot(R["steps"], R["s_hat_nqf"][:, j, l, k], color="black", ls="--", lw=0.9)
                    ax.axhline(1.0, color="0.85", lw=0.6, zorder=0)
                    ax.set_ylim(-0.15, 1.45)
                    ax.set_xlim(0, R["steps"][-1])
                    ax.text(
                        0.97,
                        0.05,
                        f"gap {R['gap'][j, l]:.3f}",
                        transform=ax.transAxes,
                        ha="right",
                        va="bottom",
                        fontsize=7,
                        color="tab:red" if R["gap"][j, l] > SMALL_INIT_BOUND else "0.2",
                    )
                    if i == 0:
                        ax.set_title(f"{o}, σ = {sigma:g}")
                    if i == len(archs) - 1:
                        ax.set_xlabel("training step")
                    if j == 0 and l == 0:
                        ax.set_ylabel(f"{a.label}\n$\\hat s_k/s_k$", fontsize=8)
        for k in range(len(S)):
            axs[0, 0].plot([], [], color=cols[k], lw=_style.NETWORK_WIDTH, label=f"network, $s_{k + 1}$ = {S[k]:g}")
        axs[0, 0].plot([], [], color="black", ls="--", lw=0.9, label="NQF twin")
        fig.legend(*axs[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=len(S) + 1)
        _style.save(fig, out, "fig2")

    summary = {
        "figure": "fig2",
        "quick": quick,
        "samples": m,
        "s": S,
        "sigmas": SIGMAS,
        "optimisers": OPTIMISERS,
        "momentum": MOMENTUM,
        "seq_len": N_TOKENS,
        "small_init_bound": SMALL_INIT_BOUND,
        "gap_definition": "max over recorded steps t and modes k of |ŝ_k^net(t)/s_k − ŝ_k^NQF(t)/s_k|",
        "architectures": {
            name: {
                "label": a.label,
                "steps": a.steps,
                "lr_gd": a.lr_gd,
                "lr_momentum": a.lr_gd * (1 - MOMENTUM),
                "lr_adam": a.lr_adam,
                "gap": {
                    f"{o}, sigma={sigma:g}": float(runs[name]["gap"][j, l])
                    for j, o in enumerate(OPTIMISERS)
                    for l, sigma in enumerate(SIGMAS)
                },
                "final_s_hat_over_s_nqf_small_init": {
                    o: runs[name]["s_hat_nqf"][-1, j, 0] for j, o in enumerate(OPTIMISERS)
                },
                "final_loss_network_small_init": {
                    o: float(runs[name]["loss_net"][-1, j, 0]) for j, o in enumerate(OPTIMISERS)
                },
            }
            for name, a in archs.items()
        },
    }
    small = np.array([runs[n]["gap"][:, 0] for n in archs])
    large = np.array([runs[n]["gap"][:, 1] for n in archs])
    summary["max_gap_small_init"] = float(np.max(small))
    summary["min_gap_large_init"] = float(np.nanmin(large))
    summary["small_init_within_bound"] = bool(np.max(small) <= SMALL_INIT_BOUND)
    _style.write_summary(out, "fig2", summary)
    return summary
