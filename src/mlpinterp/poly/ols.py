"""The paper's route to the optimal polynomial: monomial features + ordinary least squares in moments.

Rigg & Belrose (2025, arXiv 2502.01032, §3): write p(x) = theta . z(x) with z the monomials of degree <= n,
and solve the normal equations E[z z^T] theta = E[z f]. The feature covariance is a table of Gaussian
moments (Isserlis) and the cross-moments E[phi(y) prod_i x_i] come from the master theorem (Thm 3.1).
We use monomials of the centred input t = x - mean for conditioning and convert to raw coordinates.
Feature dimension C(d_in + n, n): intended for small d_in (tests, cross-checking ``ridge``).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian
from mlpinterp.gaussian.master import central_moment, master_theorem_ev
from mlpinterp.networks import GLU, MLP, Network
from mlpinterp.poly.approximant import DensePolynomial
from mlpinterp.poly.tensors import centered_to_raw

#: Refuse feature spaces larger than this (the Gram matrix is dense).
MAX_FEATURES = 5000


def monomials(d: int, n: int) -> list[tuple[int, ...]]:
    """All multisets of coordinates of size <= n (sorted tuples), degree-major order."""
    return [a for r in range(n + 1) for a in itertools.combinations_with_replacement(range(d), r)]




def _cross_moments(network: Network, dist: Gaussian, feats: list[tuple[int, ...]]) -> np.ndarray:
    """E[f_o t^alpha] for every feature alpha: ``[n_features, d_out]``."""
    S = dist.cov
    if isinstance(network, MLP):
        W, b = network.W1, network.b1
    else:
        W, b = network.W, network.b
    m = W @ dist.mean + b
    SW = W @ S  # [h, d]: Cov(y_j, x)
    var = np.einsum("hd,hd->h", SW, W)
    safe = np.where(var > 0, var, 1.0)
    if isinstance(network, GLU):
        SV = network.V @ S
        cov_gy = np.einsum("hd,hd->h", SV, W)
        var_g = np.einsum("hd,hd->h", SV, network.V)
        mean_g = network.V @ dist.mean + network.c
    out = np.zeros((len(feats), network.d_out))
    for fi, alpha in enumerate(feats):
        idx = list(alpha)
        # Y = (t_alpha_1, ..., [gate]) with t = x - mean: E[Y] = 0, Cov(Y_i, y) = SW[:, i]
        beta = np.where(var[:, None] > 0, SW[:, idx] / safe[:, None], 0.0)  # [h, r]
        cov_yy = S[np.ix_(idx, idx)][None] - beta[:, :, None] * beta[:, None, :] * var[:, None, None]
        alpha_m = np.zeros((W.shape[0], len(idx)))
        if isinstance(network, GLU):
            bg = np.where(var > 0, cov_gy / safe, 0.0)
            cov_tg = SV[:, idx]  # Cov(t_i, g)
            eg = cov_tg - beta * bg[:, None] * var[:, None]  # Cov(eps_i, eps_g)
            vg = var_g - bg**2 * var
            r = len(idx)
            full = np.zeros((W.shape[0], r + 1, r + 1))
            full[:, :r, :r] = cov_yy
            full[:, :r, r] = eg
            full[:, r, :r] = eg
            full[:, r, r] = vg
            cov_yy = full
            beta = np.concatenate([beta, bg[:, None]], axis=1)
            alpha_m = np.concatenate([alpha_m, mean_g[:, None]], axis=1)
        ev = master_theorem_ev(network.act, m, var, alpha_m, beta, cov_yy)  # [h]
        ex = central_moment(S, idx)  # E[t^alpha]
        out[fi] = network.W2 @ ev + network.b2 * ex
    return out


def fit_ols(network: Network, dist: Gaussian, degree: int, *, rcond: float = 1e-12) -> DensePolynomial:
    """Optimal degree-``degree`` approximant by the paper's OLS-in-moments route (small d_in).

    Raises ``ValueError`` if the number of monomial features exceeds ``MAX_FEATURES``.
    """
    d = network.d_in
    n_feat = math.comb(d + degree, degree)
    if n_feat > MAX_FEATURES:
        raise ValueError(
            f"the OLS route needs C(d_in + degree, degree) = {n_feat} monomial features, more than "
            f"MAX_FEATURES = {MAX_FEATURES}; use method='ridge' (exact, any size)"
        )
    feats = monomials(d, degree)
    gram = np.array([[central_moment(dist.cov, a + b) for b in feats] for a in feats])
    rhs = _cross_moments(network, dist, feats)
    theta, *_ = np.linalg.lstsq(gram, rhs, rcond=rcond)  # [n_feat, d_out], minimum-norm on singular Gram
    # symmetric tensors in centred coordinates
    tensors = [np.zeros((network.d_out,) + (d,) * r) for r in range(degree + 1)]
    for fi, alpha in enumerate(feats):
        r = len(alpha)
        perms = set(itertools.permutations(alpha))
        n_perm = math.factorial(r) // math.prod(math.factorial(c) for c in Counter(alpha).values())
        for p in perms:
            tensors[r][(slice(None),) + p] = theta[fi] / n_perm
    if dist.is_singular:
        # extension off the support by orthogonal projection: S_r[t, ..., t] -> S_r[P t, ..., P t], P = U U^T
        # (lstsq's minimum-norm monomial coefficients are not this extension for degree >= 2)
        P = dist.support @ dist.support.T
        for r in range(1, degree + 1):
            for ax in range(1, r + 1):
                tensors[r] = np.moveaxis(np.tensordot(tensors[r], P, axes=([ax], [0])), -1, ax)
    raw = centered_to_raw(tensors, dist.mean)
    return DensePolynomial(raw, info={"network": type(network).__name__, "activation": network.activation,
                                      "distribution": "Gaussian", "method": "ols-moments", "degree": degree,
                                      "d_in": d})
