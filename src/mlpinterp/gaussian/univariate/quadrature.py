"""The shared quadrature: composite Gauss-Legendre rules in z for E[g(mu + sigma Z)] (univariate and bivariate).

Window [min(-12, z0 - 12), max(12, z0 + 12)] around the activation's transition point z0 = -mu / sigma (clipped to
[-40, 40]); panels are a uniform grid (16 panels) merged with geometrically graded break points z0 +- delta 2^i
from delta = min(1/sigma, 1/(1 + |z0|)) / 4 up to twice the uniform spacing, and split at the activation's kinks
(about 600 nodes per neuron); 16 Gauss-Legendre nodes per panel. Work is chunked over neurons to bound memory.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.gaussian.hermite import he_stack
from mlpinterp.gaussian.univariate.common import Z0_MAX, checked, pdf

_N_GL = 16
_X_GL, _W_GL = np.polynomial.legendre.leggauss(_N_GL)
_L = 12.0
_Z0_MAX = 40.0
_N_UNIFORM = 16
_CHUNK_NODES = 1 << 16  # neurons * nodes per chunk (cache-sized temporaries)


def panel_rule(
    centers: list[tuple[np.ndarray, np.ndarray]],
    breaks: list[np.ndarray],
    n_uniform: int = _N_UNIFORM,
    n_gl: int = _N_GL,
) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss-Legendre rule in z per row, Gaussian weight included: z, w of shape [N, Q].

    ``centers`` are (z_c [N], delta [N]) pairs: the window is [min(-12, z_c - 12), max(12, z_c + 12)]
    over all centers (z_c clipped to [-40, 40]); break points are a uniform grid of ``n_uniform`` panels
    over the window, each z_c +- delta 2^i (geometric grading down to the feature width delta) and
    ``breaks`` (kinks). Break points outside the window are clipped (empty panels get zero weight).
    """
    zc = [np.clip(c, -Z0_MAX, Z0_MAX) for c, _ in centers]
    lo = np.minimum.reduce([np.minimum(-_L, c - _L) for c in zc])
    hi = np.maximum.reduce([np.maximum(_L, c + _L) for c in zc])
    n = len(lo)
    pieces = [lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, n_uniform + 1)]
    spacing = (hi - lo) / n_uniform
    for c, (_, delta) in zip(zc, centers, strict=True):
        # grade from delta up to twice the uniform spacing; the uniform grid takes over beyond
        n_grade = int(np.clip(np.ceil(np.log2(np.max(2.0 * spacing / delta))) + 1, 1, 200))
        g = delta[:, None] * 2.0 ** np.arange(n_grade)
        g = np.where(g <= 4.0 * spacing[:, None], g, 0.0)  # per-row cap: a row's rule ignores its batch
        pieces += [c[:, None], c[:, None] + g, c[:, None] - g]
    for b in breaks:
        pieces.append(np.nan_to_num(b, nan=0.0, posinf=hi.max(), neginf=lo.min())[:, None])
    pts = np.clip(np.concatenate(pieces, axis=1), lo[:, None], hi[:, None])
    pts.sort(axis=1)
    if n_gl == _N_GL:
        xg, wg = _X_GL, _W_GL
    else:
        xg, wg = np.polynomial.legendre.leggauss(n_gl)
    half = 0.5 * (pts[:, 1:] - pts[:, :-1])
    mid = 0.5 * (pts[:, 1:] + pts[:, :-1])
    z = mid[..., None] + half[..., None] * xg
    w = half[..., None] * wg * pdf(z)
    return z.reshape(n, -1), w.reshape(n, -1)


def _rule(mu: np.ndarray, s: np.ndarray, kinks: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Univariate rule: center z0 = -mu/s with feature width delta = min(1/s, 1/(1+|z0|)) / 4."""
    z0 = np.clip(-mu / s, -Z0_MAX, Z0_MAX)
    delta = 0.25 * np.minimum(1.0 / s, 1.0 / (1.0 + np.abs(z0)))
    return panel_rule([(z0, delta)], [(c - mu) / s for c in kinks])


def _quad(mu, s, kinks, integrand, n_out: int) -> np.ndarray:
    """sum_q w[i, q] * integrand(z, y, mu, s)[i, q, :] over the rule, chunked over neurons: [N, n_out]."""
    out = np.empty(mu.shape + (n_out,))
    if mu.size == 0:
        return out
    z, _ = _rule(mu[:1], s[:1], kinks)
    per = max(1, _CHUNK_NODES // (z.shape[1] * max(1, n_out // 4)))
    for i in range(0, mu.size, per):
        m, sg = mu[i : i + per], s[i : i + per]
        z, w = _rule(m, sg, kinks)
        y = m[:, None] + sg[:, None] * z
        out[i : i + per] = integrand(z, y, w, m, sg)
    return out


def quad_hermite_e(act, mu, s, n):
    """E[phi(mu + s Z) He_k(Z)], k = 0..n, by the rule: [N, n + 1] (flat mu, s > 0)."""

    def integrand(z, y, w, m, sg):
        f = w * checked(act.fn(y), act.name)
        # chunks hold ~1 << 18 (node, degree) entries, so the [rows, Q, n + 1] basis stays cache-sized
        return np.einsum("ij,ijk->ik", f, he_stack(n, z))

    return _quad(mu, s, act.kinks, integrand, n + 1)


def quad_moments(fn, kinks, mu, s, kmax):
    def integrand(z, y, w, m, sg):
        f = w * checked(fn(y), getattr(fn, "__name__", "activation"))
        res = np.empty((len(m), kmax + 1))
        for k in range(kmax + 1):
            res[:, k] = f.sum(axis=1)
            if k < kmax:
                f = f * y
        return res

    return _quad(mu, s, kinks, integrand, kmax + 1)
