"""Product expectations E[phi(Y1) phi(Y2)] for a bivariate normal pair, vectorised over pairs of neurons.

(Y1, Y2) has means mu1, mu2, standard deviations sigma1, sigma2 and correlation rho. These are the
neuron-pair second moments needed for the output second moment E[f(x)^2] = sum_ij W_i W_j E[phi_i phi_j]
of a one-hidden-layer network (the FVU denominator in Rigg & Belrose 2025, arXiv 2502.01032, Sec. 3-4).

Method, per entry:

1. **Mehler expansion** (Hermite polynomials' bilinear generating function; e.g. O'Donnell, *Analysis of
   Boolean Functions*, Sec. 11.2): with Z1, Z2 standard normals of correlation rho and
   phi(mu_i + sigma_i z) = sum_k c_ik He_k(z),

       E[phi(Y1) phi(Y2)] = sum_{k>=0} k! c_1k c_2k rho^k.

   The Hermite coefficients (up to degree 160) are computed once per neuron (before broadcasting
   against rho); the sum runs to the smallest K in {8, 16, 32, 64, 96, 128, 160} that leaves no more
   entries above tolerance than K = 160, so a weakly correlated [d, d] grid costs a few dozen
   multiply-adds per entry. Truncation error is bounded by Cauchy-Schwarz and
   Parseval: |tail| <= |rho|^{K+1} sqrt(R_1 R_2), R_i = E[phi(Y_i)^2] - sum_{k<=K} k! c_ik^2.
2. **Conditional quadrature** for entries whose bound exceeds 1e-10 sqrt(E[phi(Y1)^2] E[phi(Y2)^2])
   (|rho| close to 1, slowly decaying coefficients):
   E[phi(Y1) phi(Y2)] = E_z[phi(mu1 + sigma1 z) g(z)], g(z) = E[phi(Y2) | Z1 = z]
   = gauss_ev(phi, mu2 + sigma2 rho z, sigma2 sqrt(1 - rho^2)), by composite Gauss-Legendre in z split at
   the kinks of phi, graded around z1 = -mu1/sigma1 (width 1/sigma1) and z2 = -mu2/(sigma2 rho)
   (width sqrt(1 - rho^2)/|rho|), at two resolutions whose difference is the error estimate. g is a
   closed form for identity / relu / leaky_relu / gelu (cheap), a 48-node Gauss-Hermite
   rule for smooth activations when sigma2 sqrt(1 - rho^2) <= 0.25, and otherwise itself a full
   univariate quadrature (about a hundred times dearer per entry: fine for the diagonal and a few thousand strongly
   correlated pairs, slow if most pairs of a large grid are strongly correlated).

rho = +-1 (Y2 an affine function of Y1) and sigma = 0 (point masses) are handled exactly by the same
formulas (g becomes phi evaluated pointwise; a point mass has c_k = 0 for k >= 1).
"""

from __future__ import annotations

import math

import numpy as np

from mlpinterp.gaussian.activations import get_activation
from mlpinterp.gaussian.univariate import gauss_second_moment, hermite_coefficients
from mlpinterp.gaussian.univariate.common import family, quiet
from mlpinterp.gaussian.univariate.quadrature import panel_rule
from mlpinterp.utils.validation import to_numpy

__all__ = ["MEHLER_ORDER", "gauss_product_ev", "mehler_coefficients"]

_K_MEHLER = 160  # 160! < 1.8e308
#: Highest order of the per-neuron tables of :func:`mehler_coefficients` (their last axis has this + 1 entries).
MEHLER_ORDER = _K_MEHLER
_V_GH = 0.25
_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(48)
_GH_W = _GH_W / _GH_W.sum()
_REL_TOL = 1e-10
_CHUNK = 1 << 20


def _validate(mu1, sigma1, mu2, sigma2, rho):
    arrs = {}
    for name, v in (("mu1", mu1), ("sigma1", sigma1), ("mu2", mu2), ("sigma2", sigma2), ("rho", rho)):
        arrs[name] = to_numpy(v, name)
    for name in ("sigma1", "sigma2"):
        if np.any(arrs[name] < 0):
            raise ValueError(f"{name} must be >= 0, got min({name}) = {float(arrs[name].min())!r}")
    r = arrs["rho"]
    if np.any(np.abs(r) > 1 + 1e-12):
        raise ValueError(f"rho must lie in [-1, 1], got max(|rho|) = {float(np.abs(r).max())!r}")
    arrs["rho"] = np.clip(r, -1.0, 1.0)
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrs.values()))
    except ValueError:
        shapes = ", ".join(f"{k} {list(a.shape)}" for k, a in arrs.items())
        raise ValueError(f"mu1, sigma1, mu2, sigma2, rho must be broadcastable, got {shapes}") from None
    return arrs, shape


