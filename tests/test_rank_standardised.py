"""Support and rank of Gaussians decided in standardised coordinates (gaussian.distributions).

Oracle: least squares on samples drawn directly (mean + sd * standard normal, not through the class under test)
with the degree-n monomials as features.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mlpinterp as mi


def _mixed_units_case(h=64, seed=0):
    """Inputs with variances 1e4 and 1e-7 (condition 1e11), read by the network at unit scale."""
    rng = np.random.default_rng(seed)
    var = np.array([1e4, 1e-7])
    W1 = rng.standard_normal((h, 2)) / np.sqrt(var)
    net = mi.MLP(W1, 0.5 * rng.standard_normal(h), rng.standard_normal((3, h)) / np.sqrt(h), np.zeros(3),
                 activation="relu")
    return net, np.array([3.0, -1e-3]), var


@pytest.mark.parametrize("degree", [1, 2])
def test_mixed_units_match_least_squares_on_samples(degree):
    net, mean, var = _mixed_units_case()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is dropped, so nothing is warned about
        g = mi.Gaussian(mean, np.diag(var))
    assert g.rank == 2
    p = mi.fit_polynomial(net, g, degree)
    X = mean + np.sqrt(var) * np.random.default_rng(1).standard_normal((200_000, 2))
    Y = net(X)
    Z = (X - mean) / np.sqrt(var)
    cols = [np.ones(len(X)), Z[:, 0], Z[:, 1]]
    if degree == 2:
        cols += [Z[:, 0] ** 2, Z[:, 0] * Z[:, 1], Z[:, 1] ** 2]
    F = np.stack(cols, 1)
    B, *_ = np.linalg.lstsq(F, Y, rcond=None)
    sst = ((Y - Y.mean(0)) ** 2).sum()
    least_squares = ((F @ B - Y) ** 2).sum() / sst
    ours = ((p(X) - Y) ** 2).sum() / sst
    assert least_squares <= ours <= 1.1 * least_squares, (ours, least_squares)
    exact = mi.fvu(net, p, g)  # the exact FVU agrees with the samples
    assert exact.method == "exact" and abs(exact.fvu - ours) <= 0.05 * ours


def test_standardised_factor_reproduces_the_covariance():
    rng = np.random.default_rng(0)
    sd = np.array([1e3, 1.0, 1e-4, 1e-6])
    Cr = np.corrcoef(rng.standard_normal((4, 50)))
    cov = Cr * np.outer(sd, sd)
    g = mi.Gaussian(np.zeros(4), cov)
    assert g.rank == 4
    L = g.factor
    np.testing.assert_allclose(L @ L.T / np.outer(sd, sd), Cr, atol=1e-9)  # relative to each coordinate's scale
    np.testing.assert_allclose(g.support.T @ g.support, np.eye(4), atol=1e-12)
    G = L.T @ L  # columns orthogonal: factor = support * sqrt(eigenvalue)
    np.testing.assert_allclose(G - np.diag(np.diag(G)), 0, atol=1e-9 * np.abs(G).max())


def test_constant_coordinates_still_drop_without_a_warning():
    X = np.random.default_rng(0).standard_normal((500, 4))
    X[:, 2] = 0.3  # a constant pixel
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = mi.Gaussian.from_data(X)
    assert g.rank == 3 and np.allclose(g.support[2], 0)


def test_a_resolvable_dropped_direction_is_warned_with_its_variance():
    eps = 1e-11  # x2 = x1 + a direction of variance ~eps: below PSD_RTOL relative, far above rounding
    cov = np.array([[1.0, 1.0], [1.0, 1.0 + eps]])
    with pytest.warns(RuntimeWarning, match=r"1 direction\(s\) dropped .*standardised.*variance dropped"):
        g = mi.Gaussian(np.zeros(2), cov)
    assert g.rank == 1
