"""Cached dense mixture quadratic (poly/mixture/cached_dense) against the independent moment-table dense solver
(poly/mixture/moment_dense, Stein-recursion moments) and against least squares on mixture samples."""

from __future__ import annotations

import numpy as np
import pytest

from mlpinterp import GLU, MLP, GaussianMixture, fit_polynomial
from mlpinterp.poly.mixture.cached_dense import fit_mixture_quadratic_cached
from tests.oracles import monomial_features, ols_with_robust_se, prediction_z_scores


def _mixture(d, rng, *, singular_component=False):
    means = rng.standard_normal((3, d))
    covs = []
    for k in range(3):
        L = rng.standard_normal((d, 2 if (singular_component and k == 1) else d))
        covs.append(L @ L.T / d + (0 if (singular_component and k == 1) else 0.05 * np.eye(d)))
    return GaussianMixture(np.array([0.2, 0.5, 0.3]), means, np.stack(covs))


@pytest.mark.parametrize("kind,act,singular", [("mlp", "relu", False), ("mlp", "gelu", True), ("glu", "silu", False)])
def test_cached_dense_equals_moment_table_dense(kind, act, singular):
    rng = np.random.default_rng(0)
    d = 5
    mix = _mixture(d, rng, singular_component=singular)
    if kind == "mlp":
        net = MLP(rng.standard_normal((8, d)), rng.normal(0, 0.5, 8), rng.standard_normal((3, 8)), np.zeros(3), act)
    else:
        net = GLU(rng.standard_normal((6, d)), None, rng.standard_normal((6, d)), None, rng.standard_normal((3, 6)),
                  None, act)
    p = fit_mixture_quadratic_cached(net, mix)
    q = fit_polynomial(net, mix, 2, method="dense")
    for k in range(3):
        np.testing.assert_allclose(p.coefficients(k), q.coefficients(k), rtol=1e-9, atol=1e-9)
    assert p.solver_info["relative_residual"] < 1e-10
    # the cache is reused and gives the same numbers
    np.testing.assert_array_equal(fit_mixture_quadratic_cached(net, mix).coefficients(2), p.coefficients(2))


def test_cached_dense_against_least_squares_on_mixture_samples():
    rng = np.random.default_rng(1)
    d = 3
    mix = _mixture(d, rng)
    net = MLP(rng.standard_normal((8, d)), rng.normal(0, 0.5, 8), rng.standard_normal((2, 8)), np.zeros(2), "relu")
    p = fit_polynomial(net, mix, 2)
    assert p.info["method"] == "exact-mixture-dense-cached"
    X = mix.sample(1_000_000, rng)
    beta, covs, _ = ols_with_robust_se(monomial_features(X, 2), net(X))
    Xe = mix.sample(200, rng)
    z = prediction_z_scores(monomial_features(Xe, 2), beta, covs, p(Xe))
    assert np.max(np.abs(z)) < 5.0
