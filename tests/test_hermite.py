"""Probabilists' Hermite polynomials against numpy.polynomial.hermite_e (independent implementation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.polynomial import hermite_e as HE

from mlpinterp.gaussian.hermite import hermite_he, hermite_to_monomial, monomial_to_hermite


@pytest.mark.parametrize("n", [0, 1, 2, 5, 12])
def test_hermite_he_matches_numpy_hermeval(n):
    z = np.linspace(-7.0, 7.0, 41).reshape(41, 1) * np.ones((1, 3))  # [41, 3]
    out = hermite_he(n, z)
    assert out.shape == (41, 3, n + 1)
    for k in range(n + 1):
        e_k = np.zeros(k + 1)
        e_k[k] = 1.0
        ref = HE.hermeval(z, e_k)
        np.testing.assert_allclose(out[..., k], ref, rtol=1e-13, atol=1e-13 * np.abs(ref).max())


def test_hermite_he_scalar_and_torch_input():
    torch = pytest.importorskip("torch")
    assert hermite_he(3, 2.0).shape == (4,)
    # He_3(2) = 2^3 - 3*2 = 2 (hand derivation from He_3 = z^3 - 3z)
    assert hermite_he(3, 2.0)[3] == 2.0
    t = torch.tensor([0.5, -1.0], dtype=torch.float64)
    np.testing.assert_allclose(hermite_he(4, t), hermite_he(4, t.numpy()))


def test_hermite_orthogonality_by_gauss_hermite_quadrature():
    # E[He_j(Z) He_k(Z)] = k! delta_jk; numpy's hermegauss is exact for degree <= 2*40-1.
    x, w = HE.hermegauss(40)
    w = w / w.sum()
    H = hermite_he(15, x)  # [40, 16]
    gram = (H * w[:, None]).T @ H
    ref = np.diag([math.factorial(k) for k in range(16)]).astype(float)
    np.testing.assert_allclose(gram, ref, atol=1e-9 * ref.max())


@pytest.mark.parametrize("n", [0, 1, 4, 10])
def test_conversion_matrices_match_numpy(n):
    H = hermite_to_monomial(n)
    M = monomial_to_hermite(n)
    for k in range(n + 1):
        e = np.zeros(k + 1)
        e[k] = 1.0
        np.testing.assert_allclose(H[k, : k + 1], HE.herme2poly(e), atol=0)
        assert np.all(H[k, k + 1 :] == 0)
        np.testing.assert_allclose(M[k, : k + 1], HE.poly2herme(e), rtol=1e-14)
    np.testing.assert_allclose(M @ H, np.eye(n + 1), atol=1e-9)


def test_conversion_reproduces_polynomial_values():
    rng = np.random.default_rng(0)
    n = 7
    z = rng.normal(size=50)
    coef_he = rng.normal(size=n + 1)
    mono = coef_he @ hermite_to_monomial(n)  # sum_k a_k He_k = sum_i (a H)_i z^i
    np.testing.assert_allclose(np.polynomial.polynomial.polyval(z, mono), HE.hermeval(z, coef_he), rtol=1e-10)
    back = mono @ monomial_to_hermite(n)
    np.testing.assert_allclose(back, coef_he, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fn", [hermite_to_monomial, monomial_to_hermite, lambda n: hermite_he(n, 0.0)])
def test_bad_degree(fn):
    with pytest.raises(ValueError, match="n must be a non-negative int"):
        fn(-1)
    with pytest.raises(TypeError, match="n must be a non-negative int"):
        fn(2.0)
    with pytest.raises(TypeError, match="n must be a non-negative int"):
        fn(True)


def test_bad_z():
    with pytest.raises(ValueError, match="z contains"):
        hermite_he(2, [0.0, np.nan])
    with pytest.raises(TypeError, match="z must be"):
        hermite_he(2, "abc")


def test_numpy_integer_degrees_are_accepted():
    # degrees often come out of numpy (np.arange, argmax): np.int64 is an int, np.bool_ is not
    np.testing.assert_array_equal(hermite_he(np.int64(3), 2.0), hermite_he(3, 2.0))
    assert hermite_to_monomial(np.int32(2)).shape == (3, 3)
    with pytest.raises(TypeError, match="n must be a non-negative int, got bool"):
        hermite_he(np.bool_(True), 2.0)


def test_conversion_matrix_against_exact_integers():
    # independent of numpy: A&S 22.3.11, H[k, k - 2m] = (-1)^m k! / (m! (k - 2m)! 2^m), in exact integer arithmetic
    n = 40
    H = hermite_to_monomial(n)
    ref = np.zeros((n + 1, n + 1))
    for k in range(n + 1):
        for m in range(k // 2 + 1):
            ref[k, k - 2 * m] = (-1) ** m * (math.factorial(k) // (math.factorial(m) * math.factorial(k - 2 * m) * 2**m))
    np.testing.assert_allclose(H, ref, rtol=2e-15, atol=0)
    # He_k at z by the recurrence He_{k+1} = z He_k - k He_{k-1} written out here, against hermite_he
    z = np.linspace(-4.0, 4.0, 9)
    rec = [np.ones_like(z), z]
    for k in range(1, 12):
        rec.append(z * rec[k] - k * rec[k - 1])
    np.testing.assert_allclose(hermite_he(12, z), np.stack(rec, axis=-1), rtol=1e-14, atol=1e-14)
