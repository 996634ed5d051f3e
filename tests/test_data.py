"""Tests for mlpinterp.data: digits split, IDX decoding and verification, MNIST / Fashion-MNIST."""

from __future__ import annotations

import gzip
import hashlib
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from mlpinterp.data import (
    Dataset,
    candidate_data_dirs,
    default_data_dir,
    load_dataset,
    load_digits,
    load_fashion_mnist,
    load_mnist,
    read_idx,
)
from mlpinterp.data.idx import FASHION_MNIST_FILES, MNIST_FILES, IdxFile, decode_idx

REPO = Path(__file__).resolve().parents[1]
MNIST_DIR = REPO.parent / "shared" / "data" / "mnist"
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
needs_mnist = pytest.mark.skipif(not MNIST_DIR.is_dir(), reason=f"{MNIST_DIR} absent")
needs_fashion = pytest.mark.skipif(not FASHION_DIR.is_dir(), reason=f"{FASHION_DIR} absent")


# --------------------------------------------------------------------------- helpers


def encode_idx(arr: np.ndarray) -> bytes:
    """Independent IDX encoder written from the format description (00 00 08 ndim, >u4 dims, data)."""
    arr = np.asarray(arr, dtype=np.uint8)
    return struct.pack(">BBBB", 0, 0, 8, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def spec_for(raw: bytes, name: str, shape: tuple[int, ...]) -> IdxFile:
    return IdxFile(name, shape, hashlib.md5(raw).hexdigest())


# --------------------------------------------------------------------------- digits


def test_digits_split_is_a_stratified_partition_of_sklearn_digits():
    from sklearn.datasets import load_digits as sk

    bunch = sk()
    d = load_digits()
    assert d.name == "digits" and d.image_shape == (8, 8) and d.d_in == 64 and d.n_classes == 10
    # 1797 images; test_size 0.25 -> sklearn rounds the test size up: ceil(0.25 * 1797) = 450.
    assert d.X_train.shape == (1347, 64) and d.X_test.shape == (450, 64)
    assert d.X_train.dtype == np.float32 and d.y_train.dtype == np.int64
    # Partition: the union of train and test rows is exactly the original data / 16 (as a multiset).
    ours = np.concatenate([np.c_[d.X_train * 16, d.y_train], np.c_[d.X_test * 16, d.y_test]])
    ref = np.c_[bunch.data, bunch.target]
    np.testing.assert_array_equal(ours[np.lexsort(ours.T)], ref[np.lexsort(ref.T)])
    # Pixels are the UCI integer counts 0..16 scaled by 1/16.
    assert np.all((d.X_train * 16) == np.round(d.X_train * 16)) and d.X_train.max() == 1.0
    # Stratified: each class's test count is within 1 of 25% of its total.
    total = np.bincount(bunch.target, minlength=10)
    assert np.all(np.abs(np.bincount(d.y_test, minlength=10) - 0.25 * total) <= 1)


def test_digits_split_is_deterministic_and_seeded():
    a, b, c = load_digits(seed=0), load_digits(seed=0), load_digits(seed=1)
    np.testing.assert_array_equal(a.X_train, b.X_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.y_test, c.y_test)
    d = load_digits(test_fraction=0.5)
    assert d.n_test in (898, 899)


@pytest.mark.parametrize("frac", [0.0, 1.0, -0.1, 1.5])
def test_digits_rejects_bad_test_fraction(frac):
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits(test_fraction=frac)


def test_digits_rejects_bad_seed_and_types():
    with pytest.raises(ValueError, match="seed"):
        load_digits(seed=-1)
    with pytest.raises(TypeError, match="seed"):
        load_digits(seed=1.5)
    with pytest.raises(TypeError, match="test_fraction"):
        load_digits(test_fraction="0.2")


def test_dataset_arrays_are_read_only():
    d = load_digits()
    with pytest.raises(ValueError):
        d.X_train[0, 0] = 0.5


# --------------------------------------------------------------------------- Dataset validation


def _tiny(**over):
    kw = dict(
        name="t",
        X_train=np.zeros((4, 4), np.float32),
        y_train=np.array([0, 1, 0, 1], np.int64),
        X_test=np.zeros((2, 4), np.float32),
        y_test=np.array([0, 1], np.int64),
        image_shape=(2, 2),
        n_classes=2,
    )
    kw.update(over)
    return Dataset(**kw)


def test_dataset_validation_messages():
    assert _tiny().d_in == 4
    with pytest.raises(TypeError, match="X_train must be a float32"):
        _tiny(X_train=np.zeros((4, 4), np.float64))
    with pytest.raises(TypeError, match="y_test must be an int64"):
        _tiny(y_test=np.array([0, 1], np.int32))
    with pytest.raises(ValueError, match=r"X_test must have shape \[n_test > 0, 4\], got \[2, 3\]"):
        _tiny(X_test=np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"y_train must have shape \[4\]"):
        _tiny(y_train=np.array([0, 1], np.int64))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        _tiny(X_train=np.full((4, 4), 2.0, np.float32))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        _tiny(X_train=np.full((4, 4), np.nan, np.float32))
    with pytest.raises(ValueError, match="labels in"):
        _tiny(y_train=np.array([0, 1, 2, 1], np.int64))
    with pytest.raises(ValueError, match="image_shape"):
        _tiny(image_shape=(4,))


# --------------------------------------------------------------------------- IDX decoding


def test_idx_round_trip_gz_and_raw(tmp_path):
    arr = np.random.default_rng(0).integers(0, 256, size=(7, 3, 5), dtype=np.uint8)
    raw = encode_idx(arr)
    spec = spec_for(raw, "x-idx3-ubyte", (7, 3, 5))
    (tmp_path / "x-idx3-ubyte").write_bytes(raw)
    (tmp_path / "x-idx3-ubyte.gz").write_bytes(gzip.compress(raw))
    for p in ("x-idx3-ubyte", "x-idx3-ubyte.gz"):
        out = read_idx(tmp_path / p, spec)
        assert out.dtype == np.uint8
        np.testing.assert_array_equal(out, arr)
    # no spec: structure only
    np.testing.assert_array_equal(decode_idx(encode_idx(arr[:, 0, 0])), arr[:, 0, 0])


def _corruptions(raw: bytes) -> dict[str, tuple[bytes, str]]:
    flipped = bytearray(raw)
    flipped[-1] ^= 0xFF
    bad_magic = bytearray(raw)
    bad_magic[0] = 1
    bad_type = bytearray(raw)
    bad_type[2] = 0x0D
    bad_dim = bytearray(raw)
    bad_dim[7] += 1  # first dimension + 1
    return {
        "flip": (bytes(flipped), "md5"),
        "truncate": (raw[:-3], "truncated"),
        "trailing": (raw + b"\0", "trailing"),
        "magic": (bytes(bad_magic), "magic"),
        "type": (bytes(bad_type), "type code"),
        "dims": (bytes(bad_dim), "dimensions"),
        "empty": (b"", "too short"),
        "header_only": (raw[:6], "declares"),
    }


@pytest.mark.parametrize("kind", list(_corruptions(b"\0\0\x08\x01\0\0\0\x03abc")))
@pytest.mark.parametrize("gz", [False, True])
def test_idx_corruption_raises_naming_the_file(tmp_path, kind, gz):
    arr = np.arange(12, dtype=np.uint8)
    raw = encode_idx(arr)
    spec = spec_for(raw, "y-idx1-ubyte", (12,))
    bad, msg = _corruptions(raw)[kind]
    path = tmp_path / ("y-idx1-ubyte.gz" if gz else "y-idx1-ubyte")
    path.write_bytes(gzip.compress(bad) if gz else bad)
    with pytest.raises(ValueError, match=msg) as exc:
        read_idx(path, spec)
    assert str(path) in str(exc.value)


def test_truncated_gzip_stream_raises(tmp_path):
    raw = encode_idx(np.arange(1000, dtype=np.int64).astype(np.uint8))
    path = tmp_path / "z-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(raw)[:-20])
    with pytest.raises(ValueError, match="gzip"):
        read_idx(path)
    path.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="gzip magic"):
        read_idx(path)


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        read_idx(tmp_path / "nope")