def mehler_coefficients(act, mu, sigma) -> tuple[np.ndarray, np.ndarray]:
    """``(c_hat [..., K + 1], E[phi(Y)^2] [...])`` of ``Y ~ N(mu, sigma^2)``: the orthonormal Hermite coefficients
    ``c_k sqrt(k!)`` (k <= 160) and the second moment that :func:`gauss_product_ev` uses per neuron.

    Computing them once and passing them as ``coefficients=`` saves their cost (a quadrature per neuron for
    activations without closed forms) when one set of neurons meets many blocks of others.
    """
    act = get_activation(act)
    K = _K_MEHLER
    sqrt_fact = np.exp(0.5 * np.array([math.lgamma(k + 1) for k in range(K + 1)]))
    m, t = np.broadcast_arrays(to_numpy(mu, "mu"), to_numpy(sigma, "sigma"))
    return hermite_coefficients(act, m, t, K) * sqrt_fact, gauss_second_moment(act, m, t)


def _mehler(act, mu1, s1, mu2, s2, rho, shape, coefficients=None):
    """Mehler sum and its rigorous truncation bound, both of shape ``shape``."""
    K = _K_MEHLER
    # coefficients once per neuron: c_hat_k = c_k sqrt(k!) (orthonormal Hermite basis)
    if coefficients is None:
        (a, e1), (b, e2) = mehler_coefficients(act, mu1, s1), mehler_coefficients(act, mu2, s2)
    else:
        a, e1, b, e2 = coefficients
    # residuals R_i(K) = E_i - sum_{k<=K} c_hat_k^2 for every K (cumulative), clipped at rounding level
    r1 = np.maximum(e1[..., None] - np.cumsum(a * a, axis=-1), 0.0)
    r2 = np.maximum(e2[..., None] - np.cumsum(b * b, axis=-1), 0.0)
    scale = np.sqrt(np.broadcast_to(e1, shape) * np.broadcast_to(e2, shape))
    absr = np.abs(rho)

    def bound(k):  # truncation bound after terms 0..k, plus summation rounding
        return absr ** (k + 1) * np.sqrt(r1[..., k] * r2[..., k]) + 2.2e-16 * (k + 2) * scale

    # smallest K with no more fallback entries than K_max: far fewer passes for weakly correlated grids
    n_fail_max = int(np.count_nonzero(bound(K) > _REL_TOL * scale))
    k_use = K
    for k in (8, 16, 32, 64, 96, 128):
        if np.count_nonzero(bound(k) > _REL_TOL * scale) <= n_fail_max:
            k_use = k
            break
    total = np.zeros(shape)
    rk = np.ones(shape)
    tmp = np.empty(shape)
    for k in range(k_use + 1):
        np.multiply(a[..., k], b[..., k], out=tmp)
        tmp *= rk
        total += tmp
        rk *= rho
    err = np.broadcast_to(bound(k_use), shape).copy()
    return total, err, scale


def _inner_ev(act, m: np.ndarray, v: np.ndarray) -> np.ndarray:
    """E[phi(m + v W)], W ~ N(0, 1), for the conditional quadrature (flat arrays).

    Closed forms where available. For smooth activations with v <= 0.25 (the feature scale of the named
    activations is ~1, their singularities lie >= ~1 away from the real axis) a 48-node Gauss-Hermite
    rule is accurate to ~1e-15; otherwise the full univariate quadrature (slow: ~1e3 nodes per value).
    """
    if family(act) in ("identity", "relu", "leaky_relu", "gelu"):
        return hermite_coefficients(act, m, v, 0)[:, 0]
    out = np.empty(m.shape)
    small = (v <= _V_GH) & (len(act.kinks) == 0)
    if np.any(small):
        ms, vs = m[small], v[small]
        acc = np.zeros(ms.shape)
        for x, w in zip(_GH_X, _GH_W, strict=True):
            acc += w * act.fn(ms + vs * x)
        out[small] = acc
    if np.any(~small):
        out[~small] = hermite_coefficients(act, m[~small], v[~small], 0)[:, 0]
    return out


