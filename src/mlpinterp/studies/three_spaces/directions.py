"""Comparing two sets of directions in one space: MMCS with sign invariance, recovered counts, random baselines.

A *direction set* is an array ``[n, d]`` whose rows are directions in the same ``d``-dimensional space (here: the
input space of one MLP). A direction and its negative are the same direction (an SAE latent, an eigenvector, a
singular vector and a rank-one subcomponent are each defined up to sign), so every cosine below is ``|cos|``.

- :func:`match`: for each row of a *reference* set, the largest ``|cos|`` to any row of a *candidate* set; its mean is
  the mean max cosine similarity (MMCS, Sharkey et al. 2022, "max" matching, not one-to-one); the number of
  reference rows whose largest ``|cos|`` reaches a threshold is the recovered count.
- :func:`random_isotropic` / :func:`random_gaussian`: random direction sets of a given count, uniform on the sphere
  or drawn from ``N(0, cov)`` (the baseline between two methods reading the
  same data: random directions that live where the data live).
- :func:`support_basis` / :func:`on_support`: the support of the inputs (the range of their covariance) and a
  direction set projected onto it. A direction's component outside the support never meets an input, so no
  data-driven loss sees it: SPD's ``V_c`` keep it from their random initialisation (the current recipe's delta
  component leaves it unconstrained) and an SAE's decoder rows keep what their loss does not remove. Every method's
  directions are compared on the support, where their action on the inputs lives.
- :func:`random_on_support`: a direction set uniform on the unit sphere of the support (the baseline against ground
  truth that lies in the support).
- :func:`baseline`: the MMCS and recovered count of a reference set against random sets of a given count, mean and
  standard error over draws.

The cosines come from :func:`mlpinterp.sae.metrics.cosine_matrix` (the rows of two dictionaries).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from mlpinterp.sae.metrics import cosine_matrix
from mlpinterp.utils.validation import check_int, check_real, to_numpy


def direction_set(D, name: str) -> np.ndarray:
    """``D`` as a float64 ``[n >= 1, d >= 1]`` array of finite, non-zero rows.

    Raises ``ValueError`` naming ``name`` for another shape, a non-finite entry or a zero row (a zero vector has no
    direction).
    """
    D = to_numpy(D, name)
    if D.ndim != 2 or D.shape[0] < 1 or D.shape[1] < 1:
        raise ValueError(f"{name} must be a direction set [n >= 1, d >= 1] (one direction per row), got shape "
                         f"{list(D.shape)}")
    norms = np.linalg.norm(D, axis=1)
    if np.any(norms == 0):
        raise ValueError(f"{name} has zero rows {np.flatnonzero(norms == 0)[:10].tolist()}: a zero vector has no "
                         "direction; drop them first")
    return D


def abs_cosines(reference, candidates) -> np.ndarray:
    """``|cos|`` between every row of ``reference [n, d]`` and of ``candidates [m, d]``: ``[n, m]`` in ``[0, 1]``.

    Raises ``ValueError`` for bad direction sets (:func:`direction_set`) or different widths ``d``.
    """
    A = direction_set(reference, "reference")
    B = direction_set(candidates, "candidates")
    if A.shape[1] != B.shape[1]:
        raise ValueError(f"reference and candidates must live in the same space, got widths d = {A.shape[1]} and "
                         f"{B.shape[1]}")
    return cosine_matrix(torch.from_numpy(A), torch.from_numpy(B)).abs().clamp_max(1.0).numpy()


@dataclass(frozen=True)
class Match:
    """How well a candidate set covers a reference set (all cosines are ``|cos|``)."""

    max_cos: np.ndarray
    """``[n_reference]``: each reference direction's largest ``|cos|`` to any candidate."""
    best: np.ndarray
    """``[n_reference]`` int: the candidate attaining it."""

    @property
    def mmcs(self) -> float:
        """Mean max ``|cos|`` over the reference directions (in ``[0, 1]``)."""
        return float(self.max_cos.mean())

    @property
    def mmcs_se(self) -> float:
        """Standard error of :attr:`mmcs` over the reference directions (``nan`` for one direction)."""
        return _se(self.max_cos)

    def recovered(self, threshold: float) -> int:
        """Reference directions whose best ``|cos|`` is at least ``threshold`` (in ``[0, 1]``)."""
        threshold = check_real(threshold, "threshold", 0.0, 1.0)
        return int((self.max_cos >= threshold).sum())

    def distinct(self, threshold: float) -> int:
        """Distinct candidates that recover some reference direction at ``threshold`` (one candidate recovering two
        references counts once)."""
        threshold = check_real(threshold, "threshold", 0.0, 1.0)
        return int(np.unique(self.best[self.max_cos >= threshold]).size)


def match(reference, candidates) -> Match:
    """For each row of ``reference [n, d]``, the largest ``|cos|`` to a row of ``candidates [m, d]`` and which.

    Not one-to-one (two references may pick the same candidate; :meth:`Match.distinct` counts the candidates used).
    Raises ``ValueError`` as :func:`abs_cosines`.
    """
    c = abs_cosines(reference, candidates)
    best = c.argmax(axis=1)
    return Match(max_cos=c[np.arange(c.shape[0]), best], best=best)


