"""The ridge grid and the validation targets shared by the dense and the CG data projection
(:mod:`mlpinterp.poly.projection`, :mod:`mlpinterp.poly.projection_cg`)."""

from __future__ import annotations

from mlpinterp.utils.validation import check_shape, to_numpy

#: Relative ridges tried by ``ridge="validation"`` (the one with the lowest FVU on held-back samples is kept).
RIDGE_GRID = (1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 1e-1)


def validation_targets(network, basis, X_val, degree):
    """Features ``[m', F]``, outputs and total sum of squares of the validation samples (checked)."""
    X_val = check_shape(to_numpy(X_val, "X_val"), "X_val", (None, network.d_in))
    Phi_val, Y_val = basis._features(X_val, degree), network(X_val)
    sst = float(((Y_val - Y_val.mean(0)) ** 2).sum())
    if X_val.shape[0] < 2 or not sst > 1e-10 * float((Y_val**2).sum()):
        raise ValueError(f"X_val must hold >= 2 samples on which the block's output varies (the validation FVU "
                         f"divides by its variance), got {X_val.shape[0]} sample(s) with total sum of squares {sst:.3g}")
    return Phi_val, Y_val, sst
