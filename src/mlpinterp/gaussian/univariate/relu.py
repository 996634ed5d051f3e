"""Piecewise-linear activations in closed form: identity, relu and leaky_relu (= a identity + (1 - a) relu).

With h = mu / sigma, Gaussian integration by parts (Stein) gives E[g(Z) He_k(Z)] = E[g^{(k)}(Z)], hence

    E[relu(Y) He_0] = sigma * E[(h + Z)_+],  E[relu(Y) He_1] = sigma Phi(h),
    E[relu(Y) He_k] = sigma pdf(h) He_{k-2}(-h)   (k >= 2),

E[relu^{(j)}(Y)] = Phi(h) (j = 1), He_{j-2}(-h) pdf(h) / sigma^{j-1} (j >= 2: relu'' = delta), and E[relu(Y) Y^k],
E[relu(Y)^2] are truncated moments E[Y^n 1{Y > 0}] (:mod:`~mlpinterp.gaussian.univariate.truncated`).
All functions take flat ``mu [N]``, ``s [N]`` with s > 0.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from mlpinterp.gaussian.hermite import he_stack
from mlpinterp.gaussian.univariate.common import pdf
from mlpinterp.gaussian.univariate.truncated import raw_moments, trunc_moments


def identity_hermite_e(mu, s, n):
    out = np.zeros(mu.shape + (n + 1,))
    out[:, 0] = mu
    if n >= 1:
        out[:, 1] = s
    return out


def relu_hermite_e(mu, s, n):
    """E[relu(mu + s Z) He_k(Z)], k = 0..n."""
    h = mu / s
    out = np.empty(mu.shape + (n + 1,))
    out[:, 0] = trunc_moments(mu, s, 1)[:, 1]
    if n >= 1:
        out[:, 1] = s * special.ndtr(h)
    if n >= 2:
        ph = pdf(h)
        live = ph > 0  # where pdf(h) underflows the term is 0 (He_{k-2}(-h) may overflow)
        out[:, 2:] = np.where(live[:, None], (s * ph)[:, None] * he_stack(n - 2, np.where(live, -h, 0.0)), 0.0)
    return out


def relu_derivs(mu, s, j):
    """E[relu^{(j)}(Y)] for j >= 1: Phi(h) for j = 1, He_{j-2}(-h) pdf(h) / s^{j-1} (delta terms) for j >= 2."""
    h = mu / s
    if j == 1:
        return special.ndtr(h)
    ph = pdf(h)
    live = ph > 0
    he = he_stack(j - 2, np.where(live, -h, 0.0))[:, j - 2]
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(live, he * ph / s ** (j - 1), 0.0)


def identity_moments(mu, s, kmax):
    """E[Y Y^k] = E[Y^{k+1}], k = 0..kmax."""
    return raw_moments(mu, s, kmax + 1)[:, 1:]


def relu_moments(mu, s, kmax, slope=None):
    """E[phi(Y) Y^k], k = 0..kmax, for relu (``slope=None``) or leaky_relu with negative slope ``slope``."""
    relu = trunc_moments(mu, s, kmax + 1)[:, 1:]
    if slope is None:
        return relu
    return slope * raw_moments(mu, s, kmax + 1)[:, 1:] + (1.0 - slope) * relu


def relu_second_moment(mu, s, a):
    """E[phi(Y)^2] for relu (a = 0) or leaky_relu (slope a): a^2 E[Y^2] + (1 - a^2) E[relu(Y)^2]."""
    relu2 = trunc_moments(mu, s, 2)[:, 2]
    # relu alone: no 0 * (m^2 + s^2) term, which is 0 * inf = NaN when s^2 overflows
    return relu2 if a == 0.0 else a * a * (mu * mu + s * s) + (1.0 - a * a) * relu2


def relu_pointwise_deriv(y, j, a):
    """phi^{(j)}(y) for relu (a = 0) / leaky_relu (slope a), j >= 1, away from 0 (at 0: the one-sided mean)."""
    if j == 1:
        return np.where(y > 0, 1.0, np.where(y < 0, a, 0.5 * (1.0 + a)))
    return np.zeros_like(y)
