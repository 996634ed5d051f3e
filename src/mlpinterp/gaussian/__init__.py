"""Shared Gaussian math: distributions, univariate integrals per activation, master theorem, Isserlis.

Everything here is float64 numpy and vectorised over neurons.
"""

from mlpinterp.gaussian.activations import ACTIVATION_NAMES, Activation, get_activation, leaky_slope
from mlpinterp.gaussian.bivariate import gauss_product_ev
from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.gaussian.hermite import hermite_he, hermite_to_monomial, monomial_to_hermite
from mlpinterp.gaussian.master import central_moment, master_theorem_ev, noncentral_moment
from mlpinterp.gaussian.univariate import (
    gauss_derivative_ev,
    gauss_ev,
    gauss_moments,
    gauss_second_moment,
    hermite_coefficients,
)

__all__ = [
    "ACTIVATION_NAMES", "Activation", "Gaussian", "GaussianMixture", "central_moment", "gauss_derivative_ev",
    "gauss_ev", "gauss_moments", "gauss_product_ev", "gauss_second_moment", "get_activation", "hermite_coefficients",
    "hermite_he", "hermite_to_monomial", "leaky_slope", "master_theorem_ev", "monomial_to_hermite",
    "noncentral_moment",
]
