"""The data projection at width (ffn.projection, ffn.projection_cg): the ridge grid from one eigendecomposition,
the route without the [F, F] Gram, and the token count checked before any pass over the samples.

Oracles: the Cholesky solve of the full (uncentred) system per ridge (``solve_projection``) and the dense route.
"""

from __future__ import annotations

import numpy as np
import pytest

import mlpinterp as mi
from mlpinterp.poly.projection import RIDGE_GRID, RidgePath, normal_equations, project_on_data, solve_projection
from mlpinterp.poly.readout import RidgeBasis
from mlpinterp.utils import memory
from tests.helpers import random_network

D, H, O = 5, 7, 3


def _case(kind, seed=0, degree=3):
    rng = np.random.default_rng(seed)
    net = random_network(kind, D, H, O, None, rng, scaled=False)
    Q = rng.standard_normal((D, D))
    g = mi.Gaussian(rng.standard_normal(D), Q @ Q.T / D + 0.1 * np.eye(D))
    basis = RidgeBasis.from_closed_form(mi.fit_polynomial(net, g, degree), g)
    X = g.sample(3 * basis.n_features(degree), rng) + 0.3 * rng.standard_t(3, size=(3 * basis.n_features(degree), D))
    Xv = g.sample(2000, rng) + 0.3 * rng.standard_t(3, size=(2000, D))
    return net, basis, X, Xv


@pytest.mark.parametrize("kind", ["mlp", "glu"])
def test_ridge_grid_from_one_eigendecomposition_equals_per_ridge_solves(kind):
    net, basis, X, Xv = _case(kind)
    neq = normal_equations(net, basis, X, 3)
    path = RidgePath(neq)
    scale = float(np.diag(neq.M)[1:].mean())
    for r in RIDGE_GRID:
        ro, info = solve_projection(neq, basis, ridge=r)
        ref = ro.coefficients_matrix()
        np.testing.assert_allclose(path.solve(r * scale), ref, rtol=1e-7, atol=1e-9 * np.abs(ref).max())
    auto = project_on_data(net, basis, X, [2, 3], ridge="validation", X_val=Xv)
    for d in (2, 3):
        ro, info = auto[d]
        ref, ref_info = solve_projection(neq.leading(d, basis), basis, ridge=info["ridge"])
        np.testing.assert_allclose(ro.coefficients_matrix(), ref.coefficients_matrix(), rtol=1e-7,
                                   atol=1e-9 * np.abs(ref.coefficients_matrix()).max())
        assert info["fvu"] == pytest.approx(ref_info["fvu"], rel=1e-7) and info["solver"] == "dense"


@pytest.mark.parametrize("kind", ["mlp", "glu"])
def test_cg_route_matches_the_dense_solve(kind):
    net, basis, X, Xv = _case(kind, seed=1)
    for ridge in (1e-6, "validation"):
        dense = project_on_data(net, basis, X, [1, 2, 3], ridge=ridge, X_val=Xv, solver="dense")
        cg = project_on_data(net, basis, X, [1, 2, 3], ridge=ridge, X_val=Xv, solver="cg", chunk=333, tol=1e-11,
                             maxiter=5000)
        for d in (1, 2, 3):
            a, b = cg[d][0].coefficients_matrix(), dense[d][0].coefficients_matrix()
            assert cg[d][1]["solver"] == "cg" and cg[d][1]["residual"] <= 1e-11
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7 * np.abs(b).max())
            assert cg[d][1]["fvu"] == pytest.approx(dense[d][1]["fvu"], rel=1e-6, abs=1e-12)
            if ridge == "validation":
                assert cg[d][1]["ridge"] == dense[d][1]["ridge"]


def test_auto_solver_takes_cg_when_the_gram_does_not_fit(monkeypatch):
    net, basis, X, _ = _case("mlp", degree=2)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1000)  # no [F, F] matrix fits
    got = project_on_data(net, basis, X, [2], ridge=1e-6, tol=1e-11, maxiter=5000)
    assert got[2][1]["solver"] == "cg"
    with pytest.raises(memory.InsufficientMemoryError, match=r"dense \[F, F\] normal equations .*solver='cg'"):
        project_on_data(net, basis, X, [2], ridge=1e-6, solver="dense")


def test_token_count_is_checked_before_any_pass(monkeypatch):
    net, basis, X, _ = _case("glu")

    def reached(*a, **k):
        raise AssertionError("features were computed before the token count was checked")

    monkeypatch.setattr(RidgeBasis, "_features", reached)
    with pytest.raises(ValueError, match=r"has \d+ features but only 10 samples"):
        project_on_data(net, basis, X[:10], [1, 3])
