"""Stochastic masks of SPD (Bushnaq, Braun, Sharkey 2025, Sec. 2): ``m = g + (1 - g) r`` with ``r ~ U(0, 1)``.

Also the masks of one training step, in the order they are drawn from one generator, and that generator (its
state depends only on ``(seed, step)``, so a resumed run draws the same noise).

For ``g`` in ``[0, 1]`` the mask is uniform on ``[g, 1]`` (mean ``(1 + g) / 2``, variance ``(1 - g)^2 / 12``): a
subcomponent of causal importance ``g`` is ablated by at most ``1 - g``. The reparametrisation keeps ``m``
differentiable in ``g`` (``dm/dg = 1 - r``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from mlpinterp.toys.data import step_generator


def stochastic_mask(g: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``g + (1 - g) r`` with a fresh ``r ~ U(0, 1)`` of ``g``'s shape, dtype and device (from ``generator``).

    Raises ``TypeError`` unless ``g`` is a floating-point tensor.
    """
    if not isinstance(g, torch.Tensor) or not g.is_floating_point():
        raise TypeError(f"g (causal importances) must be a floating-point torch.Tensor, got "
                        f"{g.dtype if isinstance(g, torch.Tensor) else type(g).__name__}")
    r = torch.rand(g.shape, generator=generator, dtype=g.dtype, device=g.device)
    return g + (1 - g) * r


def draw_masks(g_low: Mapping[str, torch.Tensor], delta_component: bool, generator: torch.Generator | None = None
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """One draw: the subcomponent masks ``{site: g + (1 - g) r}`` (``[batch, C]``, sites in order), then, with
    ``delta_component``, the delta component's masks ``{site: r ~ U(0, 1)}`` (``[batch]``), else ``None``."""
    masks = {k: stochastic_mask(g, generator) for k, g in g_low.items()}
    if not delta_component:
        return masks, None
    return masks, {k: torch.rand(g.shape[:-1], generator=generator, dtype=g.dtype, device=g.device)
                   for k, g in g_low.items()}


def step_draws(g_low: Mapping[str, torch.Tensor], n_samples: int, delta_component: bool, fresh_layerwise: bool,
               generator: torch.Generator | None = None) -> list[tuple[tuple, tuple]]:
    """The masks of one step: per mask sample ``(full, layerwise)``, each a :func:`draw_masks` result. ``full``
    masks every site at once; ``layerwise`` is ``full`` itself, or with ``fresh_layerwise`` a second draw made
    right after it (the SPD reference's independent masks for the layerwise loss). Drawn in that order, sample
    after sample, from ``generator``."""
    draws = []
    for _ in range(n_samples):
        full = draw_masks(g_low, delta_component, generator)
        draws.append((full, draw_masks(g_low, delta_component, generator) if fresh_layerwise else full))
    return draws


def mask_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    """The generator of step ``step``'s mask noise: depends only on ``(seed, step)`` (on ``device``)."""
    g = torch.Generator(device=device)
    g.manual_seed(step_generator(seed + 4_242, step).initial_seed())
    return g
