"""Public entry point of the exact mixture solvers of degree >= 2: ``fit_mixture`` (Rigg & Belrose 2025, §3.4, §4).

``method="cg"`` (degree 2, any size) is the matrix-free solver of ``pcg.py`` on the operator of ``operator.py``; ``method="dense"``
(any degree, small support) the moment-table solve of ``moment_dense.py``. Both work in the whitened
support coordinates of ``coordinates.py``.
"""

from __future__ import annotations

import time
import warnings
import weakref
from typing import Any

import numpy as np

from mlpinterp.gaussian.distributions import GaussianMixture
from mlpinterp.networks import Network, validate_network
from mlpinterp.poly.approximant import DensePolynomial, RidgePolynomial
from mlpinterp.poly.mixture.coordinates import coordinates_of, quadratic_in_u, tensors_in_u, u_to_raw
from mlpinterp.poly.mixture.factored import factored_quadratic_in_u
from mlpinterp.poly.mixture.moment_dense import solve_dense
from mlpinterp.poly.mixture.operator import (
    PRECONDITIONERS,
    MixtureOperator,
    apply_cast,
    relative_residual,
    theta_norm,
    theta_sub,
)
from mlpinterp.poly.mixture.pcg import galerkin_start, pcg
from mlpinterp.poly.ridge import fit_ridge
from mlpinterp.utils.malloc import fix_mmap_threshold, release_free_memory
from mlpinterp.utils.memory import require

_METHODS = ("auto", "exact", "cg", "dense")


_FAST_BF16: dict = {}


def cpu_has_fast_bfloat16() -> bool:
    """True when a bfloat16 matrix product runs at least 2x faster than float32 on this CPU.

    Timed once per process and thread count (best of 3 products of two 512 x 512 matrices): CPUs with AVX512-BF16
    or AMX run bfloat16 GEMMs several times faster; without them torch emulates bfloat16 and is slower than
    float32.
    """
    import torch

    key = torch.get_num_threads()
    if key not in _FAST_BF16:
        a = torch.randn(512, 512)
        times = {}
        for dt in (torch.float32, torch.bfloat16):
            x = a.to(dt)
            x @ x
            best = np.inf
            for _ in range(3):
                t = time.perf_counter()
                x @ x
                best = min(best, time.perf_counter() - t)
            times[dt] = best
        _FAST_BF16[key] = bool(times[torch.bfloat16] * 2 <= times[torch.float32])
    return _FAST_BF16[key]


