"""Helpers for tests that need an artifact whose content is wrong but whose hash is right (what a faulty writer
or an earlier version could produce): the loaders' content checks behind the hash check are reached that way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mlpinterp.utils.artifact import artifact_kind, load_artifact, save_artifact, tensors_path


def rewrite(path, meta: Callable | object = None, *, tensors: Callable | None = None, meta_path=None,
            kind: str | None = None, provenance: dict | None = None) -> Path:
    """Re-save the artifact at ``path`` with ``meta(old_meta)`` (or the value ``meta``; ``None``: unchanged),
    ``tensors(old_tensors)`` and ``kind`` / ``provenance`` when given, signed afresh. Returns the tensor path."""
    path = tensors_path(path) if not Path(path).exists() else Path(path)
    found = artifact_kind(path)
    art = load_artifact(path, kind=found, meta_path=meta_path, verify=False)
    new_meta = art.meta if meta is None else (meta(art.meta) if callable(meta) else meta)
    new_tensors = art.tensors if tensors is None else tensors(art.tensors)
    return save_artifact(path, new_tensors, kind=kind or found, meta=new_meta,
                         provenance=art.provenance if provenance is None else provenance, meta_path=meta_path)
