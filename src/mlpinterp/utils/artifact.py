"""Artifacts: the one way mlpinterp writes and reads back tensors + metadata (hashed, versioned, with provenance).

An artifact is two files, written atomically together (:func:`mlpinterp.utils.io.atomic_replace_all`: both are
written to temporary files, then renamed into place, the tensors first):

* ``NAME.safetensors``: the tensors; its ``__metadata__`` header (ignored by other safetensors readers, e.g.
  SAELens and sparsify) holds the envelope: ``mlpinterp_format`` (:data:`FORMAT`), ``kind`` (what the artifact is:
  ``"ridge_polynomial"``, ``"classifier_checkpoint"``, ``"sae"``, ...), ``provenance`` (canonical JSON of what it
  was computed from: a network's digest, a training step, a distribution's digest; supplied by the writer) and
  ``sha256`` (:func:`artifact_sha256`);
* the metadata document, strict JSON (no ``NaN`` / ``Infinity``), by default ``NAME.json`` (an SAE's ``cfg.json``).

``sha256`` covers the envelope, the canonical metadata and every tensor (name, dtype, shape, bytes), so a changed
bit anywhere in either file is refused by :func:`load_artifact` with :class:`ArtifactError`, except a change that
leaves both the tensors and the canonical metadata as they were (JSON whitespace, ``1e-05`` vs ``1E-05``).

JSON-only artifacts (:func:`save_json_artifact`) hold the same envelope and ``data`` in one JSON file, with
``sha256`` over the canonical rest of the file.

Versioning: :data:`FORMAT` grows when the layout or the hash definition changes; a file of a newer format is refused
by name ("written by a newer mlpinterp (format 2 > 1); upgrade"), a file without the envelope (written by an earlier
mlpinterp, or hand-made) is refused as unverifiable. Write failures raise :class:`~mlpinterp.utils.io.WriteError`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlpinterp.utils.io import (
    WriteError,
    atomic_replace_all,
    atomic_write_bytes,
    bytes_writer,
    dumps_json,
    json_ready,
    loads_json,
)

__all__ = ["FORMAT", "Artifact", "ArtifactError", "WriteError", "artifact_digest", "artifact_kind", "artifact_sha256",
           "has_envelope", "load_artifact", "load_json_artifact", "read_safetensors", "save_artifact",
           "save_artifacts", "save_json_artifact", "tensors_path"]

FORMAT = 1
"""``mlpinterp_format`` of the artifacts written by this version."""

ENVELOPE = ("mlpinterp_format", "kind", "provenance", "sha256")
"""The ``__metadata__`` keys of an artifact's safetensors header (and the envelope keys of a JSON artifact)."""

DEFAULT_FIX = "delete it and rerun the command that wrote it (it is recomputed)"


class ArtifactError(ValueError):
    """An artifact cannot be used: corrupt, truncated, incomplete, of a newer format, of another kind, or computed
    from something other than what the caller expects.

    A ``ValueError``; ``path`` is the file, ``problem`` what is wrong, ``fix`` the line the CLI prints as ``Fix:``;
    the message is ``"{what} {path} {problem}; {fix}"``.
    """

    def __init__(self, path: str | os.PathLike, problem: str, fix: str = DEFAULT_FIX, what: str = "artifact"):
        self.path, self.problem, self.fix = Path(path), problem, fix
        super().__init__(f"{what} {str(path)!r} {problem}; {fix}")


@dataclass(frozen=True)
class Artifact:
    """An artifact: ``tensors``, ``meta`` (the metadata document), ``provenance``, ``kind``, the safetensors ``path``
    and the metadata document's ``meta_path`` (``None``: the ``.json`` beside ``path``). Loaded, the tensors are on
    the CPU as saved and ``sha256`` is the digest they were verified against; to be written
    (:func:`save_artifacts`), ``sha256`` is not read (it is computed)."""

    tensors: dict[str, torch.Tensor]
    meta: Any
    provenance: dict
    kind: str
    path: Path
    sha256: str = ""
    format: int = FORMAT
    meta_path: Path | None = None


def tensors_path(path: str | os.PathLike) -> Path:
    """The ``.safetensors`` path of artifact ``path``: the suffix is appended unless present (``fit.deg2`` ->
    ``fit.deg2.safetensors``; an existing suffix is never replaced, so dotted names cannot collide)."""
    path = Path(path)
    return path if path.suffix == ".safetensors" else path.with_name(path.name + ".safetensors")


