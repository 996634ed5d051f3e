"""Evaluate a network checkpoint against its polynomial approximants (Rigg & Belrose 2025, §4).

For each checkpoint we fit four approximants, all exact (no sampling, no SGD):

* ``linear_mixture`` / ``quadratic_mixture``: optimal under the class-conditional Gaussian mixture of the
  training set (the paper's model of the data);
* ``linear_gaussian`` / ``quadratic_gaussian``: optimal under the single moment-matched Gaussian.

and measure, for each: FVU under the mixture (Monte Carlo, with standard error), FVU on the real test set,
KL(network || approximant) of the softmax outputs in nats (test set and mixture), the approximant's test
accuracy as a classifier and its top-1 agreement with the network.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.poly.fit import fit_polynomial
from mlpinterp.poly.metrics import fvu, fvu_from_outputs, kl_from_outputs
from mlpinterp.poly.spectral import ablated_outputs, pca_directions, random_directions, top_singular_directions

APPROXIMANTS: tuple[tuple[str, str, int], ...] = (
    ("linear_mixture", "mixture", 1),
    ("quadratic_mixture", "mixture", 2),
    ("linear_gaussian", "gaussian", 1),
    ("quadratic_gaussian", "gaussian", 2),
)
"""(name, distribution, degree) of the approximants fitted at every checkpoint."""


@dataclass(frozen=True)
class EvalInputs:
    """What every checkpoint is evaluated against.

    mixture : class-conditional Gaussian mixture of the training set; gaussian : its moment-matched Gaussian;
    X_test ``[n_test, d_in]``, y_test ``[n_test]``; mc_samples, mc_seed: the size and seed of fixed Monte Carlo
    draws from the mixture shared by all checkpoints (common random numbers make curves over steps smooth), drawn
    by :meth:`mixture_samples` when a checkpoint is evaluated.
    """

    mixture: GaussianMixture
    gaussian: Gaussian
    X_test: np.ndarray
    y_test: np.ndarray
    mc_samples: int
    mc_seed: int = 12345

    def mixture_samples(self) -> np.ndarray:
        """The fixed Monte Carlo draws ``[mc_samples, d_in]`` (float64; the same values at every call).

        Drawn anew for each checkpoint instead of kept: their 125 MB (MNIST, 20,000 samples) are then not resident
        through the mixture-quadratic solves, where the main job's memory peaks.
        """
        return self.mixture.sample(self.mc_samples, np.random.default_rng(self.mc_seed))


def fit_approximants(network, inputs: EvalInputs, *, quadratic_mixture: bool = True, warm_start=None,
                     cg_dtype: str = "float64") -> tuple[dict, dict]:
    """Fit the approximants of ``APPROXIMANTS``; returns ``(approximants, fit_seconds)``.

    The mixture quadratic is the cached dense solve when it fits (digits); otherwise matrix-free CG in
    ``cg_dtype`` (float64 residuals either way), started from ``warm_start`` (the previous checkpoint's mixture
    quadratic: the same answer as a cold start, in fewer iterations) when given.
    """
    from mlpinterp.poly.mixture.cached_dense import MAX_FEATURES, feature_count

    out, secs = {}, {}
    for name, dist_name, degree in APPROXIMANTS:
        if name == "quadratic_mixture" and not quadratic_mixture:
            continue
        dist = inputs.mixture if dist_name == "mixture" else inputs.gaussian
        t0 = time.perf_counter()
        if name == "quadratic_mixture" and feature_count(network.d_in) > MAX_FEATURES:
            out[name] = fit_polynomial(network, dist, degree, method="cg", warm_start=warm_start, dtype=cg_dtype)
        else:
            out[name] = fit_polynomial(network, dist, degree)
        secs[name] = time.perf_counter() - t0
    return out, secs


def _summary(f: np.ndarray, q: np.ndarray) -> tuple[dict, dict]:
    r = fvu_from_outputs(f, q)
    kl, kl_se = kl_from_outputs(f, q)
    return {"fvu": r.fvu, "stderr": r.stderr}, {"nats": kl, "stderr": kl_se}


def evaluate_checkpoint(network, inputs: EvalInputs, *, quadratic_mixture: bool = True, warm_start=None,
                        cg_dtype: str = "float64") -> tuple[dict, dict]:
    """All metrics of one checkpoint as a JSON-ready dict (see module docstring), and the fitted approximants.

    The network and each approximant are evaluated once on the test set and once on the mixture samples.
    ``quadratic_mixture=False`` skips the (at MNIST scale, iterative) mixture quadratic; ``warm_start`` and
    ``cg_dtype``: see ``fit_approximants``.
    """
    approx, secs = fit_approximants(network, inputs, quadratic_mixture=quadratic_mixture, warm_start=warm_start,
                                    cg_dtype=cg_dtype)
    mc = inputs.mixture_samples()  # after the fit: not resident through the solve
    f_test, f_mix = network(inputs.X_test), network(mc)
    res: dict = {"network": {"test_accuracy": float((f_test.argmax(1) == inputs.y_test).mean())}, "approximants": {}}
    for name, p in approx.items():
        q_test, q_mix = p(inputs.X_test), p(mc)
        fvu_test, kl_test = _summary(f_test, q_test)
        fvu_mix, kl_mix = _summary(f_mix, q_mix)
        entry = {
            "fvu_mixture": fvu_mix,
            "fvu_test": fvu_test,
            "kl_test": kl_test,
            "kl_mixture": kl_mix,
            "test_accuracy": float((q_test.argmax(1) == inputs.y_test).mean()),
            "top1_agreement_test": float((q_test.argmax(1) == f_test.argmax(1)).mean()),
            "fit_seconds": secs[name],
        }
        if name.endswith("gaussian"):
            exact = fvu(network, p, inputs.gaussian)
            entry["fvu_gaussian"] = {"fvu": exact.fvu, "stderr": exact.stderr, "method": exact.method}
        if getattr(p, "solver_info", None):
            entry["solver_info"] = {k: v for k, v in p.solver_info.items() if k != "residual_history"}
        res["approximants"][name] = entry
    return res, approx


def svd_attack(network, approximants: dict, X_train, X_test, y_test, *, input_cov: np.ndarray, k_max: int = 10,
               seed: int = 0) -> dict:
    """Test accuracy of the network and approximants as k = 0..k_max input directions are projected out.

    Directions (Rigg & Belrose 2025, §4.3): ``svd``: the top-k right singular vectors of the linear
    approximant's coefficients mapped through the input covariance, ``B Sigma = Cov(f, x)`` (``B`` from
    ``approximants["linear_mixture"]``, ``Sigma = input_cov [d_in, d_in]``); ``svd-raw``: those of ``B`` itself,
    which under real-image covariances are dominated by nearly constant pixels (``B`` contains ``Sigma^-1``);
    baselines: k random orthonormal directions and the top-k PCA directions of the training data.
    Returns ``{method: {model: [acc_k for k in 0..k_max]}, "k": [...]}``. Raises ``ValueError`` when ``k_max``
    exceeds the number of singular directions, ``min(d_out, d_in)`` (it is never silently lowered).
    """
    lin = approximants["linear_mixture"]
    B = lin.coefficients(1)
    d = X_test.shape[1]
    if isinstance(k_max, bool) or not isinstance(k_max, int) or not 0 <= k_max <= min(B.shape):
        raise ValueError(f"k_max must be an int in [0, min(d_out, d_in) = {min(B.shape)}] (the singular directions of "
                         f"B [d_out, d_in] = {list(B.shape)}), got {k_max!r}")
    dirs = {
        "svd": top_singular_directions(B @ input_cov, k_max),
        "svd-raw": top_singular_directions(B, k_max),
        "random": random_directions(d, k_max, seed),
        "pca": pca_directions(X_train, k_max),
    }
    models = {"network": network, **{k: v for k, v in approximants.items() if k.endswith("mixture")}}
    out: dict = {}
    y_test = np.asarray(y_test)
    base = {m: np.asarray(f(X_test)) for m, f in models.items()}
    for method, V in dirs.items():
        # the polynomials' ablated outputs follow from one evaluation each (spectral.ablated_outputs)
        out[method] = {m: [float((q.argmax(1) == y_test).mean()) for q in ablated_outputs(f, X_test, V, base=base[m])]
                       for m, f in models.items()}
    out["k"] = list(range(k_max + 1))
    return out
