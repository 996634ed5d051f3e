"""Univariate Gaussian integrals against independent oracles.

Primary oracle: mpmath tanh-sinh quadrature (``mp.quad``) at 30 digits over z with Y = mu + sigma z, split
at the activation's transition point z0 = -mu/sigma (geometrically graded at the feature scale
min(1/sigma, 1/(1+|z0|))) and at fixed points, with the integrand rescaled to O(1) so that mpmath's
absolute stopping rule acts as a relative one. Activations are re-defined in mpmath from their textbook
formulas. Accuracy requirement (module docstring of ``univariate``): |err| <= 1e-10 * scale, with
scale = E[|phi(Y)| |He_k(Z)|] / k! (or E[|phi(Y)| |Y|^k]), which we estimate with scipy.integrate.quad in
float64 (one digit of scale suffices). Property tests (hypothesis) use scipy.integrate.quad.
"""

from __future__ import annotations

import math
import warnings

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from mlpinterp.gaussian.activations import get_activation
from mlpinterp.gaussian.univariate import (
    gauss_derivative_ev,
    gauss_ev,
    gauss_moments,
    gauss_second_moment,
    hermite_coefficients,
)

TOL = 1e-10

MP_ACT = {
    "identity": lambda y: y,
    "relu": lambda y: y if y > 0 else mp.mpf(0),
    "leaky_relu": lambda y: y if y > 0 else mp.mpf("0.01") * y,
    "leaky_relu:0.2": lambda y: y if y > 0 else mp.mpf("0.2") * y,
    "gelu": lambda y: y * mp.ncdf(y),
    # 0.5 (1 + tanh u) written as 1 / (1 + exp(-2u)) to avoid cancellation at 30 digits
    "gelu_tanh": lambda y: y / (1 + mp.exp(-2 * mp.sqrt(2 / mp.pi) * (y + mp.mpf("0.044715") * y**3))),
    "quick_gelu": lambda y: y / (1 + mp.exp(-mp.mpf("1.702") * y)),
    "silu": lambda y: y / (1 + mp.exp(-y)),
    "sigmoid": lambda y: 1 / (1 + mp.exp(-y)),
    "tanh": mp.tanh,
    "softplus": lambda y: mp.log1p(mp.exp(y)) if y < 0 else y + mp.log1p(mp.exp(-y)),
    "elu": lambda y: y if y > 0 else mp.expm1(y),
}
KINKS = {"relu": (0.0,), "leaky_relu": (0.0,), "leaky_relu:0.2": (0.0,), "elu": (0.0,)}


def _mp_he(k, z):
    a, b = mp.mpf(1), z
    if k == 0:
        return a
    for i in range(1, k):
        a, b = b, z * b - i * a
    return b


def _mp_points(mu, s, kinks):
    z0 = -mu / s
    P = {mp.mpf(v) for v in (-10, -5, 0, 5, 10)}
    if abs(z0) < 45:
        P.add(z0)
        g = min(1 / s, 1 / (1 + abs(z0))) / 4
        while g < 12:
            P.update((z0 + g, z0 - g))
            g *= 4
    for c in kinks:
        zc = (c - mu) / s
        if abs(zc) < 45:
            P.add(zc)
    return [-mp.inf, *sorted(P), mp.inf]


def mp_expect(name, mu, s, weight, dps=30):
    """mpmath E[phi(Y) weight(z, y)] at ``dps`` digits, Y = mu + s z (s > 0)."""
    f = MP_ACT[name]
    with mp.workdps(dps):
        mu, s = mp.mpf(mu), mp.mpf(s)
        P = _mp_points(mu, s, KINKS.get(name, ()))

        def F(z):
            y = mu + s * z
            return f(y) * weight(z, y) * mp.exp(-z * z / 2) / mp.sqrt(2 * mp.pi)

        fin = [p for p in P if mp.isfinite(p)]
        S = max(abs(F(z)) for z in fin + [(a + b) / 2 for a, b in zip(fin[:-1], fin[1:], strict=True)])
        S = S if S > 0 else mp.mpf(1)
        return float(mp.quad(lambda z: F(z) / S, P) * S)


