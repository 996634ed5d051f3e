"""Gaussian / GaussianMixture: validation, sampling moments (Monte Carlo with standard errors), from_labels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlpinterp import Gaussian, GaussianMixture


def test_sampling_moments_within_standard_error():
    rng = np.random.default_rng(0)
    L = rng.standard_normal((3, 3))
    g = Gaussian(np.array([1.0, -2.0, 0.5]), L @ L.T)
    X = g.sample(200_000, 1)
    se_mean = np.sqrt(np.diag(g.cov) / len(X))
    assert np.all(np.abs(X.mean(0) - g.mean) < 5 * se_mean)
    # Var of the sample covariance entry (i, j) under a Gaussian: (S_ii S_jj + S_ij^2) / n
    se_cov = np.sqrt((np.outer(np.diag(g.cov), np.diag(g.cov)) + g.cov**2) / len(X))
    assert np.all(np.abs(np.cov(X.T, bias=True) - g.cov) < 5 * se_cov)


def test_torch_inputs_and_singular_support():
    g = Gaussian(torch.zeros(3), torch.diag(torch.tensor([1.0, 0.0, 2.0])))
    assert g.rank == 2 and g.is_singular
    X = g.sample(100, 0)
    assert np.all(X[:, 1] == 0)
    np.testing.assert_allclose(g.factor @ g.factor.T, g.cov, atol=1e-14)


def test_mixture_moments_match_samples_and_from_labels():
    rng = np.random.default_rng(2)
    mix = GaussianMixture(np.array([0.2, 0.5, 0.3]), rng.standard_normal((3, 2)),
                          np.stack([np.eye(2) * s for s in (0.5, 1.0, 2.0)]))
    X, z = mix.sample(300_000, 3, return_labels=True)
    np.testing.assert_allclose(np.bincount(z) / len(z), mix.weights, atol=5 * np.sqrt(0.25 / len(z)))
    se = np.sqrt(np.diag(mix.cov) / len(X))
    assert np.all(np.abs(X.mean(0) - mix.mean) < 5 * se)
    refit = GaussianMixture.from_labels(X, z)
    np.testing.assert_allclose(refit.weights, np.bincount(z) / len(z), rtol=1e-12)
    for k in range(3):
        np.testing.assert_allclose(refit.means[k], X[z == k].mean(0), rtol=1e-12)
        np.testing.assert_allclose(refit.covs[k], np.cov(X[z == k].T, bias=True), rtol=1e-10, atol=1e-12)
    pooled = mix.pooled()
    np.testing.assert_allclose(pooled.cov, np.cov(X.T, bias=True), atol=0.05)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(mean=np.zeros(2), cov=np.eye(3)), "cov must have shape"),
        (dict(mean=np.zeros((2, 1)), cov=np.eye(2)), "mean must have shape"),
        (dict(mean=np.zeros(2), cov=np.array([[1.0, 0.5], [0.0, 1.0]])), "symmetric"),
        (dict(mean=np.zeros(2), cov=np.array([[1.0, 2.0], [2.0, 1.0]])), "positive semi-definite"),
        (dict(mean=np.array([np.nan, 0.0]), cov=np.eye(2)), "mean contains"),
        (dict(mean=np.zeros(2), cov=np.array([[np.inf, 0], [0, 1.0]])), "cov contains"),
    ],
)
def test_gaussian_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Gaussian(**kwargs)


def test_gaussian_type_error():
    with pytest.raises(TypeError, match="mean"):
        Gaussian("zeros", np.eye(2))


@pytest.mark.parametrize(
    "weights,means,covs,match",
    [
        (np.array([0.5, 0.6]), np.zeros((2, 2)), np.stack([np.eye(2)] * 2), "sum to 1"),
        (np.array([1.5, -0.5]), np.zeros((2, 2)), np.stack([np.eye(2)] * 2), "non-negative"),
        (np.array([0.5, 0.5]), np.zeros((3, 2)), np.stack([np.eye(2)] * 2), r"means must have shape \[K=2"),
        (np.array([0.5, 0.5]), np.zeros((2, 2)), np.stack([np.eye(2)] * 3), "covs must have shape"),
        (np.array([0.5, 0.5]), np.zeros((2, 2)), np.stack([np.eye(2), -np.eye(2)]), r"covs\[1\] must be positive"),
    ],
)
def test_mixture_validation(weights, means, covs, match):
    with pytest.raises(ValueError, match=match):
        GaussianMixture(weights, means, covs)


def test_from_labels_validation():
    with pytest.raises(ValueError, match="y must have shape"):
        GaussianMixture.from_labels(np.zeros((5, 2)), np.zeros(4))
    with pytest.raises(ValueError, match=">= 2 samples"):
        GaussianMixture.from_labels(np.random.default_rng(0).standard_normal((5, 2)), np.array([0, 0, 0, 0, 1]))


def test_ledoit_wolf_shrinkage_matches_sklearn_estimator():
    from sklearn.covariance import LedoitWolf

    rng = np.random.default_rng(4)
    X = rng.standard_normal((30, 40)) * np.linspace(0.01, 1, 40)  # n < d: the empirical covariance is singular
    g = Gaussian.from_data(X, shrinkage="ledoit-wolf")
    np.testing.assert_allclose(g.cov, LedoitWolf().fit(X).covariance_, rtol=1e-12)
    assert not g.is_singular and Gaussian.from_data(X).is_singular
    mix = GaussianMixture.from_labels(X, np.arange(30) % 2, shrinkage="ledoit-wolf")
    np.testing.assert_allclose(mix.covs[1], LedoitWolf().fit(X[1::2]).covariance_, rtol=1e-12)
    with pytest.raises(ValueError, match="shrinkage"):
        Gaussian.from_data(X, shrinkage="oas")
