"""Fig 8: deep networks follow a two-layer NQF, not a one-layer one (App. B.4).

A 4-layer tanh MLP 20→32→32→32→4 without bias (`lvflow._training.deep.DeepMLP`) and two-layer 4-head
attention (`DeepAttention`, D = 8, N = 8 tokens) learn a rank-4 low-rank linear teacher
(`low_rank_teacher`, `s = (1, ½, ¼, ⅛)`) by full-batch GD. Beside each: its two-layer NQF
`f = Q₂(φ'(0) Q₁(x))`, `Q_ℓ = Tr[M_ℓ A_ℓ]` (`lvflow._training.deep.DeepNQF`, degree 4 in the weights,
same initial weights), and a one-layer NQF (the twin of a two-layer network of the same width
and init, degree 2). The deep network's saddle escape is algebraic (degree 4), the one-layer
NQF's exponential, so only the two-layer NQF reproduces its loss curve. Summary: the maximum
loss discrepancy `max_t |L_net − L_NQF| / L(0)` of each NQF.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import optax

from . import _style
from ._bilinear import BilinearTwin
from ._bundle import Bundle, bundle_loss

TITLE = "deep networks (4-layer MLP, 2-layer attention) vs 2-layer and 1-layer NQFs"

EPS = 0.1  # attention
EPS_MLP = 0.05
S = (1.0, 0.5, 0.25, 0.125)
N_TOK = 8


def _problems():
    from .. import architectures as arch
    from .._training.deep import DeepAttention, DeepMLP

    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    return {
        # the MLP from a smaller init (tanh's curvature is the departure from the NQF), with a
        # larger rate to keep its slower, degree-4 saddle escape inside the run
        "mlp": dict(
            label="4-layer MLP 20→32→32→32→4",
            deep=DeepMLP(20, (32, 32, 32), 4, key=k1, init_scale=EPS_MLP),
            shallow=arch.MLP(20, 32, 4, key=k2, init_scale=EPS_MLP),
            lr=0.1,
        ),
        "attention": dict(
            label="2-layer 4-head attention",
            seq=N_TOK,
            deep=DeepAttention(8, 4, 4, 4, 4, hidden_size=8, key=k1, init_scale=EPS),
            shallow=arch.MultiHeadAttention(8, 4, 4, 4, 4, key=k2, init_scale=EPS),
            lr=0.5,
        ),
    }


def _run(P: dict, *, m: int, steps: int, every: int) -> dict:
    from .._training.data import low_rank_teacher
    from .._training.deep import DeepNQF
    from .._training.train import train
    from .._training.twin import nqf_twin

    deep, shallow = P["deep"], P["shallow"]
    teacher = low_rank_teacher(shallow, m, s=S, seq_len=P.get("seq"), seed=1)
    ref = nqf_twin(deep, seq_len=P.get("seq"))  # the library's two-layer NQF (checks ZGZ per block)
    two = DeepNQF(blocks=tuple(BilinearTwin(b) for b in deep.blocks), chain=ref.chain, dphi0=ref.dphi0)
    X = teacher.X
    check = float(
        np.max(np.abs(np.asarray(jax.vmap(two)(X[:8]) - jax.vmap(ref)(X[:8]))))
        / np.max(np.abs(np.asarray(jax.vmap(ref)(X[:8]))))
    )
    bundle = Bundle((deep, two, BilinearTwin(shallow)))

    def record(b):
        preds = jax.vmap(b)(X)
        return tuple(teacher.singular_values(p) for p in preds) + tuple(
            ((p - teacher.y) ** 2).sum() / X.shape[0] for p in preds
        )

    h = train(
        bundle,
        teacher,
        optax.sgd(P["lr"]),
        steps,
        record_every=every,
        loss=bundle_loss,
        record=record,
        record_M=False,
        throw=False,
    )
    ex = [np.asarray(e) for e in h.extras]
    s_hat = np.stack(ex[:3], axis=1) / np.asarray(S)  # (n, 3 models, r)
    L = np.stack(ex[3:], axis=1)  # (n, 3)
    return dict(steps=np.asarray(h.steps), s_hat=s_hat, loss=L, twin_check=check)


def make(out: Path, *, quick: bool = False) -> dict:
    probs = _problems()
    steps = {"mlp": 2000, "attention": 1500} if not quick else {"mlp": 400, "attention": 400}
    runs = {name: _run(P, m=128 if quick else 600, steps=steps[name], every=5) for name, P in probs.items()}
    names = ("network", "2-layer NQF", "1-layer NQF")
    cols = _style.mode_colors(len(S))
    with _style.style():
        fig, axs = _style.subplots(2, 2, width=3.5, height=2.6)
        for j, (name, P) in enumerate(probs.items()):
            R = runs[name]
            ax = axs[0, j]
            ax.semilogy(R["steps"], R["loss"][:, 0], color="tab:blue", lw=_style.NETWORK_WIDTH, label=names[0])
            ax.semilogy(R["steps"], R["loss"][:, 1], **_style.THEORY, label=names[1])
            ax.semilogy(R["steps"], R["loss"][:, 2], color="tab:red", ls=":", lw=1.4, label=names[2])
            ax.set(title=P["label"], ylabel="loss (Eq. 26)")
            ax.set_ylim(1e-8, 2 * R["loss"][0].max())  # the NQFs go on down to round-off
            ax.legend(loc="lower left")
            _style.panel_label(ax, "ab"[j])
            ax = axs[1, j]
            for k in range(len(S)):
                ax.plot(R["steps"], R["s_hat"][:, 0, k], color=cols[k], lw=_style.NETWORK_WIDTH)
                ax.plot(R["steps"], R["s_hat"][:, 1, k], color="black", ls="--", lw=0.9)
                ax.plot(R["steps"], R["s_hat"][:, 2, k], color=cols[k], ls=":", lw=1.2)
            ax.set(xlabel="training step (GD)", ylabel=r"$\hat s_k/s_k$", ylim=(-0.1, 1.3))
            ax.plot([], [], color="0.3", lw=_style.NETWORK_WIDTH, label="network")
            ax.plot([], [], color="black", ls="--", lw=0.9, label="2-layer NQF")
            ax.plot([], [], color="0.3", ls=":", label="1-layer NQF")
            ax.legend(loc="lower right")
        _style.save(fig, out, "fig8")

    def disc(R, i):
        L = R["loss"]
        return float(np.max(np.abs(L[:, 0] - L[:, i])) / L[0, 0])

    summary = {
        "figure": "fig8",
        "quick": quick,
        "eps": {"mlp": EPS_MLP, "attention": EPS},
        "s": S,
        "discrepancy_definition": "max over recorded steps of |L_net - L_NQF| / L_net(0)",
        "models": {
            name: {
                "label": P["label"],
                "lr": P["lr"],
                "steps": steps[name],
                "discrepancy_two_layer_nqf": disc(runs[name], 1),
                "discrepancy_one_layer_nqf": disc(runs[name], 2),
                "s_hat_gap_two_layer_nqf": float(np.max(np.abs(runs[name]["s_hat"][:, 0] - runs[name]["s_hat"][:, 1]))),
                "s_hat_gap_one_layer_nqf": float(np.max(np.abs(runs[name]["s_hat"][:, 0] - runs[name]["s_hat"][:, 2]))),
                "final_loss": dict(zip(("network", "two_layer_nqf", "one_layer_nqf"), runs[name]["loss"][-1].tolist())),
                "fast_two_layer_nqf_vs_nqf_twin_rel_err": runs[name]["twin_check"],
            }
            for name, P in probs.items()
        },
    }
    _style.write_summary(out, "fig8", summary)
    return summary
