"""Exact polynomial approximants of degree >= 2 under a Gaussian mixture (Rigg & Belrose 2025, §3.4, §4).

The paper calls the mixture quadratic intractable at MNIST scale (feature dimension d(d+1)/2 = 307,720
at d = 784) and fits it by SGD. We solve its normal equations exactly, matrix-free.

Coordinates. Let ``mu``, ``C = U diag(lam) U^T`` be the mixture mean and covariance (law of total
covariance) and ``r = rank C``. Every component lives in ``mu + range(C)``, so we work in the whitened
support coordinates ``u = diag(lam)^{-1/2} U^T (x - mu)`` (``u ∈ R^r``, mean 0, covariance I under the
mixture; component k: ``u ~ N(m_k, S_k)``). The approximant is optimal on the support and extended off it
by orthogonal projection onto the support (the minimum-norm solution), as for one singular Gaussian.
MNIST class covariances are singular (constant pixels): r = 712 for the 10-class mixture of the train set.

Quadratic, matrix-free (``method="cg"``). A quadratic ``p(u) = c + b.u + u^T A u`` (A symmetric) is the
parameter ``theta = (c, b, A)`` with the inner product ``<theta, theta'> = c c' + b.b' + tr(A A')``, in
which the least-squares normal equations read ``M theta = E_mix[f (1, u, u u^T)]`` with the self-adjoint
PSD operator ``M theta = sum_k pi_k E_k[p_theta(u) (1, u, u u^T)]``. Under ``N(m, S)``, with ``u = m + v``,
``p = c' + b'.v + v^T A v`` (``c' = c + b.m + m^T A m``, ``b' = b + 2 A m``) and Isserlis' theorem:

    E[p] = c' + tr(AS),   E[p v] = S b',   E[p v v^T] = (c' + tr(AS)) S + 2 S A S,

from which ``E[p u] = m E[p] + E[p v]`` and ``E[p u u^T] = m m^T E[p] + m E[p v]^T + E[p v] m^T + E[p v v^T]``:
O(r^3) per component and output (two matrix products), batched over outputs, never the r^2 x r^2 Gram.
The right-hand side needs only Gaussian moments too: the single-Gaussian projection
``p_k = fit_ridge(network, component_k, 2)`` has the same moments of degree <= 2 as f under component k,
so ``E_k[f z] = E_k[p_k z]`` and ``E_mix[f z] = sum_k pi_k M_k theta_k``.

We solve with preconditioned conjugate gradients (one independent CG per output, batched). Because u has
identity second moment under the mixture, the linear block of M is exactly the identity and the constant
couples to A only through ``E[p] = c + tr A``. The default preconditioner (``"diagonal"``) inverts M exactly
on the block (c, diag A), whose Gram matrix is that of the features ``(1, u_1^2, ..., u_r^2)`` with
``E_mix[u_i^2 u_j^2] = sum_k pi_k [(S_ii + m_i^2)(S_jj + m_j^2) + 2 S_ij^2 + 4 m_i m_j S_ij]`` (Isserlis), takes
b as is, and divides each off-diagonal ``A_ij`` by its diagonal entry ``2 E_mix[u_i^2 u_j^2]`` (Jacobi).
``"pooled"`` is the exact inverse of the pooled Gaussian N(0, I)'s operator (Hermite-diagonal:
``A = (Gamma - gamma I) / 2``, ``c = gamma - tr A``, ``b = beta``). Both ignore third moments (b-A coupling)
and cannot see quadratics that nearly vanish on most classes (MNIST's rarely-lit pixels), so at MNIST scale
the residual falls slowly; but CG minimises the energy-norm error, which *is* the excess mean squared
error of the iterate, and we stop on an estimate of it (see ``_pcg``) rather than on the residual. CG
starts from the exact quadratic under the pooled Gaussian (``init="pooled"``).

Cost at MNIST scale (r = 712, K = 10, d_out = 10): one operator application is 2 K d_out GEMMs of size r^3
(1.4e11 flop, 2-3.5 s on one core in float64). On the 784-256-10 ReLU MLP of ``benchmarks/bench_mixture_mnist.py``
59 iterations reach an estimated excess FVU of 9e-7 (relative residual 8e-5) in 220 s of CPU on one core
(float32: 69 iterations, 101 s, same FVU to 4 digits); peak memory about 1.6 GB including the data set.

Dense (``method="dense"``, any degree, small feature dimension): monomial features of u, Gram matrix
``sum_k pi_k E_k[u^(alpha + beta)]`` from a table of Gaussian moments built by the Stein recursion
``E[u_i u^a] = m_i E[u^a] + sum_j S_ij a_j E[u^(a - e_j)]`` (independent of the closed forms above), and the
right-hand side from the degree-n projections ``p_k`` in the same way; minimum-norm solve.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlpinterp.gaussian.distributions import GaussianMixture
from mlpinterp.networks import Network, validate_network
from mlpinterp.poly.approximant import DensePolynomial, RidgePolynomial
from mlpinterp.poly.ols import centered_to_raw
from mlpinterp.poly.ridge import fit_ridge

#: Largest number of monomial features the dense path accepts (its Gram matrix is features^2 floats).
MAX_DENSE_FEATURES = 5000
#: Largest number of Gaussian moments the dense path tabulates (degree <= 2n monomials of r variables).
MAX_MOMENTS = 2_000_000

_METHODS = ("auto", "exact", "cg", "dense")
_PRECONDITIONERS = ("diagonal", "pooled", "none")


# ----------------------------------------------------------------------------------------------------------
# coordinates
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SupportCoordinates:
    """Whitened coordinates of a mixture's support: ``u = (x - mean) @ P``, ``x = mean + u @ R.T`` on the support.

    mean : ``[d]`` mixture mean; P : ``[d, r]`` = U diag(lam)^-1/2; R : ``[d, r]`` = U diag(lam)^1/2;
    means : ``[K, r]`` component means m_k in u; covs : ``[K, r, r]`` component covariances S_k in u.
    """

    mean: np.ndarray
    P: np.ndarray
    R: np.ndarray
    means: np.ndarray
    covs: np.ndarray

    @property
    def r(self) -> int:
        """Dimension of the support."""
        return self.P.shape[1]

    @classmethod
    def of(cls, mixture: GaussianMixture) -> SupportCoordinates:
        pooled = mixture.pooled()  # eigendecomposition with the library's PSD_RTOL rank rule
        U = pooled.support
        lam = np.einsum("dr,dr->r", pooled.factor, pooled.factor)
        P = U / np.sqrt(lam)
        R = U * np.sqrt(lam)
        means = (mixture.means - pooled.mean) @ P
        covs = np.einsum("da,kde,eb->kab", P, mixture.covs, P, optimize=True)
        covs = 0.5 * (covs + np.swapaxes(covs, 1, 2))
        return cls(pooled.mean, P, R, means, covs)


def _quadratic_in_u(p: RidgePolynomial, coords: SupportCoordinates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coefficients ``(c [o], b [o, r], A [o, r, r])`` of a degree-2 ``RidgePolynomial`` in u coordinates.

    With x = mean + R u: c = T0 + T1 mean + mean^T T2 mean, b = (T1 + 2 T2 mean) R, A = R^T T2 R. The
    quadratic part is formed from the factored ridge form (O(o h r^2), never the d x d tensor).
    """
    mu, R = coords.mean, coords.R
    T0, T1 = p.coefficients(0), p.coefficients(1)
    gamma, delta = p._monomial_weights(2)
    AR = p.A @ R  # [h, r]
    Ad_mu = p.A @ mu  # [h]
    wg = p.W2 * gamma  # [o, h]
    A = np.matmul(AR.T[None] * wg[:, None, :], AR)  # [o, r, r]
    T2mu = (wg * Ad_mu) @ p.A  # [o, d] = T2 @ mu
    if delta is not None:
        GR = p.G @ R
        wd = p.W2 * delta
        S = np.matmul(GR.T[None] * wd[:, None, :], AR)
        A = A + 0.5 * (S + np.swapaxes(S, 1, 2))
        T2mu = T2mu + 0.5 * ((wd * (p.G @ mu)) @ p.A + (wd * Ad_mu) @ p.G)
    c = T0 + T1 @ mu + T2mu @ mu
    b = (T1 + 2 * T2mu) @ R
    return c, b, A


