"""Real datasets: scikit-learn's 8x8 digits, MNIST and Fashion-MNIST (IDX files, md5-verified).

All loaders return a :class:`Dataset` of flattened float32 images in ``[0, 1]`` and int64 labels.
"""

from mlpinterp.data.dataset import DATASET_NAMES, Dataset, candidate_data_dirs, default_data_dir
from mlpinterp.data.digits import load_digits
from mlpinterp.data.idx import load_fashion_mnist, load_mnist, read_idx
from mlpinterp.data.registry import load_dataset

__all__ = [
    "DATASET_NAMES",
    "Dataset",
    "candidate_data_dirs",
    "default_data_dir",
    "load_dataset",
    "load_digits",
    "load_fashion_mnist",
    "load_mnist",
    "read_idx",
]
