"""Function space: the MLP's quadratic approximant under its input law, and the input directions it singles out.

Two approximants are fitted and the one with the lower FVU on the validation inputs is kept (and stated):

- ``gaussian``: the exact degree-2 approximant under one Gaussian fitted to the fit inputs (Rigg & Belrose 2025,
  eq. 2; :func:`mlpinterp.fit_polynomial`), a closed form of the mean and covariance alone;
- ``data``: the exact least-squares projection onto the same ridge family under the empirical law of the fit inputs
  (:func:`mlpinterp.poly.projection.project_on_data`, ridge chosen on the validation inputs).

Directions, read in the MLP's input coordinates: the leading eigenvector of the quadratic form along each readout
direction (Rigg & Belrose 2025, §4.1; :func:`mlpinterp.poly.spectral.readout_quadratic_spectrum`) and the right
singular vectors of the readout's linear coefficients with a non-negligible singular value (§4.3).
"""

from __future__ import annotations

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian
from mlpinterp.poly.fit import fit_polynomial
from mlpinterp.poly.metrics import fvu_from_outputs
from mlpinterp.poly.projection import project_on_data
from mlpinterp.poly.readout import RidgeBasis
from mlpinterp.poly.spectral import readout_quadratic_spectrum
from mlpinterp.studies.three_spaces.block import Block

SINGULAR_FLOOR = 1e-6
"""Linear singular directions with ``S < 1e-6 S_max`` are numerically absent (not a direction the map uses)."""


def readout_fvu(block: Block, X: np.ndarray, out: np.ndarray) -> dict:
    """FVU of outputs ``out [n, d_out]`` against the block's on inputs ``X``, along :attr:`Block.readout`
    (pooled over readouts, with its standard error over inputs)."""
    f = block.network(X) @ block.readout
    r = fvu_from_outputs(f, out @ block.readout)
    return {"fvu": float(r.fvu), "fvu_se": float(r.stderr)}


def function_space(block: Block) -> dict:
    """Fit both approximants, keep the better on the validation inputs, and read its directions.

    Returns ``{"chosen", "candidates": {name: {"fvu_val", "fvu", "fvu_se"}}, "fvu", "fvu_se", "directions":
    {"quadratic": [m, d_in], "linear": [r, d_in]}, "eigenvalues": [m], "singular_values": [r], "ridge",
    "polynomial"}`` (``fvu``: on the held-out inputs; ``polynomial``: the chosen approximant)."""
    net = block.network
    g = Gaussian.from_data(block.X_fit)
    p_gauss = fit_polynomial(net, g, degree=2)
    basis = RidgeBasis.from_closed_form(p_gauss, g)
    ro, info = project_on_data(net, basis, block.X_fit, [2], ridge="validation", X_val=block.X_val)[2]
    p_data = ro.to_polynomial()
    cands = {"gaussian": p_gauss, "data": p_data}
    stats = {}
    for name, p in cands.items():
        val = readout_fvu(block, block.X_val, p(block.X_val))
        test = readout_fvu(block, block.X_test, p(block.X_test))
        stats[name] = {"fvu_val": val["fvu"], **test}
    chosen = min(stats, key=lambda k: stats[k]["fvu_val"])
    p = cands[chosen]
    spec = readout_quadratic_spectrum(p, block.eigen_readout, n=1)
    quad = spec.eigenvectors[:, :, 0]  # [m, d_in]
    B = block.eigen_readout.T @ p.coefficients(1)  # [m, d_in]
    _, S, Vt = np.linalg.svd(B, full_matrices=False)
    keep = S > SINGULAR_FLOOR * S[0] if S.size and S[0] > 0 else np.zeros(S.shape, bool)
    return {"chosen": chosen, "candidates": stats, "fvu": stats[chosen]["fvu"], "fvu_se": stats[chosen]["fvu_se"],
            "ridge": info["ridge"], "directions": {"quadratic": quad, "linear": Vt[keep]},
            "eigenvalues": spec.eigenvalues[:, 0], "singular_values": S[keep], "polynomial": p}