def test_checksum_tables_are_consistent():
    for table in (MNIST_FILES, FASHION_MNIST_FILES):
        assert table["train_images"].n_bytes == 47_040_016  # 16 + 60000*28*28 (shared README)
        assert table["train_labels"].n_bytes == 60_008
        assert table["test_images"].n_bytes == 7_840_016
        assert table["test_labels"].n_bytes == 10_008
        assert all(re.fullmatch("[0-9a-f]{32}", s.md5) for s in table.values())


SHARED_README = MNIST_DIR.parent / "README.md"


@pytest.mark.skipif(not SHARED_README.is_file(), reason=f"{SHARED_README} absent")
def test_mnist_checksums_equal_the_shared_data_readme():
    """Oracle: the md5 / byte table of ../shared/data/README.md, written from the files (not from our code)."""
    rows = re.findall(r"^\| ([\w.-]+)\.gz \| ([\d,]+) \| ([0-9a-f]{32}) \|$", SHARED_README.read_text(), re.M)
    readme = {name: (int(n.replace(",", "")), md5) for name, n, md5 in rows}
    assert len(readme) == 4
    assert {s.name: (s.n_bytes, s.md5) for s in MNIST_FILES.values()} == readme


@needs_fashion
def test_fashion_mnist_checksums_match_the_debian_files():
    """Oracle: md5 and length of the installed Debian files, decompressed here with gzip + hashlib."""
    for spec in FASHION_MNIST_FILES.values():
        raw = gzip.decompress((FASHION_DIR / f"{spec.name}.gz").read_bytes())
        assert (len(raw), hashlib.md5(raw).hexdigest()) == (spec.n_bytes, spec.md5), spec.name


