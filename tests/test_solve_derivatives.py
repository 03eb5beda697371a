"""Derivatives of `solve_lv` (reverse and forward mode) against central finite differences.

For each system, three outputs are differentiated with respect to every input array (`r`, `C` or
`d`, `U`, `z0`): (a) the finite switch-on times `t*_k`, (b) `z(t)` at two interior save times,
(c) the final loss `L(z(t1))`. Reverse mode is `jax.jit(jax.grad(⟨w, outputs⟩))` for one cotangent
per output entry (the rows of the Jacobian, what `jax.jacrev` vmaps); forward mode is `jax.jvp`
(what `jax.jacfwd` vmaps) with `adjoint=diffrax.ForwardMode()`. Both are compared, along a few
random directions per input (`C` perturbed symmetrically and kept PSD), with central differences of
solves at rtol 1e-12, atol 1e-14, to 1e-5 in the norm-wise relative error `max|g − fd| / max|fd|`
of each (output, input) block; measured, every block is below 1e-6, and reverse and forward mode
agree to 1e-13.

Systems: a diagonal `C` by the closed form and by the ODE, a dense coupled `C` (K = 6), one where a
mode that ignites first is driven extinct (its `t*` is inf: `z(∞) = 0` gives no target `ρ z(∞)`),
and a low-rank `C = Diag(d) + UUᵀ` (K = 10, q = 2).

The derivative solves use the same tolerances as the finite-difference ones, so that each system
structure (closed form; dense `C` with K = 6; low rank with K = 10, q = 2) compiles exactly two
programs, the reverse and the forward one; the finite differences run through the forward program.
"""

import functools

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lvflow

TOL = 1e-5  # norm-wise relative error against differences, every (output, input) block
AGREE = 1e-9  # reverse against forward mode (measured: below 3e-14)
SOLVE = dict(rtol=1e-12, atol=1e-14, max_steps=4096)
H = 1e-6  # finite-difference step, relative to each input's scale (the directions are scaled)


# --- the differentiated function and its two compiled programs per structure ------------------


def _system(kind, p):
    if kind == "closed_form":  # Thm 6: diagonal C = Diag(c), declared by a U without columns
        return lvflow.LowRankLotkaVolterra(p["r"], p["c"], jnp.zeros((p["c"].shape[0], 0)))
    if kind == "dense":
        return lvflow.LotkaVolterra(p["r"], p["C"], check=False)
    return lvflow.LowRankLotkaVolterra(p["r"], p["d"], p["U"])


def _outputs(kind, p, t1, ts, adjoint=None):
    # the closed form (the default) for the declared diagonal; the ODE otherwise, also for a dense C
    # that is concretely diagonal (finite differences)
    solver = None if kind == "closed_form" else lvflow.Rodas5P()
    sol = lvflow.solve_lv(_system(kind, p), p["z0"], t1, ts=ts, adjoint=adjoint, solver=solver, **SOLVE)
    t_on = sol.switch_on_times
    out = {"t_on": jnp.where(jnp.isfinite(t_on), t_on, 0.0), "zs": sol.zs[1:-1], "loss": sol.loss[-1]}
    return out, t_on


def _times(t1, ts):
    """`t1`, `ts` as strongly typed float64 arrays (a weakly typed `t1` would compile anew)."""
    return jnp.asarray(t1, dtype=float), jnp.asarray(ts, dtype=float)


@functools.cache
def _programs(kind):
    """`(rev, fwd)`: `rev(p, w, t1, ts)` = ∇_p ⟨w, outputs⟩ (jit of grad); `fwd(p, v, t1, ts)` =
    `(outputs, raw t*), (tangents, ·)` (jit of jvp, diffrax.ForwardMode on the ODE path)."""

    def scalar(p, w, t1, ts):
        out, _ = _outputs(kind, p, t1, ts)
        return sum(jnp.sum(w[k] * out[k]) for k in out)

    def fwd(p, v, t1, ts):
        return jax.jvp(lambda q: _outputs(kind, q, t1, ts, dfx.ForwardMode()), (p,), (v,))

    return jax.jit(jax.grad(scalar)), jax.jit(fwd)


# --- the comparison ----------------------------------------------------------------------------


def _switch_on_times(kind, p, t1, ts):
    """The raw `t*` (inf where not switched on) from the forward program at a zero tangent."""
    _, fwd = _programs(kind)
    p = jax.tree.map(jnp.asarray, p)
    (_, t_on), _ = fwd(p, jax.tree.map(jnp.zeros_like, p), *_times(t1, ts))
    return np.asarray(t_on)


