"""Fig 7: real data — networks and their NQF twins on odd-vs-even digits.

scikit-learn's bundled 8×8 digits (offline; the paper used 4000 MNIST images), label `+1` odd,
`−1` even (`lvflow._training.data.digits_parity`), split into a training set (full batch) and a held-out
test set. Three networks — a tanh MLP 64→100→1, a one-layer CNN (32 kernels 3×3, global sum
pool) on the 8×8 image, and 4-head attention over the 8 image rows as tokens — and their NQF
twins (Thm 1, Eq. 2; same initial weights, `N(0, ε²)` with ε = 0.01) are trained with Adam,
lr 1e-3, on the paper's loss (Eq. 26). Curves: training loss and test accuracy (sign of the
output) vs step, network solid, NQF dashed.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import _style
from ._bilinear import BilinearTwin, twin_check
from ._bundle import Bundle, bundle_loss

TITLE = "odd vs even digits: MLP, CNN, attention vs their NQF (Adam, lr 1e-3, ε = 0.01)"

EPS = 0.01
LR = 1e-3
N_TRAIN = 1200


def _models():
    from .. import architectures as arch

    key = jax.random.PRNGKey(0)
    return {
        "mlp": ("MLP 64→100→1", "flat", arch.MLP(64, 100, None, key=key, init_scale=EPS)),
        "cnn": ("CNN, 32 kernels 3×3", "image", arch.CNN((8, 8), (3, 3), 32, None, key=key, init_scale=EPS)),
        "mha": (
            "4-head attention (rows as tokens)",
            "sequence",
            arch.MultiHeadAttention(8, 8, 8, 4, None, key=key, init_scale=EPS),
        ),
    }


def _split(layout: str):
    from .._training.data import digits_parity

    D = digits_parity(layout=layout)
    idx = np.random.default_rng(0).permutation(D.X.shape[0])
    tr, te = idx[:N_TRAIN], idx[N_TRAIN:]
    return (D.X[tr], D.y[tr]), (D.X[te], D.y[te])


def _run(net, layout: str, *, steps: int, every: int) -> dict:
    from .._training.train import train
    from .._training.twin import nqf_twin

    (Xtr, ytr), (Xte, yte) = _split(layout)
    nqf_twin(net, x=Xtr[0])  # ZGZ check
    bundle = Bundle((net, BilinearTwin(net)))

    def record(b):
        out = []
        for X, y in ((Xtr, ytr), (Xte, yte)):
            preds = jax.vmap(b)(X)
            out += [
                jnp.stack([jnp.mean((p - y) ** 2) for p in preds]),  # Eq. 26
                jnp.stack([jnp.mean(jnp.sign(p) == y) for p in preds]),
            ]
        return tuple(out)

    h = train(
        bundle,
        (Xtr, ytr),
        optax.adam(LR),
        steps,
        record_every=every,
        loss=bundle_loss,
        record=record,
        record_M=False,
        throw=False,
    )
    Ltr, Atr, Lte, Ate = (np.asarray(e) for e in h.extras)  # each (n, 2): network, NQF
    return dict(
        steps=np.asarray(h.steps),
        loss_train=Ltr,
        acc_train=Atr,
        loss_test=Lte,
        acc_test=Ate,
        twin_check=twin_check(net, Xtr[:16]),
        n_test=int(yte.shape[0]),
    )


def make(out: Path, *, quick: bool = False) -> dict:
    steps = 250 if quick else 2000
    models = _models()
    runs = {name: _run(net, layout, steps=steps, every=5 if quick else 10) for name, (_, layout, net) in models.items()}
    with _style.style():
        fig, axs = _style.subplots(len(models), 2, width=3.1, height=2.3, sharex=True)
        for j, (name, (label, _, _)) in enumerate(models.items()):
            R = runs[name]
            ax = axs[0, j]
            ax.semilogy(
                R["steps"], R["loss_train"][:, 0], color="tab:blue", lw=_style.NETWORK_WIDTH, label="network, train"
            )
            ax.semilogy(R["steps"], R["loss_train"][:, 1], **_style.THEORY, label="NQF, train")
            ax.semilogy(R["steps"], R["loss_test"][:, 0], color="tab:orange", lw=1.2, label="network, test")
            ax.semilogy(R["steps"], R["loss_test"][:, 1], color="tab:orange", ls="--", lw=1.0, label="NQF, test")
            ax.set(title=label, ylabel="loss (Eq. 26)")
            ax.legend(loc="lower left")
            _style.panel_label(ax, "abc"[j])
            ax = axs[1, j]
            ax.plot(R["steps"], R["acc_test"][:, 0], color="tab:orange", lw=_style.NETWORK_WIDTH, label="network")
            ax.plot(R["steps"], R["acc_test"][:, 1], **_style.THEORY, label="NQF")
            ax.set(xlabel="training step (Adam, full batch)", ylabel="test accuracy", ylim=(0.4, 1.0))
            ax.axhline(0.5, color="0.85", lw=0.6, zorder=0)
            ax.legend(loc="lower right")
        _style.save(fig, out, "fig7")

    def gap(R, key):
        L = R[key]
        return float(np.max(np.abs(L[:, 0] - L[:, 1])) / L[0, 0])

    summary = {
        "figure": "fig7",
        "quick": quick,
        "data": "sklearn digits, odd (+1) vs even (-1), standardised pixels",
        "n_train": N_TRAIN,
        "eps": EPS,
        "lr_adam": LR,
        "steps": steps,
        "models": {
            name: {
                "label": label,
                "n_test": runs[name]["n_test"],
                "final_train_loss": {
                    "network": float(runs[name]["loss_train"][-1, 0]),
                    "nqf": float(runs[name]["loss_train"][-1, 1]),
                },
                "final_test_accuracy": {
                    "network": float(runs[name]["acc_test"][-1, 0]),
                    "nqf": float(runs[name]["acc_test"][-1, 1]),
                },
                "max_train_loss_gap_rel_to_initial": gap(runs[name], "loss_train"),
                "max_test_accuracy_gap": float(
                    np.max(np.abs(runs[name]["acc_test"][:, 0] - runs[name]["acc_test"][:, 1]))
                ),
                "twin_vs_nqf_twin_rel_err": runs[name]["twin_check"],
            }
            for name, (label, _, _) in models.items()
        },
    }
    _style.write_summary(out, "fig7", summary)
    return summary
