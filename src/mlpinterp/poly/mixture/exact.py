"""Public entry point of the exact mixture solvers of degree >= 2: ``fit_mixture`` (Rigg & Belrose 2025, §3.4, §4).

One pass, each step handing the next what it prepared: the components' single-Gaussian projections
(``ridge.fit_ridge``), the support coordinates and those projections in them (``coordinates.py``), one solve in u
(``method="dense"``: any degree, small support, ``moment_dense.py``; ``method="cg"``: degree 2, any size, the normal
equations of ``system.py`` solved by the generic block PCG of ``pcg.py``), and the answer mapped back to raw
coefficients once (``coordinates.u_to_raw``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mlpinterp.gaussian.distributions import GaussianMixture
from mlpinterp.networks import Network, validate_network
from mlpinterp.poly.approximant import DensePolynomial, RidgePolynomial
from mlpinterp.poly.mixture.coordinates import (
    coordinates_of,
    factored_quadratic_in_u,
    quadratic_in_u,
    quadratics_in_u,
    tensors_in_u,
    u_to_raw,
)
from mlpinterp.poly.mixture.moment_dense import solve_dense
from mlpinterp.poly.mixture.operator import PRECONDITIONERS
from mlpinterp.poly.mixture.system import solve_quadratic
from mlpinterp.poly.ridge import fit_ridge

_METHODS = ("auto", "exact", "cg", "dense")


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
        the anchor in the preconditioner's metric (``"zero"``: the minimum-norm one; see ``system``).
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
        bfloat16 GEMMs (``utils.hardware.cpu_has_fast_bfloat16``), float32 on a non-singular operator otherwise,
        and float64 on an operator that is not provably non-singular without fast bfloat16 (there float32 sweeps
        stall and fall back: slower than float64 on MNIST's class covariances, ``docs/measurements.md``); so the
        default answer is the canonical one everywhere on a non-singular operator, and on a singular one with fast
        bfloat16 the canonical one on the supports only (``dtype="float64"`` for the canonical one everywhere).
        ``solver_info["dtype"]`` says which precision ran and ``solver_info["dtype_reason"]`` why.
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
    pcg.IndefiniteOperatorError : CG met a direction with ``<p, M p> < 0`` beyond rounding.

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
    info: dict[str, Any] = {
        "network": type(network).__name__, "activation": network.activation,
        "distribution": f"GaussianMixture(K={mixture.K})", "degree": degree, "d_in": network.d_in,
    }
    # the single-Gaussian projections: of each component (the right-hand side: E_k[f z] = E_k[p_k z] for z of
    # degree <= ``degree``) and of the pooled Gaussian (CG's anchor)
    pooled_law = mixture.pooled() if method == "cg" and init == "pooled" else None
    ridges = [fit_ridge(network, comp, degree) for comp in mixture.components]
    pooled = fit_ridge(network, pooled_law, 2) if pooled_law is not None else None
    # everything below works in the support coordinates u
    coords = coordinates_of(mixture)
    if method == "cg":
        state = getattr(warm_start, "_cg_state", None)
        if state is not None and not (state["coords"]() is coords and state["init"] == init):
            state = None
        rhs_terms = quadratics_in_u(ridges, coords)
        anchor = quadratic_in_u(pooled, coords) if pooled is not None else None
        anchor_factors = factored_quadratic_in_u(pooled, coords) if pooled is not None else None
    # the polynomials needed as coefficient tensors in u, expanded when used (after the dense solve's size check):
    # the components' projections for the dense solve, or a warm start without a usable state for CG
    plain = method == "cg" and warm_start is not None and state is None
    to_expand = ridges if method == "dense" else [warm_start] if plain else []
    expanded = (tensors_in_u(p, coords, p.degree) for p in to_expand)
    del ridges, pooled, to_expand  # memory: the solves need only their forms in u (the dense one: the generator's)
    if method == "dense":
        tensors_u, sinfo = solve_dense(expanded, coords, degree, network.d_out)
        info["method"] = "exact-mixture-dense"
    else:
        tensors_u, sinfo, state = solve_quadratic(
            coords, network.d_out, rhs_terms, anchor, anchor_factors, next(expanded) if plain else None, state,
            tol=float(tol), fvu_tol=float(fvu_tol), residual_tol=float(residual_tol), window=window, maxiter=maxiter,
            preconditioner=preconditioner, init=init, device=device, dtype=tdtype, progress=progress, t_start=t_start)
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
        object.__setattr__(out, "_cg_state", state)  # for warm starts (system.py: anchor + correction)
    return out



def _check_warm_start(p, network: Network, method: str) -> None:
    if method == "dense":
        raise ValueError("warm_start applies to method='cg' only (the dense solve is direct)")
    if not isinstance(p, DensePolynomial | RidgePolynomial):
        raise TypeError(f"warm_start must be a DensePolynomial or RidgePolynomial, got {type(p).__name__}")
    if p.degree > 2 or p.d_in != network.d_in or p.d_out != network.d_out:
        raise ValueError(f"warm_start must be a polynomial of degree <= 2 with d_in = {network.d_in} and d_out = "
                         f"{network.d_out}, got degree {p.degree}, d_in {p.d_in}, d_out {p.d_out}")
