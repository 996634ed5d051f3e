"""The mixture operator applied to ridge quadratics in factored form: the right-hand side and the anchor's residual.

The right-hand side of the mixture normal equations is ``sum_k pi_k M_k theta_k`` with ``theta_k`` the
single-Gaussian quadratic of component k (``operator`` module docstring), and the pooled-Gaussian anchor's
residual needs ``M theta_pool``. These quadratics come from ``fit_ridge`` on an MLP, so their quadratic part has
rank <= d_hidden per output: in u coordinates ``A_o = L^T diag(w_o) L`` with ``L = A_ridge R`` ``[h, r]`` and
``w = W2 * gamma`` ``[o, h]`` (``coordinates.quadratic_in_u``). With ``G_k = L S_k`` ``[h, r]``:

    A m_k = L^T (w_o * (L m_k)),   tr(A S_k) = w_o . diag(L S_k L^T),   S_k A S_k = G_k^T diag(w_o) G_k,

so one application costs ``2 K h r^2`` for the ``G_k`` plus, per output, one GEMM ``[r, K h] x [K h, r]`` that sums
``2 pi_k S_k A_k S_k`` over all components at once (``2 o r^2 K h`` in all), instead of building each ``[o, r, r]``
``A_k`` (``2 o h r^2``) and the generic ``S_k A_k S_k`` (``4 o r^3``) per component: at MNIST scale (r = 712,
h = 512, K = o = 10) 57 instead of 196 GFLOP, in float64, and without the generic path's dozen ``[o, r, r]``
temporaries per component (measured in ``docs/measurements.md``, "Mixture solver"). The moment formulas are those of
``operator._component_apply`` (Isserlis' theorem); the result is the same tensors to rounding
(``tests/test_mixture_cg.py``). GLU ridge quadratics (a gate-residual term, not of this form) use the generic path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlpinterp.poly.approximant import RidgePolynomial
from mlpinterp.poly.mixture.coordinates import SupportCoordinates


@dataclass(frozen=True)
class FactoredQuadratic:
    """``p(u) = c + b.u + u^T A u`` per output with ``A_o = L^T diag(w_o) L``.

    c ``[o]``, b ``[o, r]``, L ``[h, r]``, w ``[o, h]`` (numpy float64; u: the support coordinates).
    """

    c: np.ndarray
    b: np.ndarray
    L: np.ndarray
    w: np.ndarray


def factored_quadratic_in_u(p: RidgePolynomial, coords: SupportCoordinates) -> FactoredQuadratic | None:
    """``coordinates.quadratic_in_u`` without forming ``A``: the factors of an MLP's degree-2 ridge polynomial.

    Returns None for a GLU's ridge polynomial (its gate-residual term is not ``L^T diag(w) L``).
    """
    if p.G is not None or p.degree != 2:
        return None
    mu, R = coords.mean, coords.R
    gamma, _ = p._monomial_weights(2)
    L = p.A @ R  # [h, r]
    w = p.W2 * gamma  # [o, h]
    T2mu = (w * (p.A @ mu)) @ p.A  # [o, d] = T2 @ mu
    c = p.coefficients(0) + p.coefficients(1) @ mu + T2mu @ mu
    b = (p.coefficients(1) + 2 * T2mu) @ R
    return FactoredQuadratic(c, b, L, w)


def apply_factored(op, quadratics):
    """``sum_k pi_k M_k theta_k`` (``op.apply(None, components=...)``) for factored ``theta_k``, in float64.

    op : the float64 ``operator.MixtureOperator`` (its means are kept in its working dtype)
    quadratics : K ``FactoredQuadratic`` (one per component, in the mixture's order) or a single one, used for
        every component (``M theta``, e.g. for the pooled-Gaussian anchor)
    Returns ``(g0 [o], g1 [o, r], g2 [o, r, r])`` float64 tensors on the operator's device.
    Raises ValueError when ``op`` is not a float64 operator, the number of quadratics is not K or their shapes
    disagree with the operator.
    """
    import torch

    if op.work_dtype != torch.float64:
        raise ValueError(f"op must be the float64 mixture operator, got one working in {op.work_dtype}")
    K, r = len(op.pi), op.r
    if isinstance(quadratics, FactoredQuadratic):
        quadratics = [quadratics] * K
    quadratics = list(quadratics)
    if len(quadratics) != K:
        raise ValueError(f"quadratics must be one FactoredQuadratic or {K} (one per component), got {len(quadratics)}")
    dev = op._S64.device
    t = lambda a: torch.as_tensor(a, dtype=torch.float64, device=dev)  # noqa: E731
    o = quadratics[0].c.shape[0]
    for q in quadratics:
        if q.c.shape != (o,) or q.b.shape != (o, r) or q.L.shape[1] != r or q.w.shape != (o, q.L.shape[0]):
            raise ValueError(f"factored quadratic has shapes c {q.c.shape}, b {q.b.shape}, L {q.L.shape}, w {q.w.shape}; "
                             f"the operator expects c [{o}], b [{o}, {r}], L [h, {r}], w [{o}, h]")
    op.n_apply += 1
    m, pi = op.m, op.pi
    pe0 = torch.zeros(o, K, dtype=torch.float64, device=dev)
    ev = torch.zeros(K, o, r, dtype=torch.float64, device=dev)
    Gs, Ws = [], []
    for k, q in enumerate(quadratics):
        if pi[k] == 0.0:
            continue
        S, mk = op._S64[k], m[k]
        L, w, c, b = t(q.L), t(q.w), t(q.c), t(q.b)
        Lm = L @ mk  # [h]
        Am = (w * Lm) @ L  # [o, r]  A m_k
        G = L @ S  # [h, r]
        trAS = w @ (G * L).sum(1)  # [o]
        e0 = c + b @ mk + w @ (Lm * Lm) + trAS  # E_k[p]
        ev[k] = (b + 2 * Am) @ S  # E_k[p v]
        pe0[:, k] = pi[k] * e0
        Gs.append(G)
        Ws.append(2.0 * pi[k] * w)
    g0 = pe0.sum(1)
    pi_t = op.pi_t
    g1 = pe0 @ m + torch.einsum("k,kos->os", pi_t, ev)
    Q = op._S64 + m[:, :, None] * m[:, None, :]  # E_k[u u^T]
    g2 = (pe0 @ Q.reshape(K, r * r)).reshape(o, r, r)  # sum_k pi_k E_k[p] (S_k + m_k m_k^T)
    del Q
    W = torch.einsum("kr,kos->ors", m * pi_t[:, None], ev)  # sum_k pi_k m_k E_k[p v]^T
    g2 += W
    g2 += W.transpose(1, 2)
    del W
    if Gs:
        Gall = torch.cat(Gs)  # [K h, r]
        Wall = torch.cat(Ws, 1)  # [o, K h]
        for j in range(o):  # one [r, K h] x [K h, r] GEMM per output: sum_k 2 pi_k S_k A_k S_k
            g2[j].addmm_(Gall.T * Wall[j], Gall)
    return g0, g1, g2