def _dot(a, b):
    return sum(jnp.vdot(a[k], b[k]) for k in a)


def _rel(g, fd):
    g, fd = np.asarray(g), np.asarray(fd)
    return float(np.max(np.abs(g - fd)) / np.max(np.abs(fd)))


def _derivative_errors(kind, p, t1, ts, directions):
    """Norm-wise relative errors `{(mode, output, direction name): err}` of reverse and forward
    mode against central differences along `directions` (`{name: tangent pytree}`, each already
    scaled to its input, so one relative step `H` serves all)."""
    rev, fwd = _programs(kind)
    p = jax.tree.map(jnp.asarray, p)
    t1, ts = _times(t1, ts)
    zero = jax.tree.map(jnp.zeros_like, p)
    (base, t_on), _ = fwd(p, zero, t1, ts)
    finite = np.isfinite(np.asarray(t_on))
    assert finite.sum() >= 2
    # Reverse mode: one jit(grad) per output entry (a row of the Jacobian); (a) on finite t* only.
    rows = {}
    for k, y in base.items():
        idx = np.flatnonzero(finite) if k == "t_on" else range(np.size(y))
        rows[k] = []
        for i in idx:
            w = jax.tree.map(jnp.zeros_like, base)
            w[k] = w[k].ravel().at[i].set(1.0).reshape(np.shape(y))
            rows[k].append(rev(p, w, t1, ts))
    errors, agree = {}, {}
    for name, v in directions.items():
        v = jax.tree.map(jnp.asarray, v)
        v = {k: v.get(k, zero[k]) for k in p}
        plus, _ = fwd(jax.tree.map(lambda a, b: a + H * b, p, v), zero, t1, ts)[0]
        minus, _ = fwd(jax.tree.map(lambda a, b: a - H * b, p, v), zero, t1, ts)[0]
        _, (tangent, _) = fwd(p, v, t1, ts)
        for k in base:
            fd = (np.ravel(plus[k]) - np.ravel(minus[k])) / (2 * H)
            jvp = np.ravel(tangent[k])
            vjp = np.array([float(_dot(g, v)) for g in rows[k]])
            if k == "t_on":
                fd, jvp = fd[finite], jvp[finite]
            errors[("rev", k, name)] = _rel(vjp, fd)
            errors[("fwd", k, name)] = _rel(jvp, fd)
            agree[(k, name)] = _rel(vjp, jvp)
    return errors, agree


def _assert_small(errors, agree):
    bad = {key: e for key, e in errors.items() if not e < TOL}
    worst = max(errors, key=errors.get)
    assert not bad, f"relative errors above {TOL:g}: {bad} (worst {worst}: {errors[worst]:.2e})"
    # Reverse and forward mode differentiate the same discrete solution: they agree far closer.
    bad = {key: e for key, e in agree.items() if not e < AGREE}
    assert not bad, f"reverse and forward mode differ by more than {AGREE:g}: {bad}"


def _random_directions(p, rng, *, groups, n=2, sym=("C",)):
    """`n` random directions per input, scaled entrywise by the input (uniformly by its largest
    entry for matrices, whose zero entries are perturbed too); symmetric for `C`."""
    out = {}
    for g in groups:
        x = np.asarray(p[g], dtype=float)
        scale = np.abs(x) if x.ndim == 1 else np.max(np.abs(x))
        for j in range(n):
            e = rng.normal(size=x.shape)
            if g in sym:
                e = (e + e.T) / 2
            out[f"{g}{j}"] = {g: e * scale}
    return out


def _sym_pair(K, i, j, scale):
    """`scale (E_ij + E_ji)`: one symmetric entry pair of `C`."""
    E = np.zeros((K, K))
    E[i, j] += scale
    E[j, i] += scale
    return {"C": E}


# --- the systems -------------------------------------------------------------------------------

# Diagonal, K = 6: five modes switching on between t ≈ 12 and 42, and one with r < 0 (t* = inf).
DIAG_R = np.array([1.0, 0.7, 0.5, 0.35, 0.25, -0.2])
DIAG_C = np.array([1.0, 2.0, 0.5, 1.5, 0.8, 1.0])
DIAG_Z0 = np.array([1e-6, 1e-4, 1e-5, 1e-7, 1e-4, 1e-3])
DIAG_T1, DIAG_TS = 48.0, [0.0, 15.0, 30.0, 48.0]

