"""How well an approximant matches its network: FVU, KL divergence, top-1 agreement, accuracy.

FVU (fraction of variance unexplained, Rigg & Belrose 2025 §4) is pooled over outputs:
``sum_o E[(f_o - p_o)^2] / sum_o Var(f_o)`` (a fraction in [0, inf), 0 = perfect); per-output values too.
Under one Gaussian and an MLP approximated by its own ``RidgePolynomial`` the FVU is exact: every term
is a bivariate Gaussian expectation (Mehler's formula for Hermite terms, 1-D quadrature of conditional
expectations for E[phi(y_i) phi(y_j)], with a propagated error bound). Otherwise it is estimated by
Monte Carlo with a delta-method standard error.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np
from scipy.special import log_softmax

from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.networks import MLP, validate_network
from mlpinterp.poly.approximant import RidgePolynomial
from mlpinterp.utils.validation import to_numpy


@dataclass(frozen=True)
class FVUResult:
    """Pooled and per-output FVU with its uncertainty.

    fvu : pooled FVU (fraction). per_output : ``[d_out]``.
    stderr / per_output_stderr : Monte Carlo (or on-data) standard errors; 0 for the exact method.
    error_bound : bound on the numerical error of the exact method (None for Monte Carlo).
    method : ``"exact"``, ``"monte-carlo"`` or ``"data"``. n_samples : samples used (0 when exact).
    """

    fvu: float
    per_output: np.ndarray
    stderr: float
    per_output_stderr: np.ndarray
    method: str
    n_samples: int = 0
    error_bound: float | None = None

    def as_dict(self) -> dict:
        return {
            "fvu": self.fvu, "stderr": self.stderr, "method": self.method, "n_samples": self.n_samples,
            "error_bound": self.error_bound, "per_output": self.per_output.tolist(),
            "per_output_stderr": self.per_output_stderr.tolist(),
        }


def _ratio_stats(r2: np.ndarray, v2: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Ratio-of-means estimates and delta-method SEs from per-sample ``r2 = (f-p)^2`` and ``v2 = (f - mean f)^2``."""
    n = r2.shape[0]
    A, B = r2.mean(0), v2.mean(0)
    per = A / np.where(B > 0, B, np.nan)
    per_se = np.sqrt(np.var(r2 - per * v2, axis=0, ddof=1) / n) / np.where(B > 0, B, np.nan)
    a, b = r2.sum(1), v2.sum(1)
    pooled = a.mean() / b.mean()
    pooled_se = math.sqrt(np.var(a - pooled * b, ddof=1) / n) / b.mean()
    return float(pooled), float(pooled_se), per, per_se


def fvu_from_outputs(f: np.ndarray, p_out: np.ndarray, method: str = "data") -> FVUResult:
    """FVU from precomputed outputs ``f [n, d_out]`` (network) and ``p_out [n, d_out]`` (approximant)."""
    if f.shape != p_out.shape or f.ndim != 2 or f.shape[0] < 2:
        raise ValueError(f"f and p_out must both have shape [n >= 2, d_out], got {list(f.shape)} and {list(p_out.shape)}")
    r2 = (f - p_out) ** 2
    v2 = (f - f.mean(0)) ** 2
    _check_variance(v2.mean(0), float((f**2).mean(0).sum()), " on these inputs")
    pooled, se, per, per_se = _ratio_stats(r2, v2)
    return FVUResult(pooled, per, se, per_se, method, f.shape[0])


def fvu_on_data(network, p, X) -> FVUResult:
    """FVU of ``p`` against ``network`` on real inputs ``X [n, d_in]`` (variance about the data mean).

    Raises ``ValueError`` for fewer than 2 inputs or a d_in mismatch.
    """
    network = validate_network(network)
    X = to_numpy(X, "X")
    if X.ndim != 2 or X.shape[0] < 2 or X.shape[1] != network.d_in:
        raise ValueError(f"X must have shape [n >= 2, d_in={network.d_in}], got {list(X.shape)}")
    return fvu_from_outputs(network(X), p(X))


def _fvu_monte_carlo(network, p, dist, n_samples: int, seed: int, chunk: int = 50_000) -> FVUResult:
    rng = np.random.default_rng(seed)
    r2s, fs = [], []
    for s in range(0, n_samples, chunk):
        X = dist.sample(min(chunk, n_samples - s), rng)
        f = network(X)
        r2s.append((f - p(X)) ** 2)
        fs.append(f)
    f = np.concatenate(fs)
    r2 = np.concatenate(r2s)
    v2 = (f - f.mean(0)) ** 2
    _check_variance(v2.mean(0), float((f**2).mean(0).sum()), " under this distribution")
    pooled, se, per, per_se = _ratio_stats(r2, v2)
    return FVUResult(pooled, per, se, per_se, "monte-carlo", n_samples)