# ----------------------------------------------------------------------------------------------------------
# matrix-free operator (torch)
# ----------------------------------------------------------------------------------------------------------


def _component_apply(c, b, A, m, S, trAS=None):
    """E[p (1, u, u u^T)] for u ~ N(m, S) and p = (c [o], b [o, r], A [o, r, r]) -> tensors of the same shapes."""
    import torch

    Am = torch.matmul(A, m)  # [o, r]
    cp = c + b @ m + Am @ m  # [o]
    bp = b + 2 * Am
    if trAS is None:
        trAS = torch.einsum("oij,ij->o", A, S)
    e0 = cp + trAS  # E[p]
    ev = bp @ S  # E[p v], S symmetric
    SAS = torch.matmul(torch.matmul(S, A), S)
    evv = e0[:, None, None] * S + 2 * SAS
    g0 = e0
    g1 = m * e0[:, None] + ev
    mev = m[None, :, None] * ev[:, None, :]  # m ev^T
    g2 = e0[:, None, None] * torch.outer(m, m) + mev + mev.transpose(1, 2) + evv
    return g0, g1, g2


class _MixtureOperator:
    """theta -> sum_k pi_k E_k[p_theta z] on (c [o], b [o, r], A [o, r, r]) tensors, with its preconditioner."""

    def __init__(self, coords: SupportCoordinates, weights: np.ndarray, preconditioner: str, device, dtype):
        import torch

        self.torch = torch
        self.pi = [float(w) for w in weights]
        self.m = torch.as_tensor(coords.means, device=device, dtype=dtype)
        self.S = torch.as_tensor(coords.covs, device=device, dtype=dtype)
        self.pi_t = torch.tensor(np.array(weights), device=device, dtype=dtype)
        self.Q = self.S + self.m[:, :, None] * self.m[:, None, :]  # E_k[u u^T]  [K, r, r]
        self.r = coords.r
        self.kind = preconditioner
        if preconditioner == "diagonal":
            m, S = coords.means, coords.covs
            dg = np.einsum("kii->ki", S) + m**2  # E_k[u_i^2]
            F = np.einsum("k,ki,kj->ij", weights, dg, dg) + np.einsum(
                "k,kij->ij", weights, 2 * S**2 + 4 * m[:, :, None] * m[:, None, :] * S
            )  # E_mix[u_i^2 u_j^2]
            r = coords.r
            B = np.empty((r + 1, r + 1))
            B[0, 0], B[0, 1:], B[1:, 0], B[1:, 1:] = 1.0, 1.0, 1.0, F  # Gram of (1, u_1^2, ..., u_r^2)
            self.F = torch.as_tensor(F, device=device, dtype=dtype)
            self.Binv = torch.as_tensor(np.linalg.inv(B), device=device, dtype=dtype)
        self.n_apply = 0

    def apply(self, theta, components=None):
        """sum_k pi_k M_k theta (``components``: per-component thetas, for the right-hand side, instead)."""
        torch = self.torch
        self.n_apply += 1
        if components is None:
            return self._apply_fused(*theta)
        out = None
        for k, pk in enumerate(self.pi):
            if pk == 0.0:
                continue
            g = _component_apply(*components[k], self.m[k], self.S[k])
            out = [pk * t for t in g] if out is None else [o + pk * t for o, t in zip(out, g, strict=True)]
        return tuple(out) if out is not None else tuple(torch.zeros_like(t) for t in components[0])

    def _apply_fused(self, c, b, A):
        """Same as summing ``_component_apply`` over components, with every O(o r^2) pass batched over k.

        Memory traffic, not arithmetic, dominated the naive sum (about 15 passes over ``[o, r, r]`` per
        component); here each component costs its two GEMMs ``S_k (A S_k)``, accumulated in place.
        """
        torch = self.torch
        o, r = b.shape
        pi, m, S = self.pi_t, self.m, self.S
        AM = torch.matmul(A, m.T)  # [o, r, K]  A m_k
        mAm = torch.einsum("ork,kr->ok", AM, m)
        trAS = A.reshape(o, r * r) @ S.reshape(-1, r * r).T  # [o, K]
        e0 = c[:, None] + b @ m.T + mAm + trAS  # [o, K]  E_k[p]
        bp = b[:, None, :] + 2 * AM.transpose(1, 2)  # [o, K, r]
        ev = torch.einsum("okr,krs->oks", bp, S)  # [o, K, r]  E_k[p v]
        pe0 = e0 * pi  # [o, K]
        g0 = pe0.sum(1)
        g1 = pe0 @ m + torch.einsum("k,oks->os", pi, ev)
        g2 = (pe0 @ self.Q.reshape(-1, r * r)).reshape(o, r, r)  # sum_k pi_k E_k[p] (S_k + m_k m_k^T)
        W = torch.einsum("kr,oks->ors", m * pi[:, None], ev)  # sum_k pi_k m_k E_k[p v]^T
        g2 += W
        g2 += W.transpose(1, 2)
        A2 = A.reshape(o * r, r)
        for k, pk in enumerate(self.pi):
            if pk == 0.0:
                continue
            Y = (A2 @ S[k]).reshape(o, r, r)  # A S_k
            g2.baddbmm_(S[k].expand(o, r, r), Y, alpha=2.0 * pk)  # += 2 pi_k S_k A S_k
        return g0, g1, g2

    def precondition(self, g):
        """Apply the preconditioner (an SPD approximation of M^-1; see module docstring)."""
        torch = self.torch
        g0, g1, g2 = g
        r = self.r
        if self.kind == "none":
            return g0.clone(), g1.clone(), g2.clone()
        if self.kind == "pooled":
            eye = torch.eye(r, dtype=g2.dtype, device=g2.device)
            A = 0.5 * (g2 - g0[:, None, None] * eye)
            return g0 - torch.diagonal(A, dim1=1, dim2=2).sum(1), g1.clone(), A
        # "diagonal": exact on (c, diag A), Jacobi on the off-diagonal entries of A, exact on b
        A = g2 / (2 * self.F)
        sol = torch.cat([g0[:, None], torch.diagonal(g2, dim1=1, dim2=2)], 1) @ self.Binv  # Binv symmetric
        A.diagonal(dim1=1, dim2=2).copy_(sol[:, 1:])
        return sol[:, 0], g1.clone(), A


