"""The leaky hard sigmoids of SPD: sigma_H,lower for the masks, sigma_H,upper for the importance-minimality loss.

Two forms of the lower one (:data:`LOWER_SIGMOIDS`, chosen by ``SPDConfig.lower_sigmoid``):

- ``"leaky"``, :func:`leaky_hard_sigmoid` (Bushnaq, Braun, Sharkey 2025, "Stochastic Parameter Decomposition", Sec. 2
  and the pseudocode of its appendix; the SPD reference implementation's ``leaky_hard_sigmoid`` in
  ``spd/models/sigmoids.py`` at the paper's commit ``f8de8aad``, June 2025): ``slope * x`` for ``x <= 0``, ``x`` on
  ``(0, 1]``, ``1`` above. Below zero the *value* leaks (a causal importance can be slightly negative) and so does
  the gradient, in both directions.
- ``"clamped"``, :func:`clamped_hard_sigmoid` (the reference's ``lower_leaky_hard_sigmoid``,
  ``LowerLeakyHardSigmoidFunction`` in ``spd/models/sigmoids.py``, added in July 2025 and still the lower function of
  ``sigmoid_type: "leaky_hard"`` in ``spd/models/component_model.py`` at ``3f0bb61e``, Feb 2026): the value is
  ``clamp(x, 0, 1)``; below zero (``x <= 0``) only a gradient that would *raise* the value passes, scaled by
  ``slope`` (an upstream gradient ``G < 0``, since gradient descent moves ``x`` against it, gives ``slope * G``; a
  ``G >= 0`` gives 0). A switched-off subcomponent can still switch on again, but the minimality loss cannot push
  it further below zero, and the masks never see a negative importance.

``upper_leaky_hard_sigmoid`` (both recipes; the reference's ``upper_leaky_hard_sigmoid``, unchanged since the paper)
is ``0`` for ``x < 0``, ``x`` on ``[0, 1]`` and ``1 + slope (x - 1)`` above: the minimality loss keeps pushing raw
outputs above one back down.

Gradients at the edges (tested against hand values):

======================  ==========  ==========  ==========  ==========  ==========
upstream G              x < 0       x = 0       0 < x < 1   x = 1       x > 1
======================  ==========  ==========  ==========  ==========  ==========
leaky (lower)           slope G     slope G     G           G           0
clamped (lower), G < 0  slope G     slope G     G           G           0
clamped (lower), G >= 0 0           0           G           G           0
upper                   0           G           G           G           slope G
======================  ==========  ==========  ==========  ==========  ==========
"""

from __future__ import annotations

from typing import Any

import torch

LEAK = 0.01
"""Slope of the leaky pieces (the paper's and the reference implementation's value)."""


def leaky_hard_sigmoid(x: torch.Tensor, slope: float = LEAK) -> torch.Tensor:
    """sigma_H,lower of the SPD paper: ``slope * x`` for ``x <= 0``, ``min(x, 1)`` for ``x > 0``; any shape,
    elementwise; its autograd gradient is ``slope`` below and at 0, ``1`` on ``(0, 1]``, ``0`` above."""
    return torch.where(x > 0, torch.where(x > 1, torch.ones_like(x), x), slope * x)


class _ClampedHardSigmoid(torch.autograd.Function):
    """Forward ``clamp(x, 0, 1)``; backward ``slope * min(G, 0)`` for ``x <= 0``, ``G`` on ``(0, 1]``, 0 above."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, slope: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.slope = slope
        return x.clamp(0, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        inside = (x > 0) & (x <= 1)
        return torch.where(inside, grad, torch.where(x <= 0, ctx.slope * grad.clamp(max=0), 0.0)), None


def clamped_hard_sigmoid(x: torch.Tensor, slope: float = LEAK) -> torch.Tensor:
    """sigma_H,lower of the current SPD reference: value ``clamp(x, 0, 1)``; gradient ``G`` on ``(0, 1]``, ``0``
    above ``1``, and for ``x <= 0`` ``slope * G`` when the upstream gradient ``G < 0`` (descent would raise the value)
    else ``0``. Any shape, elementwise."""
    return _ClampedHardSigmoid.apply(x, slope)


def upper_leaky_hard_sigmoid(x: torch.Tensor, slope: float = LEAK) -> torch.Tensor:
    """sigma_H,upper: ``0`` for ``x < 0``, ``x`` on ``[0, 1]``, ``1 + slope (x - 1)`` for ``x > 1``; elementwise."""
    return torch.where(x > 1, 1 + slope * (x - 1), torch.where(x < 0, torch.zeros_like(x), x))


LOWER_SIGMOIDS = {"leaky": leaky_hard_sigmoid, "clamped": clamped_hard_sigmoid}
"""``SPDConfig.lower_sigmoid`` -> sigma_H,lower: ``"leaky"`` (the SPD paper's) or ``"clamped"`` (the current
reference's)."""
