"""Exact output moments E[f], E||f||^2 of an FFN block under one Gaussian (the ``y1`` and ``yy`` of exact normal
equations, the FVU denominator of Rigg & Belrose 2025, arXiv 2502.01032, Sec. 3-4).

With ``h`` the hidden units (``phi(y_j)`` for an MLP, ``phi(y_j) g_j`` for a GLU with gate ``g_j = v_j . x + c_j``),
``E||f||^2 = sum_ij (W2^T W2)_ij E[h_i h_j] + 2 b2 . W2 E[h] + ||b2||^2``, so everything reduces to the neuron-pair
moments ``E[h_i h_j]``.

* MLP: :func:`~mlpinterp.gaussian.bivariate.gauss_product_ev` off the diagonal (Mehler sum with a rigorous bound,
  conditional quadrature where it does not converge), :func:`~mlpinterp.gaussian.univariate.gauss_second_moment` on
  it.
* GLU. With ``Z_i`` the standardised pre-activations (correlation rho), ``psi_i(Z_i) = phi(y_i)`` with Hermite
  coefficients ``c_ik``, regress both gates on ``(Z_i, Z_j)``: ``E[g_i g_j | Z_i, Z_j] = sum_{a + b <= 2} kappa_ab
  Z_i^a Z_j^b`` (the kappa are products of the two regressions plus the residual covariance), so

      E[h_i h_j] = sum_ab kappa_ab E[psi_i(Z_i) Z_i^a psi_j(Z_j) Z_j^b] = sum_ab kappa_ab sum_k k! rho^k e^a_ik e^b_jk,

  a Mehler sum per (a, b), where ``e^a`` are the Hermite coefficients of ``psi Z^a`` (``Z He_k = He_{k+1} + k He_{k-1}``
  applied a times). The tail after K terms is at most ``|rho|^{K+1} sqrt(R^a_i(K) R^b_j(K))`` (Cauchy-Schwarz and
  Parseval; ``R^a(K) = E[psi^2 Z^{2a}] - sum_{k<=K} k! (e^a_k)^2``, the norms by quadrature), so each pair takes
  the smallest K in (8, 16, 32, 64, 96, 128, 160) whose bound is below ``1e-10 sqrt(E[h_i^2] E[h_j^2])``. Pairs that
  do not converge by K = 160 or have ``|rho| > 0.99``, and the diagonal, are integrated by conditional quadrature:
  ``E[h_i h_j] = E_z[psi_i(z) F(z)]`` with ``F(z) = E[g_i phi(y_j) g_j | Z_i = z]`` in closed form from the Hermite
  coefficients c_0..c_2 of phi about ``y_j | Z_i = z`` (``E[phi(X) A B] = (E A E B + Cov(A, B)) c_0 +
  (E A w_B + E B w_A) c_1 + 2 w_A w_B c_2``, ``w = Cov(., X) / sd X``), composite 16-point Gauss-Legendre in z on
  [-12, 12] graded geometrically around the transition points of psi_i and F; the difference to a 10-point rule on the
  same panels is the error estimate.

Everything is float64 numpy, chunked over rows of the ``[d_hidden, d_hidden]`` pair grid.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from mlpinterp.gaussian.bivariate import gauss_product_ev
from mlpinterp.gaussian.distributions import Gaussian
from mlpinterp.gaussian.univariate import gauss_ev, gauss_second_moment, hermite_coefficients
from mlpinterp.networks import GLU, Network, validate_network
from mlpinterp.utils.validation import check_int

#: Target accuracy of every E[h_i h_j] relative to sqrt(E[h_i^2] E[h_j^2]).
REL_TOL = 1e-10
_K_LEVELS = (8, 16, 32, 64, 96, 128, 160)
_K = _K_LEVELS[-1]
_RHO_QUAD = 0.99  # |rho| above this: quadrature (the gate regression divides by 1 - rho^2)
_ZMAX = 12.0
_N_UNIFORM = 24
_LEVELS = 34  # geometric grading width / 4 * 2^l, l < _LEVELS (clipped to the window)
_GL_HI = np.polynomial.legendre.leggauss(16)
_GL_LO = np.polynomial.legendre.leggauss(10)
_QUAD_CHUNK = 64  # entries per quadrature pass (x ~2700 nodes)


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("iq,iq->i", a, b)


def _laws(network: Network, gaussian: Gaussian):
    """Pre-activation means m, sds s and standardised directions ZL (``Corr(y_i, y_j) = ZL_i . ZL_j``)."""
    W, b = (network.W, network.b) if isinstance(network, GLU) else (network.W1, network.b1)
    L = gaussian.factor
    m = W @ gaussian.mean + b
    WL = W @ L
    s = np.sqrt(_rowdot(WL, WL))
    ZL = np.where(s[:, None] > 0, WL / np.where(s > 0, s, 1.0)[:, None], 0.0)
    return m, s, ZL


def _panel_rule(centers: np.ndarray, widths: np.ndarray, rule) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights ``[n, nodes]`` (N(0, 1) density included) of composite Gauss-Legendre on [-12, 12]:
    24 uniform panels, broken at ``centers [n, c]`` and graded geometrically (``widths / 4 * 2^l``) around them."""
    n = centers.shape[0]
    grade = 0.25 * 2.0 ** np.arange(_LEVELS)
    pts = [np.broadcast_to(np.linspace(-_ZMAX, _ZMAX, _N_UNIFORM + 1), (n, _N_UNIFORM + 1))]
    for c in range(centers.shape[1]):
        cc, g = centers[:, c:c + 1], widths[:, c:c + 1] * grade
        pts += [cc, cc - g, cc + g]
    br = np.sort(np.clip(np.concatenate(pts, axis=1), -_ZMAX, _ZMAX), axis=1)
    half, mid = 0.5 * (br[:, 1:] - br[:, :-1]), 0.5 * (br[:, 1:] + br[:, :-1])
    x, w = rule
    z = (mid[..., None] + half[..., None] * x).reshape(n, -1)
    wz = (half[..., None] * w).reshape(n, -1) * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return z, wz


