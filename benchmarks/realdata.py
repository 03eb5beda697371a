"""Row 9: `lvflow.predict` on real data against the real networks trained by gradient descent.

For each architecture (MLP, CNN, multi-head attention, query–key attention) on scikit-learn's
8×8 digits (odd/even, a scalar output; one-hot classes, 10 outputs) and for a synthetic
low-rank teacher, at init σ = 1e-3 and learning rate η = 0.01:

- the NQF is the architecture's factored form on the data (`model.factors(X)`, Eq. 17) and the
  prediction is `lvflow.predict(nqf, init_std=σ, width=d, learning_rate=η)` — GD's exact map of
  `M` (Thm 2) from `M0 = d σ² I` to convergence and its drop table (`matrix_drops`), or the M-flow
  (Eq. 28) where GD on the quadratic form diverges (the row's `method` says which);
- the real network (tanh MLP / CNN, softmax attention: nonlinear) is trained by full-batch GD on
  the paper's loss `(1/m) Σ_μ |f(x_μ) − y_μ|²` (Eq. 26), `W ~ N(0, σ²)`, 5 seeds, for the
  number of steps the prediction covers (`t_end/η`), in one `jax.lax.scan` written here;
- drop steps are read off both sides with one definition (below), and the full-curve gap is
  `max_step |L_pred − L_real| / L(0)` over that horizon.

**Drop definitions** (the same code reads both sides' curves):

- *first drop*, any output: the first step the loss is halfway between its value at step 0 and
  at the horizon (what one reads off a training curve);
- *every drop*, vector outputs: a drop is a direction `u_i` of `M = W Wᵀ` that grows, read as
  `matrix_drops` reads the M-flow: the eigenvectors of `M` at the horizon whose eigenvalue
  `λ_i` grew at least 100-fold from `d σ²`; direction `i` switches on at the first step its
  strength `s_i(t) = u_iᵀ M(t) u_i = |W(t)ᵀ u_i|²` reaches `λ_i/2` (Thm 8 with ρ = ½); drops are
  compared in switch-on order. For balanced layers (`u ≈ (a, b)/√2`) `s_i ≈ 2 σ_i(Θ)`, so this is
  "the singular value `σ_i` of the learned map reaches half its final value", without having to
  pair sorted singular values across time. On the real network `s_i` is computed from the
  recorded `W(t)` with the real network's own `u_i` (not the prediction's).
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._harness import Row, best_of
from .config import Config

NAME = "realdata"
SIGMA = 1e-3
LR = 0.01
SEEDS = 5
RHO = 0.5
GROW = 100.0  # a direction "grew" when its eigenvalue is ≥ GROW × d σ² (as matrix_drops)


# ---------------------------------------------------------------------------------------------
# data


def digits(layout: str = "flat", m: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(X, parity, one_hot)`: `lvflow.digits_parity`'s inputs and labels (±1), and the one-hot
    classes of the same digits `(m, 10)` (scikit-learn's bundled copy, standardised per pixel)."""
    from sklearn.datasets import load_digits

    import lvflow

    ds = lvflow.digits_parity(layout=layout, m=m, seed=seed)
    target = load_digits().target
    if m is not None:
        target = target[np.random.default_rng(seed).permutation(target.shape[0])[:m]]
    parity = np.where(target % 2 == 1, 1.0, -1.0)
    if not np.array_equal(parity, np.asarray(ds.y)):  # the same digits in the same order
        raise RuntimeError("digits: the classes do not match lvflow.digits_parity's labels")
    return np.asarray(ds.X), parity, np.eye(10)[target]


# ---------------------------------------------------------------------------------------------
# the cases


@dataclasses.dataclass
class Case:
    """One network on one dataset: `build(key)` gives the real network at init (W ~ N(0, σ²));
    `f0(model, X)` its output at `W = 0` (QK attention's centred heads), else None."""

    name: str
    build: Callable[[Any], Any]
    X: np.ndarray
    y: np.ndarray
    width: int
    input_shape: tuple[int, ...] | None = None
    f0: Callable[[Any, Any], Any] | None = None

    @property
    def vector(self) -> bool:
        return self.y.ndim == 2


