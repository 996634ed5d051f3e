"""Exact affine approximant under a Gaussian mixture (Rigg & Belrose 2025, §3.4, any weights).

Under component k the first two moments E_k[f] and Cov_k(f, x) are closed-form (Stein's lemma in
covariance form: Cov_k(phi(w.x + b), x) = E_k[phi'(y)] Sigma_k w). The law of total covariance then gives
the mixture moments, and the optimal affine map is p(x) = E[f] + Cov(f, x) Cov(x)^+ (x - E[x]), the
minimum-norm solution when the mixture covariance is singular (constant pixels).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.gaussian.univariate import hermite_coefficients
from mlpinterp.networks import MLP, Network
from mlpinterp.poly.approximant import DensePolynomial
from mlpinterp.poly.ridge import fit_ridge

#: Eigenvalues below this fraction of the largest are treated as zero in Cov(x)^+.
PINV_RTOL = 1e-10


def component_moments(network: Network, comp: Gaussian) -> tuple[np.ndarray, np.ndarray]:
    """E_k[f] ``[d_out]`` and Cov_k(f, x) ``[d_out, d_in]`` under one Gaussian component (exact)."""
    if isinstance(network, MLP):
        W = network.W1
        m = W @ comp.mean + network.b1
        WS = W @ comp.cov
        s = np.sqrt(np.maximum(np.einsum("hd,hd->h", WS, W), 0.0))
        c = hermite_coefficients(network.act, m, s, 1)
        ef = network.W2 @ c[:, 0] + network.b2
        slope = np.where(s > 0, c[:, 1] / np.where(s > 0, s, 1.0), 0.0)  # = E[phi'(y)]
        return ef, (network.W2 * slope) @ WS
    p = fit_ridge(network, comp, 1)
    return p.coefficients(0) + p.coefficients(1) @ comp.mean, p.coefficients(1) @ comp.cov


def fit_mixture_linear(network: Network, mixture: GaussianMixture, degree: int = 1) -> DensePolynomial:
    """Exact degree-0 or degree-1 approximant under ``mixture``; returns a ``DensePolynomial``."""
    pi = mixture.weights
    moments = [component_moments(network, comp) for comp in mixture.components]
    ef_k = np.stack([m[0] for m in moments])  # [K, o]
    ef = pi @ ef_k
    info = {"network": type(network).__name__, "activation": network.activation,
            "distribution": f"GaussianMixture(K={mixture.K})", "method": "exact-total-covariance",
            "degree": degree, "d_in": network.d_in}
    if degree == 0:
        return DensePolynomial((ef,), info=info)
    mu = mixture.mean
    cov_fx = sum(p * (m[1] + np.outer(e - ef, mk - mu)) for p, m, e, mk in zip(pi, moments, ef_k, mixture.means, strict=True))
    B = cov_fx @ scipy.linalg.pinvh(mixture.cov, atol=0.0, rtol=PINV_RTOL)  # minimum norm on a singular Cov(x)
    return DensePolynomial((ef - B @ mu, B), info=info)
