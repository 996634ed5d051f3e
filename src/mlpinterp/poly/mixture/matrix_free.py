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
For an MLP ``theta_k``'s quadratic part has rank <= d_hidden, and ``factored.apply_factored`` computes this sum
from the ridge factors without forming any ``[o, r, r]`` theta_k (GLUs use ``apply(None, components=...)``).

We solve with block preconditioned conjugate gradients: the outputs' systems share the operator, so one block
CG (O'Leary 1980) takes every step along the preconditioned residuals of all outputs together, and each output's
iterate is the best in the sum of the outputs' Krylov spaces (``_inner_pcg``; on 14x14 MNIST 24 instead of 37
iterations for 10 outputs, at one operator application per output and step as before). Because u has
identity second moment under the mixture, the linear block of M is exactly the identity and the constant
couples to A only through ``E[p] = c + tr A``. The default preconditioner (``"diagonal"``) inverts M exactly
on the block (c, diag A), whose Gram matrix is that of the features ``(1, u_1^2, ..., u_r^2)`` with
``E_mix[u_i^2 u_j^2] = sum_k pi_k [(S_ii + m_i^2)(S_jj + m_j^2) + 2 S_ij^2 + 4 m_i m_j S_ij]`` (Isserlis), takes
b as is, and divides each off-diagonal ``A_ij`` by its diagonal entry ``2 E_mix[u_i^2 u_j^2]`` (Jacobi).
``"pooled"`` is the exact inverse of the pooled Gaussian N(0, I)'s operator (Hermite-diagonal:
``A = (Gamma - gamma I) / 2``, ``c = gamma - tr A``, ``b = beta``). Both ignore third moments (b-A coupling).

Singular operators. M is singular exactly when a non-zero quadratic vanishes on every component's support,
e.g. ``x_j x_l`` for two MNIST pixels that are never lit in the same class (7,267 such pairs among the 717
non-constant pixels of the MNIST train set with empirical class covariances), or ``1 - u^2`` for two point
masses at ``u = +-1``. M is non-singular when some component has full rank on the support (one component's
Gram is then positive definite); ``_MixtureOperator.structure`` says which case holds ("nonsingular",
"singular" when the preconditioner's blocks prove a null direction, else "possibly singular"). The normal
equations are consistent (the right-hand side lies in the range of M), every solution gives the same
polynomial on the components' supports (the same mixture error), and the solutions differ off them. PCG
(block PCG too: each of its directions is a combination of preconditioned residuals) started at an anchor
``theta_0`` with a positive semi-definite preconditioner P (null directions of the
(c, diag A) block and entries ``A_ij`` with ``E[u_i^2 u_j^2] = 0`` are null directions of M, and P maps them
to 0) keeps its iterates in ``theta_0 + P range(M)``, which contains exactly one solution: the solution closest
to the anchor in the metric ``P^+`` (``argmin (theta - theta_0) . P^+ (theta - theta_0)`` subject to
``M theta = rhs``). That is the solution returned. The default anchor (``init="pooled"``) is the exact quadratic
under the pooled Gaussian: off the components' supports the polynomial stays as close as the mixture allows
to the pooled-Gaussian optimum (and CG starts close to the answer: 43 instead of 119 iterations on 14x14
MNIST); ``init="zero"`` gives the minimum-norm solution in the metric ``P^+``. A warm start from an earlier
result under the same mixture starts at the new anchor plus the earlier correction ``theta - theta_0``, which
stays in the same affine set, so it returns the cold start's answer; on a non-singular operator the start is the
energy-optimal combination of the earlier result's per-output corrections (``galerkin_start``: the operator is the
same at every checkpoint, so its action on them is known from the earlier solve; 60 instead of 82 iterations on
MNIST checkpoint 512 after 384).

