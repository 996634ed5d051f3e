"""The three spaces' direction sets against ground truth and against each other, each beside a random baseline of
the same count (:mod:`mlpinterp.studies.three_spaces.directions`)."""

from __future__ import annotations

import numpy as np

from mlpinterp.studies.three_spaces.directions import (
    baseline,
    match,
    random_gaussian,
    random_isotropic,
    random_on_support,
)
from mlpinterp.studies.three_spaces.settings import BASELINE_DRAWS, RECOVERED_COSINE


def against_truth(truth: np.ndarray, sets: dict[str, np.ndarray], *, seed: int = 0,
                  support: np.ndarray | None = None) -> dict:
    """For each method: MMCS of the true directions to its set (mean over true features of the best ``|cos|``, with
    its s.e. over the features), true features recovered at :data:`RECOVERED_COSINE`, distinct directions doing so,
    and the same for random sets of the method's count (mean ± s.e. over :data:`BASELINE_DRAWS` draws), uniform on
    the sphere of the span of ``support [r, d]`` (orthonormal rows: the inputs' support the sets were projected on)
    or, without it, of the whole space."""
    d = truth.shape[1]
    draw = (lambda c, g: random_isotropic(d, c, g)) if support is None else \
        (lambda c, g: random_on_support(support, c, g))
    out = {}
    for i, (name, D) in enumerate(sets.items()):
        m = match(truth, D)
        b = baseline(truth, D.shape[0], draw, threshold=RECOVERED_COSINE, n_draws=BASELINE_DRAWS,
                     seed=seed * 1000 + i)
        out[name] = {"mmcs": m.mmcs, "mmcs_se": m.mmcs_se, "recovered": m.recovered(RECOVERED_COSINE),
                     "distinct": m.distinct(RECOVERED_COSINE), "count": int(D.shape[0]),
                     "max_cos": m.max_cos.tolist(), "random": b.as_dict()}
    return out


def pairwise(sets: dict[str, np.ndarray], cov: np.ndarray, *, seed: int = 0) -> dict:
    """For each ordered pair ``(a, b)`` of methods: MMCS of ``a``'s directions to ``b``'s set (with its s.e. over
    ``a``'s directions) and to random sets of ``b``'s count drawn from ``N(0, cov)`` (``cov``: the held-out inputs'
    covariance), ``{a: {b: {...}}}``."""
    out: dict = {}
    names = list(sets)
    for i, a in enumerate(names):
        out[a] = {}
        for j, b in enumerate(names):
            if a == b:
                continue
            m = match(sets[a], sets[b])
            rb = baseline(sets[a], sets[b].shape[0], lambda c, g: random_gaussian(cov, c, g),
                          threshold=RECOVERED_COSINE, n_draws=BASELINE_DRAWS, seed=seed * 1000 + 10 * i + j)
            out[a][b] = {"mmcs": m.mmcs, "mmcs_se": m.mmcs_se, "recovered": m.recovered(RECOVERED_COSINE),
                         "count_a": int(sets[a].shape[0]), "count_b": int(sets[b].shape[0]), "random": rb.as_dict()}
    return out
