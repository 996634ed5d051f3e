"""MNIST and Fashion-MNIST from their standard IDX files, verified byte for byte.

IDX format (LeCun et al., http://yann.lecun.com/exdb/mnist/): two zero bytes, a type byte
(``0x08`` = unsigned byte), the number of dimensions ``ndim``, then ``ndim`` big-endian uint32
sizes, then the data in row-major (C) order. Each dataset is four files
``{train,t10k}-{images-idx3,labels-idx1}-ubyte``, either gzip-compressed (``.gz``, as
distributed) or uncompressed.

Every file is checked for the magic number, the dimensions, the exact byte length and the md5
of its *uncompressed* bytes (gzip headers vary between copies, so the compressed md5 is not a
stable identity). Any mismatch raises an error naming the file; no partial array is returned.

Checksums:

* MNIST: the raw md5s of the project's shared copy (``/work/shared/data/README.md``), identical to
  the published MNIST bytes.
* Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv 1708.07747): raw md5s computed from the Debian
  package ``dataset-fashion-mnist`` (0.0~git20200523) and identical to the raw-file md5 tables in
  several independent public loaders that pair them with the official compressed md5s
  (``8d4fb7e6...``, ``25c81989...``, ``bef4ecab...``, ``bb300cfd...``).
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlpinterp.data.dataset import Dataset, candidate_data_dirs, default_data_dir
from mlpinterp.utils.io import atomic_write_bytes

IDX_UBYTE = 0x08
"""IDX type code for unsigned bytes, the only type used by (Fashion-)MNIST."""


@dataclass(frozen=True)
class IdxFile:
    """Expected identity of one IDX file."""

    name: str
    """File name without ``.gz``, e.g. ``"train-images-idx3-ubyte"``."""
    shape: tuple[int, ...]
    """Decoded array shape, e.g. ``(60000, 28, 28)``."""
    md5: str
    """md5 hex digest of the uncompressed bytes."""

    @property
    def n_bytes(self) -> int:
        """Exact uncompressed length: 4-byte magic + 4 bytes per dimension + data."""
        return 4 + 4 * len(self.shape) + math.prod(int(n) for n in self.shape)


MNIST_FILES: dict[str, IdxFile] = {
    "train_images": IdxFile("train-images-idx3-ubyte", (60000, 28, 28), "6bbc9ace898e44ae57da46a324031adb"),
    "train_labels": IdxFile("train-labels-idx1-ubyte", (60000,), "a25bea736e30d166cdddb491f175f624"),
    "test_images": IdxFile("t10k-images-idx3-ubyte", (10000, 28, 28), "2646ac647ad5339dbf082846283269ea"),
    "test_labels": IdxFile("t10k-labels-idx1-ubyte", (10000,), "27ae3e4e09519cfbb04c329615203637"),
}
"""The four MNIST files with their raw md5s."""

FASHION_MNIST_FILES: dict[str, IdxFile] = {
    "train_images": IdxFile("train-images-idx3-ubyte", (60000, 28, 28), "f4a8712d7a061bf5bd6d2ca38dc4d50a"),
    "train_labels": IdxFile("train-labels-idx1-ubyte", (60000,), "9018921c3c673c538a1fc5bad174d6f9"),
    "test_images": IdxFile("t10k-images-idx3-ubyte", (10000, 28, 28), "8181f5470baa50b63fa0f6fddb340f0a"),
    "test_labels": IdxFile("t10k-labels-idx1-ubyte", (10000,), "15d484375f8d13e6eb1aabb0c3f46965"),
}
"""The four Fashion-MNIST files with their raw md5s."""

MIRRORS: dict[str, tuple[str, ...]] = {
    "mnist": (
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
    ),
    "fashion-mnist": (
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    ),
}
"""Public mirrors serving the ``.gz`` files, tried in order by ``download=True``."""

_FILES = {"mnist": MNIST_FILES, "fashion-mnist": FASHION_MNIST_FILES}
_HOW_TO_GET = {
    "mnist": "put the four files there, or set $MLPINTERP_DATA to a directory containing mnist/, or download them "
    "(needs network; library only: load_dataset('mnist', download=True), the CLI never downloads)",
    "fashion-mnist": "`apt-get install dataset-fashion-mnist` (files in /usr/share/datasets/fashion-mnist/), or set "
    "$MLPINTERP_DATA to a directory containing fashion-mnist/, or download them (needs network; library only: "
    "load_dataset('fashion-mnist', download=True), the CLI never downloads)",
}


def find_idx_file(directory: str | os.PathLike, name: str) -> Path | None:
    """Return ``directory/name.gz`` or ``directory/name`` (in that order) if it exists, else ``None``."""
    d = Path(directory)
    for cand in (d / f"{name}.gz", d / name):
        if cand.is_file():
            return cand
    return None


MAX_IDX_BYTES = 1 << 31
"""Largest uncompressed IDX file read without an expected size (2 GiB; MNIST's largest file is 47 MB)."""

_CHUNK = 1 << 20


def _raw_bytes(path: Path, expected: IdxFile | None = None) -> bytes:
    """The uncompressed bytes of ``path`` (gzip decided by content, not by name), never more than its size allows.

    The size is known before the data is read: ``expected.n_bytes`` when given, else the size the IDX header
    declares (at most :data:`MAX_IDX_BYTES`). A plain file is checked by its length on disk; a gzip stream is
    decompressed in chunks of at most 1 MiB of output, its header checked as soon as it is out, and refused the
    moment its output exceeds that size (a small gzip can expand to gigabytes).
    """
    with open(path, "rb") as f:
        magic = f.read(2)
        if magic != b"\x1f\x8b":
            if path.suffix == ".gz":
                raise ValueError(f"{str(path)!r} has a .gz name but does not start with the gzip magic bytes 1f 8b")
            size = path.stat().st_size
            head = magic + f.read(2)
            if len(head) == 4 and head[:3] == bytes([0, 0, IDX_UBYTE]) and head[3] > 0:
                head += f.read(4 * head[3])
                if len(head) == 4 + 4 * head[3]:
                    _check_shape(head, str(path), expected)
            limit = expected.n_bytes if expected is not None else MAX_IDX_BYTES
            if size > limit:
                raise ValueError(f"{str(path)!r}: {size} bytes, more than the {limit} "
                                 f"{'expected' if expected is not None else 'allowed for an IDX file'} "
                                 "(trailing bytes, or not this file)")
            f.seek(0)
            return f.read()
        f.seek(0)
        return _gunzip_bounded(f, path, expected)


def _gunzip_bounded(f, path: Path, expected: IdxFile | None) -> bytes:
    d = zlib.decompressobj(wbits=31)  # gzip container
    out = bytearray()
    limit = expected.n_bytes if expected is not None else None
    header_checked, buf = False, b""
    try:
        while not d.eof:
            if not buf:
                buf = f.read(_CHUNK)
                if not buf:
                    raise ValueError(f"{str(path)!r} is not a valid gzip file (truncated: the stream ends early)")
            room = _CHUNK if limit is None else min(_CHUNK, limit + 1 - len(out))
            out += d.decompress(buf, room)
            buf = d.unconsumed_tail
            if not header_checked and len(out) >= 4 and len(out) >= 4 + 4 * out[3]:
                header_checked = True
                declared = _declared_size(bytes(out[:4 + 4 * out[3]]), path)  # None: decode_idx says what is wrong
                if declared is not None:
                    _check_shape(bytes(out[:4 + 4 * out[3]]), str(path), expected)
                limit = min(x for x in (limit, declared, MAX_IDX_BYTES) if x is not None)
            if limit is not None and len(out) > limit:
                raise ValueError(f"{str(path)!r}: decompresses to more than the {limit} bytes its IDX header "
                                 "declares or the file should have (stopped there: trailing bytes, or not this file)")
    except zlib.error as e:
        raise ValueError(f"{str(path)!r} is not a valid gzip file (corrupt or truncated: {e})") from e
    return bytes(out)


def _check_shape(header: bytes, source: str, expected: IdxFile | None) -> None:
    """``ValueError`` naming both shapes when a well-formed IDX header (magic + sizes) declares other dimensions than
    ``expected`` (e.g. the train and test label files swapped), before any data is read."""
    if expected is None:
        return
    shape = tuple(int(n) for n in np.frombuffer(header, dtype=">u4", count=header[3], offset=4))
    if shape != tuple(expected.shape):
        raise ValueError(f"{source}: IDX dimensions {shape}, expected {tuple(expected.shape)}")


def _declared_size(header: bytes, path: Path) -> int | None:
    """Total bytes an IDX header (magic + sizes) declares (``None`` for a malformed header, which
    :func:`decode_idx` then names); ``ValueError`` when that is over :data:`MAX_IDX_BYTES`."""
    if header[0] != 0 or header[1] != 0 or header[2] != IDX_UBYTE or header[3] == 0:
        return None
    ndim = header[3]
    size = 4 + 4 * ndim + math.prod(int(n) for n in np.frombuffer(header, dtype=">u4", count=ndim, offset=4))
    if size > MAX_IDX_BYTES:
        raise ValueError(f"{str(path)!r}: its IDX header declares {size} bytes, more than the {MAX_IDX_BYTES} "
                         "allowed for an IDX file")
    return size


def decode_idx(raw: bytes, source: str = "<bytes>", expected: IdxFile | None = None) -> np.ndarray:
    """Decode uncompressed IDX bytes into a read-only uint8 array.

    Checks the magic number (``00 00 08 ndim``), that the byte length equals
    ``4 + 4 * ndim + prod(shape)`` exactly, and, when ``expected`` is given, the shape and the md5
    of ``raw``. ``source`` names the file in error messages.

    Raises
    ------
    ValueError
        Bad magic, unsupported type code, wrong dimensions, wrong length or md5 mismatch.
    """
    if len(raw) < 4:
        raise ValueError(f"{source}: IDX file too short ({len(raw)} bytes) to hold the 4-byte magic number")
    if raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{source}: bad IDX magic number {raw[:4].hex()} (expected 0000 08 <ndim>)")
    if raw[2] != IDX_UBYTE:
        raise ValueError(f"{source}: unsupported IDX type code 0x{raw[2]:02x} (expected 0x08, unsigned byte)")
    ndim = raw[3]
    if ndim == 0 or len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{source}: IDX header declares {ndim} dimensions but the file has {len(raw)} bytes")
    _check_shape(raw[:4 + 4 * ndim], source, expected)
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    n_expected = 4 + 4 * ndim + math.prod(int(n) for n in shape)  # Python ints: no int64 wrap-around
    if len(raw) != n_expected:
        raise ValueError(
            f"{source}: {len(raw)} bytes, expected exactly {n_expected} for shape {shape} "
            f"({'truncated' if len(raw) < n_expected else 'trailing bytes'})"
        )
    if expected is not None:
        md5 = hashlib.md5(raw, usedforsecurity=False).hexdigest()
        if md5 != expected.md5:
            raise ValueError(
                f"{source}: md5 of the uncompressed bytes is {md5}, expected {expected.md5} (corrupt copy?)"
            )
    arr = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape).copy()
    arr.setflags(write=False)
    return arr


