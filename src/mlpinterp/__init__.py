"""mlpinterp: decompose what trained feedforward networks compute.

* Function space: exact polynomial approximants (Rigg & Belrose 2025, arXiv 2502.01032).
* Parameter space: Attribution-based Parameter Decomposition (Braun et al. 2025).
* Activation space: TopK SAEs with Mutual Feature Regularization (Marks et al. 2024).

The public names below are imported lazily so that ``import mlpinterp`` stays fast.
"""

from __future__ import annotations

from mlpinterp.utils.lazy import lazy_getattr

__version__ = "0.1.0"

_EXPORTS = {
    "Gaussian": "mlpinterp.gaussian.distributions",
    "GaussianMixture": "mlpinterp.gaussian.distributions",
    "MLP": "mlpinterp.networks",
    "GLU": "mlpinterp.networks",
    "fit_polynomial": "mlpinterp.poly.fit",
    "RidgePolynomial": "mlpinterp.poly.approximant",
    "DensePolynomial": "mlpinterp.poly.approximant",
    "load_polynomial": "mlpinterp.poly.approximant",
    "fvu": "mlpinterp.poly.metrics",
    "fvu_on_data": "mlpinterp.poly.metrics",
    "kl_divergence": "mlpinterp.poly.metrics",
    "top1_agreement": "mlpinterp.poly.metrics",
    "quadratic_spectrum": "mlpinterp.poly.spectral",
    "linear_svd": "mlpinterp.poly.spectral",
    "ablate": "mlpinterp.poly.spectral",
    "get_activation": "mlpinterp.gaussian.activations",
    "from_hf": "mlpinterp.hf.blocks",
    "ffn_site": "mlpinterp.hf.blocks",
    "ffn_paths": "mlpinterp.hf.blocks",
    "FFNSite": "mlpinterp.hf.blocks",
    "from_module": "mlpinterp.hf.layouts",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__ = lazy_getattr(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return __all__
