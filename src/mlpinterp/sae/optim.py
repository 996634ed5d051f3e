"""Schedule-free Signum: the sign of the gradient (Bernstein et al. 2018, "signSGD") inside schedule-free
averaging (Defazio et al. 2024, "The Road Less Scheduled", eq. 1-3), EleutherAI sparsify's default SAE optimiser.

With momentum ``beta``, a base sequence ``z``, the average ``x`` and the gradient point ``y`` (the parameters
during training)::

    z_{t+1} = z_t - lr * sign(grad f(y_t))
    x_{t+1} = (1 - c_{t+1}) x_t + c_{t+1} z_{t+1},   c_{t+1} = (t + 1)**r / sum_{i=1..t+1} i**r
    y_{t+1} = (1 - beta) z_{t+1} + beta x_{t+1}

so ``x_t`` is the average of ``z_1 .. z_t`` with weights proportional to ``i**r`` (``r = average_power``): ``r = 0``
is the uniform average ``c_{t+1} = 1 / (t + 1)`` of the paper's eq. 1-3, ``r > 0`` weighs later iterates more
(the paper's polynomial weighting, the wrapper's ``r``), which matters in short runs whose first iterates are far
from the solution.

The arithmetic is that of ``schedulefree.ScheduleFreeWrapper(SignSGD(...), momentum=beta, r=r)`` (sparsify wraps
its ``SignSGD`` so, with ``r = 0``) with a constant learning rate, whose weights ``(t + 1)**r lr**2 / sum`` are
those above (equal to float rounding; tested): ``x`` is not stored but recovered from ``y`` and ``z``
(``x = y + (1 - 1/beta)(z - y)``), so an in-place change of the parameters between steps (decoder
renormalisation) changes ``x`` as it does there. Unlike the wrapper, the whole state is per-parameter (``z``, the
step count and the running weight sum), so ``optimizer.state`` alone resumes a run, and the averaged weights are
read without leaving train mode (:meth:`ScheduleFreeSignum.averaged`). A learning rate changed during a run keeps
these weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.optim import Optimizer


class ScheduleFreeSignum(Optimizer):
    """Schedule-free Signum (see the module docstring). Parameters hold ``y`` during training; evaluate and save
    inside :meth:`averaged`, where they hold ``x``.

    Parameters
    ----------
    lr : float
        Step of the base sequence per coordinate (``z -= lr * sign(grad)``).
    momentum : float
        ``beta``, the interpolation between ``z`` and ``x`` at which gradients are taken.
    average_power : float
        ``r``: the average ``x`` weighs iterate ``i`` in proportion to ``i**r`` (0: uniform).

    Raises ``ValueError`` for ``lr <= 0``, ``momentum`` outside ``(0, 1)`` or ``average_power`` not finite and >= 0.
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.95, average_power: float = 0.0):
        if not (lr > 0):
            raise ValueError(f"lr must be > 0, got {lr!r}")
        if not (0 < momentum < 1):
            raise ValueError(f"momentum must be in (0, 1), got {momentum!r}")
        if isinstance(average_power, bool) or not isinstance(average_power, (int, float)) \
                or not math.isfinite(average_power) or average_power < 0:
            raise ValueError(f"average_power must be a finite number >= 0, got {average_power!r}")
        super().__init__(params, {"lr": lr, "momentum": momentum, "average_power": float(average_power)})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("ScheduleFreeSignum.step takes no closure")
        for group in self.param_groups:
            lr, beta, r = group["lr"], group["momentum"], group.get("average_power", 0.0)
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
                p.lerp_(end=z, weight=self._average_weight(int(st["step"]), r))  # x_{t+1}
                p.lerp_(end=z, weight=1 - beta)  # y_{t+1}
        return None

    def _average_weight(self, t: int, r: float) -> float:
        """``c_t = t**r / sum_{i=1..t} i**r`` (``1 / t`` for ``r = 0``). The sum is carried from step to step in a
        cache outside the state (the state stays ``z`` and the step count, as with ``r = 0``) and recomputed from
        the step count after a resume."""
        if r == 0:
            return 1.0 / t
        cache = self.__dict__.setdefault("_weight_sums", {})
        last = cache.get(r)
        if last is not None and last[0] == t - 1:
            total = last[1] + float(t) ** r
        elif last is not None and last[0] == t:
            total = last[1]
        else:  # the same sequence of float additions as step by step, so a resumed run continues bit for bit
            total = 0.0
            for i in range(1, t + 1):
                total += float(i) ** r
        cache[r] = (t, total)
        return float(t) ** r / total

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
