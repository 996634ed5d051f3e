"""Seeded batch order without saved generator state: epoch-wise permutations drawn from ``(seed, epoch)``.

Every trainer that walks a fixed dataset (classifiers in :mod:`mlpinterp.models.train`, the causal LM in
:mod:`mlpinterp.lm.train`) draws batch ``step`` from here, so resuming at any step needs only the step number.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.utils.seeding import numpy_rng


def epoch_batch_indices(seed: int, n: int, batch_size: int, step: int, cache: dict) -> np.ndarray:
    """Indices ``[batch_size]`` of the batch used at 0-based ``step``: epoch ``e`` is the permutation
    ``numpy.random.default_rng([seed, e]).permutation(n)`` cut into ``n // batch_size`` batches (the last partial
    batch is dropped). ``cache`` (a dict the caller keeps) holds the current epoch's permutation.

    Raises ``ValueError`` if ``batch_size`` exceeds ``n``.
    """
    per_epoch = n // batch_size
    if per_epoch < 1:
        raise ValueError(f"batch_size {batch_size} exceeds the {n} examples")
    epoch, j = divmod(step, per_epoch)
    if cache.get("epoch") != epoch:
        cache["epoch"] = epoch
        cache["perm"] = numpy_rng(seed, epoch).permutation(n)
    return cache["perm"][j * batch_size : (j + 1) * batch_size]
