"""Predict the plateaus of the paper's Fig 3 system and check them against Eq. 158.

Five decoupled modes, r = (1, ½, ¼, ⅛, 1/16), C = I, initial scale ε = 1e-5:
`python examples/predict_fig3.py`.
"""

import numpy as np

import lvflow

r = np.array([1.0, 0.5, 0.25, 0.125, 0.0625])
system = lvflow.LotkaVolterra(r, np.eye(5))
eps = 1e-5

prediction = lvflow.predict(system, eps=eps, learning_rate=0.01)
sol = lvflow.solve_lv(system, np.full(5, eps), 300.0, ts=[0.0, 300.0])
eq158 = np.asarray(lvflow.ignition_time(r, np.ones(5), np.ones(5), eps))

print("mode   t*_k (solve_lv)   t*_k (Eq. 158)   GD steps at lr 0.01")
for k, (t, e) in enumerate(zip(np.asarray(sol.switch_on_times), eq158), start=1):
    print(f"{k:4d}   {t:15.6f}   {e:14.6f}   {t / 0.01:12.0f}")
assert np.allclose(np.asarray(sol.switch_on_times), eq158, rtol=1e-6)
print(f"plateau losses: {np.round(np.asarray(prediction.plateau_loss), 6)}")