def _dot(x, y):
    """Per-output inner products ``<x_o, y_o>`` -> ``[o]``."""
    return (x[0] * y[0]) + (x[1] * y[1]).sum(1) + (x[2] * y[2]).sum((1, 2))


def _axpy(a, x, y):
    """y + a[o] * x, per output."""
    return (y[0] + a * x[0], y[1] + a[:, None] * x[1], y[2] + a[:, None, None] * x[2])


def _pcg(op: _MixtureOperator, rhs, *, tol: float, fvu_tol: float, window: int, maxiter: int, progress: bool,
         x0=None):
    """Batched preconditioned CG, one system per output; returns ``(theta, info)``.

    Stops when every output's relative residual is <= ``tol`` or when the estimated excess FVU is <= ``fvu_tol``.
    CG minimises the energy-norm error, i.e. the excess mean squared error ``E_mix[(p_k - p*)^2]`` of the
    iterate; in exact arithmetic ``||e_k||^2 = sum_{j >= k} alpha_j (r_j . z_j)`` and the sum over the next
    ``window`` steps is the Hestenes-Stiefel lower-bound estimate (Strakos & Tichy 2002). We divide it by the
    variance explained so far, ``E[f^2] - E[(f - p_k)^2] - E[f]^2 = 2 theta_k . rhs - theta_k . M theta_k - E[f]^2
    = theta_k . (rhs + r_k) - E[f]^2`` (pooled over outputs; it increases monotonically to Var(p*)), a proxy
    for Var(f). ``x0``: optional starting point (default 0).
    """
    torch = op.torch
    rnorm0 = torch.sqrt(_dot(rhs, rhs))
    safe0 = torch.where(rnorm0 > 0, rnorm0, torch.ones_like(rnorm0))
    mean_sq = float((rhs[0] ** 2).sum())  # sum_o E_mix[f_o]^2 (the constant feature has E[1 * f] = E[f])
    if x0 is None:
        x = tuple(torch.zeros_like(t) for t in rhs)
        res = rhs
    else:
        x = x0
        res = tuple(r_ - m_ for r_, m_ in zip(rhs, op.apply(x0), strict=True))
    z = op.precondition(res)
    p = z
    rz = _dot(res, z)
    residuals, gains, explained = [], [], []
    it = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=maxiter, desc="mixture CG", leave=False)
    rel = torch.sqrt(_dot(res, res)) / safe0
    stop = "maxiter"
    while it < maxiter:
        if float(rel.max()) <= tol:
            stop = "residual"
            break
        Ap = op.apply(p)
        pAp = _dot(p, Ap)
        ok = pAp > 0
        alpha = torch.where(ok, rz / torch.where(ok, pAp, torch.ones_like(pAp)), torch.zeros_like(pAp))
        x = _axpy(alpha, p, x)
        res = _axpy(-alpha, Ap, res)
        gain = float((alpha * rz).sum())
        z = op.precondition(res)
        rz_new = _dot(res, z)
        ok = rz > 0
        beta = torch.where(ok, rz_new / torch.where(ok, rz, torch.ones_like(rz)), torch.zeros_like(rz))
        p = tuple(zt + beta.reshape(-1, *([1] * (pt.ndim - 1))) * pt for zt, pt in zip(z, p, strict=True))
        rz = rz_new
        it += 1
        rel = torch.sqrt(_dot(res, res)) / safe0
        residuals.append(float(rel.max()))
        gains.append(gain)
        explained.append(float((_dot(x, rhs) + _dot(x, res)).sum()) - mean_sq)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(rel_residual=f"{residuals[-1]:.2e}")
        if it >= window and explained[-1] > 0 and sum(gains[-window:]) / explained[-1] <= fvu_tol:
            stop = "fvu"
            break
    if bar is not None:
        bar.close()
    # explicit final residual (guards against drift of the recursive residual)
    Mx = op.apply(x)
    true_res = tuple(r_ - m_ for r_, m_ in zip(rhs, Mx, strict=True))
    true_rel = torch.sqrt(_dot(true_res, true_res)) / safe0
    var_expl = explained[-1] if explained else 0.0
    info = {
        "iterations": it,
        "relative_residual": float(true_rel.max()),
        "per_output_relative_residual": [float(v) for v in true_rel],
        "stopped_by": stop,
        "converged": stop != "maxiter",
        "excess_fvu_estimate": (sum(gains[-window:]) / var_expl) if var_expl > 0 and gains else None,
        "residual_history": residuals,
        "explained_variance_history": explained,
    }
    return x, info


