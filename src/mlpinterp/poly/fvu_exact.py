"""Exact FVU of an MLP's ridge approximant under one Gaussian, in memory O(d_hidden x chunk).

With u_i = (y_i - m_i) / s_i the network's standardised pre-activations, c_ik the Hermite coefficients of phi about
y_i's law and z_j = A_j . (x - center) the approximant's standard-normal ridge variables, Mehler's formula gives
(Rigg & Belrose 2025, arXiv 2502.01032, §3; O'Donnell, *Analysis of Boolean Functions*, §11.2)

    Cov(phi(y_i), He_k(z_j)) = k! c_ik rho_ij^k,   rho_ij = Corr(y_i, z_j),
    Cov(He_k(z_i), He_l(z_j)) = delta_kl k! R_ij^k, R_ij = Corr(z_i, z_j),

and Var(f_o) = sum_ij W2_oi W2_oj Cov(phi(y_i), phi(y_j)) needs the bivariate integrals E[phi(y_i) phi(y_j)]
(:func:`mlpinterp.gaussian.bivariate.gauss_product_ev`, with a propagated error bound). Every ``[d_hidden,
d_hidden]`` matrix of these sums is formed one block of ``chunk`` rows at a time and contracted with the read-out
at once, so only ``[chunk, d_hidden]`` blocks and ``[chunk, d_out]`` products are ever held; the result equals the
unblocked sums up to the order of floating-point additions.

GLUs have no exact route here: E[(phi(y_i) g_i)(phi(y_j) g_j)] needs the bivariate moments
E[phi(y_i) phi(y_j) y_i^a y_j^b] (a + b <= 2) of every neuron pair, which :mod:`mlpinterp.gaussian.bivariate`
does not provide; their FVU is the streamed Monte Carlo estimate of :mod:`mlpinterp.poly.metrics`.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian
from mlpinterp.networks import MLP
from mlpinterp.poly.approximant import RidgePolynomial
from mlpinterp.utils.memory import chunk_rows

#: Bytes per neuron pair held while one block of bivariate integrals is evaluated (the Mehler sum's running
#: arrays, its bound and the correlation block; measured from ``gauss_product_ev``'s temporaries, rounded up).
BYTES_PER_PAIR = 128

#: network -> (distribution, the network-only sums): Var(f), E[f], their scale and error bound depend on the
#: network and the input law only, so FVUs of several approximants of one network reuse them.
_NETWORK_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def exact_layout(network, p, dist: Gaussian) -> np.ndarray | None:
    """Classify ``p``'s ridge directions for the exact FVU, or ``None`` if the exact route does not apply.

    The exact route needs an MLP, a ``RidgePolynomial`` without gate terms and, for each of p's neurons,
    ``z_j = A_j . (x - center)`` either standard normal under ``dist`` (unit variance, zero mean) or a.s. 0
    (zero variance, zero mean). Returns a boolean mask ``[p.d_hidden]`` (True = standard-normal direction).
    """
    if not (isinstance(network, MLP) and isinstance(p, RidgePolynomial) and p.G is None):
        return None
    if p.d_in != network.d_in or p.d_out != network.d_out:
        return None
    scale = 1.0 + float(np.abs(dist.mean).max()) + float(np.abs(p.center).max())
    AL = p.A @ dist.factor
    norms = np.einsum("hr,hr->h", AL, AL)
    unit = np.abs(norms - 1) < 1e-8
    zero = np.abs(norms) < 1e-12
    if not np.all(unit | zero):
        return None
    offset = p.A @ (dist.mean - p.center)  # mean of z_j
    if np.any(np.abs(offset) > 1e-12 * scale * (1.0 + np.abs(p.A).sum(1))):
        return None
    return unit


def check_variance(var_f: np.ndarray, scale: float, where: str) -> None:
    """``ValueError`` when the network output has (numerically) zero variance: the FVU is undefined."""
    total = float(np.sum(var_f))
    if not total > 1e-24 * scale:
        raise ValueError(
            f"network output has zero variance{where} (sum_o Var(f_o) = {total:.3g}); the FVU is undefined"
        )


def _rows(n_cols: int, extra_per_row: int, chunk_size: int | None, what: str) -> int:
    """Rows per block: ``chunk_size`` if given, else as many as the working budget allows (memory checked)."""
    per_row = BYTES_PER_PAIR * max(n_cols, 1) + 8 * extra_per_row
    fix = ("pass a smaller chunk_size, or method='monte-carlo' (memory independent of d_hidden^2; on the command "
           "line: mlpinterp approx --fvu-method monte-carlo)")
    if chunk_size is not None:
        return chunk_rows(per_row, what, fix, budget=int(chunk_size * per_row), maximum=chunk_size)
    return chunk_rows(per_row, what, fix, minimum=1)


def _network_sums(network: MLP, dist: Gaussian, WL: np.ndarray, m, s, e_phi, chunk_size):
    """``(var_f [o], mean_f [o], scale, bound)``, blocked over rows of the ``[h, h]`` product moments (``bound``: the
    error bound of ``sum_o Var(f_o)``)."""
    from mlpinterp.gaussian.bivariate import gauss_product_ev, mehler_coefficients

    hit = _NETWORK_CACHE.get(network)
    if hit is not None and hit[0] is dist:
        return hit[1]
    h, W2 = network.d_hidden, network.W2
    absW2 = np.abs(W2)
    safe = np.where(s > 0, s, 1.0)
    live = s > 0
    var_f = np.zeros(network.d_out)
    bound = 0.0
    rows = _rows(h, 4 * network.d_out, chunk_size, "the exact FVU's [chunk, d_hidden] bivariate blocks")
    coef, second = mehler_coefficients(network.act, m, s)  # once per neuron, shared by every block
    for i0 in range(0, h, rows):
        blk = slice(i0, min(i0 + rows, h))
        cov = WL[blk] @ WL.T
        rho = np.clip(cov / np.outer(safe[blk], safe), -1.0, 1.0)
        rho = np.where(np.outer(live[blk], live), rho, 0.0)
        e2, err = gauss_product_ev(network.act, m[blk, None], s[blk, None], m[None, :], s[None, :], rho,
                                   return_error=True,
                                   coefficients=(coef[blk, None], second[blk, None], coef[None], second[None]))
        C = np.where(np.outer(live[blk], live), e2 - np.outer(e_phi[blk], e_phi), 0.0)
        var_f += (W2[:, blk].T * (C @ W2.T)).sum(0)  # sum_ij W2_oi C_ij W2_oj, rows i of this block
        bound += float((err * (absW2[:, blk].T @ absW2)).sum())  # sum_o sum_ij |W2_oi| err_ij |W2_oj|
    # scale of the zero-variance test: sum_o (sum_i |W2_oi| sqrt(E phi_i^2))^2 >= sum_o sum_ij |W2_oi W2_oj e2_ij|
    scale_sum = float(((absW2 @ np.sqrt(np.maximum(second, 0.0))) ** 2).sum())
    mean_f = W2 @ e_phi + network.b2
    out = (var_f, mean_f, float(np.sum(mean_f**2)) + scale_sum, bound)
    _NETWORK_CACHE[network] = (dist, out)
    return out


def fvu_exact_mlp(network: MLP, p: RidgePolynomial, dist: Gaussian, unit: np.ndarray, *,
                  chunk_size: int | None = None):
    """Exact FVU of a ``RidgePolynomial`` (directions classified by :func:`exact_layout`) under one Gaussian.

    ``chunk_size``: rows per block of the ``[d_hidden, d_hidden]`` sums (default: from the memory budget,
    :mod:`mlpinterp.utils.memory`). Returns ``(pooled, per_output [o], error_bound)``. Raises
    :class:`~mlpinterp.utils.memory.InsufficientMemoryError` before allocating when one block does not fit and
    ``ValueError`` for a network output of zero variance.
    """
    from mlpinterp.gaussian.hermite import hermite_he
    from mlpinterp.gaussian.univariate import hermite_coefficients

    L = dist.factor
    WL = network.W1 @ L  # [h, r]: Cov(y) = WL WL^T
    m = network.W1 @ dist.mean + network.b1
    s = np.sqrt(np.einsum("hr,hr->h", WL, WL))
    safe = np.where(s > 0, s, 1.0)
    n = p.degree
    c = hermite_coefficients(network.act, m, s, n)
    var_f, mean_f, scale, bound = _network_sums(network, dist, WL, m, s, c[:, 0], chunk_size)
    check_variance(var_f, scale, " under this distribution")
    W2, P = network.W2, p.W2
    AL = np.where(unit[:, None], p.A @ L, 0.0)  # [hp, r]: z_j = AL_j . u
    PD = [P * p.D[:, k] for k in range(n + 1)]  # [o, hp] read-out of He_k(z_j)
    cov_fp = np.zeros(network.d_out)
    var_p = np.zeros(network.d_out)
    h, hp = network.d_hidden, p.d_hidden
    rows = _rows(hp, 4 * network.d_out, chunk_size, "the exact FVU's [chunk, d_hidden] correlation blocks")
    for i0 in range(0, h, rows):  # Cov(f, p): rows i of the network's neurons
        blk = slice(i0, min(i0 + rows, h))
        rho = np.where((s[blk] > 0)[:, None] & unit[None, :], (WL[blk] @ AL.T) / safe[blk, None], 0.0)
        rho = np.clip(rho, -1.0, 1.0)
        rk = np.ones_like(rho)
        for k in range(1, n + 1):
            rk *= rho
            T = (rk * math.factorial(k)) @ PD[k].T  # [chunk, o]
            cov_fp += ((W2[:, blk] * c[blk, k]).T * T).sum(0)
    for j0 in range(0, hp, rows):  # Var(p): rows j of the approximant's neurons
        blk = slice(j0, min(j0 + rows, hp))
        R = np.clip(AL[blk] @ AL.T, -1.0, 1.0)
        Rk = np.ones_like(R)
        for k in range(1, n + 1):
            Rk *= R
            var_p += (PD[k][:, blk].T * ((Rk * math.factorial(k)) @ PD[k].T)).sum(0)
    const_h = (hermite_he(n, np.zeros(hp)) * p.D).sum(1)  # sum_k D_jk He_k(0)
    mean_h = np.where(unit, p.D[:, 0], const_h)
    mean_gap = mean_f - (P @ mean_h + p.b2)
    mse = np.maximum(var_f + var_p - 2 * cov_fp + mean_gap**2, 0.0)
    per = mse / np.where(var_f > 0, var_f, np.nan)
    pooled = float(mse.sum() / var_f.sum())
    err_bound = float(bound * (1 + pooled) / var_f.sum())
    return pooled, per, err_bound
