"""How Gaussian are a block's real inputs? Diagnostics that explain when a Gaussian input model fails.

The closed-form approximant under one Gaussian depends on the inputs only through each neuron's pre-activation
law ``y_j = w_j . x + b_j`` (Rigg & Belrose 2025, eq. 6: the optimal degree-n approximant truncates each neuron's
Hermite expansion about N(E y_j, Var y_j)). So the diagnostics look at the inputs along their top principal
directions and, above all, at the neurons' standardised pre-activations on real tokens:

* ``pc_excess_kurtosis`` ``[n_pcs]``: excess kurtosis along the top principal directions (0 for a Gaussian;
  large values mean heavy tails / outlier tokens).
* ``outlier_dims`` / ``outlier_variance_fraction``: coordinates whose variance exceeds ``outlier_factor`` times the
  median coordinate variance (the "outlier dimensions" of transformer residual streams) and their share of the
  total variance.
* ``neuron_excess_kurtosis_median``, ``neuron_tail_fraction`` (fraction of |z| > 3 over all neurons and tokens,
  0.0027 for a Gaussian), ``neuron_w1_median``: median over neurons of the 1-Wasserstein distance between the
  standardised pre-activation and N(0, 1) (scipy.stats.wasserstein_distance against Gaussian quantiles).
* ``neuron_bimodality_fraction``: fraction of neurons with Sarle's bimodality coefficient
  (skew^2 + 1) / (kurtosis + 3 (n-1)^2 / ((n-2)(n-3))) above 5/9 (the uniform distribution's value; a Gaussian's is 1/3).
"""

from __future__ import annotations

import numpy as np
import scipy.stats

from mlpinterp.utils.validation import check_int, check_real, to_numpy

#: A principal direction or a neuron counts as varying when its standard deviation exceeds this fraction of the
#: scale of the values (below it the "variation" is float64 rounding, and its kurtosis a meaningless number).
_REL_SD = 1e-10


def gaussianity(X, W=None, b=None, *, n_pcs: int = 10, outlier_factor: float = 10.0, max_neurons: int = 512,
                seed: int = 0) -> dict:
    """Gaussianity diagnostics of inputs ``X [n, d_in]`` and, given ``W [d_hidden, d_in]`` and ``b [d_hidden]``,
    of the pre-activations ``X W^T + b`` (a seeded subsample of ``max_neurons`` neurons). See module docstring.

    Principal directions with (numerically) zero variance are left out (``pc_*`` lists may be shorter than
    ``n_pcs``), as are neurons whose pre-activation does not vary (dead on these inputs).

    Raises ``TypeError``/``ValueError`` for a non-numeric (complex included) or non-finite ``X``, ``W`` or ``b``,
    fewer than 8 inputs, a width mismatch, inputs that do not vary at all, or (with ``W``) no neuron whose
    pre-activation varies.
    """
    X = to_numpy(X, "X")
    if X.ndim != 2 or X.shape[0] < 8:
        raise ValueError(f"X must have shape [n >= 8, d_in], got {list(X.shape)}")
    n_pcs = check_int(n_pcs, "n_pcs", minimum=1)
    max_neurons = check_int(max_neurons, "max_neurons", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    check_real(outlier_factor, "outlier_factor", 1.0)
    Xc = X - X.mean(0)
    Xs = Xc[: min(X.shape[0], 20_000)]
    w, V = np.linalg.eigh(Xs.T @ Xs)  # principal directions from the d x d Gram: ~10x cheaper than an SVD of Xs
    S, Vt = np.sqrt(np.clip(w[::-1], 0.0, None)), V[:, ::-1].T
    scale = float(np.abs(X).max())
    varying = S > _REL_SD * max(scale, 1e-300) * np.sqrt(min(X.shape[0], 20_000))
    if not varying.any():
        raise ValueError(f"X ({X.shape[0]} inputs) does not vary: every input is the same vector, so no Gaussianity "
                         "statistic is defined")
    P = Xc @ Vt[: min(n_pcs, int(varying.sum()))].T
    var = Xc.var(0)
    med = float(np.median(var))
    out = var > outlier_factor * max(med, 1e-300)
    res = {
        "n_tokens": int(X.shape[0]),
        "pc_excess_kurtosis": scipy.stats.kurtosis(P, axis=0, fisher=True).tolist(),
        "pc_variance_fraction": (S[: P.shape[1]] ** 2 / float((S**2).sum())).tolist(),
        "outlier_dims": np.flatnonzero(out).tolist(),
        "outlier_variance_fraction": float(var[out].sum() / var.sum()) if var.sum() > 0 else 0.0,
    }
    if W is not None:
        W = to_numpy(W, "W")
        b = np.zeros(W.shape[0] if W.ndim else 0) if b is None else to_numpy(b, "b")
        if W.ndim != 2 or W.shape[1] != X.shape[1] or b.shape != (W.shape[0],):
            raise ValueError(f"W must be [d_hidden, d_in={X.shape[1]}] and b [d_hidden], got {list(W.shape)}, "
                             f"{list(b.shape)}")
        rng = np.random.default_rng(seed)
        idx = np.sort(rng.choice(W.shape[0], size=min(max_neurons, W.shape[0]), replace=False))
        Y = X @ W[idx].T + b[idx]
        sd = Y.std(0)
        live = sd > _REL_SD * np.maximum(np.abs(Y).max(0), 1e-300)
        if not live.any():
            raise ValueError(f"none of the {idx.size} neurons checked has a pre-activation that varies on X (all dead "
                             "on these inputs): no pre-activation statistic is defined")
        Z = (Y[:, live] - Y[:, live].mean(0)) / sd[live]
        n = Z.shape[0]
        skew = scipy.stats.skew(Z, axis=0)
        kurt = scipy.stats.kurtosis(Z, axis=0, fisher=True)
        bc = (skew**2 + 1) / (kurt + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))
        q = scipy.stats.norm.ppf((np.arange(min(n, 4096)) + 0.5) / min(n, 4096))
        sub = Z[rng.choice(n, size=min(n, 4096), replace=False)] if n > 4096 else Z
        w1 = [scipy.stats.wasserstein_distance(sub[:, j], q) for j in range(Z.shape[1])]
        res.update({
            "neurons_checked": int(Z.shape[1]),
            "neuron_excess_kurtosis_median": float(np.median(kurt)),
            "neuron_excess_kurtosis_p90": float(np.quantile(kurt, 0.9)),
            "neuron_tail_fraction": float((np.abs(Z) > 3).mean()),
            "neuron_w1_median": float(np.median(w1)),
            "neuron_bimodality_fraction": float((bc > 5 / 9).mean()),
        })
    return res