def sp_expect(name, mu, s, weight, absolute=False):
    """float64 scipy.integrate.quad of E[phi(Y) weight(z, y)] (rescaled, split at z0 and kinks)."""
    act = get_activation(name)
    z0 = float(np.clip(-mu / s, -40, 40))
    lo, hi = min(-14.0, z0 - 14.0), max(14.0, z0 + 14.0)
    pts = sorted({z0, *[float(np.clip((c - mu) / s, lo, hi)) for c in act.kinks]} - {lo, hi})

    def F(z):
        y = mu + s * z
        v = float(act.fn(np.array(y))) * weight(z, y) * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
        return abs(v) if absolute else v

    grid = np.linspace(lo, hi, 201)
    S = max(max(abs(F(z)) for z in grid), max((abs(F(p)) for p in pts), default=0.0)) or 1.0
    with warnings.catch_warnings():  # roundoff warnings: the tolerances of the callers allow for them
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        val, _ = integrate.quad(lambda z: F(z) / S, lo, hi, points=pts or None, limit=500, epsabs=0, epsrel=1e-12)
    return val * S


def he_weight(k):
    return lambda z, y: _mp_he(k, z) if isinstance(z, mp.mpf) else float(np.polynomial.hermite_e.hermeval(z, [0] * k + [1]))


# (mu, sigma) regimes: bulk, far left tail h = -30, far right tail h = +30, narrow, wide
BULK, LEFT, RIGHT, NARROW, WIDE = (0.7, 1.3), (-300.0, 10.0), (30.0, 1.0), (5e-4, 1e-3), (-2000.0, 1e3)
MP_CASES = [
    ("relu", LEFT),
    ("relu", NARROW),
    ("leaky_relu", LEFT),
    ("leaky_relu:0.2", BULK),
    ("gelu", LEFT),
    ("gelu", WIDE),
    ("gelu_tanh", LEFT),
    ("gelu_tanh", WIDE),
    ("silu", LEFT),
    ("silu", NARROW),
    ("quick_gelu", LEFT),
    ("quick_gelu", BULK),
    ("quick_gelu", WIDE),
    ("sigmoid", WIDE),
    ("sigmoid", RIGHT),
    ("tanh", NARROW),
    ("softplus", LEFT),
    ("elu", WIDE),
    ("elu", (-3.0, 0.1)),
    ("identity", BULK),
]


@pytest.mark.parametrize("name,case", MP_CASES)
def test_hermite_coefficients_vs_mpmath(name, case):
    mu, s = case
    ks = (0, 1, 8) if name != "identity" else (0, 1, 2, 8)
    c = hermite_coefficients(name, mu, s, 8)
    assert c.shape == (9,) and c.dtype == np.float64
    for k in ks:
        ref = mp_expect(name, mu, s, lambda z, y, k=k: _mp_he(k, z)) / math.factorial(k)
        scale = sp_expect(name, mu, s, he_weight(k), absolute=True) / math.factorial(k)
        assert abs(c[k] - ref) <= TOL * max(scale, abs(ref)), (name, case, k, c[k], ref, scale)


@pytest.mark.parametrize(
    "name,case", [("relu", LEFT), ("relu", BULK), ("leaky_relu", (-5.0, 1.0)), ("silu", LEFT), ("gelu", LEFT),
                  ("tanh", WIDE), ("identity", (-2.0, 0.5)), ("quick_gelu", LEFT), ("quick_gelu", BULK)]
)
def test_moments_vs_mpmath(name, case):
    mu, s = case
    m = gauss_moments(name, mu, s, 8)
    assert m.shape == (9,)
    for k in (0, 1, 5, 8):
        ref = mp_expect(name, mu, s, lambda z, y, k=k: y**k)
        scale = sp_expect(name, mu, s, lambda z, y, k=k: abs(y) ** k, absolute=True)
        assert abs(m[k] - ref) <= TOL * max(scale, abs(ref)), (name, case, k, m[k], ref)