def cases(*, smoke: bool = False) -> list[Case]:
    import lvflow
    from lvflow import architectures as A

    m = 300 if smoke else None
    width = 16 if smoke else 64
    out: list[Case] = []
    X, par, hot = digits("flat", m)
    for lab, y, k in (("odd/even", par, None), ("one-hot", hot, 10)):
        out.append(
            Case(
                f"MLP 64→{width}→{k or 1}, digits {lab}",
                lambda key, k=k: A.MLP(64, width, k, key=key, init_scale=SIGMA),
                X,
                y,
                width,
                (64,),
            )
        )
    Xi, par, hot = digits("image", m)
    ch = 16
    for lab, y, k in (("odd/even", par, None), ("one-hot", hot, 10)):
        out.append(
            Case(
                f"CNN 3×3, {ch} channels, digits {lab}",
                lambda key, k=k: A.CNN((8, 8), (3, 3), ch, k, key=key, init_scale=SIGMA),
                Xi,
                y,
                ch,
                (3, 3),
            )
        )
    Xs, par, hot = digits("sequence", m)
    heads = 32
    for lab, y, k in (("odd/even", par, None), ("one-hot", hot, 10)):
        out.append(
            Case(
                f"multi-head attention, {heads} heads d_k = d_v = 4, digits {lab}",
                lambda key, k=k: A.MultiHeadAttention(8, 4, 4, heads, k, key=key, init_scale=SIGMA),
                Xs,
                y,
                heads,
            )
        )
    for lab, y, k in (("odd/even", par, None), ("one-hot", hot, 10)):
        c = np.asarray(jax.random.normal(jax.random.PRNGKey(123), (8,) if k is None else (8, k))) / math.sqrt(8)
        out.append(
            Case(
                f"QK attention, {heads} heads d_k = 4, digits {lab}",
                lambda key, k=k, c=c: A.QKAttention(8, 4, heads, k, readout=c, key=key, init_scale=SIGMA),
                Xs,
                y,
                heads,
                None,
                lambda model, X: jax.vmap(model.f0)(X),
            )
        )
    teacher_model = A.MLP(20, width, 8, key=jax.random.PRNGKey(0), init_scale=SIGMA)
    n_teacher = 200 if smoke else 600
    t = lvflow.low_rank_teacher(teacher_model, n_teacher, s=(1.0, 0.5, 0.25, 0.125), seed=0)
    out.append(
        Case(
            f"MLP 20→{width}→8, rank-4 teacher s = (1, ½, ¼, ⅛), {n_teacher} Gaussian inputs",
            lambda key: A.MLP(20, width, 8, key=key, init_scale=SIGMA),
            np.asarray(t.X),
            np.asarray(t.y),
            width,
            (20,),
        )
    )
    # the CNN's learned map acts on the sum of its 36 patches (variance 36 per entry): s/36 gives
    # the MLP teacher's curvature (at s = (1, ½, ¼, ⅛) the real tanh CNN's GD diverges at η = 0.01)
    cnn_teacher = A.CNN((8, 8), (3, 3), ch, 4, key=jax.random.PRNGKey(0), init_scale=SIGMA)
    t = lvflow.low_rank_teacher(cnn_teacher, n_teacher, s=np.array([1.0, 0.5, 0.25, 0.125]) / 36, seed=0)
    out.append(
        Case(
            f"CNN 3×3, {ch} channels → 4, rank-4 teacher s = (1, ½, ¼, ⅛)/36, {n_teacher} Gaussian 8×8 images",
            lambda key: A.CNN((8, 8), (3, 3), ch, 4, key=key, init_scale=SIGMA),
            np.asarray(t.X),
            np.asarray(t.y),
            ch,
            (3, 3),
        )
    )
    return out


def case_nqf(case: Case):
    """The factored NQF (Eq. 17) of the case's architecture on its data, with `f0` for QK attention."""
    import lvflow

    model = case.build(jax.random.PRNGKey(0))
    X = jnp.asarray(case.X)
    features, basis = model.factors(X)
    f0 = None if case.f0 is None else np.asarray(case.f0(model, X))
    return lvflow.NQF(features=features, basis=basis, y=case.y, f0=f0)


# ---------------------------------------------------------------------------------------------
# gradient descent on the real network