def _conditional(act, mu1, s1, mu2, s2, rho, n_uniform, n_gl):
    """E_z[phi(mu1 + s1 z) gauss_ev(phi, mu2 + s2 rho z, s2 sqrt(1 - rho^2))] for flat arrays (s1 > 0)."""
    slope = s2 * rho
    v = s2 * np.sqrt(np.maximum(1.0 - rho * rho, 0.0))
    z1 = -mu1 / s1
    d1 = 0.25 * np.minimum(1.0 / s1, 1.0 / (1.0 + np.minimum(np.abs(z1), 40.0)))
    centers = [(z1, d1)]
    breaks = [(c - mu1) / s1 for c in act.kinks]
    has2 = slope != 0
    safe = np.where(has2, slope, 1.0)
    z2 = np.where(has2, -mu2 / safe, z1)
    # g(z) has features of width v / |slope| around z2 (a kink when v == 0)
    width2 = np.where(has2, np.maximum(v, 1e-9 * s2) / np.abs(safe), 1.0)
    d2 = 0.25 * np.minimum(width2, 1.0 / (1.0 + np.minimum(np.abs(z2), 40.0)))
    centers.append((z2, d2))
    for c in act.kinks:
        breaks.append(np.where(has2, (c - mu2) / safe, z1))
    z, w = panel_rule(centers, breaks, n_uniform=n_uniform, n_gl=n_gl)
    y1 = mu1[:, None] + s1[:, None] * z
    m2 = mu2[:, None] + slope[:, None] * z
    vv = np.broadcast_to(v[:, None], m2.shape)
    g = _inner_ev(act, m2.reshape(-1), vv.reshape(-1)).reshape(m2.shape)
    return np.sum(w * act.fn(y1) * g, axis=1)


@quiet
def gauss_product_ev(act, mu1, sigma1, mu2, sigma2, rho, *, return_error: bool = False, coefficients=None):
    """E[phi(Y1) phi(Y2)] for (Y1, Y2) bivariate normal, broadcast over all arguments.

    Args:
        act: activation (name, Activation, torch module or callable; see ``get_activation``).
        mu1, sigma1, mu2, sigma2: means and standard deviations (sigma >= 0; 0 is a point mass).
        rho: correlation of Y1 and Y2 in [-1, 1] (values within 1e-12 outside are clipped).
            Typical use: ``mu1 [d, 1]``, ``mu2 [1, d]``, ``rho [d, d]`` for all neuron pairs; Hermite
            coefficients are computed once per row/column, not per pair.
        return_error: also return a per-entry error estimate.
        coefficients: optional ``(c_hat1, e1, c_hat2, e2)`` from :func:`mehler_coefficients` of ``(mu1, sigma1)``
            and ``(mu2, sigma2)`` (their broadcast shapes plus a last axis of 161), to reuse them across calls.

    Returns:
        float64 array of shape ``broadcast(mu1, sigma1, mu2, sigma2, rho)``; with ``return_error`` a tuple
        (value, error) where error is a rigorous truncation bound (Mehler entries) or the difference of two
        quadrature resolutions (conditional-quadrature entries). Target: error <= 1e-10 *
        sqrt(E[phi(Y1)^2] E[phi(Y2)^2]).

    Raises:
        ValueError: NaN/inf inputs, negative sigma, |rho| > 1, shapes that do not broadcast.
        TypeError: non-numeric inputs or a bad ``act``.

    See the module docstring for the method (Mehler expansion + conditional quadrature fallback).
    """
    act = get_activation(act)
    arrs, shape = _validate(mu1, sigma1, mu2, sigma2, rho)
    mu1, s1, mu2, s2, r = (arrs[k] for k in ("mu1", "sigma1", "mu2", "sigma2", "rho"))
    if act.polynomial_degree == 1 and family(act) == "identity":
        # E[Y1 Y2] = mu1 mu2 + rho s1 s2 (exact)
        val = np.broadcast_to(mu1 * mu2 + r * s1 * s2, shape).astype(np.float64)
        return (val, np.zeros(shape)) if return_error else val
    total, err, scale = _mehler(act, mu1, s1, mu2, s2, r, shape, coefficients)
    bad = err > _REL_TOL * scale
    if np.any(bad):
        full = [np.broadcast_to(x, shape)[bad] for x in (mu1, s1, mu2, s2, r)]
        fm1, fs1, fm2, fs2, fr = full
        # condition on the variable with sigma > 0 (Mehler is exact when either sigma is 0)
        vals = np.empty(fm1.shape)
        errs = np.empty(fm1.shape)
        q_hi = (_N_PANEL_HI + 60) * _N_GL_HI  # nodes per entry, roughly (uniform + graded panels)
        per = max(1, _CHUNK // q_hi)
        for i in range(0, fm1.size, per):
            sl = slice(i, i + per)
            hi = _conditional(act, fm1[sl], fs1[sl], fm2[sl], fs2[sl], fr[sl], _N_PANEL_HI, _N_GL_HI)
            lo = _conditional(act, fm1[sl], fs1[sl], fm2[sl], fs2[sl], fr[sl], _N_PANEL_LO, _N_GL_LO)
            vals[sl] = hi
            errs[sl] = np.abs(hi - lo) + 1e-15 * np.abs(hi)
        total = total.copy()
        total[bad] = vals
        err[bad] = errs
    return (total, err) if return_error else total


# conditional quadrature: (uniform panels, Gauss-Legendre nodes per panel) at the two resolutions
_N_PANEL_HI, _N_GL_HI = 24, 16
_N_PANEL_LO, _N_GL_LO = 12, 10
