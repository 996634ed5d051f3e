"""Public entry point of the exact mixture solvers of degree >= 2: ``fit_mixture`` (Rigg & Belrose 2025, §3.4, §4).

``method="cg"`` (degree 2, any size) is the matrix-free solver of ``matrix_free.py``; ``method="dense"``
(any degree, small support) the moment-table solve of ``moment_dense.py``. Both work in the whitened
support coordinates of ``coordinates.py``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mlpinterp.gaussian.distributions import GaussianMixture
from mlpinterp.networks import Network, validate_network
from mlpinterp.poly.approximant import DensePolynomial
from mlpinterp.poly.mixture.coordinates import SupportCoordinates, quadratic_in_u, u_to_raw
from mlpinterp.poly.mixture.matrix_free import PRECONDITIONERS, _MixtureOperator, _pcg
from mlpinterp.poly.mixture.moment_dense import _solve_dense
from mlpinterp.poly.ridge import fit_ridge

_METHODS = ("auto", "exact", "cg", "dense")


def _torch_dtype(dtype):
    import torch

    if dtype in (None, "float64", torch.float64, np.float64):
        return torch.float64
    if dtype in ("float32", torch.float32, np.float32):
        return torch.float32
    raise ValueError(f"dtype must be torch.float64 or torch.float32 (or 'float64'/'float32'), got {dtype!r}")



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
            c, b, A = quadratic_in_u(fit_ridge(network, comp, 2), coords)
            comps.append(tuple(torch.as_tensor(t, device=dev, dtype=tdtype) for t in (c, b, A)))
        t_rhs = time.perf_counter()
        rhs = op.apply(None, components=comps)
        del comps
        x0 = None
        if init == "pooled":
            c, b, A = quadratic_in_u(fit_ridge(network, mixture.pooled(), 2), coords)
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
    raw = u_to_raw(tensors_u, coords)
    sinfo["wall_time_s"] = time.perf_counter() - t_start
    sinfo["cpu_time_s"] = time.process_time() - cpu_start  # all threads; the honest figure on a shared CPU
    info["solver_info"] = sinfo
    return DensePolynomial(tuple(raw), info=info)