@pytest.mark.parametrize(
    "name,case", [("relu", LEFT), ("leaky_relu", LEFT), ("gelu", BULK), ("gelu", LEFT), ("elu", WIDE),
                  ("sigmoid", NARROW), ("identity", BULK), ("quick_gelu", LEFT), ("quick_gelu", WIDE)]
)
def test_second_moment_vs_mpmath(name, case):
    mu, s = case
    ref = mp_expect(name, mu, s, lambda z, y: MP_ACT[name](y))
    got = gauss_second_moment(name, mu, s)
    assert abs(got - ref) <= TOL * abs(ref), (name, case, got, ref)  # non-negative integrand: relative


def test_relu_tail_beats_naive_formula():
    # h = mu / sigma = -35. The textbook form mu Phi(h) + sigma pdf(h) with Phi = (1 + erf(h / sqrt 2)) / 2
    # returns sigma pdf(h), about h^2 = 1225 times the true value; ours keeps relative accuracy 1e-12.
    from scipy.special import erf

    mu, s = -35.0, 1.0
    h = mu / s
    naive = mu * 0.5 * (1 + erf(h / math.sqrt(2))) + s * math.exp(-h * h / 2) / math.sqrt(2 * math.pi)
    ref = mp_expect("relu", mu, s, lambda z, y: 1)
    got = gauss_ev("relu", mu, s)
    assert abs(got - ref) <= 1e-12 * ref
    assert naive > 1000 * ref


# ----------------------------------------------------------------------------- derivatives


@pytest.mark.parametrize("name", ["relu", "leaky_relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "silu", "softplus", "elu",
                                  "quick_gelu"])
def test_derivative_ev_by_stein_identity_with_mpmath(name):
    # Gaussian integration by parts: E[phi^{(j)}(Y)] = E[phi(Y) He_j(Z)] / sigma^j, valid distributionally
    # (relu'' = delta, elu''' has a delta); the right side is computed by mpmath quadrature.
    for case in ((0.4, 2.0), (-0.3, 0.2)) if name in ("sigmoid", "elu") else ((-0.3, 0.2),):
        mu, s = case
        for j in (1, 3):
            ref = mp_expect(name, mu, s, lambda z, y, j=j: _mp_he(j, z)) / s**j
            got = gauss_derivative_ev(name, mu, s, j)
            scale = sp_expect(name, mu, s, he_weight(j), absolute=True) / s**j
            assert abs(got - ref) <= 1e-9 * max(scale, abs(ref)), (name, case, j, got, ref)


@pytest.mark.parametrize(
    "name,mu,s,j", [("gelu_tanh", -9.75, 0.456, 2), ("gelu_tanh", -22.06, 0.99, 3), ("quick_gelu", -20.0, 0.7, 3)]
)
def test_derivative_ev_tails_vs_mpmath(name, mu, s, j):
    # left tails, where 1 + tanh(u) differences (torch's autograd formula) lose every digit; the Stein
    # identity oracle cancels to ~1e-20 of its terms here, hence 60 digits.
    ref = mp_expect(name, mu, s, lambda z, y: _mp_he(j, z), dps=60) / s**j
    got = gauss_derivative_ev(name, mu, s, j)
    assert abs(got - ref) <= 1e-10 * abs(ref), (got, ref)


def test_relu_second_derivative_is_density_at_zero():
    # E[relu''(Y)] = E[delta(Y)] = pdf_Y(0) = exp(-mu^2 / (2 s^2)) / (s sqrt(2 pi)) (hand derivation)
    mu, s = np.array([-1.0, 0.0, 2.5]), 0.7
    np.testing.assert_allclose(
        gauss_derivative_ev("relu", mu, s, 2), np.exp(-(mu**2) / (2 * s * s)) / (s * math.sqrt(2 * math.pi)), rtol=1e-14
    )
    # E[relu'(Y)] = P(Y > 0)
    from scipy.stats import norm

    np.testing.assert_allclose(gauss_derivative_ev("relu", mu, s, 1), norm.sf(0, loc=mu, scale=s), rtol=1e-14)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "sigmoid", "tanh", "silu", "softplus", "elu", "quick_gelu"])
