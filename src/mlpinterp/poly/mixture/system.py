"""The normal equations of the exact mixture quadratic, set up once for the generic solver of ``pcg.py``.

:func:`solve_quadratic` is where the mixture (in its support coordinates, ``coordinates.py``) meets the solver: it
checks the memory, takes the operators of ``operator.py`` in the precisions the solve uses (cached per mixture),
builds the right-hand side ``sum_k pi_k M_k theta_k`` from the components' ridge quadratics, the anchor and its
residual in the flat form of ``operator.flatten_theta`` (one ``[o, 1 + r + r^2]`` row per output), hands the
solver :class:`~mlpinterp.poly.mixture.pcg.Precision` and :class:`~mlpinterp.poly.mixture.pcg.Space` objects
(callables only: the solver knows no mixture), and turns the flat answer back into tensors ``[c, b, A]`` in u
with the state a later warm start reuses.

Which solution. The normal equations are consistent (the right-hand side lies in the range of M), every solution
gives the same polynomial on the components' supports (the same mixture error), and the solutions differ off
them. PCG (block PCG too: each of its directions is a combination of preconditioned residuals) started at an
anchor ``theta_0`` with a positive semi-definite preconditioner P keeps its iterates in
``theta_0 + P range(M)``, which contains exactly one solution: the solution closest to the anchor in the metric
``P^+`` (``argmin (theta - theta_0) . P^+ (theta - theta_0)`` subject to ``M theta = rhs``). That is the solution
returned. The default anchor (``init="pooled"``) is the exact quadratic under the pooled Gaussian: off the
components' supports the polynomial stays as close as the mixture allows to the pooled-Gaussian optimum (and CG
starts close to the answer); ``init="zero"`` gives the minimum-norm solution in the metric ``P^+``. A warm start
from an earlier result under the same mixture starts at the new anchor plus the earlier correction
``theta - theta_0``, which stays in the same affine set, so it returns the cold start's answer; on a non-singular
operator the start is the energy-optimal combination of the earlier result's per-output corrections
(``pcg.galerkin_start``: the operator is the same at every checkpoint, so its action on them is known from the
earlier solve).
"""

from __future__ import annotations

import time
import warnings
import weakref

import numpy as np

from mlpinterp.poly.mixture.coordinates import SupportCoordinates
from mlpinterp.poly.mixture.operator import (
    auto_dtype,
    cached_operator,
    flatten_theta,
    precision_of,
    space_of,
    unflatten_theta,
)
from mlpinterp.poly.mixture.pcg import dtype_name, pcg
from mlpinterp.utils.malloc import fix_mmap_threshold, release_free_memory, reuse_heap
from mlpinterp.utils.memory import require


def operator_bytes(K: int, r: int, d_out: int) -> float:
    """Bytes of the matrix-free solve, float64 (an upper bound for the lower precisions): the K component
    covariances in u with their working copies and preconditioner blocks (4 K r^2) and CG's iterate, residual,
    search direction, operator image, anchor and refinement vectors over the outputs, with the freed ones that
    glibc's heap keeps for reuse during the solve (``utils.malloc.reuse_heap``; 20 d_out r^2 in all: measured at
    MNIST scale, docs/measurements.md)."""
    return 8.0 * (4 * K + 20 * d_out) * r * r


