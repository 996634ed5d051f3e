"""Pointwise derivatives of the sigmoid family: sigmoid, tanh, silu, quick_gelu and softplus.

sigmoid^{(j)} = P_j(sigmoid) with P_0 = x, P_{j+1} = P_j' (x - x^2), evaluated at -|y| (no 1 - sigma cancellation)
and reflected; tanh(y) = 2 sigmoid(2y) - 1, silu(y) = y sigmoid(y), quick_gelu(y) = silu(1.702 y) / 1.702,
softplus' = sigmoid. Their Gaussian integrals use the quadrature of these analytic derivatives, which keeps
relative accuracy in the tails.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from mlpinterp.gaussian.activations import QUICK_GELU_SLOPE

#: Families whose derivatives this module gives.
SIGMOID_FAMILY = ("sigmoid", "tanh", "silu", "quick_gelu", "softplus")


def _sigmoid_poly(j: int) -> np.ndarray:
    """Coefficients of P_j with sigmoid^{(j)} = P_j(sigmoid); P_0 = x, P_{j+1} = P_j' (x - x^2)."""
    P = np.polynomial.Polynomial
    p = P([0.0, 1.0])
    for _ in range(j):
        p = p.deriv() * P([0.0, 1.0, -1.0])
    return p.coef


def sigmoid_deriv(y: np.ndarray, j: int) -> np.ndarray:
    if j == 0:
        return special.expit(y)
    x = special.expit(-np.abs(y))  # evaluate at -|y| (no 1 - sigma cancellation), then reflect
    val = np.polynomial.polynomial.polyval(x, _sigmoid_poly(j))
    sign = np.where(y > 0, (-1.0) ** (j + 1), 1.0)
    return sign * val


def sigmoid_family_deriv(fam: str, y, j: int):
    """phi^{(j)}(y), j >= 1, for ``fam`` in :data:`SIGMOID_FAMILY`."""
    if fam == "sigmoid":
        return sigmoid_deriv(y, j)
    if fam == "tanh":
        return 2.0 ** (j + 1) * sigmoid_deriv(2.0 * y, j)
    if fam == "silu":
        return y * sigmoid_deriv(y, j) + j * sigmoid_deriv(y, j - 1)
    if fam == "quick_gelu":  # quick_gelu(y) = silu(a y) / a, so quick_gelu^{(j)}(y) = a^{j-1} silu^{(j)}(a y)
        u = QUICK_GELU_SLOPE * y
        return QUICK_GELU_SLOPE ** (j - 1) * (u * sigmoid_deriv(u, j) + j * sigmoid_deriv(u, j - 1))
    if fam == "softplus":
        return sigmoid_deriv(y, j - 1)
    raise AssertionError(fam)  # pragma: no cover
