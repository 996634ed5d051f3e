"""Exact mixture quadratic at MNIST scale: matrix-free preconditioned conjugate gradients (``method="cg"``).

The paper (Rigg & Belrose 2025, §4) calls the mixture quadratic intractable at MNIST scale (feature dimension
d(d+1)/2 = 307,720 at d = 784) and fits it by SGD. We solve its normal equations exactly, matrix-free, in the
whitened support coordinates u of ``coordinates.py``.

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
"""

from __future__ import annotations

import numpy as np

from mlpinterp.poly.mixture.coordinates import SupportCoordinates

PRECONDITIONERS = ("diagonal", "pooled", "none")


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

