"""Memory of the mixture solvers estimated before allocating (poly.fit routing, cached_dense, exact).

Oracle for the routed fit: the cached dense solve of the same mixture (both are exact on the support).
"""

from __future__ import annotations

import numpy as np
import pytest

import mlpinterp as mi
from mlpinterp.poly.mixture import cached_dense
from mlpinterp.utils import memory


def _case(K=12, d=6, seed=0):
    rng = np.random.default_rng(seed)
    net = mi.MLP(rng.standard_normal((16, d)) / np.sqrt(d), rng.standard_normal(16) * 0.2,
                 rng.standard_normal((2, 16)) / 4, np.zeros(2), activation="gelu")
    covs = []
    for _ in range(K):
        Q = rng.standard_normal((d, d)) / np.sqrt(d)
        covs.append(Q @ Q.T + 0.05 * np.eye(d))
    w = rng.random(K)
    return net, mi.GaussianMixture(w / w.sum(), rng.standard_normal((K, d)), np.stack(covs))


def test_many_components_are_routed_to_the_matrix_free_solver(monkeypatch):
    net, mix = _case()
    dense = mi.fit_polynomial(net, mix, 2)
    assert dense.info["method"] == "exact-mixture-dense-cached"
    net, mix = _case()  # a fresh mixture object (the cached factorisation is per mixture)
    monkeypatch.setattr(cached_dense, "MAX_CACHED_BYTES", cached_dense.gram_bytes(mix.K, mix.d) - 1)
    routed = mi.fit_polynomial(net, mix, 2)
    assert routed.info["method"] == "exact-mixture-cg" and routed.solver_info["converged"]
    # the default stopping rule bounds the excess FVU over the optimum by fvu_tol (1e-7), not the coefficients:
    # that on samples (an unbiased estimate of E[(p - p*)^2] / Var f) ...
    X = mix.sample(100_000, np.random.default_rng(1))
    f = net(X)
    excess = ((routed(X) - dense(X)) ** 2).sum(1).mean() / ((f - f.mean(0)) ** 2).sum(1).mean()
    assert excess <= 1e-7, excess
    # ... and the coefficients to 1e-7 from the same route solved to its residual tolerance (fvu_tol 0: the true
    # float64 relative residual <= tol)
    tight = mi.fit_polynomial(net, mix, 2, fvu_tol=0.0)
    assert tight.info["method"] == "exact-mixture-cg" and tight.solver_info["converged"]
    for k in range(3):
        a, b = tight.coefficients(k), dense.coefficients(k)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7 * np.abs(b).max())


def test_matrix_free_solver_refuses_before_building_its_operator(monkeypatch):
    from mlpinterp.poly.mixture import system

    net, mix = _case(K=30)

    def reached(*a, **k):
        raise AssertionError("the operator was built before the memory check")

    monkeypatch.setattr(system, "cached_operator", reached)
    monkeypatch.setattr(memory, "available_bytes", lambda: 10_000)
    with pytest.raises(memory.InsufficientMemoryError, match=r"matrix-free quadratic solve \(K = 30 .*needs about"):
        mi.fit_polynomial(net, mix, 2)


def test_cached_dense_refuses_before_building_its_grams(monkeypatch):
    net, mix = _case(K=5)

    def reached(*a, **k):
        raise AssertionError("a Gram was built before the memory check")

    monkeypatch.setattr(cached_dense, "_component_gram", reached)
    monkeypatch.setattr(memory, "available_bytes", lambda: 10_000)
    with pytest.raises(memory.InsufficientMemoryError, match=r"5 Gram matrices \[F, F\] \(F = 28\).*method='cg'"):
        cached_dense.fit_mixture_quadratic_cached(net, mix)
