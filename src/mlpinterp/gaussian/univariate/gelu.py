"""GELU in closed form (erf form gelu(y) = y Phi(y)), and the pointwise derivatives of both GELUs.

For gelu, with t = sqrt(1 + sigma^2) and m = mu / t (Gaussian convolution),

    E[gelu^{(k)}(Y)] = (-1)^k pdf(m) / t^{k+1} [t^2 He_{k-2}(m) - He_k(m)]   (k >= 2),
    E[gelu'(Y)] = Phi(m) + mu pdf(m) / t^3,  E[gelu(Y)] = (mu / t^2) Phi(m) + (sigma^2 / t) E[(m + Z)_+],

and E[gelu(Y) Y^k] = E[Y^{k+1} 1{Y - W > 0}] with W ~ N(0, 1) independent. The tanh GELU has no closed form: its
Gaussian integrals use the quadrature; its derivatives come from Taylor-mode arithmetic (:func:`gelu_tanh_deriv`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from mlpinterp.gaussian.activations import _GELU_TANH_C
from mlpinterp.gaussian.hermite import he_stack
from mlpinterp.gaussian.univariate.common import pdf
from mlpinterp.gaussian.univariate.truncated import trunc_moments


def gelu_derivs(mu, s, n, sigma_power: bool = False):
    """E[gelu^{(k)}(Y)], k = 0..n (gelu = y Phi(y) is smooth); times sigma^k if ``sigma_power``."""
    t = np.hypot(1.0, s)  # sqrt(1 + s^2) without overflow for s > 1e154
    m = mu / t
    out = np.empty(mu.shape + (n + 1,))
    out[:, 0] = (m / t) * special.ndtr(m) + (s * (s / t)) * trunc_moments(m, np.ones_like(m), 1)[:, 1]
    if n >= 1:
        out[:, 1] = (special.ndtr(m) + (m / t) * pdf(m) / t) * (s if sigma_power else 1.0)
    if n >= 2:
        pm = pdf(m)
        live = pm > 0
        he = he_stack(n, np.where(live, m, 0.0))
        k = np.arange(2, n + 1)
        base = s / t if sigma_power else 1.0 / t  # s^k / t^{k+1} = (s/t)^k / t, no overflow
        pref = (-1.0) ** k * pm[:, None] * np.power.outer(base, k)
        # (pm / t) (t^2 He_{k-2} - He_k) without forming t^2 (overflows for s > 1e154)
        out[:, 2:] = np.where(live[:, None], pref * (t[:, None] * he[:, :-2] - he[:, 2:] / t[:, None]), 0.0)
    return out


def gelu_moments(mu, s, kmax):
    """E[gelu(Y) Y^k], k = 0..kmax, as E[Y^{k+1} 1{D > 0}] with D = Y - W, W ~ N(0, 1) independent.

    gelu(y) = y P(W < y), D ~ N(mu, t^2), t^2 = 1 + s^2, and Y | D ~ N(a + b D, c^2) with a = mu / t^2,
    b = c^2 = s^2 / t^2, so E[Y^n | D] = sum_{j even} C(n, j) (j - 1)!! c^j (a + b D)^{n - j}, a polynomial
    in D whose truncated moments E[D^i 1{D > 0}] come from the cancellation-free tail integrals.
    """
    n_top = kmax + 1
    t = np.hypot(1.0, s)  # no overflow of 1 + s^2
    a = (mu / t) / t
    b = (s / t) ** 2
    T = trunc_moments(mu, t, n_top)  # [N, n_top + 1]
    out = np.empty(mu.shape + (kmax + 1,))
    for k in range(kmax + 1):
        n = k + 1
        acc = np.zeros(mu.shape)
        for j in range(0, n + 1, 2):
            cj = math.comb(n, j) * math.prod(range(j - 1, 0, -2)) * b ** (j // 2)  # c^2 = b
            r = n - j
            inner = np.zeros(mu.shape)
            for i in range(r + 1):
                inner += math.comb(r, i) * a ** (r - i) * b**i * T[:, i]
            acc += cj * inner
        out[:, k] = acc
    return out


def gelu_pointwise_deriv(y, j):
    """gelu^{(j)}(y), j >= 1: Phi(y) + y pdf(y) for j = 1, (-1)^j pdf(y) (He_{j-2}(y) - He_j(y)) for j >= 2."""
    if j == 1:
        return special.ndtr(y) + y * pdf(y)
    he = he_stack(j, y)
    return (-1.0) ** j * pdf(y) * (he[..., j - 2] - he[..., j])


def gelu_tanh_deriv(y: np.ndarray, j: int) -> np.ndarray:
    """gelu_tanh^{(j)}(y) = j! [(y + e) S(e)]_j by Taylor-mode arithmetic, S(e) = sigmoid(v(y + e)).

    v(y) = 2 sqrt(2/pi) (y + 0.044715 y^3) is a cubic; with r = 1 - S = sigmoid(-v) the ODE
    S' = S r v' gives (k + 1) S_{k+1} = [S r v']_k and r_k = -S_k (k >= 1). Every coefficient carries a
    factor S_0 or r_0, so the tails keep their relative accuracy (unlike 1 + tanh differences).
    """
    c = 2.0 * _GELU_TANH_C
    kap = 0.044715
    zero = np.zeros_like(y)
    v = [c * (y + kap * y**3), c * (1.0 + 3.0 * kap * y * y), c * 3.0 * kap * y, c * kap + zero]
    v += [zero] * max(0, j + 2 - len(v))
    dv = [(k + 1) * v[k + 1] for k in range(j + 1)]
    S = [special.expit(v[0])]
    R = [special.expit(-v[0])]
    for k in range(j):
        sr = [sum(S[a] * R[m - a] for a in range(m + 1)) for m in range(k + 1)]
        S.append(sum(sr[m] * dv[k - m] for m in range(k + 1)) / (k + 1))
        R.append(-S[-1])
    return math.factorial(j) * (y * S[j] + S[j - 1])
