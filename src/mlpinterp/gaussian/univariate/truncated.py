"""Cancellation-free Gaussian tail integrals and truncated moments (shared by the relu and gelu closed forms).

The tail integrals int_t^inf (z - t)^n pdf(z) dz = pdf(t) J_n(t), J_n(t) = int_0^inf u^n exp(-t u - u^2 / 2) du,
are never formed as ``mu Phi(h) + sigma pdf(h)`` (which cancels catastrophically for h << 0, the weakness of the
authors' EleutherAI/polyapprox code) but from J_0(t) = sqrt(pi/2) erfcx(t/sqrt 2) and the recurrence
t J_n + J_{n+1} = n J_{n-1}, run forwards for t <= 1 and as a continued fraction (backwards) for t > 1.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from mlpinterp.gaussian.univariate.common import Z0_MAX, pdf

_SQRT2 = math.sqrt(2.0)
_SQRT_HALF_PI = math.sqrt(0.5 * math.pi)
_T_SWITCH = 1.0  # J_n recurrence: forward for t <= _T_SWITCH, continued fraction above


def tail_j(t: np.ndarray, nmax: int) -> np.ndarray:
    """J_n(t) = int_0^inf u^n exp(-t u - u^2/2) du for t in [0, 40], n = 0..nmax: [N, nmax + 1].

    pdf(t) J_n(t) = int_t^inf (z - t)^n pdf(z) dz. Forward recurrence J_{n+1} = n J_{n-1} - t J_n for
    t <= 1 (little cancellation); for t > 1 the ratios q_n = J_{n+1}/J_n from the continued fraction
    q_{n-1} = n / (t + q_n) (Miller's backward recurrence for the minimal solution).
    """
    out = np.empty(t.shape + (nmax + 1,))
    out[:, 0] = _SQRT_HALF_PI * special.erfcx(t / _SQRT2)
    if nmax == 0:
        return out
    out[:, 1] = 1.0 - t * out[:, 0]
    for n in range(1, nmax):
        out[:, n + 1] = n * out[:, n - 1] - t * out[:, n]
    # continued fraction, in bins of t: about (24 / t)^2 extra terms make the start value irrelevant.
    # The forward recurrence stays accurate (< 1e-14, checked against mpmath) up to t = 8 for n <= 1
    # and t = 3 for n <= 2, which spares the long continued fractions in the common low-order calls.
    t_fwd = 8.0 if nmax <= 1 else (3.0 if nmax <= 2 else _T_SWITCH)
    edges = tuple(e for e in (_T_SWITCH, 2.0, 4.0, 8.0) if e >= t_fwd) + (np.inf,)
    for lo_t, hi_t in zip(edges[:-1], edges[1:], strict=True):
        sel = (t > lo_t) & (t <= hi_t)
        if not np.any(sel):
            continue
        tb = t[sel]
        n_start = nmax + 16 + int(math.ceil((24.0 / lo_t) ** 2))
        q = 0.5 * (-tb + np.sqrt(tb * tb + 4.0 * (n_start + 1)))
        qs = np.empty((tb.size, nmax))
        for n in range(n_start, 0, -1):
            q = n / (tb + q)  # q_{n-1} = J_n / J_{n-1}
            if n - 1 < nmax:
                qs[:, n - 1] = q
        res = np.empty((tb.size, nmax + 1))
        res[:, 0] = out[sel, 0]
        for n in range(1, nmax + 1):
            res[:, n] = res[:, n - 1] * qs[:, n - 1]
        out[sel] = res
    return out


def raw_moments(mu: np.ndarray, s: np.ndarray, nmax: int) -> np.ndarray:
    """E[Y^n], n = 0..nmax, Y ~ N(mu, s^2): M_{n+1} = mu M_n + n s^2 M_{n-1} (terms share a sign)."""
    out = np.empty(mu.shape + (nmax + 1,))
    out[:, 0] = 1.0
    if nmax >= 1:
        out[:, 1] = mu
    s2 = s * s
    for n in range(1, nmax):
        out[:, n + 1] = mu * out[:, n] + n * s2 * out[:, n - 1]
    return out


def trunc_moments(mu: np.ndarray, s: np.ndarray, nmax: int) -> np.ndarray:
    """E[Y^n 1{Y > 0}], n = 0..nmax, Y ~ N(mu, s^2), s > 0, without tail cancellation: [N, nmax + 1].

    h = mu/s <= 0: s^n pdf(h) J_n(-h); h > 0: E[Y^n] - (-s)^n pdf(h) J_n(h) (the subtracted tail is at
    most half of E[Y^n] for even n and adds for odd n).
    """
    h = mu / s
    t = np.minimum(np.abs(h), Z0_MAX)
    j = tail_j(t, nmax)
    spow = np.power.outer(s, np.arange(nmax + 1))
    tail = spow * pdf(h)[:, None] * j
    raw = raw_moments(mu, s, nmax)
    sign = (-1.0) ** np.arange(nmax + 1)
    with np.errstate(invalid="ignore"):
        upper = np.where(np.isinf(raw), raw, raw - sign * tail)  # inf - inf: the moment itself overflows
    return np.where((h <= 0)[:, None], tail, upper)
