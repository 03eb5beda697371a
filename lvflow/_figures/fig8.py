"""Fig 8: deep networks against a two-layer and a one-layer NQF (App. B.4).

As App. C: a 4-layer bias-free tanh MLP 8→16→16→16→1 (`lvflow._training.deep.DeepMLP`) and a
2-layer single-head attention model (`DeepAttention`, input and hidden dimension 8, `d_k = d_v =
8`, N = 10 tokens, output 1), each learning a teacher of the same architecture with fixed
Gaussian weights (variance 1/fan-in) from 200 Gaussian training samples (1000 test samples), under three
optimisers (GD, Polyak momentum 0.9, Adam) and two initial *variances* (MLP 0.05 and 0.5,
attention 0.1 and 1). Beside each network:

- its two-layer NQF `f = Q₂(φ(Q₁(x)))`, `Q_ℓ = Tr[M_ℓ A_ℓ]` (`DeepNQF`), from the network's own
  initial weights: each block is replaced by its quadratic form and the network's activation is
  kept between them (Def 2: layer 2's structure matrix reads `φ(h⁽¹⁾)`; attention has none);
- a one-layer NQF (the NQF of a two-layer MLP 8→16→1, or of one attention head), trained on its
  own from weights that match the network at step 0: its map `Θ(0)` is the network's end-to-end
  linear map `(Θ₁Θ₂)(0)` (the linearised two-layer NQF's output at step 0), factored as one balanced neuron.

All three share the learning rate (fixed per model, init and optimiser). Curves: training loss
solid, test loss dashed; network black, two-layer NQF orange, one-layer NQF purple (the paper's
colours). The summary's `claims` check the paper's statement (at small init the dynamics overlap
with the two-layer NQF, not with the one-layer one) for each model and optimiser.
"""

from __future__ import annotations

import math
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array

from .. import architectures as arch
from .._core.errors import LvflowError
from .._training.deep import DeepAttention, DeepMLP, DeepNQF
from .._training.train import train
from .._training.twin import nqf_twin
from ..architectures import MLP
from . import _style
from ._bilinear import BilinearTwin
from ._bundle import Bundle, bundle_loss, outputs, sliced, with_W

TITLE = "deep networks (4-layer MLP, 2-layer attention) vs 2-layer and 1-layer NQFs × GD/momentum/Adam × 2 inits"

VARIANCES = {"mlp": (0.05, 0.5), "attention": (0.1, 1.0)}  # App. C: initial variances, small and large
N_TRAIN, N_TEST = 200, 1000
N_TOK = 10
OPTIMISERS = ("GD", "momentum", "Adam")
MOMENTUM = 0.9
TWO_LAYER_BOUND = 0.10  # "well approximated": max_t |L_net − L_2NQF| ≤ 10 % of L_net(0)
ONE_LAYER_APART = 0.10  # "not by 1-layer NQFs": max_t |L_net − L_1NQF| ≥ 10 % of L_net(0)
MODELS = ("network", "two_layer_nqf", "one_layer_nqf")
COLORS = {"network": "black", "two_layer_nqf": "tab:orange", "one_layer_nqf": "tab:purple"}
LABELS = {"mlp": "4-layer MLP 8→16→16→16→1", "attention": "2-layer attention (1 head, D = 8, N = 10)"}
SHORT = {"mlp": "4-layer MLP", "attention": "2-layer attention"}
# Learning rates (not given by the paper): per model and init, shared by the three optimisers'
# GD step (momentum: lr (1 − β), the same effective step); Adam's per model.
LR_GD = {"mlp": (0.02, 1e-4), "attention": (0.02, 1e-4)}
LR_ADAM = {"mlp": 1e-3, "attention": 1e-3}


#: per model: the deep network at an init scale, the one-block architecture of the matched NQF,
#: one input's shape, and the fan-in of each block's neuron entries (for the teacher's variance)
_DEEP = {
    "mlp": lambda scale, key: DeepMLP(8, (16, 16, 16), None, key=key, init_scale=scale),
    "attention": lambda scale, key: DeepAttention(8, 8, 8, 1, None, hidden_size=8, key=key, init_scale=scale),
}
_SHALLOW = {
    "mlp": lambda key: arch.MLP(8, 16, None, key=key, init_scale=0.0),
    "attention": lambda key: arch.MultiHeadAttention(8, 8, 8, 1, None, key=key, init_scale=0.0),
}
INPUT_SHAPE = {"mlp": (8,), "attention": (8, N_TOK)}
_FAN_IN = {
    # block 1: [row of W₁ (fan-in 8), column of W₂ (16)]; block 2: [W₃ (16), W₄ (16)]
    "mlp": lambda deep: (np.r_[np.full(8, 8.0), np.full(16, 16.0)], np.full(17, 16.0)),
    # every matrix of both heads reads a vector of size 8 (D = d_v = hidden = 8)
    "attention": lambda deep: tuple(np.full(b.W.shape[0], 8.0) for b in deep.blocks),
}


