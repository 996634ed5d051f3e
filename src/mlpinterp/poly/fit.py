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
        Cholesky solve cached per mixture when (d_in+1)(d_in+2)/2 <= 5000 and its K Gram matrices fit in
        ``cached_dense.MAX_CACHED_BYTES`` and the available memory (``poly/mixture/cached_dense.py``), else
        matrix-free preconditioned CG (``"cg"``, ``poly/mixture/system.py`` and ``pcg.py``; see :func:`mixture_route`); ``"dense"`` builds the monomial
        Gram from a moment table (any degree, small d_in); ``"sgd"`` is the paper's hybrid (N(0, I) init +
        schedule-free SGD on mixture samples), for comparison only.
    options : passed to the solver (``tol``, ``fvu_tol``, ``maxiter``, ``device``, ``dtype``, ``warm_start``, ``init``, ...;
        see ``poly.mixture.exact.fit_mixture``).

    Returns
    -------
    ``RidgePolynomial`` or ``DensePolynomial``: callable ``[n, d_in] -> [n, d_out]`` with ``coefficients(k)``.
    On a singular covariance the approximant is optimal on the support and extended off it by orthogonal
    projection onto the support (minimum-norm coefficients). Under a mixture whose components are all
    rank-deficient, the default CG precision on a CPU with fast bfloat16 GEMMs returns the documented (canonical)
    polynomial on every component's support and another optimal one off them: ``p.solver_info["answer"]`` says
    which (``"canonical"`` or ``"canonical on the support"``); ``dtype="float64"`` gives the canonical one everywhere.

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

    route = mixture_route(degree, method, network.d_in, options, K=distribution.K)
    if route == "sgd":
        from mlpinterp.poly.mixture.sgd import fit_sgd

        return fit_sgd(network, distribution, degree, **options)
    if route == "linear":
        from mlpinterp.poly.mixture.linear import fit_mixture_linear

        _no_options(options, "degree <= 1 under a GaussianMixture (closed form, no solver options)")
        return fit_mixture_linear(network, distribution, degree)
    if route == "cached":
        from mlpinterp.poly.mixture.cached_dense import fit_mixture_quadratic_cached

        return fit_mixture_quadratic_cached(network, distribution)
    from mlpinterp.poly.mixture.exact import fit_mixture

    return fit_mixture(network, distribution, degree, method=route, **options)


#: Options that change how a solve is shown, never which solver runs or what it computes.
PRESENTATION_OPTIONS = frozenset({"progress"})


def mixture_route(degree: int, method: str, d_in: int, options: dict, K: int = 1) -> str:
    """The solver ``fit_polynomial`` runs under a ``GaussianMixture``: ``"linear"``, ``"cached"``, ``"cg"``,
    ``"dense"`` or ``"sgd"`` (the one place where the mixture methods are dispatched).

    Degree <= 1 is the closed form (``"linear"``) for every exact method. Degree 2 with ``"auto"``/``"exact"`` is
    the dense Cholesky solve cached per mixture (``"cached"``) when it fits (``cached_dense.fits``: its feature
    count and its ``K`` Gram matrices within its limits and the available memory) and no option of the CG solver
    is given, else ``"cg"`` (memory O(K r^2)); other degrees with ``"auto"``/``"exact"`` are ``"dense"``. Options
    in :data:`PRESENTATION_OPTIONS` (``progress``) never change the route.

    Raises ``ValueError`` for an unknown method.
    """
    if method == "sgd":
        return "sgd"
    if method not in ("auto", "exact", "cg", "dense"):
        raise ValueError(f"unknown method {method!r} for a GaussianMixture; use 'auto', 'cg', 'dense' or 'sgd'")
    if degree <= 1:
        return "linear"
    if method in ("cg", "dense"):
        return method
    if degree == 2:
        from mlpinterp.poly.mixture.cached_dense import fits

        return "cached" if not set(options) - PRESENTATION_OPTIONS and fits(K, d_in) else "cg"
    return "dense"


def _no_options(options: dict, where: str) -> None:
    """Raise ``TypeError`` naming solver options that the chosen route would silently ignore."""
    if options:
        raise TypeError(f"unused solver option(s) {', '.join(sorted(options))} for {where}")
