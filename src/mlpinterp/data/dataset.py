"""The :class:`Dataset` container, the dataset names and where their files are looked for.

A dataset is a frozen bundle of flattened float32 images in ``[0, 1]`` and int64 labels,
already split into train and test. Loaders for the individual datasets live in
:mod:`mlpinterp.data.digits` (scikit-learn's bundled 8x8 digits) and :mod:`mlpinterp.data.idx`
(MNIST and Fashion-MNIST IDX files).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATASET_NAMES: tuple[str, ...] = ("digits", "mnist", "fashion-mnist")
"""Names accepted by :func:`mlpinterp.data.registry.load_dataset` and :func:`default_data_dir`."""

ENV_VAR = "MLPINTERP_DATA"
"""Environment variable naming a directory that holds one sub-directory per dataset."""

_DEBIAN_DIRS = {"fashion-mnist": Path("/usr/share/datasets/fashion-mnist")}


@dataclass(frozen=True, eq=False)
class Dataset:
    """A labelled image-classification dataset with a fixed train/test split.

    Arrays are validated on construction and made read-only, so a ``Dataset`` can be
    shared between experiments without defensive copies.

    Raises
    ------
    TypeError
        If an array has the wrong dtype (``X_*`` must be float32, ``y_*`` int64).
    ValueError
        If shapes disagree (``X_*`` must be ``[n, prod(image_shape)]``, ``y_*`` ``[n]``),
        pixels fall outside ``[0, 1]`` or are non-finite, or labels fall outside
        ``[0, n_classes)``.
    """

    name: str
    """Dataset name, e.g. ``"digits"``, ``"mnist"`` or ``"fashion-mnist"``."""
    X_train: np.ndarray
    """Training images, ``[n_train, d_in]`` float32 in ``[0, 1]``, flattened row-major."""
    y_train: np.ndarray
    """Training labels, ``[n_train]`` int64 in ``[0, n_classes)``."""
    X_test: np.ndarray
    """Test images, ``[n_test, d_in]`` float32 in ``[0, 1]``."""
    y_test: np.ndarray
    """Test labels, ``[n_test]`` int64."""
    image_shape: tuple[int, int]
    """Height and width of one image: ``(8, 8)`` for digits, ``(28, 28)`` for (Fashion-)MNIST."""
    n_classes: int
    """Number of classes (10 for all built-in datasets)."""
    description: str = ""
    """Short provenance string: source, split and preprocessing."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty str, got {self.name!r}")
        if (
            not isinstance(self.image_shape, tuple)
            or len(self.image_shape) != 2
            or not all(isinstance(s, int) and s > 0 for s in self.image_shape)
        ):
            raise ValueError(f"image_shape must be a tuple of two positive ints, got {self.image_shape!r}")
        if not isinstance(self.n_classes, int) or self.n_classes < 2:
            raise ValueError(f"n_classes must be an int >= 2, got {self.n_classes!r}")
        d_in = self.image_shape[0] * self.image_shape[1]
        for split in ("train", "test"):
            X = getattr(self, f"X_{split}")
            y = getattr(self, f"y_{split}")
            if not isinstance(X, np.ndarray) or X.dtype != np.float32:
                raise TypeError(f"X_{split} must be a float32 numpy array, got {_describe(X)}")
            if not isinstance(y, np.ndarray) or y.dtype != np.int64:
                raise TypeError(f"y_{split} must be an int64 numpy array, got {_describe(y)}")
            if X.ndim != 2 or X.shape[1] != d_in or X.shape[0] == 0:
                raise ValueError(f"X_{split} must have shape [n_{split} > 0, {d_in}], got {list(X.shape)}")
            if y.shape != (X.shape[0],):
                raise ValueError(f"y_{split} must have shape [{X.shape[0]}], got {list(y.shape)}")
            if not np.all(np.isfinite(X)) or X.min() < 0.0 or X.max() > 1.0:
                raise ValueError(f"X_{split} must hold finite pixel values in [0, 1]")
            if y.min() < 0 or y.max() >= self.n_classes:
                raise ValueError(
                    f"y_{split} must hold labels in [0, {self.n_classes}), got range [{y.min()}, {y.max()}]"
                )
            X.setflags(write=False)
            y.setflags(write=False)

    @property
    def d_in(self) -> int:
        """Input dimension, ``image_shape[0] * image_shape[1]``."""
        return self.image_shape[0] * self.image_shape[1]

    @property
    def n_train(self) -> int:
        """Number of training examples."""
        return int(self.X_train.shape[0])

    @property
    def n_test(self) -> int:
        """Number of test examples."""
        return int(self.X_test.shape[0])

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, n_train={self.n_train}, n_test={self.n_test}, "
            f"image_shape={self.image_shape}, n_classes={self.n_classes})"
        )


