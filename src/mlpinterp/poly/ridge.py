"""Exact least-squares polynomial approximants under one Gaussian, by per-neuron Hermite truncation.

Rigg & Belrose (2025, arXiv 2502.01032) derive the optimal degree-1/2 approximants through the master
theorem and an OLS solve. Here we use the equivalent, cheaper characterisation: with ``x = mu + L u``,
``u ~ N(0, I)``, each neuron ``phi(w . x + b)`` is a ridge function ``g(a . u)`` of a unit direction ``a``;
its Hermite expansion ``sum_k c_k He_k(a . u)`` is its Wiener-chaos decomposition, so the L2 projection
onto polynomials of degree <= n in u (equivalently in x, on the support) is the truncation ``k <= n``.
By linearity the optimal approximant of the whole MLP replaces each activation by its truncated
Hermite series about that neuron's pre-activation law.

GLU terms ``phi(y) g`` split by regressing the gate on the pre-activation, ``g = alpha + beta (y - m) + eps``
with ``eps`` independent of ``y``: ``phi(y)(alpha + beta (y - m))`` is a ridge function with Hermite
coefficients ``alpha c_k + beta s ((k+1) c_{k+1} + c_{k-1})`` (from ``Z He_k = He_{k+1} + k He_{k-1}``),
and ``He_k(z) eps`` lies in chaos k + 1, so its projection keeps ``k <= n - 1``.

Cost: O(d_hidden d_in r) for the pre-activation laws (r = rank of the covariance) plus O(d_hidden n).
"""

from __future__ import annotations

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian
from mlpinterp.gaussian.univariate import hermite_coefficients
from mlpinterp.networks import GLU, MLP, Network
from mlpinterp.poly.approximant import RidgePolynomial


def preactivation_laws(W: np.ndarray, b: np.ndarray, dist: Gaussian) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Means ``[h]``, standard deviations ``[h]`` and support-projected directions ``[h, d]`` of ``W x + b``."""
    m = W @ dist.mean + b
    WL = W @ dist.factor
    s = np.sqrt(np.einsum("hr,hr->h", WL, WL))
    return m, s, _onto_support(W, dist)


def _onto_support(W: np.ndarray, dist: Gaussian) -> np.ndarray:
    """Rows of ``W [h, d]`` projected onto the support (``W`` itself when the support is all of R^d)."""
    if dist.rank == dist.d:
        return W.copy()
    return (W @ dist.support) @ dist.support.T


def fit_ridge(network: Network, dist: Gaussian, degree: int) -> RidgePolynomial:
    """Optimal degree-``degree`` approximant of ``network`` under ``dist`` in factored form (exact).

    Returns a ``RidgePolynomial``; see ``fit_polynomial`` for the public entry point and validation.
    """
    n = degree
    if isinstance(network, MLP):
        m, s, Wp = preactivation_laws(network.W1, network.b1, dist)
        safe = np.where(s > 0, s, 1.0)
        A = np.where(s[:, None] > 0, Wp / safe[:, None], 0.0)
        D = hermite_coefficients(network.act, m, s, n)
        return RidgePolynomial(
            center=dist.mean.copy(), A=A, D=D, W2=network.W2.copy(), b2=network.b2.copy(),
            info={"network": "MLP", "activation": network.activation, "distribution": "Gaussian",
                  "method": "hermite-ridge", "degree": n},
        )
    if isinstance(network, GLU):
        m, s, Wp = preactivation_laws(network.W, network.b, dist)
        safe = np.where(s > 0, s, 1.0)
        A = np.where(s[:, None] > 0, Wp / safe[:, None], 0.0)
        alpha = network.V @ dist.mean + network.c
        cov_gy = np.einsum("hr,hr->h", network.V @ dist.factor, network.W @ dist.factor)
        beta = np.where(s > 0, cov_gy / safe**2, 0.0)
        Vp = _onto_support(network.V, dist)
        G = Vp - beta[:, None] * Wp
        c = hermite_coefficients(network.act, m, s, n + 1)  # [h, n+2]
        k = np.arange(n + 1)
        c_prev = np.concatenate([np.zeros((c.shape[0], 1)), c[:, :n]], axis=1)  # c_{k-1}
        D = alpha[:, None] * c[:, : n + 1] + (beta * s)[:, None] * ((k + 1) * c[:, 1 : n + 2] + c_prev)
        E = c[:, :n] if n >= 1 else np.zeros((c.shape[0], 0))
        return RidgePolynomial(
            center=dist.mean.copy(), A=A, D=D, W2=network.W2.copy(), b2=network.b2.copy(), G=G, E=E,
            info={"network": "GLU", "activation": network.activation, "distribution": "Gaussian",
                  "method": "hermite-ridge", "degree": n},
        )
    raise TypeError(f"network must be MLP or GLU, got {type(network).__name__}")
