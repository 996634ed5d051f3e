"""Direction-set comparison (studies/three_spaces/directions.py) against hand-built sets, and the factored readout
spectrum (poly/spectral.readout_quadratic_spectrum) against the dense eigendecomposition."""

from __future__ import annotations

import numpy as np
import pytest

import mlpinterp as mi
from mlpinterp.poly.approximant import RidgePolynomial
from mlpinterp.poly.spectral import quadratic_spectrum, readout_quadratic_spectrum
from mlpinterp.studies.three_spaces.directions import (
    abs_cosines,
    baseline,
    match,
    on_support,
    random_gaussian,
    random_isotropic,
    random_on_support,
    support_basis,
)


def _orthonormal(n, d, seed=0):
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, n)))
    return q.T  # [n, d] orthonormal rows


def test_identical_permuted_sign_flipped_sets_match_exactly():
    T = _orthonormal(6, 10) * np.arange(1, 7)[:, None]  # row norms must not matter
    perm = np.random.default_rng(1).permutation(6)
    signs = np.array([1, -1, 1, -1, -1, 1.0])[:, None]
    for cand in (T, T[perm], signs * T[perm] * 0.3):
        m = match(T, cand)
        assert m.mmcs == pytest.approx(1.0, abs=1e-12)
        assert m.recovered(0.99) == 6 and m.distinct(0.99) == 6
    m = match(T, T[perm])
    np.testing.assert_array_equal(perm[m.best], np.arange(6))


def test_partial_and_hand_computed_cosines():
    # reference e1, e2; candidates (e1 + e2)/sqrt2 and -e1: max |cos| = (1, 1/sqrt2), recovered at 0.9 = 1
    ref = np.array([[1.0, 0, 0], [0, 1.0, 0]])
    cand = np.array([[1.0, 1.0, 0], [-1.0, 0, 0]])
    m = match(ref, cand)
    np.testing.assert_allclose(m.max_cos, [1.0, 1 / np.sqrt(2)], atol=1e-12)
    assert m.mmcs == pytest.approx((1 + 1 / np.sqrt(2)) / 2, abs=1e-12)
    assert m.recovered(0.9) == 1 and m.recovered(0.7) == 2
    assert m.distinct(0.7) == 2 and list(m.best) == [1, 0]
    # one candidate recovering both references counts once as distinct
    m2 = match(np.array([[1.0, 0.01, 0], [1.0, -0.01, 0]]), np.array([[1.0, 0, 0], [0, 0, 1.0]]))
    assert m2.recovered(0.99) == 2 and m2.distinct(0.99) == 1


def test_random_sets_score_near_their_analytic_expectation():
    # one reference direction against one isotropic direction in R^d: E|cos| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))
    from math import gamma, pi, sqrt

    d = 50
    ref = np.eye(d)[:1]
    b = baseline(ref, 1, lambda c, g: random_isotropic(d, c, g), threshold=0.9, n_draws=4000, seed=3)
    expected = gamma(d / 2) / (sqrt(pi) * gamma((d + 1) / 2))
    assert abs(b.mmcs_mean - expected) < 4 * b.mmcs_se
    assert b.recovered_mean == 0.0
    # a random set of 5 in R^200 recovers none of 10 orthonormal references at 0.9
    m = match(_orthonormal(10, 200), random_isotropic(200, 5, np.random.default_rng(0)))
    assert m.recovered(0.9) == 0 and m.mmcs < 0.4


def test_random_gaussian_stays_on_the_covariance_support():
    rng = np.random.default_rng(0)
    B = rng.standard_normal((3, 8))
    cov = B.T @ B  # rank 3
    X = random_gaussian(cov, 50, rng)
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-12)
    P = np.linalg.pinv(B) @ B  # projector on the row space of B
    np.testing.assert_allclose(X @ P, X, atol=1e-10)
    # their covariance direction matches N(0, diag(9, 1)): the first coordinate dominates
    Y = random_gaussian(np.diag([9.0, 1.0]), 4000, rng)
    assert np.mean(np.abs(Y[:, 0]) > np.abs(Y[:, 1])) > 0.7


