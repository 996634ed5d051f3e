"""E[phi^{(j)}(Y)] for activations without a closed form, and the pointwise derivatives phi^{(j)}(y) of every family.

Named smooth activations (:mod:`~mlpinterp.gaussian.univariate.sigmoid`, the tanh GELU) and elu: quadrature of the
analytic phi^{(j)} (plus elu's delta terms), which keeps relative accuracy in the tails. Other activations: the same
with torch-autograd derivatives for sigma < 1 when phi has no kinks and its torch_fn is differentiable, else
Gaussian integration by parts E[phi(Y) He_j(Z)] / sigma^j (Stein's lemma).
"""

from __future__ import annotations

import numpy as np

from mlpinterp.gaussian.activations import Activation, leaky_slope
from mlpinterp.gaussian.hermite import he_stack
from mlpinterp.gaussian.univariate.common import family
from mlpinterp.gaussian.univariate.elu import elu_delta_terms, elu_pointwise_deriv
from mlpinterp.gaussian.univariate.gelu import gelu_pointwise_deriv, gelu_tanh_deriv
from mlpinterp.gaussian.univariate.quadrature import quad_hermite_e, quad_moments
from mlpinterp.gaussian.univariate.relu import relu_pointwise_deriv
from mlpinterp.gaussian.univariate.sigmoid import SIGMOID_FAMILY, sigmoid_family_deriv

_S_IBP = 1.0  # autograd derivatives: integration by parts for sigma >= _S_IBP, quadrature of phi^{(j)} below
ANALYTIC_DERIV = ("gelu_tanh", *SIGMOID_FAMILY, "elu")


def autograd_deriv(torch_fn, y: np.ndarray, j: int) -> np.ndarray | None:
    """phi^{(j)}(y) by nested torch autograd in float64; None if torch_fn is not differentiable."""
    import torch

    yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64).reshape(-1)).requires_grad_(True)
    out = torch_fn(yt)
    if j == 0:
        return out.detach().numpy().reshape(y.shape)
    if not out.requires_grad:
        return None
    for i in range(j):
        if not out.requires_grad:  # derivative identically zero from here on
            return np.zeros(y.shape)
        (out,) = torch.autograd.grad(out.sum(), yt, create_graph=i < j - 1, allow_unused=True)
        if out is None:
            return np.zeros(y.shape)
    return out.detach().numpy().reshape(y.shape)


def smooth_deriv(act: Activation, y: np.ndarray, j: int) -> np.ndarray | None:
    """phi^{(j)}(y) away from kinks (at a kink: mean of one-sided values); None if unavailable."""
    fam = family(act)
    if j == 0:
        return act.fn(y)
    if fam == "identity":
        return np.ones_like(y) if j == 1 else np.zeros_like(y)
    if fam in ("relu", "leaky_relu"):
        return relu_pointwise_deriv(y, j, 0.0 if fam == "relu" else leaky_slope(act))
    if fam == "gelu":
        return gelu_pointwise_deriv(y, j)
    if fam in SIGMOID_FAMILY:
        return sigmoid_family_deriv(fam, y, j)
    if fam == "elu":
        return elu_pointwise_deriv(y, j)
    if fam == "gelu_tanh":
        return gelu_tanh_deriv(y, j)
    try:
        return autograd_deriv(act.torch_fn, y, j)
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return None


def delta_limit(terms: list[tuple[float, int]]) -> float:
    """lim_{sigma -> 0+} sum_i a_i He_{r_i}(0) pdf(0) / sigma^(r_i + 1): 0 or +-inf."""
    best_r, best = -1, 0.0
    for a, r in terms:
        he0 = he_stack(r, np.zeros(1))[0, r]
        if a * he0 != 0 and r > best_r:
            best_r, best = r, a * he0
    return float(np.sign(best) * np.inf) if best != 0 else 0.0


def numeric_derivative_ev(act, fam, mu, s, j):
    """E[phi^{(j)}(Y)] for flat ``mu``, ``s > 0`` by quadrature (see the module docstring for the method)."""
    out = np.empty(mu.shape)
    if fam in ANALYTIC_DERIV:
        use_quad = np.ones(mu.shape, dtype=bool)
    else:
        use_quad = np.zeros(mu.shape, dtype=bool)
        small = s < _S_IBP
        if np.any(small) and not act.kinks:
            probe = smooth_deriv(act, np.zeros(1), j)
            use_quad = small if probe is not None else use_quad
    ibp = ~use_quad
    if np.any(ibp):
        out[ibp] = quad_hermite_e(act, mu[ibp], s[ibp], j)[:, j] / s[ibp] ** j
    if np.any(use_quad):
        m, sg = mu[use_quad], s[use_quad]
        val = quad_moments(lambda y: smooth_deriv(act, y, j), act.kinks, m, sg, 0)[:, 0]
        if fam == "elu":
            val = elu_delta_terms(val, m, sg, j)
        out[use_quad] = val
    return out
