"""Learning-rate (and penalty-weight) schedule factors: the one place every trainer takes them from.

Each function returns a dimensionless factor of 0-based ``step`` that the caller multiplies into its peak value.
The names say which curve: a *half* cosine runs over half a period, ``(1 + cos(pi t)) / 2`` from 1 to 0 with zero
slope at both ends; a *quarter* cosine runs over a quarter period, ``cos(pi t / 2)`` from 1 to 0 with zero slope
at the start only. Decays take the progress ``t`` in one of two ways, named at the call:

* ``zero_at_last_step=True``: ``t = step / (steps - 1)``, so the factor is 0 at the last step ``steps - 1``;
* ``zero_at_last_step=False``: ``t = step / steps``, so it would reach 0 one step after the last one.

``t`` is clipped to ``[0, 1]`` (a step past the end keeps the final factor) and a run of one step has ``t = 0``.
The factors are pure functions of ``(step, steps)``: a resumed run needs only its step number.
"""

from __future__ import annotations

import math


def _progress(step: int, steps: int, zero_at_last_step: bool) -> float:
    """``min(step / span, 1)`` with ``span = steps - 1`` (``zero_at_last_step``) or ``steps``, at least 1."""
    if step < 0 or steps < 1:
        raise ValueError(f"step must be >= 0 and steps >= 1, got step={step}, steps={steps}")
    span = max(1, steps - 1 if zero_at_last_step else steps)
    return min(step / span, 1.0)


def constant(step: int, steps: int) -> float:
    """The constant factor 1 at every step of a run of ``steps``. Raises ``ValueError`` for ``step < 0`` or
    ``steps < 1``, as the decays do."""
    _progress(step, steps, zero_at_last_step=True)  # validates
    return 1.0


def cosine_half(step: int, steps: int, *, zero_at_last_step: bool = True) -> float:
    """Half-cosine decay ``(1 + cos(pi t)) / 2``: 1 at step 0, 1/2 halfway, 0 at the end (cosine annealing,
    Loshchilov & Hutter 2017, without restarts). ``t`` as in the module docstring. Raises ``ValueError`` for
    ``step < 0`` or ``steps < 1``."""
    return 0.5 * (1.0 + math.cos(math.pi * _progress(step, steps, zero_at_last_step)))


def cosine_quarter(step: int, steps: int) -> float:
    """Quarter-cosine decay ``cos(pi/2 * step / (steps - 1))``: 1 at step 0, ``cos(pi/4) = 0.7071`` halfway, 0 at
    the last step (1 when ``steps == 1``). The APD/SPD reference implementation's ``"cosine"``
    (``get_lr_schedule_fn``) and the SPD paper's schedule. Raises ``ValueError`` for ``step < 0`` or
    ``steps < 1``."""
    span = max(1, steps - 1)
    _progress(step, steps, zero_at_last_step=True)  # validates
    return math.cos(0.5 * math.pi * min(step, span) / span)


def linear_decay(step: int, steps: int, *, zero_at_last_step: bool = False) -> float:
    """Linear decay ``1 - t``: 1 at step 0, 1/2 halfway; with the default ``t = step / steps`` the last step
    still has ``1 / steps`` (the APD reference's TMS ``"linear"``). Raises ``ValueError`` as above."""
    return 1.0 - _progress(step, steps, zero_at_last_step)


def linear_warmup(step: int, warmup_steps: int) -> float:
    """Linear warm-up ``(step + 1) / warmup_steps`` for ``step < warmup_steps``, then 1 (1 throughout when
    ``warmup_steps == 0``): the first step already takes a nonzero learning rate. Raises ``ValueError`` for
    ``step < 0`` or ``warmup_steps < 0``."""
    if step < 0 or warmup_steps < 0:
        raise ValueError(f"step and warmup_steps must be >= 0, got step={step}, warmup_steps={warmup_steps}")
    return (step + 1) / warmup_steps if step < warmup_steps else 1.0


def cosine_half_rise(step: int, steps: int) -> float:
    """Half-cosine ramp from 0 to 1, ``(1 - cos(pi * min(step, T) / T)) / 2`` with ``T = steps``: 0 at step 0,
    1/2 at ``T / 2``, 1 from step ``T`` on (1 throughout when ``T == 0``). MFR's penalty-weight warm-up (Marks
    et al. 2024, sec. 3). Raises ``ValueError`` for ``step < 0`` or ``steps < 0``."""
    if step < 0 or steps < 0:
        raise ValueError(f"step and steps must be >= 0, got step={step}, steps={steps}")
    if steps == 0:
        return 1.0
    return 0.5 * (1.0 - math.cos(math.pi * min(step, steps) / steps))