def test_pointwise_derivative_at_sigma_zero_vs_mpmath_diff(name):
    for y in (-2.3, 0.6):
        for j in (1, 2, 4):
            with mp.workdps(30):
                ref = float(mp.diff(MP_ACT[name], mp.mpf(y), j))
            got = gauss_derivative_ev(name, y, 0.0, j)
            assert abs(got - ref) <= 1e-12 * max(1.0, abs(ref)), (name, y, j, got, ref)


def test_derivative_identity_between_functions():
    # extra consistency check: c_k = sigma^k E[phi^{(k)}(Y)] / k!
    mu, s = np.array([-1.0, 0.2, 3.0]), np.array([0.5, 1.5, 4.0])
    for name in ("relu", "gelu", "silu", "tanh", "elu"):
        c = hermite_coefficients(name, mu, s, 5)
        for k in range(6):
            d = gauss_derivative_ev(name, mu, s, k)
            np.testing.assert_allclose(c[:, k], s**k * d / math.factorial(k), rtol=1e-8, atol=1e-12)


# ----------------------------------------------------------------------------- user callables


def test_user_callable_sin_closed_form():
    # E[sin(mu + s Z) He_k(Z)] = s^k E[sin^{(k)}(Y)] = s^k sin(mu + k pi / 2) exp(-s^2 / 2)  (Stein +
    # characteristic function); E[sin^2(Y)] = (1 - cos(2 mu) exp(-2 s^2)) / 2.
    mu = np.array([-3.0, 0.0, 0.4, 2.0])
    s = np.array([0.1, 1.0, 2.5, 0.001])
    c = hermite_coefficients(np.sin, mu, s, 8)
    for k in range(9):
        ref = s**k * np.sin(mu + k * np.pi / 2) * np.exp(-(s**2) / 2) / math.factorial(k)
        scale = s**k / math.sqrt(math.factorial(k))  # >= E|sin(Y) He_k(Z)|/k! by Cauchy-Schwarz (|sin| <= 1)
        np.testing.assert_allclose(c[:, k], ref, rtol=0, atol=TOL * scale.max())
    np.testing.assert_allclose(gauss_second_moment(np.sin, mu, s), (1 - np.cos(2 * mu) * np.exp(-2 * s**2)) / 2, rtol=1e-12)
    np.testing.assert_allclose(gauss_derivative_ev(np.sin, mu, s, 2), -np.sin(mu) * np.exp(-(s**2) / 2), atol=1e-9)


def test_torch_module_and_activation_inputs():
    torch = pytest.importorskip("torch")
    a = hermite_coefficients(torch.nn.GELU(approximate="tanh"), 0.3, 1.2, 4)
    b = hermite_coefficients(get_activation("gelu_tanh"), 0.3, 1.2, 4)
    np.testing.assert_array_equal(a, b)
    t = hermite_coefficients("relu", torch.tensor([0.1, 0.2]), torch.tensor(1.0), 2)
    assert t.shape == (2, 3)


# ----------------------------------------------------------------------------- point mass, shapes


@pytest.mark.parametrize("name", ["identity", "relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "softplus", "elu",
                                  "quick_gelu"])
def test_point_mass_and_continuity(name):
    act = get_activation(name)
    mu = np.array([-2.0, -1e-13, 0.0, 0.5, 3.0])
    c0 = hermite_coefficients(name, mu, 0.0, 4)
    np.testing.assert_array_equal(c0[:, 0], act.fn(mu))
    np.testing.assert_array_equal(c0[:, 1:], 0.0)
    np.testing.assert_array_equal(gauss_ev(name, mu, 0.0), act.fn(mu))
    np.testing.assert_array_equal(gauss_second_moment(name, mu, 0.0), act.fn(mu) ** 2)
    np.testing.assert_array_equal(gauss_moments(name, mu, 0.0, 3), act.fn(mu)[:, None] * mu[:, None] ** np.arange(4))
    tiny = hermite_coefficients(name, mu, 1e-12, 4)
    assert np.all(np.isfinite(tiny))
    # |c_k(sigma)| <= sigma^k sup|phi^(k)| / k! -> continuity at sigma = 0 (Lipschitz constants <= 2 here)
    np.testing.assert_allclose(tiny, c0, rtol=0, atol=1e-11)
    for j in range(3):
        d = gauss_derivative_ev(name, mu, 1e-12, j)
        assert not np.any(np.isnan(d))
    assert np.all(np.isfinite(gauss_moments(name, mu, 1e-12, 4)))
    assert np.all(np.isfinite(gauss_second_moment(name, mu, 1e-12)))