# Competition, K = 6: mode 2 ignites first (z_2 ≈ 0.63 by t = 10) and is driven extinct when mode 0
# ignites (C_02 = 0.95; z_2(∞) = 0 with r_2 − (C z*)_2 = −0.61 < 0, so its t* is inf); modes 3–5
# are weakly coupled to the first three and to each other.
EXT_R = np.array([1.5, 0.5, 0.8, 0.6, 0.4, 0.3])
EXT_C = np.array(
    [
        [1.0, 0.2, 0.95, 0.1, 0.0, 0.0],
        [0.2, 1.0, 0.2, 0.0, 0.1, 0.0],
        [0.95, 0.2, 1.0, 0.0, 0.0, 0.1],
        [0.1, 0.0, 0.0, 1.0, 0.2, 0.1],
        [0.0, 0.1, 0.0, 0.2, 1.0, 0.2],
        [0.0, 0.0, 0.1, 0.1, 0.2, 1.0],
    ]
)
EXT_Z0 = np.array([1e-8, 1e-4, 1e-3, 1e-5, 1e-4, 1e-4])
EXT_T1, EXT_TS = 40.0, [0.0, 10.0, 25.0, 40.0]


def _dense_system():
    # C = 0.3 AAᵀ + 0.7 I (eigenvalues 0.70 … 1.21), every mode survives (z* = C⁻¹r > 0.5).
    rng = np.random.default_rng(0)
    K = 6
    A = rng.normal(size=(K, K)) / np.sqrt(K)
    C = 0.3 * A @ A.T + 0.7 * np.eye(K)
    return {"r": np.linspace(1.0, 0.4, K), "C": C, "z0": 10.0 ** rng.uniform(-8, -5, K)}


def _low_rank_system():
    # K = 10, q = 2: C = Diag(d) + UUᵀ, every mode survives; switch-ons between t ≈ 13 and 37.
    rng = np.random.default_rng(1)
    K = 10
    return {
        "r": np.linspace(1.0, 0.4, K),
        "d": 0.6 + 0.2 * rng.uniform(size=K),
        "U": rng.normal(0.0, 0.3, (K, 2)),
        "z0": 10.0 ** rng.uniform(-8, -4, K),
    }


# --- the tests ---------------------------------------------------------------------------------


def test_closed_form_derivatives():
    p = {"r": DIAG_R, "c": DIAG_C, "z0": DIAG_Z0}
    rng = np.random.default_rng(10)
    directions = _random_directions(p, rng, groups=("r", "c", "z0"))
    _assert_small(*_derivative_errors("closed_form", p, DIAG_T1, DIAG_TS, directions))


@pytest.mark.slow
def test_diagonal_ode_derivatives_match_closed_form_and_differences():
    # The same diagonal system through the ODE (C traced, so a dense term): derivatives along C's
    # diagonal, and along off-diagonal pairs E_ij + E_ji (which couple the modes; the closed form
    # cannot follow those), against differences of ODE solves.
    p = {"r": DIAG_R, "C": np.diag(DIAG_C), "z0": DIAG_Z0}
    rng = np.random.default_rng(11)
    directions = _random_directions(p, rng, groups=("r", "z0"))
    directions["Cdiag"] = {"C": np.diag(rng.normal(size=6) * DIAG_C)}
    directions["C01"] = _sym_pair(6, 0, 1, 1.0)
    directions["C24"] = _sym_pair(6, 2, 4, 1.0)
    _assert_small(*_derivative_errors("dense", p, DIAG_T1, DIAG_TS, directions))
    # Forward and reverse mode of the ODE path against the exact (closed-form) derivatives.
    rev_c, fwd_c = _programs("closed_form")
    rev_o, fwd_o = _programs("dense")
    pc = jax.tree.map(jnp.asarray, {"r": DIAG_R, "c": DIAG_C, "z0": DIAG_Z0})
    po = jax.tree.map(jnp.asarray, p)
    args = _times(DIAG_T1, DIAG_TS)
    vc = {"r": DIAG_R * rng.normal(size=6), "c": DIAG_C * rng.normal(size=6), "z0": DIAG_Z0 * rng.normal(size=6)}
    vo = {"r": vc["r"], "C": np.diag(vc["c"]), "z0": vc["z0"]}
    (_, t_on), (tan_c, _) = fwd_c(pc, jax.tree.map(jnp.asarray, vc), *args)
    _, (tan_o, _) = fwd_o(po, jax.tree.map(jnp.asarray, vo), *args)
    w = {k: jnp.asarray(rng.normal(size=np.shape(tan_c[k]))) for k in tan_c}
    w["t_on"] = jnp.where(jnp.isfinite(t_on), w["t_on"], 0.0)
    g_c, g_o = rev_c(pc, w, *args), rev_o(po, w, *args)
    for k in tan_c:
        assert _rel(tan_o[k], tan_c[k]) < TOL, k
    assert _rel([g_o["r"], g_o["z0"], jnp.diagonal(g_o["C"])], [g_c["r"], g_c["z0"], g_c["c"]]) < TOL


