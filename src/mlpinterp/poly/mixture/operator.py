"""The mixture operator of the exact quadratic normal equations, and the algebra of its parameter vectors.

A quadratic ``p(u) = c + b.u + u^T A u`` (A symmetric) in the whitened support coordinates u of
``coordinates.py`` is the parameter ``theta = (c, b, A)`` with the inner product
``<theta, theta'> = c c' + b.b' + tr(A A')``, in which the least-squares normal equations read
``M theta = E_mix[f (1, u, u u^T)]`` with the self-adjoint PSD operator ``M theta = sum_k pi_k E_k[p_theta(u) (1, u,
u u^T)]`` (Rigg & Belrose 2025, §4 poses the problem). Under ``N(m, S)``, with ``u = m + v``,
``p = c' + b'.v + v^T A v`` (``c' = c + b.m + m^T A m``, ``b' = b + 2 A m``) and Isserlis' theorem:

    E[p] = c' + tr(AS),   E[p v] = S b',   E[p v v^T] = (c' + tr(AS)) S + 2 S A S,

from which ``E[p u] = m E[p] + E[p v]`` and ``E[p u u^T] = m m^T E[p] + m E[p v]^T + E[p v] m^T + E[p v v^T]``:
O(r^3) per component and output (two matrix products), batched over outputs, never the r^2 x r^2 Gram.
The right-hand side needs only Gaussian moments too: the single-Gaussian projection
``p_k = fit_ridge(network, component_k, 2)`` has the same moments of degree <= 2 as f under component k,
so ``E_k[f z] = E_k[p_k z]`` and ``E_mix[f z] = sum_k pi_k M_k theta_k``.
For an MLP ``theta_k``'s quadratic part has rank <= d_hidden, and ``MixtureOperator.apply_factored`` computes this
sum from the ridge factors without forming any ``[o, r, r]`` theta_k (GLUs use ``apply(None, components=...)``).

Preconditioners. Because u has identity second moment under the mixture, the linear block of M is exactly the
identity and the constant couples to A only through ``E[p] = c + tr A``. ``"diagonal"`` (default) inverts M
exactly on the block (c, diag A), whose Gram matrix is that of the features ``(1, u_1^2, ..., u_r^2)`` with
``E_mix[u_i^2 u_j^2] = sum_k pi_k [(S_ii + m_i^2)(S_jj + m_j^2) + 2 S_ij^2 + 4 m_i m_j S_ij]`` (Isserlis), takes
b as is, and divides each off-diagonal ``A_ij`` by its diagonal entry ``2 E_mix[u_i^2 u_j^2]`` (Jacobi).
``"pooled"`` is the exact inverse of the pooled Gaussian N(0, I)'s operator (Hermite-diagonal:
``A = (Gamma - gamma I) / 2``, ``c = gamma - tr A``, ``b = beta``). Both ignore third moments (b-A coupling).

Singular operators. M is singular exactly when a non-zero quadratic vanishes on every component's support (e.g.
``x_j x_l`` for two pixels that are never lit in the same class, or ``1 - u^2`` for two point masses at
``u = +-1``). M is non-singular when some component has full rank on the support (one component's Gram is then
positive definite); ``MixtureOperator.structure`` says which case holds ("nonsingular", "singular" when the
preconditioner's blocks prove a null direction, else "possibly singular"). Null directions of the (c, diag A)
block and entries ``A_ij`` with ``E[u_i^2 u_j^2] = 0`` are null directions of M, and the preconditioner maps them
to 0 (so it is positive semi-definite; the solver in ``pcg.py`` relies on this).

Precision. The operator works in float64, float32 or bfloat16: in bfloat16 only the sandwiches' GEMMs take
bfloat16 inputs (float32 accumulation; ``A S_k`` rounded to bfloat16 per component, ``sum_k pi_k S_k A S_k`` once
per output); the rest of the application is float32. On a non-symmetric A the fused operator (``b' = b + 2 A m``)
is not self-adjoint, so the operator's answer is built as ``H + H^T`` (exactly symmetric). On the CPU the sum over
components is one GEMM per output, and it computes only the block-lower part of its symmetric answer
(``_add_sandwiches``). Measured costs: docs/measurements.md, "Mixture solver".

Interface. :class:`MixtureOperator` applies M to ``(c [o], b [o, r], A [o, r, r])`` tuples (``apply``,
``apply_factored``) and to their flat form (``apply_flat``, ``precondition_flat``: one ``[o, 1 + r + r^2]`` row per
output, :func:`flatten_theta`), in which the inner product is :func:`flat_dot` and the subspace of symmetric A is
kept by :func:`symmetrise_flat_`: :func:`precision_of` and :func:`space_of` give them to the generic solver of
``pcg.py`` in its terms. :func:`cached_operator` keeps one operator per mixture, preconditioner, device and precision;
:func:`auto_dtype` says which precision ``dtype="auto"`` runs.
"""