def _centers(act, m: np.ndarray, slope: np.ndarray, width: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Transition points z of ``phi(m + slope z)`` (phi's kinks and 0) with their widths; 0 (width 1) if slope 0."""
    pts = sorted(set(act.kinks) | {0.0})
    ok = slope != 0
    safe = np.where(ok, slope, 1.0)
    cs = [np.where(ok, np.clip((k - m) / safe, -_ZMAX, _ZMAX), 0.0) for k in pts]
    ws = [np.where(ok, width, 1.0)] * len(pts)
    return np.stack(cs, 1), np.stack(ws, 1)


def _psi2_moments(act, m, s, pmax: int) -> np.ndarray:
    """``E[phi(m + s Z)^2 Z^p]``, p = 0..pmax, by the panel rule: ``[n, pmax + 1]``."""
    out = np.empty((m.size, pmax + 1))
    for i in range(0, m.size, _QUAD_CHUNK):
        sl = slice(i, i + _QUAD_CHUNK)
        c, w = _centers(act, m[sl], s[sl], np.minimum(1.0, 1.0 / np.maximum(s[sl], 1e-300)))
        z, wz = _panel_rule(c, w, _GL_HI)
        f = wz * act.fn(m[sl, None] + s[sl, None] * z) ** 2
        for p in range(pmax + 1):
            out[sl, p] = f.sum(1)
            f = f * z
    return out


def _glu_pair_quad(act, rows: dict, ii: np.ndarray, jj: np.ndarray, rho, gam_ij, gam_ji, cgg, lam_ij):
    """Conditional quadrature of E[h_i h_j] for flat entry lists (see the module docstring): (value, error)."""
    m, s, mu, beta = rows["m"], rows["s"], rows["mu"], rows["beta"]
    val = np.empty(ii.size)
    err = np.empty(ii.size)
    for a in range(0, ii.size, _QUAD_CHUNK):
        sl = slice(a, a + _QUAD_CHUNK)
        i, j, r = ii[sl], jj[sl], rho[sl]
        one = np.maximum(1.0 - r * r, 0.0)
        sq = np.sqrt(one)
        w_i = np.where(sq > 0, lam_ij[sl] / np.where(sq > 0, sq, 1.0), 0.0)
        w_j = np.where(sq > 0, (beta[j] - gam_ji[sl] * r) / np.where(sq > 0, sq, 1.0), 0.0)
        cij = cgg[sl] - beta[i] * gam_ji[sl]
        c1, w1 = _centers(act, m[i], s[i], np.minimum(1.0, 1.0 / np.maximum(s[i], 1e-300)))
        wid2 = np.minimum(1.0, np.maximum(sq, 1.0 / np.maximum(s[j], 1e-300)) / np.maximum(np.abs(r), 1e-300))
        c2, w2 = _centers(act, m[j], s[j] * r, wid2)
        cen, wid = np.concatenate([c1, c2], 1), np.concatenate([w1, w2], 1)
        res = []
        for rule in (_GL_HI, _GL_LO):
            z, wz = _panel_rule(cen, wid, rule)
            psi = act.fn(m[i, None] + s[i, None] * z)
            mx = m[j, None] + (s[j] * r)[:, None] * z
            sx = np.broadcast_to((s[j] * sq)[:, None], z.shape)
            c = hermite_coefficients(act, mx.ravel(), sx.ravel(), 2).reshape(z.shape + (3,))
            al_i = mu[i, None] + beta[i, None] * z
            al_j = mu[j, None] + gam_ji[sl, None] * z
            F = ((al_i * al_j + cij[:, None]) * c[..., 0] + (al_i * w_j[:, None] + al_j * w_i[:, None]) * c[..., 1]
                 + 2.0 * (w_i * w_j)[:, None] * c[..., 2])
            res.append(np.sum(wz * psi * F, axis=1))
        val[sl] = res[0]
        err[sl] = np.abs(res[0] - res[1]) + 1e-15 * np.abs(res[0])
    return val, err


def _times_z(e: np.ndarray) -> np.ndarray:
    """Hermite coefficients of ``Z f`` from those of f (one fewer): ``e'_m = e_{m-1} + (m + 1) e_{m+1}``."""
    n = e.shape[1] - 1
    out = (np.arange(1, n + 1) * e[:, 1:]).astype(np.float64)
    out[:, 1:] += e[:, :n - 1]
    return out


def _glu_hidden_moments(network: GLU, gaussian: Gaussian, chunk: int):
    """Mehler with Hermite coefficients to degree 34 first (levels <= 32); to 162 only if some pair needs it (for
    activations without closed forms the coefficients are quadratures, and most pairs of a wide block converge
    early)."""
    for k_top in (32, _K):
        out = _glu_pass(network, gaussian, chunk, k_top)
        if out is not None:
            return out
    raise AssertionError("unreachable")


def _glu_pass(network: GLU, gaussian: Gaussian, chunk: int, k_top: int):
    """One pass at truncation <= ``k_top``; None if a pair needs more and ``k_top < 160``."""
    levels_t = tuple(k for k in _K_LEVELS if k <= k_top)
    act = network.act
    m, s, ZL = _laws(network, gaussian)
    L = gaussian.factor
    gL = network.V @ L
    mu = network.V @ gaussian.mean + network.c
    beta = _rowdot(gL, ZL)
    var_g = _rowdot(gL, gL)
    h = m.size
    c = hermite_coefficients(act, m, s, k_top + 2)  # [h, k_top + 3]
    e_h = mu * c[:, 0] + beta * c[:, 1]
    sqrt_fact = np.exp(0.5 * np.array([math.lgamma(k + 1) for k in range(k_top + 1)]))
    e = [c, _times_z(c)]
    e.append(_times_z(e[1]))
    ehat = [ea[:, :k_top + 1] * sqrt_fact for ea in e]  # orthonormal Hermite coefficients, k = 0..k_top
    # norms E[psi^2 Z^(2a)] and the diagonal E[psi^2 ((mu + beta Z)^2 + Var g - beta^2)], one quadrature
    q = _psi2_moments(act, m, s, 4)
    norms = q[:, [0, 2, 4]]
    diag = q[:, 0] * (mu**2 + var_g - beta**2) + 2 * mu * beta * q[:, 1] + beta**2 * q[:, 2]
    diag_err = 1e-13 * np.abs(diag) + 1e-13 * q[:, 0] * (mu**2 + var_g)
    cum = [np.cumsum(x * x, axis=1) for x in ehat]
    levels = np.array(levels_t)
    resid = [np.maximum(norms[:, a, None] - cum[a][:, levels], 0.0) + 1e-15 * norms[:, a, None] for a in range(3)]
    combos = ((0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (0, 2))
    scale_row = np.sqrt(np.maximum(diag, 0.0))
    Ehh = np.empty((h, h))
    Err = np.empty((h, h))
    for s0 in range(0, h, chunk):
        sl = slice(s0, min(s0 + chunk, h))
        nr = sl.stop - s0
        rho = np.clip(ZL[sl] @ ZL.T, -1.0, 1.0)
        gam = gL[sl] @ ZL.T            # Cov(g_i, Z_j)
        gamT = ZL[sl] @ gL.T           # Cov(Z_i, g_j)
        cgg = gL[sl] @ gL.T            # Cov(g_i, g_j)
        lam = (gL[sl] - beta[sl, None] * ZL[sl]) @ ZL.T  # Cov(g_i - beta_i Z_i, Z_j), no cancellation
        ri = np.arange(nr)
        quad = np.abs(rho) > _RHO_QUAD
        quad[ri, ri + s0] = True
        r = np.where(quad, 0.0, rho)
        det = 1.0 - r * r
        bi, bj = beta[sl, None], beta[None, :]
        p = (bi - r * gam) / det
        qq = (gam - r * bi) / det
        pp = (bj - r * gamT) / det
        qp = (gamT - r * bj) / det
        covr = cgg - (p * gamT + qq * bj)
        mi, mj = mu[sl, None], mu[None, :]
        kap = {(0, 0): mi * mj + covr, (1, 0): mi * qp + mj * p, (0, 1): mi * pp + mj * qq,
               (2, 0): p * qp, (1, 1): p * pp + qq * qp, (0, 2): qq * pp}
        del p, qq, pp, qp, covr
        # per-pair level: smallest K whose truncation bound meets the tolerance (pending pairs only, level by level)
        scale = np.outer(scale_row[sl], scale_row)
        nlev = len(levels_t)
        level = np.full(nr * h, nlev, dtype=np.int8)
        errb = np.zeros(nr * h)
        pend = np.flatnonzero(~quad.ravel())
        for li, K in enumerate(levels_t):
            if not pend.size:
                break
            i, j = np.divmod(pend, h)
            bnd = np.zeros(pend.size)
            for a, b in combos:
                bnd += np.abs(kap[(a, b)].ravel()[pend]) * np.sqrt(resid[a][s0 + i, li] * resid[b][j, li])
            bnd *= np.abs(r.ravel()[pend]) ** (K + 1)
            bnd += 2.2e-16 * (K + 2) * scale.ravel()[pend]
            good = bnd <= REL_TOL * scale.ravel()[pend]
            level[pend[good]] = li
            errb[pend[good]] = bnd[good]
            pend = pend[~good]
        if pend.size and k_top < _K:
            return None
        level = level.reshape(nr, h)
        errb = errb.reshape(nr, h)
        ok = level < nlev
        # dense Mehler sum up to the level that covers >= 95% of the convergent pairs, the rest by gathers
        counts = np.bincount(level[ok].ravel(), minlength=nlev)
        l0 = int(np.searchsorted(np.cumsum(counts), 0.95 * counts.sum())) if counts.sum() else 0
        k0 = levels_t[l0]
        acc = np.zeros((nr, h))
        rk = np.ones((nr, h))
        tmp = np.empty((nr, h))
        for k in range(k0 + 1):
            term = np.zeros((nr, h))
            for a, b in combos:
                np.multiply(ehat[a][sl, k, None], ehat[b][None, :, k], out=tmp)
                tmp *= kap[(a, b)]
                term += tmp
            term *= rk
            acc += term
            rk *= r
        for li in range(l0 + 1, nlev):
            idx = np.flatnonzero(level == li)
            if not idx.size:
                continue
            i, j = np.divmod(idx, h)
            rr = r.ravel()[idx]
            kv = {ab: kap[ab].ravel()[idx] for ab in combos}
            rkv = rr ** (k0 + 1)
            extra = np.zeros(idx.size)
            for k in range(k0 + 1, levels_t[li] + 1):
                t = sum(kv[(a, b)] * ehat[a][s0 + i, k] * ehat[b][j, k] for a, b in combos)
                extra += rkv * t
                rkv *= rr
            acc.ravel()[idx] += extra
        # conditional quadrature: diagonal, |rho| > 0.99, non-convergent pairs
        idx = np.flatnonzero(~ok)
        i, j = np.divmod(idx, h)
        diag_sel = (i + s0) == j
        off = ~diag_sel
        if off.any():
            v, er = _glu_pair_quad(act, dict(m=m, s=s, mu=mu, beta=beta), i[off] + s0, j[off], rho.ravel()[idx[off]],
                                   gam.ravel()[idx[off]], gamT.ravel()[idx[off]], cgg.ravel()[idx[off]],
                                   lam.ravel()[idx[off]])
            acc.ravel()[idx[off]] = v
            errb.ravel()[idx[off]] = er
        acc.ravel()[idx[diag_sel]] = diag[j[diag_sel]]
        errb.ravel()[idx[diag_sel]] = diag_err[j[diag_sel]]
        Ehh[sl] = acc
        Err[sl] = errb
    return e_h, Ehh, Err


def _mlp_hidden_moments(network: Network, gaussian: Gaussian, chunk: int):
    act = network.act
    m, s, ZL = _laws(network, gaussian)
    h = m.size
    e_h = gauss_ev(act, m, s)
    Ehh = np.empty((h, h))
    Err = np.empty((h, h))
    for s0 in range(0, h, chunk):
        sl = slice(s0, min(s0 + chunk, h))
        ri = np.arange(sl.stop - s0)
        rho = np.clip(ZL[sl] @ ZL.T, -1.0, 1.0)
        rho[ri, ri + s0] = 0.0  # the diagonal comes from the univariate second moment (no quadrature per entry)
        v, er = gauss_product_ev(act, m[sl, None], s[sl, None], m[None, :], s[None, :], rho, return_error=True)
        d2 = gauss_second_moment(act, m[sl], s[sl])
        v[ri, ri + s0] = d2
        er[ri, ri + s0] = 1e-10 * np.abs(d2)
        Ehh[sl] = v
        Err[sl] = er
    return e_h, Ehh, Err


def hidden_moments(network: Network, gaussian: Gaussian, *, chunk: int = 1024):
    """``E[h] [d_hidden]``, ``E[h h^T] [d_hidden, d_hidden]`` and a per-entry error estimate of the latter for the
    hidden units h of ``network`` (``phi(W1 x + b1)``; GLU: ``phi(W x + b) * (V x + c)``) under ``gaussian``.

    ``chunk``: rows of the pair grid per pass. Raises ``TypeError`` for a network or law of the wrong type,
    ``ValueError`` for a dimension mismatch or ``chunk < 1``."""
    network = validate_network(network)
    if not isinstance(gaussian, Gaussian):
        raise TypeError(f"gaussian must be a mlpinterp.Gaussian, got {type(gaussian).__name__}")
    if gaussian.d != network.d_in:
        raise ValueError(f"gaussian has dimension {gaussian.d} but the network has d_in = {network.d_in}")
    chunk = check_int(chunk, "chunk", minimum=1)
    if isinstance(network, GLU):
        return _glu_hidden_moments(network, gaussian, chunk)
    return _mlp_hidden_moments(network, gaussian, chunk)


def output_moments(network: Network, gaussian: Gaussian, *, chunk: int = 1024) -> tuple[np.ndarray, float]:
    """``E[f] [d_out]`` and ``E||f||^2`` under ``gaussian`` (exact up to ~1e-10 relative; a ``RuntimeWarning`` names
    the estimated error if the pair integrals did not reach 1e-8 of the total)."""
    e_h, Ehh, Err = hidden_moments(network, gaussian, chunk=chunk)
    W2, b2 = network.W2, network.b2
    G = W2.T @ W2
    e_f = W2 @ e_h + b2
    e_ff = float(np.sum(G * Ehh) + 2.0 * b2 @ (W2 @ e_h) + b2 @ b2)
    bound = float(np.sum(np.abs(G) * Err))
    scale = float(np.sum(np.abs(G) * np.abs(Ehh))) + float(b2 @ b2)
    if bound > 1e-8 * max(scale, 1e-300):
        warnings.warn(f"E||f||^2 = {e_ff:.10g} has an estimated error of {bound:.3g} (pair integrals did not "
                      "converge to 1e-8 of the total)", RuntimeWarning, stacklevel=2)
    return e_f, e_ff