Convergence is checked on the true residual ``rhs - M theta``, recomputed in float64 when CG stops, never on
the recurrence alone: the solver reports ``converged`` only when the true relative residual is ``<= tol``, or
when the estimated excess FVU is ``<= fvu_tol`` *and* the true relative residual is ``<= residual_tol``
(default 1e-4). CG minimises the energy-norm error, which *is* the excess mean squared error of the iterate,
and we estimate it over a window of steps (see ``_pcg``). If the true residual misses the target, CG restarts
from it (iterative refinement); in float32 (``dtype=torch.float32``) this is mixed-precision iterative
refinement: float32 operator applications (the GEMMs) inside, float64 CG vectors and recurrences, float64
true residuals outside. In bfloat16 (``dtype=torch.bfloat16``) only the 2K GEMMs take bfloat16 inputs (float32
accumulation, the product rounded to bfloat16: about 3e-3 relative error per application, 4-5x faster than
float32 on a CPU with AVX512-BF16); the rest of the application and the sweep's CG vectors are float32. A
bfloat16 sweep ends when its recurrence stagnates at that rounding level; the true residual is then updated with
the float32 operator (``res - M d``, recomputed as ``rhs - M x`` in float64 whenever it has fallen 1000-fold, so
float32 rounding never accumulates), any convergence is decided on ``rhs - M x`` in float64, and a bfloat16
sweep that reduces the true residual less than twofold (or raises it: its correction is discarded) switches the
remaining sweeps to float32, and a float32 sweep that does so switches them to float64 (``solver_info["fallback"]``
lists each switch: on singular operators float32 and bfloat16 rounding can leave the true residual above a tight
``tol`` however many sweeps run; 22 of 240 small rank-deficient problems did so before the float64 step was added,
and every one converges with it). bfloat16 is exact in this sense on a non-singular operator; on a singular one its rounding adds components along null directions that no residual sees, so the
answer is optimal on the supports but not the documented solution off them (``canonical`` False). A direction
with ``<p, M p> < 0`` beyond rounding raises ``IndefiniteOperatorError`` (from a float32 sweep only after the
float64 operator confirms it, against the rounding scale ``eps ||M|| |p|^2``; bfloat16 sweeps stop that output
instead); a direction with ``<p, M p> = 0`` (a null direction reached by rounding) stops that output, and the
true residual decides. On a non-symmetric A the fused operator (``b' = b + 2 A m``) is not self-adjoint, so CG
stays on symmetric A: the operator's answer is built as ``H + H^T`` (exactly symmetric), each step's directions are
symmetrised, and so are corrections in reduced precision.

Cost at MNIST scale (r = 712, K = 10): one operator application is 2 K GEMMs of size r^3 per output, 96 % of
the time (``benchmarks/profile_mixture_operator.py``); on the CPU the second GEMM of each pair computes only the
block-lower part of its symmetric answer (``_add_sandwiches``: 0.79 of the flops). On the 784-256-10 ReLU MLP of
``benchmarks/bench_mixture_solver.py`` (all 10 outputs, one thread, load 3.3-4.7): float64 65 iterations 223 s
CPU, float32 75 iterations 138 s, bfloat16 101 iterations (95 of them bfloat16) 94 s; see ``docs/polynomial.md``.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.poly.mixture.coordinates import SupportCoordinates
from mlpinterp.utils.progress import progress_bar

PRECONDITIONERS = ("diagonal", "pooled", "none")
#: Eigenvalues of the preconditioner's (c, diag A) block, and moments ``E[u_i^2 u_j^2]``, at or below this
#: fraction of the largest are treated as zero (null directions of the operator).
NULL_RTOL = 1e-12
#: Rank rule for "component k has full rank on the support" (proves the operator non-singular).
FULL_RANK_RTOL = 1e-10


class IndefiniteOperatorError(ArithmeticError):
    """The mixture operator has a direction with ``<p, M p> < 0`` beyond rounding (it must be PSD)."""


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
            # on a loaded CPU, took 3.6 s instead of 0.04 s per 712 x 712 matrix (measured, issue 12)
            ev = torch.linalg.eigvalsh(torch.as_tensor(S, dtype=torch.float64)).numpy()
            if ev[-1] > 0 and ev[0] > FULL_RANK_RTOL * ev[-1]:
                return "nonsingular"
    return "possibly singular"


class _MixtureOperator:
    """theta -> sum_k pi_k E_k[p_theta z] on (c [o], b [o, r], A [o, r, r]) tensors, with its preconditioner.

    ``structure``: "nonsingular", "singular" (a null direction found in the preconditioner's blocks) or
    "possibly singular"; ``null_directions``: how many such directions were found (a lower bound).
    ``like``: an operator of the same mixture and preconditioner whose structure and preconditioner setup
    (two (r+1) x (r+1) eigen-decompositions) are reused.
    """

    def __init__(self, coords: SupportCoordinates, weights: np.ndarray, preconditioner: str, device, dtype,
                 structure: str | None = None, like: _MixtureOperator | None = None):
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
        # memory (issue 12): the covariances are kept once, in float64 (on the CPU the coordinates' own array, not a
        # copy); a float32 operator casts them per application (``S``), and ``Q`` is built per application
        self._S64 = torch.as_tensor(coords.covs, device=device, dtype=torch.float64)
        self._S_gemm = self.S.to(dtype) if dtype != wd else None  # bfloat16 GEMM inputs, kept (half of float32)
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
    def S_gemm(self):
        """The covariances as the GEMMs take them (bfloat16 for a bfloat16 operator, else ``S``)."""
        return self._S_gemm if self._S_gemm is not None else self.S

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
        component); here each component costs its two GEMMs ``S_k (A S_k)``, accumulated in place.
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
            _add_sandwiches(g2, A3, lambda k: self._S_gemm[k], self.pi)
            del A3
        elif A.device.type == "cpu":
            _add_sandwiches(g2, A, self._S_k, self.pi)
        else:  # on a GPU the o K (1 + LOWER_BLOCKS) small GEMMs would cost launches: K batched products instead
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

    def precondition_flat(self, F):
        """Apply the preconditioner (a PSD approximation of M^+; see module docstring) to ``F [s, 1 + r + r^2]``
        (``_flat`` rows), written into one new ``[s, n]`` tensor of ``F``'s dtype.

        Memory (issue 12): no tuple with its own ``[s, r, r]`` part beside the flat block that CG needs.
        """
        torch = self.torch
        r = self.r
        g0, g1, g2 = _unflat(F, r)
        out = torch.empty_like(F)
        c, b, A = _unflat(out, r)
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
        return _unflat(self.precondition_flat(_flat(g)), self.r)