# ----------------------------------------------------------------------------------------------------------
# dense path: moment table + monomial Gram
# ----------------------------------------------------------------------------------------------------------


def _monomial_index(r: int, n: int) -> np.ndarray:
    """All sorted multisets of ``range(r)`` of size <= n as rows ``[M, n]`` padded with ``r`` (degree-major)."""
    import itertools

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


def _tensors_in_u(p, coords: SupportCoordinates, degree: int) -> list[np.ndarray]:
    """Raw-coordinate tensors of ``p`` rewritten in u: expand about the mixture mean, contract each axis with R."""
    raw = [np.asarray(p.coefficients(j)) for j in range(degree + 1)]
    centred = centered_to_raw(raw, -coords.mean)  # p(mean + t) = sum_j S_j[t, ..., t]
    out = []
    for j, Sj in enumerate(centred):
        T = Sj
        for _ in range(j):
            T = np.tensordot(T, coords.R, axes=([1], [0]))  # contract the first input axis, append r axis
        out.append(T)
    return out


def _dense_feature_count(r: int, degree: int) -> int:
    return math.comb(r + degree, degree)


def _largest_dim(degree: int) -> int:
    d = 1
    while _dense_feature_count(d + 1, degree) <= MAX_DENSE_FEATURES:
        d += 1
    return d


