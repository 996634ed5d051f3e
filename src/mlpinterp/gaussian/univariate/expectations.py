"""The public univariate expectations: validation, point masses (sigma == 0) and dispatch to the family modules.

Closed forms for identity, relu, leaky_relu (:mod:`~mlpinterp.gaussian.univariate.relu`) and gelu
(:mod:`~mlpinterp.gaussian.univariate.gelu`); the shared quadrature
(:mod:`~mlpinterp.gaussian.univariate.quadrature`) for every other activation and for E[gelu^2]; derivatives of the
other activations in :mod:`~mlpinterp.gaussian.univariate.derivatives`. Methods and accuracy: see the package
docstring (:mod:`mlpinterp.gaussian.univariate`).
"""

from __future__ import annotations

import math

import numpy as np

from mlpinterp.gaussian.activations import get_activation, leaky_slope
from mlpinterp.gaussian.univariate.common import MAX_DEGREE, S_TINY, checked, family, prepare, quiet
from mlpinterp.gaussian.univariate.derivatives import delta_limit, numeric_derivative_ev, smooth_deriv
from mlpinterp.gaussian.univariate.gelu import gelu_derivs, gelu_moments
from mlpinterp.gaussian.univariate.quadrature import quad_hermite_e, quad_moments
from mlpinterp.gaussian.univariate.relu import (
    identity_hermite_e,
    identity_moments,
    relu_derivs,
    relu_hermite_e,
    relu_moments,
    relu_second_moment,
)
from mlpinterp.utils.validation import check_int

__all__ = ["gauss_derivative_ev", "gauss_ev", "gauss_moments", "gauss_second_moment", "hermite_coefficients"]

_CLOSED = ("identity", "relu", "leaky_relu", "gelu")


def _closed_hermite_e(fam, act, mu, s, n):
    """E[phi(mu + s Z) He_k(Z)], k = 0..n, for the closed-form families (flat mu, s > 0)."""
    if fam == "identity":
        return identity_hermite_e(mu, s, n)
    if fam == "relu":
        return relu_hermite_e(mu, s, n)
    if fam == "leaky_relu":
        a = leaky_slope(act)
        return a * identity_hermite_e(mu, s, n) + (1.0 - a) * relu_hermite_e(mu, s, n)
    if fam == "gelu":
        return gelu_derivs(mu, s, n, sigma_power=True)
    raise AssertionError(fam)  # pragma: no cover


@quiet
def hermite_coefficients(act, mu, sigma, n: int) -> np.ndarray:
    """Hermite coefficients c_k = E[phi(mu + sigma Z) He_k(Z)] / k!, k = 0..n, Z ~ N(0, 1).

    phi(mu + sigma z) = sum_k c_k He_k(z) in L2(N(0, 1)); the degree-n truncation is the least-squares
    optimal polynomial of a single neuron under a Gaussian input (Rigg & Belrose 2025, Sec. 3, Eq. for
    the ridge/Hermite expansion). Closed forms for identity, relu, leaky_relu, gelu; quadrature otherwise
    (see module docstring for methods and accuracy).

    Args:
        act: activation (name, :class:`~mlpinterp.gaussian.activations.Activation`, torch module, callable).
        mu: pre-activation means, any shape, broadcastable with ``sigma``.
        sigma: pre-activation standard deviations (>= 0; 0 is a point mass).
        n: highest degree, ``n >= 0``.

    Returns:
        float64 array ``[*broadcast(mu, sigma).shape, n + 1]``.

    Raises:
        ValueError: NaN/inf in ``mu``/``sigma``, negative ``sigma``, negative ``n``, unknown activation.
        TypeError: non-int ``n``, bad ``act`` type.
    """
    act = get_activation(act)
    n = check_int(n, "n", 0, "a non-negative int")
    if n > MAX_DEGREE:
        raise ValueError(f"n must be <= {MAX_DEGREE} (k! overflows float64 beyond), got {n}")
    mu, s, shape = prepare(mu, sigma)
    out = np.zeros(mu.shape + (n + 1,))
    pm = s < S_TINY
    if np.any(pm):
        out[pm, 0] = checked(act.fn(mu[pm]), act.name)
    sel = ~pm
    if np.any(sel):
        fam = family(act)
        if fam in _CLOSED:
            e = _closed_hermite_e(fam, act, mu[sel], s[sel], n)
        else:
            e = quad_hermite_e(act, mu[sel], s[sel], n)
        fact = np.array([math.factorial(k) for k in range(n + 1)], dtype=np.float64)
        out[sel] = e / fact
    return out.reshape(shape + (n + 1,))


