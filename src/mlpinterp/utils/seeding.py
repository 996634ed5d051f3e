"""The one seeding scheme: child seeds from numpy's ``SeedSequence`` over ``(seed, *keys)``.

A run's random streams are named by keys after its seed: a purpose (``"batch"``, ``"held-out"``, ``"reinit"``),
then indices (step, epoch, SAE number). Each ``(seed, *keys)`` gets its own stream through
``numpy.random.SeedSequence``, whose hashing makes streams of nearby seeds or keys statistically independent
(O'Neill 2015, PCG; numpy's NEP 19), so no stream needs saved generator state: a resumed run rebuilds the same
stream from its step number. ``numpy_rng(seed, e)`` is exactly ``numpy.random.default_rng([seed, e])``.

Seeds and keys are ints or (keys only) strings. Non-negative ints enter the sequence as they are; a string enters
as its UTF-8 bytes followed by a 1 above 64 zero bits, so it is never equal to an int below 2**64, and a negative
int as its decimal string. Nothing here imports torch until a torch generator is asked for.
"""

from __future__ import annotations

import numbers

import numpy as np


def _entropy(key, name: str) -> int:
    """The non-negative integer ``key`` stands for in the sequence (see the module docstring)."""
    if isinstance(key, str):
        return int.from_bytes(key.encode() + bytes(8) + b"\x01", "little")
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, numbers.Integral):
        raise TypeError(f"{name} must be an int or a str, got {type(key).__name__} {key!r}")
    return int(key) if key >= 0 else _entropy(str(int(key)), name)


def seed_sequence(seed: int, *keys: int | str) -> np.random.SeedSequence:
    """``numpy.random.SeedSequence([seed, *keys])`` with strings and negative ints encoded as in the module
    docstring. Raises ``TypeError`` for a seed that is not an int or a key that is neither an int nor a str."""
    if isinstance(seed, str):
        raise TypeError(f"seed must be an int, got str {seed!r}")
    return np.random.SeedSequence([_entropy(seed, "seed"), *(_entropy(k, f"key {i}") for i, k in enumerate(keys))])


def child_seed(seed: int, *keys: int | str) -> int:
    """A 63-bit integer seed for the stream ``(seed, *keys)`` (for libraries that take one integer, e.g.
    ``torch.Generator.manual_seed``)."""
    lo, hi = seed_sequence(seed, *keys).generate_state(2, np.uint32)
    return ((int(hi) << 32) | int(lo)) & ((1 << 63) - 1)


def numpy_rng(seed: int, *keys: int | str) -> np.random.Generator:
    """``numpy.random.default_rng`` of the stream ``(seed, *keys)``."""
    return np.random.default_rng(seed_sequence(seed, *keys))


def torch_generator(seed: int, *keys: int | str, device=None):
    """A ``torch.Generator`` (on ``device``, default CPU) seeded with :func:`child_seed` of ``(seed, *keys)``."""
    import torch

    g = torch.Generator() if device is None else torch.Generator(device=device)
    return g.manual_seed(child_seed(seed, *keys))


def splitmix_seed(seed: int, index: int) -> int:
    """A 63-bit seed for stream ``index`` of ``seed`` by SplitMix64 mixing (Steele, Lea & Flood 2014).

    The initialisation (and re-initialisation) of the SAEs of an MFR ensemble keeps this older scheme: its tests
    judge training progress over a few steps from these exact initial weights, so new draws would change what
    they measure. Every other stream uses :func:`torch_generator` / :func:`numpy_rng`."""
    z = (int(seed) * 0x9E3779B97F4A7C15 + int(index) * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % (1 << 64)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % (1 << 64)
    return (z ^ (z >> 31)) & ((1 << 63) - 1)