def _solve_dense(network: Network, mixture: GaussianMixture, coords: SupportCoordinates, degree: int):
    """Dense normal equations in the monomials of u; returns tensors in u and solver diagnostics."""
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
    pi = mixture.weights
    mix_moments = pi @ vals  # [M]
    # Gram[a, b] = E_mix[u^(alpha_a + alpha_b)]
    pair = np.concatenate([np.repeat(feats, F, axis=0), np.tile(feats, (F, 1))], axis=1)
    pair.sort(axis=1)
    pos = _lookup(keys, order, pair, r).reshape(F, F)
    gram = mix_moments[pos]
    # RHS[a, o] = sum_k pi_k sum_beta coef_k[o, beta] E_k[u^(alpha_a + beta)]
    mult = _multiplicity(feats, r)
    deg = (feats < r).sum(1)
    rhs = np.zeros((F, network.d_out))
    for k, comp in enumerate(mixture.components):
        if pi[k] == 0:
            continue
        pk = fit_ridge(network, comp, degree)
        Tu = _tensors_in_u(pk, coords, degree)
        coef = np.zeros((network.d_out, F))
        for b_ in range(F):
            idx = tuple(int(v) for v in feats[b_, : deg[b_]])
            coef[:, b_] = Tu[deg[b_]][(slice(None),) + idx] * mult[b_]
        rhs += pi[k] * (vals[k][pos] @ coef.T)
    w, V = np.linalg.eigh(gram)
    keep = w > 1e-12 * w[-1]
    theta = (V[:, keep] / w[keep]) @ (V[:, keep].T @ rhs)  # minimum-norm solution  [F, o]
    resid = gram @ theta - rhs
    rel = np.linalg.norm(resid, axis=0) / np.maximum(np.linalg.norm(rhs, axis=0), 1e-300)
    tensors = [np.zeros((network.d_out,) + (r,) * j) for j in range(degree + 1)]
    import itertools

    for a in range(F):
        j = int(deg[a])
        idx = tuple(int(v) for v in feats[a, :j])
        val = theta[a] / mult[a]
        for perm in set(itertools.permutations(idx)):
            tensors[j][(slice(None),) + perm] = val
    info = {"method": "dense", "n_features": F, "gram_condition": float(w[-1] / w[keep][0]),
            "gram_rank": int(keep.sum()), "relative_residual": float(rel.max()), "iterations": 0}
    return tensors, info


