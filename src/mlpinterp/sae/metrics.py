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
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"{name} contains {int((~torch.isfinite(w)).sum())} non-finite value(s) (NaN or inf)")
    return w


def _check_pair(x: Tensor, x_hat: Tensor) -> None:
    for name, t in (("x", x), ("x_hat", x_hat)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if x.shape != x_hat.shape:
        raise ValueError(f"x and x_hat must have the same shape, got {list(x.shape)} and {list(x_hat.shape)}")
    if x.numel() == 0:
        raise ValueError(f"x and x_hat must be non-empty, got shape {list(x.shape)}")
    for name, t in (("x", x), ("x_hat", x_hat)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} contains {int((~torch.isfinite(t)).sum())} non-finite value(s) (NaN or inf)")


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """Cosine similarities ``[n, m]`` between the rows of ``a [n, d]`` and ``b [m, d]`` (differentiable)."""
    _check_dict(a, "a")
    _check_dict(b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must have the same width d, got a {list(a.shape)} and b {list(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
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

    Raises ``TypeError``/``ValueError`` on non-float, mis-shaped, empty or non-finite input, and when ``x`` has no
    variance about its mean (a single row or identical rows: FVU is undefined).
    """
    _check_pair(x, x_hat)
    if x.ndim != 2:
        raise ValueError(f"x and x_hat must have shape [batch, d], got {list(x.shape)}")
    var = (x - x.mean(0)).pow(2).sum()
    if not bool(var > 0):
        raise ValueError(f"x has zero variance about its mean (batch of {x.shape[0]} identical row(s)); FVU is undefined")
    return (x - x_hat).pow(2).sum() / var


def mse(x: Tensor, x_hat: Tensor) -> Tensor:
    """Mean squared reconstruction error per element (``TypeError``/``ValueError`` on non-float, mis-shaped, empty or
    non-finite input)."""
    _check_pair(x, x_hat)
    return (x - x_hat).pow(2).mean()


def l0(latent_acts: Tensor) -> Tensor:
    """Mean number of non-zero latents per sample; ``latent_acts``: ``[batch, k]`` or ``[batch, d_sae]``."""
    if not isinstance(latent_acts, Tensor):
        raise TypeError(f"latent_acts must be a torch.Tensor [batch, k], got {type(latent_acts).__name__}")
    if latent_acts.ndim != 2 or latent_acts.shape[0] < 1:
        raise ValueError(f"latent_acts must have shape [batch >= 1, k], got {list(latent_acts.shape)}")
    return (latent_acts != 0).sum(-1).double().mean()


def firing_counts(latent_acts: Tensor, latent_indices: Tensor, d_sae: int) -> Tensor:
    """How many samples of the batch each latent fired on (activation > 0): int64 ``[d_sae]``.

    Raises ``TypeError``/``ValueError`` if ``latent_indices`` is not an integer tensor of the shape of ``latent_acts``
    with values in ``[0, d_sae)``, or ``d_sae`` is not a positive int.
    """
    if isinstance(d_sae, bool) or not isinstance(d_sae, int) or d_sae < 1:
        raise ValueError(f"d_sae must be a positive int, got {d_sae!r}")
    if not isinstance(latent_acts, Tensor) or not isinstance(latent_indices, Tensor):
        raise TypeError(f"latent_acts and latent_indices must be torch.Tensors, got {type(latent_acts).__name__} and "
                        f"{type(latent_indices).__name__}")
    if latent_indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"latent_indices must be an int64/int32 tensor, got dtype {latent_indices.dtype}")
    if latent_acts.shape != latent_indices.shape:
        raise ValueError(f"latent_acts and latent_indices must have the same shape, got {list(latent_acts.shape)} and "
                         f"{list(latent_indices.shape)}")
    if latent_indices.numel() and (int(latent_indices.min()) < 0 or int(latent_indices.max()) >= d_sae):
        raise ValueError(f"latent_indices must lie in [0, d_sae={d_sae}), got values in "
                         f"[{int(latent_indices.min())}, {int(latent_indices.max())}]")
    fired = latent_indices[latent_acts > 0]
    return torch.bincount(fired.reshape(-1), minlength=d_sae)


def dead_fraction(counts: Tensor) -> float:
    """Fraction of latents with zero count in ``counts [d_sae]`` (firing counts over a window)."""
    if not isinstance(counts, Tensor):
        raise TypeError(f"counts must be a torch.Tensor [d_sae], got {type(counts).__name__}")
    if counts.ndim != 1 or counts.shape[0] < 1:
        raise ValueError(f"counts must have shape [d_sae >= 1], got {list(counts.shape)}")
    return float((counts == 0).double().mean())
