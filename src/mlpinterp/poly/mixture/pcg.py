"""Block preconditioned conjugate gradients with mixed-precision iterative refinement, on flat vectors.

Generic: it solves ``M X = B`` for right-hand sides ``B [o, n]`` (one system per row) with a symmetric positive
semi-definite operator seen only through :class:`Precision` (its application and preconditioner in one precision)
and :class:`Space` (inner products, the subspace of the iterates), as ``scipy.sparse.linalg.cg`` sees a
``LinearOperator``. The mixture quadratic (d(d+1)/2 = 307,720 features at d = 784, which Rigg & Belrose 2025, §4 fit
by SGD) builds them in ``system.py`` from ``operator.py``; nothing here knows a mixture.

Block PCG (O'Leary 1980): the rows share the operator, so every step goes along the preconditioned residuals of
all rows together (``_inner_pcg``).

Which solution. On a consistent singular system, PCG (block PCG too: each of its directions is a combination of
preconditioned residuals) started at ``x0`` with a positive semi-definite preconditioner P keeps its iterates in
``x0 + P range(M)``, which contains exactly one solution: the one closest to ``x0`` in the metric ``P^+``. A start
``x0 + D c`` with earlier corrections ``D`` (:func:`galerkin_start`) stays in that set when each of them does.

Convergence is checked on the true residual ``rhs - M theta``, recomputed in float64 when CG stops, never on
the recurrence alone: the solver reports ``converged`` only when the true relative residual is ``<= tol``, or
when the estimated excess FVU is ``<= fvu_tol`` *and* the true relative residual is ``<= residual_tol``
(default 1e-4). CG minimises the energy-norm error, which *is* the excess mean squared error of the iterate,
and we estimate it over a window of steps (see :func:`pcg`). If the true residual misses the target, CG goes on
from it (iterative refinement with reliable updates: the next sweep starts from the true residual and keeps the
last block of search directions, so CG continues instead of restarting, as in van der Vorst & Ye 2000's residual
replacement and Clark et al. 2010's mixed-precision CG); in float32 (``dtype=torch.float32``) this is
mixed-precision iterative refinement: float32 operator applications (the GEMMs) inside, float64 CG vectors and
recurrences, float64 true residuals outside. In bfloat16 only the operator's GEMMs take bfloat16 inputs; the sweep's
CG vectors are float32. A bfloat16 sweep ends when every output still running has cut its recurrence residual
tenfold (``SWEEP_REDUCTION``) or when the recurrence stagnates; the true residual is then updated with the float32
operator (``res - M d``, recomputed as ``rhs - M x`` in float64 whenever it has fallen 1000-fold, so float32
rounding never accumulates; in float64 at once, without the float32 update, when the sweep's recurrence has met the
stopping rule or fallen 1000-fold), any convergence is decided on ``rhs - M x`` in float64, and a bfloat16 sweep
that reduces the true residual less than twofold (or raises it: its correction is discarded) switches the remaining
sweeps to float32, and a float32 sweep that does so switches them to float64
(``solver_info["fallback"]`` lists each switch: on singular operators float32 and bfloat16 rounding can leave the
true residual above a tight ``tol`` however many sweeps run; on a singular operator bfloat16 rounding also adds
components along null directions that no residual sees). A direction with ``<p, M p> < 0`` beyond rounding raises
``IndefiniteOperatorError`` (from a float32 sweep only after the float64 operator confirms it, against the rounding
scale ``eps ||M|| |p|^2``; bfloat16 sweeps stop that output instead); a direction with ``<p, M p> = 0`` (a null
direction reached by rounding) stops that output, and the true residual decides. Iterates stay in the subspace of
``Space.project_`` (the mixture's: symmetric A): each step's directions are projected, and so are corrections in
reduced precision. Measured: docs/measurements.md, "Mixture solver".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlpinterp.utils.progress import progress_bar

#: A sweep stops on its recurrence at this fraction of ``tol`` (the true residual decides; see ``_inner_pcg``).
INNER_TOL_FACTOR = 0.5
#: Block directions whose unit-normalised Gram eigenvalue is at or below this (per vector dtype) are linearly
#: dependent on the others and dropped (breakdown-free block CG, Ji & Li 2017).
DEPENDENT_RTOL = {"float64": 1e-10, "float32": 1e-5}
#: Eigenvalues of the Galerkin Gram ``D^T M D`` at or below this fraction of the largest are dropped (pseudo-inverse).
GALERKIN_RTOL = 1e-8


class IndefiniteOperatorError(ArithmeticError):
    """The operator has a direction with ``<p, M p> < 0`` beyond rounding (it must be PSD)."""


@dataclass(frozen=True)
class Precision:
    """The operator in one floating-point precision (``scipy``'s ``LinearOperator``, with a preconditioner).

    matvec : ``X [s, n] -> M X [s, n]`` in ``X``'s dtype; precondition : ``R [s, n] -> P R`` in ``R``'s dtype, P a
    PSD approximation of ``M^+``; dtype : of the application's GEMMs; work_dtype : of its other arithmetic (float32
    for bfloat16, else ``dtype``); rounding : relative rounding of one application (unit roundoff of the GEMMs).
    """

    matvec: Callable
    precondition: Callable
    dtype: Any
    work_dtype: Any
    rounding: float


@dataclass(frozen=True)
class Space:
    """The vectors' geometry: row-wise inner products ``dot(X, Y) -> [o]`` (M is self-adjoint in them), all pairs
    ``gram(X, Y) -> [nx, ny]``, ``project_(X)`` onto the subspace where M is self-adjoint (in place, returns X)."""

    dot: Callable
    gram: Callable
    project_: Callable


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")  # torch.float32 -> "float32"


def _norm(space: Space, X):
    """Row norms ``[o]``, 1 where 0 (the denominators of relative residuals)."""
    n = space.dot(X, X).sqrt()
    return n.where(n > 0, n.new_ones(()))


def _relative(space: Space, res, rhs_norm):
    """``(per-row relative residual [o], its max as a float)``."""
    rel_o = space.dot(res, res).sqrt() / rhs_norm
    return rel_o, float(rel_o.max())


def _inner_pcg(op: Precision, space: Space, r0, rhs_norm, explained0, gains: list, frozen, frozen_err, *, tol,
               fvu_tol, residual_tol, window, maxiter, reduction, bar, precondition=None, verify=None, carry=None):
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

    CG vectors and recurrences stay in ``r0 [o, n]``'s dtype; only the applications run in ``op.dtype``.
    ``carry``: ``(P, M P, (P^T M P)^+)`` of the previous sweep's last block (or None): the first step's directions
    are M-orthogonalised against it, so the sweep continues that CG from ``r0`` (reliable updates, module docstring).
    ``precondition``: the precision whose preconditioner is used (default ``op``); ``verify``: the float64 one, which
    decides whether a float32 direction with ``<p, M p> < 0`` is indefinite (raise) or rounding (dropped); ``rhs_norm
    [o]``: the right-hand side's norms; ``explained0 [o]``: variance explained by the outer iterate; ``gains``: the
    per-output energy decreases ``[o]`` of all earlier steps (appended to).

    An output whose own relative residual is ``<= tol``, or ``<= residual_tol`` with its own excess-FVU estimate
    ``<= fvu_tol``, is frozen (``frozen [o]``, updated in place): its iterate stops changing and its residual no
    longer adds directions. ``frozen_err [o]`` keeps a frozen output's estimated energy error, which stays in the
    pooled estimate. Returns ``(d [o, n], stop, iterations, residual_history, explained_history,
    active_output_history, carry)`` with ``carry`` the last block for the next sweep (None when the sweep ended
    before completing a step's block).
    """
    import torch

    # bfloat16: a direction that looks negative or null may be rounding (2^-8 per GEMM): it is dropped, and the
    # float64 true residual outside decides (falling back to float32 if the sweep stalled)
    low = op.dtype == torch.bfloat16
    tau = 100 * (torch.finfo(torch.float32).eps if low else op.rounding)
    dep = DEPENDENT_RTOL[dtype_name(r0.dtype)]
    precondition = (precondition or op).precondition
    # the recurrence's residual drifts from the true one by the operator's rounding (times the condition number):
    # aim below tol, so that the true residual, which decides, meets it without another sweep
    tol = INNER_TOL_FACTOR * tol
    R = r0.clone()  # [o, n] residuals
    D = torch.zeros_like(R)  # [o, n] correction
    rn = rhs_norm
    r0_norm = R.norm(dim=1)
    live = r0_norm > 0
    residuals, explained, n_active = [], [], []
    stop, it = "maxiter", 0
    explained_k = explained0.clone()
    mnorm = 0.0  # the largest |M p| / |p| seen: a lower bound on ||M||
    best, best_it = np.inf, 0  # reduced precision: the sweep ends when the recurrence stagnates at the rounding level
    # the previous block (orthonormal), M applied to it, and the pseudo-inverse of its Gram
    Pp, Qp, Hinv = carry if carry is not None else (None, None, None)
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
            Qp = None  # memory: the previous block is not used again, freed as soon as it is done with
            Z -= coef @ Pp
        Pp = None
        # rounding moves a direction off the subspace on which M is self-adjoint (the mixture's: an antisymmetric
        # part of A, which grew on a singular operator until a float64 direction had <p, M p> < 0): project it back
        space.project_(Z)
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
        Q = op.matvec(Z)
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
            lam64 = (Zn * verify.matvec(Zn)).sum(1)
            # rounding of <z, M z> is ~ eps ||M|| |z|^2 (on a null direction |M z| itself is rounding)
            bad = lam64 < -100 * verify.rounding * mnorm
            lam = lam.index_copy(0, jdx, torch.where(bad, lam64, torch.zeros_like(lam64)).to(lam.dtype))
            neg = torch.zeros_like(neg).index_copy_(0, jdx, bad)
        if bool(neg.any()) and not low:
            j = int(torch.nonzero(neg)[0])
            raise IndefiniteOperatorError(
                f"the operator is not positive semi-definite: a CG direction (from the residuals of "
                f"outputs {idx.tolist()}) has <p, M p> = {float(lam[j]):.3g} < 0 with |p| = 1, |M p| = "
                f"{float(qn[j]):.3g}; the mixture's component covariances must be PSD, and in float32 rounding can "
                f"cause this: retry with dtype=torch.float64"
            )
        ok = lam > tau * qn  # null directions (reached by rounding) carry no step
        U, lam = U[:, ok], lam[ok]
        if lam.numel() == 0:
            stop = "stalled"
            break
        PR = U.T @ (Z @ R.T)  # [directions, o]: <z_j, r_o>
        alpha = (PR / lam[:, None]) * run.to(PR.dtype)  # frozen outputs take no step
        C = U @ alpha  # [s, o]: the step in the orthonormal basis Z
        D.addmm_(C.T, Z)
        R.addmm_(C.T, Q, alpha=-1)
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
        # refine: every output still running has cut its residual by ``reduction`` since the sweep began (a frozen
        # output takes no steps, so its residual says nothing about how far this sweep has come)
        going = live & ~frozen
        if bool(going.any()) and float((rel_o * rn / torch.where(live, r0_norm, 1.0))[going].max()) <= reduction:
            stop = "refine"
            break
    carry = (Pp, Qp, Hinv) if Pp is not None and Qp is not None else None
    return D, stop, it, residuals, explained, n_active, carry


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
#: dtype of the inner operator (float64: no inner sweeps; see ``pcg``). A bfloat16 sweep stops at a tenfold cut
#: (one digit per refinement step): asked for more, its recurrence plateaus after a few-fold cut and the sweep
#: spends tens of steps there before the stagnation window ends it; short sweeps continued from the true residual
#: converge in fewer steps in all (``docs/measurements.md``, "Mixture solver default").
SWEEP_REDUCTION = {"float32": 1e-6, "bfloat16": 1e-1}
#: Iteration budget of one inner sweep per dtype (None: no limit beyond ``maxiter``; tests shrink it to force
#: the bfloat16 -> float32 -> float64 fallbacks).
SWEEP_MAXITER: dict = {"float32": None, "bfloat16": None}
#: A bfloat16 or float32 sweep ends (``"stagnated"``) when its recurrence residual has not fallen by 10 % in this
#: many steps (rounding, not the Krylov space, limits it; the next sweep goes on from the true residual). CG's
#: residual norm also plateaus on its own (a 10-step window ends MNIST's first bfloat16 sweep threefold above where
#: it goes on to), so the window is long.
STAGNATION_STEPS = 30
#: The float32-updated true residual is recomputed as ``rhs - M x`` in float64 once it has fallen by this factor
#: since the last float64 residual (its float32 rounding, ~eps32 times that residual, would otherwise stay in it).
RECOMPUTE_FALL = 1e-3
#: A reduced-precision sweep that leaves the true residual above this fraction of the previous one has stalled: the
#: remaining sweeps run one precision up, bfloat16 -> float32 -> float64 (``solver_info["fallback"]``).
BF16_STALL = 0.5


