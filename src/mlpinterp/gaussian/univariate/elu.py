"""ELU (alpha = 1): y for y > 0, exp(y) - 1 otherwise. C^1 at 0; elu^{(m)} jumps by -1 at 0 for m >= 2.

Its Gaussian integrals use the quadrature (split at the kink); E[elu^{(j)}(Y)] is the quadrature of the smooth part
plus the delta terms of the jumps, E[delta^{(r)}(Y)] = He_r(c) pdf(c) / sigma^{r+1} with c = -mu / sigma.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.gaussian.hermite import he_stack
from mlpinterp.gaussian.univariate.common import pdf


def elu_pointwise_deriv(y, j):
    """elu^{(j)}(y), j >= 1, away from 0 (at 0: the mean of the one-sided values)."""
    neg = np.exp(np.minimum(y, 0.0))
    pos = 1.0 if j == 1 else 0.0
    return np.where(y > 0, pos, np.where(y < 0, neg, 0.5 * (pos + 1.0)))


def elu_delta_terms(val, mu, s, j):
    """``val`` (E of the smooth part of elu^{(j)}) plus the jumps' delta terms: elu^{(j)} += -sum_{r=0}^{j-3} delta^{(r)}."""
    c = -mu / s
    he = he_stack(max(j - 3, 0), c)
    for r in range(j - 2):
        val = val - he[:, r] * pdf(c) / s ** (r + 1)
    return val
