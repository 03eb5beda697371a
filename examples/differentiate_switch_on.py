"""How do the switch-on times of a coupled gLV move with the growth rates? `jax.jacrev` through
`solve_lv`, checked against central finite differences: `python examples/differentiate_switch_on.py`.
"""

import jax
import jax.numpy as jnp
import numpy as np

import lvflow

rng = np.random.default_rng(0)
K, q = 8, 2
r = jnp.asarray(np.sort(rng.uniform(0.2, 1.0, K))[::-1])
d = np.ones(K)
U = 0.2 * rng.standard_normal((K, q))  # C = I + U Uᵀ: weak mixed-sign coupling
z0 = np.full(K, 1e-6)
t1 = 200.0


def switch_on(r, rtol=1e-8):
    system = lvflow.LowRankLotkaVolterra(r, d, U)
    return lvflow.solve_lv(system, z0, t1, ts=[0.0, t1], rtol=rtol, atol=rtol * 1e-2).switch_on_times


J = jax.jacrev(switch_on)(r)  # ∂t*_k/∂r_j
h = 1e-6
fd = np.stack([(switch_on(r + h * e, 1e-12) - switch_on(r - h * e, 1e-12)) / (2 * h) for e in np.eye(K)], axis=1)
print("∂t*_k/∂r_k:", np.round(np.diag(np.asarray(J)), 4))
print("max relative difference from finite differences:", float(np.max(np.abs(J - fd)) / np.max(np.abs(fd))))
assert np.max(np.abs(J - fd)) <= 1e-5 * np.max(np.abs(fd))
