"""The largest eigenvalue of the loss Hessian at the last plateau (`predict`'s stability note),
`Diag(√z) C Diag(√z)`: the matrix-free Lanczos for more than 2000 modes against scipy's `eigsh`,
and the dense and diagonal paths against `eigvalsh` and the closed form."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.sparse.linalg import LinearOperator, eigsh

import lvflow

# internal on purpose: the eigenvalue behind predict's learning-rate warning, only its 3 digits are public
from lvflow._workflow.predict import _hessian_max_eig


@pytest.mark.parametrize(("K", "q", "scale", "seed"), [(2500, 4, 1.0, 0), (3000, 1, 1.0, 1), (2100, 3, 0.01, 3)])
def test_lanczos_matches_eigsh(K, q, scale, seed):
    # scale 0.01: a weak coupling, so the top eigenvalues cluster (slow Lanczos convergence)
    rng = np.random.default_rng(seed)
    r, d, U = rng.uniform(0.1, 1.0, K), rng.uniform(0.5, 2.0, K), scale * rng.standard_normal((K, q))
    lv = lvflow.LowRankLotkaVolterra(r, d, U)
    z = rng.uniform(0.0, 1.0, K)
    s = np.sqrt(z)
    op = LinearOperator((K, K), matvec=lambda x: s * np.asarray(lv.Cz(jnp.asarray(s * x.ravel()))))
    ref = float(eigsh(op, k=1, which="LA", return_eigenvectors=False)[0])
    got = _hessian_max_eig(lv, z)
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_small_and_diagonal():
    rng = np.random.default_rng(5)
    K = 50
    B = rng.standard_normal((K, K))
    C = B @ B.T / K
    z = rng.uniform(0.0, 1.0, K)
    s = np.sqrt(z)
    lv = lvflow.LotkaVolterra(rng.uniform(0.1, 1.0, K), C)
    np.testing.assert_allclose(_hessian_max_eig(lv, z), np.linalg.eigvalsh(s[:, None] * C * s[None, :])[-1], rtol=1e-12)
    c = rng.uniform(0.5, 2.0, K)
    lvd = lvflow.LotkaVolterra(rng.uniform(0.1, 1.0, K), np.diag(c))
    np.testing.assert_allclose(_hessian_max_eig(lvd, z), np.max(z * c), rtol=1e-15)