from __future__ import annotations

import functools
import weakref

import numpy as np

from mlpinterp.poly.mixture.coordinates import SupportCoordinates
from mlpinterp.poly.mixture.factored import FactoredQuadratic
from mlpinterp.poly.mixture.pcg import Precision, Space
from mlpinterp.utils.hardware import cpu_has_fast_bfloat16

PRECONDITIONERS = ("diagonal", "pooled", "none")
#: Eigenvalues of the preconditioner's (c, diag A) block, and moments ``E[u_i^2 u_j^2]``, at or below this
#: fraction of the largest are treated as zero (null directions of the operator).
NULL_RTOL = 1e-12
#: Rank rule for "component k has full rank on the support" (proves the operator non-singular).
FULL_RANK_RTOL = 1e-10


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


def operator_structure(coords: SupportCoordinates, weights: np.ndarray) -> str:
    """``"nonsingular"`` if a component with positive weight has full rank on the support, else ``"possibly singular"``."""
    import torch

    for w, S in zip(weights, coords.covs, strict=True):
        if w > 0:
            # torch's LAPACK follows torch.set_num_threads; numpy's OpenBLAS may spawn a thread per core and,
            # on a loaded CPU, is about a hundred times slower here (docs/measurements.md)
            ev = torch.linalg.eigvalsh(torch.as_tensor(S, dtype=torch.float64)).numpy()
            if ev[-1] > 0 and ev[0] > FULL_RANK_RTOL * ev[-1]:
                return "nonsingular"
    return "possibly singular"