def gd_runner(case: Case, steps: int, every: int):
    """A compiled full-batch GD loop for `case`: `run(W0) -> (loss (steps+1,), Ws (steps//every+1, p, d))`,
    the loss (Eq. 26) at every step 0..steps and `W` every `every` steps."""
    template = case.build(jax.random.PRNGKey(0))
    X, y = jnp.asarray(case.X), jnp.asarray(case.y)
    f0 = 0.0 if case.f0 is None else case.f0(template, X)
    m = y.shape[0]
    n_rec = steps // every

    def loss(W):
        model = eqx.tree_at(lambda mdl: mdl.W, template, W)
        return jnp.sum((jax.vmap(model)(X) + f0 - y) ** 2) / m

    grad = jax.value_and_grad(loss)

    def step(W, _):
        value, g = grad(W)
        return W - LR * g, value

    def block(W, _):
        W, losses = jax.lax.scan(step, W, None, length=every)
        return W, (losses, W)

    @jax.jit
    def run(W0):
        W, (losses, Ws) = jax.lax.scan(block, W0, None, length=n_rec)
        rest, tail = jax.lax.scan(step, W, None, length=steps - n_rec * every)
        last = loss(rest)
        L = jnp.concatenate([losses.reshape(-1), tail, last[None]])
        return L, jnp.concatenate([W0[None], Ws]), rest

    return run


# ---------------------------------------------------------------------------------------------
# drops, one definition for both sides


def crossing(steps: np.ndarray, values: np.ndarray, level: float, *, down: bool) -> float:
    """The first step `values` reaches `level` (falling to it if `down`, else rising), linear
    interpolation between samples; inf if never."""
    hit = np.flatnonzero(values <= level if down else values >= level)
    if hit.size == 0:
        return math.inf
    j = int(hit[0])
    if j == 0:
        return float(steps[0])
    w = (values[j - 1] - level) / (values[j - 1] - values[j])
    return float(steps[j - 1] + w * (steps[j] - steps[j - 1]))


def first_drop(steps: np.ndarray, loss: np.ndarray, level: float | None = None) -> float:
    """The first step the loss is halfway between `loss[0]` and `loss[-1]` (or reaches `level`)."""
    return crossing(steps, loss, 0.5 * (loss[0] + loss[-1]) if level is None else level, down=True)


def strength_drops(
    steps: np.ndarray, Ws: np.ndarray, eps: float, directions: np.ndarray | None = None, levels=None
) -> np.ndarray:
    """Switch-on steps of the directions of `M = W Wᵀ` that grew (see the module docstring).

    Own definition (default): the eigenvectors `u_i` of `M` at the last record with eigenvalue
    `λ_i ≥ 100 d σ²`, each at the step `|W(t)ᵀ u_i|²` reaches `λ_i/2`, sorted. With `directions`
    (rows) and `levels`: the step `|W(t)ᵀ u_i|²` reaches `levels[i]`, in the order given.
    """
    if directions is None:
        lam, U = np.linalg.eigh(Ws[-1] @ Ws[-1].T)
        grew = lam >= GROW * eps
        U, levels = U[:, grew], RHO * lam[grew]
    else:
        U = np.asarray(directions).T
    s = np.sum(np.einsum("pi,tpd->tid", U, Ws) ** 2, axis=-1)  # (T, n): |W(t)ᵀ u_i|²
    out = np.array([crossing(steps, s[:, i], levels[i], down=False) for i in range(U.shape[1])])
    return np.sort(out) if directions is None else out


# ---------------------------------------------------------------------------------------------
# one case


def _summary(pred: np.ndarray, real: np.ndarray) -> dict:
    """Predicted steps `(n,)` against the seeds' `(seeds, n)`: mean, half-range, error (%)."""
    if pred.size == 0:
        return {"pred": [], "real_mean": [], "real_half_range_pct": [], "err_pct": [], "met": False}
    mean, half = real.mean(0), (real.max(0) - real.min(0)) / 2
    err = 100.0 * (pred / mean - 1.0)
    spread = 100.0 * half / mean
    return {
        "pred": pred.tolist(),
        "real_mean": mean.tolist(),
        "real_half_range_pct": spread.tolist(),
        "err_pct": err.tolist(),
        "met": bool(np.all(np.abs(err) <= np.maximum(10.0, spread))) if pred.size else False,
    }