def pcg(exact: Precision, space: Space, rhs, *, tol: float, fvu_tol: float, residual_tol: float, window: int,
        maxiter: int, progress: bool, x0=None, inner: Precision | None = None, max_sweeps: int = 20,
        fallback: Precision | None = None, res0=None, recycle=None):
    """Block PCG with true-residual checks and iterative refinement, one system per row of ``rhs [o, n]``;
    returns ``(x [o, n], info, res)`` with ``res = rhs - M x`` in float64.

    The excess-FVU estimate: CG minimises the energy-norm error, the excess mean squared error of the iterate; in
    exact arithmetic ``||e_k||^2 = sum_{j >= k} alpha_j (r_j . z_j)``, and the sum over the next ``window`` steps is
    the Hestenes-Stiefel lower-bound estimate (Strakos & Tichy 2002), divided by the variance explained so far,
    ``x_k . (rhs + r_k) - rhs[:, 0]^2`` (pooled over outputs; the first entry of a row is the constant feature's,
    ``E[f]``), a proxy for Var(f). Outputs that meet the rules on their own are frozen (``_inner_pcg``) and unfrozen
    if the true residual disagrees.

    ``exact``: the float64 precision (true residuals, every convergence decision). Each sweep runs PCG with
    ``inner`` (default ``exact``; float32 or bfloat16 for mixed precision) on the true residual and adds its
    correction; a sweep ends on the rules of the module docstring, on a residual reduction of
    ``SWEEP_REDUCTION[dtype]`` (``"refine"``) or when every direction is null (``"stalled"``). ``fallback`` (float32,
    with a bfloat16 ``inner``) updates the residual between sweeps (``res - M d``); a bfloat16 sweep that reduces the
    true residual by less than ``BF16_STALL`` (or raises it: its correction is discarded) hands the remaining sweeps
    to float32, a float32 one to float64 (``info["fallback"]``: ``{"to", "after_sweep", "reason"}`` per switch).
    ``x0``: the start (default 0); ``res0``: its residual ``rhs - M x0`` if the caller has it (computed with
    ``fallback``, else ``exact``). ``recycle``: ``(basis, m_basis)``, earlier corrections ``[m, n]`` and M applied to
    them: the start is then the best one in ``x0 + span(basis)`` (:func:`galerkin_start`; needs ``res0``), reported
    in ``info["galerkin_start"]``.
    """
    rhs_norm = _norm(space, rhs)
    galerkin = None
    if x0 is None:
        x, res = rhs.new_zeros(rhs.shape), rhs
    else:
        x = x0
        res = rhs - (fallback or exact).matvec(x0) if res0 is None else res0
        if recycle is not None:
            basis, m_basis = recycle
            x, res, C = galerkin_start(x0, res, basis, m_basis, space)
            galerkin = {"basis": int(C.shape[1]), "initial_relative_residual": _relative(space, res, rhs_norm)[1],
                        "plain_warm_relative_residual": _relative(space, res0 - m_basis, rhs_norm)[1]}
    del x0, res0, recycle
    with progress_bar(total=maxiter, desc="mixture CG", quiet=not progress) as bar:
        x, info, res = _sweeps(exact, inner or exact, fallback, space, rhs, rhs_norm, x, res, bar, tol=tol,
                               fvu_tol=fvu_tol, residual_tol=residual_tol, window=window, maxiter=maxiter,
                               max_sweeps=max_sweeps)
    if galerkin is not None:
        info["galerkin_start"] = galerkin
    return x, info, res