def test_relu_derivative_limits_at_kink_sigma_zero():
    assert gauss_derivative_ev("relu", 0.0, 0.0, 1) == 0.5  # = lim Phi(0 / s)
    assert gauss_derivative_ev("relu", 0.0, 0.0, 2) == np.inf  # pdf_Y(0) -> inf
    assert gauss_derivative_ev("relu", 0.0, 0.0, 3) == 0.0  # He_1(0) pdf(0) / s^2 = 0
    assert gauss_derivative_ev("relu", 1.0, 0.0, 2) == 0.0


def test_broadcast_shapes():
    mu = np.zeros((3, 1))
    s = np.ones(4)
    assert hermite_coefficients("silu", mu, s, 2).shape == (3, 4, 3)
    assert gauss_moments("relu", mu, s, 1).shape == (3, 4, 2)
    assert gauss_ev("gelu", mu, s).shape == (3, 4)
    assert gauss_second_moment("tanh", mu, s).shape == (3, 4)
    assert gauss_derivative_ev("elu", mu, s, 1).shape == (3, 4)
    assert gauss_ev("relu", 0.0, 1.0).shape == ()
    assert hermite_coefficients("relu", np.zeros(0), 1.0, 2).shape == (0, 3)


def test_vectorised_equals_scalar_loop():
    rng = np.random.default_rng(1)
    mu = rng.normal(size=7) * 3
    s = np.exp(rng.normal(size=7))
    for name in ("gelu_tanh", "elu", "relu"):
        batch = hermite_coefficients(name, mu, s, 3)
        loop = np.stack([hermite_coefficients(name, m, t, 3) for m, t in zip(mu, s, strict=True)])
        np.testing.assert_allclose(batch, loop, rtol=1e-14, atol=1e-15)  # only summation order differs


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "call",
    [
        lambda mu, s: gauss_ev("relu", mu, s),
        lambda mu, s: gauss_second_moment("silu", mu, s),
        lambda mu, s: gauss_moments("relu", mu, s, 2),
        lambda mu, s: gauss_derivative_ev("tanh", mu, s, 1),
        lambda mu, s: hermite_coefficients("gelu", mu, s, 2),
    ],
)
def test_bad_mu_sigma(call):
    with pytest.raises(ValueError, match="mu contains"):
        call(np.array([0.0, np.nan]), 1.0)
    with pytest.raises(ValueError, match="sigma contains"):
        call(0.0, np.inf)
    with pytest.raises(ValueError, match=r"sigma must be >= 0"):
        call(0.0, -1.0)
    with pytest.raises(ValueError, match="broadcastable"):
        call(np.zeros(3), np.ones(2))
    with pytest.raises(TypeError, match="mu must be"):
        call("a", 1.0)


def test_bad_orders():
    with pytest.raises(ValueError, match="n must be a non-negative int, got -1"):
        hermite_coefficients("relu", 0.0, 1.0, -1)
    with pytest.raises(ValueError, match="kmax must be a non-negative int"):
        gauss_moments("relu", 0.0, 1.0, -2)
    with pytest.raises(ValueError, match="j must be a non-negative int"):
        gauss_derivative_ev("relu", 0.0, 1.0, -1)
    with pytest.raises(TypeError, match="n must be a non-negative int"):
        hermite_coefficients("relu", 0.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="unknown activation"):
        gauss_ev("nope", 0.0, 1.0)


def test_sigma_zero_derivative_needs_derivative():
    with pytest.raises(ValueError, match="no available derivative"):
        gauss_derivative_ev(lambda y: np.abs(y) ** 1.5, 0.3, 0.0, 1)


