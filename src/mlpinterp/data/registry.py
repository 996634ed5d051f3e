"""The name-based :func:`load_dataset` dispatcher over the loaders (above :mod:`mlpinterp.data.dataset`)."""

from __future__ import annotations

import os

from mlpinterp.data.dataset import Dataset, check_data_path, check_name
from mlpinterp.data.digits import load_digits
from mlpinterp.data.idx import load_fashion_mnist, load_mnist


def load_dataset(name: str, path: str | os.PathLike | None = None, *, download: bool = False) -> Dataset:
    """Load a dataset by name: ``"digits"``, ``"mnist"`` or ``"fashion-mnist"``.

    ``path`` and ``download`` apply to the IDX datasets (see :func:`mlpinterp.data.idx.load_mnist`);
    digits is bundled with scikit-learn and uses its documented default split
    (:func:`mlpinterp.data.digits.load_digits`), so ``path`` must be ``None`` for it.

    Raises
    ------
    ValueError
        Unknown name, or a ``path`` given for digits; any error of the underlying loader.
    FileNotFoundError
        IDX files missing and ``download=False``.
    """
    key = check_name(name)
    check_data_path(key, path)
    if key == "digits":
        return load_digits()
    loader = load_mnist if key == "mnist" else load_fashion_mnist
    return loader(path, download=download)
