"""Exact FVU of an MLP's ridge approximant under one Gaussian, in memory O(d_hidden x chunk).

With u_i = (y_i - m_i) / s_i the network's standardised pre-activations, c_ik the Hermite coefficients of phi about
y_i's law and z_j = A_j . (x - center) the approximant's standard-normal ridge variables, Mehler's formula gives
(Rigg & Belrose 2025, arXiv 2502.01032, §3; O'Donnell, *Analysis of Boolean Functions*, §11.2)

    Cov(phi(y_i), He_k(z_j)) = k! c_ik rho_ij^k,   rho_ij = Corr(y_i, z_j),
    Cov(He_k(z_i), He_l(z_j)) = delta_kl k! R_ij^k, R_ij = Corr(z_i, z_j).

Two routes, both blocked over rows of the ``[d_hidden, d_hidden]`` sums (only ``[chunk, d_hidden]`` blocks and
``[chunk, d_out]`` products are ever held):

* **Own approximant** (``p`` from ``fit_polynomial`` under this Gaussian: its directions are the network's
  standardised pre-activations, its read-out the network's, its coefficients the c_ik): the squared error of each
  output is the Hermite tail beyond degree n of the network's own output covariance,
  :func:`mlpinterp.poly.mehler_tails.tail_sums`, computed once per network and Gaussian for every degree up to
  ``max(n, 2)`` together with Var(f) (each pair's integrals once; symmetric blocks). A ``p`` that differs from
  that approximant by rounding (directions, coefficients, read-out) is covered by a perturbation bound added to
  the error bound: with p~ the approximant above, ``|E(f - p)^2 - E(f - p~)^2| <= 2 ||f - p~|| ||p - p~|| +
  ||p - p~||^2`` and ``||p_o - p~_o|| <= sum_j |P_oj| (eps_j sqrt(sum_k k k! D_jk^2) + sqrt(sum_k k! (D_jk -
  c_jk)^2)) + sum_j |P_oj - W2_oj| sqrt(sum_k k! c_jk^2)`` (eps_j: the distance of p's direction from the
  network's, first order in eps_j <= ``ALIGN_TOL``).
* **Any other ridge approximant** with standard-normal directions: Var(f) as above, and Cov(f, p), Var(p) from
  the Mehler sums of the correlations, one GEMM per block for all Hermite orders together.

GLUs have no exact route here: E[(phi(y_i) g_i)(phi(y_j) g_j)] needs the bivariate moments
E[phi(y_i) phi(y_j) y_i^a y_j^b] (a + b <= 2) of every neuron pair, which :mod:`mlpinterp.gaussian.bivariate`
does not provide; their FVU is the streamed Monte Carlo estimate of :mod:`mlpinterp.poly.metrics`.
"""

from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import numpy as np

from mlpinterp.gaussian.bivariate import MEHLER_ORDER
from mlpinterp.gaussian.distributions import Gaussian
from mlpinterp.networks import MLP
from mlpinterp.poly.approximant import RidgePolynomial
from mlpinterp.poly.mehler_tails import NeuronLaws, bytes_per_pair, tail_sums
from mlpinterp.utils.memory import chunk_rows, require

#: Largest distance between an approximant's ridge direction and the network's own (in the standardised input
#: coordinates u) for which the own-approximant route applies (rounding of the fit, far below 1e-8).
ALIGN_TOL = 1e-12

#: Largest perturbation bound (relative to sum_o Var(f_o)) for which the own-approximant route is used; an
#: approximant further from the network's own (other coefficients or read-out) takes the general route.
OWN_REL_TOL = 1e-12

#: Default upper limit of rows per block (the diagonal block of each row block is evaluated in full, a share
#: ``chunk / d_hidden`` of extra work; the GEMMs are efficient well below it).
MAX_ROWS = 512

#: What to change when a block does not fit.
_FIX = ("pass a smaller chunk_size, or method='monte-carlo' (memory independent of d_hidden^2; on the command "
        "line: mlpinterp approx --fvu-method monte-carlo)")

