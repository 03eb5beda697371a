"""The gLV solve assembled from lvflow's diffrax components: `LogLotkaVolterraTerm`, `Rodas5P` and
`SwitchOnTracker`, in a plain `diffrax.diffeqsolve`: `python examples/diffrax_components.py`.
"""

import diffrax
import jax.numpy as jnp
import numpy as np

import lvflow

K = 1000
k = np.arange(1, K + 1)
r = k**-0.8  # Fig 3 right: r_k = k^-0.8, V_k = k^-2, C_kk = r_k²/(8 V_k)
c = r**2 / (8 * k**-2.0)
system = lvflow.LotkaVolterra(r, np.diag(c))
z0 = 1e-6 * k**-1.2
rho = 0.5

term = lvflow.LogLotkaVolterraTerm.from_system(system)  # C diagonal: O(K) stage solves
tracker = lvflow.SwitchOnTracker(lvflow.Rodas5P(), jnp.log(rho * r / c))  # threshold ln(ρ z_k(∞))
sol = diffrax.diffeqsolve(
    term,
    tracker,
    0.0,
    1e4,
    None,
    jnp.log(z0),
    stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-10),
    saveat=diffrax.SaveAt(t1=True, solver_state=True),
    max_steps=16384,
)
t_star = np.asarray(tracker.crossing_times(sol.solver_state))
exact = np.asarray(lvflow.ignition_time(r, c, z0 / 1e-6, 1e-6))  # Eq. 158, exact for Thm 6
print(
    f"{int(sol.stats['num_steps'])} steps; max relative error of the {K} switch-on times vs Eq. 158:",
    float(np.max(np.abs(t_star - exact) / exact)),
)
assert np.allclose(t_star, exact, rtol=1e-6)