# ----------------------------------------------------------------------------- property-based


ACTS = ["relu", "leaky_relu:0.2", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "softplus", "elu"]


@pytest.mark.slow
@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(ACTS),
    h=st.floats(-12.0, 12.0),
    log_s=st.floats(-3.0, 3.0),
    k=st.integers(0, 8),
)
def test_hermite_property_vs_scipy_quad(name, h, log_s, k):
    s = 10.0**log_s
    mu = h * s
    got = hermite_coefficients(name, mu, s, k)[k]
    ref = sp_expect(name, mu, s, he_weight(k)) / math.factorial(k)
    scale = sp_expect(name, mu, s, he_weight(k), absolute=True) / math.factorial(k)
    assert abs(got - ref) <= 1e-9 * scale, (name, mu, s, k, got, ref, scale)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(name=st.sampled_from(ACTS), h=st.floats(-8.0, 8.0), log_s=st.floats(-2.0, 2.0), k=st.integers(0, 6))
def test_moments_property_vs_scipy_quad(name, h, log_s, k):
    s = 10.0**log_s
    mu = h * s
    got = gauss_moments(name, mu, s, k)[k]
    ref = sp_expect(name, mu, s, lambda z, y: y**k)
    scale = sp_expect(name, mu, s, lambda z, y: abs(y) ** k, absolute=True)
    assert abs(got - ref) <= 1e-9 * scale, (name, mu, s, k, got, ref, scale)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(name=st.sampled_from(ACTS), h=st.floats(-6.0, 6.0), log_s=st.floats(-1.0, 1.0))
def test_parseval_bessel(name, h, log_s):
    # Bessel's inequality sum_{k<=n} k! c_k^2 <= E[phi^2], with near equality for n = 30 when phi(Y) is smooth
    s = 10.0**log_s
    mu = h * s
    c = hermite_coefficients(name, mu, s, 30)
    partial = np.sum(c**2 * np.array([math.factorial(k) for k in range(31)], dtype=float))
    second = gauss_second_moment(name, mu, s)
    assert partial <= second * (1 + 1e-10) + 1e-300


def test_extreme_inputs_never_nan():
    # huge |mu / sigma|, sub-1e-150 and huge sigma: over/underflowing intermediate terms must not leak NaN
    mus = np.array([-1e6, -1e3, -50.0, -1.0, 0.0, 1.0, 50.0, 1e3, 1e6])
    sig = np.array([0.0, 1e-300, 1e-12, 1e-3, 1.0, 1e3, 1e6])
    M, S = np.meshgrid(mus, sig)
    for name in ("relu", "leaky_relu", "gelu", "gelu_tanh", "elu", "identity"):
        outs = [hermite_coefficients(name, M, S, 8), gauss_moments(name, M, S, 4), gauss_second_moment(name, M, S)]
        outs += [gauss_derivative_ev(name, M, S, j) for j in range(4)]
        for o in outs:
            assert not np.any(np.isnan(o)), name


@pytest.mark.parametrize("nmax", [1, 2, 12])
def test_tail_integrals_vs_mpmath(nmax):
    # J_n(t) = int_0^inf u^n exp(-t u - u^2 / 2) du: the cancellation-free core of the relu / gelu tails;
    # the recurrence switches between forward and continued-fraction evaluation at t = 1, 3, 8.
    from mlpinterp.gaussian.univariate.truncated import tail_j as _tail_j

    ts = np.array([0.0, 0.9, 1.2, 2.9, 3.2, 7.5, 8.5, 30.0])
    J = _tail_j(ts, nmax)
    with mp.workdps(30):
        for i, t in enumerate(ts):
            for n in sorted({0, 1, nmax // 2, nmax}):
                ref = float(mp.quad(lambda u, n=n, t=t: u**n * mp.exp(-t * u - u * u / 2), [0, 1, 5, mp.inf]))
                assert abs(J[i, n] - ref) <= 5e-14 * ref, (t, n, J[i, n], ref)
