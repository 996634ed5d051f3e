"""Input models fitted to a block's captured inputs: one Gaussian, or a Gaussian mixture (scikit-learn EM).

The approximants of Rigg & Belrose (2025) are optimal under an input law; these are the laws a user fits to real
activations. The third option, the empirical law of the tokens themselves, needs no fitting: see
:mod:`mlpinterp.ffn.projection`.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.ffn.capture import Moments
from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.utils.validation import check_int


def fit_gaussian(moments: Moments, covariance: str, X_sample: np.ndarray) -> Gaussian:
    """The Gaussian input model N(mean, S) from the fit-token moments (all fit tokens).

    ``covariance``: ``"empirical"`` (unbiased S) or ``"ledoit-wolf"`` (shrunk toward ``(tr S / d) I`` with the
    intensity that scikit-learn's ``ledoit_wolf_shrinkage`` estimates on ``X_sample [n, d]``, a subsample of the
    tokens). Raises ``ValueError`` for another ``covariance`` or too few tokens for a covariance.
    """
    if covariance not in ("empirical", "ledoit-wolf"):
        raise ValueError(f"covariance must be 'empirical' or 'ledoit-wolf', got {covariance!r}")
    S = moments.cov()
    if covariance == "ledoit-wolf":
        from sklearn.covariance import ledoit_wolf_shrinkage

        delta = float(ledoit_wolf_shrinkage(X_sample))
        S = (1 - delta) * S + delta * np.trace(S) / S.shape[0] * np.eye(S.shape[0])
    return Gaussian(moments.mean, S)


def fit_mixture(X: np.ndarray, K: int, n_fit: int, seed: int = 0) -> tuple[GaussianMixture, dict]:
    """scikit-learn ``GaussianMixture`` (``K`` full covariances, EM seeded with ``seed``, ``reg_covar`` 1e-6) on a
    seeded subsample of ``n_fit`` rows of ``X [n, d]`` -> ``(mlpinterp.GaussianMixture, {"converged", "n_iter"})``.

    Raises ``ValueError`` when the subsample has fewer than ``K`` rows.
    """
    from sklearn.mixture import GaussianMixture as SkGMM

    K, n_fit = check_int(K, "K", minimum=1), check_int(n_fit, "n_fit", minimum=1)
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or min(n_fit, X.shape[0]) < K:
        raise ValueError(f"a {K}-component mixture needs at least {K} rows of X [n, d], got {list(X.shape)}")
    rng = np.random.default_rng(seed)
    sub = X[rng.choice(X.shape[0], size=min(n_fit, X.shape[0]), replace=False)]
    gm = SkGMM(n_components=K, covariance_type="full", random_state=seed, reg_covar=1e-6, max_iter=200).fit(sub)
    return GaussianMixture(gm.weights_, gm.means_, gm.covariances_), {"converged": bool(gm.converged_),
                                                                      "n_iter": int(gm.n_iter_)}
