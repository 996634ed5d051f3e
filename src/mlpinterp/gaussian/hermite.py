"""Probabilists' Hermite polynomials He_k and monomial <-> Hermite change of basis.

He_0 = 1, He_1 = z, He_{k+1}(z) = z He_k(z) - k He_{k-1}(z); they are orthogonal under N(0, 1) with
E[He_j(Z) He_k(Z)] = k! [j == k] (Abramowitz & Stegun 22.2.15, 22.7.14). Rigg & Belrose (2025,
arXiv 2502.01032, Sec. 3) expand each neuron's activation in this basis. Evaluation and the change of basis are
numpy's :mod:`numpy.polynomial.hermite_e` (``hermevander``, ``herme2poly``); this module fixes the shapes
(``[..., n + 1]``, scalars included) and validates the arguments.
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import hermite_e

from mlpinterp.utils.validation import check_int, to_numpy

__all__ = ["hermite_he", "hermite_to_monomial", "monomial_to_hermite"]


def hermite_he(n: int, z) -> np.ndarray:
    """Evaluate He_0(z), ..., He_n(z) (``numpy.polynomial.hermite_e.hermevander``: the forward three-term recurrence).

    Args:
        n: highest degree, ``n >= 0``.
        z: array of any shape ``[...]`` (numpy, torch or nested sequence), finite.

    Returns:
        float64 array ``[..., n + 1]`` with ``out[..., k] = He_k(z)``.

    Raises:
        TypeError: ``n`` not an int, ``z`` not numeric.
        ValueError: ``n < 0`` or ``z`` contains NaN / inf.
    """
    return he_stack(check_int(n, "n", 0, "a non-negative int"), to_numpy(z, "z"))


def he_stack(n: int, z: np.ndarray) -> np.ndarray:
    """``hermite_he`` without input validation (for internal callers): ``[..., n + 1]``.

    ``hermevander`` builds the degrees along a leading axis (contiguous slices) and returns a ``moveaxis`` view,
    faster than a strided recurrence over a trailing axis.
    """
    z = np.asarray(z, dtype=np.float64)
    return hermite_e.hermevander(z, n).reshape(z.shape + (n + 1,))


def hermite_to_monomial(n: int) -> np.ndarray:
    """Matrix ``H [n + 1, n + 1]`` with ``He_k(z) = sum_i H[k, i] z**i`` (lower triangular, integer entries).

    Row k is ``numpy.polynomial.hermite_e.herme2poly`` of the k-th unit vector; explicitly
    H[k, k - 2m] = (-1)^m k! / (m! (k - 2m)! 2^m) (A&S 22.3.11).

    Raises:
        TypeError / ValueError: ``n`` not a non-negative int.
    """
    n = check_int(n, "n", 0, "a non-negative int")
    H = np.zeros((n + 1, n + 1))
    for k, row in enumerate(np.eye(n + 1)):
        poly = hermite_e.herme2poly(row[: k + 1])
        H[k, : poly.size] = poly
    return H


def monomial_to_hermite(n: int) -> np.ndarray:
    """Matrix ``M [n + 1, n + 1]`` with ``z**i = sum_k M[i, k] He_k(z)``; ``M`` is the inverse of ``H``.

    Explicitly M[i, i - 2m] = i! / (m! (i - 2m)! 2^m) >= 0, i.e. E[Z^i He_k(Z)] / k! (A&S 22.5.18 form).

    Raises:
        TypeError / ValueError: ``n`` not a non-negative int.
    """
    return np.abs(hermite_to_monomial(n))  # the same coefficients as H without the signs (-1)^m
