"""Exact quadratic approximant under a Gaussian mixture by a cached dense solve (moderate d_in).

Normal equations of the mixture least-squares problem over quadratic features z(u) = (1, u, u_i u_j (i <= j))
of whitened support coordinates u = W (x - mean):

    G theta = E_mix[z f],      G = sum_k pi_k G_k,   G_k = E_k[z z^T]   (Gaussian moments <= 4, Isserlis).

The right-hand side needs no new integrals: under component k the single-Gaussian quadratic projection p_k
(``fit_ridge``) has the same moments of degree <= 2 as f, so E_k[z f] = E_k[z p_k] = G_k theta_k with theta_k
the coefficients of p_k. G, its eigendecomposition and the G_k depend only on the mixture, so they are cached
per mixture: fitting every checkpoint of a training run costs K single-Gaussian fits and K matrix-vector
products. Intended for feature dimension (r+1)(r+2)/2 <= ~5,000 (r = support dimension), e.g. 8x8 digits;
MNIST-scale problems use the matrix-free CG solver of ``pcg.py``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from mlpinterp.gaussian.distributions import GaussianMixture
from mlpinterp.networks import Network
from mlpinterp.poly.approximant import DensePolynomial
from mlpinterp.poly.mixture.coordinates import coordinates_of
from mlpinterp.poly.ridge import fit_ridge

#: Largest number of quadratic features (r+1)(r+2)/2 handled here.
MAX_FEATURES = 5000

#: Largest memory of the cached Grams (``gram_bytes``) for which ``fit_polynomial`` takes this route by default;
#: beyond it (many components) the matrix-free solver, whose memory is O(K r^2), is used instead.
MAX_CACHED_BYTES = 2 * 10**9


def gram_bytes(K: int, r: int) -> float:
    """Bytes of the cached solve: K per-component Grams ``[F, F]``, their mixture, its factorisation and the
    symmetrised copy (F = (r+1)(r+2)/2, float64)."""
    F = feature_count(r)
    return 8.0 * (K + 4) * F * F

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class _Factorised:
    mean: np.ndarray  # [d] mixture mean
    W: np.ndarray  # [r, d] whitening on the support: u = W (x - mean)
    Winv: np.ndarray  # [d, r] x - mean = Winv u on the support
    iu: tuple[np.ndarray, np.ndarray]  # upper-triangle index pairs (i <= j)
    grams: np.ndarray  # [K, F, F] per-component Gram matrices
    gram: np.ndarray  # [F, F] mixture Gram matrix
    solve: Callable[[np.ndarray], np.ndarray]  # rhs [F, o] -> G^+ rhs
    condition: float  # condition estimate of G (Cholesky pivots ratio, or eigenvalue ratio)
    how: str


def feature_count(r: int) -> int:
    """(r+1)(r+2)/2 quadratic features on an r-dimensional support."""
    return (r + 1) * (r + 2) // 2


def fits(K: int, d_in: int) -> bool:
    """Whether the cached solve fits for ``K`` components in ``d_in`` dimensions (the support's rank r is at most
    ``d_in``): its feature count within :data:`MAX_FEATURES` and its ``K`` Gram matrices (:func:`gram_bytes`) within
    :data:`MAX_CACHED_BYTES` and the usable share of the memory available now (``utils.memory``)."""
    from mlpinterp.utils.memory import USABLE_FRACTION, available_bytes

    return feature_count(d_in) <= MAX_FEATURES and \
        gram_bytes(K, d_in) <= min(MAX_CACHED_BYTES, USABLE_FRACTION * available_bytes())


def _component_gram(a: np.ndarray, C: np.ndarray, iu) -> np.ndarray:
    """E[z z^T] for u ~ N(a, C), z = (1, u, u_i u_j (i <= j)); Isserlis for moments up to order 4."""
    r = a.shape[0]
    M2 = C + np.outer(a, a)
    # third moments E[u_i u_j u_l]
    M3 = (np.einsum("i,jl->ijl", a, C) + np.einsum("j,il->ijl", a, C) + np.einsum("l,ij->ijl", a, C)
          + np.einsum("i,j,l->ijl", a, a, a))
    # fourth moments E[u_i u_j u_l u_m] (non-central Isserlis): 3 CC + 6 aaC + aaaa
    i, j = iu
    q = len(i)
    F = 1 + r + q
    G = np.empty((F, F))
    G[0, 0] = 1.0
    G[0, 1 : r + 1] = G[1 : r + 1, 0] = a
    G[0, r + 1 :] = G[r + 1 :, 0] = M2[i, j]
    G[1 : r + 1, 1 : r + 1] = M2
    B = M3[:, i, j]  # [r, q]
    G[1 : r + 1, r + 1 :] = B
    G[r + 1 :, 1 : r + 1] = B.T
    # fourth moments E[u_i u_j u_l u_m] over pairs (i <= j), (l <= m): non-central Isserlis,
    # 3 CC + 6 aaC + aaaa, each term gathered directly in pair coordinates ([q, q])
    Cii, Cjj, Cij, Cji = C[np.ix_(i, i)], C[np.ix_(j, j)], C[np.ix_(i, j)], C[np.ix_(j, i)]
    ai, aj = a[i], a[j]
    cp = C[i, j]  # C_ij of each pair
    G[r + 1 :, r + 1 :] = (
        np.outer(cp, cp) + Cii * Cjj + Cij * Cji
        + np.outer(ai * aj, cp) + np.outer(cp, ai * aj)
        + ai[:, None] * ai[None, :] * Cjj + ai[:, None] * aj[None, :] * Cji
        + aj[:, None] * ai[None, :] * Cij + aj[:, None] * aj[None, :] * Cii
        + np.outer(ai * aj, ai * aj)
    )
    return G


def _factorise(mixture: GaussianMixture) -> _Factorised:
    cached = _CACHE.get(mixture)
    if cached is not None:
        return cached
    coords = coordinates_of(mixture)  # whitened support coordinates, shared with the CG solver
    r = coords.r
    if feature_count(r) > MAX_FEATURES:
        raise ValueError(f"the cached dense quadratic solve needs {feature_count(r)} features (support dimension "
                         f"r = {r}), more than MAX_FEATURES = {MAX_FEATURES}; use method='cg'")
    from mlpinterp.utils.memory import require

    require(gram_bytes(mixture.K, r), f"the cached dense quadratic solve's {mixture.K} Gram matrices "
            f"[F, F] (F = {feature_count(r)})", "use method='cg' (matrix-free, memory O(K r^2))")
    iu = np.triu_indices(r)
    grams = np.stack([_component_gram(a, C, iu) for a, C in zip(coords.means, coords.covs, strict=True)])
    G = np.einsum("k,kab->ab", mixture.weights, grams)
    try:  # positive definite in the usual case: Cholesky is ~10x cheaper than an eigendecomposition
        chol = scipy.linalg.cho_factor(G, lower=True)
        diag = np.diag(chol[0]) ** 2
        solve = lambda rhs: scipy.linalg.cho_solve(chol, rhs)
        condition, how = float(diag.max() / diag.min()), "cholesky"
    except np.linalg.LinAlgError:  # a quadric carries every component: minimum-norm solution
        ev, evec = np.linalg.eigh(G)
        keep = ev > 1e-12 * ev[-1]
        ev, evec = ev[keep], evec[:, keep]
        solve = lambda rhs: evec @ ((evec.T @ rhs) / ev[:, None])
        condition, how = float(ev[-1] / ev[0]), "eigh (singular Gram: minimum-norm)"
    f = _Factorised(coords.mean, coords.P.T, coords.R, iu, grams, G, solve, condition, how)
    _CACHE[mixture] = f
    return f


def sandwich(L: np.ndarray, T: np.ndarray, R: np.ndarray) -> np.ndarray:
    """``L @ T[o] @ R`` for every o, as two 2-D GEMMs: ``L [a, b]``, ``T [o, b, c]``, ``R [c, e]`` -> ``[o, a, e]``."""
    o, b, c = T.shape
    TR = (T.reshape(o * b, c) @ R).reshape(o, b, -1)  # [o, b, e]
    return np.tensordot(L, TR, axes=([1], [1])).transpose(1, 0, 2)


def _theta_from_raw(T0, T1, T2, f: _Factorised) -> np.ndarray:
    """Raw-coordinate quadratic (T0 [o], T1 [o, d], T2 [o, d, d]) -> feature coefficients ``[F, o]`` in u."""
    m, Wi = f.mean, f.Winv
    T2m = T2 @ m  # [o, d]
    A = sandwich(Wi.T, T2, Wi)  # [o, r, r]
    b = (T1 + 2 * T2m) @ Wi
    c = T0 + T1 @ m + T2m @ m
    i, j = f.iu
    quad = np.where(i == j, 1.0, 2.0) * A[:, i, j]  # u_i u_j (i < j) appears twice in u^T A u
    return np.concatenate([c[:, None], b, quad], axis=1).T


def _raw_from_theta(theta: np.ndarray, f: _Factorised) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of ``_theta_from_raw`` (minimum-norm extension off the support)."""
    r = f.W.shape[0]
    i, j = f.iu
    o = theta.shape[1]
    c, b, q = theta[0], theta[1 : r + 1].T, theta[r + 1 :].T
    A = np.zeros((o, r, r))
    A[:, i, j] = q * np.where(i == j, 1.0, 0.5)
    A[:, j, i] = A[:, i, j]
    W, m = f.W, f.mean
    T2 = sandwich(W.T, A, W)  # [o, d, d]
    T2m = T2 @ m
    T1 = b @ W - 2 * T2m
    T0 = c - b @ (W @ m) + T2m @ m
    return T0, T1, T2


