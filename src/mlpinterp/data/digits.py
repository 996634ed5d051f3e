"""scikit-learn's bundled 8x8 handwritten digits (UCI "Optical Recognition of Handwritten Digits").

1,797 real images of 8x8 pixels with integer intensities 0..16, ten balanced classes
(Alpaydin & Kaynak 1998; shipped as ``sklearn.datasets.load_digits``). The dataset has no
published train/test split, so this module defines one: a stratified split by
``sklearn.model_selection.train_test_split(test_size=test_fraction, stratify=y,
random_state=seed)``. With the defaults (``test_fraction=0.25``, ``seed=0``) this gives 1,347
training and 450 test images, every class present in both in its original proportion.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.data.dataset import Dataset

DIGITS_MAX_INTENSITY = 16
"""Pixel intensities in the UCI digits are integer counts in ``0..16`` (4x4 blocks of a 32x32 bitmap)."""


def load_digits(test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """Load scikit-learn's 8x8 digits with pixels scaled to ``[0, 1]`` (divided by 16).

    Parameters
    ----------
    test_fraction
        Fraction of the 1,797 images held out for testing, in ``(0, 1)``; the split is
        stratified by class, so each class contributes the same fraction.
    seed
        ``random_state`` of the split (an int >= 0). The split is a pure function of
        ``(test_fraction, seed)`` and the installed scikit-learn's data file.

    Returns
    -------
    Dataset
        ``X_*`` ``[n, 64]`` float32 in ``[0, 1]``, ``y_*`` ``[n]`` int64, ``image_shape=(8, 8)``.

    Raises
    ------
    ValueError
        If ``test_fraction`` is not in ``(0, 1)`` or ``seed`` is negative.
    TypeError
        If ``seed`` is not an int.
    """
    from sklearn.datasets import load_digits as _sk_load_digits
    from sklearn.model_selection import train_test_split

    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
        raise TypeError(f"test_fraction must be a float, got {type(test_fraction).__name__}")
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    bunch = _sk_load_digits()
    X = np.asarray(bunch.data, dtype=np.float64) / DIGITS_MAX_INTENSITY
    y = np.asarray(bunch.target, dtype=np.int64)
    X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=float(test_fraction), stratify=y, random_state=int(seed))
    return Dataset(
        name="digits",
        X_train=np.ascontiguousarray(X_tr, dtype=np.float32),
        y_train=np.ascontiguousarray(y_tr, dtype=np.int64),
        X_test=np.ascontiguousarray(X_te, dtype=np.float32),
        y_test=np.ascontiguousarray(y_te, dtype=np.int64),
        image_shape=(8, 8),
        n_classes=10,
        description=(
            "scikit-learn load_digits (UCI optical digits, 1797 images 8x8, pixels/16); "
            f"stratified split test_fraction={float(test_fraction)}, random_state={int(seed)}"
        ),
    )
