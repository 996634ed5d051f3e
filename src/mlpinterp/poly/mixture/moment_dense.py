"""Exact mixture approximant of any degree by a dense moment-table solve (small support dimension).

Dense (``method="dense"``, any degree, small feature dimension): monomial features of u, Gram matrix
``sum_k pi_k E_k[u^(alpha + beta)]`` from a table of Gaussian moments built by the Stein recursion
``E[u_i u^a] = m_i E[u^a] + sum_j S_ij a_j E[u^(a - e_j)]`` (independent of the closed forms above), and the
right-hand side from the degree-n projections ``p_k`` in the same way; minimum-norm solve.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from mlpinterp.poly.mixture.coordinates import SupportCoordinates

#: Largest number of monomial features the dense path accepts (its Gram matrix is features^2 floats).
MAX_DENSE_FEATURES = 5000
#: Largest number of Gaussian moments the dense path tabulates (degree <= 2n monomials of r variables).
MAX_MOMENTS = 2_000_000


def _monomial_index(r: int, n: int) -> np.ndarray:
    """All sorted multisets of ``range(r)`` of size <= n as rows ``[M, n]`` padded with ``r`` (degree-major)."""

    rows = [a + (r,) * (n - len(a)) for k in range(n + 1) for a in itertools.combinations_with_replacement(range(r), k)]
    return np.array(rows, dtype=np.int64).reshape(len(rows), n)


def _keys(rows: np.ndarray, r: int) -> np.ndarray:
    """Injective integer key of padded sorted rows (base r + 1)."""
    base = np.int64(r + 1)
    key = np.zeros(rows.shape[0], dtype=np.int64)
    for j in range(rows.shape[1]):
        key = key * base + rows[:, j]
    return key


def _lookup(table_keys: np.ndarray, order: np.ndarray, rows: np.ndarray, r: int) -> np.ndarray:
    """Positions in the moment table of padded sorted ``rows``."""
    k = _keys(rows, r)
    pos = np.searchsorted(table_keys, k, sorter=order)
    return order[pos]


def moment_table(means: np.ndarray, covs: np.ndarray, max_degree: int):
    """Raw moments E[u^alpha] of N(means[k], covs[k]) for every multiset alpha of size <= max_degree.

    Stein recursion (Gaussian integration by parts): ``E[u_i u^a] = m_i E[u^a] + sum_{t in a} S_{i t} E[u^(a - t)]``
    where the sum runs over the positions of the multiset a. ``means [K, r]``, ``covs [K, r, r]``.
    Returns ``(rows [M, max_degree], values [K, M], keys, order)`` (rows padded with r, see ``_monomial_index``).
    """
    K, r = means.shape
    D = max_degree
    rows = _monomial_index(r, D)
    keys = _keys(rows, r)
    order = np.argsort(keys)
    vals = np.zeros((K, rows.shape[0]))
    deg = (rows < r).sum(1)
    vals[:, deg == 0] = 1.0
    for t in range(1, D + 1):
        idx = np.flatnonzero(deg == t)
        beta = rows[idx]
        i = beta[:, 0]
        alpha = np.concatenate([beta[:, 1:], np.full((len(idx), 1), r)], axis=1)  # still sorted
        pa = _lookup(keys, order, alpha, r)
        acc = means[:, i] * vals[:, pa]
        for s in range(t - 1):
            j = alpha[:, s]
            rest = np.concatenate([np.delete(alpha, s, axis=1), np.full((len(idx), 1), r)], axis=1)
            acc = acc + covs[:, i, j] * vals[:, _lookup(keys, order, rest, r)]
        vals[:, idx] = acc
    return rows, vals, keys, order


def _multiplicity(rows: np.ndarray, r: int) -> np.ndarray:
    """Number of distinct orderings of each padded multiset row (multinomial coefficient)."""
    out = np.empty(rows.shape[0])
    for a, row in enumerate(rows):
        row = row[row < r]
        _, counts = np.unique(row, return_counts=True)
        out[a] = math.factorial(len(row)) / math.prod(math.factorial(int(c)) for c in counts)
    return out


def _dense_feature_count(r: int, degree: int) -> int:
    return math.comb(r + degree, degree)


def _largest_dim(degree: int) -> int:
    d = 1
    while _dense_feature_count(d + 1, degree) <= MAX_DENSE_FEATURES:
        d += 1
    return d


def solve_dense(projections, coords: SupportCoordinates, degree: int, d_out: int):
    """Dense normal equations in the monomials of u; returns tensors in u and solver diagnostics.

    projections : an iterable (e.g. a generator, consumed after the size check below) over the components k of the
    tensors ``[d_out], [d_out, r], ...`` in u of their degree-``degree`` single-Gaussian projections ``p_k``
    (``coordinates.tensors_in_u`` of ``fit_ridge``), which have f's moments of degree <= ``degree`` under component k.
    Raises ValueError when the feature count exceeds ``MAX_DENSE_FEATURES`` or the moments ``MAX_MOMENTS``.
    """
    r = coords.r
    n_feat = _dense_feature_count(r, degree)
    if n_feat > MAX_DENSE_FEATURES or math.comb(r + 2 * degree, 2 * degree) > MAX_MOMENTS:
        raise ValueError(
            f"the dense degree-{degree} solve needs C(r + {degree}, {degree}) = {n_feat} monomial features on the "
            f"mixture's support (r = {r}), more than MAX_DENSE_FEATURES = {MAX_DENSE_FEATURES}; it fits for "
            f"support dimension r <= {_largest_dim(degree)}"
            + ("; use method='cg' for degree 2 (matrix-free, any size)" if degree == 2 else "")
        )
    rows, vals, keys, order = moment_table(coords.means, coords.covs, 2 * degree)
    feats = _monomial_index(r, degree)
    F = feats.shape[0]
    pi = coords.weights
    mix_moments = pi @ vals  # [M]
    # Gram[a, b] = E_mix[u^(alpha_a + alpha_b)]
    pair = np.concatenate([np.repeat(feats, F, axis=0), np.tile(feats, (F, 1))], axis=1)
    pair.sort(axis=1)
    pos = _lookup(keys, order, pair, r).reshape(F, F)
    gram = mix_moments[pos]
    # RHS[a, o] = sum_k pi_k sum_beta coef_k[o, beta] E_k[u^(alpha_a + beta)]
    mult = _multiplicity(feats, r)
    deg = (feats < r).sum(1)
    rhs = np.zeros((F, d_out))
    for k, Tu in enumerate(projections):
        if pi[k] == 0:
            continue
        coef = np.zeros((d_out, F))
        for b_ in range(F):
            idx = tuple(int(v) for v in feats[b_, : deg[b_]])
            coef[:, b_] = Tu[deg[b_]][(slice(None),) + idx] * mult[b_]
        rhs += pi[k] * (vals[k][pos] @ coef.T)
    w, V = np.linalg.eigh(gram)
    keep = w > 1e-12 * w[-1]
    theta = (V[:, keep] / w[keep]) @ (V[:, keep].T @ rhs)  # minimum-norm solution  [F, o]
    resid = gram @ theta - rhs
    rel = np.linalg.norm(resid, axis=0) / np.maximum(np.linalg.norm(rhs, axis=0), 1e-300)
    tensors = [np.zeros((d_out,) + (r,) * j) for j in range(degree + 1)]

    for a in range(F):
        j = int(deg[a])
        idx = tuple(int(v) for v in feats[a, :j])
        val = theta[a] / mult[a]
        for perm in set(itertools.permutations(idx)):
            tensors[j][(slice(None),) + perm] = val
    info = {"method": "dense", "n_features": F, "gram_condition": float(w[-1] / w[keep][0]),
            "gram_rank": int(keep.sum()), "relative_residual": float(rel.max()), "iterations": 0}
    return tensors, info