def run_case(case: Case, cfg: Config) -> Row:
    """Predict, train 5 seeds for the prediction's horizon, compare; one `Row`."""
    import lvflow

    t0 = time.perf_counter()
    nqf = case_nqf(case)
    t_nqf = time.perf_counter() - t0

    def pred():
        return lvflow.predict(nqf, init_std=SIGMA, width=case.width, learning_rate=LR, input_shape=case.input_shape)

    t0 = time.perf_counter()
    p = pred()
    t_first = time.perf_counter() - t0
    t_pred, all_pred, p = best_of(pred, cfg.repeats)
    d = p.matrix
    horizon = int(math.ceil(d.t_end / LR))
    every = max(1, horizon // 400)
    eps = case.width * SIGMA**2
    steps = np.arange(horizon + 1)
    L_pred = np.interp(steps * LR, np.asarray(d.ts), np.asarray(d.loss))
    first_pred = first_drop(steps, L_pred)
    level_pred = 0.5 * (L_pred[0] + L_pred[-1])
    pred_drops = np.asarray(d.t_star) / LR
    pred_dirs, pred_levels = np.asarray(d.directions), RHO * np.asarray(d.strength)

    run_gd = gd_runner(case, horizon, every)
    rec = np.arange(0, (horizon // every) * every + 1, every)
    rec = rec if rec[-1] == horizon else np.append(rec, horizon)
    losses, own, at_pred, first_own, first_at = [], [], [], [], []
    for seed in range(2 if cfg.smoke else SEEDS):
        L, Ws, W_end = run_gd(case.build(jax.random.PRNGKey(seed)).W)
        L, Ws = np.asarray(L), np.asarray(Ws)
        if not np.all(np.isfinite(L)):
            bad = int(np.argmin(np.isfinite(L)))
            raise RuntimeError(f"{case.name}: the real network's GD diverged (seed {seed}, by step {bad})")
        if Ws.shape[0] < rec.size:
            Ws = np.concatenate([Ws, np.asarray(W_end)[None]])
        losses.append(L)
        first_own.append(first_drop(steps, L))
        first_at.append(first_drop(steps, L, level_pred))
        own.append(strength_drops(rec, Ws, eps))
        at_pred.append(strength_drops(rec, Ws, eps, pred_dirs, pred_levels))
    W0 = case.build(jax.random.PRNGKey(0)).W
    t_train, all_train, _ = best_of(lambda: run_gd(W0), cfg.repeats)
    losses = np.stack(losses)

    first = _summary(np.array([first_pred]), np.array(first_own)[:, None])
    first_b = _summary(np.array([first_pred]), np.array(first_at)[:, None])
    first["met"] = bool(abs(first["err_pct"][0]) <= max(5.0, first["real_half_range_pct"][0]))
    first_b["met"] = bool(abs(first_b["err_pct"][0]) <= max(5.0, first_b["real_half_range_pct"][0]))
    n_own = [int(x.size) for x in own]
    n = min([pred_drops.size] + n_own)
    drops_own = _summary(pred_drops[:n], np.stack([x[:n] for x in own]))
    drops_at = _summary(pred_drops, np.stack(at_pred))
    diff = np.abs(L_pred - losses.mean(0)) / losses[:, 0].mean()
    gap, gap_at = float(np.max(diff)), int(np.argmax(diff))
    # the same gap over the drops only: up to 1.5× the last predicted switch-on (before any late
    # departure from the quadratic form)
    span = min(horizon, int(math.ceil(1.5 * float(np.max(pred_drops, initial=first_pred)))))
    gap_drops = float(np.max(diff[: span + 1]))
    # GD's lag behind the flow on the fastest direction (what the GD map accounts for, and what a
    # flow prediction misses): W grows by (1 + ηλ) per step against e^{ηλ}, λ = λ_max(Y) (Ẇ = Y W
    # at small W), so GD's t* is ηλ/ln(1 + ηλ) times the flow's
    lam = float(np.max(np.linalg.eigvalsh(np.asarray(nqf.Y))))
    gd_lag = 100.0 * (LR * lam / math.log1p(LR * lam) - 1.0)
    gaps = (np.max(np.abs(L_pred[None, :] - losses), axis=1) / losses[:, 0]).tolist()
    data = {
        "m": int(case.y.shape[0]),
        "p": int(nqf.p),
        "width": case.width,
        "eps": eps,
        "horizon_steps": horizon,
        "converged": bool(d.converged),
        "method": p.method,
        "nqf_build_s": t_nqf,
        "predict_first_call_s": t_first,
        "predict_s_all": all_pred,
        "train_s_all": all_train,
        "first_drop": first,
        "first_drop_real_seeds": first_own,
        "first_drop_at_predicted_level": first_b,
        "drops_own": drops_own,
        "n_drops_pred": int(pred_drops.size),
        "n_drops_real": n_own,
        "drops_at_predicted_level": drops_at,
        "curve_gap_mean_curve": gap,
        "curve_gap_per_seed": gaps,
        "curve_gap_step": gap_at,
        "curve_gap_over_drops": gap_drops,
        "curve_gap_over_drops_steps": span,
        "lambda_max_Y": lam,
        "gd_lag_pct": gd_lag,
        "loss_pred_end": float(L_pred[-1]),
        "loss_real_end": losses[:, -1].tolist(),
        "loss_floor": d.loss_floor,
        "loss_pred_samples": {int(s): float(L_pred[s]) for s in np.linspace(0, horizon, 11).astype(int)},
        "loss_real_samples": {int(s): float(losses[:, s].mean()) for s in np.linspace(0, horizon, 11).astype(int)},
    }
    fm, fs = np.mean(first_own), first["real_half_range_pct"][0]
    note = f"first drop {first_pred:.0f} vs {fm:.0f} ±{fs:.1f}% ({first['err_pct'][0]:+.1f}%)"
    note += f", at predicted level {np.mean(first_at):.0f} ({first_b['err_pct'][0]:+.1f}%)"
    if case.vector:
        e_own = ", ".join(f"{e:+.0f}" for e in drops_own["err_pct"])
        e_at = ", ".join(f"{e:+.0f}" for e in drops_at["err_pct"])
        note += f"; drops {pred_drops.size} vs {n_own}, own (%) {e_own}; at predicted level (%) {e_at}"
    note += f"; curve gap {gap:.3f} L(0) (at step {gap_at}), {gap_drops:.3f} to step {span}"
    note += f"; {p.method} (GD's lag behind the flow on the fastest direction +{gd_lag:.1f}%); {horizon} steps"
    return Row(NAME, case.name, t_pred, f"GD, {horizon} steps", t_train, t_train / t_pred, 1.0, note, data)


def cold_cli(cfg: Config) -> Row:
    """`lvflow predict --architecture mlp` on all digits in a fresh process: no compilation cache,
    then twice with a fresh persistent cache (the second run reads it)."""
    X, y, _ = digits("flat")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "digits.npz")
        np.savez(path, x=X, y=y)
        cmd = [sys.executable, "-m", "lvflow", "predict", "--architecture", "mlp", "--data", path]
        cmd += ["--init-std", str(SIGMA), "--width", "64", "--lr", str(LR), "--quiet"]
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for label, cache in (("no cache", "off"), ("cache filled", tmp), ("cache read", tmp)):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, env=dict(env, LVFLOW_CACHE_DIR=cache), capture_output=True, text=True)
            times[label] = time.perf_counter() - t0
            if out.returncode != 0:
                raise RuntimeError(f"lvflow predict failed: {out.stderr[-2000:]}")
    note = ", ".join(f"{k} {v:.1f} s" for k, v in times.items()) + "; import, NQF, compile and solve included"
    return Row(
        NAME,
        "`lvflow predict --architecture mlp`, 1797 digits, fresh process",
        times["no cache"],
        "budget (warm)",
        5.0,
        5.0 / times["no cache"],
        None,
        note,
        {"times_s": times, "output_tail": out.stdout[-3000:]},
    )


def run(cfg: Config) -> list[Row]:
    rows = []
    todo = cases(smoke=cfg.smoke)
    if cfg.cases:
        todo = [c for c in todo if any(text in c.name for text in cfg.cases)]
    elif cfg.smoke:  # one scalar-output and one vector-output case: the smoke run checks the code paths
        todo = [todo[0], next(c for c in todo if c.name.startswith("MLP 20"))]
    for case in todo:
        row = run_case(case, cfg)
        print(f"  {row.case}: {row.note}", flush=True)
        rows.append(row)
    if cfg.cold and not cfg.smoke and not cfg.cases:
        rows.append(cold_cli(cfg))
    return rows