@quiet
def gauss_ev(act, mu, sigma) -> np.ndarray:
    """E[phi(Y)] for Y ~ N(mu, sigma^2), elementwise over ``broadcast(mu, sigma)``.

    Equals the Hermite coefficient c_0 (Rigg & Belrose 2025, Sec. 3). See :func:`hermite_coefficients`
    for arguments, exceptions and accuracy.

    Returns:
        float64 array of shape ``broadcast(mu, sigma).shape``.
    """
    return hermite_coefficients(act, mu, sigma, 0)[..., 0]


@quiet
def gauss_moments(act, mu, sigma, kmax: int) -> np.ndarray:
    """E[phi(Y) Y^k], k = 0..kmax, for Y ~ N(mu, sigma^2).

    Computed directly (not from Hermite coefficients, whose binomial recombination cancels in the tails):
    truncated Gaussian moments E[Y^{k+1} 1{Y>0}] for relu / leaky_relu (see module docstring), raw
    moments for the identity, for gelu E[Y^{k+1} 1{Y - W > 0}] with an independent W ~ N(0, 1) (a
    polynomial in the truncated moments of Y - W), quadrature of phi(y) y^k otherwise. Accuracy: |error| <= 1e-10 *
    E[|phi(Y)| |Y|^k]. These are the "master theorem" cross-moments of Rigg & Belrose (2025, Thm 3.1).

    Args:
        act, mu, sigma: as in :func:`hermite_coefficients`.
        kmax: highest power, ``kmax >= 0``.

    Returns:
        float64 array ``[*broadcast(mu, sigma).shape, kmax + 1]``.

    Raises:
        ValueError / TypeError: as in :func:`hermite_coefficients` (argument ``kmax``).
    """
    act = get_activation(act)
    kmax = check_int(kmax, "kmax", 0, "a non-negative int")
    mu, s, shape = prepare(mu, sigma)
    out = np.zeros(mu.shape + (kmax + 1,))
    pm = s < S_TINY
    if np.any(pm):
        out[pm] = act.fn(mu[pm])[:, None] * np.power.outer(mu[pm], np.arange(kmax + 1))
    sel = ~pm
    if np.any(sel):
        m, sg = mu[sel], s[sel]
        fam = family(act)
        if fam == "identity":
            out[sel] = identity_moments(m, sg, kmax)
        elif fam == "gelu":
            out[sel] = gelu_moments(m, sg, kmax)
        elif fam in ("relu", "leaky_relu"):
            out[sel] = relu_moments(m, sg, kmax, None if fam == "relu" else leaky_slope(act))
        else:
            out[sel] = quad_moments(act.fn, act.kinks, m, sg, kmax)
    return out.reshape(shape + (kmax + 1,))


@quiet
def gauss_second_moment(act, mu, sigma) -> np.ndarray:
    """E[phi(Y)^2] for Y ~ N(mu, sigma^2), elementwise over ``broadcast(mu, sigma)``.

    Closed forms: identity mu^2 + sigma^2; relu E[Y^2 1{Y>0}]; leaky_relu a^2 E[Y^2] + (1 - a^2) E[relu^2].
    Quadrature of phi(y)^2 otherwise (relative error <= 1e-10: the integrand is non-negative).
    By Parseval, E[phi^2] = sum_k k! c_k^2 (Rigg & Belrose 2025, Sec. 3: the FVU of the degree-n
    truncation is sum_{k>n} k! c_k^2 / Var phi).

    Returns:
        float64 array of shape ``broadcast(mu, sigma).shape``.

    Raises:
        ValueError / TypeError: as in :func:`hermite_coefficients`.
    """
    act = get_activation(act)
    mu, s, shape = prepare(mu, sigma)
    out = np.zeros(mu.shape)
    pm = s < S_TINY
    if np.any(pm):
        out[pm] = act.fn(mu[pm]) ** 2
    sel = ~pm
    if np.any(sel):
        m, sg = mu[sel], s[sel]
        fam = family(act)
        if fam == "identity":
            out[sel] = m * m + sg * sg
        elif fam in ("relu", "leaky_relu"):
            out[sel] = relu_second_moment(m, sg, 0.0 if fam == "relu" else leaky_slope(act))
        else:
            fn = act.fn
            out[sel] = quad_moments(lambda y: fn(y) ** 2, act.kinks, m, sg, 0)[:, 0]
    return out.reshape(shape)


