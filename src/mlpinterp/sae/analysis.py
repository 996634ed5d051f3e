"""Analyses of SAE dictionaries against each other and against known features (Marks et al. 2024, sec. 4.1).

* :func:`mmcs_to_truth`: Hungarian MMCS between an SAE's decoder rows and the ground-truth features.
* :func:`feature_similarities`: for every latent of every SAE, (a) its *cross-SAE similarity*, the mean over
  the other SAEs of its best cosine similarity with their latents, and (b) its *truth similarity*, its best
  cosine similarity with a ground-truth feature.
* :func:`cross_truth_correlation`: Pearson correlation between (a) and (b) over all latents (the paper's
  motivating statistic: 0.625 for independently trained SAEs, 0.668 with re-initialisation).
* :func:`shared_false_cluster`: latents that the SAEs agree on (cross similarity >= ``shared_min``) but that
  match no true feature (truth similarity < ``truth_max``), with their firing rate vs the others'.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from mlpinterp.sae.metrics import _check_dict, cosine_matrix, mmcs


def _decoders(decoders) -> list[Tensor]:
    """``decoders``: a list/tuple (or a stacked ``[N, d_sae, d]`` tensor) of at least two ``[d_sae, d]`` tensors."""
    if isinstance(decoders, Tensor):
        if decoders.ndim != 3:
            raise ValueError(f"decoders as one tensor must have shape [n_saes, d_sae, d], got {list(decoders.shape)}")
        decoders = list(decoders)
    if not isinstance(decoders, (list, tuple)):
        raise TypeError(f"decoders must be a list of [d_sae, d] tensors, got {type(decoders).__name__}")
    if len(decoders) < 2:
        raise ValueError(f"decoders must hold at least 2 dictionaries, got {len(decoders)}")
    for i, d in enumerate(decoders):
        _check_dict(d, f"decoders[{i}]")
    shapes = {tuple(d.shape) for d in decoders}
    if len(shapes) != 1:
        raise ValueError(f"decoders must all have the same shape [d_sae, d], got {sorted(shapes)}")
    return list(decoders)


def mmcs_to_truth(w_dec: Tensor, features: Tensor) -> float:
    """Hungarian MMCS between ``w_dec [d_sae, d]`` and true ``features [G, d]`` (mean over min(d_sae, G) pairs)."""
    _check_dict(w_dec, "w_dec")
    _check_dict(features, "features")
    return float(mmcs(w_dec.detach().double(), features.detach().double(), matching="hungarian"))


@dataclass(frozen=True)
class FeatureSimilarities:
    """Per-latent similarities, ``[n_saes, d_sae]`` each (float64 numpy)."""

    cross: np.ndarray
    """Mean over the other SAEs of the latent's max cosine similarity with their latents."""

    truth: np.ndarray
    """Max cosine similarity with any ground-truth feature."""


def feature_similarities(decoders: list[Tensor], features: Tensor) -> FeatureSimilarities:
    """Cross-SAE and truth similarity of every latent; ``decoders``: ``N >= 2`` tensors ``[d_sae, d]``.

    Raises ``ValueError`` when fewer than two decoders are given or the widths disagree.
    """
    decoders = _decoders(decoders)
    _check_dict(features, "features")
    if features.shape[1] != decoders[0].shape[1]:
        raise ValueError(f"features must have width d={decoders[0].shape[1]} like the decoders, got {list(features.shape)}")
    decs = [d.detach().double() for d in decoders]
    f = features.detach().double()
    n = len(decs)
    cross = np.zeros((n, decs[0].shape[0]))
    truth = np.zeros((n, decs[0].shape[0]))
    for i in range(n):
        others = [cosine_matrix(decs[i], decs[j]).max(dim=1).values for j in range(n) if j != i]
        cross[i] = torch.stack(others).mean(0).numpy()
        truth[i] = cosine_matrix(decs[i], f).max(dim=1).values.numpy()
    return FeatureSimilarities(cross, truth)


def cross_truth_correlation(decoders: list[Tensor], features: Tensor) -> dict:
    """Pearson ``r`` (and p-value, n) between cross-SAE and truth similarity over all latents of all SAEs."""
    sims = feature_similarities(decoders, features)
    a, b = sims.cross.ravel(), sims.truth.ravel()
    if np.ptp(a) < 1e-9 or np.ptp(b) < 1e-9:  # constant input: correlation undefined
        return {"r": float("nan"), "p": float("nan"), "n": int(a.size)}
    res = stats.pearsonr(a, b)
    return {"r": float(res.statistic), "p": float(res.pvalue), "n": int(a.size)}


def shared_false_cluster(decoders: list[Tensor], features: Tensor, firing_rates: Tensor | np.ndarray,
                         shared_min: float = 0.9, truth_max: float = 0.5) -> dict:
    """Latents shared across SAEs (cross >= ``shared_min``) yet far from every true feature (truth < ``truth_max``).

    ``firing_rates``: ``[n_saes, d_sae]`` fraction of samples on which each latent fired. Returns the cluster
    size, its fraction of all latents, and the mean firing rate inside vs outside the cluster (fractions).
    """
    for name, v in (("shared_min", shared_min), ("truth_max", truth_max)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite real number (a cosine threshold), got {v!r}")
    sims = feature_similarities(decoders, features)
    if isinstance(firing_rates, Tensor):
        firing_rates = firing_rates.detach().cpu().double().numpy()
    try:
        rates = np.asarray(firing_rates, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"firing_rates must be a numeric array [n_saes, d_sae], got {type(firing_rates).__name__}") from e
    if rates.shape != sims.cross.shape:
        raise ValueError(f"firing_rates must have shape {list(sims.cross.shape)}, got {list(rates.shape)}")
    if not np.all(np.isfinite(rates)) or rates.min() < 0 or rates.max() > 1:
        raise ValueError("firing_rates must be finite fractions in [0, 1]")
    mask = (sims.cross >= shared_min) & (sims.truth < truth_max)
    inside = rates[mask]
    outside = rates[~mask]
    return {
        "count": int(mask.sum()),
        "fraction": float(mask.mean()),
        "rate_in_cluster": float(inside.mean()) if inside.size else float("nan"),
        "rate_outside": float(outside.mean()) if outside.size else float("nan"),
        "shared_min": shared_min,
        "truth_max": truth_max,
    }