def solve_quadratic(coords: SupportCoordinates, d_out: int, rhs_terms, anchor, anchor_factors, plain_start, state, *,
                    tol, fvu_tol, residual_tol, window, maxiter, preconditioner, init, device, dtype, progress,
                    t_start):
    """Matrix-free CG for the exact mixture quadratic in u: ``(tensors [c, b, A] in u, solver info, warm state)``.

    rhs_terms : the components' degree-2 ridge quadratics in u (``coordinates.quadratics_in_u``: K
        ``FactoredQuadratic`` or a generator of K ``(c, b, A)`` arrays).
    anchor : the pooled-Gaussian quadratic ``(c, b, A)`` in u (``init="pooled"``), else None (the zero anchor);
        anchor_factors : its ``FactoredQuadratic`` (an MLP's) or None.
    plain_start : tensors ``[c, b, A]`` in u of a warm start without a usable state (a plain starting point), or None.
    state : the ``_cg_state`` of a warm start under the same mixture and ``init``, or None.
    The other arguments are ``fit_mixture``'s (``dtype``: a torch dtype or ``"auto"``).
    """
    import torch

    fix_mmap_threshold()  # memory; see mlpinterp.utils.malloc
    K, r = coords.means.shape
    nbytes = operator_bytes(K, r, d_out)
    require(nbytes,
            f"the matrix-free quadratic solve (K = {K} components on a support of rank r = {r}, "
            f"{d_out} outputs)", "merge components, or reduce the inputs' dimension (e.g. PCA) before fitting")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    op64 = cached_operator(coords, preconditioner, dev, torch.float64)
    requested = dtype
    reason = "requested"
    if dtype == "auto":
        dtype, reason = auto_dtype(op64, dev)
    inner = op64 if dtype == torch.float64 else cached_operator(coords, preconditioner, dev, dtype)
    fallback = cached_operator(coords, preconditioner, dev, torch.float32) if dtype == torch.bfloat16 else None
    ops = list({id(op): op for op in (op64, inner, fallback) if op is not None}.values())  # distinct operators
    n_apply = [op.n_apply for op in ops]
    as_t = lambda ts: tuple(torch.as_tensor(t, device=dev, dtype=torch.float64) for t in ts)  # noqa: E731
    if isinstance(rhs_terms, list):  # an MLP: from the ridge factors, never the [o, r, r] tensors (factored.py)
        rhs = op64.apply_factored(rhs_terms)
    else:  # one component's [o, r, r] tensor at a time (a generator), not all K (400 MB at MNIST scale)
        rhs = op64.apply(None, components=(as_t(t) for t in rhs_terms))
    rhs = flatten_theta(rhs)
    del rhs_terms
    space = space_of(r)
    exact, sweeps = precision_of(op64), precision_of(inner)
    low = precision_of(fallback) if fallback is not None else None
    # the anchor (a [o, 1 + r + r^2] float64 tensor, 49 MB at MNIST scale) and
    # ra = rhs - M anchor, with which the solution's M (x - anchor) = ra - res costs nothing: float64 from the
    # factors for an MLP, else with the fallback or float64 operator
    if anchor is None:
        a, ra = torch.zeros(rhs.shape, dtype=torch.float64, device=dev), rhs
    else:
        a = flatten_theta(as_t(anchor))
        if anchor_factors is not None:
            Ma = flatten_theta(op64.apply_factored(anchor_factors))
        else:
            Ma = (low or exact).matvec(a)
        ra = torch.sub(rhs, Ma, out=Ma)
    t_rhs = time.perf_counter()
    structure = op64.structure
    start = init
    x0, res0 = (a, ra) if init == "pooled" else (None, None)
    recycle = None
    if state is not None:
        corr = state["correction"].to(dev)
        start = "warm"
        # Galerkin over the previous corrections (galerkin_start) on a non-singular operator; on a singular one the
        # corrections' null components make the Galerkin system ill-posed: the plain correction instead
        if state.get("m_correction") is not None and structure == "nonsingular":
            x0, res0, recycle = a, ra, (corr, state["m_correction"].to(dev))
        else:
            x0, res0 = a + corr, None
    elif plain_start is not None:
        t = list(plain_start) + [np.zeros((d_out,) + (r,) * j) for j in range(len(plain_start), 3)]
        x0, res0, start = flatten_theta(as_t(t)), None, "warm (plain start)"
    with reuse_heap():  # the CG vectors from the heap's freed blocks, not fresh pages (mlpinterp.utils.malloc)
        x, sinfo, res = pcg(exact, space, rhs, tol=tol, fvu_tol=fvu_tol, residual_tol=residual_tol, window=window,
                            maxiter=maxiter, progress=progress, x0=x0, inner=sweeps, fallback=low, res0=res0,
                            recycle=recycle)
    del x0, res0, recycle  # memory: a warm start's initial iterate and residual (98 MB at MNIST scale), stale by now
    # bfloat16 rounding adds components along null directions of a singular operator that no residual sees
    canonical = structure == "nonsingular" or (start != "warm (plain start)" and dtype != torch.bfloat16 and (
        start != "warm" or state.get("canonical", True)))
    sinfo.update(method="pcg", preconditioner=preconditioner, init=start, device=str(dev),
                 dtype=dtype_name(dtype), dtype_requested=dtype_name(requested), dtype_reason=reason,
                 operator_structure=structure,
                 null_directions_found=op64.null_directions, canonical=canonical,
                 answer="canonical" if canonical else "canonical on the support",
                 operator_applications=sum(op.n_apply - n for op, n in zip(ops, n_apply, strict=True)),
                 operator_applications_by_dtype={dtype_name(op.dtype): op.n_apply - n
                                                 for op, n in zip(ops, n_apply, strict=True)},
                 setup_time_s=t_rhs - t_start)
    if structure != "nonsingular":
        sinfo["extension_note"] = (
            "the operator may be singular (every component is rank-deficient on the support): the polynomial is "
            "optimal on the mixture; off the components' supports it is "
            + ({"pooled": "the solution closest to the pooled-Gaussian quadratic", "zero": "the minimum-norm solution"}[init]
               + " in the preconditioner's metric" if canonical else
               ("one solution among many (bfloat16 rounding adds null-space components): use dtype='float64' "
                "for the canonical one" if dtype == torch.bfloat16 else
                "one solution among many (a plain warm start adds its null component): warm-start from a "
                "fit_mixture result under the same mixture for the canonical one"))
        )
    m_correction = ra - res  # M (x - anchor) = (rhs - M anchor) - (rhs - M x)
    del ra, res, rhs  # memory: not needed below (the right-hand side and residuals, 49 MB each at MNIST scale)
    new_state = {"coords": weakref.ref(coords), "init": init, "canonical": canonical,
                 "correction": (x - a).detach(), "m_correction": m_correction}
    del a
    if not sinfo["converged"]:
        warnings.warn(
            f"fit_mixture: CG did not converge in {sinfo['iterations']} iterations (true relative residual "
            f"{sinfo['relative_residual']:.2e}, estimated excess FVU {sinfo['excess_fvu_estimate']}; stopped by "
            f"{sinfo['stopped_by']}): raise maxiter, or loosen tol / fvu_tol / residual_tol", RuntimeWarning,
            stacklevel=3)
    x = x.detach().to("cpu", torch.float64)
    c, b, A = unflatten_theta(x, r)
    tensors_u = [c.numpy().copy(), b.numpy().copy()]
    A = A.numpy()
    sym = A + np.swapaxes(A, 1, 2)  # 0.5 (A + A^T), one temporary instead of two
    sym *= 0.5
    tensors_u.append(sym)
    del x, A, c, b
    release_free_memory()
    return tensors_u, sinfo, new_state