def read_idx(path: str | os.PathLike, expected: IdxFile | None = None) -> np.ndarray:
    """Read one IDX file (gzip-compressed or not) into a read-only uint8 array.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Invalid gzip stream, or any check of :func:`decode_idx` fails (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file {str(path)!r} does not exist")
    return decode_idx(_raw_bytes(path, expected), source=repr(str(path)), expected=expected)


def download_idx(name: str, directory: str | os.PathLike, *, timeout: float = 60.0) -> list[Path]:
    """Download the four ``.gz`` files of ``name`` (``"mnist"`` or ``"fashion-mnist"``) into ``directory``.

    Files already present are kept (the loaders verify them and report a corrupt copy). Each
    download is verified (raw md5) before it is written atomically. Tries each mirror in
    :data:`MIRRORS` in turn.

    Raises
    ------
    ValueError
        Unknown name.
    OSError
        If no mirror served a valid copy of a file (the message lists each mirror's error).
    """
    key = name.lower()
    if key not in _FILES:
        raise ValueError(f"name must be one of {list(_FILES)}, got {name!r}")
    directory = Path(directory)
    out = []
    for spec in _FILES[key].values():
        existing = find_idx_file(directory, spec.name)
        if existing is not None:  # verified by the loader; a corrupt copy is reported, not replaced
            out.append(existing)
            continue
        errors = []
        for base in MIRRORS[key]:
            url = base + spec.name + ".gz"
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (fixed https mirrors)
                    data = resp.read()
                decode_idx(gzip.decompress(data), source=url, expected=spec)
            except Exception as e:  # network errors, bad gzip, checksum mismatch: try the next mirror
                errors.append(f"{url}: {e}")
                continue
            target = directory / f"{spec.name}.gz"
            atomic_write_bytes(target, data)
            out.append(target)
            break
        else:
            raise OSError(f"could not download {spec.name}.gz for {key}:\n  " + "\n  ".join(errors))
    return out


def _load_idx_dataset(key: str, path, download: bool) -> Dataset:
    files = _FILES[key]
    if path is None:
        # The first candidate directory that holds all four files; else the default directory.
        directory = next(
            (d for d in candidate_data_dirs(key) if all(find_idx_file(d, s.name) for s in files.values())),
            default_data_dir(key),
        )
    else:
        if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str, os.PathLike or None, got {type(path).__name__}")
        directory = Path(path).expanduser()
    missing = [s.name for s in files.values() if find_idx_file(directory, s.name) is None]
    if missing and download:
        download_idx(key, directory)
        missing = [s.name for s in files.values() if find_idx_file(directory, s.name) is None]
    if missing:
        raise FileNotFoundError(
            f"{key}: missing IDX file(s) {', '.join(m + '[.gz]' for m in missing)} in {str(directory)!r}. "
            f"To get them: {_HOW_TO_GET[key]}."
        )
    # Smallest files first, so that a corrupt label file fails before ~50 MB are hashed.
    arrays = {
        k: read_idx(find_idx_file(directory, s.name), s) for k, s in sorted(files.items(), key=lambda kv: kv[1].n_bytes)
    }
    for split in ("train", "test"):
        labels = arrays[f"{split}_labels"]
        if labels.max() > 9:
            raise ValueError(f"{key}: {split} labels must lie in 0..9, found {int(labels.max())}")
    h, w = files["train_images"].shape[1:]
    return Dataset(
        name=key,
        X_train=(arrays["train_images"].reshape(-1, h * w).astype(np.float32) / np.float32(255.0)),
        y_train=arrays["train_labels"].astype(np.int64),
        X_test=(arrays["test_images"].reshape(-1, h * w).astype(np.float32) / np.float32(255.0)),
        y_test=arrays["test_labels"].astype(np.int64),
        image_shape=(int(h), int(w)),
        n_classes=10,
        description=(
            f"{key} IDX files from {str(directory)!r} (raw md5 verified); official 60000/10000 "
            "train/test split; pixels/255, flattened row-major"
        ),
    )


def load_mnist(path: str | os.PathLike | None = None, *, download: bool = False) -> Dataset:
    """Load MNIST (LeCun, Cortes & Burges) from its four IDX files, with the official split.

    Parameters
    ----------
    path
        Directory holding ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``. ``None``: the first
        of :func:`mlpinterp.data.dataset.candidate_data_dirs` holding all four files
        (``$MLPINTERP_DATA/mnist``, ``../shared/data/mnist``, ``~/.cache/mlpinterp/data/mnist``).
    download
        If files are missing, fetch them from :data:`MIRRORS` into that directory first.

    Returns
    -------
    Dataset
        60,000 train / 10,000 test images, ``X_*`` ``[n, 784]`` float32 = pixel/255,
        ``y_*`` ``[n]`` int64, ``image_shape=(28, 28)``.

    Raises
    ------
    FileNotFoundError
        A file is missing and ``download=False`` (the message says how to get it).
    ValueError
        A file is corrupt: bad gzip stream, magic number, dimensions, length or md5.
    """
    return _load_idx_dataset("mnist", path, download)


def load_fashion_mnist(path: str | os.PathLike | None = None, *, download: bool = False) -> Dataset:
    """Load Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) from its four IDX files, with the official split.

    Same file names, shapes, checks and return value as :func:`load_mnist`. With ``path=None``
    the search also covers ``/usr/share/datasets/fashion-mnist`` (Debian ``dataset-fashion-mnist``).
    Classes: 0 T-shirt/top, 1 Trouser, 2 Pullover, 3 Dress, 4 Coat, 5 Sandal, 6 Shirt, 7 Sneaker,
    8 Bag, 9 Ankle boot.

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`load_mnist`.
    """
    return _load_idx_dataset("fashion-mnist", path, download)
