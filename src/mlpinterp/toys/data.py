"""Sparse-feature data used by the APD toy models (Braun et al. 2025, Sec. 3 and App. D).

Every feature is active independently with probability ``feature_probability``; an active
feature takes a value uniform in ``value_range`` and an inactive one is exactly zero.
Batches are drawn from a ``torch.Generator`` so that a run is reproducible from its seed and,
through :func:`step_generator`, every training step has its own deterministic stream (which
makes resumed runs bit-identical to uninterrupted ones).
"""

from __future__ import annotations

import math

import torch


def _check_int(v, name: str, minimum: int | None = 1) -> int:
    """``v`` must be an int (not a bool, not a float) ``>= minimum``; raises ``TypeError``/``ValueError`` naming it."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def _check_real(v, name: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float:
    """``v`` must be a finite real number (not a bool) in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__} {v!r}")
    if not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        if lo is None and hi is None:
            rng = ""
        elif hi is None:
            rng = f" and {'>' if lo_open else '>='} {lo:g}"
        else:
            rng = f" in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ValueError(f"{name} must be finite{rng}, got {v}")
    return float(v)


def step_generator(seed: int, step: int) -> torch.Generator:
    """A ``torch.Generator`` whose state depends only on ``(seed, step)``."""
    if isinstance(seed, bool) or isinstance(step, bool) or not isinstance(seed, int) or not isinstance(step, int):
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
    TypeError
        If ``n``/``n_features`` are not ints, the probability or the range bounds not real numbers, or ``dtype``
        not a floating-point dtype.
    ValueError
        If ``n`` or ``n_features`` is not positive, the probability is outside (0, 1] or the range is empty or
        not finite.
    """
    _check_int(n, "n")
    _check_int(n_features, "n_features")
    _check_real(feature_probability, "feature_probability", 0.0, 1.0, lo_open=True)
    if not isinstance(value_range, (tuple, list)) or len(value_range) != 2:
        raise ValueError(f"value_range must be a (low, high) pair, got {value_range!r}")
    lo = _check_real(value_range[0], "value_range[0]")
    hi = _check_real(value_range[1], "value_range[1]")
    if not hi > lo:
        raise ValueError(f"value_range must satisfy low < high, got {value_range}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    active = torch.rand(n, n_features, generator=generator) < feature_probability
    values = torch.rand(n, n_features, generator=generator) * (hi - lo) + lo
    return torch.where(active, values, torch.zeros(())).to(dtype)


def one_hot_inputs(n_features: int, value: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[n_features, n_features]``: row ``i`` has only feature ``i`` active, with ``value``."""
    _check_int(n_features, "n_features")
    _check_real(value, "value")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    return torch.eye(n_features, dtype=dtype) * value
