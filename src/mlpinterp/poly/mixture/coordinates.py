"""Whitened support coordinates of a Gaussian mixture and the coordinate changes of polynomials into them.

Coordinates. Let ``mu``, ``C = U diag(lam) U^T`` be the mixture mean and covariance (law of total
covariance) and ``r = rank C``. Every component lives in ``mu + range(C)``, so we work in the whitened
support coordinates ``u = diag(lam)^{-1/2} U^T (x - mu)`` (``u ∈ R^r``, mean 0, covariance I under the
mixture; component k: ``u ~ N(m_k, S_k)``). The approximant is optimal on the support and extended off it
by orthogonal projection onto the support (the minimum-norm solution), as for one singular Gaussian.
MNIST class covariances are singular (constant pixels): r = 712 for the 10-class mixture of the train set.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from mlpinterp.gaussian.distributions import GaussianMixture
from mlpinterp.poly.approximant import RidgePolynomial
from mlpinterp.poly.mixture.factored import FactoredQuadratic
from mlpinterp.poly.tensors import centered_to_raw


@dataclass(frozen=True, eq=False)
class SupportCoordinates:
    """Whitened coordinates of a mixture's support, and the mixture in them: ``u = (x - mean) @ P``,
    ``x = mean + u @ R.T`` on the support.

    mean : ``[d]`` mixture mean; P : ``[d, r]`` = U diag(lam)^-1/2; R : ``[d, r]`` = U diag(lam)^1/2;
    means : ``[K, r]`` component means m_k in u; covs : ``[K, r, r]`` component covariances S_k in u;
    weights : ``[K]`` the mixture weights pi_k.
    """

    mean: np.ndarray
    P: np.ndarray
    R: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    weights: np.ndarray

    @property
    def r(self) -> int:
        """Dimension of the support."""
        return self.P.shape[1]

    @classmethod
    def of(cls, mixture: GaussianMixture) -> SupportCoordinates:
        pooled = mixture.pooled()  # eigendecomposition with the library's PSD_RTOL rank rule
        U = pooled.support
        lam = np.einsum("dr,dr->r", pooled.factor, pooled.factor)
        P = U / np.sqrt(lam)
        R = U * np.sqrt(lam)
        means = (mixture.means - pooled.mean) @ P
        covs = np.einsum("da,kde,eb->kab", P, mixture.covs, P, optimize=True)
        covs = 0.5 * (covs + np.swapaxes(covs, 1, 2))
        return cls(pooled.mean, P, R, means, covs, np.asarray(mixture.weights, dtype=np.float64))


def quadratic_in_u(p: RidgePolynomial, coords: SupportCoordinates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coefficients ``(c [o], b [o, r], A [o, r, r])`` of a degree-2 ``RidgePolynomial`` in u coordinates.

    With x = mean + R u: c = T0 + T1 mean + mean^T T2 mean, b = (T1 + 2 T2 mean) R, A = R^T T2 R. The
    quadratic part is formed from the factored ridge form (O(o h r^2), never the d x d tensor).
    """
    mu, R = coords.mean, coords.R
    T0, T1 = p.coefficients(0), p.coefficients(1)
    gamma, delta = p._monomial_weights(2)
    AR = p.A @ R  # [h, r]
    Ad_mu = p.A @ mu  # [h]
    wg = p.W2 * gamma  # [o, h]
    A = np.matmul(AR.T[None] * wg[:, None, :], AR)  # [o, r, r]
    T2mu = (wg * Ad_mu) @ p.A  # [o, d] = T2 @ mu
    if delta is not None:
        GR = p.G @ R
        wd = p.W2 * delta
        S = np.matmul(GR.T[None] * wd[:, None, :], AR)
        A = A + 0.5 * (S + np.swapaxes(S, 1, 2))
        T2mu = T2mu + 0.5 * ((wd * (p.G @ mu)) @ p.A + (wd * Ad_mu) @ p.G)
    c = T0 + T1 @ mu + T2mu @ mu
    b = (T1 + 2 * T2mu) @ R
    return c, b, A


def factored_quadratic_in_u(p: RidgePolynomial, coords: SupportCoordinates) -> FactoredQuadratic | None:
    """:func:`quadratic_in_u` without forming ``A``: the factors of an MLP's degree-2 ridge polynomial
    (``factored`` module docstring).

    Returns None for a GLU's ridge polynomial (its gate-residual term is not ``L^T diag(w) L``).
    """
    if p.G is not None or p.degree != 2:
        return None
    mu, R = coords.mean, coords.R
    gamma, _ = p._monomial_weights(2)
    L = p.A @ R  # [h, r]
    w = p.W2 * gamma  # [o, h]
    T2mu = (w * (p.A @ mu)) @ p.A  # [o, d] = T2 @ mu
    c = p.coefficients(0) + p.coefficients(1) @ mu + T2mu @ mu
    b = (p.coefficients(1) + 2 * T2mu) @ R
    return FactoredQuadratic(c, b, L, w)


def quadratics_in_u(ps: list[RidgePolynomial], coords: SupportCoordinates):
    """Degree-2 ridge polynomials in u, in the cheapest form the operator applies: a list of ``FactoredQuadratic``
    when every one has it (an MLP's), else a generator of their ``(c, b, A)`` arrays (:func:`quadratic_in_u`),
    each built when it is used (one ``[o, r, r]`` tensor at a time, not all of them: 400 MB at MNIST scale)."""
    factors = [factored_quadratic_in_u(p, coords) for p in ps]
    if all(f is not None for f in factors):
        return factors
    return (quadratic_in_u(p, coords) for p in ps)



def tensors_in_u(p, coords: SupportCoordinates, degree: int) -> list[np.ndarray]:
    """Raw-coordinate tensors of ``p`` rewritten in u: expand about the mixture mean, contract each axis with R."""
    raw = [np.asarray(p.coefficients(j)) for j in range(degree + 1)]
    centred = centered_to_raw(raw, -coords.mean)  # p(mean + t) = sum_j S_j[t, ..., t]
    out = []
    for j, Sj in enumerate(centred):
        T = Sj
        for _ in range(j):
            T = np.tensordot(T, coords.R, axes=([1], [0]))  # contract the first input axis, append r axis
        out.append(T)
    return out



def u_to_raw(tensors_u: list[np.ndarray], coords: SupportCoordinates) -> tuple[np.ndarray, ...]:
    """Tensors of p(u) -> raw-coordinate tensors of x -> p(P^T (x - mean)) (projection onto the support)."""
    centred = []
    for j, T in enumerate(tensors_u):
        for _ in range(j):
            T = np.tensordot(T, coords.P.T, axes=([1], [0]))
        centred.append(T)
    return centered_to_raw(centred, coords.mean)



_COORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def coordinates_of(mixture: GaussianMixture) -> SupportCoordinates:
    """``SupportCoordinates.of(mixture)``, cached per mixture (one eigendecomposition per mixture, not per fit)."""
    c = _COORDS.get(mixture)
    if c is None:
        c = _COORDS[mixture] = SupportCoordinates.of(mixture)
    return c
