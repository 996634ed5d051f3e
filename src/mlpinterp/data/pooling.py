"""Average pooling of a :class:`Dataset`'s images (smaller inputs for smoke runs)."""

from __future__ import annotations

import dataclasses

import numpy as np

from mlpinterp.data.dataset import Dataset
from mlpinterp.utils.validation import check_int


def pool_factor(image_shape: tuple[int, int], max_side: int) -> int:
    """Smallest factor f dividing both image sides with ``max(image_shape) / f <= max_side`` (1 if none is needed).

    E.g. ``(28, 28)`` and 8 -> 4 (7x7); ``(8, 8)`` and 8 -> 1. Raises ``ValueError`` if no common divisor fits.
    """
    max_side = check_int(max_side, "max_side")
    h, w = image_shape
    for f in range(1, max(h, w) + 1):
        if h % f == 0 and w % f == 0 and max(h, w) // f <= max_side:
            return f
    raise ValueError(f"max_side must allow a common divisor of the image sides {image_shape}, got {max_side}")


def average_pool(data: Dataset, max_side: int | None) -> Dataset:
    """``data`` with images average-pooled by ``pool_factor(data.image_shape, max_side)`` (unchanged for None or 1)."""
    if max_side is None:
        return data
    f = pool_factor(data.image_shape, max_side)
    if f == 1:
        return data
    h, w = data.image_shape

    def pool(X: np.ndarray) -> np.ndarray:
        return X.reshape(-1, h // f, f, w // f, f).mean((2, 4), dtype=np.float64).reshape(X.shape[0], -1).astype(np.float32)

    return dataclasses.replace(data, X_train=pool(data.X_train), X_test=pool(data.X_test), image_shape=(h // f, w // f),
                               description=f"{data.description}; images average-pooled {f}x{f} to {h // f}x{w // f}")
