"""The toy targets of the parameter-space studies: settings, data distributions, and the recipes each target is
trained (or hand-coded) with, checked against what is saved before a run reuses a target.

Settings: ``tms-5-2``, ``tms-40-10`` (toy models of superposition), ``resid-mlp-1/2/3`` (residual MLPs computing
``n_features`` ReLUs) and ``gated-trig`` (the hand-coded gated piecewise-trigonometric network). A target recipe
(``fidelity``) is ``"ours"`` or ``"reference"`` (the APD/SPD reference implementation's target recipe). APD and SPD
decompose the same saved targets.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn

from mlpinterp.toys.data import sparse_features
from mlpinterp.toys.gated_trig import build_gated_trig, gated_trig_inputs
from mlpinterp.toys.io import load_toy, save_toy
from mlpinterp.toys.resid_mlp import ADDED_FIELDS as RESID_ADDED_FIELDS
from mlpinterp.toys.resid_mlp import RESID_PRESETS, ResidMLPConfig, train_resid_mlp
from mlpinterp.toys.tms import ADDED_FIELDS as TMS_ADDED_FIELDS
from mlpinterp.toys.tms import TMS_PRESETS, TMSConfig, train_tms
from mlpinterp.utils.artifact import tensors_path
from mlpinterp.utils.config_diff import config_differences
from mlpinterp.utils.io import read_json
from mlpinterp.utils.validation import check_bool, check_int

#: Target recipes: ``"ours"`` or ``"reference"`` (the APD/SPD reference implementation's: for TMS a linearly decayed
#: lr, for the residual MLPs :data:`REFERENCE_TARGET`).
FIDELITIES = ("ours", "reference")

#: The fidelity a setting runs at when none is given (the better one at the paper preset; the measurements behind
#: the choice are in docs/measurements.md); every other setting runs at ``"ours"``.
DEFAULT_FIDELITY = {"tms-40-10": "reference"}


def default_fidelity(name: str) -> str:
    """The fidelity setting ``name`` runs at when none is given (:data:`DEFAULT_FIDELITY`, else ``"ours"``)."""
    return DEFAULT_FIDELITY.get(name, "ours")


def resolve_fidelity(name: str, fidelity: str | None) -> str:
    """``fidelity``, or the setting's default (:func:`default_fidelity`) for ``None``; ``ValueError`` for another
    value."""
    if fidelity is None:
        return default_fidelity(name)
    if fidelity not in FIDELITIES:
        raise ValueError(f"fidelity must be one of {FIDELITIES}, got {fidelity!r}")
    return fidelity


QUICK_TARGET = {"tms-5-2": {}, "tms-40-10": {}, "resid-mlp-1": dict(steps=2000, batch_size=1024),
                "resid-mlp-2": dict(steps=2000, batch_size=1024), "resid-mlp-3": dict(steps=2000, batch_size=1024)}

#: Residual-MLP targets at ``fidelity="reference"``: the APD/SPD reference's (``train_resid_mlp.py`` at a1cf5a03 and
#: 6a8d0324): MLPs without biases (``in_bias=False, out_bias=False``), batch 2048, lr 3e-3 with its
#: ``cos(pi/2 t/(T-1))`` schedule, AdamW weight decay 0.01; 1k steps for 1 and 2 layers, 10k for 3. With ``quick``
#: only resid-MLP-3 is shortened (to QUICK_TARGET's budget); the others are already below it.
_REFERENCE_RESID = dict(bias=False, lr_schedule="quarter_cosine", batch_size=2048, lr=3e-3, weight_decay=0.01)
REFERENCE_TARGET = {"resid-mlp-1": dict(_REFERENCE_RESID, steps=1000),
                    "resid-mlp-2": dict(_REFERENCE_RESID, steps=1000),
                    "resid-mlp-3": dict(_REFERENCE_RESID, steps=10_000)}


@dataclass(frozen=True)
class SettingSpec:
    """Data distribution of a setting: sampler ``(batch, generator) -> x`` and feature metadata."""

    name: str
    n_features: int
    value_range: tuple[float, float]
    sample: Callable[[int, torch.Generator], torch.Tensor]


def setting_spec(name: str) -> SettingSpec:
    """The data distribution of ``name`` (raises ``ValueError`` for an unknown setting or one that is not a str)."""
    if not isinstance(name, str) or name not in TARGET_SETTINGS:  # a list or dict: not a bare "unhashable type"
        raise ValueError(f"setting must be one of {TARGET_SETTINGS}, got {name!r}")
    if name in TMS_PRESETS:
        n = TMS_PRESETS[name].n_features
        return SettingSpec(name, n, (0.0, 1.0), lambda b, g: sparse_features(b, n, 0.05, (0.0, 1.0), generator=g))
    if name in RESID_PRESETS:  # resid-mlp-1/2 (APD and SPD) and resid-mlp-3 (SPD)
        n = RESID_PRESETS[name].n_features
        return SettingSpec(name, n, (-1.0, 1.0), lambda b, g: sparse_features(b, n, 0.01, (-1.0, 1.0), generator=g))
    return SettingSpec(name, 4, (0.0, 1.0), lambda b, g: gated_trig_inputs(b, 4, 0.05, generator=g))



#: The settings :func:`get_target` makes targets for (``resid-mlp-3`` is SPD's; the "-id" settings use the base TMS).
TARGET_SETTINGS = (*TMS_PRESETS, *RESID_PRESETS, "gated-trig")

#: The hand-coded gated-trig network's arguments (:func:`mlpinterp.toys.build_gated_trig`), the seed aside.
_GATED_TARGET = {"n_functions": 4, "neurons_per_function": 10, "n_layers": 2}


def _target_kind(name: str) -> str:
    if not isinstance(name, str) or name not in TARGET_SETTINGS:  # a list or dict: not a bare "unhashable type"
        raise ValueError(f"setting must be one of {TARGET_SETTINGS}, got {name!r}")
    if name in TMS_PRESETS:
        return "tms"
    return "resid_mlp" if name in RESID_PRESETS else "gated_trig"


def target_config(name: str, seed: int, quick: bool, fidelity: str | None = None) -> dict:
    """The training configuration :func:`get_target` trains (or hand-codes) the target of setting ``name`` with: the
    ``asdict`` of the :class:`~mlpinterp.toys.TMSConfig` / :class:`~mlpinterp.toys.ResidMLPConfig` (TMS: the lr
    schedule of ``fidelity``; residual MLPs: the ``quick`` recipe of :data:`QUICK_TARGET` when ``quick``), or the
    arguments of :func:`~mlpinterp.toys.build_gated_trig`, with ``seed``. A saved target stores it as
    ``info["config"]``.

    Raises ``ValueError`` for a setting without a target (:data:`TARGET_SETTINGS`), a ``seed`` below 0, an unknown
    ``fidelity`` or ``fidelity="reference"`` on a setting that is not TMS; ``TypeError`` for a non-int ``seed`` or a
    ``quick`` that is not a bool."""
    kind = _target_kind(name)
    check_int(seed, "seed", minimum=0)
    check_bool(quick, "quick")
    fidelity = resolve_fidelity(name, fidelity)
    if fidelity == "reference" and kind == "gated_trig":
        raise ValueError("fidelity='reference' is defined for the TMS and residual-MLP targets only, got setting "
                         f"{name!r}")
    if kind == "tms":
        schedule = "linear" if fidelity == "reference" else "constant"
        return asdict(replace(TMS_PRESETS[name], seed=int(seed), lr_schedule=schedule))
    if kind == "resid_mlp" and fidelity == "reference":
        kw = dict(REFERENCE_TARGET[name])
        if quick and kw["steps"] * kw["batch_size"] > QUICK_TARGET[name]["steps"] * QUICK_TARGET[name]["batch_size"]:
            kw.update(QUICK_TARGET[name])
        return asdict(replace(RESID_PRESETS[name], seed=int(seed), **kw))
    if kind == "resid_mlp":
        return asdict(replace(RESID_PRESETS[name], seed=int(seed), **(QUICK_TARGET[name] if quick else {})))
    return {**_GATED_TARGET, "seed": int(seed)}


def _target_arch(kind: str, cfg: dict) -> dict:
    """The ``arch`` :func:`mlpinterp.toys.save_toy` records for a target trained with ``cfg``."""
    if kind == "tms":
        return {"n_features": cfg["n_features"], "d_hidden": cfg["d_hidden"]}
    if kind == "resid_mlp":  # "bias" recorded only for bias-free MLPs (mlpinterp.toys.io)
        return {**{k: cfg[k] for k in ("n_features", "d_embed", "d_mlp", "n_layers")},
                **({} if cfg.get("bias", True) else {"bias": False})}
    return {"d_resid": cfg["n_functions"] + 2, "n_layers": cfg["n_layers"], "n_functions": cfg["n_functions"],
            "d_mlp": cfg["n_functions"] * cfg["neurons_per_function"] // cfg["n_layers"]}


#: Per target kind, the training-configuration fields added after targets were first saved with their configuration,
#: with the behaviour before each (``config_diff``'s ``implicit``); gated-trig has gained none.
_TARGET_ADDED_FIELDS = {"tms": TMS_ADDED_FIELDS, "resid_mlp": RESID_ADDED_FIELDS}


def _saved_config(kind: str, meta: dict) -> dict | None:
    """The training configuration a saved target's metadata records (``None`` if none). Gated-trig targets written
    before their ``config`` was recorded get it from their seed and ``neurons_per_function`` (recorded) and their
    architecture; fields added to a recorded configuration later are :data:`_TARGET_ADDED_FIELDS`."""
    info = meta.get("info")
    info = info if isinstance(info, dict) else {}
    cfg = info.get("config")
    if isinstance(cfg, dict):
        return dict(cfg)
    arch = meta.get("arch")
    if kind == "gated_trig" and isinstance(arch, dict) and "seed" in info and "neurons_per_function" in info:
        return {"n_functions": arch.get("n_functions"), "neurons_per_function": info["neurons_per_function"],
                "n_layers": arch.get("n_layers"), "seed": info["seed"]}
    return None


def _which_target(kind: str, cfg: dict) -> str | None:
    """``"setting S, seed N[, --quick][, fidelity F]"`` of the :func:`get_target` recipe ``cfg`` is, if any."""
    seed = cfg.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        return None
    for name in TARGET_SETTINGS:
        if _target_kind(name) != kind:
            continue
        for fid in (("ours",) if kind == "gated_trig" else FIDELITIES):
            for quick in ((False, True) if QUICK_TARGET.get(name) else (False,)):
                if target_config(name, seed, quick, fid) == cfg:
                    return (f"setting {name!r}, seed {seed}" + (", --quick" if quick else "")
                            + (f", fidelity {fid!r}" if kind != "gated_trig" else ""))
    return None


def _target_file(path: str | os.PathLike) -> Path:
    """The ``.safetensors`` path of a target (the suffix appended unless present, :func:`tensors_path`); ``ValueError``
    if ``path`` is an existing directory."""
    for p in (Path(path), tensors_path(path)):
        if p.is_dir():
            raise ValueError(f"target path {str(p)!r} is an existing directory; expected the path of a target "
                             f".safetensors file (e.g. {str(Path(p) / 'target.safetensors')!r})")
    return tensors_path(path)


def check_target(name: str, seed: int, path: str | os.PathLike, quick: bool, fidelity: str | None = None) -> bool:
    """Whether a complete saved target (``.safetensors`` and its ``.json``) exists at ``path`` (the ``.safetensors``
    suffix appended unless present); when one does, that it is the target :func:`get_target` would make now: same
    kind, architecture and training configuration (:func:`target_config`: setting, seed, steps, batch size, lr and
    its schedule, instances, ...). Reads the JSON only.

    Raises ``ValueError`` naming the file, the differing fields (saved and requested values) and the fix (another
    out directory) when the saved target was made with another recipe (e.g. a ``--quick`` target under a paper
    run, another seed or setting, another ``fidelity``'s TMS recipe) or records no training configuration, or if
    ``path`` is an existing directory or the JSON is invalid; and as :func:`target_config` for bad arguments."""
    want = target_config(name, seed, quick, fidelity)
    kind = _target_kind(name)
    path = _target_file(path)
    meta_path = path.with_suffix(".json")
    if not (path.is_file() and meta_path.is_file()):
        return False
    meta = read_json(meta_path, what="target metadata")
    fidelity = resolve_fidelity(name, fidelity)
    run = (f"setting {name!r}, seed {seed}, {'--quick' if quick else 'paper'} preset"
           + (f", fidelity {fidelity!r}" if kind != "gated_trig" else ""))
    fix = "use another out directory (--out) for this run, or delete the target's two files to train it afresh"
    if meta.get("kind") != kind:
        raise ValueError(f"target {str(path)!r} holds a {meta.get('kind')!r} network, but {run} needs a {kind!r} "
                         f"target; {fix}")
    saved = _saved_config(kind, meta)
    if saved is None:
        raise ValueError(f"target {str(path)!r} records no training configuration (info['config'] in "
                         f"{str(meta_path)!r}), so it cannot be checked to be the target of {run}; {fix}")
    implicit = _TARGET_ADDED_FIELDS.get(kind, {})
    diffs = config_differences(saved, want, implicit=implicit)
    arch = meta.get("arch")
    if isinstance(arch, dict) and not diffs:
        diffs = [f"arch.{d}" for d in config_differences(arch, _target_arch(kind, want))]
    if diffs:
        which = _which_target(kind, {**implicit, **saved})
        raise ValueError(f"target {str(path)!r} was not made with the recipe of {run}: " + "; ".join(diffs)
                         + (f" (it is the target of {which})" if which else "") + f"; {fix}")
    return True


def get_target(name: str, seed: int, path: str | os.PathLike, quick: bool, quiet: bool,
               fidelity: str | None = None) -> tuple[nn.Module, dict]:
    """Load the target of setting ``name`` from ``path`` (``.safetensors`` appended unless present) if it exists there,
    else train (or hand-code) it and save it there. Returns ``(model, info)``; ``info["config"]`` is the training
    configuration (:func:`target_config`).

    ``fidelity="reference"`` trains a TMS target with the APD reference's recipe (lr 5e-3 decayed linearly to 0),
    ``"ours"`` at a constant lr 5e-3 (the SPD reference's recipe); ``None``: the setting's default
    (:func:`default_fidelity`). ``quick`` trains residual-MLP targets with :data:`QUICK_TARGET`'s shorter recipe.

    Raises ``ValueError`` (:func:`check_target`) when the target at ``path`` was made with another recipe than the
    one asked for (another setting, seed, ``quick`` recipe or TMS lr schedule: every field of its stored
    configuration is compared) or records none, or ``path`` is an existing directory; for a setting without a target,
    a negative ``seed``, an unknown ``fidelity`` or ``fidelity="reference"`` on a setting that is not TMS; and as
    :func:`mlpinterp.toys.load_toy` for a corrupt file."""
    kind = _target_kind(name)
    if check_target(name, seed, path, quick, fidelity):
        model, meta = load_toy(_target_file(path))
        if kind == "tms" and model.identity is not None:
            raise ValueError(f"target {str(_target_file(path))!r} holds a TMS with an identity layer; targets are "
                             "saved without it (the '-id' settings insert it on loading); use another out directory")
        return model, meta.get("info", {})
    path = _target_file(path)
    cfg = target_config(name, seed, quick, fidelity)
    t0 = time.perf_counter()
    if kind == "tms":
        model, info = train_tms(TMSConfig(**cfg), quiet=quiet)
    elif kind == "resid_mlp":
        model, info = train_resid_mlp(ResidMLPConfig(**cfg), quiet=quiet)
    else:
        model, info = build_gated_trig(**cfg)
    info["train_seconds"] = time.perf_counter() - t0
    save_toy(model, path, info)
    return model, info

