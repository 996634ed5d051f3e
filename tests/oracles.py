"""Independent oracles shared by the tests: least squares on samples of explicit monomial features.

Nothing here uses mlpinterp's closed forms: features are plain products of input coordinates and the
fit is ``numpy.linalg.lstsq``; standard errors are heteroskedasticity-robust (HC0 sandwich).
"""

from __future__ import annotations

import itertools

import numpy as np


def monomial_features(X: np.ndarray, degree: int, center: np.ndarray | None = None) -> np.ndarray:
    """All monomials of degree <= ``degree`` of ``X - center``: ``[n, C(d + degree, degree)]``."""
    T = X if center is None else X - center
    cols = [np.ones(len(X))]
    for r in range(1, degree + 1):
        for idx in itertools.combinations_with_replacement(range(X.shape[1]), r):
            cols.append(np.prod(T[:, idx], axis=1))
    return np.stack(cols, axis=1)


def ols_with_robust_se(F: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OLS of ``y [n, m]`` on features ``F [n, p]``; returns (beta [p, m], HC0 covariance [m, p, p], residuals)."""
    Q, R = np.linalg.qr(F)
    beta = np.linalg.solve(R, Q.T @ y)
    resid = y - F @ beta
    Rinv = np.linalg.inv(R)
    bread = Rinv @ Rinv.T  # (F^T F)^-1
    covs = []
    for j in range(y.shape[1]):
        meat = (F * resid[:, j : j + 1] ** 2).T @ F
        covs.append(bread @ meat @ bread)
    return beta, np.stack(covs), resid


def prediction_z_scores(F_eval: np.ndarray, beta: np.ndarray, covs: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """z-scores of ``pred [n_eval, m]`` against the OLS prediction ``F_eval beta`` with its robust SE."""
    mc = F_eval @ beta
    se = np.sqrt(np.einsum("np,mpq,nq->nm", F_eval, covs, F_eval))
    return (pred - mc) / se
