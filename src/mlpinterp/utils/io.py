"""Atomic file writes and strict JSON: the base under :mod:`mlpinterp.utils.artifact`.

Writes go to a temporary file in the same directory followed by ``os.replace``, so an interrupted or failed write
never leaves a partial file under the final name. Every write failure (disk full, permissions, an I/O error, also
when a serialiser such as safetensors reports it as its own exception type) is raised as :class:`WriteError`, an
``OSError`` carrying the line the CLI prints as ``Fix:``.

Strict JSON (:func:`dumps_json`, :func:`loads_json`, used by artifacts) refuses a NaN or infinity on writing,
naming where it is (``NaN`` / ``Infinity`` are not JSON), and the ``NaN`` / ``Infinity`` tokens and duplicate keys
on reading. :func:`atomic_write_json` / :func:`read_json` write and read results and reports, where an undefined
metric is a NaN.
"""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


class WriteError(OSError):
    """Writing ``filename`` failed (disk full, permissions, an I/O error); nothing was left under that name.

    An ``OSError`` (``errno`` that of the cause when it has one, ``ENOSPC`` when the cause names a full disk);
    ``fix``: the line the CLI prints as ``Fix:``.
    """

    def __init__(self, path: str | os.PathLike, cause: BaseException):
        code = getattr(cause, "errno", None)
        text = str(cause) or type(cause).__name__
        if code is None and ("No space left" in text or "ENOSPC" in text):
            code = errno.ENOSPC
        super().__init__(code, f"could not write {str(path)!r} ({type(cause).__name__}: {text}); nothing was "
                               "written under that name")
        self.filename = str(path)
        self.fix = ("free disk space (or check the permissions of the directory) and rerun; finished files are kept "
                    "and a resumable run continues where it stopped")

    def __str__(self) -> str:
        return self.strerror


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_replace(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Run ``write(tmp)`` on a temporary file beside ``path``, then give it normal permissions and rename it.

    Raises :class:`WriteError` (the temporary file removed, ``path`` untouched) when ``write`` or the rename fails
    with an ``OSError`` or any exception of a serialiser (e.g. ``safetensors.SafetensorError`` on a full disk);
    ``KeyboardInterrupt`` and the like are re-raised as they are, after the same clean-up.
    """
    atomic_replace_all([(path, write)])


def atomic_replace_all(writes: list[tuple[str | os.PathLike, Callable[[str], None]]]) -> None:
    """:func:`atomic_replace` for several files written together: every ``write(tmp)`` runs first, and only when all
    succeeded are the files renamed into place, in order. A failure (e.g. a full disk) leaves every final name as it
    was; an interruption between the renames (the process killed) can leave the first files new and the later ones
    old, which readers of such groups must detect (artifacts do: their hash covers the group).
    Raises :class:`WriteError` as :func:`atomic_replace`."""
    tmps: list[tuple[Path, str]] = []
    current = Path(writes[0][0]) if writes else Path()
    try:
        for path, write in writes:
            current = Path(path)
            current.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=current.parent, prefix=f".{current.name}.", suffix=".tmp")
            os.close(fd)
            tmps.append((current, tmp))
            write(tmp)
            os.chmod(tmp, _umask_mode())
        for path, tmp in tmps:
            current = path
            os.replace(tmp, path)
    except BaseException as e:
        for _, tmp in tmps:
            if os.path.exists(tmp):
                os.unlink(tmp)
        if isinstance(e, OSError) or type(e).__name__ == "SafetensorError":
            raise WriteError(current, e) from e
        raise


def bytes_writer(data: bytes) -> Callable[[str], None]:
    """A ``write(tmp)`` for :func:`atomic_replace` that writes ``data`` and syncs it to disk."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    return write


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename), with the usual file permissions.
    Raises :class:`WriteError` when the write fails."""
    atomic_replace(Path(path), bytes_writer(data))


def json_ready(obj: Any, where: str = "value") -> Any:
    """``obj`` as plain JSON types (numpy scalars and arrays, tuples and paths converted), checked finite.

    Raises ``ValueError`` naming the place (``where`` followed by the keys, e.g. ``meta['history'][3]['loss']``) of
    a NaN or infinity (JSON has no such value: record it as ``None`` or a string where it is meaningful), and
    ``TypeError`` for a value of another type or a non-string key.
    """
    import numpy as np

    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"{where} is {obj}, which JSON cannot hold (NaN and infinities are not JSON); record "
                             "it as null or a string, or stop the computation that produced it")
        return float(obj)
    if isinstance(obj, dict):
        bad = [k for k in obj if not isinstance(k, str)]
        if bad:
            raise TypeError(f"{where} has non-string keys {bad[:3]!r}; JSON object keys are strings")
        return {k: json_ready(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    raise TypeError(f"{where} of type {type(obj).__name__} is not JSON serialisable")


def dumps_json(obj: Any, *, where: str = "value", indent: int | None = 2) -> str:
    """Strict JSON text of ``obj`` (keys sorted; :func:`json_ready` first, so a NaN is refused naming its place).
    ``indent=None``: the canonical form (no spaces), the one artifact hashes are computed over."""
    obj = json_ready(obj, where)
    if indent is None:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return json.dumps(obj, indent=indent, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented, strict JSON (RFC 8259) to ``path`` atomically.

    NaN and infinity have no JSON spelling (``json.dumps`` would write the tokens ``NaN``/``Infinity`` that strict
    readers refuse): they are written as ``null``, the value of an undefined statistic (the standard error of one
    seed, a ratio with a zero denominator). Training never gets here with a non-finite loss or weight: it stops
    first (:class:`mlpinterp.utils.checkpoint.TrainingDiverged`). Artifacts use :func:`dumps_json`. Raises
    :class:`WriteError` when the write fails.
    """
    text = json.dumps(_finite_or_null(obj), indent=2, sort_keys=True, default=_json_default, allow_nan=False)
    atomic_write_bytes(path, (text + "\n").encode())


def _finite_or_null(obj: Any) -> Any:
    """``obj`` with every non-finite float (Python or numpy, also inside arrays) replaced by ``None``."""
    import numpy as np

    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_null(v) for v in obj]
    if isinstance(obj, np.ndarray) and obj.dtype.kind in "fc":
        return _finite_or_null(obj.tolist())
    return obj


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"object of type {type(o).__name__} is not JSON serialisable")


def _no_constant(token: str):
    raise ValueError(f"the token {token} is not JSON (NaN and infinities are not JSON values)")


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"duplicate keys {dup!r}")
    return dict(pairs)


def loads_json(text: str | bytes) -> Any:
    """Parse strict JSON (``ValueError`` for invalid JSON, the ``NaN`` / ``Infinity`` tokens or duplicate keys;
    bytes must be UTF-8)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)


def read_json(path: str | os.PathLike, *, what: str = "file", expect: type | None = dict,
              fix: str | None = "delete it to recompute it") -> Any:
    """The JSON content of ``path`` (a file of :func:`atomic_write_json`); ``ValueError`` naming the file (``what``)
    if it is not valid UTF-8 JSON or (with ``expect``) not of that type, e.g. a truncated or hand-edited
    ``config.json``, followed by ``fix`` (``None``: no fix, the caller adds its own); ``FileNotFoundError`` if it is
    missing."""
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
