"""Learning-rate schedule factors shared by more than one training loop."""

from __future__ import annotations

import math


def quarter_cosine(step: int, steps: int) -> float:
    """``cos(pi/2 * step / (steps - 1))``: 1 at step 0, 0 at the last of ``steps`` steps (1 when ``steps == 1``).

    The APD/SPD reference implementation's "cosine" (``get_lr_schedule_fn``), used by APD's ``quarter_cosine``
    schedule and the reference's residual-MLP target training."""
    return math.cos(0.5 * math.pi * step / max(1, steps - 1))