def random_isotropic(d: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` directions uniform on the unit sphere of ``R^d``: ``[count, d]`` unit rows."""
    d, count = check_int(d, "d"), check_int(count, "count")
    X = rng.standard_normal((count, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _symmetric_eigh(cov, when_zero: str) -> tuple[np.ndarray, np.ndarray]:
    """``np.linalg.eigh`` of ``cov [d, d]`` after checking it is square, nonzero (else ``"cov is zero: " +
    when_zero``) and symmetric to ``1e-10`` of its largest entry; ``ValueError`` otherwise."""
    S = to_numpy(cov, "cov")
    if S.ndim != 2 or S.shape[0] != S.shape[1] or S.shape[0] < 1:
        raise ValueError(f"cov must be a square matrix [d, d], got shape {list(S.shape)}")
    scale = float(np.abs(S).max())
    if scale == 0:
        raise ValueError(f"cov is zero: {when_zero}")
    if not np.allclose(S, S.T, rtol=0, atol=1e-10 * scale):
        raise ValueError("cov must be symmetric")
    return np.linalg.eigh(S)


def random_gaussian(cov, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` directions drawn from ``N(0, cov)`` (``cov [d, d]`` symmetric positive semi-definite, possibly
    singular: the draws stay on its support), as unit rows ``[count, d]``.

    Raises ``ValueError`` for a ``cov`` that is not square, not symmetric, has a clearly negative eigenvalue or is
    zero.
    """
    count = check_int(count, "count")
    w, U = _symmetric_eigh(cov, "no direction can be drawn from N(0, 0)")
    if w.min() < -1e-8 * w.max():
        raise ValueError(f"cov must be positive semi-definite, got eigenvalue {w.min():.3g} (largest {w.max():.3g})")
    keep = w > 1e-12 * w.max()
    X = rng.standard_normal((count, int(keep.sum()))) * np.sqrt(w[keep])
    X = X @ U[:, keep].T
    return X / np.linalg.norm(X, axis=1, keepdims=True)


SUPPORT_RTOL = 1e-9
"""Eigenvalues of the input covariance below ``1e-9`` times its largest are outside the support."""


def support_basis(cov, rtol: float = SUPPORT_RTOL) -> np.ndarray:
    """Orthonormal rows ``[r, d]`` spanning the range of ``cov [d, d]`` (symmetric positive semi-definite): the
    eigenvectors with eigenvalue above ``rtol`` times the largest.

    Raises ``ValueError`` for a ``cov`` that is not square or symmetric, or is zero.
    """
    rtol = check_real(rtol, "rtol", 0.0, 1.0)
    w, U = _symmetric_eigh(cov, "the inputs have no support")
    return U[:, w > rtol * w.max()].T.copy()


def on_support(D, basis: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(P D, share)``: the rows of ``D [n, d]`` projected onto the span of ``basis [r, d]`` (orthonormal rows) and
    the share of each row's squared norm that lies there (``[n]`` in ``[0, 1]``).

    Raises ``ValueError`` naming ``name`` for a bad direction set, a width other than the basis's, or a row with no
    component on the support (it has no direction there).
    """
    D = direction_set(D, name)
    B = to_numpy(basis, "basis")
    if B.ndim != 2 or B.shape[1] != D.shape[1]:
        raise ValueError(f"basis must be [r, d = {D.shape[1]}] (the width of {name}), got shape {list(B.shape)}")
    P = (D @ B.T) @ B
    share = (P**2).sum(1) / (D**2).sum(1)
    if np.any(share <= 1e-24):
        raise ValueError(f"{name} has rows {np.flatnonzero(share <= 1e-24)[:10].tolist()} with no component on the "
                         "inputs' support: no direction there")
    return P, share


def random_on_support(basis: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` directions uniform on the unit sphere of the span of ``basis [r, d]`` (orthonormal rows):
    ``[count, d]`` unit rows."""
    B = to_numpy(basis, "basis")
    return random_isotropic(B.shape[0], count, rng) @ B


@dataclass(frozen=True)
class Baseline:
    """MMCS and recovered count of a reference set against random sets, over ``n_draws`` draws."""

    mmcs_mean: float
    mmcs_se: float
    recovered_mean: float
    recovered_se: float
    count: int
    """Directions per random set."""
    n_draws: int
    threshold: float

    def as_dict(self) -> dict:
        return {"mmcs": self.mmcs_mean, "mmcs_se": self.mmcs_se, "recovered": self.recovered_mean,
                "recovered_se": self.recovered_se, "count": self.count, "n_draws": self.n_draws,
                "threshold": self.threshold}


def _se(v: np.ndarray) -> float:
    return float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")


def baseline(reference, count: int, draw: Callable[[int, np.random.Generator], np.ndarray], *, threshold: float,
             n_draws: int = 20, seed: int = 0) -> Baseline:
    """MMCS / recovered count of ``reference [n, d]`` against ``draw(count, rng) -> [count, d]`` random sets (e.g.
    ``lambda c, g: random_isotropic(d, c, g)``), mean and standard error over ``n_draws`` draws (``seed``: the
    generator's seed). Raises ``ValueError`` for ``n_draws < 2`` or a bad threshold."""
    count = check_int(count, "count")
    n_draws = check_int(n_draws, "n_draws", minimum=2)
    threshold = check_real(threshold, "threshold", 0.0, 1.0)
    rng = np.random.default_rng(seed)
    mm, rec = np.empty(n_draws), np.empty(n_draws)
    for i in range(n_draws):
        m = match(reference, draw(count, rng))
        mm[i], rec[i] = m.mmcs, m.recovered(threshold)
    return Baseline(float(mm.mean()), _se(mm), float(rec.mean()), _se(rec), count, n_draws, threshold)
