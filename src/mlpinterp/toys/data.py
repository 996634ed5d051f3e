"""Sparse-feature data used by the APD toy models (Braun et al. 2025, Sec. 3 and App. D).

Every feature is active independently with probability ``feature_probability``; an active
feature takes a value uniform in ``value_range`` and an inactive one is exactly zero.
Batches are drawn from a ``torch.Generator`` so that a run is reproducible from its seed and,
through :func:`step_generator`, every training step has its own deterministic stream (which
makes resumed runs bit-identical to uninterrupted ones).
"""

from __future__ import annotations

import torch

from mlpinterp.utils.seeding import torch_generator
from mlpinterp.utils.validation import check_int, check_real


def step_generator(seed: int, step: int) -> torch.Generator:
    """A ``torch.Generator`` whose state depends only on ``(seed, step)``: the stream ``(seed, "step", step)`` of
    :func:`mlpinterp.utils.seeding.torch_generator` (``step`` may be negative, e.g. -1 for a held-out batch)."""
    if isinstance(seed, bool) or isinstance(step, bool) or not isinstance(seed, int) or not isinstance(step, int):
        raise TypeError(f"seed and step must be int, got {type(seed).__name__} and {type(step).__name__}")
    return torch_generator(seed, "step", step)


def sparse_features(
    n: int,
    n_features: int,
    feature_probability: float,
    value_range: tuple[float, float] = (0.0, 1.0),
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Sample ``[n, n_features]`` sparse inputs.

    Entry ``x[b, i]`` is ``U(value_range)`` with probability ``feature_probability`` and 0 otherwise
    (the ``at_least_zero_active`` distribution of the APD paper: all-zero rows are allowed).

    Raises
    ------
    TypeError
        If ``n``/``n_features`` are not ints, the probability or the range bounds not real numbers, or ``dtype``
        not a floating-point dtype.
    ValueError
        If ``n`` or ``n_features`` is not positive, the probability is outside (0, 1] or the range is empty or
        not finite.
    """
    check_int(n, "n")
    check_int(n_features, "n_features")
    check_real(feature_probability, "feature_probability", 0.0, 1.0, lo_open=True)
    if not isinstance(value_range, (tuple, list)) or len(value_range) != 2:
        raise ValueError(f"value_range must be a (low, high) pair, got {value_range!r}")
    lo = check_real(value_range[0], "value_range[0]")
    hi = check_real(value_range[1], "value_range[1]")
    if not hi > lo:
        raise ValueError(f"value_range must satisfy low < high, got {value_range}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    active = torch.rand(n, n_features, generator=generator) < feature_probability
    values = torch.rand(n, n_features, generator=generator) * (hi - lo) + lo
    return torch.where(active, values, torch.zeros(())).to(dtype)


def one_hot_inputs(n_features: int, value: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[n_features, n_features]``: row ``i`` has only feature ``i`` active, with ``value``."""
    check_int(n_features, "n_features")
    check_real(value, "value")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    return torch.eye(n_features, dtype=dtype) * value