class MixtureOperator:
    """theta -> sum_k pi_k E_k[p_theta z] on (c [o], b [o, r], A [o, r, r]) tensors, with its preconditioner.

    ``structure``: "nonsingular", "singular" (a null direction found in the preconditioner's blocks) or
    "possibly singular"; ``null_directions``: how many such directions were found (a lower bound).
    ``like``: an operator of the same mixture and preconditioner whose structure and preconditioner setup
    (two (r+1) x (r+1) eigen-decompositions) are reused.
    """

    def __init__(self, coords: SupportCoordinates, weights: np.ndarray, preconditioner: str, device, dtype,
                 structure: str | None = None, like: MixtureOperator | None = None):
        import torch

        self.torch = torch
        self.dtype = dtype
        # bfloat16: only the 2K GEMMs take bfloat16 inputs (float32 accumulation, output rounded to bfloat16);
        # everything else (means, traces, accumulation of g2) runs in float32
        self.work_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
        #: relative rounding of one operator application (unit roundoff of its GEMM inputs and outputs)
        self.rounding = 2.0**-8 if dtype == torch.bfloat16 else torch.finfo(dtype).eps
        wd = self.work_dtype
        self.pi = [float(w) for w in weights]
        self.m = torch.as_tensor(coords.means, device=device, dtype=wd)
        # memory: the covariances are kept once, in float64 (on the CPU the coordinates' own array, not a
        # copy); a float32 operator casts them per application (``S``), and ``Q`` is built per application
        self._S64 = torch.as_tensor(coords.covs, device=device, dtype=torch.float64)
        # bfloat16: the sandwiches' GEMM inputs sqrt(pi_k) S_k side by side, kept (K r^2 in bfloat16, a quarter of
        # the float64 covariances); float32 and float64 build them per application (``sandwich_factors``)
        self._T_gemm = sandwich_factors(self._S64, self.pi, dtype) if dtype != wd else None
        self.pi_t = torch.tensor(np.array(weights), device=device, dtype=wd)
        self.r = coords.r
        self.kind = preconditioner
        if like is not None:
            self.structure, self.null_directions = like.structure, like.null_directions
            if preconditioner == "diagonal":
                self.Finv, self.Binv = like.Finv.to(wd), like.Binv.to(wd)
            self.n_apply = 0
            return
        self.structure = structure or operator_structure(coords, weights)
        self.null_directions = 0
        if preconditioner == "diagonal":
            m, S = coords.means, coords.covs
            dg = np.einsum("kii->ki", S) + m**2  # E_k[u_i^2]
            F = np.einsum("k,ki,kj->ij", weights, dg, dg) + np.einsum(
                "k,kij->ij", weights, 2 * S**2 + 4 * m[:, :, None] * m[:, None, :] * S
            )  # E_mix[u_i^2 u_j^2]
            r = coords.r
            B = np.empty((r + 1, r + 1))
            B[0, 0], B[0, 1:], B[1:, 0], B[1:, 1:] = 1.0, 1.0, 1.0, F  # Gram of (1, u_1^2, ..., u_r^2)
            # pseudo-inverse: a null vector of this principal block of M is a null vector of M (M is PSD)
            w, V = (t.numpy() for t in torch.linalg.eigh(torch.as_tensor(B)))
            keep = w > NULL_RTOL * w[-1]
            Binv = (V[:, keep] / w[keep]) @ V[:, keep].T
            # Jacobi on A_ij; E[u_i^2 u_j^2] = 0 means u_i u_j = 0 a.s.: a null direction, mapped to 0
            scale = np.sqrt(np.outer(np.diag(F), np.diag(F)))
            zero = F <= NULL_RTOL * scale
            Finv = np.where(zero, 0.0, 1.0 / (2.0 * np.where(zero, 1.0, F)))
            self.null_directions = int((~keep).sum()) + int(np.triu(zero, 1).sum())
            if self.null_directions and self.structure != "nonsingular":
                self.structure = "singular"
            self.Finv = torch.as_tensor(Finv, device=device, dtype=wd)
            self.Binv = torch.as_tensor(Binv, device=device, dtype=wd)
        self.n_apply = 0

    @property
    def S(self):
        """The component covariances ``[K, r, r]`` in the working dtype (float32: a fresh cast of the float64 ones)."""
        return self._S64.to(self.work_dtype)

    def _S_k(self, k: int):
        """``S[k]`` alone (the same values as ``self.S[k]``, without casting all K)."""
        return self._S64[k].to(self.work_dtype)

    @property
    def T_gemm(self):
        """The sandwiches' factors as the GEMMs take them (:func:`sandwich_factors`: kept for a bfloat16 operator,
        else built from the float64 covariances in the working dtype)."""
        return self._T_gemm if self._T_gemm is not None else sandwich_factors(self._S64, self.pi, self.work_dtype)

    @property
    def Q(self):
        """``E_k[u u^T] = S_k + m_k m_k^T``, ``[K, r, r]`` in the working dtype (built on each access)."""
        return self.S + self.m[:, :, None] * self.m[:, None, :]

    def apply(self, theta, components=None):
        """sum_k pi_k M_k theta (``components``: per-component thetas, for the right-hand side, instead).

        ``components`` may be any iterable of the K thetas, e.g. a generator that builds each when it is used (the
        right-hand side then holds one component's ``[o, r, r]`` tensor at a time, not K).
        """
        torch = self.torch
        self.n_apply += 1
        if components is None:
            return self._apply_fused(*theta)
        out, first = None, None
        for k, (pk, comp) in enumerate(zip(self.pi, components, strict=True)):
            if pk == 0.0:
                first = comp if out is None and first is None else first  # for the shapes of an all-zero answer
                continue
            g = _component_apply(*comp, self.m[k], self._S_k(k))
            del comp
            out = [pk * t for t in g] if out is None else [o + pk * t for o, t in zip(out, g, strict=True)]
        return tuple(out) if out is not None else tuple(torch.zeros_like(t) for t in first)

    def _apply_fused(self, c, b, A):
        """Same as summing ``_component_apply`` over components, with every O(o r^2) pass batched over k.

        Memory traffic, not arithmetic, dominated the naive sum (about 15 passes over ``[o, r, r]`` per
        component); here each component costs its GEMM ``A S_k``, and the sum over components of ``S_k (A S_k)`` is
        one GEMM per output (``_add_sandwiches``), accumulated in place.
        """
        torch = self.torch
        o, r = b.shape
        pi, m, S = self.pi_t, self.m, self.S  # S: float32, a cast of the float64 covariances, freed below
        AM = torch.matmul(A, m.T)  # [o, r, K]  A m_k
        mAm = torch.einsum("ork,kr->ok", AM, m)
        trAS = A.reshape(o, r * r) @ S.reshape(-1, r * r).T  # [o, K]
        e0 = c[:, None] + b @ m.T + mAm + trAS  # [o, K]  E_k[p]
        bp = b[:, None, :] + 2 * AM.transpose(1, 2)  # [o, K, r]
        ev = torch.einsum("okr,krs->oks", bp, S)  # [o, K, r]  E_k[p v]
        pe0 = e0 * pi  # [o, K]
        g0 = pe0.sum(1)
        g1 = pe0 @ m + torch.einsum("k,oks->os", pi, ev)
        Q = S + m[:, :, None] * m[:, None, :]  # E_k[u u^T]  [K, r, r] (``self.Q``)
        del S
        # g2 is built as a half H with H + H^T the answer (``_add_sandwiches``): half of the symmetric
        # sum_k pi_k E_k[p] (S_k + m_k m_k^T), one of the two transposed terms sum_k pi_k m_k E_k[p v]^T, and the
        # block-lower parts of the sandwiches
        g2 = (pe0 @ Q.reshape(-1, r * r)).reshape(o, r, r).mul_(0.5)
        del Q
        g2 += torch.einsum("kr,oks->ors", m * pi[:, None], ev)
        if self.dtype != self.work_dtype:  # bfloat16 GEMMs, float32 accumulation across components
            A3 = A.to(self.dtype)
            _add_sandwiches(g2, A3, self.T_gemm)
            del A3
        elif A.device.type == "cpu":
            _add_sandwiches(g2, A, self.T_gemm)
        else:  # on a GPU the o (K + LOWER_BLOCKS) small GEMMs would cost launches: K batched products instead
            A2 = A.reshape(o * r, r)
            Y = torch.empty_like(A2)
            for k, pk in enumerate(self.pi):
                if pk != 0.0:
                    Sk = self._S_k(k)
                    torch.mm(A2, Sk, out=Y)  # A S_k
                    g2.baddbmm_(Sk.expand(o, r, r), Y.view(o, r, r), alpha=pk)  # half of 2 pi_k S_k A S_k
            del Y
        # H + H^T: the operator's answer is exactly symmetric, so CG stays on symmetric A (the polynomial's
        # coefficients; on a non-symmetric A this operator, b' = b + 2 A m, is not self-adjoint)
        return g0, g1, _add_transpose_(g2)

    def apply_factored(self, quadratics):
        """``sum_k pi_k M_k theta_k`` (``apply(None, components=...)``) for factored ``theta_k``, in float64, on a
        float64 operator (its means are kept in its working dtype): the right-hand side and the anchor's
        ``M theta`` (:mod:`~mlpinterp.poly.mixture.factored` gives the form and its cost).

            quadratics : K ``FactoredQuadratic`` (one per component, in the mixture's order) or a single one, used for
            every component (``M theta``, e.g. for the pooled-Gaussian anchor)
        Returns ``(g0 [o], g1 [o, r], g2 [o, r, r])`` float64 tensors on the operator's device.
        Raises ValueError when this is not a float64 operator, the number of quadratics is not K or their shapes
        disagree with the operator.
        """
        import torch

        if self.work_dtype != torch.float64:
            raise ValueError(f"op must be the float64 mixture operator, got one working in {self.work_dtype}")
        K, r = len(self.pi), self.r
        if isinstance(quadratics, FactoredQuadratic):
            quadratics = [quadratics] * K
        quadratics = list(quadratics)
        if len(quadratics) != K:
            raise ValueError(f"quadratics must be one FactoredQuadratic or {K} (one per component), got {len(quadratics)}")
        dev = self._S64.device
        t = lambda a: torch.as_tensor(a, dtype=torch.float64, device=dev)  # noqa: E731
        o = quadratics[0].c.shape[0]
        for q in quadratics:
            if q.c.shape != (o,) or q.b.shape != (o, r) or q.L.shape[1] != r or q.w.shape != (o, q.L.shape[0]):
                raise ValueError(f"factored quadratic has shapes c {q.c.shape}, b {q.b.shape}, L {q.L.shape}, w {q.w.shape}; "
                                 f"the operator expects c [{o}], b [{o}, {r}], L [h, {r}], w [{o}, h]")
        self.n_apply += 1
        m, pi = self.m, self.pi
        pe0 = torch.zeros(o, K, dtype=torch.float64, device=dev)
        ev = torch.zeros(K, o, r, dtype=torch.float64, device=dev)
        Gs, Ws = [], []
        for k, q in enumerate(quadratics):
            if pi[k] == 0.0:
                continue
            S, mk = self._S64[k], m[k]
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
        pi_t = self.pi_t
        g1 = pe0 @ m + torch.einsum("k,kos->os", pi_t, ev)
        Q = self._S64 + m[:, :, None] * m[:, None, :]  # E_k[u u^T]
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

    def apply_flat(self, Z):
        """:meth:`apply` on flat rows ``Z [s, 1 + r + r^2]`` (:func:`flatten_theta`), in this operator's working dtype,
        answered in ``Z``'s dtype in one new ``[s, n]`` tensor (memory: no second ``[s, r, r]`` copy in ``Z``'s dtype
        beside the flat block)."""
        r = self.r
        theta = unflatten_theta(Z, r)
        if self.work_dtype != Z.dtype:
            theta = tuple(t.to(self.work_dtype) for t in theta)
        g = self.apply(theta)
        del theta
        out = Z.new_empty(Z.shape)
        for dst, src in zip(unflatten_theta(out, r), g, strict=True):
            dst.copy_(src)
        return out

    def precondition_flat(self, F):
        """Apply the preconditioner (a PSD approximation of M^+; see module docstring) to ``F [s, 1 + r + r^2]``
        (``flatten_theta`` rows), written into one new ``[s, n]`` tensor of ``F``'s dtype.

        Memory: no tuple with its own ``[s, r, r]`` part beside the flat block that CG needs.
        """
        torch = self.torch
        r = self.r
        g0, g1, g2 = unflatten_theta(F, r)
        out = torch.empty_like(F)
        c, b, A = unflatten_theta(out, r)
        b.copy_(g1)
        if self.kind == "none":
            c.copy_(g0)
            A.copy_(g2)
        elif self.kind == "pooled":
            eye = torch.eye(r, dtype=g2.dtype, device=g2.device)
            torch.mul(g2 - g0[:, None, None] * eye, 0.5, out=A)
            c.copy_(g0 - torch.diagonal(A, dim1=1, dim2=2).sum(1))
        else:  # "diagonal": exact on (c, diag A), Jacobi on the off-diagonal entries of A, exact on b
            torch.mul(g2, self.Finv, out=A)
            sol = torch.cat([g0[:, None], torch.diagonal(g2, dim1=1, dim2=2)], 1) @ self.Binv  # Binv symmetric
            A.diagonal(dim1=1, dim2=2).copy_(sol[:, 1:])
            c.copy_(sol[:, 0])
        return out

    def precondition(self, g):
        """:meth:`precondition_flat` on ``(c [s], b [s, r], A [s, r, r])``; the answer as views of one flat tensor."""
        return unflatten_theta(self.precondition_flat(flatten_theta(g)), self.r)


