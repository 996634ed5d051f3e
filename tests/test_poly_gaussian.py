"""Exact single-Gaussian approximants against independent oracles.

Oracles: (1) least squares on >= 10^6 samples of explicit monomial features with HC0 standard errors,
(2) the paper's OLS-in-moments route (master theorem + Isserlis; a different algorithm),
(3) hand derivations written in the tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlpinterp import GLU, MLP, Gaussian, fit_polynomial, from_module, fvu, load_polynomial
from mlpinterp.poly.metrics import fvu_on_data
from tests.helpers import random_network
from tests.oracles import monomial_features, ols_with_robust_se, prediction_z_scores


def random_gaussian(d: int, rng: np.random.Generator, *, rank: int | None = None) -> Gaussian:
    r = d if rank is None else rank
    L = rng.standard_normal((d, r)) / np.sqrt(d)
    return Gaussian(rng.normal(0.3, 0.5, d), L @ L.T + (0.2 * np.eye(d) if rank is None else 0))


# ---------------------------------------------------------------- hand-derived identities
def test_identity_activation_reproduces_network_exactly():
    rng = np.random.default_rng(0)
    net = random_network("mlp", 4, 7, 3, "identity", rng)
    g = random_gaussian(4, rng)
    X = rng.standard_normal((50, 4))
    for n in (1, 2, 3):
        p = fit_polynomial(net, g, n)
        np.testing.assert_allclose(p(X), net(X), rtol=1e-12, atol=1e-12)


def test_bilinear_glu_is_its_own_quadratic():
    rng = np.random.default_rng(1)
    net = random_network("glu", 3, 5, 2, "identity", rng)
    g = random_gaussian(3, rng)
    X = rng.standard_normal((40, 3))
    np.testing.assert_allclose(fit_polynomial(net, g, 2)(X), net(X), rtol=1e-11, atol=1e-11)


def test_zero_bias_relu_standard_normal_linear_term_is_half_W2W1():
    # Stein: Cov(relu(w.x), x) = E[1{w.x > 0}] w = w / 2 under N(0, I), so B = W2 W1 / 2.
    rng = np.random.default_rng(2)
    W1, W2 = rng.standard_normal((6, 4)), rng.standard_normal((3, 6))
    net = MLP(W1, np.zeros(6), W2, np.zeros(3), "relu")
    p = fit_polynomial(net, Gaussian.standard(4), 1)
    np.testing.assert_allclose(p.coefficients(1), 0.5 * W2 @ W1, rtol=1e-13, atol=1e-13)
    # constant: E[relu(y)] = |w| / sqrt(2 pi)
    np.testing.assert_allclose(p.coefficients(0), W2 @ (np.linalg.norm(W1, axis=1) / np.sqrt(2 * np.pi)), rtol=1e-12)


def test_quadratic_activation_is_exact_at_degree_two():
    rng = np.random.default_rng(3)
    net = random_network("mlp", 3, 5, 2, lambda y: y**2, rng)
    g = random_gaussian(3, rng)
    X = g.sample(100, rng)
    np.testing.assert_allclose(fit_polynomial(net, g, 2)(X), net(X), rtol=1e-8, atol=1e-8)
    assert fvu(net, fit_polynomial(net, g, 1), g, n_samples=20000).fvu > 1e-3


# ---------------------------------------------------------------- paper route (different algorithm)
@pytest.mark.parametrize("kind,act", [("mlp", "relu"), ("mlp", "gelu"), ("mlp", "tanh"), ("glu", "silu"), ("glu", "relu")])
@pytest.mark.parametrize("degree", [1, 2, 3])
def test_ridge_equals_ols_moments_route(kind, act, degree):
    rng = np.random.default_rng(10 + degree)
    d = 3
    net = random_network("mlp", d, 6, 2, act, rng) if kind == "mlp" else random_network("glu", d, 4, 2, act, rng)
    g = random_gaussian(d, rng)
    p_ridge = fit_polynomial(net, g, degree)
    p_ols = fit_polynomial(net, g, degree, method="ols")
    for k in range(degree + 1):
        np.testing.assert_allclose(p_ridge.coefficients(k), p_ols.coefficients(k), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- Monte Carlo least squares oracle
@pytest.mark.parametrize(
    "kind,act,degree",
    [("mlp", "relu", 1), ("mlp", "relu", 2), ("mlp", "gelu", 3), ("mlp", "tanh", 2), ("glu", "silu", 2),
     pytest.param("glu", "relu", 3, marks=pytest.mark.slow)],
)
def test_against_least_squares_on_a_million_samples(kind, act, degree):
    rng = np.random.default_rng(100 + degree)
    d = 3
    net = random_network("mlp", d, 8, 2, act, rng) if kind == "mlp" else random_network("glu", d, 5, 2, act, rng)
    g = random_gaussian(d, rng)
    X = g.sample(1_000_000, rng)
    F = monomial_features(X, degree, center=g.mean)
    beta, covs, _ = ols_with_robust_se(F, net(X))
    p = fit_polynomial(net, g, degree)
    X_eval = g.sample(200, rng)
    z = prediction_z_scores(monomial_features(X_eval, degree, center=g.mean), beta, covs, p(X_eval))
    # 400 correlated z-scores of a correct model: |z| > 5 has probability < 1e-4 even under a union bound
    assert np.max(np.abs(z)) < 5.0, np.max(np.abs(z))


# ---------------------------------------------------------------- FVU
def test_fvu_decreases_with_degree_and_exact_matches_monte_carlo():
    rng = np.random.default_rng(4)
    net = random_network("mlp", 5, 16, 3, "relu", rng)
    g = random_gaussian(5, rng)
    vals = []
    for n in (0, 1, 2, 3, 4):
        p = fit_polynomial(net, g, n)
        ex = fvu(net, p, g)
        mc = fvu(net, p, g, method="monte-carlo", n_samples=400_000, seed=n)
        assert ex.method == "exact" and mc.method == "monte-carlo"
        assert abs(ex.fvu - mc.fvu) < 5 * mc.stderr + ex.error_bound, (n, ex, mc)
        vals.append(ex.fvu)
    assert vals[0] == pytest.approx(1.0, abs=1e-9)  # the constant explains nothing
    assert all(a > b for a, b in zip(vals, vals[1:], strict=False))


def test_fvu_on_data_is_zero_for_exact_and_one_for_mean():
    rng = np.random.default_rng(5)
    net = random_network("mlp", 3, 4, 2, "identity", rng)
    g = random_gaussian(3, rng)
    X = g.sample(1000, rng)
    assert fvu_on_data(net, fit_polynomial(net, g, 1), X).fvu < 1e-20
    mean_model = lambda Z: np.broadcast_to(net(X).mean(0), (len(Z), 2))
    assert fvu_on_data(net, mean_model, X).fvu == pytest.approx(1.0, rel=1e-12)


# ---------------------------------------------------------------- singular covariance
def test_singular_covariance_matches_least_squares_on_the_support():
    rng = np.random.default_rng(6)
    d, rank = 4, 2
    g = random_gaussian(d, rng, rank=rank)
    assert g.is_singular
    net = random_network("mlp", d, 8, 2, "gelu", rng)
    p = fit_polynomial(net, g, 2)
    X = g.sample(400_000, rng)
    U = (X - g.mean) @ g.support  # coordinates on the support
    F = monomial_features(U, 2)
    beta, covs, _ = ols_with_robust_se(F, net(X))
    Xe = g.sample(100, rng)
    z = prediction_z_scores(monomial_features((Xe - g.mean) @ g.support, 2), beta, covs, p(Xe))
    assert np.max(np.abs(z)) < 5.0
    # off the support the approximant is defined by orthogonal projection onto it
    off = Xe + rng.standard_normal((100, d)) @ (np.eye(d) - g.support @ g.support.T)
    np.testing.assert_allclose(p(off), p(g.project_to_support(off)), rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- representation consistency
@pytest.mark.parametrize("kind", ["mlp", "glu"])
def test_dense_materialisation_save_load_and_torch_module(kind, tmp_path):
    rng = np.random.default_rng(7)
    net = random_network("mlp", 4, 6, 3, "gelu", rng) if kind == "mlp" else random_network("glu", 4, 5, 3, "silu", rng)
    g = random_gaussian(4, rng)
    p = fit_polynomial(net, g, 3)
    X = rng.standard_normal((30, 4))
    np.testing.assert_allclose(p.to_dense()(X), p(X), rtol=1e-10, atol=1e-10)
    q = load_polynomial(p.save(tmp_path / "p"))
    np.testing.assert_allclose(q(X), p(X), rtol=0, atol=0)
    with torch.no_grad():
        np.testing.assert_allclose(p.to_module()(torch.from_numpy(X)).numpy(), p(X), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(p.to_dense().to_module()(torch.from_numpy(X)).numpy(), p(X), rtol=1e-10, atol=1e-10)


def test_from_module_matches_torch():
    torch.manual_seed(0)
    seq = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.Linear(7, 2)).double()
    net = from_module(seq)
    X = np.random.default_rng(0).standard_normal((10, 5))
    with torch.no_grad():
        np.testing.assert_allclose(net(X), seq(torch.from_numpy(X)).numpy(), rtol=1e-12)
    assert net.to_module()(torch.from_numpy(X)).shape == (10, 2)


# ---------------------------------------------------------------- bad input
def test_bad_inputs_raise_clear_errors():
    rng = np.random.default_rng(8)
    net = random_network("mlp", 3, 4, 2, "relu", rng)
    g = Gaussian.standard(3)
    with pytest.raises(ValueError, match="degree"):
        fit_polynomial(net, g, -1)
    with pytest.raises(ValueError, match="degree"):
        fit_polynomial(net, g, 1.5)
    with pytest.raises(ValueError, match="d_in"):
        fit_polynomial(net, Gaussian.standard(4), 1)
    with pytest.raises(TypeError, match="distribution"):
        fit_polynomial(net, np.eye(3), 1)
    with pytest.raises(TypeError, match="network"):
        fit_polynomial("net", g, 1)
    with pytest.raises(ValueError, match="method"):
        fit_polynomial(net, g, 1, method="magic")
    with pytest.raises(ValueError, match="W2 must have shape"):
        MLP(np.ones((4, 3)), np.zeros(4), np.ones((2, 5)), np.zeros(2), "relu")
    with pytest.raises(ValueError, match="b1 must have shape"):
        MLP(np.ones((4, 3)), np.zeros(3), np.ones((2, 4)), np.zeros(2), "relu")
    with pytest.raises(ValueError, match="W1 contains"):
        MLP(np.full((4, 3), np.nan), np.zeros(4), np.ones((2, 4)), np.zeros(2), "relu")
    with pytest.raises(ValueError, match="relu"):  # unknown activation lists the known names
        MLP(np.ones((4, 3)), np.zeros(4), np.ones((2, 4)), np.zeros(2), "reluu")
    with pytest.raises(ValueError, match="V must have shape"):
        GLU(np.ones((4, 3)), None, np.ones((4, 2)), None)
    with pytest.raises(ValueError, match="X must have shape"):
        net(np.ones((5, 4)))
    p = fit_polynomial(net, g, 2)
    with pytest.raises(ValueError, match="k must be"):
        p.coefficients(3)
    with pytest.raises(TypeError, match="nn.Sequential"):
        from_module(torch.nn.Linear(3, 2))
