"""Input models fitted to a block's captured inputs: one Gaussian, or a Gaussian mixture (scikit-learn EM).

The approximants of Rigg & Belrose (2025) are optimal under an input law; these are the laws a user fits to real
activations. The third option, the empirical law of the tokens themselves, needs no fitting: see
:mod:`mlpinterp.poly.projection`.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.lm.capture import Moments
from mlpinterp.utils.validation import check_instance, check_int, check_shape, to_numpy


def fit_gaussian(moments: Moments, covariance: str, X_sample) -> Gaussian:
    """The Gaussian input model N(mean, S) from the fit-token moments (all fit tokens).

    ``covariance``: ``"empirical"`` (unbiased S) or ``"ledoit-wolf"`` (shrunk toward ``(tr S / d) I`` with the
    intensity that scikit-learn's ``ledoit_wolf_shrinkage`` estimates on ``X_sample [n >= 2, d]``, a subsample of the
    tokens; unused for ``"empirical"``). Raises ``TypeError`` if ``moments`` is not a :class:`Moments`,
    ``ValueError`` for another ``covariance``, too few tokens for a covariance, or (ledoit-wolf) an ``X_sample`` of
    another width, with NaN/inf or fewer than 2 rows (scikit-learn returns no shrinkage for one row, silently).
    """
    check_instance(moments, Moments, "moments")
    if covariance not in ("empirical", "ledoit-wolf"):
        raise ValueError(f"covariance must be 'empirical' or 'ledoit-wolf', got {covariance!r}")
    S = moments.cov()
    if covariance == "ledoit-wolf":
        from sklearn.covariance import ledoit_wolf_shrinkage

        X_sample = check_shape(to_numpy(X_sample, "X_sample"), "X_sample", (None, S.shape[0]))
        if X_sample.shape[0] < 2:
            raise ValueError(f"X_sample must have at least 2 rows to estimate the Ledoit-Wolf shrinkage, got "
                             f"{X_sample.shape[0]}")
        delta = float(ledoit_wolf_shrinkage(X_sample))
        S = (1 - delta) * S + delta * np.trace(S) / S.shape[0] * np.eye(S.shape[0])
    return Gaussian(moments.mean, S)


def fit_mixture(X, K: int, n_fit: int, seed: int = 0) -> tuple[GaussianMixture, dict]:
    """scikit-learn ``GaussianMixture`` (``K`` full covariances, EM seeded with ``seed``, ``reg_covar`` 1e-6) on a
    seeded subsample of ``n_fit`` rows of ``X [n, d]`` -> ``(mlpinterp.GaussianMixture, {"converged", "n_iter"})``.

    Raises ``TypeError``/``ValueError`` for a non-numeric (complex included), non-finite or non-2-D ``X``, non-int
    ``K`` / ``n_fit`` / ``seed`` (``seed >= 0``), and when the subsample has fewer than ``K`` rows.
    """
    from sklearn.mixture import GaussianMixture as SkGMM

    K, n_fit = check_int(K, "K", minimum=1), check_int(n_fit, "n_fit", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    X = to_numpy(X, "X")
    if X.ndim != 2 or min(n_fit, X.shape[0]) < K:
        raise ValueError(f"a {K}-component mixture needs at least {K} rows of X [n, d] (n_fit={n_fit}), got "
                         f"{list(X.shape)}")
    rng = np.random.default_rng(seed)
    sub = X[rng.choice(X.shape[0], size=min(n_fit, X.shape[0]), replace=False)]
    gm = SkGMM(n_components=K, covariance_type="full", random_state=seed, reg_covar=1e-6, max_iter=200).fit(sub)
    return GaussianMixture(gm.weights_, gm.means_, gm.covariances_), {"converged": bool(gm.converged_),
                                                                      "n_iter": int(gm.n_iter_)}