def _describe(x) -> str:
    if isinstance(x, np.ndarray):
        return f"ndarray of dtype {x.dtype}"
    return type(x).__name__


def check_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    key = name.lower().replace("_", "-")
    if key == "fashion":
        key = "fashion-mnist"
    if key not in DATASET_NAMES:
        raise ValueError(f"unknown dataset name {name!r}; expected one of {list(DATASET_NAMES)}")
    return key


def check_data_path(dataset: str, path: str | os.PathLike | None, name: str = "path", dataset_arg: str = "name"
                    ) -> None:
    """Refuse a data directory ``path`` for a dataset that reads none: ``digits`` is bundled with scikit-learn.

    ``name`` and ``dataset_arg`` are how the caller's arguments are called in the message (``load_dataset``: ``path``
    and ``name``). Raises ``ValueError`` (with a ``fix``), ``TypeError``/``ValueError`` for an unknown dataset."""
    if path is not None and check_name(dataset) == "digits":
        err = ValueError(f"{name} is not used with {dataset_arg}='digits' (bundled with scikit-learn), got "
                         f"{str(path)!r}")
        err.fix = f"leave '{name}' unset, or choose {dataset_arg}='mnist' or 'fashion-mnist' (IDX files)"
        raise err


def candidate_data_dirs(name: str) -> list[Path]:
    """Directories searched for dataset ``name``, in order of preference.

    1. ``$MLPINTERP_DATA/<name>`` if the environment variable is set;
    2. ``../shared/data/<name>`` relative to the current working directory (the project's
       shared, checksummed copy when run from the repository root);
    3. for ``"fashion-mnist"``: ``/usr/share/datasets/fashion-mnist`` (Debian package
       ``dataset-fashion-mnist``);
    4. ``~/.cache/mlpinterp/data/<name>`` (where ``download=True`` writes by default).

    Raises ``ValueError`` for an unknown name.
    """
    key = check_name(name)
    dirs: list[Path] = []
    env = os.environ.get(ENV_VAR)
    if env:
        dirs.append(Path(env).expanduser() / key)
    dirs.append(Path.cwd().parent / "shared" / "data" / key)
    if key in _DEBIAN_DIRS:
        dirs.append(_DEBIAN_DIRS[key])
    dirs.append(Path.home() / ".cache" / "mlpinterp" / "data" / key)
    return dirs


def default_data_dir(name: str) -> Path:
    """The directory a loader reads dataset ``name`` from when no path is given.

    ``$MLPINTERP_DATA/<name>`` if that variable is set (whether or not the directory exists
    yet: an explicit choice wins); otherwise the first existing directory among
    :func:`candidate_data_dirs`; otherwise ``~/.cache/mlpinterp/data/<name>``.

    Raises ``ValueError`` for an unknown name (``"digits"`` is accepted; it needs no files).
    """
    key = check_name(name)
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser() / key
    cands = candidate_data_dirs(key)
    for d in cands:
        if d.is_dir():
            return d
    return cands[-1]