@pytest.mark.parametrize("bad, msg", [(np.zeros((2, 3)), "zero rows"), (np.ones(3), "direction set"),
                                      (np.array([[np.nan, 1.0]]), "non-finite|NaN")])
def test_bad_direction_sets_are_refused(bad, msg):
    with pytest.raises(ValueError, match=msg):
        match(bad, np.ones((2, bad.shape[-1] if bad.ndim else 1)))


def test_widths_must_agree_and_cov_must_be_psd():
    with pytest.raises(ValueError, match="same space"):
        abs_cosines(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="positive semi-definite"):
        random_gaussian(np.diag([1.0, -1.0]), 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="n_draws"):
        baseline(np.eye(2), 1, lambda c, g: random_isotropic(2, c, g), threshold=0.5, n_draws=1)


def test_support_projection_by_hand():
    # inputs on span(e1, e2) of R^4: the support is that plane; (1, 0, 1, 0) projects to (1, 0, 0, 0), half its
    # squared norm on the support; (0, 3, 0, 4) to (0, 3, 0, 0), 9/25 of it
    rng = np.random.default_rng(0)
    X = np.zeros((500, 4))
    X[:, :2] = rng.standard_normal((500, 2)) * [3.0, 0.5]
    B = support_basis(np.cov(X, rowvar=False))
    assert B.shape == (2, 4)
    np.testing.assert_allclose(B @ B.T, np.eye(2), atol=1e-12)
    np.testing.assert_allclose(np.abs(B[:, 2:]), 0.0, atol=1e-12)
    P, share = on_support(np.array([[1.0, 0, 1, 0], [0, 3.0, 0, 4]]), B, "D")
    np.testing.assert_allclose(P, [[1.0, 0, 0, 0], [0, 3.0, 0, 0]], atol=1e-12)
    np.testing.assert_allclose(share, [0.5, 9 / 25], atol=1e-12)
    # the cosine to a direction on the support rises from 1/sqrt(2) to 1 once the off-support part is dropped
    assert match(np.array([[1.0, 0, 0, 0]]), P[:1]).mmcs == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="no component on the inputs' support"):
        on_support(np.array([[0, 0, 1.0, 0]]), B, "spd")
    with pytest.raises(ValueError, match=r"basis must be \[r, d = 3\]"):
        on_support(np.ones((1, 3)), B, "spd")
    with pytest.raises(ValueError, match="cov is zero"):
        support_basis(np.zeros((3, 3)))


def test_random_on_support_is_isotropic_in_the_support():
    # uniform on the unit sphere of an r-dimensional subspace of R^d: E|cos| to a unit vector in the subspace is the
    # isotropic value of R^r, Gamma(r/2) / (sqrt(pi) Gamma((r+1)/2)), not that of R^d
    from math import gamma, pi, sqrt

    r, d = 5, 40
    B = _orthonormal(r, d, seed=4)
    X = random_on_support(B, 7, np.random.default_rng(0))
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(X @ B.T @ B, X, atol=1e-12)
    b = baseline(B[:1], 1, lambda c, g: random_on_support(B, c, g), threshold=0.9, n_draws=4000, seed=3)
    expected = gamma(r / 2) / (sqrt(pi) * gamma((r + 1) / 2))
    assert abs(b.mmcs_mean - expected) < 4 * b.mmcs_se
    assert abs(b.mmcs_mean - gamma(d / 2) / (sqrt(pi) * gamma((d + 1) / 2))) > 20 * b.mmcs_se