def _exact_layout(network, p, dist: Gaussian) -> np.ndarray | None:
    """Classify ``p``'s ridge directions for the exact FVU, or ``None`` if the exact route does not apply.

    The exact route needs an MLP, a ``RidgePolynomial`` without gate terms and, for each of p's neurons,
    ``z_j = A_j . (x - center)`` either standard normal under ``dist`` (unit variance, zero mean) or a.s. 0
    (zero variance, zero mean). Returns a boolean mask ``[p.d_hidden]`` (True = standard-normal direction).
    """
    if not (isinstance(network, MLP) and isinstance(p, RidgePolynomial) and p.G is None):
        return None
    if p.d_in != network.d_in or p.d_out != network.d_out:
        return None
    scale = 1.0 + float(np.abs(dist.mean).max()) + float(np.abs(p.center).max())
    norms = ((p.A @ dist.cov) * p.A).sum(1)
    unit = np.abs(norms - 1) < 1e-8
    zero = np.abs(norms) < 1e-12
    if not np.all(unit | zero):
        return None
    offset = p.A @ (dist.mean - p.center)  # mean of z_j
    if np.any(np.abs(offset) > 1e-12 * scale * (1.0 + np.abs(p.A).sum(1))):
        return None
    return unit


def _check_variance(var_f: np.ndarray, scale: float, where: str) -> None:
    total = float(np.sum(var_f))
    if not total > 1e-24 * scale:
        raise ValueError(
            f"network output has zero variance{where} (sum_o Var(f_o) = {total:.3g}); the FVU is undefined"
        )


#: network -> (distribution, E[phi(y_i) phi(y_j)], its error bound): the d_hidden^2 bivariate integrals depend on
#: the network and the input law only, so FVUs of several approximants of one network reuse them.
_PRODUCT_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _product_moments(network: MLP, dist: Gaussian, m, s, rho) -> tuple[np.ndarray, np.ndarray]:
    """E[phi(y_i) phi(y_j)] ``[h, h]`` and its error bound, cached per (network, distribution) object pair."""
    from mlpinterp.gaussian.bivariate import gauss_product_ev

    hit = _PRODUCT_CACHE.get(network)
    if hit is not None and hit[0] is dist:
        return hit[1], hit[2]
    e2, err = gauss_product_ev(network.act, m[:, None], s[:, None], m[None, :], s[None, :], rho, return_error=True)
    _PRODUCT_CACHE[network] = (dist, e2, err)
    return e2, err


def _fvu_exact_mlp(network: MLP, p: RidgePolynomial, dist: Gaussian, unit: np.ndarray) -> FVUResult:
    """Exact FVU of a ``RidgePolynomial`` (any standard-normal directions, see ``_exact_layout``) under one Gaussian.

    With u_i = (y_i - m_i) / s_i the network's standardised pre-activations, c_ik the Hermite coefficients of
    phi about y_i's law, and z_j = A_j . (x - center) p's standard-normal ridge variables (Mehler):
    Cov(phi(y_i), He_k(z_j)) = k! c_ik rho_ij^k with rho_ij = Corr(y_i, z_j), and
    Cov(He_k(z_i), He_l(z_j)) = delta_kl k! R_ij^k with R_ij = Corr(z_i, z_j). Neurons of p with z_j = 0 a.s.
    are constants sum_k D_jk He_k(0).
    """
    from mlpinterp.gaussian.hermite import hermite_he
    from mlpinterp.gaussian.univariate import hermite_coefficients

    W = network.W1
    m = W @ dist.mean + network.b1
    WS = W @ dist.cov
    cov_y = WS @ W.T
    s = np.sqrt(np.maximum(np.diag(cov_y), 0.0))
    safe = np.where(s > 0, s, 1.0)
    rho_y = np.clip(cov_y / np.outer(safe, safe), -1.0, 1.0)
    rho_y = np.where(np.outer(s > 0, s > 0), rho_y, 0.0)
    n = p.degree
    c = hermite_coefficients(network.act, m, s, n)
    e_phi = c[:, 0]
    e2, err = _product_moments(network, dist, m, s, rho_y)
    C = e2 - np.outer(e_phi, e_phi)
    C = np.where(np.outer(s > 0, s > 0), C, 0.0)  # constant neurons have exactly zero covariance
    W2, P = network.W2, p.W2
    # quadratic forms as one GEMM each (a 3-operand einsum without optimize loops in C, slow at transformer widths)
    var_f = ((W2 @ C) * W2).sum(1)
    mean_f = W2 @ e_phi + network.b2
    scale = float(np.sum(mean_f**2)) + float(((np.abs(W2) @ np.abs(e2)) * np.abs(W2)).sum())
    _check_variance(var_f, scale, " under this distribution")
    bound = ((np.abs(W2) @ np.abs(err)) * np.abs(W2)).sum(1)
    A = np.where(unit[:, None], p.A, 0.0)
    rho = np.where((s > 0)[:, None] & unit[None, :], (WS @ A.T) / safe[:, None], 0.0)
    rho = np.clip(rho, -1.0, 1.0)
    R = np.clip(A @ dist.cov @ A.T, -1.0, 1.0)
    cov_fp = np.zeros(network.d_out)
    var_p = np.zeros(network.d_out)
    for k in range(1, n + 1):
        fk = math.factorial(k)
        PD = P * p.D[:, k]
        cov_fp += (((W2 * c[:, k]) @ (rho**k * fk)) * PD).sum(1)
        var_p += ((PD @ (R**k * fk)) * PD).sum(1)
    const_h = (hermite_he(n, np.zeros(p.d_hidden)) * p.D).sum(1)  # sum_k D_jk He_k(0)
    mean_h = np.where(unit, p.D[:, 0], const_h)
    mean_gap = mean_f - (P @ mean_h + p.b2)
    mse = np.maximum(var_f + var_p - 2 * cov_fp + mean_gap**2, 0.0)
    per = mse / np.where(var_f > 0, var_f, np.nan)
    pooled = float(mse.sum() / var_f.sum())
    err_bound = float(bound.sum() * (1 + pooled) / var_f.sum())
    zeros = np.zeros(network.d_out)
    return FVUResult(pooled, per, 0.0, zeros, "exact", 0, err_bound)


