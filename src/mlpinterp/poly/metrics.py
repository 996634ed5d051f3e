"""How well an approximant matches its network: FVU, KL divergence, top-1 agreement, accuracy.

FVU (fraction of variance unexplained, Rigg & Belrose 2025 §4) is pooled over outputs:
``sum_o E[(f_o - p_o)^2] / sum_o Var(f_o)`` (a fraction in [0, inf), 0 = perfect); per-output values too.
Under one Gaussian and an MLP approximated by its own ``RidgePolynomial`` the FVU is exact: every term
is a bivariate Gaussian expectation (Mehler's formula for Hermite terms, 1-D quadrature of conditional
expectations for E[phi(y_i) phi(y_j)], with a propagated error bound), summed in blocks of neuron rows
(:mod:`mlpinterp.poly.fvu_exact`). Otherwise it is estimated by Monte Carlo with a delta-method standard error,
streamed over chunks of samples (memory independent of the sample count).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.special import log_softmax

from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.networks import GLU, validate_network
from mlpinterp.poly.approximant import RidgePolynomial
from mlpinterp.poly.fvu_exact import check_variance, exact_layout, fvu_exact_mlp
from mlpinterp.utils.memory import chunk_rows
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
    check_variance(v2.mean(0), float((f**2).mean(0).sum()), " on these inputs")
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


def _mc_bytes_per_row(network, p, dist) -> float:
    """Bytes one Monte Carlo sample holds while the network and ``p`` are evaluated (inputs, hidden layers with
    their temporaries, outputs and the running products)."""
    h = network.d_hidden * (4 if isinstance(network, GLU) else 3)
    hp = int(getattr(p, "d_hidden", 0) or 0)
    terms = (int(getattr(p, "degree", 2)) + 3) * (2 if getattr(p, "G", None) is not None else 1)
    width = int(getattr(dist, "rank", dist.d))
    return 8.0 * (2 * dist.d + width + h + hp * terms + 6 * network.d_out)


class _Moments:
    """Running sums of the Monte Carlo FVU, per output and pooled, about a pilot mean (memory O(d_out)).

    With e = f - mu0 (mu0: the first chunk's mean) the variance about the sample mean is mean(e^2) - (mean e)^2,
    and the delta-method variance of r2 - per (f - mean f)^2 expands into the sums of r2, r2^2, r2 e, r2 e^2, e,
    e^2, e^3, e^4: per-output values and errors equal those computed from stored samples. The pooled value does
    too; the pooled error uses deviations about mu0, which differ from deviations about the sample mean by the
    pilot's error, O(1/sqrt(chunk)) of the spread (a second-order change of the error, not of the value).
    """

    def __init__(self, f: np.ndarray):
        self.mu0 = f.mean(0)
        self.n = 0
        self.sums = {k: np.zeros(f.shape[1]) for k in ("r", "rr", "re", "ree", "e", "ee", "eee", "eeee")}
        self.pooled = np.zeros(5)  # sums of a, a^2, b, b^2, a b with a = sum_o r2, b = sum_o e^2

    def add(self, f: np.ndarray, r2: np.ndarray) -> None:
        e = f - self.mu0
        e2 = e * e
        s = self.sums
        s["r"] += r2.sum(0)
        s["rr"] += (r2 * r2).sum(0)
        s["re"] += (r2 * e).sum(0)
        s["ree"] += (r2 * e2).sum(0)
        s["e"] += e.sum(0)
        s["ee"] += e2.sum(0)
        s["eee"] += (e2 * e).sum(0)
        s["eeee"] += (e2 * e2).sum(0)
        a, b = r2.sum(1), e2.sum(1)
        self.pooled += [a.sum(), (a * a).sum(), b.sum(), (b * b).sum(), (a * b).sum()]
        self.n += f.shape[0]

    def result(self) -> FVUResult:
        n = self.n
        s = {k: v / n for k, v in self.sums.items()}
        d = s["e"]  # sample mean - mu0
        B = s["ee"] - d * d  # variance about the sample mean (1/n)
        check_variance(B, float(np.sum(s["ee"] + (self.mu0 + d) ** 2)), " under this distribution")
        Bs = np.where(B > 0, B, np.nan)
        per = s["r"] / Bs
        # t = r2 - per v with v = (e - d)^2; E[t] = 0 by the choice of per
        Ev2 = s["eeee"] - 4 * d * s["eee"] + 6 * d * d * s["ee"] - 3 * d**4  # E[(e - d)^4], using E[e] = d
        Erv = s["ree"] - 2 * d * s["re"] + d * d * s["r"]
        var_t = np.maximum(s["rr"] - 2 * per * Erv + per * per * Ev2, 0.0) * n / (n - 1)
        per_se = np.sqrt(var_t / n) / Bs
        sa, saa, sb, sbb, sab = self.pooled / n
        total = float(np.sum(B))
        pooled = float(sa / total)
        tvar = max(saa - 2 * pooled * sab + pooled**2 * sbb - (sa - pooled * sb) ** 2, 0.0) * n / (n - 1)
        return FVUResult(pooled, per, math.sqrt(tvar / n) / total, per_se, "monte-carlo", n)


class _Affine:
    """``x -> T1 x + T0`` (a degree <= 1 polynomial evaluated in O(d_in d_out) per sample, not through its neurons)."""

    degree = 1
    d_hidden = 0

    def __init__(self, p):
        self.T0 = np.asarray(p.coefficients(0))
        self.T1 = np.asarray(p.coefficients(1)) if p.degree >= 1 else np.zeros((p.d_out, p.d_in))

    def __call__(self, X):
        return X @ self.T1.T + self.T0


def _linear_form(p):
    """``p`` as an :class:`_Affine` when it is a factored polynomial of degree <= 1, else ``p``."""
    if isinstance(p, RidgePolynomial) and p.degree <= 1:
        return _Affine(p)
    return p


def _fvu_monte_carlo(network, p, dist, n_samples: int, seed: int, chunk_size: int | None = None) -> FVUResult:
    """Monte Carlo FVU streamed over chunks of samples: memory O(chunk x width + d_out), for any ``n_samples``.

    ``chunk_size`` samples (default: from the width and the memory budget, :func:`mlpinterp.utils.memory.chunk_rows`)
    are drawn, evaluated and reduced to running sums (:class:`_Moments`) before the next chunk is drawn. Raises
    :class:`~mlpinterp.utils.memory.InsufficientMemoryError` before drawing when one chunk would not fit.
    """
    p = _linear_form(p)
    per_row = _mc_bytes_per_row(network, p, dist)
    what, fix = "a Monte Carlo FVU chunk", "pass a smaller chunk_size"
    if chunk_size is None:
        chunk = chunk_rows(per_row, what, fix, minimum=2, maximum=n_samples)
    else:
        chunk = chunk_rows(per_row, what, fix, budget=int(chunk_size * per_row), maximum=chunk_size)
    chunk = max(chunk, 2)
    rng = np.random.default_rng(seed)
    acc = None
    for start in range(0, n_samples, chunk):
        X = dist.sample(min(chunk, n_samples - start), rng)
        f = network(X)
        r2 = (f - p(X)) ** 2
        del X
        acc = acc or _Moments(f)
        acc.add(f, r2)
    return acc.result()


def fvu(network, p, distribution, *, n_samples: int = 200_000, seed: int = 0, method: str = "auto",
        chunk_size: int | None = None) -> FVUResult:
    """FVU of approximant ``p`` against ``network`` under ``distribution``.

    ``method="auto"`` is exact when possible (MLP, one Gaussian, ``p`` its own ridge approximant;
    :mod:`mlpinterp.poly.fvu_exact`, memory O(d_hidden x chunk)) and Monte Carlo with ``n_samples`` seeded draws
    otherwise (streamed: memory independent of ``n_samples``). GLUs always use Monte Carlo (the module docstring of
    :mod:`mlpinterp.poly.fvu_exact` says why). When the exact value's error bound exceeds the value itself (e.g. a
    covariance at the edge of float64, where the bivariate integrals lose their digits), ``"auto"`` warns and falls
    back to Monte Carlo; ``"exact"`` warns and returns it. ``"monte-carlo"`` forces sampling. ``chunk_size``: rows
    per block (exact) or samples per chunk (Monte Carlo); default from the width and the available memory.

    Raises ``ValueError`` for an unknown method or when ``"exact"`` is requested but not available;
    :class:`~mlpinterp.utils.memory.InsufficientMemoryError` (a ``MemoryError``) before allocating when even one
    block or chunk would not fit, naming the estimate and what to change.
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
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int | np.integer)
                                   or chunk_size < 2):
        raise ValueError(f"chunk_size must be an int >= 2 or None, got {chunk_size!r}")
    layout = exact_layout(network, p, distribution) if isinstance(distribution, Gaussian) else None
    exact_ok = layout is not None
    if method == "exact" and not exact_ok:
        raise ValueError(
            "exact FVU needs an MLP, a Gaussian and a ridge approximant whose directions are standard normal "
            "under that Gaussian (e.g. one fitted by fit_polynomial under it)"
        )
    if isinstance(n_samples, bool) or not isinstance(n_samples, int | np.integer) or n_samples < 2:
        raise ValueError(f"n_samples must be >= 2, got {n_samples}")
    if exact_ok and method != "monte-carlo":
        pooled, per, bound = fvu_exact_mlp(network, p, distribution, layout, chunk_size=chunk_size)
        if not bound <= pooled:
            note = (f"the exact FVU {pooled:.3g} has a numerical error bound {bound:.3g} larger than itself (the "
                    "bivariate integrals lost their digits, e.g. a covariance near the float64 range)")
            if method == "exact":
                warnings.warn(f"{note}; pass method='monte-carlo' (mlpinterp approx --fvu-method monte-carlo) for a "
                              "sampled estimate", RuntimeWarning,
                              stacklevel=2)
            else:
                warnings.warn(f"{note}; using Monte Carlo with {n_samples} samples instead", RuntimeWarning,
                              stacklevel=2)
                return _fvu_monte_carlo(network, p, distribution, int(n_samples), seed, chunk_size)
        zeros = np.zeros(network.d_out)
        return FVUResult(pooled, per, 0.0, zeros, "exact", 0, bound)
    return _fvu_monte_carlo(network, p, distribution, int(n_samples), seed, chunk_size)


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
