"""Schedule-free Signum: the sign of the gradient (Bernstein et al. 2018, "signSGD") inside schedule-free
averaging (Defazio et al. 2024, "The Road Less Scheduled", eq. 1-3), EleutherAI sparsify's default SAE optimiser.

With momentum ``beta``, a base sequence ``z``, the average ``x`` and the gradient point ``y`` (the parameters
during training)::

    z_{t+1} = z_t - lr * sign(grad f(y_t))
    x_{t+1} = (1 - c_{t+1}) x_t + c_{t+1} z_{t+1},   c_{t+1} = 1 / (t + 1)
    y_{t+1} = (1 - beta) z_{t+1} + beta x_{t+1}

The arithmetic is that of ``schedulefree.ScheduleFreeWrapper(SignSGD(...), momentum=beta)`` (sparsify wraps its
``SignSGD`` so) with a constant learning rate, whose weights ``lr**2 / sum lr**2`` are the uniform ``1 / (t + 1)``
(equal to float rounding; tested): ``x`` is not stored but recovered from ``y`` and ``z``
(``x = y + (1 - 1/beta)(z - y)``), so an in-place change of the parameters between steps (decoder
renormalisation) changes ``x`` as it does there. Unlike the wrapper, the whole state is per-parameter (``z`` and
the step count), so ``optimizer.state`` alone resumes a run, and the averaged weights are read without leaving
train mode (:meth:`ScheduleFreeSignum.averaged`). A learning rate changed during a run keeps the uniform weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.optim import Optimizer


class ScheduleFreeSignum(Optimizer):
    """Schedule-free Signum (see the module docstring). Parameters hold ``y`` during training; evaluate and save
    inside :meth:`averaged`, where they hold ``x``.

    Raises ``ValueError`` for ``lr <= 0`` or ``momentum`` outside ``(0, 1)``.
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.95):
        if not (lr > 0):
            raise ValueError(f"lr must be > 0, got {lr!r}")
        if not (0 < momentum < 1):
            raise ValueError(f"momentum must be in (0, 1), got {momentum!r}")
        super().__init__(params, {"lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("ScheduleFreeSignum.step takes no closure")
        for group in self.param_groups:
            lr, beta = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "z" not in st:
                    st["z"] = p.detach().clone()
                    st["step"] = torch.zeros((), dtype=torch.float64)
                z = st["z"]
                p.lerp_(end=z, weight=1 - 1 / beta)  # y -> x
                z.add_(p.grad.sign(), alpha=-lr)
                st["step"].add_(1)
                p.lerp_(end=z, weight=1.0 / float(st["step"]))  # x_{t+1}
                p.lerp_(end=z, weight=1 - beta)  # y_{t+1}
        return None

    @contextmanager
    def averaged(self) -> Iterator[None]:
        """Within the block the parameters hold the average ``x`` (the weights to evaluate and save); afterwards
        they hold exactly the training point ``y`` again (restored bit for bit)."""
        saved = []
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    st = self.state.get(p, {})
                    if "z" in st:
                        saved.append((p, p.detach().clone()))
                        p.lerp_(end=st["z"], weight=1 - 1 / group["momentum"])
        try:
            yield
        finally:
            with torch.no_grad():
                for p, y in saved:
                    p.copy_(y)