# ----------------------------------------------------------------------------------------------------------
# public entry point
# ----------------------------------------------------------------------------------------------------------


def _torch_dtype(dtype):
    import torch

    if dtype in (None, "float64", torch.float64, np.float64):
        return torch.float64
    if dtype in ("float32", torch.float32, np.float32):
        return torch.float32
    raise ValueError(f"dtype must be torch.float64 or torch.float32 (or 'float64'/'float32'), got {dtype!r}")


def _u_to_raw(tensors_u: list[np.ndarray], coords: SupportCoordinates) -> tuple[np.ndarray, ...]:
    """Tensors of p(u) -> raw-coordinate tensors of x -> p(P^T (x - mean)) (projection onto the support)."""
    centred = []
    for j, T in enumerate(tensors_u):
        for _ in range(j):
            T = np.tensordot(T, coords.P.T, axes=([1], [0]))
        centred.append(T)
    return centered_to_raw(centred, coords.mean)


def fit_mixture(
    network: Network,
    mixture: GaussianMixture,
    degree: int,
    *,
    method: str = "auto",
    tol: float = 1e-10,
    fvu_tol: float = 1e-7,
    window: int = 10,
    maxiter: int = 500,
    preconditioner: str = "diagonal",
    init: str = "pooled",
    device=None,
    dtype=None,
    progress: bool = False,
) -> DensePolynomial:
    """Exact least-squares approximant of degree ``degree`` of ``network`` under a Gaussian ``mixture``.

    Minimises ``E_mix ||f(x) - p(x)||^2`` (Rigg & Belrose 2025, arXiv 2502.01032, eq. 2 with the mixture input
    law of §3.4/§4) over polynomials of degree <= ``degree``, on the mixture's support (see module docstring).

    Parameters
    ----------
    network : ``MLP`` or ``GLU`` with ``d_in = d``
    mixture : ``GaussianMixture`` on R^d (any weights; singular components allowed)
    degree : int >= 0 (``"cg"`` needs degree 2)
    method : ``"auto"``/``"exact"`` (``"cg"`` for degree 2, ``"dense"`` otherwise), ``"cg"`` (matrix-free
        preconditioned CG, O(K d_out r^3) per iteration, r = rank of the mixture covariance) or ``"dense"``
        (explicit monomial Gram, C(r + degree, degree) <= ``MAX_DENSE_FEATURES`` features).
    tol : CG stops when the relative residual ``||M theta - rhs|| / ||rhs||`` of every output is <= tol ...
    fvu_tol : ... or when the estimated excess FVU of the iterate over the exact optimum (CG's energy-norm
        error summed over the last ``window`` steps, relative to the explained variance; see ``_pcg``) is
        <= fvu_tol. Pass 0 to stop on the residual only. At MNIST scale the residual stalls near 1e-4 while
        the excess FVU keeps falling (the Gram matrix is ill-conditioned in directions f hardly uses).
    window : number of CG steps in the excess-FVU estimate.
    maxiter : CG iteration limit.
    preconditioner : ``"diagonal"`` (default), ``"pooled"`` or ``"none"`` (see module docstring).
    init : CG starting point: ``"pooled"`` (the exact quadratic under the pooled Gaussian, default) or ``"zero"``.
    device : torch device for the CG path (default: CUDA when available, else CPU).
    dtype : ``torch.float64`` (default) or ``torch.float32`` for the CG path (float32: relative coefficient
        errors of order 1e-4 instead of 1e-10).
    progress : show a tqdm bar over CG iterations.

    Returns
    -------
    ``DensePolynomial`` with raw-coordinate tensors ``[d_out], [d_out, d], [d_out, d, d], ...``;
    ``p.solver_info`` holds ``method``, ``iterations``, ``relative_residual`` (recomputed explicitly at the
    end), ``stopped_by`` (``"residual"``, ``"fvu"`` or ``"maxiter"``), ``excess_fvu_estimate``,
    ``support_rank`` r, ``singular`` and a ``note`` on the support, ``wall_time_s``, ``cpu_time_s``, and (CG) the residual and
    explained-variance histories. The dense path reports the Gram matrix's condition number and rank.

    Raises
    ------
    TypeError : ``network``/``mixture`` of the wrong type.
    ValueError : dimension mismatch, bad degree/method/preconditioner/tol/maxiter/dtype, ``"cg"`` with degree
        != 2, or a dense problem too large (the message gives the largest support dimension that fits).
    """
    t_start, cpu_start = time.perf_counter(), time.process_time()
    network = validate_network(network)
    if not isinstance(mixture, GaussianMixture):
        raise TypeError(f"mixture must be mlpinterp.GaussianMixture, got {type(mixture).__name__}")
    if mixture.d != network.d_in:
        raise ValueError(f"mixture has dimension {mixture.d} but the network has d_in = {network.d_in}")
    if isinstance(degree, bool) or not isinstance(degree, int | np.integer) or degree < 0:
        raise ValueError(f"degree must be a non-negative integer, got {degree!r}")
    degree = int(degree)
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if preconditioner not in _PRECONDITIONERS:
        raise ValueError(f"preconditioner must be one of {_PRECONDITIONERS}, got {preconditioner!r}")
    if not (isinstance(tol, float | int) and tol > 0):
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    if not (isinstance(fvu_tol, float | int) and fvu_tol >= 0):
        raise ValueError(f"fvu_tol must be a non-negative number, got {fvu_tol!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if init not in ("pooled", "zero"):
        raise ValueError(f"init must be 'pooled' or 'zero', got {init!r}")
    if isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 1:
        raise ValueError(f"maxiter must be a positive integer, got {maxiter!r}")
    tdtype = _torch_dtype(dtype)
    if method in ("auto", "exact"):
        method = "cg" if degree == 2 else "dense"
    if method == "cg" and degree != 2:
        raise ValueError(f"method='cg' solves degree 2 only, got degree={degree}; use method='dense'")

    coords = SupportCoordinates.of(mixture)
    info: dict[str, Any] = {
        "network": type(network).__name__, "activation": network.activation,
        "distribution": f"GaussianMixture(K={mixture.K})", "degree": degree, "d_in": network.d_in,
    }
    if method == "dense":
        tensors_u, sinfo = _solve_dense(network, mixture, coords, degree)
        info["method"] = "exact-mixture-dense"
    else:
        import torch

        dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        op = _MixtureOperator(coords, mixture.weights, preconditioner, dev, tdtype)
        comps = []
        for comp in mixture.components:
            c, b, A = _quadratic_in_u(fit_ridge(network, comp, 2), coords)
            comps.append(tuple(torch.as_tensor(t, device=dev, dtype=tdtype) for t in (c, b, A)))
        t_rhs = time.perf_counter()
        rhs = op.apply(None, components=comps)
        del comps
        x0 = None
        if init == "pooled":
            c, b, A = _quadratic_in_u(fit_ridge(network, mixture.pooled(), 2), coords)
            x0 = tuple(torch.as_tensor(t, device=dev, dtype=tdtype) for t in (c, b, A))
        x, sinfo = _pcg(op, rhs, tol=float(tol), fvu_tol=float(fvu_tol), window=window, maxiter=maxiter,
                        progress=progress, x0=x0)
        sinfo.update(method="pcg", preconditioner=preconditioner, init=init, device=str(dev), dtype=str(tdtype).replace("torch.", ""),
                     operator_applications=op.n_apply, setup_time_s=t_rhs - t_start)
        tensors_u = [t.detach().to("cpu", torch.float64).numpy() for t in x]
        tensors_u[2] = 0.5 * (tensors_u[2] + np.swapaxes(tensors_u[2], 1, 2))
        info["method"] = "exact-mixture-cg"
    sinfo["support_rank"] = coords.r
    sinfo["singular"] = bool(coords.r < mixture.d)
    sinfo["note"] = (
        f"solved on the mixture's support (rank {coords.r} of {mixture.d}); extended off it by orthogonal projection"
        if coords.r < mixture.d else "mixture covariance is non-singular"
    )
    raw = _u_to_raw(tensors_u, coords)
    sinfo["wall_time_s"] = time.perf_counter() - t_start
    sinfo["cpu_time_s"] = time.process_time() - cpu_start  # all threads; the honest figure on a shared CPU
    info["solver_info"] = sinfo
    return DensePolynomial(tuple(raw), info=info)
