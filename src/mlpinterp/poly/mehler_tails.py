"""An MLP's output variance and the errors of its Hermite truncations under one Gaussian, exactly, in blocks.

With y_i = m_i + s_i u_i the pre-activations (u_i standard normal, rho_ij = Corr(y_i, y_j)) and
phi(m_i + s_i u) = sum_k c_ik He_k(u), Mehler's formula (O'Donnell, *Analysis of Boolean Functions*, §11.2) gives

    Cov(phi(y_i), phi(y_j)) = sum_{k>=1} a_ik a_jk rho_ij^k,   a_ik = c_ik sqrt(k!),

and the degree-n truncation p_n (the least-squares approximant, Rigg & Belrose 2025, arXiv 2502.01032, §3) leaves
the residual covariance T^(n)_ij = sum_{k>n} a_ik a_jk rho_ij^k. So for f = W2 phi(y) + b2

    Var(f_o) = sum_ij W2_oi T^(0)_ij W2_oj,   E[(f_o - p_n,o)^2] = sum_ij W2_oi T^(n)_ij W2_oj,

one matrix per degree, each a tail of the same series: no difference of large terms. :func:`tail_sums` forms the
matrices T^(0..N) for one block of rows i and the columns j >= i (the matrices are symmetric: each off-diagonal
pair once, weighted 2) and contracts them with the read-out in one GEMM per block, so only
``[N + 1, chunk, d_hidden]`` arrays are ever held and each pair's integrals are evaluated once for every degree.

Truncation, per tile of ``chunk x TILE`` pairs: the series is summed (Horner, in rho) to the smallest order K
whose rigorous tail bound |rho|^{K+1} sqrt(R_i(K) R_j(K)) (Cauchy-Schwarz and Parseval; R_i(K) = E[phi(y_i)^2]
- sum_{k<=K} a_ik^2) is below ``REL_TOL`` sqrt(E[phi_i^2] E[phi_j^2]) for the tile's largest |rho|, at most
``K_MAX``. Pairs more correlated than that (near-duplicate neurons) are evaluated one by one by
:func:`mlpinterp.gaussian.bivariate.gauss_product_ev` (Mehler to order 160, else conditional quadrature, with
its error estimate); a neuron with itself uses T^(n)_ii = R_i(n) directly.

Error bound: the sum over pairs of the truncation / quadrature errors and the rounding of the Mehler sums
(``eps (K + n + 3) |rho_ij| sqrt(Var phi_i Var phi_j)``; ``eps (n + 3) E[phi_i^2]`` for a neuron with itself), weighted by ``||W2[:, i]|| ||W2[:, j]||`` (>= sum_o |W2_oi W2_oj|,
Cauchy-Schwarz); it bounds ``sum_o`` of the error of every ``Var(f_o)`` and truncation error alike. The rounding
of the final contractions (relative O(eps sqrt(d_hidden))) is not included.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.gaussian.bivariate import gauss_product_ev, mehler_coefficients

#: Relative truncation tolerance of the tiled Mehler sums (per pair, relative to sqrt(E phi_i^2 E phi_j^2)).
REL_TOL = 1e-13
#: Highest order of the tiled Mehler sums; more correlated pairs are evaluated one by one.
K_MAX = 48
#: Columns per tile of the elementwise Mehler sums (a tile's arrays stay in cache).
TILE = 512
_EPS = np.finfo(float).eps


def bytes_per_pair(n_max: int) -> int:
    """Bytes held per neuron pair of a row block: the ``n_max + 1`` tail matrices and the correlation block."""
    return 8 * (n_max + 2)


class NeuronLaws:
    """Per-neuron quantities of the tail sums: ``a [h, 161]`` (orthonormal Hermite coefficients, 0 for k >= 1 on
    constant neurons), ``second [h]`` (E[phi(y_i)^2]), ``resid [h, 161]`` (R_i(k), clipped at 0) and
    ``q [h, 161]`` (sqrt(R_i(k) / E[phi_i^2]), the relative tail)."""

    def __init__(self, act, m: np.ndarray, s: np.ndarray):
        live = s > 0
        a, second = mehler_coefficients(act, m, s)
        a[:, 1:] *= live[:, None]
        self.a, self.second, self.live = a, second, live
        self.resid = np.maximum(second[:, None] - np.cumsum(a * a, axis=1), 0.0)
        pos = second > 0
        self.q = np.sqrt(self.resid / np.where(pos, second, 1.0)[:, None]) * pos[:, None]
        self.m, self.s, self.act = m, s, act


def _order(mx: float, qI: np.ndarray, qJ: np.ndarray, n_max: int) -> tuple[int, float]:
    """``(K, t)``: the order of a tile's Mehler sum and the largest |rho| it covers within ``REL_TOL``
    (``t >= mx`` unless the tile has pairs that need more than ``K_MAX`` terms)."""
    ks = np.arange(qI.shape[0])
    crit = mx ** (ks + 1) * qI * qJ
    ok = (crit <= REL_TOL) & (ks >= n_max) & (ks <= K_MAX)
    if ok.any():
        return int(np.argmax(ok)), mx
    K = max(K_MAX, n_max)
    qq = qI[K] * qJ[K]
    return K, (REL_TOL / qq) ** (1.0 / (K + 1)) if qq > 0 else 1.0


def _tile(T: np.ndarray, rho: np.ndarray, law: NeuronLaws, I: slice, J: slice, n_max: int, diagonal: bool,
          nI: np.ndarray, nJ: np.ndarray) -> float:
    """Fill ``T [n_max + 1, b, w]`` with the tails T^(n) of rows ``I`` x columns ``J`` (``rho [b, w]``) and return
    the error bound of the tile, weighted by ``nI [b]``, ``nJ [w]`` (read-out column norms)."""
    a, q, resid = law.a, law.q, law.resid
    b, w = rho.shape
    idx = np.arange(b)
    if diagonal:  # neuron i with itself: exact from its residuals, not from the series
        rho[idx, idx] = 0.0
    mx = max(float(rho.max(initial=0.0)), float(-rho.min(initial=0.0)))
    K, t = _order(mx, q[I].max(0), q[J].max(0), n_max)
    aI, aJ = a[I], a[J]
    # Horner in rho: H_k = a_k a_k^T + rho H_(k+1), H_(K+1) = 0; T^(n) = rho^(n+1) H_(n+1)
    acc, tmp = np.empty((b, w)), np.empty((b, w))
    T[K:] = 0.0  # H_(n+1) = 0 for n >= K
    np.multiply(aI[:, K, None], aJ[None, :, K], out=acc)
    for k in range(K, 0, -1):
        if k < K:
            acc *= rho
            np.multiply(aI[:, k, None], aJ[None, :, k], out=tmp)
            acc += tmp
        if k <= n_max + 1:
            T[k - 1] = acc
    pw = rho.copy()
    for n in range(n_max + 1):
        if n > 0:
            pw *= rho
        T[n] *= pw
    # truncation: |rho| <= t off the strong pairs; rounding of the Horner sums: (K + n_max + 3) eps sum_k
    # |a_ik a_jk| |rho|^k <= (K + n_max + 3) eps t sqrt(R_i(0) R_j(0))
    rI, rJ = resid[I, K], resid[J, K]
    vI, vJ = resid[I, 0], resid[J, 0]
    bound = (t ** (K + 1) * float(nI @ np.sqrt(rI)) * float(nJ @ np.sqrt(rJ))
             + _EPS * (K + n_max + 3) * t * float(nI @ np.sqrt(vI)) * float(nJ @ np.sqrt(vJ)))
    if diagonal:
        rho[idx, idx] = 1.0
        T[:, idx, idx] = resid[I, : n_max + 1].T * law.live[I]
        bound += _EPS * (n_max + 3) * float(nI**2 @ law.second[I])  # R_i(n) = E[phi_i^2] - sum_{k<=n} a_ik^2
    if t < mx:
        rows, cols = np.nonzero(np.abs(rho) > t)
        if diagonal:
            keep = rows != cols
            rows, cols = rows[keep], cols[keep]
        if rows.size:
            bound += _strong(T, rho, law, I.start + rows, J.start + cols, rows, cols, n_max, nI, nJ)
    return bound


def _strong(T, rho, law: NeuronLaws, gi, gj, rows, cols, n_max, nI, nJ) -> float:
    """Overwrite the pairs ``(rows, cols)`` of a tile (global neurons ``gi``, ``gj``) with their one-by-one
    integrals; returns their error bound."""
    r = rho[rows, cols]
    m, s, a, e2 = law.m, law.s, law.a, law.second
    val, err = gauss_product_ev(law.act, m[gi], s[gi], m[gj], s[gj], r, return_error=True,
                                coefficients=(a[gi], e2[gi], a[gj], e2[gj]))
    mean2 = a[gi, 0] * a[gj, 0]
    tail = val - mean2
    err = err + 2 * _EPS * (np.abs(val) + np.abs(mean2))
    rk = np.ones_like(r)
    for n in range(n_max + 1):
        if n > 0:
            rk *= r
            tail -= a[gi, n] * a[gj, n] * rk
        T[n, rows, cols] = tail
    return float((err * nI[rows] * nJ[cols]).sum())


def tail_sums(law: NeuronLaws, WL: np.ndarray, W2: np.ndarray, n_max: int, rows: int) -> tuple[np.ndarray, float]:
    """``(sums [n_max + 1, d_out], bound)``: ``sums[n, o] = sum_ij W2_oi T^(n)_ij W2_oj`` (n = 0: Var(f_o); n >= 1:
    the squared error of the degree-n truncation) and the error bound of ``sums.sum(1)`` (module docstring).

    ``WL [h, r]``: pre-activation factors (Cov(y) = WL WL^T); ``rows``: neurons per row block.
    """
    h, o = W2.shape[1], W2.shape[0]
    s = law.s
    safe = np.where(s > 0, s, 1.0)
    inv = np.where(s > 0, 1.0 / safe, 0.0)  # rho_ij = (WL WL^T)_ij inv_i inv_j; 0 for constant neurons
    W2T = np.ascontiguousarray(W2.T)
    norms = np.sqrt(np.einsum("oh,oh->h", W2, W2))
    sums = np.zeros((n_max + 1, o))
    bound = 0.0
    for i0 in range(0, h, rows):
        i1 = min(i0 + rows, h)
        b, nc = i1 - i0, h - i0
        rho = WL[i0:i1] @ WL[i0:].T
        rho *= inv[i0:i1, None]
        rho *= inv[None, i0:]
        np.clip(rho, -1.0, 1.0, out=rho)
        T = np.empty((n_max + 1, b, nc))
        edges = [0, b, *range(b + TILE, nc, TILE), nc] if nc > b else [0, b]
        for c0, c1 in zip(edges[:-1], edges[1:], strict=True):
            tile = T[:, :, c0:c1]
            I, J = slice(i0, i1), slice(i0 + c0, i0 + c1)
            wgt = 1.0 if c0 == 0 else 2.0  # an off-diagonal tile stands for itself and its mirror image
            bound += wgt * _tile(tile, rho[:, c0:c1], law, I, J, n_max, c0 == 0, norms[I], norms[J])
            if c0 > 0:
                tile *= 2.0
        prod = (T.reshape((n_max + 1) * b, nc) @ W2T[i0:]).reshape(n_max + 1, b, o)
        sums += np.einsum("nbo,bo->no", prod, W2T[i0:i1])
    return sums, bound