def fit_mixture_quadratic_cached(network: Network, mixture: GaussianMixture) -> DensePolynomial:
    """Exact degree-2 approximant under ``mixture`` (see module docstring). Raises ``ValueError`` if too large."""
    import time

    t0 = time.perf_counter()
    f = _factorise(mixture)
    rhs = 0.0
    for pi, comp, Gk in zip(mixture.weights, mixture.components, f.grams, strict=True):
        if pi == 0:
            continue
        pk = fit_ridge(network, comp, 2)
        rhs = rhs + pi * (Gk @ _theta_from_raw(pk.coefficients(0), pk.coefficients(1), pk.coefficients(2), f))
    theta = f.solve(rhs)
    rel = float(np.max(np.linalg.norm(f.gram @ theta - rhs, axis=0) / np.maximum(np.linalg.norm(rhs, axis=0), 1e-300)))
    r = f.W.shape[0]
    info = {
        "network": type(network).__name__, "activation": network.activation,
        "distribution": f"GaussianMixture(K={mixture.K})", "method": "exact-mixture-dense-cached", "degree": 2,
        "d_in": network.d_in,
        "solver_info": {"method": f"dense {f.how} (factorisation cached per mixture)", "iterations": 0, "relative_residual": rel,
                        "n_features": feature_count(r), "gram_condition": f.condition, "support_rank": r,
                        "singular": r < mixture.d, "wall_time_s": time.perf_counter() - t0},
    }
    return DensePolynomial(_raw_from_theta(theta, f), info=info)