def _meta_path(path: Path, meta_path: str | os.PathLike | None) -> Path:
    return path.with_suffix(".json") if meta_path is None else Path(meta_path)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def artifact_sha256(tensors: Mapping[str, torch.Tensor], *, kind: str, meta: Any, provenance: Mapping,
                    format: int = FORMAT) -> str:
    """SHA-256 hex digest of an artifact: the canonical JSON (:func:`~mlpinterp.utils.io.dumps_json`, keys sorted,
    no spaces) of ``{"mlpinterp_format", "kind", "provenance", "meta"}``, a newline, then per tensor in name order
    the canonical JSON of ``[name, dtype, shape]``, a newline and its raw bytes (native little-endian, C order).

    Independent of the safetensors header layout and of JSON formatting; any changed tensor bit, name, dtype or
    shape and any changed metadata value changes it. Raises ``ValueError`` naming the place of a NaN or infinity in
    ``meta`` or ``provenance`` (e.g. ``meta['history'][3]['loss']``)."""
    h = hashlib.sha256()
    head = {"mlpinterp_format": format, "kind": kind, "provenance": json_ready(provenance, "provenance"),
            "meta": json_ready(meta, "meta")}
    h.update(dumps_json(head, indent=None).encode() + b"\n")
    for name in sorted(tensors):
        t = tensors[name]
        h.update(dumps_json([name, _dtype_name(t.dtype), list(t.shape)], indent=None).encode() + b"\n")
        h.update(_tensor_bytes(t))
    return h.hexdigest()


def _check_kind(kind: str) -> None:
    if not isinstance(kind, str) or not kind or not kind.replace("_", "").isalnum():
        raise ValueError(f"kind must be a non-empty name of letters, digits and '_', got {kind!r}")


def _ready(meta: Any, provenance: Mapping | None) -> tuple[Any, dict]:
    if provenance is not None and not isinstance(provenance, Mapping):
        raise TypeError(f"provenance must be a dict or None, got {type(provenance).__name__}")
    return json_ready(meta, "meta"), json_ready(dict(provenance or {}), "provenance")


def save_artifact(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], *, kind: str, meta: Any = None,
                  provenance: Mapping | None = None, meta_path: str | os.PathLike | None = None) -> Path:
    """Write artifact ``path`` (``.safetensors`` appended unless present) atomically: the tensors with the envelope
    in their header, then the metadata document ``meta`` (default ``{}``) as strict, indented JSON at ``meta_path``
    (default: the ``.json`` beside it). Returns the ``.safetensors`` path.

    ``provenance``: what the artifact was computed from (JSON values), checked by :func:`load_artifact` against
    what its caller expects.

    Raises
    ------
    ValueError
        ``kind`` is not a name, or ``meta`` / ``provenance`` hold a NaN or infinity (named; nothing is written).
    TypeError
        A value that is not a tensor or not JSON serialisable.
    WriteError
        The disk is full or the directory is not writable (an ``OSError``): neither final name was touched (an
        artifact already there stays as it was).
    """
    art = Artifact(dict(tensors), meta, provenance, kind, Path(path),
                   meta_path=None if meta_path is None else Path(meta_path))
    return save_artifacts([art])[0]


def save_artifacts(artifacts: Iterable[Artifact], documents: Mapping[str | os.PathLike, Any] | None = None
                   ) -> list[Path]:
    """Write several artifacts, and plain strict-JSON ``documents`` (``{path: value}``, indented, not hashed),
    together: every file is written to a temporary file first and renamed into place only when all were written
    (:func:`~mlpinterp.utils.io.atomic_replace_all`), so a failure leaves every final name as it was. Each artifact
    as :func:`save_artifact` writes it. Returns the artifacts' ``.safetensors`` paths, in order.

    Raises as :func:`save_artifact` (``TypeError`` also for an item that is not an :class:`Artifact`), before
    anything is written."""
    from safetensors.torch import save_file

    items = [_checked(a) for a in artifacts]
    # from here on the canonical JSON and the files (utils.io); the digest refuses a NaN or infinity, naming its place
    writes, paths = [], []
    for path, meta_path, flat, kind, meta, provenance in items:
        digest = artifact_sha256(flat, kind=kind, meta=meta, provenance=provenance)
        header = {"mlpinterp_format": str(FORMAT), "kind": kind, "sha256": digest,
                  "provenance": dumps_json(provenance, indent=None)}
        writes += [(path, functools.partial(save_file, flat, metadata=header)),  # (tmp) -> the tensors in tmp
                   (meta_path, bytes_writer(dumps_json(meta).encode()))]
        paths.append(path)
    writes += [(Path(p), bytes_writer(dumps_json(v, where=str(p)).encode())) for p, v in (documents or {}).items()]
    atomic_replace_all(writes)
    return paths


