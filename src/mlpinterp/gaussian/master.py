"""Gaussian product moments: non-central Isserlis and the master theorem.

Master theorem (Rigg & Belrose 2025, arXiv 2502.01032, Thm 3.1), in the covariance form used here:
for jointly Gaussian scalars X, Y_1..Y_n write ``Y_i = alpha_i + beta_i (X - E X) + eps_i`` with
``alpha_i = E[Y_i]``, ``beta_i = Cov(Y_i, X) / Var X`` and ``eps`` zero-mean Gaussian independent of X.
Then

    E[g(X) prod_i Y_i] = sum_{S subset [n]} E[g(X) prod_{i in S} (alpha_i + beta_i (X - E X))]
                                         * E[prod_{i not in S} eps_i],

where the last factor is Isserlis' sum over perfect matchings of ``Cov(eps)``. For n = 2 the
coefficient of E[g(X)] is ``alpha_1 alpha_2 + Cov(eps_1, eps_2)`` (the paper's printed n = 2 case
omits the covariance term). Working with centred X is the covariance form of Stein's lemma, so a
non-zero mean needs no extra ``E[x] E[phi(y)]`` correction.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from mlpinterp.gaussian.hermite import monomial_to_hermite
from mlpinterp.gaussian.univariate import hermite_coefficients


@lru_cache(maxsize=64)
def perfect_matchings(n: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """All perfect matchings of ``range(n)`` as tuples of index pairs (empty for odd n; one empty matching for n=0)."""
    if n % 2:
        return ()

    def rec(items: tuple[int, ...]):
        if not items:
            yield ()
            return
        a = items[0]
        for i in range(1, len(items)):
            rest = items[1:i] + items[i + 1 :]
            for m in rec(rest):
                yield ((a, items[i]),) + m

    return tuple(rec(tuple(range(n))))


def central_moment(cov: np.ndarray, idx: Sequence[int]) -> np.ndarray:
    """Isserlis: E[prod_{t} xi_{idx[t]}] for xi ~ N(0, cov); ``cov [..., d, d]`` (batched), returns ``[...]``."""
    idx = tuple(idx)
    out = np.zeros(cov.shape[:-2])
    for m in perfect_matchings(len(idx)):
        term = np.ones(cov.shape[:-2])
        for a, b in m:
            term = term * cov[..., idx[a], idx[b]]
        out = out + term
    return out


def noncentral_moment(mean: np.ndarray, cov: np.ndarray, idx: Sequence[int]) -> np.ndarray:
    """E[prod_t x_{idx[t]}] for x ~ N(mean, cov) (non-central Isserlis), batched over leading axes.

    ``mean [..., d]``, ``cov [..., d, d]``; ``idx`` a multiset of coordinates (repeats allowed).
    Expands ``x = mean + xi`` over subsets: sum_T prod_{t not in T} mean_t * E[prod_{t in T} xi_t].
    """
    idx = tuple(idx)
    n = len(idx)
    out = np.zeros(np.broadcast_shapes(mean.shape[:-1], cov.shape[:-2]))
    for r in range(0, n + 1, 1):
        for T in itertools.combinations(range(n), r):
            if r % 2:
                continue
            rest = [idx[t] for t in range(n) if t not in T]
            mu_part = np.ones(mean.shape[:-1])
            for i in rest:
                mu_part = mu_part * mean[..., i]
            out = out + mu_part * central_moment(cov, [idx[t] for t in T])
    return out


def centered_power_ev(act, mu, sigma, kmax: int) -> np.ndarray:
    """E[phi(mu + sigma Z) Z^k] for k = 0..kmax, ``[..., kmax+1]``, from the Hermite coefficients.

    Uses ``Z^k = sum_l M[k, l] He_l(Z)`` and ``E[phi He_l(Z)] = l! c_l``.
    """
    c = hermite_coefficients(act, mu, sigma, kmax)
    fact = np.array([float(np.prod(np.arange(1, l + 1))) for l in range(kmax + 1)])
    M = monomial_to_hermite(kmax)
    return np.einsum("...l,kl->...k", c * fact, M)


def master_theorem_ev(act, mean_x, var_x, alpha, beta, eps_cov) -> np.ndarray:
    """E[phi(X) prod_{i=1..n} Y_i] for jointly Gaussian (X, Y), batched (Rigg & Belrose Thm 3.1).

    Parameters
    ----------
    act : activation (name, ``Activation`` or callable)
    mean_x, var_x : ``[...]`` mean and variance of X (var_x >= 0)
    alpha : ``[..., n]`` means E[Y_i]
    beta : ``[..., n]`` regression slopes Cov(Y_i, X) / Var X (use 0 where Var X = 0)
    eps_cov : ``[..., n, n]`` covariance of the residuals eps_i = Y_i - alpha_i - beta_i (X - E X)

    Returns ``[...]``. Cost O(2^n * matchings) per entry; intended for n <= 6.
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    eps_cov = np.asarray(eps_cov, dtype=np.float64)
    n = alpha.shape[-1]
    sigma = np.sqrt(np.maximum(np.asarray(var_x, dtype=np.float64), 0.0))
    # E[phi(X) (X - m)^k] = sigma^k E[phi(m + sigma Z) Z^k]
    ez = centered_power_ev(act, mean_x, sigma, n)
    ev_pow = ez * sigma[..., None] ** np.arange(n + 1)
    total = np.zeros(np.broadcast_shapes(np.shape(mean_x), alpha.shape[:-1]))
    for r in range(n + 1):
        for S in itertools.combinations(range(n), r):
            rest = [i for i in range(n) if i not in S]
            if len(rest) % 2:
                continue
            eps_part = central_moment(eps_cov, rest)
            # polynomial prod_{i in S} (alpha_i + beta_i t) in t = X - m: coefficients by convolution
            poly = np.zeros(alpha.shape[:-1] + (r + 1,))
            poly[..., 0] = 1.0
            for i in S:
                new = poly * alpha[..., i : i + 1]
                new[..., 1:] += poly[..., :-1] * beta[..., i : i + 1]
                poly = new
            total = total + eps_part * np.einsum("...k,...k->...", poly, ev_pow[..., : r + 1])
    return total