def galerkin_start(anchor, ra, basis, m_basis, space: Space):
    """The best start in ``anchor + span(basis)``: ``(x0, res0, coefficients [o, m])``.

    ``basis``, ``m_basis``: ``m`` vectors ``[m, n]`` and the operator applied to them (``M D_j``); ``anchor``, ``ra =
    rhs - M anchor``: ``[o, n]``. For each output ``o`` the coefficients solve the Galerkin equations
    ``(D^T M D) c_o = D^T ra_o`` (pseudo-inverse), which minimise the energy-norm error, i.e. the excess mean
    squared error, of ``anchor_o + D c_o`` over the span (Krylov-subspace recycling with the previous checkpoint's
    corrections: the operator is the same at every checkpoint, only the right-hand side changes). ``res0 = ra -
    (M D) c`` (projected with ``space``) is the start's residual without an operator application. On a singular
    operator the start stays in ``anchor + P range(M)`` when each ``D_j`` does (corrections of earlier solves).
    """
    import torch

    G = space.gram(basis, m_basis)
    G = 0.5 * (G + G.T)
    w, V = torch.linalg.eigh(G)
    keep = w > GALERKIN_RTOL * w[-1].clamp(min=0) if w.numel() else w > 0
    if not bool(keep.any()):
        return anchor, ra, ra.new_zeros(ra.shape[0], 0)
    Ginv = (V[:, keep] / w[keep]) @ V[:, keep].T
    C = space.gram(ra, basis) @ Ginv  # [o, m]
    return anchor + C @ basis, space.project_(ra - C @ m_basis), C