def _torch_dtype(dtype):
    import torch

    if isinstance(dtype, str) and dtype == "auto":
        return "auto"
    if dtype in (None, "float64", torch.float64, np.float64):
        return torch.float64
    if dtype in ("float32", torch.float32, np.float32):
        return torch.float32
    if dtype in ("bfloat16", torch.bfloat16):
        return torch.bfloat16
    raise ValueError(f"dtype must be torch.float64, torch.float32 or torch.bfloat16 (or 'float64'/'float32'/"
                     f"'bfloat16'/'auto'), got {dtype!r}")



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
    warm_start=None,
    residual_tol: float = 1e-4,
    device=None,
    dtype="auto",
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
    tol : CG has converged when the true relative residual ``||rhs - M theta|| / ||rhs||`` (recomputed in
        float64) of every output is <= tol ...
    fvu_tol : ... or when the estimated excess FVU of the iterate over the exact optimum (CG's energy-norm
        error summed over the last ``window`` steps, relative to the explained variance; see ``pcg.pcg``)
        is <= fvu_tol and the true relative residual is <= ``residual_tol``. Pass 0 to stop on the residual only.
    window : number of CG steps in the excess-FVU estimate.
    maxiter : CG iteration limit (all refinement sweeps together).
    preconditioner : ``"diagonal"`` (default), ``"pooled"`` or ``"none"`` (see ``operator``).
    init : CG's anchor and start: ``"pooled"`` (default; the exact quadratic under the pooled Gaussian) or
        ``"zero"``. On a singular operator the answer off the components' supports is the solution closest to
        the anchor in the preconditioner's metric (``"zero"``: the minimum-norm one; see ``pcg``).
    warm_start : the previous checkpoint's ``fit_mixture`` result under the same mixture (method ``"cg"``, same
        ``init``): CG starts from the new anchor plus the best combination of its per-output corrections (the
        Galerkin start of ``pcg.galerkin_start``, on a non-singular operator; the plain correction on a
        singular one; ``solver_info["galerkin_start"]`` gives its initial residual) and returns the cold start's
        answer, to the solver's tolerance. Any other degree <= 2 polynomial is used as a plain starting point
        (``solver_info["canonical"]`` is then False on a singular operator).
    residual_tol : largest true relative residual accepted with the excess-FVU stop (default 1e-4).
    device : torch device for the CG path (default: CUDA when available, else CPU).
    dtype : ``"auto"`` (default), ``torch.float64``, ``torch.float32``: float32 operator applications inside CG, float64
        true residuals and iterative refinement outside (the same stopping rules, checked in float64; float64
        sweeps once float32 ones stall, ``solver_info["fallback"]``);
        ``torch.bfloat16``: the operator's GEMMs in bfloat16 (float32 accumulation) inside CG, float32 updates
        of the true residual between sweeps, float32 sweeps once bfloat16 ones stall and float64 sweeps once float32
        ones stall (``solver_info["fallback"]``, a list of the switches),
        convergence always decided on the float64 residual ``rhs - M theta``. On an operator that is not provably
        non-singular the bfloat16 answer is the documented solution on the components' supports (every solution of
        the normal equations is: the same polynomial there, to the solver's tolerance) but not off them: bfloat16
        rounding adds a polynomial that vanishes on every component's support (``solver_info["canonical"]`` False,
        ``solver_info["answer"]`` ``"canonical on the support"``). ``"auto"`` picks bfloat16 on a CPU with fast
        bfloat16 GEMMs (``cpu_has_fast_bfloat16``), float32 on a non-singular operator otherwise, and float64 on an
        operator that is not provably non-singular without fast bfloat16 (there float32 sweeps stall and fall back:
        slower than float64 on MNIST's class covariances, ``docs/measurements.md``); so the default answer is the
        canonical one everywhere on a non-singular operator, and on a singular one with fast bfloat16 the canonical
        one on the supports only (``dtype="float64"`` for the canonical one everywhere). ``solver_info["dtype"]``
        says which precision ran and ``solver_info["dtype_reason"]`` why.
    progress : show a progress bar over CG iterations (``mlpinterp.utils.progress``).

    Returns
    -------
    ``DensePolynomial`` with raw-coordinate tensors ``[d_out], [d_out, d], [d_out, d, d], ...``;
    ``p.solver_info`` holds ``method``, ``iterations``, ``relative_residual`` (recomputed explicitly at the
    end), ``converged`` (true only if the true residual met the rules above), ``stopped_by`` (``"residual"``,
    ``"fvu"``, ``"maxiter"``, ``"stalled"`` or ``"refine"``), ``excess_fvu_estimate``, ``operator_structure``
    (``"nonsingular"``, ``"singular"``, ``"possibly singular"``), ``init`` (``"pooled"``, ``"zero"``, ``"warm"`` or
    ``"warm (plain start)"``), ``canonical`` (the answer is the documented one, not just any solution), ``answer``
    (``"canonical"``, or ``"canonical on the support"``: the documented polynomial on every component's support,
    another solution of the normal equations off them),
    ``support_rank`` r, ``singular`` and a ``note`` on the support, ``wall_time_s``, ``cpu_time_s``, and (CG) the residual and
    explained-variance histories. The dense path reports the Gram matrix's condition number and rank.

    Raises
    ------
    TypeError : ``network``/``mixture`` of the wrong type.
    ValueError : dimension mismatch, bad degree/method/preconditioner/tol/maxiter/dtype/warm_start, ``"cg"``
        with degree != 2, or a dense problem too large (the message gives the largest support dimension that fits).
    IndefiniteOperatorError : CG met a direction with ``<p, M p> < 0`` beyond rounding.

    Warns
    -----
    RuntimeWarning : CG stopped without meeting the convergence rules (``solver_info["converged"]`` is False).
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
    if preconditioner not in PRECONDITIONERS:
        raise ValueError(f"preconditioner must be one of {PRECONDITIONERS}, got {preconditioner!r}")
    if not (isinstance(tol, float | int) and tol > 0):
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    if not (isinstance(fvu_tol, float | int) and fvu_tol >= 0):
        raise ValueError(f"fvu_tol must be a non-negative number, got {fvu_tol!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if init not in ("pooled", "zero"):
        raise ValueError(f"init must be 'pooled' or 'zero', got {init!r}")
    if not (isinstance(residual_tol, float | int) and residual_tol > 0):
        raise ValueError(f"residual_tol must be a positive number, got {residual_tol!r}")
    if isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 1:
        raise ValueError(f"maxiter must be a positive integer, got {maxiter!r}")
    tdtype = _torch_dtype(dtype)
    if method in ("auto", "exact"):
        method = "cg" if degree == 2 else "dense"
    if method == "cg" and degree != 2:
        raise ValueError(f"method='cg' solves degree 2 only, got degree={degree}; use method='dense'")

    if warm_start is not None:
        _check_warm_start(warm_start, network, method)
    coords = coordinates_of(mixture)
    info: dict[str, Any] = {
        "network": type(network).__name__, "activation": network.activation,
        "distribution": f"GaussianMixture(K={mixture.K})", "degree": degree, "d_in": network.d_in,
    }
    if method == "dense":
        tensors_u, sinfo = solve_dense(network, mixture, coords, degree)
        info["method"] = "exact-mixture-dense"
    else:
        tensors_u, sinfo, state = _solve_cg(network, mixture, coords, tol=float(tol), fvu_tol=float(fvu_tol),
                                     residual_tol=float(residual_tol), window=window, maxiter=maxiter,
                                     preconditioner=preconditioner, init=init, warm_start=warm_start, device=device,
                                     dtype=tdtype, progress=progress, t_start=t_start)
        info["method"] = "exact-mixture-cg"
    sinfo["support_rank"] = coords.r
    sinfo["singular"] = bool(coords.r < mixture.d)
    sinfo["note"] = (
        f"solved on the mixture's support (rank {coords.r} of {mixture.d}); extended off it by orthogonal projection"
        if coords.r < mixture.d else "mixture covariance is non-singular"
    )
    raw = u_to_raw(tensors_u, coords)
    sinfo["wall_time_s"] = time.perf_counter() - t_start
    sinfo["cpu_time_s"] = time.process_time() - cpu_start  # all threads; the honest figure on a shared CPU
    info["solver_info"] = sinfo
    out = DensePolynomial(tuple(raw), info=info)
    if method == "cg":
        object.__setattr__(out, "_cg_state", state)  # for warm starts (pcg: anchor + correction)
    return out



_OPERATORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def operator_bytes(K: int, r: int, d_out: int) -> float:
    """Bytes of the matrix-free solve, float64 (an upper bound for the lower precisions): the K component
    covariances in u with their working copies and preconditioner blocks (4 K r^2) and CG's iterate, residual,
    search direction, operator image, anchor and refinement vectors over the outputs (12 d_out r^2)."""
    return 8.0 * (4 * K + 12 * d_out) * r * r


def _operator(mixture: GaussianMixture, coords, preconditioner: str, device, dtype) -> MixtureOperator:
    """The mixture's operator and preconditioner, cached per (mixture, preconditioner, device, dtype)."""
    ops = _OPERATORS.setdefault(mixture, {})
    key = (preconditioner, str(device), str(dtype))
    if key not in ops:
        like = next((op for k, op in ops.items() if k[0] == preconditioner and k[1] == str(device)), None)
        structure = next((op.structure for op in ops.values() if op.structure == "nonsingular"), None)
        ops[key] = MixtureOperator(coords, mixture.weights, preconditioner, device, dtype, structure=structure,
                                    like=like)
    return ops[key]


def _check_warm_start(p, network: Network, method: str) -> None:
    if method == "dense":
        raise ValueError("warm_start applies to method='cg' only (the dense solve is direct)")
    if not isinstance(p, DensePolynomial | RidgePolynomial):
        raise TypeError(f"warm_start must be a DensePolynomial or RidgePolynomial, got {type(p).__name__}")
    if p.degree > 2 or p.d_in != network.d_in or p.d_out != network.d_out:
        raise ValueError(f"warm_start must be a polynomial of degree <= 2 with d_in = {network.d_in} and d_out = "
                         f"{network.d_out}, got degree {p.degree}, d_in {p.d_in}, d_out {p.d_out}")


def _solve_cg(network: Network, mixture: GaussianMixture, coords, *, tol, fvu_tol, residual_tol, window, maxiter,
              preconditioner, init, warm_start, device, dtype, progress, t_start):
    """Matrix-free CG branch of ``fit_mixture``: tensors ``[c, b, A]`` in u and the solver diagnostics."""
    import torch

    fix_mmap_threshold()  # memory; see mlpinterp.utils.malloc
    require(operator_bytes(mixture.K, coords.r, network.d_out),
            f"the matrix-free quadratic solve (K = {mixture.K} components on a support of rank r = {coords.r}, "
            f"{network.d_out} outputs)", "merge components, or reduce the inputs' dimension (e.g. PCA) before fitting")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    op64 = _operator(mixture, coords, preconditioner, dev, torch.float64)
    requested = dtype
    reason = "requested"
    if dtype == "auto":
        if dev.type == "cpu" and cpu_has_fast_bfloat16():
            dtype, reason = torch.bfloat16, "auto: fast bfloat16 GEMMs on this CPU" + (
                ", non-singular operator (the canonical answer)" if op64.structure == "nonsingular" else
                f"; the operator is {op64.structure} (the canonical answer on the components' supports)")
        elif op64.structure == "nonsingular":
            dtype, reason = torch.float32, "auto: non-singular operator, no fast bfloat16 GEMMs on this device"
        else:  # float32 sweeps stall on singular operators and fall back to float64: float64 from the start
            dtype, reason = torch.float64, (f"auto: the operator is {op64.structure} and this device has no fast "
                                            "bfloat16 GEMMs")
    inner = op64 if dtype == torch.float64 else _operator(mixture, coords, preconditioner, dev, dtype)
    fallback = _operator(mixture, coords, preconditioner, dev, torch.float32) if dtype == torch.bfloat16 else None
    ops = list({id(op): op for op in (op64, inner, fallback) if op is not None}.values())  # distinct operators
    n_apply = [op.n_apply for op in ops]
    as_t = lambda ts: tuple(torch.as_tensor(t, device=dev, dtype=torch.float64) for t in ts)  # noqa: E731
    ridges = [fit_ridge(network, comp, 2) for comp in mixture.components]
    factors = [factored_quadratic_in_u(p, coords) for p in ridges]
    if all(f is not None for f in factors):  # an MLP: from the ridge factors, never the [o, r, r] tensors (factored.py)
        rhs = op64.apply_factored(factors)
    else:  # one component's [o, r, r] tensor at a time (a generator), not all K (400 MB at MNIST scale)
        rhs = op64.apply(None, components=(as_t(quadratic_in_u(p, coords)) for p in ridges))
    del ridges, factors
    pooled = fit_ridge(network, mixture.pooled(), 2) if init == "pooled" else None  # the anchor's ridge quadratic
    pooled_factors = factored_quadratic_in_u(pooled, coords) if pooled is not None else None

    def anchor_residual(rhs, anchor):
        """``rhs - M anchor`` (float64 from the factors for an MLP, else with the fallback or float64 operator)."""
        if init != "pooled":
            return rhs
        if pooled_factors is not None:
            return theta_sub(rhs, op64.apply_factored(pooled_factors))
        return theta_sub(rhs, apply_cast(fallback or op64, anchor))

    t_rhs = time.perf_counter()
    structure = op64.structure

    shapes = [t.shape for t in rhs]

    def anchor_of():
        # (the zero anchor only when it is used: a [o, r, r] float64 tensor, 49 MB at MNIST scale)
        return (as_t(quadratic_in_u(pooled, coords)) if pooled is not None
                else tuple(torch.zeros(s, dtype=torch.float64, device=dev) for s in shapes))

    anchor = anchor_of()
    start = init
    # ra = rhs - M anchor (the anchor's residual; with it the solution's M (x - anchor) = ra - res costs nothing)
    ra = anchor_residual(rhs, anchor)
    x0, res0 = (anchor, ra) if init == "pooled" else (None, None)
    galerkin = None
    if warm_start is not None:
        state = getattr(warm_start, "_cg_state", None)
        if state is not None and state["mixture"]() is mixture and state["init"] == init:
            corr = tuple(torch.as_tensor(c, device=dev) for c in state["correction"])
            start = "warm"
            # Galerkin over the previous corrections (galerkin_start) on a non-singular operator; on a singular one
            # the corrections' null components make the Galerkin system ill-posed: the plain correction instead
            if state.get("m_correction") is not None and structure == "nonsingular":
                mcorr = tuple(torch.as_tensor(c, device=dev) for c in state["m_correction"])
                x0, res0, C = galerkin_start(anchor, ra, corr, mcorr)
                rhs_norm = theta_norm(rhs)
                galerkin = {"basis": int(C.shape[1]), "initial_relative_residual": relative_residual(res0, rhs_norm)[1],
                            "plain_warm_relative_residual": relative_residual(theta_sub(ra, mcorr), rhs_norm)[1]}
            else:
                x0, res0 = tuple(a + c for a, c in zip(anchor, corr, strict=True)), None
        else:
            t = tensors_in_u(warm_start, coords, warm_start.degree)
            t += [np.zeros((network.d_out,) + (coords.r,) * j) for j in range(len(t), 3)]
            x0, res0, start = as_t(t), None, "warm (plain start)"
    # memory: the anchor is not kept through the solve (49 MB at MNIST scale; a cold start's x0 is the
    # anchor itself) but built again for the correction below (the same deterministic values); nor is its
    # residual ra once a warm start has used it (recomputed below, the same values: one more operator application)
    del anchor
    if res0 is not ra:
        ra = None
    x, sinfo, res = pcg(op64, rhs, tol=tol, fvu_tol=fvu_tol, residual_tol=residual_tol, window=window,
                         maxiter=maxiter, progress=progress, x0=x0, inner=inner, fallback=fallback, res0=res0,
                         return_residual=True)
    del x0, res0  # memory: a warm start's initial iterate and residual (98 MB at MNIST scale), stale by now
    if galerkin is not None:
        sinfo["galerkin_start"] = galerkin
    # bfloat16 rounding adds components along null directions of a singular operator that no residual sees
    canonical = structure == "nonsingular" or (start != "warm (plain start)" and dtype != torch.bfloat16 and (
        start != "warm" or warm_start._cg_state.get("canonical", True)))
    sinfo.update(method="pcg", preconditioner=preconditioner, init=start, device=str(dev),
                 dtype=str(dtype).replace("torch.", ""), dtype_requested=str(requested).replace("torch.", ""),
                 dtype_reason=reason,
                 operator_structure=structure,
                 null_directions_found=op64.null_directions, canonical=canonical,
                 answer="canonical" if canonical else "canonical on the support",
                 operator_applications=sum(op.n_apply - n for op, n in zip(ops, n_apply, strict=True)),
                 operator_applications_by_dtype={str(op.dtype).replace("torch.", ""): op.n_apply - n
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
    anchor = anchor_of()
    if ra is None:
        ra = anchor_residual(rhs, anchor)
    m_correction = theta_sub(ra, res)  # M (x - anchor) = (rhs - M anchor) - (rhs - M x)
    del ra, res, rhs  # memory: not needed below (the right-hand side and residuals, 49 MB each at MNIST scale)
    state = {"mixture": weakref.ref(mixture), "init": init, "canonical": canonical,
             "correction": tuple((a - b).detach() for a, b in zip(x, anchor, strict=True)),  # fresh tensors
             "m_correction": m_correction}
    del anchor
    if not sinfo["converged"]:
        warnings.warn(
            f"fit_mixture: CG did not converge in {sinfo['iterations']} iterations (true relative residual "
            f"{sinfo['relative_residual']:.2e}, estimated excess FVU {sinfo['excess_fvu_estimate']}; stopped by "
            f"{sinfo['stopped_by']}): raise maxiter, or loosen tol / fvu_tol / residual_tol", RuntimeWarning, stacklevel=3)
    tensors_u = [t.detach().to("cpu", torch.float64).numpy() for t in x]
    del x
    release_free_memory()
    sym = tensors_u[2] + np.swapaxes(tensors_u[2], 1, 2)  # 0.5 (A + A^T), one temporary instead of two
    sym *= 0.5
    tensors_u[2] = sym
    return tensors_u, sinfo, state