#: network -> :class:`_Entry` (the network-only quantities under one Gaussian): Var(f), the truncation errors,
#: E[f] and their bound depend on the network and the input law only, so FVUs of several approximants of one
#: network (degrees 1 and 2) reuse them.
_NETWORK_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Layout(NamedTuple):
    """How ``p``'s ridge directions relate to the exact FVU (see :func:`exact_layout`).

    unit : ``[p.d_hidden]`` bool, True = a standard-normal direction, False = a.s. 0.
    eps : ``[d_hidden]`` distance of each direction from the network's own standardised pre-activation, or None
        when ``p`` is not the network's own approximant (different width, or a distance above ``ALIGN_TOL``).
    """

    unit: np.ndarray
    eps: np.ndarray | None


class _Entry:
    """Pre-activation laws of one network under one Gaussian and the cached tail sums.

    ``WL [h, r]`` (Cov(y) = WL WL^T) is kept only until the tail sums are formed; ``m``, ``s`` stay.
    """

    def __init__(self, network: MLP, dist: Gaussian):
        self.dist = dist
        self.WL: np.ndarray | None = network.W1 @ dist.factor
        self.m = network.W1 @ dist.mean + network.b1
        self.s = np.sqrt(np.einsum("hr,hr->h", self.WL, self.WL))
        self.law: NeuronLaws | None = None
        self.tails: tuple[int, np.ndarray, float] | None = None  # (n_max, sums [n_max + 1, o], bound)

    def wl(self, network: MLP) -> np.ndarray:
        if self.WL is None:
            self.WL = network.W1 @ self.dist.factor
        return self.WL


def _entry(network: MLP, dist: Gaussian) -> _Entry:
    hit = _NETWORK_CACHE.get(network)
    if hit is None or hit.dist is not dist:
        hit = _Entry(network, dist)
        _NETWORK_CACHE[network] = hit
    return hit


