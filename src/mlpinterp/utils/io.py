"""Atomic, resumable artefact I/O: ``NAME.safetensors`` + ``NAME.json`` pairs.

Writes go to a temporary file in the same directory followed by ``os.replace``, so an
interrupted run never leaves a truncated artefact under the final name.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic_replace(path: Path, write: Callable[[str], None]) -> None:
    """Run ``write(tmp)`` on a temporary file beside ``path``, then give it normal permissions and rename it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename), with the usual file permissions."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    _atomic_replace(Path(path), write)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n").encode())


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"object of type {type(o).__name__} is not JSON serialisable")


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], meta: dict | None = None) -> Path:
    """Save ``tensors`` to ``path`` (``.safetensors``) and ``meta`` to the sibling ``.json``, atomically.

    ``.safetensors`` is appended unless ``path`` already ends with it (``fit.deg2`` -> ``fit.deg2.safetensors``
    and ``fit.deg2.json``; an existing suffix is never replaced, so dotted names cannot collide).
    The JSON is written last: a checkpoint counts as complete only when both files exist.
    Returns the safetensors path.
    """
    path = tensors_path(path)
    _atomic_replace(path, lambda tmp: save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp))
    atomic_write_json(path.with_suffix(".json"), meta or {})
    return path


def tensors_path(path: str | os.PathLike) -> Path:
    """The ``.safetensors`` path ``save_tensors`` writes for ``path``: the suffix is appended unless present."""
    path = Path(path)
    return path if path.suffix == ".safetensors" else path.with_name(path.name + ".safetensors")


def load_tensors(path: str | os.PathLike, *, what: str = "file") -> tuple[dict[str, torch.Tensor], dict]:
    """Load a ``.safetensors`` file and its sibling ``.json`` metadata (``{}`` if absent).

    ``path`` may be the name given to ``save_tensors`` (``NAME``, loaded from ``NAME.safetensors`` when ``NAME``
    itself does not exist) or the returned ``.safetensors`` path. ``what`` names the file in error messages (e.g.
    ``"checkpoint"``, ``"model"``); the caller adds the fix that fits it.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not a valid safetensors file (corrupt or truncated), or the JSON is not valid UTF-8 JSON or
        not a JSON object (via :func:`read_json`), naming the file.
    """
    path = Path(path)
    if not path.exists() and tensors_path(path).exists():
        path = tensors_path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, Exception) as e:  # safetensors raises several types on corruption
        raise ValueError(f"{what} {str(path)!r} is not a valid safetensors file ({e})") from e
    meta_path = path.with_suffix(".json")
    meta = read_json(meta_path, what=f"{what} metadata", fix=None) if meta_path.exists() else {}
    return tensors, meta


def read_json(path: str | os.PathLike, *, what: str = "file", expect: type | None = dict,
              fix: str | None = "delete it to recompute it") -> Any:
    """The JSON content of ``path``; ``ValueError`` naming the file (``what``) if it is not valid UTF-8 JSON or
    (with ``expect``) not of that type, e.g. a truncated or hand-edited ``config.json``, followed by ``fix`` (``None``:
    no fix, the caller adds its own); ``FileNotFoundError`` if it is missing."""
    path = Path(path)
    tail = f"; {fix}" if fix else ""
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {str(path)!r} is not valid JSON ({e}){tail}") from e
    if expect is not None and not isinstance(obj, expect):
        raise ValueError(f"{what} {str(path)!r} holds a JSON {type(obj).__name__}, expected a JSON "
                         f"{'object' if expect is dict else expect.__name__}{tail}")
    return obj