def fvu(network, p, distribution, *, n_samples: int = 200_000, seed: int = 0, method: str = "auto") -> FVUResult:
    """FVU of approximant ``p`` against ``network`` under ``distribution``.

    ``method="auto"`` is exact when possible (MLP, one Gaussian, ``p`` its own ridge approximant) and Monte
    Carlo with ``n_samples`` draws (seeded) otherwise; ``"monte-carlo"`` forces sampling.
    Raises ``ValueError`` for an unknown method or when ``"exact"`` is requested but not available.
    """
    network = validate_network(network)
    if not isinstance(distribution, Gaussian | GaussianMixture):
        raise TypeError(f"distribution must be Gaussian or GaussianMixture, got {type(distribution).__name__}")
    if method not in ("auto", "exact", "monte-carlo"):
        raise ValueError(f"method must be 'auto', 'exact' or 'monte-carlo', got {method!r}")
    if distribution.d != network.d_in:
        raise ValueError(
            f"distribution has dimension {distribution.d} but the network has d_in = {network.d_in}"
        )
    unit = _exact_layout(network, p, distribution) if isinstance(distribution, Gaussian) else None
    exact_ok = unit is not None
    if method == "exact" and not exact_ok:
        raise ValueError(
            "exact FVU needs an MLP, a Gaussian and a ridge approximant whose directions are standard normal "
            "under that Gaussian (e.g. one fitted by fit_polynomial under it)"
        )
    if exact_ok and method != "monte-carlo":
        return _fvu_exact_mlp(network, p, distribution, unit)
    if isinstance(n_samples, bool) or not isinstance(n_samples, int | np.integer) or n_samples < 2:
        raise ValueError(f"n_samples must be >= 2, got {n_samples}")
    return _fvu_monte_carlo(network, p, distribution, n_samples, seed)


def _eval_inputs(X, d_in: int) -> np.ndarray:
    X = to_numpy(X, "X")
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] != d_in:
        raise ValueError(f"X must have shape [n >= 1, d_in={d_in}], got {list(X.shape)}")
    return X


def kl_from_outputs(f: np.ndarray, p_out: np.ndarray) -> tuple[float, float]:
    """Mean KL(softmax(f) || softmax(p_out)) in nats over rows, and its standard error (NaN for one row).

    Computed in the log domain (``scipy.special.log_softmax``), so rows whose softmax underflows stay finite.
    ``f``, ``p_out``: ``[n >= 1, n_classes]``. Raises ``ValueError`` if the shapes differ or n = 0.
    """
    f, p_out = np.asarray(f), np.asarray(p_out)
    if f.shape != p_out.shape or f.ndim != 2 or f.shape[0] < 1:
        raise ValueError(
            f"f and p_out (outputs of the network and of p) must both have shape [n >= 1, n_classes], "
            f"got {list(f.shape)} and {list(p_out.shape)}"
        )
    lf, lp = log_softmax(f, axis=1), log_softmax(p_out, axis=1)
    kl = (np.exp(lf) * (lf - lp)).sum(1)
    return float(kl.mean()), (float(kl.std(ddof=1) / math.sqrt(len(kl))) if len(kl) > 1 else math.nan)


def kl_divergence(network, p, X) -> tuple[float, float]:
    """Mean KL(softmax(f(x)) || softmax(p(x))) over inputs ``X [n, d_in]`` in nats, and its standard error."""
    network = validate_network(network)
    X = _eval_inputs(X, network.d_in)
    return kl_from_outputs(network(X), p(X))


def top1_agreement(network, p, X) -> float:
    """Fraction of inputs on which ``argmax f(x) == argmax p(x)``."""
    network = validate_network(network)
    X = _eval_inputs(X, network.d_in)
    f, p_out = network(X), np.asarray(p(X))
    if p_out.shape != f.shape:
        raise ValueError(f"p(X) must have the network's output shape {list(f.shape)}, got {list(p_out.shape)}")
    return float((f.argmax(1) == p_out.argmax(1)).mean())


def accuracy(model, X, y) -> float:
    """Classification accuracy of any callable ``model: [n, d_in] -> [n, n_classes]`` on labels ``y [n]``."""
    y = np.asarray(y)
    return float((np.asarray(model(to_numpy(X, "X"))).argmax(1) == y).mean())
