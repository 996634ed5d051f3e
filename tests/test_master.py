"""Isserlis and the master theorem against Monte Carlo (standard-error tolerances) and quadrature."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from mlpinterp.gaussian.master import central_moment, master_theorem_ev, noncentral_moment, perfect_matchings


def test_perfect_matching_counts():
    # (n-1)!! perfect matchings of n points
    assert [len(perfect_matchings(n)) for n in (0, 2, 4, 6, 8)] == [1, 1, 3, 15, 105]
    assert perfect_matchings(3) == ()


@pytest.mark.parametrize("idx", [(0, 1), (0, 0, 1, 2), (1, 1, 1, 1), (0, 1, 2), (0, 0, 1, 1, 2, 2)])
def test_noncentral_isserlis_against_monte_carlo(idx):
    rng = np.random.default_rng(0)
    L = rng.standard_normal((3, 3)) / 2
    mean, cov = np.array([0.3, -0.5, 0.8]), L @ L.T + 0.1 * np.eye(3)
    X = rng.multivariate_normal(mean, cov, size=1_000_000)
    vals = np.prod(X[:, list(idx)], axis=1)
    se = vals.std() / np.sqrt(len(vals))
    assert abs(noncentral_moment(mean, cov, idx) - vals.mean()) < 5 * se


def test_central_isserlis_hand_derivation():
    # E[x^4] = 3 s^4 ; E[x0^2 x1^2] = S00 S11 + 2 S01^2
    cov = np.array([[2.0, 0.3], [0.3, 0.5]])
    assert central_moment(cov, (0, 0, 0, 0)) == pytest.approx(3 * 4.0)
    assert central_moment(cov, (0, 0, 1, 1)) == pytest.approx(2.0 * 0.5 + 2 * 0.09)


def _regress(mean, cov):
    """alpha, beta, eps_cov of Y = (entries 1..n) regressed on X = entry 0."""
    vx = cov[0, 0]
    beta = cov[0, 1:] / vx
    eps = cov[1:, 1:] - np.outer(beta, beta) * vx
    return mean[1:], beta, eps


@pytest.mark.parametrize("act", ["relu", "gelu", "tanh"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_master_theorem_against_monte_carlo(act, n):
    from mlpinterp.gaussian.activations import get_activation

    rng = np.random.default_rng(n)
    d = n + 1
    L = rng.standard_normal((d, d)) / np.sqrt(d)
    mean, cov = rng.normal(0.2, 0.7, d), L @ L.T + 0.2 * np.eye(d)
    alpha, beta, eps = _regress(mean, cov)
    got = master_theorem_ev(act, mean[0], cov[0, 0], alpha, beta, eps)
    S = rng.multivariate_normal(mean, cov, size=1_000_000)
    vals = get_activation(act).fn(S[:, 0]) * np.prod(S[:, 1:], axis=1)
    assert abs(got - vals.mean()) < 5 * vals.std() / np.sqrt(len(vals))


def test_master_theorem_n2_constant_term_includes_residual_covariance():
    # phi = 1 (a constant "activation" through a callable): E[Y1 Y2] = alpha1 alpha2 + beta1 beta2 Var X + Cov(eps1, eps2).
    mean = np.array([0.5, 1.0, -2.0])
    cov = np.array([[1.0, 0.3, 0.2], [0.3, 1.0, 0.6], [0.2, 0.6, 2.0]])
    alpha, beta, eps = _regress(mean, cov)
    got = master_theorem_ev(lambda y: np.ones_like(y), mean[0], cov[0, 0], alpha, beta, eps)
    assert got == pytest.approx(mean[1] * mean[2] + cov[1, 2], rel=1e-10)


def test_master_theorem_n1_against_quadrature():
    # E[relu(X) Y] with Y = a + b (X - m) + eps: integrate relu(x) (a + b (x - m)) against N(m, v).
    m, v, a, b = 0.4, 2.0, 1.5, -0.7
    ref, _ = integrate.quad(lambda x: max(x, 0) * (a + b * (x - m)) * stats.norm.pdf(x, m, np.sqrt(v)), -40, 40,
                            points=[0.0], epsabs=1e-13, epsrel=1e-13)
    got = master_theorem_ev("relu", m, v, np.array([a]), np.array([b]), np.array([[0.9]]))
    assert got == pytest.approx(ref, rel=1e-10)
