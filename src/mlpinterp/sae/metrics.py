"""SAE metrics: reconstruction (MSE, FVU, L0, dead fraction) and dictionary similarity (MMCS).

MMCS, the mean max cosine similarity of Sharkey et al. 2022 ("Taking features out of superposition with
sparse autoencoders"), compares two dictionaries ``A [n, d]`` and ``B [m, d]`` (one feature per row):

* ``matching="max"``: ``mean_i max_j cos(A_i, B_j)`` (the original, not one-to-one);
* ``matching="hungarian"``: a one-to-one matching that maximises the total cosine similarity
  (``scipy.optimize.linear_sum_assignment``), then the mean over the ``min(n, m)`` matched pairs. This is what
  Marks et al. 2024 (sec. 3, eq. 1) use in the MFR penalty. Gradients flow through the matched cosines;
  the assignment itself is piecewise constant.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor


def _check_dict(w: Tensor, name: str) -> Tensor:
    if not isinstance(w, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [n_features, d], got {type(w).__name__}")
    if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 1:
        raise ValueError(f"{name} must have shape [n_features, d], got {list(w.shape)}")
    if not w.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {w.dtype}")
    return w


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """Cosine similarities ``[n, m]`` between the rows of ``a [n, d]`` and ``b [m, d]`` (differentiable)."""
    _check_dict(a, "a")
    _check_dict(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must have the same width d, got a {list(a.shape)} and b {list(b.shape)}")
    eps = torch.finfo(a.dtype).eps
    an = a / a.norm(dim=1, keepdim=True).clamp_min(eps)
    bn = b / b.norm(dim=1, keepdim=True).clamp_min(eps)
    return an @ bn.t()


class Matching(NamedTuple):
    """A one-to-one matching between the rows of two dictionaries."""

    rows: np.ndarray
    """Indices into ``a`` (``[min(n, m)]``)."""

    cols: np.ndarray
    """Matched indices into ``b``."""

    cosines: Tensor
    """Matched cosine similarities (differentiable), ``[min(n, m)]``."""


def hungarian_match(a: Tensor, b: Tensor) -> Matching:
    """One-to-one matching of the rows of ``a [n, d]`` and ``b [m, d]`` maximising the summed cosine."""
    c = cosine_matrix(a, b)
    rows, cols = linear_sum_assignment(c.detach().cpu().double().numpy(), maximize=True)
    return Matching(rows, cols, c[torch.as_tensor(rows), torch.as_tensor(cols)])


def mmcs(a: Tensor, b: Tensor, matching: Literal["hungarian", "max"] = "hungarian") -> Tensor:
    """Mean max cosine similarity between dictionaries ``a [n, d]`` and ``b [m, d]`` (scalar in [-1, 1]).

    Differentiable in both arguments (through the selected cosines). Raises ``ValueError`` on bad shapes
    or an unknown ``matching``.
    """
    if matching == "hungarian":
        return hungarian_match(a, b).cosines.mean()
    if matching == "max":
        return cosine_matrix(a, b).max(dim=1).values.mean()
    raise ValueError(f"matching must be 'hungarian' or 'max', got {matching!r}")


def fvu(x: Tensor, x_hat: Tensor) -> Tensor:
    """Fraction of variance unexplained ``sum ||x - x_hat||^2 / sum ||x - mean_batch(x)||^2``.

    The denominator is the variance about the *mean* (not about zero). ``x, x_hat``: ``[batch, d]``.
    """
    if x.shape != x_hat.shape or x.ndim != 2:
        raise ValueError(f"x and x_hat must have the same shape [batch, d], got {list(x.shape)} and "
                         f"{list(x_hat.shape)}")
    return (x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum()


def mse(x: Tensor, x_hat: Tensor) -> Tensor:
    """Mean squared reconstruction error per element."""
    if x.shape != x_hat.shape:
        raise ValueError(f"x and x_hat must have the same shape, got {list(x.shape)} and {list(x_hat.shape)}")
    return (x - x_hat).pow(2).mean()


def l0(latent_acts: Tensor) -> Tensor:
    """Mean number of non-zero latents per sample; ``latent_acts``: ``[batch, k]`` or ``[batch, d_sae]``."""
    return (latent_acts != 0).sum(-1).double().mean()


def firing_counts(latent_acts: Tensor, latent_indices: Tensor, d_sae: int) -> Tensor:
    """How many samples of the batch each latent fired on (activation > 0): int64 ``[d_sae]``."""
    fired = latent_indices[latent_acts > 0]
    return torch.bincount(fired.reshape(-1), minlength=d_sae)


def dead_fraction(counts: Tensor) -> float:
    """Fraction of latents with zero count in ``counts [d_sae]`` (firing counts over a window)."""
    return float((counts == 0).double().mean())