def _arch(name: str, variance: float, key):
    return _DEEP[name](math.sqrt(variance), key)


def _shallow(name: str):
    return _SHALLOW[name](jax.random.PRNGKey(0))


def teacher(name: str, seed: int = 0):
    """A teacher of the same architecture with fixed Gaussian weights, each of variance
    1/fan-in (LeCun scale: pre-activations and outputs O(1))."""
    t = _arch(name, 1.0, jax.random.PRNGKey(1000 + seed))
    for i, f in enumerate(_FAN_IN[name](t)):
        t = eqx.tree_at(lambda m, i=i: m.blocks[i].W, t, t.blocks[i].W / np.sqrt(f)[:, None])
    return t


def data(name: str, *, n_train: int = N_TRAIN, n_test: int = N_TEST, seed: int = 0):
    """Gaussian inputs labelled by `teacher(name)`: `((X_train, y_train), (X_test, y_test))`."""
    t = teacher(name, seed)
    shape = INPUT_SHAPE[name]
    rng = np.random.default_rng(seed)
    X = jnp.asarray(rng.standard_normal((n_train + n_test,) + shape))
    y = outputs(t, X)
    return (X[:n_train], y[:n_train]), (X[n_train:], y[n_train:])


def link_activation(deep):
    """The map the two-layer NQF keeps between the blocks (Def 2: block 2's `A` reads `φ(h)`):
    the MLP's activation; `None` (the identity, `φ'(0) = 1`) for attention."""
    return deep.activation if isinstance(deep, DeepMLP) else None


def two_layer_nqf(deep, X, *, keep_activation: bool = True):
    """The two-layer NQF of `deep` through its blocks' learned maps (`BilinearTwin`), and its
    relative deviation on `X` from the same composition of the blocks' closed-form quadratic
    forms `Tr[Wᵀ A(x) W]` (`NQFModel(method="structure")`). With `keep_activation` (Fig 8) the
    blocks are joined by the network's `φ` (Def 2), else by `φ'(0)·h` (what `lvflow.nqf_twin`
    builds)."""
    act = link_activation(deep) if keep_activation else None
    b1, b2 = deep.blocks
    two = DeepNQF(blocks=(BilinearTwin(b1), BilinearTwin(b2)), chain=deep.chain, dphi0=deep.link_slope, activation=act)
    linear = nqf_twin(deep, method="structure")  # the blocks' NQFModel(method="structure"), linearised link
    if not isinstance(linear, DeepNQF):
        raise LvflowError(f"deep: a {type(deep).__name__} is not a deep model")
    ref = DeepNQF(
        blocks=linear.blocks,
        chain=deep.chain,
        dphi0=deep.link_slope,
        activation=act,
    )
    a, b = outputs(two, X), outputs(ref, X)
    return two, float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def matched_one_layer(name: str, deep, X):
    """The one-layer NQF whose output at step 0 is the network's end-to-end linear map (its
    leading term `φ'(0)³ W₄W₃W₂W₁x`, or `Θ₁Θ₂` for attention: the linearised two-layer NQF's
    output): `Θ(0)` fitted by least squares on the features `ψ(x)` (exact: both are linear in
    `ψ`), factored as one balanced neuron `[Θ/√|Θ|, √|Θ|]`. Returns the twin and the relative
    mismatch at step 0 on `X` against that linear map."""
    shallow = _shallow(name)
    linear, _ = two_layer_nqf(deep, X[:1], keep_activation=False)
    psi = np.asarray(jax.vmap(shallow.shared_features)(X))  # (m, n): φ'(0) x, or x̄
    target = np.asarray(outputs(linear, X))
    theta = np.linalg.lstsq(psi, target, rcond=None)[0]
    norm = float(np.linalg.norm(theta))
    W = np.zeros(shallow.W.shape)
    if isinstance(shallow, arch.MLP):
        W[: theta.size, 0], W[theta.size, 0] = theta / math.sqrt(norm), math.sqrt(norm)
    else:  # one head [Wᑫ, Wᴷ, Wᴠ (d_v×D), v (d_v)]: row 0 of Wᴠ and v_0, so Θ = Wᴠᵀ v = θ
        start = 2 * shallow.key_size * shallow.in_size
        W[start : start + theta.size, 0] = theta / math.sqrt(norm)
        W[start + shallow.value_size * shallow.in_size, 0] = math.sqrt(norm)
    one = BilinearTwin(with_W(shallow, jnp.asarray(W)))
    out = np.asarray(outputs(one, X))
    return one, float(np.max(np.abs(out - target)) / np.max(np.abs(target)))