def _checked(art: Artifact) -> tuple:
    """``(path, meta_path, tensors on the CPU, kind, meta, provenance)`` of ``art`` to be written, after the checks
    that need no JSON (the JSON values are checked when the digest is computed)."""
    if not isinstance(art, Artifact):
        raise TypeError(f"artifacts must be Artifact instances, got {type(art).__name__}")
    _check_kind(art.kind)
    if art.provenance is not None and not isinstance(art.provenance, Mapping):
        raise TypeError(f"provenance must be a dict or None, got {type(art.provenance).__name__}")
    bad = [k for k, v in art.tensors.items() if not isinstance(k, str) or not torch.is_tensor(v)]
    if bad:
        raise TypeError(f"tensors must map names (str) to torch tensors; bad entries {bad[:3]!r}")
    path = tensors_path(art.path)
    flat = {k: v.detach().cpu().contiguous() for k, v in art.tensors.items()}
    return (path, _meta_path(path, art.meta_path), flat, art.kind, {} if art.meta is None else art.meta,
            dict(art.provenance or {}))


def read_safetensors(path: str | os.PathLike, *, what: str = "file") -> tuple[dict[str, torch.Tensor], dict]:
    """``(tensors, header metadata)`` of a safetensors file written by another program (no verification: for
    inputs such as a user's weights or an SAE written by SAELens / sparsify).

    Raises ``FileNotFoundError`` if it is missing and ``ValueError`` naming the file when it is not a valid
    safetensors file (corrupt or truncated)."""
    from safetensors.torch import load

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    data = path.read_bytes()
    try:
        header = _header(data)
        tensors = load(data)
    except Exception as e:  # noqa: BLE001 - safetensors raises several types on corrupt files
        raise ValueError(f"{what} {str(path)!r} is not a valid safetensors file ({type(e).__name__}: {e})") from e
    return tensors, header.get("__metadata__") or {}


