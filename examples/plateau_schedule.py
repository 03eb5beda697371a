"""The ε → 0 limit of a coupled gLV: events in τ = t/ln(1/ε), a mode a competitor keeps from igniting,
and the finite-ε solve approaching it: `python examples/plateau_schedule.py`.
"""

import numpy as np

import lvflow

r = np.array([1.0, 0.8, 0.5])
C = np.array([[1.0, 0.95, 0.2], [0.95, 1.0, 0.2], [0.2, 0.2, 1.0]])  # mode 2 competes with mode 1
system = lvflow.LotkaVolterra(r, C)
sched = lvflow.plateau_schedule(system, 1e-8)
print("τ* (ε → 0):", np.round(np.asarray(sched.tau_star), 4))
for eps in (1e-4, 1e-8, 1e-16):
    sol = lvflow.solve_lv(system, np.full(3, eps), 60 * np.log(1 / eps), ts=[0.0, 60 * np.log(1 / eps)])
    print(f"ε = {eps:g}: t*/ln(1/ε) =", np.round(np.asarray(sol.switch_on_times) / np.log(1 / eps), 4))