def initial_offset(deep, two, X) -> dict:
    """Where the network and its two-layer NQF part at step 0: the relative output difference
    `‖f_net − f_NQF‖ / ‖f_net‖` on `X`, block 1's alone (`‖h_net − Q₁‖ / ‖h_net‖`), and the RMS
    pre-activation of the network's first layer (`W₁x`; tanh is within 5 % of linear only for
    `|u| ≲ 0.39`)."""
    f_net, f_two = outputs(deep, X), outputs(two, X)
    h_net = jax.vmap(lambda x: deep.chain(deep.blocks[0], x))(X)
    h_two = jax.vmap(lambda x: deep.chain(two.blocks[0], x))(X)
    out = {
        "output_rel_diff": float(jnp.linalg.norm(f_net - f_two) / jnp.linalg.norm(f_net)),
        "block1_rel_diff": float(jnp.linalg.norm(h_net - h_two) / jnp.linalg.norm(h_net)),
    }
    b = deep.blocks[0]
    if isinstance(b, MLP):  # neuron i = [row i of W₁, column i of W₂]
        u = X @ b.W[: b.in_size]
        out["rms_first_preactivation"] = float(jnp.sqrt(jnp.mean(u**2)))
    return out


class _Copies(eqx.Module):
    """The bundle's copies, one per optimiser, stacked on axis 0 of every array and evaluated with
    `jax.vmap`: the six models are traced once instead of eighteen times. Output: the tuple of
    the models' outputs, each with the copies on axis 0."""

    bundle: Bundle

    def __call__(self, x):
        arrays, static = eqx.partition(self.bundle, eqx.is_array)
        return jax.vmap(lambda a: eqx.combine(a, static)(x))(arrays)


class _Losses(eqx.Module):
    """Each copy's models' training and test loss (Eq. 26): `(2, copies · models)`, copy-major."""

    Xtr: Array
    ytr: Array
    Xte: Array
    yte: Array

    def __call__(self, copies):
        out = []
        for X, y in ((self.Xtr, self.ytr), (self.Xte, self.yte)):
            preds = jax.vmap(copies)(X)  # (m, copies, *k) each
            yb = y.reshape(y.shape[:1] + (1,) + y.shape[1:])
            per = [jnp.mean((p - yb) ** 2, axis=tuple(a for a in range(p.ndim) if a != 1)) for p in preds]
            out.append(jnp.stack(per, axis=1).reshape(-1))  # (copies · models)
        return jnp.stack(out)


