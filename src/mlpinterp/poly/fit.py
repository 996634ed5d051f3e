"""Public entry point: ``fit_polynomial(network, distribution, degree)``."""

from __future__ import annotations

from typing import Literal

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.networks import validate_network
from mlpinterp.poly.approximant import Polynomial

Method = Literal["auto", "ridge", "ols", "exact", "cg", "dense", "sgd"]


def fit_polynomial(network, distribution, degree: int, *, method: Method = "auto", **options) -> Polynomial:
    """Least-squares-optimal polynomial of total degree ``degree`` approximating ``network`` under ``distribution``.

    Minimises E_x ||f(x) - p(x)||^2 over polynomials p of degree <= ``degree`` (Rigg & Belrose 2025,
    arXiv 2502.01032, eq. 2), exactly, from the weights and the input moments (no sampling).

    Parameters
    ----------
    network : ``MLP`` or ``GLU``
    distribution : ``Gaussian`` or ``GaussianMixture`` on R^{d_in}
    degree : int >= 0
    method :
        Under one ``Gaussian``: ``"auto"``/``"ridge"`` (per-neuron Hermite truncation, any degree, factored
        ``RidgePolynomial``) or ``"ols"`` (the paper's route: monomial features, master-theorem
        cross-moments, Isserlis feature covariance; small d_in only; returns ``DensePolynomial``).
        Under a ``GaussianMixture``: degree <= 1 exact by total covariance; degree 2 ``"auto"`` is a dense
        Cholesky solve cached per mixture when (d_in+1)(d_in+2)/2 <= 5000 (``poly/mixture/cached_dense.py``), else
        matrix-free preconditioned CG (``"cg"``, ``poly/mixture/matrix_free.py``); ``"dense"`` builds the monomial
        Gram from a moment table (any degree, small d_in); ``"sgd"`` is the paper's hybrid (N(0, I) init +
        schedule-free SGD on mixture samples), for comparison only.
    options : passed to the solver (``tol``, ``fvu_tol``, ``maxiter``, ``device``, ``dtype``, ``warm_start``, ``init``, ...;
        see ``poly.mixture.exact.fit_mixture``).

    Returns
    -------
    ``RidgePolynomial`` or ``DensePolynomial``: callable ``[n, d_in] -> [n, d_out]`` with ``coefficients(k)``.
    On a singular covariance the approximant is optimal on the support and extended off it by orthogonal
    projection onto the support (minimum-norm coefficients).

    Raises
    ------
    TypeError : network or distribution of the wrong type.
    ValueError : degree not a non-negative int, d_in mismatch, unknown method.
    """
    network = validate_network(network)
    if isinstance(degree, bool | np.bool_) or not isinstance(degree, int | np.integer) or degree < 0:
        raise ValueError(f"degree must be a non-negative integer, got {degree!r}")
    degree = int(degree)
    from mlpinterp.gaussian.univariate import MAX_DEGREE
    from mlpinterp.networks import GLU

    max_degree = MAX_DEGREE - 1 if isinstance(network, GLU) else MAX_DEGREE  # GLUs need c_{n+1}
    if degree > max_degree:
        raise ValueError(
            f"degree must be <= {max_degree} (Hermite coefficients need k! in float64, which overflows for k > "
            f"{MAX_DEGREE}), got {degree}"
        )
    if not isinstance(distribution, Gaussian | GaussianMixture):
        raise TypeError(
            f"distribution must be mlpinterp.Gaussian or mlpinterp.GaussianMixture, got {type(distribution).__name__}"
        )
    if distribution.d != network.d_in:
        raise ValueError(
            f"distribution has dimension {distribution.d} but the network has d_in = {network.d_in}"
        )
    if isinstance(distribution, GaussianMixture) and distribution.K == 1 and method in ("auto", "ridge", "ols"):
        distribution = distribution.components[0]

    if isinstance(distribution, Gaussian):
        if method in ("auto", "ridge", "exact"):
            from mlpinterp.poly.ridge import fit_ridge

            _no_options(options, f"method={method!r} under a Gaussian (closed form, no solver options)")
            return fit_ridge(network, distribution, degree)
        if method == "ols":
            from mlpinterp.poly.ols import fit_ols

            return fit_ols(network, distribution, degree, **options)
        raise ValueError(f"method must be 'auto', 'ridge' or 'ols' under a Gaussian, got {method!r}")

    if method == "sgd":
        from mlpinterp.poly.mixture.sgd import fit_sgd

        return fit_sgd(network, distribution, degree, **options)
    if degree <= 1 and method in ("auto", "exact", "dense", "cg"):
        from mlpinterp.poly.mixture.linear import fit_mixture_linear

        _no_options(options, "degree <= 1 under a GaussianMixture (closed form, no solver options)")
        return fit_mixture_linear(network, distribution, degree)
    if degree == 2 and method in ("auto", "exact") and not options:
        from mlpinterp.poly.mixture.cached_dense import MAX_FEATURES, feature_count, fit_mixture_quadratic_cached

        if feature_count(network.d_in) <= MAX_FEATURES:
            return fit_mixture_quadratic_cached(network, distribution)
    if method in ("auto", "exact", "cg", "dense"):
        from mlpinterp.poly.mixture.exact import fit_mixture

        return fit_mixture(network, distribution, degree, method=method, **options)
    raise ValueError(f"unknown method {method!r} for a GaussianMixture; use 'auto', 'cg', 'dense' or 'sgd'")


def _no_options(options: dict, where: str) -> None:
    """Raise ``TypeError`` naming solver options that the chosen route would silently ignore."""
    if options:
        raise TypeError(f"unused solver option(s) {', '.join(sorted(options))} for {where}")
