"""Exact ridge-family normal equations under Gaussian mixtures (ffn.mixture_moments, ffn.output_moments).

Oracles: (1) under one Gaussian the projection is the closed form (``fit_polynomial``, per-neuron Hermite
truncation: a different derivation) and, for MLPs, its exact FVU from ``poly.metrics``; (2) under a 3-component
mixture every entry of M, C, yy, y1 agrees with Monte Carlo sums over 10^6 samples within a few per-entry
standard errors, and the solved read-out's FVU with a Monte Carlo FVU (the same z-test rejects the pooled
Gaussian's normal equations, so it has power); (3) GLU neuron-pair moments E[h_i h_j] against tensor Gauss-Hermite
and nested adaptive quadrature; a point mass against the features evaluated at that point; bad input.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from mlpinterp import GLU, MLP, Gaussian, GaussianMixture, fit_polynomial, fvu
from mlpinterp.poly.mixture.readout_moments import mixture_normal_equations
from mlpinterp.poly.output_moments import hidden_moments
from mlpinterp.poly.projection import solve_projection
from mlpinterp.poly.readout import Readout, RidgeBasis


def _net(kind: str, act: str, d: int, h: int, o: int, seed: int):
    rng = np.random.default_rng(seed)
    if kind == "mlp":
        return MLP(rng.standard_normal((h, d)), rng.normal(0, 0.5, h), rng.standard_normal((o, h)),
                   rng.normal(size=o), act)
    return GLU(rng.standard_normal((h, d)), rng.normal(0, 0.5, h), rng.standard_normal((h, d)), rng.normal(0, 0.5, h),
               rng.standard_normal((o, h)), rng.normal(size=o), act)


def _gaussian(d: int, seed: int, rank: int | None = None) -> Gaussian:
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((d, rank or d))
    return Gaussian(rng.normal(size=d), B @ B.T / d)


def _mixture(d: int, seed: int) -> GaussianMixture:
    rng = np.random.default_rng(seed)
    covs = []
    for k in range(3):
        B = rng.standard_normal((d, d - (k == 1)))  # component 1 singular
        covs.append(B @ B.T / d)
    return GaussianMixture(np.array([0.5, 0.3, 0.2]), rng.normal(0, 1, (3, d)), np.stack(covs))


# ------------------------------------------------------------------------------------ oracle 1: one Gaussian


@pytest.mark.parametrize("kind", ["mlp", "glu"])
@pytest.mark.parametrize("act", ["relu", "gelu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("singular", [False, True])
def test_single_gaussian_equals_closed_form(kind, act, singular):
    d, h = 5, 4
    net = _net(kind, act, d, h, 3, seed=hash((kind, act)) % 1000)
    g = _gaussian(d, seed=3, rank=4 if singular else None)
    X = g.sample(2000, 1)
    for n in (1, 2, 3):
        p = fit_polynomial(net, g, n)
        basis = RidgeBasis.from_closed_form(p, g)
        neq = mixture_normal_equations(net, basis, g, n)
        assert neq.exact and neq.n == 1 and neq.degree == n
        ro, info = solve_projection(neq, basis, ridge=0.0)
        ref = Readout.from_closed_form(p, basis)
        scale = np.abs(ref(X)).max()
        assert np.abs(ro(X) - ref(X)).max() < 1e-9 * scale
        Bc = ref.coefficients_matrix()
        assert np.abs(ro.coefficients_matrix() - Bc).max() < 1e-9 * np.abs(Bc).max()
        if kind == "mlp":  # exact FVU from poly.metrics (Mehler on the closed form's own coefficients)
            assert info["fvu"] == pytest.approx(fvu(net, p, g, method="exact").fvu, abs=1e-8)


# ------------------------------------------------------------------------------------ oracle 2: Monte Carlo


def _mc_sums(net, basis, mix, n, N, seed):
    p, o = basis.n_features(n), net.d_out
    S = {k: np.zeros(s) for k, s in
         dict(M=(p, p), M2=(p, p), C=(p, o), C2=(p, o), y1=o, y12=o, yy=(), yy2=()).items()}
    rng = np.random.default_rng(seed)
    for _ in range(N // 100_000):
        X = mix.sample(100_000, rng)
        Phi, F = basis.features(X, n), net(X)
        S["M"] += Phi.T @ Phi
        S["M2"] += (Phi**2).T @ (Phi**2)
        S["C"] += Phi.T @ F
        S["C2"] += (Phi**2).T @ (F**2)
        ff = (F**2).sum(1)
        S["yy"] += ff.sum()
        S["yy2"] += (ff**2).sum()
        S["y1"] += F.sum(0)
        S["y12"] += (F**2).sum(0)
    return S


def _max_z(S, N, neq) -> float:
    zs = []
    for name, exact in (("M", neq.M), ("C", neq.C), ("yy", neq.yy), ("y1", neq.y1)):
        mean = S[name] / N
        se = np.sqrt(np.maximum(S[name + "2"] / N - mean**2, 0.0) / N)
        zs.append(np.abs((exact - mean) / np.maximum(se, 1e-300)).ravel())
    return float(np.concatenate(zs).max())


@pytest.mark.parametrize("kind,act", [("mlp", "relu"), ("mlp", "gelu_tanh"), ("glu", "silu"), ("glu", "relu")])
def test_mixture_matches_monte_carlo(kind, act):
    d, h, n, N = 5, 4, 3, 1_000_000
    net = _net(kind, act, d, h, 3, seed=11)
    mix = _mixture(d, seed=5)
    pooled = mix.pooled()
    basis = RidgeBasis.from_closed_form(fit_polynomial(net, pooled, n), pooled)
    neq = mixture_normal_equations(net, basis, mix, n)
    S = _mc_sums(net, basis, mix, n, N, seed=7)
    assert _max_z(S, N, neq) < 5.0
    # power: the moment-matched single Gaussian has the same first two moments but is rejected
    assert _max_z(S, N, mixture_normal_equations(net, basis, pooled, n)) > 20.0
    ro, info = solve_projection(neq, basis)
    mc = fvu(net, ro.to_polynomial(), mix, n_samples=N, seed=9, method="monte-carlo")
    assert abs(info["fvu"] - mc.fvu) < 4.0 * mc.stderr
    assert 0.0 < info["fvu"] < 1.0


def test_point_mass_component_and_mixture():
    d, h, n = 4, 3, 3
    net = _net("glu", "gelu", d, h, 2, seed=2)
    g = _gaussian(d, seed=1)
    basis = RidgeBasis.from_closed_form(fit_polynomial(net, g, n), g)
    x0 = np.array([0.3, -1.2, 0.7, 2.0])
    point = GaussianMixture(np.ones(1), x0[None], np.zeros((1, d, d)))
    neq = mixture_normal_equations(net, basis, point, n)
    phi = basis.features(x0[None], n)[0]
    f0 = net(x0[None])[0]
    tol = 1e-12 * np.abs(phi).max() ** 2
    assert np.abs(neq.M - np.outer(phi, phi)).max() < tol
    assert np.abs(neq.C - np.outer(phi, f0)).max() < 1e-12 * np.abs(phi).max() * np.abs(f0).max()
    assert neq.yy == pytest.approx(float(f0 @ f0), rel=1e-12)
    assert np.allclose(neq.y1, f0, rtol=1e-12, atol=0)
    # a point mass beside a Gaussian: the mixture's moments are the weighted sums
    mix = GaussianMixture(np.array([0.25, 0.75]), np.stack([x0, g.mean]), np.stack([np.zeros((d, d)), g.cov]))
    both = mixture_normal_equations(net, basis, mix, n)
    alone = mixture_normal_equations(net, basis, g, n)
    assert np.allclose(both.M, 0.25 * neq.M + 0.75 * alone.M, rtol=1e-12, atol=1e-12 * np.abs(both.M).max())
    assert both.yy == pytest.approx(0.25 * neq.yy + 0.75 * alone.yy, rel=1e-12)
    ro, info = solve_projection(both, basis)
    mc = fvu(net, ro.to_polynomial(), mix, n_samples=400_000, seed=1, method="monte-carlo")
    assert abs(info["fvu"] - mc.fvu) < 4.0 * mc.stderr


def test_chunking_and_leading_degrees():
    d, h = 4, 7
    mix = _mixture(d, seed=8)
    for kind in ("mlp", "glu"):
        net = _net(kind, "gelu", d, h, 2, seed=4)
        basis = RidgeBasis.from_closed_form(fit_polynomial(net, mix.pooled(), 3), mix.pooled())
        a = mixture_normal_equations(net, basis, mix, 3)
        b = mixture_normal_equations(net, basis, mix, 3, chunk=3)
        for x, y in ((a.M, b.M), (a.C, b.C), (a.y1, b.y1)):
            assert np.allclose(x, y, rtol=1e-12, atol=1e-12 * np.abs(x).max())
        assert a.yy == pytest.approx(b.yy, rel=1e-12)
        lo = mixture_normal_equations(net, basis, mix, 2)
        lead = a.leading(2, basis)
        assert np.allclose(lead.M, lo.M, rtol=1e-12, atol=1e-12 * np.abs(lo.M).max())
        assert np.allclose(lead.C, lo.C, rtol=1e-12, atol=1e-12 * np.abs(lo.C).max())


# ------------------------------------------------------------------------------------ GLU pair moments


def _pair_glu(act: str, rho: float, seed: int = 0) -> tuple[GLU, Gaussian]:
    rng = np.random.default_rng(seed)
    d = 3
    W = np.zeros((2, d))
    W[0, 0] = 1.3
    W[1, 0], W[1, 1] = 0.9 * rho, 0.9 * math.sqrt(max(1 - rho * rho, 0.0))
    net = GLU(W, np.array([0.3, -0.4]), rng.standard_normal((2, d)), np.array([0.2, 0.5]), None, None, act)
    return net, Gaussian(np.zeros(d), np.eye(d))


def _pair_reference(net: GLU, g: Gaussian, i: int, j: int, n_gh: int | None) -> float:
    """E[phi(y_i) g_i phi(y_j) g_j] by 2-D integration over (Z_i, W), Z_j = rho Z_i + sqrt(1 - rho^2) W, with the gates'
    regression on (Z_i, Z_j) written out (tensor Gauss-Hermite, or nested scipy quad split at the kinks)."""
    s = np.linalg.norm(net.W, axis=1)
    D = np.vstack([net.W / s[:, None], net.V])
    Sg = D @ g.cov @ D.T
    rho = Sg[i, j]
    fn, m, c = net.act.fn, net.b, net.c
    if i == j:
        beta, var = Sg[i, 2 + i], Sg[2 + i, 2 + i]
        f1 = lambda z: fn(m[i] + s[i] * z) ** 2 * ((c[i] + beta * z) ** 2 + var - beta**2) * np.exp(-z * z / 2)
        return integrate.quad(f1, -12, 12, points=[-m[i] / s[i]], epsabs=0, epsrel=1e-13, limit=200)[0] / math.sqrt(
            2 * math.pi)
    idx = [i, j]
    Szz = Sg[np.ix_(idx, idx)]
    Sgz = Sg[np.ix_([2 + i, 2 + j], idx)]
    B = Sgz @ np.linalg.inv(Szz)
    cres = Sg[2 + i, 2 + j] - B[0] @ Sgz[1]
    sq = math.sqrt(1 - rho * rho)

    def integrand(z1, w):
        z2 = rho * z1 + sq * w
        g1 = c[i] + B[0, 0] * z1 + B[0, 1] * z2
        g2 = c[j] + B[1, 0] * z1 + B[1, 1] * z2
        return fn(m[i] + s[i] * z1) * fn(m[j] + s[j] * z2) * (g1 * g2 + cres)

    if n_gh:
        x, w = np.polynomial.hermite_e.hermegauss(n_gh)
        w = w / w.sum()
        return float(np.sum(w[:, None] * w[None, :] * integrand(x[:, None], x[None, :])))

    def inner(z1):
        kink = (-m[j] / s[j] - rho * z1) / sq
        f = lambda w: integrand(np.array(z1), np.array(w)) * math.exp(-w * w / 2)
        return integrate.quad(f, -12, 12, points=[kink], epsabs=0, epsrel=1e-12, limit=200)[0] * math.exp(
            -z1 * z1 / 2)

    return integrate.quad(inner, -12, 12, points=[-m[i] / s[i]], epsabs=0, epsrel=1e-11, limit=200)[0] / (2 * math.pi)


@pytest.mark.parametrize("act,n_gh", [("gelu", 150), ("silu", 150), ("relu", None)])
@pytest.mark.parametrize("rho", [0.3, 0.9, 0.97, 0.995])
def test_glu_pair_moments_against_quadrature(act, n_gh, rho):
    net, g = _pair_glu(act, rho)
    e_h, Ehh, err = hidden_moments(net, g)
    for i, j in ((0, 1), (1, 0), (0, 0), (1, 1)):
        ref = _pair_reference(net, g, i, j, n_gh if i != j else None)
        scale = math.sqrt(Ehh[i, i] * Ehh[j, j])
        assert abs(Ehh[i, j] - ref) < 1e-9 * scale, (i, j, Ehh[i, j], ref)
        assert err[i, j] < 1e-9 * scale
    assert np.allclose(Ehh, Ehh.T, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------ bad input


def test_bad_input_raises():
    d = 4
    net = _net("mlp", "relu", d, 3, 2, seed=0)
    g = _gaussian(d, seed=0)
    basis = RidgeBasis.from_closed_form(fit_polynomial(net, g, 2), g)
    with pytest.raises(ValueError, match="dimension 5 but the network has d_in = 4"):
        mixture_normal_equations(net, basis, _mixture(5, seed=0), 2)
    with pytest.raises(ValueError, match="degree must be >= 1"):
        mixture_normal_equations(net, basis, g, 0)
    with pytest.raises(TypeError, match="degree must be an int"):
        mixture_normal_equations(net, basis, g, 2.0)
    with pytest.raises(ValueError, match="degree must be <= 168"):
        mixture_normal_equations(net, basis, g, 200)
    with pytest.raises(TypeError, match="mixture must be"):
        mixture_normal_equations(net, basis, np.eye(d), 2)
    with pytest.raises(TypeError, match="basis must be"):
        mixture_normal_equations(net, "basis", g, 2)
    with pytest.raises(TypeError, match="network must be"):
        mixture_normal_equations(object(), basis, g, 2)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        mixture_normal_equations(net, basis, g, 2, chunk=0)
    other = RidgeBasis(basis.center[:3], basis.A[:, :3], None, basis.white[:3])
    with pytest.raises(ValueError, match=r"basis.center must have shape \[4\]"):
        mixture_normal_equations(net, other, g, 2)
    with pytest.raises(ValueError, match="A contains 12 non-finite"):  # a NaN basis is refused when it is built
        RidgeBasis(basis.center, np.full_like(basis.A, np.nan), None, basis.white)


def test_hidden_moments_bad_input():
    net = _net("glu", "gelu", 3, 2, 2, seed=0)
    with pytest.raises(ValueError, match="dimension 4 but the network has d_in = 3"):
        hidden_moments(net, _gaussian(4, seed=0))
    with pytest.raises(TypeError, match="gaussian must be"):
        hidden_moments(net, _mixture(3, seed=0))
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        hidden_moments(net, _gaussian(3, seed=0), chunk=0)