def _optimiser(name: str) -> optax.GradientTransformation:
    """One optimiser for the stacked copies of every run of a model: copy `j` is optimiser `j`'s
    (`_bundle.sliced`, exact for entrywise optimisers), and within a copy the first three models
    run at the small-init rate, the others at the large-init rate (`optax.multi_transform`,
    exact: no parameter is shared)."""

    one = {
        "GD": lambda lr_gd: optax.sgd(lr_gd),
        "momentum": lambda lr_gd: optax.sgd(lr_gd * (1 - MOMENTUM), momentum=MOMENTUM),
        "Adam": lambda lr_gd: optax.adam(LR_ADAM[name]),
    }

    def labels(params):
        models = params.bundle.models
        tagged = tuple(jax.tree_util.tree_map(lambda _, i=i: i // len(MODELS), m) for i, m in enumerate(models))
        return _Copies(Bundle(tagged))

    per_optimiser = [
        optax.multi_transform({v: one[o](LR_GD[name][v]) for v in range(len(VARIANCES[name]))}, labels)
        for o in OPTIMISERS
    ]
    return sliced(per_optimiser, reps=1)


def run_model(name: str, *, steps: int, every: int, n_train: int = N_TRAIN, n_test: int = N_TEST) -> dict:
    """Train network, two-layer and one-layer NQF from both inits under the three optimisers.

    Returns `steps`, `loss` `(n, optimisers, inits, 2 (train, test), 3 models)` and the checks.
    """
    (Xtr, ytr), (Xte, yte) = data(name, n_train=n_train, n_test=n_test)
    models, checks, offsets = [], {}, {}
    for v, var in enumerate(VARIANCES[name]):
        deep = _arch(name, var, jax.random.PRNGKey(v))
        two, checks[f"two_layer_nqf_vs_nqf_twin var={var:g}"] = two_layer_nqf(deep, Xtr[:8])
        one, checks[f"one_layer_match_at_step0 var={var:g}"] = matched_one_layer(name, deep, Xtr)
        offsets[f"variance={var:g}"] = initial_offset(deep, two, Xtr)
        models += [deep, two, one]
    # copy j (optimiser j) of the six models: every array stacked on a leading axis
    arrays, static = eqx.partition(Bundle(tuple(models)), eqx.is_array)
    arrays = jax.tree_util.tree_map(lambda a: jnp.stack([a] * len(OPTIMISERS)), arrays)
    copies = _Copies(eqx.combine(arrays, static))
    h = train(
        copies,
        (Xtr, ytr),
        _optimiser(name),
        steps,
        record_every=every,
        loss=bundle_loss,
        record=_Losses(Xtr, ytr, Xte, yte),
        record_M=False,
        throw=False,
    )
    L = np.asarray(h.extras)  # (n, 2, optimisers · inits · models)
    L = L.reshape(L.shape[0], 2, len(OPTIMISERS), len(VARIANCES[name]), len(MODELS)).transpose(0, 2, 3, 1, 4)
    return dict(steps=np.asarray(h.steps), loss=L, checks=checks, offsets=offsets)


def make(out: Path, *, quick: bool = False) -> dict:
    steps, every = (200, 10) if quick else (2000, 10)
    n_train, n_test = (N_TRAIN, 200) if quick else (N_TRAIN, N_TEST)
    runs = {name: run_model(name, steps=steps, every=every, n_train=n_train, n_test=n_test) for name in VARIANCES}
    _draw(out, runs)

    def gap(R, o, v, which, i):  # max_t |L_net − L_i| / L_net(0), train (0) or test (1)
        L = R["loss"][:, o, v, which]
        return float(np.max(np.abs(L[:, 0] - L[:, i])) / L[0, 0])

    claims, models = [], {}
    for name, R in runs.items():
        g2 = {o: gap(R, j, 0, 0, 1) for j, o in enumerate(OPTIMISERS)}
        g2t = {o: gap(R, j, 0, 1, 1) for j, o in enumerate(OPTIMISERS)}
        g1 = {o: gap(R, j, 0, 0, 2) for j, o in enumerate(OPTIMISERS)}
        off = R["offsets"][f"variance={VARIANCES[name][0]:g}"]
        L0 = R["loss"][0, 0, 0, 0]
        step0 = float(abs(L0[0] - L0[1]) / L0[0])  # the gap's value at step 0 (the same for every optimiser)
        ok = max(g2.values()) <= TWO_LAYER_BOUND
        claims.append(
            _style.claim(
                f"{LABELS[name]}: under small init (variance {VARIANCES[name][0]:g}) the training dynamics are well "
                "approximated by the 2-layer NQF",
                ok,
                f"max over steps of |L_net − L_2NQF| ≤ {TWO_LAYER_BOUND:.0%} of L_net(0) (training loss), every "
                "optimiser (the bound is ours)",
                verdict=f"{'holds' if ok else 'fails'} at our {TWO_LAYER_BOUND:.0%} bound (max gap "
                f"{max(g2.values()):.3f}, of which {step0:.3f} at step 0); holds for any bound ≥ "
                f"{max(g2.values()):.3f}",
                train_gap=g2,
                test_gap=g2t,
                holds_per_optimiser={o: g <= TWO_LAYER_BOUND for o, g in g2.items()},
                gap_at_step0=step0,
                output_rel_diff_at_step0=off["output_rel_diff"],
            )
        )
        claims.append(
            _style.claim(
                f"{LABELS[name]}: ... but not by the 1-layer NQF",
                min(g1.values()) >= ONE_LAYER_APART,
                f"max over steps of |L_net − L_1NQF| ≥ {ONE_LAYER_APART:.0%} of L_net(0), every optimiser (the "
                "bound is ours)",
                verdict=f"{'holds' if min(g1.values()) >= ONE_LAYER_APART else 'fails'} at our "
                f"{ONE_LAYER_APART:.0%} bound (min gap {min(g1.values()):.3f}); holds for any bound ≤ "
                f"{min(g1.values()):.3f}",
                train_gap=g1,
                holds_per_optimiser={o: g >= ONE_LAYER_APART for o, g in g1.items()},
            )
        )
        models[name] = {
            "label": LABELS[name],
            "variances": VARIANCES[name],
            "init_std": [math.sqrt(v) for v in VARIANCES[name]],
            "lr_gd": LR_GD[name],
            "lr_momentum": [lr * (1 - MOMENTUM) for lr in LR_GD[name]],
            "lr_adam": LR_ADAM[name],
            "steps": steps,
            "gap_rel_to_initial_loss": {
                f"{o}, variance={var:g}": {
                    f"{which}_{m}": gap(R, j, v, w, i)
                    for w, which in enumerate(("train", "test"))
                    for i, m in ((1, "two_layer_nqf"), (2, "one_layer_nqf"))
                }
                for j, o in enumerate(OPTIMISERS)
                for v, var in enumerate(VARIANCES[name])
            },
            "final_train_loss": {
                f"{o}, variance={var:g}": dict(zip(MODELS, R["loss"][-1, j, v, 0].tolist()))
                for j, o in enumerate(OPTIMISERS)
                for v, var in enumerate(VARIANCES[name])
            },
            "initial_train_loss": {
                f"variance={var:g}": dict(zip(MODELS, R["loss"][0, 0, v, 0].tolist()))
                for v, var in enumerate(VARIANCES[name])
            },
            "checks": R["checks"],
            "offset_at_step0": R["offsets"],
        }
    summary = {
        "figure": "fig8",
        "quick": quick,
        "n_train": n_train,
        "n_test": n_test,
        "seq_len": N_TOK,
        "optimisers": OPTIMISERS,
        "momentum": MOMENTUM,
        "gap_definition": "max over recorded steps of |L_net − L_NQF| / L_net(0), on the training (or test) set",
        "claims": claims,
        "choices": {
            "teacher": "the same architecture with Gaussian weights of variance 1/fan-in (the paper: 'fixed Gaussian "
            "weights', variance not given; with N(0, 1) weights the attention teacher's outputs are O(50))",
            "attention_sizes": "d_k = d_v = 8 (the paper gives input and hidden dimension 8)",
            "learning_rates_and_steps": "not given by the paper; listed per model",
            "one_layer_match": "Θ(0) of the 1-layer NQF = the network's end-to-end linear map at step 0 (its "
            "leading term φ'(0)³ W₄W₃W₂W₁x, or Θ₁Θ₂ for attention), one balanced neuron; the other neurons start "
            "at 0",
            "two_layer_link": "the 2-layer NQF keeps the network's activation between the blocks, "
            "f = Q₂(φ(Q₁(x))) (Def 2: layer 2's structure matrix reads φ(h⁽¹⁾)); linearising it to φ'(0)·h, "
            "as lvflow.nqf_twin does, makes the MLP's 2-layer NQF a linear map of x, the function class of the "
            "1-layer NQF (attention has no activation between blocks: the same model either way)",
        },
        "models": models,
    }
    _style.write_summary(out, "fig8", summary)
    return summary


def _draw(out: Path, runs: dict) -> None:
    names = {"network": "network", "two_layer_nqf": "2-layer NQF", "one_layer_nqf": "1-layer NQF"}
    ncol = len(OPTIMISERS) * 2
    with _style.style():
        fig, axs = _style.subplots(ncol, len(runs), width=1.85, height=1.7)
        for r, (name, R) in enumerate(runs.items()):
            s = R["steps"]
            for j, o in enumerate(OPTIMISERS):
                for v, var in enumerate(VARIANCES[name]):
                    ax = axs[r, v * len(OPTIMISERS) + j]
                    L = R["loss"][:, j, v]
                    for i, m in enumerate(MODELS):
                        lw = _style.NETWORK_WIDTH if m == "network" else 1.2
                        ax.semilogy(s, L[:, 0, i], color=COLORS[m], lw=lw)
                        ax.semilogy(s, L[:, 1, i], color=COLORS[m], lw=0.9, ls="--")
                    ax.set_xlim(0, s[-1])
                    ax.tick_params(labelsize=6.5)
                    if r == 0:
                        ax.set_title(f"{o}, var {var:g}", fontsize=7.5)
                    else:
                        ax.set_title(f"var {var:g}", fontsize=7.5)
                    if j == 0 and v == 0:
                        ax.set_ylabel(f"{SHORT[name]}\nloss", fontsize=7.5)
                    if r == len(runs) - 1:
                        ax.set_xlabel("step", fontsize=7.5)
        for m in MODELS:
            axs[0, 0].plot([], [], color=COLORS[m], lw=1.5, label=names[m])
        axs[0, 0].plot([], [], color="0.4", lw=1.2, label="train")
        axs[0, 0].plot([], [], color="0.4", lw=1.0, ls="--", label="test")
        fig.legend(*axs[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=5)
        _style.save(fig, out, "fig8")