def test_dense_coupled_derivatives():
    p = _dense_system()
    t1, ts = 42.0, [0.0, 15.0, 25.0, 42.0]
    assert np.all(np.isfinite(_switch_on_times("dense", p, t1, ts)))  # all six switch on by t1
    rng = np.random.default_rng(12)
    directions = _random_directions(p, rng, groups=("r", "C", "z0"))
    directions["C03"] = _sym_pair(6, 0, 3, float(np.max(p["C"])))
    _assert_small(*_derivative_errors("dense", p, t1, ts, directions))


def test_extinction_derivatives():
    # Mode 2 is switched off by mode 0: z_2(∞) = 0, so its switch-on time is inf (never ρ z_2(∞));
    # the other five are finite and differentiable, and z_2's rise and fall is in zs.
    p = {"r": EXT_R, "C": EXT_C, "z0": EXT_Z0}
    t_on = _switch_on_times("dense", p, EXT_T1, EXT_TS)
    assert np.isinf(t_on[2]) and np.all(np.isfinite(np.delete(t_on, 2)))
    rng = np.random.default_rng(13)
    directions = _random_directions(p, rng, groups=("r", "C", "z0"))
    directions["C02"] = _sym_pair(6, 0, 2, 1.0)  # the competition that extinguishes mode 2
    _assert_small(*_derivative_errors("dense", p, EXT_T1, EXT_TS, directions))


@pytest.mark.slow
def test_low_rank_derivatives():
    p = _low_rank_system()
    t1, ts = 42.0, [0.0, 15.0, 30.0, 42.0]
    assert np.all(np.isfinite(_switch_on_times("low_rank", p, t1, ts)))  # all ten switch on by t1
    rng = np.random.default_rng(14)
    directions = _random_directions(p, rng, groups=("r", "d", "U", "z0"), sym=())
    _assert_small(*_derivative_errors("low_rank", p, t1, ts, directions))


def test_jit_grad_of_the_final_loss():
    # A user's jax.jit(jax.grad(f)) of the final loss of the dense system in (r, C, z0), t1 and ts
    # closed over, against central differences in every coordinate (C in symmetric pairs).
    p = _dense_system()
    K = 6
    t1, ts = 42.0, [0.0, 15.0, 25.0, 42.0]

    def final_loss(r, C, z0):
        return lvflow.solve_lv(lvflow.LotkaVolterra(r, C, check=False), z0, t1, ts=ts, **SOLVE).loss[-1]

    g = jax.jit(jax.grad(final_loss, argnums=(0, 1, 2)))(*(jnp.asarray(p[k]) for k in ("r", "C", "z0")))
    g = dict(zip(("r", "C", "z0"), map(np.asarray, g)))
    _, fwd = _programs("dense")  # differences through the shared program (C traced)
    pj = jax.tree.map(jnp.asarray, p)
    zero = jax.tree.map(jnp.zeros_like, pj)
    args = _times(t1, ts)

    def fd(v):
        plus = fwd(jax.tree.map(lambda a, b: a + H * b, pj, v), zero, *args)[0][0]["loss"]
        minus = fwd(jax.tree.map(lambda a, b: a - H * b, pj, v), zero, *args)[0][0]["loss"]
        return float(plus - minus) / (2 * H)

    def unit(k, idx, scale):
        v = {key: np.zeros_like(x) for key, x in p.items()}
        v[k][idx] += scale
        if k == "C":
            v[k][idx[::-1]] += scale
        return v

    pairs = [(i, j) for i in range(K) for j in range(i, K)]
    C_scale = float(np.max(p["C"]))
    for k, idx, scale, grad in (
        ("r", [(i,) for i in range(K)], p["r"], lambda i: g["r"][i]),
        ("z0", [(i,) for i in range(K)], p["z0"], lambda i: g["z0"][i]),
        ("C", pairs, np.full(len(pairs), C_scale), lambda ij: g["C"][ij] + g["C"][ij[::-1]]),
    ):
        want = np.array([fd(unit(k, ix, s)) for ix, s in zip(idx, scale)])
        got = np.array([grad(ix) * s for ix, s in zip(idx, scale)])
        assert _rel(got, want) < TOL, k