def test_mmcs_standard_error_over_the_reference_directions():
    ref = np.eye(3)
    cand = np.array([[1.0, 0, 0], [0, 1.0, 1.0]])  # max |cos|: 1, 1/sqrt2, 1/sqrt2
    m = match(ref, cand)
    c = np.array([1.0, 1 / np.sqrt(2), 1 / np.sqrt(2)])
    assert m.mmcs_se == pytest.approx(c.std(ddof=1) / np.sqrt(3), abs=1e-12)
    assert np.isnan(match(ref[:1], cand).mmcs_se)


def _readout_poly(p: RidgePolynomial, R: np.ndarray) -> RidgePolynomial:
    return RidgePolynomial(center=p.center, A=p.A, D=p.D, W2=R @ p.W2, b2=R @ p.b2, G=p.G, E=p.E)


def _assert_same_spectrum(fast, dense, n):
    for o in range(fast.eigenvalues.shape[0]):
        np.testing.assert_allclose(fast.eigenvalues[o], dense.eigenvalues[o, :n], rtol=1e-9, atol=1e-12)
        overlap = np.abs(np.sum(fast.eigenvectors[o] * dense.eigenvectors[o, :, :n], axis=0))
        np.testing.assert_allclose(overlap, 1.0, atol=1e-7)


@pytest.mark.parametrize("d_in, d_hidden", [(12, 5), (6, 20)])  # thin-QR path and dense path
def test_readout_spectrum_equals_dense_eigendecomposition_mlp(d_in, d_hidden):
    rng = np.random.default_rng(0)
    net = mi.MLP(rng.standard_normal((d_hidden, d_in)) / 3, rng.standard_normal(d_hidden) * 0.3,
                 rng.standard_normal((4, d_hidden)), rng.standard_normal(4), activation="gelu")
    g = mi.Gaussian(rng.standard_normal(d_in) * 0.2, np.eye(d_in) * 0.8)
    p = mi.fit_polynomial(net, g, degree=3)
    R = rng.standard_normal((3, 4))
    fast = readout_quadratic_spectrum(p, R.T, n=3)
    _assert_same_spectrum(fast, quadratic_spectrum(_readout_poly(p, R)), 3)


def test_readout_spectrum_equals_dense_eigendecomposition_glu():
    rng = np.random.default_rng(1)
    d_in, h = 9, 4
    glu = mi.GLU(rng.standard_normal((h, d_in)) / 3, rng.standard_normal(h) * 0.2, rng.standard_normal((h, d_in)) / 3,
                 rng.standard_normal(h) * 0.2, rng.standard_normal((5, h)), rng.standard_normal(5), activation="silu")
    p = mi.fit_polynomial(glu, mi.Gaussian(np.zeros(d_in), np.eye(d_in)), degree=2)
    R = np.eye(5)[:2]
    fast = readout_quadratic_spectrum(p, R.T, n=4)
    _assert_same_spectrum(fast, quadratic_spectrum(_readout_poly(p, R)), 4)


def test_readout_spectrum_refuses_bad_arguments():
    rng = np.random.default_rng(0)
    net = mi.MLP(rng.standard_normal((3, 4)), np.zeros(3), rng.standard_normal((2, 3)), np.zeros(2))
    p = mi.fit_polynomial(net, mi.Gaussian(np.zeros(4), np.eye(4)), degree=2)
    with pytest.raises(ValueError, match="U must"):
        readout_quadratic_spectrum(p, np.ones((3, 2)))
    with pytest.raises(ValueError, match="n must be"):
        readout_quadratic_spectrum(p, np.eye(2), n=5)
    with pytest.raises(ValueError, match="degree"):
        readout_quadratic_spectrum(mi.fit_polynomial(net, mi.Gaussian(np.zeros(4), np.eye(4)), degree=1), np.eye(2))
    # fewer quadratic units than n: zero eigenvalues, orthonormal completion
    s = readout_quadratic_spectrum(p, np.eye(2), n=4)
    np.testing.assert_allclose(s.eigenvalues[:, 3:], 0.0)
    for o in range(2):
        np.testing.assert_allclose(s.eigenvectors[o].T @ s.eigenvectors[o], np.eye(4), atol=1e-10)