#: For r >= ``LOWER_BLOCKS_MIN_R`` the second GEMM of the sandwiches computes only the lower part of each of
#: ``LOWER_BLOCKS`` block columns of its symmetric answer (the flops are (1 + 6/10) / 2 = 0.8 of the full pair;
#: fewer blocks save less, more lose it to the smaller GEMMs: ``docs/measurements.md``). Below it, one block column
#: (the full product).
LOWER_BLOCKS = 5
LOWER_BLOCKS_MIN_R = 512
#: Largest group of factors ``[r, g r]`` (bytes) that :func:`sandwich_factors` puts side by side; the sandwiches
#: keep one ``[g r, r]`` buffer of the same size.
SANDWICH_GROUP_BYTES = 64 * 2**20


def sandwich_factors(S, pi, dtype):
    """The factors ``T_k = sqrt(pi_k) S_k`` of the components with ``pi_k > 0``, side by side in groups.

    S : ``[K, r, r]`` covariances (symmetric); pi : the K weights; dtype : of the answer (the GEMMs' input dtype).
    Returns a list of ``[r, g r]`` tensors ``[T_k1, ..., T_kg]``, each at most ``SANDWICH_GROUP_BYTES`` (at least
    one component per group), so that ``sum_k pi_k S_k A S_k = sum_k T_k (A T_k)`` is one GEMM per group with an
    inner dimension of ``g r`` (:func:`_add_sandwiches`).
    """
    import torch

    K, r = S.shape[0], S.shape[1]
    keep = [k for k in range(K) if pi[k] > 0.0]
    g = max(1, SANDWICH_GROUP_BYTES // max(1, r * r * torch.finfo(dtype).bits // 8))
    groups = []
    for i in range(0, len(keep), g):
        ks = keep[i : i + g]
        scale = torch.tensor([np.sqrt(pi[k]) for k in ks], dtype=S.dtype, device=S.device)
        T = (S[ks] * scale[:, None, None]).to(dtype)  # [g, r, r]
        groups.append(T.transpose(0, 1).reshape(r, len(ks) * r))  # [T_k1, ..., T_kg] (a copy: side by side)
    return groups


def _add_sandwiches(H, A, factors):
    """``H[j] += L_j`` with ``L_j + L_j^T = sum_k 2 pi_k S_k A_j S_k``, in place; returns ``H``.

    ``H [o, r, r]`` in the working dtype (float32 or float64); ``A [o, r, r]`` symmetric, in the GEMM dtype
    (bfloat16 GEMMs accumulate into a float32 ``H``); ``factors``: :func:`sandwich_factors` in the GEMM dtype. Per
    output and group, ``W = [A T_k1; ...; A T_kg]`` (one GEMM per component, stacked rows) and then
    ``sum_k T_k (A T_k) = [T_k1, ..., T_kg] W``: one GEMM whose inner dimension runs over the group's components,
    so the sum over components is accumulated inside the GEMM (in float32 for bfloat16 inputs, rounded once) and
    added to ``H`` once per group. ``S_k A_j S_k`` is symmetric, so only the lower part of each block column (the
    rows from the block's first column down) is computed, the diagonal blocks at half weight: the caller adds
    ``H^T``. One output at a time (the hot path: buffers of one output, reused).
    """
    import torch

    o, r = A.shape[:2]
    bs = max(-(-r // LOWER_BLOCKS) if r >= LOWER_BLOCKS_MIN_R else r, 1)
    cols = [(c0, min(c0 + bs, r)) for c0 in range(0, r, bs)]
    buf = torch.empty(r * bs, dtype=A.dtype, device=A.device)
    for T in factors:
        g = T.shape[1] // r
        W = torch.empty(g * r, r, dtype=A.dtype, device=A.device)
        for j in range(o):
            for i in range(g):
                torch.mm(A[j], T[:, i * r : (i + 1) * r], out=W[i * r : (i + 1) * r])  # A_j T_k
            for c0, c1 in cols:
                w = c1 - c0
                Zb = buf[: (r - c0) * w].view(r - c0, w)
                torch.mm(T[c0:], W[:, c0:c1], out=Zb)  # rows c0: of columns c0:c1 of sum_k T_k A_j T_k
                H[j, c0:c1, c0:c1].add_(Zb[:w])  # the diagonal block at half of 2 (H + H^T doubles it)
                if c1 < r:
                    H[j, c1:, c0:c1].add_(Zb[w:], alpha=2.0)
        del W
    return H


def _add_transpose_(g2):
    """``g2 + g2^T`` per output, in place (memory: one ``[r, r]`` temporary at a time, not an ``[o, r, r]`` one)."""
    for g in g2:
        g += g.T.contiguous()
    return g2


def symmetrise_(g2):
    """``0.5 * (g2 + g2^T)`` per output, in place (one ``[r, r]`` temporary at a time; the same values)."""
    return _add_transpose_(g2).mul_(0.5)


def theta_dot(x, y):
    """Per-output inner products ``<x_o, y_o>`` of ``(c, b, A)`` tuples -> ``[o]``."""
    return (x[0] * y[0]) + (x[1] * y[1]).sum(1) + (x[2] * y[2]).sum((1, 2))


def flatten_theta(theta):
    """(c [o], b [o, r], A [o, r, r]) -> one ``[o, 1 + r + r^2]`` tensor (the inner product becomes the dot product)."""
    import torch

    return torch.cat([theta[0][:, None], theta[1], theta[2].reshape(theta[0].shape[0], -1)], 1)


def unflatten_theta(F, r: int):
    """Inverse of ``flatten_theta`` (views, no copies)."""
    return F[:, 0], F[:, 1 : r + 1], F[:, r + 1 :].reshape(F.shape[0], r, r)


def flat_dot(X, Y, r: int):
    """Per-row inner products ``[o]`` of flat rows ``X, Y [o, 1 + r + r^2]``: :func:`theta_dot` of their parts (the same
    values as on the tuples)."""
    return theta_dot(unflatten_theta(X, r), unflatten_theta(Y, r))


def flat_gram(X, Y, r: int):
    """All inner products ``[nx, ny]`` between the flat rows of ``X [nx, n]`` and ``Y [ny, n]``, summed part by part
    as :func:`flat_dot`."""
    x, y = unflatten_theta(X, r), unflatten_theta(Y, r)
    n, m = x[2].shape[0], y[2].shape[0]
    return x[0][:, None] * y[0][None] + x[1] @ y[1].T + x[2].reshape(n, -1) @ y[2].reshape(m, -1).T


def symmetrise_flat_(X, r: int):
    """Replace the A part of each flat row of ``X`` by its symmetric part, in place (the operator is self-adjoint on
    symmetric A only); returns ``X``."""
    symmetrise_(unflatten_theta(X, r)[2])
    return X


_OPERATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_operator(coords: SupportCoordinates, preconditioner: str, device, dtype) -> MixtureOperator:
    """The mixture's operator and preconditioner in ``dtype``, cached per (mixture, preconditioner, device, dtype)
    (``coords`` are cached per mixture: ``coordinates.coordinates_of``); the precisions share their structure and
    preconditioner setup (``like``)."""
    ops = _OPERATORS.setdefault(coords, {})
    key = (preconditioner, str(device), str(dtype))
    if key not in ops:
        like = next((op for k, op in ops.items() if k[0] == preconditioner and k[1] == str(device)), None)
        structure = next((op.structure for op in ops.values() if op.structure == "nonsingular"), None)
        ops[key] = MixtureOperator(coords, coords.weights, preconditioner, device, dtype, structure=structure,
                                   like=like)
    return ops[key]


def auto_dtype(op64: MixtureOperator, device):
    """``fit_mixture(dtype="auto")``: the precision of the inner CG sweeps on ``device`` and why, from the float64
    operator's structure (``(torch dtype, reason)``)."""
    import torch

    if device.type == "cpu" and cpu_has_fast_bfloat16():
        return torch.bfloat16, "auto: fast bfloat16 GEMMs on this CPU" + (
            ", non-singular operator (the canonical answer)" if op64.structure == "nonsingular" else
            f"; the operator is {op64.structure} (the canonical answer on the components' supports)")
    if op64.structure == "nonsingular":
        return torch.float32, "auto: non-singular operator, no fast bfloat16 GEMMs on this device"
    # float32 sweeps stall on singular operators and fall back to float64: float64 from the start
    return torch.float64, f"auto: the operator is {op64.structure} and this device has no fast bfloat16 GEMMs"


def precision_of(op: MixtureOperator) -> Precision:
    """The solver's view of ``op``: its flat application and preconditioner, dtypes and rounding."""
    return Precision(matvec=op.apply_flat, precondition=op.precondition_flat, dtype=op.dtype,
                     work_dtype=op.work_dtype, rounding=op.rounding)


def space_of(r: int) -> Space:
    """The solver's view of the flat rows on a support of dimension r: :func:`flat_dot`, :func:`flat_gram`, and the
    symmetric part of A (:func:`symmetrise_flat_`)."""
    return Space(dot=functools.partial(flat_dot, r=r), gram=functools.partial(flat_gram, r=r),
                 project_=functools.partial(symmetrise_flat_, r=r))