# --------------------------------------------------------------------------- missing files / locations


def test_missing_files_error_says_how_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=True") as exc:
        load_mnist(tmp_path)
    assert "train-images-idx3-ubyte" in str(exc.value) and str(tmp_path) in str(exc.value)
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_dataset("mnist", tmp_path)


def test_default_data_dir_order(tmp_path, monkeypatch):
    monkeypatch.setenv("MLPINTERP_DATA", str(tmp_path / "mine"))
    assert default_data_dir("mnist") == tmp_path / "mine" / "mnist"
    assert candidate_data_dirs("fashion-mnist")[0] == tmp_path / "mine" / "fashion-mnist"
    monkeypatch.delenv("MLPINTERP_DATA")
    (tmp_path / "shared" / "data" / "mnist").mkdir(parents=True)
    (tmp_path / "repo").mkdir()
    monkeypatch.chdir(tmp_path / "repo")
    assert default_data_dir("mnist") == tmp_path / "shared" / "data" / "mnist"
    assert Path("/usr/share/datasets/fashion-mnist") in candidate_data_dirs("fashion-mnist")
    with pytest.raises(ValueError, match="unknown dataset name 'cifar'"):
        default_data_dir("cifar")


def test_load_dataset_rejects_bad_names():
    with pytest.raises(ValueError, match="unknown dataset name"):
        load_dataset("imagenet")
    with pytest.raises(TypeError, match="name must be a str"):
        load_dataset(3)
    with pytest.raises(ValueError, match="path is not used with name='digits'"):
        load_dataset("digits", "/tmp")
    assert load_dataset("digits").n_train == 1347


def test_load_mnist_rejects_bad_path_type():
    with pytest.raises(TypeError, match="path"):
        load_mnist(3)


# --------------------------------------------------------------------------- real MNIST / Fashion-MNIST

# Label counts from /work/shared/data/README.md (an independent source: written from the files).
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@needs_mnist
def test_real_mnist_shapes_and_label_counts():
    d = load_mnist(MNIST_DIR)
    assert d.X_train.shape == (60000, 784) and d.X_test.shape == (10000, 784)
    assert d.image_shape == (28, 28) and d.n_classes == 10
    assert np.bincount(d.y_train).tolist() == MNIST_TRAIN_COUNTS
    assert np.bincount(d.y_test).tolist() == MNIST_TEST_COUNTS
    assert d.X_train.min() == 0.0 and d.X_train.max() == 1.0
    # pixel / 255 exactly: multiplying back gives integers 0..255
    sample = d.X_test[:100] * np.float32(255)
    np.testing.assert_array_equal(sample, np.round(sample))


@needs_mnist
def test_mnist_uncompressed_file_matches_gz(tmp_path):
    raw = gzip.decompress((MNIST_DIR / "t10k-labels-idx1-ubyte.gz").read_bytes())
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(raw)
    spec = MNIST_FILES["test_labels"]
    a = read_idx(tmp_path / "t10k-labels-idx1-ubyte", spec)
    b = read_idx(MNIST_DIR / "t10k-labels-idx1-ubyte.gz", spec)
    np.testing.assert_array_equal(a, b)
    assert np.bincount(a).tolist() == MNIST_TEST_COUNTS


def _mnist_copy(tmp_path: Path) -> Path:
    """Symlink the image files, copy the (small) label files: corrupt the copies only."""
    d = tmp_path / "mnist"
    d.mkdir()
    for spec in MNIST_FILES.values():
        src = MNIST_DIR / f"{spec.name}.gz"
        if "labels" in spec.name:
            shutil.copy(src, d / src.name)
        else:
            (d / src.name).symlink_to(src)
    return d


@needs_mnist
@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_corrupt_mnist_copy_raises(tmp_path, how):
    d = _mnist_copy(tmp_path)
    target = d / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(target.read_bytes()))
    if how == "flip":
        raw[5000] ^= 0x01  # a label changes, structure intact: only the md5 can catch it
        target.write_bytes(gzip.compress(bytes(raw)))
        match = "md5"
    else:
        target.write_bytes(gzip.compress(bytes(raw[:-10])))
        match = "truncated"
    with pytest.raises(ValueError, match=match) as exc:
        load_mnist(d)
    assert "t10k-labels-idx1-ubyte" in str(exc.value)


