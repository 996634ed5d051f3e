"""Ridge quadratics in factored form, for the mixture operator (``MixtureOperator.apply_factored``): the right-hand
side and the anchor's residual.

The right-hand side of the mixture normal equations is ``sum_k pi_k M_k theta_k`` with ``theta_k`` the
single-Gaussian quadratic of component k (``operator`` module docstring), and the pooled-Gaussian anchor's
residual needs ``M theta_pool``. These quadratics come from ``fit_ridge`` on an MLP, so their quadratic part has
rank <= d_hidden per output: in u coordinates ``A_o = L^T diag(w_o) L`` with ``L = A_ridge R`` ``[h, r]`` and
``w = W2 * gamma`` ``[o, h]`` (``coordinates.factored_quadratic_in_u`` builds them). With ``G_k = L S_k`` ``[h, r]``:

    A m_k = L^T (w_o * (L m_k)),   tr(A S_k) = w_o . diag(L S_k L^T),   S_k A S_k = G_k^T diag(w_o) G_k,

so one application costs ``2 K h r^2`` for the ``G_k`` plus, per output, one GEMM ``[r, K h] x [K h, r]`` that sums
``2 pi_k S_k A_k S_k`` over all components at once (``2 o r^2 K h`` in all), instead of building each ``[o, r, r]``
``A_k`` (``2 o h r^2``) and the generic ``S_k A_k S_k`` (``4 o r^3``) per component: at MNIST scale (r = 712,
h = 512, K = o = 10) 57 instead of 196 GFLOP, in float64, and without the generic path's dozen ``[o, r, r]``
temporaries per component (measured in ``docs/measurements.md``, "Mixture solver"). The moment formulas are those of
``operator._component_apply`` (Isserlis' theorem); the result is the same tensors to rounding
(``tests/test_mixture_cg.py``). GLU ridge quadratics (a gate-residual term, not of this form) use the generic path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FactoredQuadratic:
    """``p(u) = c + b.u + u^T A u`` per output with ``A_o = L^T diag(w_o) L``.

    c ``[o]``, b ``[o, r]``, L ``[h, r]``, w ``[o, h]`` (numpy float64; u: the support coordinates).
    """

    c: np.ndarray
    b: np.ndarray
    L: np.ndarray
    w: np.ndarray
