"""Schedule-free Signum: the sign of the gradient (Bernstein et al. 2018, "signSGD") inside schedule-free
averaging (Defazio et al. 2024, "The Road Less Scheduled", eq. 1-3), EleutherAI sparsify's default SAE optimiser.

With momentum ``beta``, a base sequence ``z``, the average ``x`` and the gradient point ``y`` (the parameters
during training)::

    z_{t+1} = z_t - lr * sign(grad f(y_t))
    x_{t+1} = (1 - c_{t+1}) x_t + c_{t+1} z_{t+1},   c_{t+1} = w_{t+1} / sum_{i <= t+1} w_i,  w = lr_max**2
    y_{t+1} = (1 - beta) z_{t+1} + beta x_{t+1}

The arithmetic is the same, operation for operation, as ``schedulefree.ScheduleFreeWrapper(SignSGD(...),
momentum=beta)`` (``weight_lr_power=2``, ``r=0``; sparsify wraps its ``SignSGD`` so): ``x`` is not stored but
recovered from ``y`` and ``z`` (``x = y + (1 - 1/beta)(z - y)``), so an in-place change of the parameters between
steps (decoder renormalisation) changes ``x`` as it does there. Unlike the wrapper, every piece of state (``z``,
the step count, the weight sum, ``lr_max``) is per-parameter optimizer state, so ``optimizer.state`` alone resumes
a run, and the averaged weights are read without leaving train mode (:meth:`ScheduleFreeSignum.averaged`).
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
                    st["weight_sum"] = torch.zeros((), dtype=torch.float64)
                    st["lr_max"] = torch.zeros((), dtype=torch.float64)
                z = st["z"]
                p.lerp_(end=z, weight=1 - 1 / beta)  # y -> x
                z.add_(p.grad.sign(), alpha=-lr)
                lr_max = max(lr, float(st["lr_max"]))
                st["lr_max"].fill_(lr_max)
                weight = lr_max ** 2
                st["weight_sum"].add_(weight)
                p.lerp_(end=z, weight=weight / float(st["weight_sum"]))  # x_{t+1}
                p.lerp_(end=z, weight=1 - beta)  # y_{t+1}
                st["step"].add_(1)
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
