"""Sparse-feature data used by the APD toy models (Braun et al. 2025, Sec. 3 and App. D).

Every feature is active independently with probability ``feature_probability``; an active
feature takes a value uniform in ``value_range`` and an inactive one is exactly zero.
Batches are drawn from a ``torch.Generator`` so that a run is reproducible from its seed and,
through :func:`step_generator`, every training step has its own deterministic stream (which
makes resumed runs bit-identical to uninterrupted ones).
"""

from __future__ import annotations

import torch


def step_generator(seed: int, step: int) -> torch.Generator:
    """A ``torch.Generator`` whose state depends only on ``(seed, step)``."""
    if not isinstance(seed, int) or not isinstance(step, int):
        raise TypeError(f"seed and step must be int, got {type(seed).__name__} and {type(step).__name__}")
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + step * 7_919 + 12_345) % (2**63 - 1))
    return g


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
    ValueError
        If ``n`` or ``n_features`` is not positive, the probability is outside (0, 1] or the range is empty.
    """
    if int(n) <= 0 or int(n_features) <= 0:
        raise ValueError(f"n and n_features must be positive, got n={n}, n_features={n_features}")
    if not 0.0 < float(feature_probability) <= 1.0:
        raise ValueError(f"feature_probability must be in (0, 1], got {feature_probability}")
    lo, hi = float(value_range[0]), float(value_range[1])
    if not hi > lo:
        raise ValueError(f"value_range must satisfy low < high, got {value_range}")
    active = torch.rand(n, n_features, generator=generator) < feature_probability
    values = torch.rand(n, n_features, generator=generator) * (hi - lo) + lo
    return torch.where(active, values, torch.zeros(())).to(dtype)


def one_hot_inputs(n_features: int, value: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[n_features, n_features]``: row ``i`` has only feature ``i`` active, with ``value``."""
    return torch.eye(n_features, dtype=dtype) * value
