"""E[phi(Y1) phi(Y2)] against hand-derived closed forms, scipy dblquad and Monte Carlo (standard-error tolerance)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from mlpinterp.gaussian.activations import get_activation
from mlpinterp.gaussian.bivariate import _inner_ev, gauss_product_ev
from mlpinterp.gaussian.univariate import gauss_ev, gauss_second_moment, hermite_coefficients


def arccos_kernel(s1, s2, rho):
    # Cho & Saul (2009), degree-1 arc-cosine kernel: for zero means,
    # E[relu(s1 Z1) relu(s2 Z2)] = s1 s2 / (2 pi) * (sqrt(1 - rho^2) + (pi - arccos(rho)) rho).
    return s1 * s2 / (2 * np.pi) * (np.sqrt(1 - rho**2) + (np.pi - np.arccos(rho)) * rho)


def test_relu_zero_mean_matches_arccos_kernel_and_error_is_a_bound():
    rho = np.array([-1.0, -0.999, -0.9, -0.5, 0.0, 0.3, 0.7, 0.95, 0.9999, 1.0])
    val, err = gauss_product_ev("relu", 0.0, 1.3, 0.0, 0.4, rho, return_error=True)
    ref = arccos_kernel(1.3, 0.4, rho)
    scale = math.sqrt(gauss_second_moment("relu", 0.0, 1.3) * gauss_second_moment("relu", 0.0, 0.4))
    assert np.all(np.abs(val - ref) <= 1e-10 * scale)
    assert np.all(np.abs(val - ref) <= err + 1e-15 * scale)  # the reported error covers the actual one
    assert np.all(err <= 1e-10 * scale)


def _dbl(name, m1, s1, m2, s2, r):
    f = get_activation(name).fn

    def g(w, z):
        y2 = m2 + s2 * (r * z + math.sqrt(1 - r * r) * w)
        return float(f(np.array(m1 + s1 * z)) * f(np.array(y2))) * math.exp(-(z * z + w * w) / 2) / (2 * math.pi)

    return integrate.dblquad(g, -11, 11, -11, 11, epsabs=1e-13, epsrel=1e-12)[0]


@pytest.mark.parametrize(
    "name,params",
    [
        ("gelu", (0.3, 1.0, -0.2, 2.0, 0.95)),
        ("tanh", (1.0, 0.5, 0.5, 1.5, -0.99)),
        ("silu", (0.3, 1.0, -0.2, 2.0, 0.5)),
        ("sigmoid", (-1.0, 3.0, 2.0, 0.3, 0.97)),
        ("gelu_tanh", (0.5, 1.0, 0.5, 1.0, 0.999)),
    ],
)
def test_smooth_activations_vs_dblquad(name, params):
    val, err = gauss_product_ev(name, *params, return_error=True)
    ref = _dbl(name, *params)
    assert abs(val - ref) <= 1e-9 * max(1.0, abs(ref)), (val, ref)
    assert err <= 1e-10 * max(1.0, abs(ref))


@pytest.mark.parametrize("name", ["relu", "elu", "leaky_relu:0.2"])
def test_kinked_activations_vs_monte_carlo(name):
    rng = np.random.default_rng(123)
    n = 1_000_000
    m1, s1, m2, s2, r = 0.4, 1.5, -0.3, 0.8, 0.85
    z1 = rng.standard_normal(n)
    z2 = r * z1 + math.sqrt(1 - r * r) * rng.standard_normal(n)
    f = get_activation(name).fn
    prod = f(m1 + s1 * z1) * f(m2 + s2 * z2)
    est, se = prod.mean(), prod.std(ddof=1) / math.sqrt(n)
    val = gauss_product_ev(name, m1, s1, m2, s2, r)
    assert abs(val - est) <= 5 * se, (val, est, se)


def test_user_callable_vs_closed_form():
    # E[cos(Y1) cos(Y2)] = (E[cos(Y1+Y2)] + E[cos(Y1-Y2)]) / 2 with E[cos(N(m, v))] = cos(m) exp(-v/2)
    m1, s1, m2, s2, r = 0.3, 0.9, -0.5, 1.2, np.array([-0.6, 0.2, 0.8])
    val = gauss_product_ev(np.cos, m1, s1, m2, s2, r)
    vp = s1**2 + s2**2 + 2 * r * s1 * s2
    vm = s1**2 + s2**2 - 2 * r * s1 * s2
    ref = 0.5 * (np.cos(m1 + m2) * np.exp(-vp / 2) + np.cos(m1 - m2) * np.exp(-vm / 2))
    np.testing.assert_allclose(val, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["relu", "gelu", "tanh", "elu"])
def test_degenerate_cases(name):
    act = get_activation(name)
    mu2, s2 = np.array([-1.0, 0.2, 2.0]), np.array([0.5, 1.0, 3.0])
    # sigma1 = 0: Y1 is the constant mu1
    np.testing.assert_allclose(
        gauss_product_ev(name, 0.7, 0.0, mu2, s2, 0.4), act.fn(np.array(0.7)) * gauss_ev(name, mu2, s2), rtol=1e-12
    )
    # rho = 1 and equal parameters: E[phi(Y)^2]
    np.testing.assert_allclose(gauss_product_ev(name, mu2, s2, mu2, s2, 1.0), gauss_second_moment(name, mu2, s2), rtol=1e-10)
    # rho = -1: E[phi(mu1 + s1 Z) phi(mu2 - s2 Z)] by 1-D scipy quadrature
    for m, s in zip(mu2, s2, strict=True):
        ref = integrate.quad(
            lambda z, m=m, s=s: act.fn(np.array(0.1 + 0.6 * z)) * act.fn(np.array(m - s * z)) * math.exp(-z * z / 2)
            / math.sqrt(2 * math.pi),
            -12, 12, points=sorted({-0.1 / 0.6, m / s}), limit=200, epsabs=1e-14, epsrel=1e-12,
        )[0]
        assert abs(gauss_product_ev(name, 0.1, 0.6, m, s, -1.0) - ref) <= 1e-10 * max(1, abs(ref))
    assert np.all(np.isfinite(gauss_product_ev(name, 0.0, 0.0, 0.0, 0.0, 1.0)))


def test_identity_is_exact():
    val, err = gauss_product_ev("identity", 1.0, 2.0, -3.0, 0.5, 0.25, return_error=True)
    assert val == 1.0 * -3.0 + 0.25 * 2.0 * 0.5 and err == 0.0


def test_grid_shape_symmetry_psd_and_diagonal():
    rng = np.random.default_rng(0)
    d, d_in = 96, 20
    W = rng.normal(size=(d, d_in)) / math.sqrt(d_in)
    b = rng.normal(size=d) * 0.5
    C = W @ W.T
    s = np.sqrt(np.diag(C))
    R = C / np.outer(s, s)
    for name in ("relu", "gelu_tanh"):
        G, err = gauss_product_ev(name, b[:, None], s[:, None], b[None, :], s[None, :], R, return_error=True)
        assert G.shape == (d, d) and err.shape == (d, d)
        np.testing.assert_allclose(G, G.T, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.diag(G), gauss_second_moment(name, b, s), rtol=1e-10)
        assert np.linalg.eigvalsh(G).min() >= -1e-10 * np.abs(G).max()
        scale = np.sqrt(np.outer(np.diag(G), np.diag(G)))
        assert np.all(err <= 1e-10 * scale)


def test_grid_matches_mehler_identity_from_hermite_coefficients():
    # independent check of the Mehler branch on weakly correlated pairs: Monte Carlo of the full grid
    rng = np.random.default_rng(5)
    mu = np.array([-0.5, 0.1, 0.8])
    s = np.array([0.7, 1.1, 2.0])
    R = np.array([[1.0, 0.3, -0.2], [0.3, 1.0, 0.1], [-0.2, 0.1, 1.0]])
    n = 400_000
    Z = rng.standard_normal((n, 3)) @ np.linalg.cholesky(R).T
    Y = mu + s * Z
    F = get_activation("silu").fn(Y)
    est = F.T @ F / n
    se = np.sqrt(((F[:, :, None] * F[:, None, :]) ** 2).mean(0) - est**2) / math.sqrt(n)
    G = gauss_product_ev("silu", mu[:, None], s[:, None], mu[None, :], s[None, :], R)
    assert np.all(np.abs(G - est) <= 5 * se)


@pytest.mark.parametrize("name", ["gelu_tanh", "silu", "sigmoid", "tanh", "softplus"])
def test_inner_gauss_hermite_branch(name):
    m = np.array([-30.0, -3.0, 0.0, 0.7, 5.0, 40.0])
    for v in (1e-9, 0.1, 0.25):
        got = _inner_ev(get_activation(name), m, np.full(m.shape, v))
        ref = hermite_coefficients(name, m, v, 0)[:, 0]
        scale = gauss_ev(lambda y, f=get_activation(name).fn: np.abs(f(y)), m, v)
        assert np.all(np.abs(got - ref) <= 1e-12 * scale + 1e-300), (name, v, got, ref)


def test_validation():
    with pytest.raises(ValueError, match=r"rho must lie in \[-1, 1\]"):
        gauss_product_ev("relu", 0.0, 1.0, 0.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="rho contains"):
        gauss_product_ev("relu", 0.0, 1.0, 0.0, 1.0, np.nan)
    with pytest.raises(ValueError, match="sigma2 must be >= 0"):
        gauss_product_ev("relu", 0.0, 1.0, 0.0, -1.0, 0.5)
    with pytest.raises(ValueError, match="mu1 contains"):
        gauss_product_ev("relu", np.inf, 1.0, 0.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="broadcastable"):
        gauss_product_ev("relu", np.zeros(2), 1.0, np.zeros(3), 1.0, 0.5)
    with pytest.raises(ValueError, match="unknown activation"):
        gauss_product_ev("nope", 0.0, 1.0, 0.0, 1.0, 0.5)
    # rounding slack: |rho| = 1 + 1e-15 is accepted and clipped
    assert np.isfinite(gauss_product_ev("relu", 0.0, 1.0, 0.0, 1.0, 1.0 + 1e-15))