def _sweeps(op64: Precision, inner: Precision, fallback: Precision | None, space: Space, rhs, rhs_norm, x, res, bar,
            *, tol, fvu_tol, residual_tol, window, maxiter, max_sweeps):
    """The refinement sweeps of ``pcg`` (see there)."""
    import torch

    o = rhs_norm.shape[0]
    gains: list = []
    frozen = torch.zeros(o, dtype=torch.bool, device=rhs_norm.device)
    frozen_err = torch.zeros_like(rhs_norm)
    residuals, explained, sweeps, n_active = [], [], [], []
    it, stop, converged = 0, "maxiter", False
    # ref: the true relative residual at the last float64 recomputation
    true_rel, ref = _relative(space, res, rhs_norm)
    est = None
    fell_back: list = []
    update = fallback  # the precision of the residual updates between sweeps (None: rhs - M x in float64)
    exact = update is None  # res is rhs - M x in float64 (else updated with the float32 operator)
    carry = None

    def meets(rel: float, est: float | None) -> bool:
        """The stopping rule of the module docstring, on a true relative residual."""
        return rel <= tol or (est is not None and est <= fvu_tol and rel <= residual_tol)

    for _ in range(max_sweeps):
        # E[f^2] - E[(f - p)^2] - E[f]^2 per output (the constant feature has E[1 * f] = E[f])
        explained0 = space.dot(x, rhs) + space.dot(x, res) - rhs[:, 0] ** 2
        # an output stays frozen only if its true residual meets the rule on its own (its error estimate from when
        # it was frozen); one frozen on its recurrence's residual can be above tol in truth: go on
        own_est = _per_output_fvu(frozen_err, explained0)
        unfreeze = frozen & (true_rel > tol) & ((true_rel > residual_tol) | (own_est > fvu_tol))
        if bool((frozen & ~unfreeze).all()):  # another sweep with every output frozen: reopen the unconverged
            unfreeze = frozen & (true_rel > tol)
        frozen &= ~unfreeze
        frozen_err.masked_fill_(unfreeze, 0.0)
        name = dtype_name(inner.dtype)
        budget = maxiter - it
        if SWEEP_MAXITER.get(name) is not None:
            budget = min(budget, SWEEP_MAXITER[name])
        # bfloat16 sweeps keep their CG vectors in float32 (half the memory traffic; their accuracy is set by the
        # 2^-8 GEMMs); float32 and float64 sweeps keep them in float64
        low = inner.dtype == torch.bfloat16
        d, stop, n, rh, eh, na, carry_new = _inner_pcg(
            inner, space, res.to(inner.work_dtype) if low else res, rhs_norm, explained0, gains, frozen, frozen_err,
            tol=tol, fvu_tol=fvu_tol, residual_tol=residual_tol, window=window, maxiter=budget,
            reduction=SWEEP_REDUCTION.get(name, 0.0), bar=bar, precondition=inner if low else op64, verify=op64,
            carry=carry)
        it += n
        residuals += rh
        explained += eh
        n_active += na
        if inner.dtype != torch.float64:  # rounding moves the correction off the subspace (module docstring)
            d = space.project_(d)
        x_new = x + d.to(x.dtype)
        prev = float(true_rel.max())
        # float64 at once where the float32 update would be replaced by it anyway: the sweep's recurrence (which
        # tracks the true residual) met the stopping rule, or has fallen 1000-fold since the last float64 residual
        # (at half the fall, as the recurrence tracks the true residual only to a few per cent)
        exact_new = update is None or stop in ("fvu", "residual") or bool(rh and rh[-1] <= 0.5 * RECOMPUTE_FALL * ref)
        if not exact_new:  # the float32 update of the true residual; float64 confirms any convergence
            res_new = space.project_(res - update.matvec(d))
            rel_o, rel = _relative(space, res_new, rhs_norm)
            # its rounding, ~eps32 times the residual at the last float64 recomputation, stays in res: recompute
            exact_new = rel <= RECOMPUTE_FALL * ref
        if exact_new:
            res_new = space.project_(_residual(op64, rhs, x_new))
            rel_o, rel = _relative(space, res_new, rhs_norm)
        est = _pooled_estimate(gains, frozen, frozen_err, explained[-1] if explained else 0.0, window)
        converged = meets(rel, est)
        if converged and not exact_new:  # the decision is made on rhs - M x in float64 only
            res_new = space.project_(_residual(op64, rhs, x_new))
            exact_new = True
            rel_o, rel = _relative(space, res_new, rhs_norm)
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
            fell_back.append({"to": dtype_name(up.dtype), "after_sweep": len(sweeps),
                              "reason": f"a {name} sweep took the true relative residual from {prev:.3g} to {rel:.3g}"
                                        + (" (correction discarded)" if entry["discarded"] else "")})
            inner, carry = up, None
            if up is op64:  # float64 sweeps: every residual is rhs - M x in float64
                update = None
                if not exact:
                    res = space.project_(_residual(op64, rhs, x))
                    true_rel, _ = _relative(space, res, rhs_norm)
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
        carry = carry_new
        if converged or it >= maxiter or (stop == "stalled" and rel > 0.5 * prev) or n == 0 or bf16_stalled:
            break
    if not exact:  # the reported residual is always rhs - M x in float64
        res = _residual(op64, rhs, x)
        true_rel, rel = _relative(space, res, rhs_norm)
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


def _residual(op64: Precision, rhs, x):
    """``rhs - M x`` in float64, written into the operator's answer (one ``[o, n]`` tensor, not two)."""
    import torch

    Mx = op64.matvec(x)
    return torch.sub(rhs, Mx, out=Mx)
