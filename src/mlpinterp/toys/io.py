"""Save and load toy targets: the artifact ``toy_target`` (``NAME.safetensors`` + ``NAME.json``, atomic and hashed,
via :mod:`mlpinterp.utils.artifact`)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from mlpinterp.utils.artifact import load_artifact, save_artifact

KIND = "toy_target"
"""Artifact kind of saved toy targets."""


def _kind(model: nn.Module) -> str:
    from mlpinterp.toys.gated_trig import GatedTrigMLP
    from mlpinterp.toys.resid_mlp import ResidualMLP
    from mlpinterp.toys.tms import TMS

    for cls, name in ((TMS, "tms"), (ResidualMLP, "resid_mlp"), (GatedTrigMLP, "gated_trig")):
        if isinstance(model, cls):
            return name
    raise TypeError(f"model must be a TMS, ResidualMLP or GatedTrigMLP, got {type(model).__name__}")


def _arch(model: nn.Module) -> dict:
    kind = _kind(model)
    if kind == "tms":
        return {"n_features": model.n_features, "d_hidden": model.d_hidden,
                **({"identity": True} if model.identity is not None else {})}
    if kind == "resid_mlp":  # "bias" only when False: biased targets keep the metadata of earlier versions
        return {"n_features": model.n_features, "d_embed": model.d_embed, "d_mlp": model.d_mlp,
                "n_layers": model.n_layers, **({} if model.bias else {"bias": False})}
    return {"d_resid": model.d_resid, "d_mlp": model.d_mlp, "n_layers": model.n_layers,
            "n_functions": model.n_functions}


def save_toy(model: nn.Module, path: str | os.PathLike, info: dict | None = None,
             provenance: dict | None = None) -> Path:
    """Save a toy target's state dict and ``{"kind", "arch", "info"}`` metadata atomically (artifact ``toy_target``;
    ``provenance``: what it was made from, checked by :func:`load_toy`). Returns the ``.safetensors`` path."""
    if info is not None and not isinstance(info, dict):
        raise TypeError(f"info must be a dict or None, got {type(info).__name__}")
    meta = {"kind": _kind(model), "arch": _arch(model), "info": info or {}}
    return save_artifact(path, dict(model.state_dict()), kind=KIND, meta=meta, provenance=provenance)


def load_toy(path: str | os.PathLike, provenance: dict | None = None) -> tuple[nn.Module, dict]:
    """Load a toy saved by :func:`save_toy` (``provenance``: values its recorded provenance must hold). Returns
    ``(model, meta)``.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ArtifactError
        (a ``ValueError``) If a file is corrupt, truncated or edited, its ``.json`` metadata is missing, or it is
        another kind of artifact, of a newer mlpinterp or of another provenance.
    ValueError
        If the metadata lacks ``kind``/``arch`` or the tensors do not fit the architecture.
    """
    from mlpinterp.toys.gated_trig import GatedTrigMLP
    from mlpinterp.toys.resid_mlp import ResidualMLP
    from mlpinterp.toys.tms import TMS

    art = load_artifact(path, kind=KIND, provenance=provenance, what="toy target",
                        fix="delete its two files and make the target again")
    tensors, meta = art.tensors, art.meta
    identity, bias = False, True
    if not isinstance(meta, dict):
        raise ValueError(f"metadata of {str(path)!r} must be a JSON object, got {type(meta).__name__}")
    if "kind" not in meta or "arch" not in meta:
        raise ValueError(f"metadata of {str(path)!r} must contain 'kind' and 'arch', got keys {sorted(meta)}")
    kind, arch = meta["kind"], meta["arch"]
    keys = {"tms": {"n_features", "d_hidden"}, "resid_mlp": {"n_features", "d_embed", "d_mlp", "n_layers"},
            "gated_trig": {"d_resid", "d_mlp", "n_layers", "n_functions"}}
    if kind in keys:
        if kind == "tms" and isinstance(arch, dict) and arch.get("identity") is True:
            arch = {k: v for k, v in arch.items() if k != "identity"}
            identity = True
        if kind == "resid_mlp" and isinstance(arch, dict) and "bias" in arch:  # recorded only for bias-free MLPs
            if arch["bias"] is not False:
                raise ValueError(f"metadata 'arch' of {str(path)!r}: 'bias' is recorded only as false (MLPs without "
                                 f"biases), got {arch['bias']!r}")
            arch = {k: v for k, v in arch.items() if k != "bias"}
            bias = False
        if not isinstance(arch, dict) or set(arch) != keys[kind]:
            got = sorted(arch) if isinstance(arch, dict) else type(arch).__name__
            raise ValueError(f"metadata 'arch' of {str(path)!r} must be an object with keys {sorted(keys[kind])} for "
                             f"kind {kind!r}, got {got}")
        bad = {k: v for k, v in arch.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:
            raise ValueError(f"metadata 'arch' of {str(path)!r} must hold positive ints, got {bad}")
    bad_t = [k for k, v in tensors.items() if not v.is_floating_point() or not bool(torch.isfinite(v).all())]
    if bad_t:
        raise ValueError(f"tensors {bad_t} in {str(path)!r} must be finite floating-point tensors")
    if kind == "tms":
        model: nn.Module = TMS(**arch, identity=identity)
    elif kind == "resid_mlp":
        if "W_E" not in tensors:
            raise ValueError(f"checkpoint {str(path)!r} lacks the embedding 'W_E'")
        model = ResidualMLP(W_E=tensors["W_E"], bias=bias, **arch)
    elif kind == "gated_trig":
        model = GatedTrigMLP(**arch)
    else:
        raise ValueError(f"unknown toy kind {kind!r} in {str(path)!r}; expected 'tms', 'resid_mlp' or 'gated_trig'")
    try:
        model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()})
    except RuntimeError as e:
        # the architecture as recorded: with its 'bias' / 'identity' flags, which the tensors may contradict
        raise ValueError(f"tensors in {str(path)!r} do not match the {kind} architecture {meta['arch']} ({e})") from e
    return model, meta
