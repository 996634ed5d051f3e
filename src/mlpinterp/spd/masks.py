"""Stochastic masks of SPD (Bushnaq, Braun, Sharkey 2025, Sec. 2): ``m = g + (1 - g) r`` with ``r ~ U(0, 1)``.

For ``g`` in ``[0, 1]`` the mask is uniform on ``[g, 1]`` (mean ``(1 + g) / 2``, variance ``(1 - g)^2 / 12``): a
subcomponent of causal importance ``g`` is ablated by at most ``1 - g``. The reparametrisation keeps ``m``
differentiable in ``g`` (``dm/dg = 1 - r``).
"""

from __future__ import annotations

import torch


def stochastic_mask(g: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``g + (1 - g) r`` with a fresh ``r ~ U(0, 1)`` of ``g``'s shape, dtype and device (from ``generator``).

    Raises ``TypeError`` unless ``g`` is a floating-point tensor.
    """
    if not isinstance(g, torch.Tensor) or not g.is_floating_point():
        raise TypeError(f"g (causal importances) must be a floating-point torch.Tensor, got "
                        f"{g.dtype if isinstance(g, torch.Tensor) else type(g).__name__}")
    r = torch.rand(g.shape, generator=generator, dtype=g.dtype, device=g.device)
    return g + (1 - g) * r
