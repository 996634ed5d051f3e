"""Inactivity measures of an SAE's latents after TopK, and the re-initialisation rule of Mutual Feature
Regularization (Marks et al. 2024, sec. 3.3).

Each measure maps the firing counts ``counts [d_sae]`` of ``n_samples`` inputs at sparsity ``k`` to one
dimensionless number; an SAE whose measure exceeds the threshold is re-initialised (:func:`should_reinit`).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor


def cubed_relative_deviation(counts: Tensor, n_samples: int, k: int) -> float:
    """``mean_j |r_j / t - 1|**3`` with ``r_j = counts_j / n_samples`` and ``t = k / d_sae`` (dimensionless).

    0 when every latent fires at the uniform rate; 1 when all latents are dead; grows cubically when a
    few latents fire far more often than ``t``.
    """
    t = k / counts.shape[-1]
    r = counts.double() / n_samples
    return float((r / t - 1).abs().pow(3).mean())


def mean_relative_deviation(counts: Tensor, n_samples: int, k: int) -> float:
    """``mean_j |r_j / t - 1|`` with ``r_j = counts_j / n_samples`` and ``t = k / d_sae`` (dimensionless): the
    mean deviation of the activation frequency from the uniform ``k / N``, relative to it (Marks et al. 2024,
    sec. 3.3, whose threshold is 1).

    0 when every latent fires at the uniform rate; 1 when all are dead. With exactly ``k`` firings per sample
    (``sum_j r_j = k``) it is twice the total-variation distance between the firing distribution and the uniform
    one, so it lies in ``[0, 2)`` and exceeds 1 when more than half of the firing mass is misplaced: a fraction
    ``f`` of dead latents with the others uniform scores ``2 f``; one latent firing on every sample scores
    about ``2 / k``.
    """
    t = k / counts.shape[-1]
    r = counts.double() / n_samples
    return float((r / t - 1).abs().mean())


def dead_fraction_measure(counts: Tensor, n_samples: int, k: int) -> float:
    """Fraction of latents that did not fire at all during the window."""
    return float((counts == 0).double().mean())


INACTIVITY_MEASURES: dict[str, Callable[[Tensor, int, int], float]] = {
    "mean_relative_deviation": mean_relative_deviation,
    "cubed_relative_deviation": cubed_relative_deviation,
    "dead_fraction": dead_fraction_measure,
}
"""Name -> ``measure(counts [d_sae], n_samples, k) -> float``; an SAE is re-initialised when measure > threshold."""


def should_reinit(measure: float, threshold: float) -> bool:
    """Re-initialisation rule: strictly above the threshold (NaN never triggers)."""
    return bool(measure > threshold)
