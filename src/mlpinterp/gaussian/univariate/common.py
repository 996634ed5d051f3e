"""Shared helpers of the univariate Gaussian integrals: input validation, family dispatch, the normal pdf.

Y = mu + sigma Z, Z ~ N(0, 1); everything is float64 and vectorised over flattened neurons ``[N]``.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from mlpinterp.gaussian.activations import Activation
from mlpinterp.utils.validation import to_numpy

#: Highest Hermite degree: k! overflows float64 for k > 170.
MAX_DEGREE = 170
S_TINY = 1e-150  # sigma below this is a point mass (differences are far below float64 resolution)
Z0_MAX = 40.0  # |transition point| beyond which pdf underflows: windows and tails are clipped here
_SQRT2PI = math.sqrt(2.0 * math.pi)


def quiet(fn):
    """Silence float over/underflow warnings of intermediate terms (handled explicitly)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(over="ignore", under="ignore", divide="ignore"):
            return fn(*args, **kwargs)

    return wrapper


def checked(values: np.ndarray, name: str) -> np.ndarray:
    """Raise ``ValueError`` if the activation returned NaN at finite pre-activations (a wrong integral otherwise)."""
    if np.any(np.isnan(values)):
        raise ValueError(
            f"activation {name!r} returned NaN at {int(np.isnan(values).sum())} finite pre-activation value(s); "
            "the Gaussian integrals need phi to be defined (non-NaN) on the whole real line"
        )
    return values


def prepare(mu, sigma) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Validate, broadcast and flatten mu, sigma; returns (mu [N], sigma [N], shape)."""
    mu = to_numpy(mu, "mu")
    sigma = to_numpy(sigma, "sigma")
    if np.any(sigma < 0):
        raise ValueError(f"sigma must be >= 0, got min(sigma) = {float(sigma.min())!r}")
    try:
        mu_b, s_b = np.broadcast_arrays(mu, sigma)
    except ValueError:
        raise ValueError(
            f"mu and sigma must be broadcastable, got shapes {list(mu.shape)} and {list(sigma.shape)}"
        ) from None
    shape = mu_b.shape
    return mu_b.reshape(-1).copy(), s_b.reshape(-1).copy(), shape


def family(act: Activation) -> str:
    if act.name == "leaky_relu" or act.name.startswith("leaky_relu:"):
        return "leaky_relu"
    return act.name


def pdf(x):
    return np.exp(-0.5 * np.square(x)) / _SQRT2PI
