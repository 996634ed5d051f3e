"""Top-k selection of active components from attributions (Braun et al. 2025, App. A.3; batch top-k of
Bussmann et al. 2024)."""

from __future__ import annotations

import math
import numbers

import torch


def _check_attr(attr: torch.Tensor) -> None:
    if not isinstance(attr, torch.Tensor):
        raise TypeError(f"attributions must be a torch.Tensor, got {type(attr).__name__}")
    if attr.dtype == torch.bool or attr.is_complex():
        raise TypeError(f"attributions must be a real (float or int) tensor, got dtype {attr.dtype}")
    if attr.ndim != 2:
        raise ValueError(f"attributions must have shape [batch, C], got {list(attr.shape)}")
    if not torch.isfinite(attr).all():
        raise ValueError("attributions contain NaN or inf")


def _check_k(k, what: str) -> float:
    """``k`` must be a real number (not a bool or a string) and finite."""
    if isinstance(k, bool) or not isinstance(k, numbers.Real):
        raise TypeError(f"{what} k must be a real number, got {type(k).__name__} {k!r}")
    if not math.isfinite(float(k)):
        raise ValueError(f"{what} k must be finite, got {k}")
    return float(k)


def topk_mask(attr: torch.Tensor, k: int) -> torch.Tensor:
    """Per-sample top-k: ``[batch, C]`` bool, exactly ``k`` ``True`` per row (the largest attributions).

    Raises
    ------
    ValueError
        If ``k`` is not an integer in ``[1, C]`` or ``attr`` is not ``[batch, C]``.
    """
    _check_attr(attr)
    _check_k(k, "top-k")
    C = attr.shape[1]
    if int(k) != k or not 1 <= k <= C:
        raise ValueError(f"top-k k must be an integer in [1, C={C}], got {k}")
    idx = attr.topk(int(k), dim=1).indices
    return torch.zeros_like(attr, dtype=torch.bool).scatter_(1, idx, True)


def batch_topk_mask(attr: torch.Tensor, k: float) -> torch.Tensor:
    """Batch top-k: keep the ``floor(k * batch)`` largest attributions over the whole ``[batch, C]`` array.

    ``k`` is the mean number of active components per sample (0.211 for TMS 5-2, 1.28 for the residual MLPs).

    Raises
    ------
    ValueError
        If ``k`` is not in ``(0, C]``, ``floor(k * batch) < 1`` or ``attr`` is not ``[batch, C]``.
    """
    _check_attr(attr)
    _check_k(k, "batch top-k")
    n, C = attr.shape
    if not 0 < float(k) <= C:
        raise ValueError(f"batch top-k k must be in (0, C={C}], got {k}")
    total = int(float(k) * n)
    if total < 1:
        raise ValueError(f"batch top-k selects floor(k * batch) = floor({k} * {n}) = 0 components; raise k or batch")
    flat = attr.reshape(-1)
    idx = flat.topk(total).indices
    return torch.zeros_like(flat, dtype=torch.bool).scatter_(0, idx, True).reshape(n, C)