def _header(data: bytes) -> dict:
    """The parsed JSON header of safetensors bytes (``ValueError`` when malformed)."""
    if len(data) < 8:
        raise ValueError(f"{len(data)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"the header says {n} bytes but only {len(data) - 8} follow")
    header = loads_json(data[8:8 + n])
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    md = header.get("__metadata__")
    if md is not None and (not isinstance(md, dict) or not all(isinstance(v, str) for v in md.values())):
        raise ValueError("the __metadata__ header is not a map of strings")
    return header


def _header_metadata(path: str | os.PathLike) -> dict:
    """The ``__metadata__`` of a safetensors file's header, read alone (``{}`` when missing or unreadable)."""
    try:
        with open(tensors_path(path) if not Path(path).exists() else path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            (n,) = struct.unpack("<Q", head) if len(head) == 8 else (size,)
            if n > size - 8:  # a corrupt or truncated header: no envelope can be read from it
                return {}
            return _header(head + f.read(n)).get("__metadata__") or {}
    except (OSError, ValueError, struct.error):
        return {}


def artifact_kind(path: str | os.PathLike) -> str | None:
    """The ``kind`` an artifact's safetensors header declares (unverified: for dispatching on a file a user
    passes), or ``None`` when the file is missing, unreadable or carries no envelope."""
    md = _header_metadata(path)
    return md.get("kind") if "sha256" in md else None


def artifact_digest(path: str | os.PathLike) -> str | None:
    """The ``sha256`` an artifact's header records (unverified: read after :func:`load_artifact` verified the file,
    e.g. to record a checkpoint as the provenance of what is computed from it), or ``None`` without one."""
    digest = _header_metadata(path).get("sha256")
    return digest if isinstance(digest, str) else None


def has_envelope(path: str | os.PathLike) -> bool:
    """Whether a safetensors file's header carries any key of the artifact envelope (then it must be verified
    whole: a file whose envelope was damaged is not mistaken for a file of another program)."""
    return bool(set(ENVELOPE) & set(_header_metadata(path)))


def _format(value: Any, path: Path, fix: str, what: str) -> int:
    try:
        fmt = int(value)
    except (TypeError, ValueError):
        fmt = None
    if fmt is None or str(fmt) != str(value) or fmt < 1:
        raise ArtifactError(path, f"has an unknown mlpinterp_format {value!r} (this mlpinterp writes and reads "
                                  f"format {FORMAT}); the file is corrupt", fix, what)
    if fmt > FORMAT:
        raise ArtifactError(path, f"was written by a newer mlpinterp (format {fmt} > {FORMAT})",
                            "upgrade mlpinterp to read it (pip install -U mlpinterp)", what)
    return fmt


def _expect_kind(found: str, kind: str | Iterable[str], path: Path, fix: str, what: str) -> None:
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if found not in kinds:
        want = " or ".join(repr(k) for k in kinds)
        raise ArtifactError(path, f"is a {found!r} artifact, not a {want} one (another kind of file was passed)",
                            f"pass a {want} file", what)


def _expect_provenance(recorded: Mapping, expected: Mapping | None, path: Path, fix: str, what: str) -> None:
    """Raise :class:`ArtifactError` naming every key of ``expected`` whose recorded value differs or is missing
    (values compare after conversion to JSON: tuples equal lists)."""
    if not expected:
        return
    diffs = []
    for key, want in json_ready(dict(expected), "expected provenance").items():
        if key not in recorded:
            diffs.append(f"{key}: not recorded, expected {want!r}")
        elif recorded[key] != want:
            diffs.append(f"{key}: {recorded[key]!r}, expected {want!r}")
    if diffs:
        raise ArtifactError(path, f"was computed from something else ({'; '.join(diffs)})", fix, what)


def load_artifact(path: str | os.PathLike, *, kind: str | Iterable[str], provenance: Mapping | None = None,
                  meta_path: str | os.PathLike | None = None, fix: str = DEFAULT_FIX, what: str | None = None,
                  verify: bool = True) -> Artifact:
    """Read and verify the artifact written by :func:`save_artifact` at ``path`` (``NAME`` or ``NAME.safetensors``).

    Checks, in order: both files present and parseable (strict JSON), the envelope complete, the format not newer
    than :data:`FORMAT`, the SHA-256 over tensors and metadata (skipped with ``verify=False``, only for a
    deliberately edited file), the ``kind`` (one name or several accepted) and, for each key of ``provenance``, the
    recorded value. ``fix`` and ``what`` (default: the kind) go into the messages.

    Raises
    ------
    FileNotFoundError
        If the tensor file does not exist.
    ArtifactError
        (a ``ValueError``) naming the file, what is wrong and ``fix``: corrupt, truncated, incomplete (the metadata
        file missing), without the envelope (an earlier mlpinterp), of a newer format (named), of another kind, or
        with another provenance.
    """
    from safetensors.torch import load

    path = Path(path)
    if not path.exists() and tensors_path(path).exists():
        path = tensors_path(path)
    name = what or (kind if isinstance(kind, str) else "artifact").replace("_", " ")
    if not path.is_file():
        raise FileNotFoundError(f"{name} {str(path)!r} does not exist")
    mpath = _meta_path(path, meta_path)
    data = path.read_bytes()
    try:
        md = _header(data).get("__metadata__") or {}
    except (ValueError, UnicodeDecodeError, struct.error) as e:
        raise ArtifactError(path, f"is not a valid safetensors file (corrupt or truncated: {e})", fix, name) from e
    missing = [k for k in ENVELOPE if k not in md]
    if missing:
        raise ArtifactError(path, f"carries no complete mlpinterp envelope (header lacks {missing}): it was written "
                                  "by an earlier mlpinterp or another program, or is corrupt, so it cannot be "
                                  "verified", fix, name)
    fmt = _format(md["mlpinterp_format"], path, fix, name)
    try:
        tensors = load(data)
    except Exception as e:  # noqa: BLE001 - safetensors raises several types on corrupt files
        raise ArtifactError(path, f"is not a valid safetensors file (corrupt or truncated: {e})", fix, name) from e
    if not mpath.is_file():
        raise ArtifactError(path, f"has no metadata file {mpath.name!r} beside it (an incomplete write)", fix, name)
    try:
        meta = loads_json(mpath.read_bytes())
        prov = loads_json(md["provenance"])
    except (ValueError, UnicodeDecodeError) as e:
        raise ArtifactError(mpath, f"is not valid JSON ({e})", fix, name) from e
    if not isinstance(prov, dict):
        raise ArtifactError(path, "records a provenance that is not a JSON object (corrupt)", fix, name)
    if verify:
        got = artifact_sha256(tensors, kind=md["kind"], meta=meta, provenance=prov, format=fmt)
        if got != md["sha256"]:
            raise ArtifactError(path, f"does not match its recorded SHA-256 (recorded {md['sha256'][:12]}..., the "
                                      f"tensors and {mpath.name} hash to {got[:12]}...): a file is corrupt, truncated "
                                      "or was changed after saving", fix, name)
    _expect_kind(md["kind"], kind, path, fix, name)
    _expect_provenance(prov, provenance, path, fix, name)
    return Artifact(tensors=tensors, meta=meta, provenance=prov, kind=md["kind"], path=path, sha256=md["sha256"],
                    format=fmt)


# ----------------------------------------------------------------------------- JSON-only artifacts
def _json_digest(doc: Mapping) -> str:
    return hashlib.sha256(dumps_json({k: v for k, v in doc.items() if k != "sha256"}, indent=None).encode()).hexdigest()


def save_json_artifact(path: str | os.PathLike, data: Any, *, kind: str, provenance: Mapping | None = None) -> Path:
    """Write ``{"mlpinterp_format", "kind", "provenance", "data", "sha256"}`` to ``path`` as strict JSON, atomically
    (``sha256`` over the canonical JSON of the other four). Raises as :func:`save_artifact`."""
    _check_kind(kind)
    data, provenance = _ready(data, provenance)
    doc = {"mlpinterp_format": FORMAT, "kind": kind, "provenance": provenance, "data": data}
    doc["sha256"] = _json_digest(doc)
    atomic_write_bytes(path, dumps_json(doc).encode())
    return Path(path)


def load_json_artifact(path: str | os.PathLike, *, kind: str | Iterable[str], provenance: Mapping | None = None,
                       fix: str = DEFAULT_FIX, what: str | None = None) -> Artifact:
    """Read and verify a :func:`save_json_artifact` file; the returned :class:`Artifact` has ``meta`` = ``data`` and
    no tensors. Raises ``FileNotFoundError`` and :class:`ArtifactError` as :func:`load_artifact`."""
    path = Path(path)
    name = what or (kind if isinstance(kind, str) else "artifact").replace("_", " ")
    if not path.is_file():
        raise FileNotFoundError(f"{name} {str(path)!r} does not exist")
    try:
        doc = loads_json(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise ArtifactError(path, f"is not valid JSON ({e})", fix, name) from e
    keys = (*ENVELOPE, "data")
    if not isinstance(doc, dict) or sorted(doc) != sorted(keys):
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise ArtifactError(path, f"is not an mlpinterp JSON artifact (expected the keys {sorted(keys)}, got {got}): "
                                  "written by an earlier mlpinterp or another program, or corrupt", fix, name)
    fmt = _format(doc["mlpinterp_format"], path, fix, name)
    if _json_digest(doc) != doc["sha256"]:
        raise ArtifactError(path, "does not match its recorded SHA-256: the file is corrupt or was changed after "
                                  "saving", fix, name)
    if not isinstance(doc["kind"], str) or not isinstance(doc["provenance"], dict):
        raise ArtifactError(path, "has a malformed envelope", fix, name)
    _expect_kind(doc["kind"], kind, path, fix, name)
    _expect_provenance(doc["provenance"], provenance, path, fix, name)
    return Artifact(tensors={}, meta=doc["data"], provenance=doc["provenance"], kind=doc["kind"], path=path,
                    sha256=doc["sha256"], format=fmt)