def _alignment(network: MLP, p: RidgePolynomial, dist: Gaussian, e: _Entry) -> np.ndarray | None:
    """``eps [h]``: ``||A_j L - WL_j / s_j||`` (0 for constant neurons: ``||A_j L||``), or None for another width.

    Full rank: bounded by ``||A_j - W1_j / s_j|| ||L||_F`` without a product (the fit's A is W1 / s itself);
    otherwise computed.
    """
    if p.A.shape != network.W1.shape or p.W2.shape != network.W2.shape:
        return None
    live = e.s > 0
    safe = np.where(live, e.s, 1.0)
    full = dist.rank == dist.d
    L_norm = float(np.sqrt(np.einsum("dr,dr->", dist.factor, dist.factor))) if full else 1.0
    eps = np.empty(network.d_hidden)
    step = max(1, (1 << 22) // max(network.d_in, 1))  # rows per chunk: temporaries of about 32 MB
    for i0 in range(0, network.d_hidden, step):
        sl = slice(i0, i0 + step)
        if full:  # the fit's A is W1 / s itself
            gap = p.A[sl] - np.where(live[sl, None], network.W1[sl] / safe[sl, None], 0.0)
        else:
            gap = p.A[sl] @ dist.factor - np.where(live[sl, None], e.wl(network)[sl] / safe[sl, None], 0.0)
        eps[sl] = np.sqrt(np.einsum("hr,hr->h", gap, gap)) * L_norm
    return eps


def exact_layout(network, p, dist: Gaussian) -> Layout | None:
    """Classify ``p``'s ridge directions for the exact FVU, or ``None`` if the exact route does not apply.

    The exact route needs an MLP, a ``RidgePolynomial`` without gate terms and, for each of p's neurons,
    ``z_j = A_j . (x - center)`` either standard normal under ``dist`` (unit variance, zero mean) or a.s. 0
    (zero variance, zero mean). Returns a :class:`Layout`.
    """
    if not (isinstance(network, MLP) and isinstance(p, RidgePolynomial) and p.G is None):
        return None
    if p.d_in != network.d_in or p.d_out != network.d_out:
        return None
    scale = 1.0 + float(np.abs(dist.mean).max()) + float(np.abs(p.center).max())
    offset = p.A @ (dist.mean - p.center)  # mean of z_j
    if np.any(np.abs(offset) > 1e-12 * scale * (1.0 + np.abs(p.A).sum(1))):
        return None
    e = _entry(network, dist)
    eps = _alignment(network, p, dist, e)
    if eps is not None and float(eps.max(initial=0.0)) <= ALIGN_TOL:
        return Layout(e.s > 0, eps + np.abs(offset))  # a shift mu of z_j acts like a distance |mu| (first order)
    AL = p.A @ dist.factor
    norms = np.einsum("hr,hr->h", AL, AL)
    unit = np.abs(norms - 1) < 1e-8
    zero = np.abs(norms) < 1e-12
    if not np.all(unit | zero):
        return None
    return Layout(unit, None)


def check_variance(var_f: np.ndarray, scale: float, where: str) -> None:
    """``ValueError`` when the network output has (numerically) zero variance: the FVU is undefined."""
    total = float(np.sum(var_f))
    if not total > 1e-24 * scale:
        raise ValueError(
            f"network output has zero variance{where} (sum_o Var(f_o) = {total:.3g}); the FVU is undefined"
        )


def _rows(per_row: float, chunk_size: int | None, n_rows: int, what: str) -> int:
    """Rows per block: ``chunk_size`` if given, else as many as the working budget allows, at most ``MAX_ROWS``
    (memory checked before anything is allocated)."""
    fix = _FIX
    if chunk_size is not None:
        return chunk_rows(per_row, what, fix, budget=int(chunk_size * per_row), maximum=chunk_size)
    return chunk_rows(per_row, what, fix, minimum=1, maximum=min(MAX_ROWS, max(n_rows, 1)))


def _tails(network: MLP, e: _Entry, n_max: int, chunk_size: int | None) -> tuple[np.ndarray, float]:
    """The network's tail sums up to degree ``n_max`` (cached; recomputed for a higher degree)."""
    if e.tails is not None and e.tails[0] >= n_max:
        return e.tails[1], e.tails[2]
    h, o = network.d_hidden, network.d_out
    per_row = bytes_per_pair(n_max) * h + 16 * (n_max + 1) * o
    what = "the exact FVU's [chunk, d_hidden] bivariate blocks"
    rows = _rows(per_row, chunk_size, h, what)
    # held beside the blocks: the read-out transposed, the per-neuron Hermite tables, WL if it must be formed again
    fixed = 8 * h * (o + 4 * (MEHLER_ORDER + 1) + (e.dist.rank if e.WL is None else 0))
    require(fixed + rows * per_row, what + " and the per-neuron tables",
            "pass a smaller chunk_size, or method='monte-carlo' (memory independent of d_hidden^2)")
    if e.law is None:
        e.law = NeuronLaws(network.act, e.m, e.s)
    sums, bound = tail_sums(e.law, e.wl(network), network.W2, n_max, rows)
    e.tails, e.WL = (n_max, sums, bound), None
    return sums, bound


def _own_mse(network: MLP, p: RidgePolynomial, e: _Entry, eps: np.ndarray, sums: np.ndarray):
    """``(mse [o], extra_bound)`` of the network's own approximant (module docstring, first route)."""
    n, a = p.degree, e.law.a
    kf = np.array([math.factorial(k) for k in range(n + 1)], dtype=float)
    c = a[:, : n + 1] / np.sqrt(kf)
    D, P = p.D, p.W2
    step = eps * np.sqrt((np.arange(n + 1) * kf * D * D).sum(1)) + np.sqrt((kf * (D - c) ** 2).sum(1))
    # a constant neuron (z_j = 0): |He_k(0)| <= sqrt(k!), so sum_k |x_k He_k(0)| <= sqrt(n + 1) sqrt(sum_k k! x_k^2)
    step *= np.where(e.s > 0, 1.0, math.sqrt(n + 1))
    gap_p = np.abs(P) @ step
    if not np.array_equal(P, network.W2):
        gap_p += np.abs(P - network.W2) @ np.sqrt((kf * c * c).sum(1))
    mse = sums[n] + (network.b2 - p.b2) ** 2
    return mse, float((2 * np.sqrt(mse) * gap_p + gap_p**2).sum())


def _general_mse(network: MLP, p: RidgePolynomial, dist: Gaussian, e: _Entry, unit: np.ndarray, var_f, mean_f,
                 chunk_size):
    """``mse [o]`` of any ridge approximant with standard-normal (or a.s. 0) directions (second route)."""
    from mlpinterp.gaussian.hermite import hermite_he
    from mlpinterp.gaussian.univariate import hermite_coefficients

    n, h, hp, o = p.degree, network.d_hidden, p.d_hidden, network.d_out
    rows = _rows(8 * (3 * max(h, hp) + 2 * o), chunk_size, max(h, hp),
                 "the exact FVU's [chunk, d_hidden] correlation blocks")
    WL, s = e.wl(network), e.s
    c = hermite_coefficients(network.act, e.m, s, n)
    inv = np.where(s > 0, 1.0 / np.where(s > 0, s, 1.0), 0.0)
    AL = np.where(unit[:, None], p.A @ dist.factor, 0.0)  # [hp, r]: z_j = AL_j . u
    kf = np.array([math.factorial(k) for k in range(n + 1)], dtype=float)
    W2T, PT = np.ascontiguousarray(network.W2.T), np.ascontiguousarray(p.W2.T)
    cov_fp, var_p = np.zeros(o), np.zeros(o)

    def series(x, left, right):  # sum_{k=1}^n k! left_ik right_jk x_ij^k (Horner in x)
        acc = np.multiply.outer(left[:, n] * kf[n], right[:, n])
        for k in range(n - 1, 0, -1):
            acc *= x
            acc += np.multiply.outer(left[:, k] * kf[k], right[:, k])
        return acc * x

    for i0 in range(0, h, rows):  # Cov(f, p): rows i of the network's neurons, all of p's
        blk = slice(i0, min(i0 + rows, h))
        if n >= 1:
            rho = np.clip((WL[blk] @ AL.T) * inv[blk, None], -1.0, 1.0)
            cov_fp += (W2T[blk] * (series(rho, c[blk], p.D) @ PT)).sum(0)
    for j0 in range(0, hp, rows):  # Var(p): rows j of p's neurons, columns l >= j (pairs off the block twice)
        blk = slice(j0, min(j0 + rows, hp))
        if n >= 1:
            Y = series(np.clip(AL[blk] @ AL[j0:].T, -1.0, 1.0), p.D[blk], p.D[j0:])
            Y[:, blk.stop - j0:] *= 2.0
            var_p += (PT[blk] * (Y @ PT[j0:])).sum(0)
    const_h = (hermite_he(n, np.zeros(hp)) * p.D).sum(1)  # sum_k D_jk He_k(0)
    mean_h = np.where(unit, p.D[:, 0], const_h)
    mean_gap = mean_f - (p.W2 @ mean_h + p.b2)
    return var_f + var_p - 2 * cov_fp + mean_gap**2


def fvu_exact_mlp(network: MLP, p: RidgePolynomial, dist: Gaussian, layout: Layout, *,
                  chunk_size: int | None = None):
    """Exact FVU of a ``RidgePolynomial`` (directions classified by :func:`exact_layout`) under one Gaussian.

    ``chunk_size``: rows per block of the ``[d_hidden, d_hidden]`` sums (default: from the memory budget,
    :mod:`mlpinterp.utils.memory`, at most ``MAX_ROWS``). Returns ``(pooled, per_output [o], error_bound)``.
    Raises :class:`~mlpinterp.utils.memory.InsufficientMemoryError` before allocating when one block does not fit
    and ``ValueError`` for a network output of zero variance.
    """
    e = _entry(network, dist)
    n = p.degree
    sums, bound = _tails(network, e, max(n, 2), chunk_size)
    var_f = sums[0]
    absW2 = np.abs(network.W2)
    # scale of the zero-variance test: sum_o (sum_i |W2_oi| sqrt(E phi_i^2))^2 >= sum_o sum_ij |W2_oi W2_oj e2_ij|
    scale_sum = float(((absW2 @ np.sqrt(np.maximum(e.law.second, 0.0))) ** 2).sum())
    mean_f = network.W2 @ e.law.a[:, 0] + network.b2
    check_variance(var_f, float(np.sum(mean_f**2)) + scale_sum, " under this distribution")
    mse, extra = _own_mse(network, p, e, layout.eps, sums) if layout.eps is not None else (None, math.inf)
    if not extra <= OWN_REL_TOL * float(var_f.sum()):  # not the network's own approximant up to rounding
        mse, extra = _general_mse(network, p, dist, e, layout.unit, var_f, mean_f, chunk_size), 0.0
    mse = np.maximum(mse, 0.0)
    per = mse / np.where(var_f > 0, var_f, np.nan)
    pooled = float(mse.sum() / var_f.sum())
    err_bound = float((bound * (1 + pooled) + extra) / var_f.sum())
    return pooled, per, err_bound