#: For r >= ``LOWER_BLOCKS_MIN_R`` the second GEMM of ``S_k (A S_k)`` computes only the lower part of each of
#: ``LOWER_BLOCKS`` block columns of its symmetric answer (measured hot path, r = 784 on a 2-core AMD EPYC with
#: AVX512-BF16: the bfloat16 GEMM pair 4.6-4.8 ms -> 3.8-3.9 ms with 7 blocks of 112; 4 or 8 blocks gained less,
#: 14 or 16 lost it to the smaller GEMMs; the flops are (1 + 8/14) / 2 = 0.79 of the full pair). Below it, one
#: block column (the full product).
LOWER_BLOCKS = 7
LOWER_BLOCKS_MIN_R = 512


def _add_sandwiches(H, A, S_of, pi):
    """``H[j] += L_j`` with ``L_j + L_j^T = sum_k 2 pi_k S_k A_j S_k``, in place; returns ``H``.

    ``H [o, r, r]`` in the working dtype (float32 or float64); ``A [o, r, r]`` symmetric, in the GEMM dtype
    (bfloat16 GEMMs accumulate into a float32 ``H``); ``S_of(k)``: ``S_k [r, r]`` in the GEMM dtype; ``pi``: the K
    weights (zero weights are skipped). ``S_k A_j S_k`` is symmetric, so only the lower part of each block column
    (the rows from the block's first column down) is computed, the diagonal blocks at half weight: the caller adds
    ``H^T``. One output at a time (measured hot path): a bfloat16 GEMM allocates a float32 accumulator of its
    output, 2 MB per ``[r, r]`` at MNIST scale, reused from the heap (one ``[o r, r]`` GEMM allocated 24.6 MB, a
    fresh mapping each time: 105,000 page faults per application; ``utils.malloc``, ``docs/polynomial.md``).
    """
    import torch

    o, r = A.shape[:2]
    bs = max(-(-r // LOWER_BLOCKS) if r >= LOWER_BLOCKS_MIN_R else r, 1)
    cols = [(c0, min(c0 + bs, r)) for c0 in range(0, r, bs)]
    Y = torch.empty(r, r, dtype=A.dtype, device=A.device)
    buf = torch.empty(r * bs, dtype=A.dtype, device=A.device)
    for k, pk in enumerate(pi):
        if pk == 0.0:
            continue
        Sk = S_of(k)
        for j in range(o):
            torch.mm(A[j], Sk, out=Y)  # A S_k
            for c0, c1 in cols:
                w = c1 - c0
                Zb = buf[: (r - c0) * w].view(r - c0, w)
                torch.mm(Sk[c0:], Y[:, c0:c1], out=Zb)  # rows c0: of columns c0:c1 of S_k A S_k
                H[j, c0:c1, c0:c1].add_(Zb[:w], alpha=pk)  # the diagonal block at half of 2 pi_k (H + H^T doubles it)
                if c1 < r:
                    H[j, c1:, c0:c1].add_(Zb[w:], alpha=2.0 * pk)
    return H


def _add_transpose_(g2):
    """``g2 + g2^T`` per output, in place (memory: one ``[r, r]`` temporary at a time, not an ``[o, r, r]`` one)."""
    for g in g2:
        g += g.T.contiguous()
    return g2


def _symmetrise_(g2):
    """``0.5 * (g2 + g2^T)`` per output, in place (one ``[r, r]`` temporary at a time; the same values)."""
    return _add_transpose_(g2).mul_(0.5)


def _dot(x, y):
    """Per-output inner products ``<x_o, y_o>`` -> ``[o]``."""
    return (x[0] * y[0]) + (x[1] * y[1]).sum(1) + (x[2] * y[2]).sum((1, 2))


def _sub(x, y):
    """x - y, per output."""
    return tuple(a - b for a, b in zip(x, y, strict=True))


def _sub_into(x, y):
    """``x - y`` per output, written into ``y``'s tensors (``y`` must be fresh: an operator's answer; the same values
    as ``_sub``, one ``[o, r, r]`` tensor fewer)."""
    import torch

    return tuple(torch.sub(a, b, out=b) if a.dtype == b.dtype else a - b for a, b in zip(x, y, strict=True))


def _norm(theta):
    """Per-output norms ``[o]``, 1 where 0 (the denominators of relative residuals)."""
    n = _dot(theta, theta).sqrt()
    return n.where(n > 0, n.new_ones(()))


def _rel(res, rhs_norm):
    """``(per-output relative residual [o], its max as a float)``."""
    rel_o = _dot(res, res).sqrt() / rhs_norm
    return rel_o, float(rel_o.max())


def _cast(theta, dtype):
    return tuple(t.to(dtype) for t in theta)


def _flat(theta):
    """(c [o], b [o, r], A [o, r, r]) -> one ``[o, 1 + r + r^2]`` tensor (the inner product becomes the dot product)."""
    import torch

    return torch.cat([theta[0][:, None], theta[1], theta[2].reshape(theta[0].shape[0], -1)], 1)


def _unflat(F, r: int):
    """Inverse of ``_flat`` (views, no copies)."""
    return F[:, 0], F[:, 1 : r + 1], F[:, r + 1 :].reshape(F.shape[0], r, r)


#: A sweep stops on its recurrence at this fraction of ``tol`` (the true residual decides; see ``_inner_pcg``).
INNER_TOL_FACTOR = 0.5
#: Block directions whose unit-normalised Gram eigenvalue is at or below this (per vector dtype) are linearly
#: dependent on the others and dropped (breakdown-free block CG, Ji & Li 2017).
DEPENDENT_RTOL = {"float64": 1e-10, "float32": 1e-5}


def _inner_pcg(op: _MixtureOperator, r0, rhs_norm, explained0, gains: list, frozen, frozen_err, *, tol, fvu_tol,
               residual_tol, window, maxiter, reduction, bar, precondition=None, verify=None):
    """Block PCG on ``M d = r0`` from ``d = 0`` with ``op``'s operator; the stopping rules use the global quantities.

    One block CG (O'Leary 1980) for all outputs: they share the operator, so each step's directions are the
    preconditioned residuals of every running output, M-orthogonalised against the previous block and made
    linearly independent (directions dependent on the others are dropped: breakdown-free block CG, Ji & Li 2017),
    and every output's iterate is the best (energy norm) in the sum of all outputs' Krylov spaces, at the cost of
    one operator application per output and step as in one CG per output. The block is diagonalised in the
    energy inner product (``<p_i, M p_j> = lambda_i delta_ij``), so the step is ``d += sum_j p_j <p_j, r>/lambda_j``
    and the energy decrease of output o, ``sum_j <p_j, r_o>^2 / lambda_j``, is its Hestenes-Stiefel gain.
    Directions are combinations of preconditioned residuals, so on a singular operator every output's iterate
    stays in ``P range(M)`` as with one CG per output (the same solution; module docstring).

    The CG vectors and recurrences stay in ``r0``'s dtype; only the operator applications run in ``op.dtype``.
    ``precondition``: the operator whose preconditioner is used (default ``op``). ``verify``: the float64 operator, which decides whether a float32
    direction with ``<p, M p> < 0`` is indefinite (raise) or rounding (dropped). ``rhs_norm [o]``: norms of the
    original right-hand side; ``explained0 [o]``: variance explained by the outer iterate, per output; ``gains``:
    the per-output energy decreases ``[o]`` of all earlier steps (appended to).

    An output whose own relative residual is ``<= tol``, or ``<= residual_tol`` with its own excess-FVU estimate
    ``<= fvu_tol``, is frozen (``frozen [o]``, updated in place): its iterate stops changing and its residual no
    longer adds directions. ``frozen_err [o]`` keeps a frozen output's estimated energy error, which stays in the
    pooled estimate. Returns ``(d, stop, iterations, residual_history, explained_history, active_output_history)``.
    """
    torch = op.torch
    # bfloat16: a direction that looks negative or null may be rounding (2^-8 per GEMM): it is dropped, and the
    # float64 true residual outside decides (falling back to float32 if the sweep stalled)
    low = op.dtype == torch.bfloat16
    tau = 100 * (torch.finfo(torch.float32).eps if low else op.rounding)
    dep = DEPENDENT_RTOL[_dtype_name(r0[0].dtype)]
    precondition = (precondition or op).precondition_flat
    # the recurrence's residual drifts from the true one by the operator's rounding (times the condition number):
    # aim below tol, so that the true residual, which decides, meets it without another sweep
    tol = INNER_TOL_FACTOR * tol
    r = r0[1].shape[1]
    R = _flat(r0)  # [o, n] residuals
    D = torch.zeros_like(R)  # [o, n] correction
    rn = rhs_norm
    r0_norm = R.norm(dim=1)
    live = r0_norm > 0
    residuals, explained, n_active = [], [], []
    stop, it = "maxiter", 0
    explained_k = explained0.clone()
    mnorm = 0.0  # the largest |M p| / |p| seen: a lower bound on ||M||
    best, best_it = np.inf, 0  # reduced precision: the sweep ends when the recurrence stagnates at the rounding level
    Pp = Qp = Hinv = None  # the previous block (orthonormal), M applied to it, and the pseudo-inverse of its Gram
    while it < maxiter:
        run = live & ~frozen
        idx = torch.nonzero(run).flatten()
        if idx.numel() == 0:
            stop = "stalled"
            break
        n_active.append(int(idx.numel()))
        Z = precondition(R if idx.numel() == R.shape[0] else R.index_select(0, idx))  # [s, n]
        if Pp is not None:  # M-orthogonal to the previous block (and, in exact arithmetic, to all earlier ones)
            coef = (Z @ Qp.T) @ Hinv
            Qp = None  # memory (issue 12): the previous block is not used again, freed as soon as it is done with
            Z -= coef @ Pp
        Pp = None
        # the parameter space is symmetric A: GEMM rounding breaks the symmetry of a direction's A, and on a singular
        # operator that antisymmetric part, on which the fused operator is not self-adjoint, grew until a float64
        # direction had <p, M p> < 0 (a false IndefiniteOperatorError on rank-deficient classes at tol 1e-12)
        _symmetrise_(_unflat(Z, r)[2])
        # an orthonormal basis of the block from the Gram of the unit-normalised directions: s x s arithmetic, then
        # one product with Z (memory: the block's [s, n] tensors are rotated only in s x s coefficients below)
        zn = Z.norm(dim=1)
        if not bool((zn > 0).all()):
            Z, zn = Z[zn > 0], zn[zn > 0]
        w, V = torch.linalg.eigh((Z @ Z.T) / torch.outer(zn, zn))
        keep = w > dep * w[-1] if w.numel() else w > 0
        if not bool(keep.any()):
            stop = "stalled"
            break
        Z = ((V[:, keep] / w[keep].sqrt()) / zn[:, None]).T @ Z
        Q = _apply_flat(op, Z, r)
        H = Z @ Q.T
        # the block's energy eigen-directions z_j = U_j^T Z (<z_i, M z_j> = lam_i delta_ij, |z_j| = 1) stay
        # implicit; |M z_j| from the s x s Gram of Q
        lam, U = torch.linalg.eigh(0.5 * (H + H.T))
        qn = torch.einsum("ij,ik,kj->j", U, Q @ Q.T, U).clamp(min=0).sqrt()
        mnorm = max(mnorm, float(qn.max()))
        neg = lam < -tau * qn
        if bool(neg.any()) and not low and verify is not None and verify is not op:
            # float32 near its attainable accuracy: M z is rounding noise; the float64 operator decides
            jdx = torch.nonzero(neg).flatten()
            Zn = (U[:, jdx].T @ Z).to(torch.float64)
            lam64 = (Zn * _flat(verify.apply(_unflat(Zn, r)))).sum(1)
            # rounding of <z, M z> is ~ eps ||M|| |z|^2 (on a null direction |M z| itself is rounding)
            bad = lam64 < -100 * verify.rounding * mnorm
            lam = lam.index_copy(0, jdx, torch.where(bad, lam64, torch.zeros_like(lam64)).to(lam.dtype))
            neg = torch.zeros_like(neg).index_copy_(0, jdx, bad)
        if bool(neg.any()) and not low:
            j = int(torch.nonzero(neg)[0])
            raise IndefiniteOperatorError(
                f"the mixture operator is not positive semi-definite: a CG direction (from the residuals of "
                f"outputs {idx.tolist()}) has <p, M p> = {float(lam[j]):.3g} < 0 with |p| = 1, |M p| = "
                f"{float(qn[j]):.3g}; the component covariances must be PSD, and in float32 rounding can cause "
                f"this: retry with dtype=torch.float64"
            )
        ok = lam > tau * qn  # null directions (reached by rounding) carry no step
        U, lam = U[:, ok], lam[ok]
        if lam.numel() == 0:
            stop = "stalled"
            break
        PR = U.T @ (Z @ R.T)  # [directions, o]: <z_j, r_o>
        alpha = (PR / lam[:, None]) * run.to(PR.dtype)  # frozen outputs take no step
        C = U @ alpha  # [s, o]: the step in the orthonormal basis Z
        D += C.T @ Z
        R -= C.T @ Q
        gain = (alpha * PR).sum(0)  # [o] energy decrease per output
        Pp, Qp, Hinv = Z, Q, (U / lam) @ U.T
        it += 1
        gains.append(gain)
        explained_k = explained_k + gain
        rel_o = R.norm(dim=1) / rn
        rel = float(rel_o.max())
        residuals.append(rel)
        explained.append(float(explained_k.sum()))
        bar.advance()
        bar.postfix(rel_residual=rel, outputs=int(run.sum()), directions=int(lam.numel()))
        if rel <= tol:
            stop = "residual"
            break
        if rel < 0.9 * best:
            best, best_it = rel, it
        elif op.dtype != torch.float64 and it - best_it >= STAGNATION_STEPS:
            stop = "stagnated"
            break
        if len(gains) >= window:
            recent = torch.stack(gains[-window:]).sum(0)  # [o]; 0 for outputs frozen in the whole window
            est_o = _per_output_fvu(recent, explained_k)
            by_tol = ~frozen & (rel_o <= tol)
            newly = by_tol | (~frozen & (rel_o <= residual_tol) & (est_o <= fvu_tol))
            # the window's sum estimates the error of `window` steps ago: block CG can pass from a large error to a
            # residual <= tol within the window, so an output that meets tol keeps its last step's gain instead
            frozen_err.copy_(torch.where(by_tol, gain, torch.where(newly, recent, frozen_err)))
            frozen |= newly
            est = _fvu_estimate(torch.where(frozen, frozen_err, recent).sum(), explained_k.sum())
            if est is not None and est <= fvu_tol and rel <= residual_tol:
                stop = "fvu"
                break
        if float((rel_o * rn / torch.where(r0_norm > 0, r0_norm, torch.ones_like(r0_norm))).max()) <= reduction:
            stop = "refine"
            break
    return _unflat(D, r), stop, it, residuals, explained, n_active


def _per_output_fvu(energy, explained):
    """Per-output ``energy / explained`` ``[o]`` (an excess-FVU estimate), ``inf`` where nothing is explained yet."""
    import torch

    pos = explained > 0
    return torch.where(pos, energy / torch.where(pos, explained, 1.0), torch.inf)


def _fvu_estimate(energy, explained) -> float | None:
    """Hestenes-Stiefel estimate of the excess FVU: the energy decrease of the last window of steps / explained."""
    explained = float(explained)
    return float(energy) / explained if explained > 0 else None


def _pooled_estimate(gains: list, frozen, frozen_err, explained, window: int) -> float | None:
    """The pooled excess-FVU estimate (frozen outputs count with the error estimated when they were frozen)."""
    import torch

    if len(gains) < window:
        return None
    recent = torch.stack(gains[-window:]).sum(0)
    return _fvu_estimate(torch.where(frozen, frozen_err, recent).sum(), explained)


#: Residual reduction at which an inner PCG sweep stops and the outer loop recomputes the true residual, per
#: dtype of the inner operator (float64: no inner sweeps; see ``_pcg``).
SWEEP_REDUCTION = {"float32": 1e-6, "bfloat16": 1e-2}
#: Iteration budget of one inner sweep per dtype (None: no limit beyond ``maxiter``; tests shrink it to force
#: the bfloat16 -> float32 -> float64 fallbacks).
SWEEP_MAXITER: dict = {"float32": None, "bfloat16": None}
#: A bfloat16 or float32 sweep ends (``"stagnated"``) when its recurrence residual has not fallen by 10 % in this
#: many steps (rounding, not the Krylov space, limits it; the next sweep restarts from the true residual). CG's
#: residual norm also plateaus on its own: 10 steps cut MNIST's first bfloat16 sweep at 32 iterations and 1.5e-3
#: where it goes on to 5e-4 (measured), so the window is long.
STAGNATION_STEPS = 30
#: A reduced-precision sweep that leaves the true residual above this fraction of the previous one has stalled: the
#: remaining sweeps run one precision up, bfloat16 -> float32 -> float64 (``solver_info["fallback"]``).
BF16_STALL = 0.5


def _sym(theta):
    """(c, b, A) with A replaced by its symmetric part (the operator is self-adjoint on symmetric A only)."""
    return theta[0], theta[1], 0.5 * (theta[2] + theta[2].transpose(1, 2))


def _sym_(theta):
    """``_sym`` in place (``theta``'s A is overwritten; the same values, one ``[o, r, r]`` temporary instead of two)."""
    _symmetrise_(theta[2])
    return theta


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _pcg(op64: _MixtureOperator, rhs, *, tol: float, fvu_tol: float, residual_tol: float, window: int, maxiter: int,
         progress: bool, x0=None, inner: _MixtureOperator | None = None, max_sweeps: int = 20,
         fallback: _MixtureOperator | None = None, res0=None, return_residual: bool = False):
    """Batched PCG with true-residual checks and iterative refinement, one system per output; ``(theta, info)``.

    CG minimises the energy-norm error, i.e. the excess mean squared error ``E_mix[(p_k - p*)^2]`` of the
    iterate; in exact arithmetic ``||e_k||^2 = sum_{j >= k} alpha_j (r_j . z_j)`` and the sum over the next
    ``window`` steps is the Hestenes-Stiefel lower-bound estimate (Strakos & Tichy 2002). We divide it by the
    variance explained so far, ``E[f^2] - E[(f - p_k)^2] - E[f]^2 = theta_k . (rhs + r_k) - E[f]^2`` (pooled over
    outputs; it increases monotonically to Var(p*)), a proxy for Var(f). Outputs that meet the rules on their
    own are frozen (see ``_inner_pcg``) and unfrozen if the true residual disagrees.

    Each sweep runs PCG with ``inner``'s operator (default: ``op64``; float32 or bfloat16 for mixed precision)
    on the true residual of the float64 iterate and adds its correction; a sweep ends on the rules of the module
    docstring, on a residual reduction of ``SWEEP_REDUCTION[dtype]`` (``"refine"``) or when every output's
    direction is null (``"stalled"``); then the true residual is recomputed. ``fallback`` (a float32 operator,
    with a bfloat16 ``inner``): the residuals between sweeps are updated with it (``res - M d``), the convergence
    decision is always confirmed by ``rhs - M x`` in float64, and when a bfloat16 sweep reduces the true residual
    by less than ``BF16_STALL`` (or increases it: that correction is discarded) the remaining sweeps run in
    float32; a float32 sweep that stalls likewise hands the remaining sweeps to float64 (``info["fallback"]``: a
    list of ``{"to", "after_sweep", "reason"}``, one per switch, empty when none). ``x0``: starting point (default
    0); ``res0``: its residual ``rhs - M x0`` when the caller has it (computed as here: with ``fallback``'s
    operator, else float64).
    ``return_residual``: return ``(theta, info, res)`` with ``res = rhs - M theta`` in float64.
    """
    torch = op64.torch
    inner = inner or op64
    rhs_norm = _norm(rhs)
    if x0 is None:
        x = tuple(torch.zeros_like(t) for t in rhs)
        res = rhs
    else:
        x = x0
        res = _sub(rhs, _apply_cast(fallback or op64, x0)) if res0 is None else res0
    with progress_bar(total=maxiter, desc="mixture CG", quiet=not progress) as bar:
        x, info, res = _sweeps(op64, inner, fallback, rhs, rhs_norm, x, res, bar, tol=tol, fvu_tol=fvu_tol,
                       residual_tol=residual_tol, window=window, maxiter=maxiter, max_sweeps=max_sweeps)
    return (x, info, res) if return_residual else (x, info)


def galerkin_start(anchor, ra, basis, m_basis):
    """The best start in ``anchor + span(basis)``: ``(x0, res0, coefficients [o, n])``.

    ``basis``, ``m_basis``: ``n`` parameter vectors stacked as (c [n], b [n, r], A [n, r, r]) and the operator
    applied to them (``M D_j``); ``ra = rhs - M anchor`` per output. For each output ``o`` the coefficients solve
    the Galerkin equations ``(D^T M D) c_o = D^T ra_o`` (pseudo-inverse), which minimise the energy-norm error,
    i.e. the excess mean squared error, of ``anchor_o + D c_o`` over the span (Krylov-subspace recycling with the
    previous checkpoint's corrections: the operator is the same at every checkpoint, only the right-hand side
    changes). ``res0 = ra - (M D) c`` is the start's residual without an operator application. On a singular
    operator the start stays in ``anchor + P range(M)`` when each ``D_j`` does (corrections of earlier solves).
    """
    import torch

    def dots(X, Y):  # [nx, ny] inner products <X_i, Y_j>
        return X[0][:, None] * Y[0][None] + X[1] @ Y[1].T + X[2].reshape(X[2].shape[0], -1) @ Y[2].reshape(Y[2].shape[0], -1).T

    G = dots(basis, m_basis)
    G = 0.5 * (G + G.T)
    w, V = torch.linalg.eigh(G)
    keep = w > NULL_RTOL * 1e4 * w[-1].clamp(min=0) if w.numel() else w > 0
    if not bool(keep.any()):
        return anchor, ra, torch.zeros(ra[0].shape[0], 0, dtype=ra[0].dtype)
    Ginv = (V[:, keep] / w[keep]) @ V[:, keep].T
    C = dots(ra, basis) @ Ginv  # [o, n]

    def comb(T):  # sum_j C[o, j] T_j -> per-output tensors
        return (C @ T[0], C @ T[1], (C @ T[2].reshape(T[2].shape[0], -1)).reshape(-1, *T[2].shape[1:]))

    x0 = tuple(a + b for a, b in zip(anchor, comb(basis), strict=True))
    res0 = _sym_(tuple(a - b for a, b in zip(ra, comb(m_basis), strict=True)))
    return x0, res0, C


def _apply_flat(op: _MixtureOperator, Z, r: int):
    """``_flat(_apply_cast(op, _unflat(Z, r)))``: the same values, the answer written into one new ``[s, n]`` tensor
    (memory, issue 12: no second ``[s, r, r]`` copy in ``Z``'s dtype beside the flat block)."""
    theta = _unflat(Z, r)
    if op.work_dtype != Z.dtype:
        theta = _cast(theta, op.work_dtype)
    g = op.apply(theta)
    del theta
    out = Z.new_empty(Z.shape)
    for dst, src in zip(_unflat(out, r), g, strict=True):
        dst.copy_(src)
    return out


def _apply_cast(op: _MixtureOperator, theta):
    """``op.apply`` in ``op``'s working dtype, returned in ``theta``'s dtype."""
    if op.work_dtype == theta[0].dtype:
        return op.apply(theta)
    return _cast(op.apply(_cast(theta, op.work_dtype)), theta[0].dtype)


def _sweeps(op64, inner, fallback, rhs, rhs_norm, x, res, bar, *, tol, fvu_tol, residual_tol, window, maxiter,
            max_sweeps):
    """The refinement sweeps of ``_pcg`` (see there)."""
    torch = op64.torch
    o = rhs_norm.shape[0]
    gains: list = []
    frozen = torch.zeros(o, dtype=torch.bool, device=rhs_norm.device)
    frozen_err = torch.zeros_like(rhs_norm)
    residuals, explained, sweeps, n_active = [], [], [], []
    it, stop, converged = 0, "maxiter", False
    # ref: the true relative residual at the last float64 recomputation
    true_rel, ref = _rel(res, rhs_norm)
    est = None
    fell_back: list = []
    update = fallback  # the operator of the residual updates between sweeps (None: rhs - M x in float64)
    exact = update is None  # res is rhs - M x in float64 (else updated with the float32 operator)

    def meets(rel: float, est: float | None) -> bool:
        """The stopping rule of the module docstring, on a true relative residual."""
        return rel <= tol or (est is not None and est <= fvu_tol and rel <= residual_tol)

    for _ in range(max_sweeps):
        # E[f^2] - E[(f - p)^2] - E[f]^2 per output (the constant feature has E[1 * f] = E[f])
        explained0 = _dot(x, rhs) + _dot(x, res) - rhs[0] ** 2
        # an output stays frozen only if its true residual meets the rule on its own (its error estimate from when
        # it was frozen); one frozen on its recurrence's residual can be above tol in truth: go on
        own_est = _per_output_fvu(frozen_err, explained0)
        unfreeze = frozen & (true_rel > tol) & ((true_rel > residual_tol) | (own_est > fvu_tol))
        if bool((frozen & ~unfreeze).all()):  # another sweep with every output frozen: reopen the unconverged
            unfreeze = frozen & (true_rel > tol)
        frozen &= ~unfreeze
        frozen_err.masked_fill_(unfreeze, 0.0)
        name = _dtype_name(inner.dtype)
        budget = maxiter - it
        if SWEEP_MAXITER.get(name) is not None:
            budget = min(budget, SWEEP_MAXITER[name])
        # bfloat16 sweeps keep their CG vectors in float32 (half the memory traffic; their accuracy is set by the
        # 2^-8 GEMMs); float32 and float64 sweeps keep them in float64
        low = inner.dtype == torch.bfloat16
        d, stop, n, rh, eh, na = _inner_pcg(inner, _cast(res, inner.work_dtype) if low else res, rhs_norm,
                                            explained0, gains, frozen, frozen_err, tol=tol,
                                            fvu_tol=fvu_tol, residual_tol=residual_tol, window=window,
                                            maxiter=budget, reduction=SWEEP_REDUCTION.get(name, 0.0), bar=bar,
                                            precondition=inner if low else op64,
                                            verify=op64)
        it += n
        residuals += rh
        explained += eh
        n_active += na
        if inner.dtype != torch.float64:  # rounding leaves an antisymmetric part in A, invisible to the polynomial
            d = _sym_(d)  # (d: views of the sweep's own correction)
        x_new = tuple(a + b.to(a.dtype) for a, b in zip(x, d, strict=True))
        prev = float(true_rel.max())
        exact_new = update is None
        if not exact_new:  # the float32 update of the true residual; float64 confirms any convergence
            res_new = _sym_(_sub_into(res, _apply_cast(update, d)))
            rel_o, rel = _rel(res_new, rhs_norm)
            # its rounding, ~eps32 times the residual at the last float64 recomputation, stays in res: recompute
            exact_new = rel <= 1e-3 * ref
        if exact_new:
            res_new = _sym_(_sub_into(rhs, op64.apply(x_new)))
            rel_o, rel = _rel(res_new, rhs_norm)
        est = _pooled_estimate(gains, frozen, frozen_err, explained[-1] if explained else 0.0, window)
        converged = meets(rel, est)
        if converged and not exact_new:  # the decision is made on rhs - M x in float64 only
            res_new = _sym_(_sub_into(rhs, op64.apply(x_new)))
            exact_new = True
            rel_o, rel = _rel(res_new, rhs_norm)
            converged = meets(rel, est)
        entry = {"iterations": n, "stopped_by": stop, "true_relative_residual": rel, "dtype": name}
        stalled = not converged and rel > BF16_STALL * prev
        up = {torch.bfloat16: fallback, torch.float32: op64}.get(inner.dtype) if stalled else None
        if up is not None and it < maxiter:
            # a reduced-precision sweep stalled (on a singular operator float32 and bfloat16 rounding can leave the
            # true residual above tol however many sweeps run): the remaining sweeps run one precision up
            entry["discarded"] = rel >= prev
            sweeps.append(entry)
            if not entry["discarded"]:
                x, res, true_rel, exact = x_new, res_new, rel_o, exact_new
                ref = rel if exact else ref
            fell_back.append({"to": _dtype_name(up.dtype), "after_sweep": len(sweeps),
                              "reason": f"a {name} sweep took the true relative residual from {prev:.3g} to {rel:.3g}"
                                        + (" (correction discarded)" if entry["discarded"] else "")})
            inner = up
            if up is op64:  # float64 sweeps: every residual is rhs - M x in float64
                update = None
                if not exact:
                    res = _sym_(_sub_into(rhs, op64.apply(x)))
                    true_rel, _ = _rel(res, rhs_norm)
                    exact, ref = True, float(true_rel.max())
            continue
        if not converged and rel >= prev:  # a sweep that made the true residual worse: its correction is discarded
            entry["discarded"] = True
            sweeps.append(entry)
            break
        bf16_stalled = inner.dtype == torch.bfloat16 and stalled  # no float32 operator to fall back to, or no budget
        if bf16_stalled:
            entry["discarded"] = False
        sweeps.append(entry)
        x, res, true_rel, exact = x_new, res_new, rel_o, exact_new
        ref = rel if exact else ref
        if converged or it >= maxiter or (stop == "stalled" and rel > 0.5 * prev) or n == 0 or bf16_stalled:
            break
    if not exact:  # the reported residual is always rhs - M x in float64
        res = _sub_into(rhs, op64.apply(x))
        true_rel, rel = _rel(res, rhs_norm)
        converged = meets(rel, est)
    info = {
        "iterations": it,
        "relative_residual": float(true_rel.max()),
        "per_output_relative_residual": [float(v) for v in true_rel],
        "stopped_by": stop if converged else ("maxiter" if it >= maxiter else stop),
        "converged": bool(converged),
        "excess_fvu_estimate": est,
        "sweeps": sweeps,
        "fallback": fell_back,
        "active_outputs_history": n_active,
        "residual_history": residuals,
        "explained_variance_history": explained,
    }
    return x, info, res