@needs_mnist
def test_mnist_wrong_files_in_directory_raise(tmp_path):
    d = _mnist_copy(tmp_path)
    # Swap train and test label files: valid IDX, wrong dimensions.
    tr, te = d / "train-labels-idx1-ubyte.gz", d / "t10k-labels-idx1-ubyte.gz"
    a, b = tr.read_bytes(), te.read_bytes()
    tr.write_bytes(b)
    te.write_bytes(a)
    with pytest.raises(ValueError, match="dimensions"):
        load_mnist(d)


@needs_mnist
def test_mnist_uncompressed_file_of_other_dimensions_is_named_by_its_header(tmp_path):
    import gzip

    d = _mnist_copy(tmp_path)
    # the train labels, uncompressed, under the test labels' plain name: refused from the header, before the size
    raw = gzip.decompress((d / "train-labels-idx1-ubyte.gz").read_bytes())
    (d / "t10k-labels-idx1-ubyte.gz").unlink()
    (d / "t10k-labels-idx1-ubyte").write_bytes(raw)
    with pytest.raises(ValueError, match=r"IDX dimensions \(60000,\), expected \(10000,\)"):
        load_mnist(d)


@needs_fashion
def test_real_fashion_mnist_is_balanced():
    # Xiao, Rasul & Vollgraf (2017), Table 1: 6,000 train and 1,000 test images per class.
    d = load_fashion_mnist(FASHION_DIR)
    assert d.X_train.shape == (60000, 784) and d.X_test.shape == (10000, 784)
    assert np.bincount(d.y_train).tolist() == [6000] * 10
    assert np.bincount(d.y_test).tolist() == [1000] * 10
    assert d.name == "fashion-mnist"


# ------------------------------------------------------------------ download (no network: fake mirrors)


class _FakeResponse:
    def __init__(self, data: bytes):
        self._data = data

    def read(self) -> bytes:
        return self._data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def tiny_mnist(monkeypatch):
    """Replace the MNIST file table by four tiny synthetic IDX files; return their .gz bytes by name."""
    import mlpinterp.data.idx as idx

    rng = np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
        "train_labels": np.array([0, 1, 2, 3, 4, 5], np.uint8),
        "test_images": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
        "test_labels": np.array([9, 8, 7], np.uint8),
    }
    table, served = {}, {}
    for key, arr in arrays.items():
        raw = encode_idx(arr)
        spec = spec_for(raw, MNIST_FILES[key].name, arr.shape)
        table[key] = spec
        served[spec.name + ".gz"] = gzip.compress(raw)
    monkeypatch.setitem(idx._FILES, "mnist", table)
    return served, arrays


def test_download_verifies_and_falls_back_to_next_mirror(tmp_path, monkeypatch, tiny_mnist):
    import urllib.error

    import mlpinterp.data.idx as idx

    served, arrays = tiny_mnist
    first, second = idx.MIRRORS["mnist"]
    requested = []

    def fake_urlopen(url, timeout):
        requested.append(url)
        name = url.rsplit("/", 1)[1]
        if url.startswith(first):
            if "labels" in name:  # first mirror serves a corrupt label file ...
                raw = bytearray(gzip.decompress(served[name]))
                raw[-1] ^= 1
                return _FakeResponse(gzip.compress(bytes(raw)))
            raise urllib.error.URLError("offline")  # ... and no images
        return _FakeResponse(served[name])

    monkeypatch.setattr(idx.urllib.request, "urlopen", fake_urlopen)
    target = tmp_path / "dl"
    d = load_dataset("mnist", target, download=True)
    np.testing.assert_array_equal(d.y_test, [9, 8, 7])
    np.testing.assert_array_equal(d.X_train * np.float32(255), arrays["train_images"].reshape(6, 784))
    assert sorted(p.name for p in target.iterdir()) == sorted(served)
    assert len(requested) == 8 and all(u.startswith((first, second)) for u in requested)
    # Present files are not fetched again.
    requested.clear()
    load_mnist(target, download=True)
    assert requested == []


def test_download_failure_lists_every_mirror(tmp_path, monkeypatch):
    import urllib.error

    import mlpinterp.data.idx as idx

    def offline(url, timeout):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(idx.urllib.request, "urlopen", offline)
    with pytest.raises(OSError, match="could not download") as exc:
        load_fashion_mnist(tmp_path, download=True)
    assert all(m in str(exc.value) for m in idx.MIRRORS["fashion-mnist"])
    assert list(tmp_path.iterdir()) == []  # nothing partial written