@quiet
def gauss_derivative_ev(act, mu, sigma, j: int) -> np.ndarray:
    """E[phi^{(j)}(Y)] for Y ~ N(mu, sigma^2), with distributional derivatives at kinks.

    E.g. relu'' = delta, so E[relu''(Y)] = pdf_Y(0); generally a jump at c contributes
    E[delta^{(r)}(Y - c)] = He_r((c - mu)/sigma) pdf((c - mu)/sigma) / sigma^{r+1}. By Gaussian
    integration by parts E[phi^{(j)}(Y)] = E[phi(Y) He_j(Z)] / sigma^j = j! c_j / sigma^j (Stein's lemma,
    Rigg & Belrose 2025, Sec. 3). Closed forms for identity, relu, leaky_relu, gelu; quadrature of the
    analytic derivative (sigmoid polynomials, Taylor-mode arithmetic for gelu_tanh, plus delta terms for
    elu) for the other named activations, accurate to 1e-10 * E[|phi^{(j)}(Y)|] (smooth part). For
    other activations: quadrature of the torch-autograd derivative when sigma < 1, otherwise integration
    by parts (accuracy then 1e-10 * E[|phi(Y) He_j(Z)|] / sigma^j, which is poor for small sigma
    when no derivative is available, e.g. wrapped numpy callables). With sigma == 0 returns phi^{(j)}(mu) (at a kink: the limit
    sigma -> 0+, which is +-inf for delta terms); this needs the derivative, else ValueError.

    Args:
        act, mu, sigma: as in :func:`hermite_coefficients`.
        j: derivative order, ``j >= 0``.

    Returns:
        float64 array of shape ``broadcast(mu, sigma).shape``.

    Raises:
        ValueError: as in :func:`hermite_coefficients` (argument ``j``); sigma == 0 with j >= 1 for an
            activation whose derivative is not available.
        TypeError: non-int ``j``.
    """
    act = get_activation(act)
    j = check_int(j, "j", 0, "a non-negative int")
    mu, s, shape = prepare(mu, sigma)
    out = np.zeros(mu.shape)
    fam = family(act)
    if j == 0:
        return gauss_ev(act, mu, s).reshape(shape)
    pm = s < S_TINY
    if np.any(pm):
        y = mu[pm]
        val = smooth_deriv(act, y, j)
        if val is None:
            raise ValueError(
                f"gauss_derivative_ev: sigma == 0 needs phi^({j}) but activation {act.name!r} has no "
                "available derivative (its torch_fn is not differentiable)"
            )
        # delta terms at a kink sitting exactly at mu: limit sigma -> 0+ of He_r(0) pdf(0) / sigma^(r+1)
        if fam in ("relu", "leaky_relu") and j >= 2:
            a = 0.0 if fam == "relu" else leaky_slope(act)
            val = np.where(y == 0, delta_limit([(1.0 - a, j - 2)]), val)
        if fam == "elu" and j >= 3:
            val = np.where(y == 0, delta_limit([(-1.0, r) for r in range(j - 2)]), val)
        out[pm] = val
    sel = ~pm
    if np.any(sel):
        m, sg = mu[sel], s[sel]
        if fam in _CLOSED:
            if fam == "gelu":
                out[sel] = gelu_derivs(m, sg, j)[:, j]
            elif fam == "identity":
                out[sel] = 1.0 if j == 1 else 0.0
            else:
                a = 0.0 if fam == "relu" else leaky_slope(act)
                out[sel] = (a if j == 1 else 0.0) + (1.0 - a) * relu_derivs(m, sg, j)
        else:
            out[sel] = numeric_derivative_ev(act, fam, m, sg, j)
    return out.reshape(shape)
