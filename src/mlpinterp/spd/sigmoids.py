"""The leaky hard sigmoids of SPD (Bushnaq, Braun, Sharkey 2025, "Stochastic Parameter Decomposition", Sec. 2 and
the pseudocode of its appendix: sigma_H,lower for the masks, sigma_H,upper for the importance-minimality loss).

``leaky_hard_sigmoid`` (lower leak) is ``slope * x`` for ``x <= 0``, ``x`` on ``(0, 1]`` and ``1`` above: causal
importances below zero keep a small gradient, so a subcomponent switched off can switch on again.
``upper_leaky_hard_sigmoid`` is ``0`` for ``x < 0``, ``x`` on ``[0, 1]`` and ``1 + slope (x - 1)`` above: the
minimality loss keeps pushing raw outputs above one back down.

Gradients at the edges are fixed (tested): lower ``slope`` at ``x <= 0``, ``1`` on ``(0, 1]``, ``0`` above ``1``;
upper ``0`` below ``0``, ``1`` on ``[0, 1]``, ``slope`` above ``1``.
"""

from __future__ import annotations

import torch

LEAK = 0.01
"""Slope of the leaky pieces (the paper's and the reference implementation's value)."""


def leaky_hard_sigmoid(x: torch.Tensor, slope: float = LEAK) -> torch.Tensor:
    """sigma_H,lower: ``slope * x`` for ``x <= 0``, ``min(x, 1)`` for ``x > 0``; any shape, elementwise."""
    return torch.where(x > 0, torch.where(x > 1, torch.ones_like(x), x), slope * x)


def upper_leaky_hard_sigmoid(x: torch.Tensor, slope: float = LEAK) -> torch.Tensor:
    """sigma_H,upper: ``0`` for ``x < 0``, ``x`` on ``[0, 1]``, ``1 + slope (x - 1)`` for ``x > 1``; elementwise."""
    return torch.where(x > 1, 1 + slope * (x - 1), torch.where(x < 0, torch.zeros_like(x), x))
