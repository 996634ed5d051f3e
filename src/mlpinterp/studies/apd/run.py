"""End-to-end APD reproductions (Braun et al. 2025): train or load the toy target, decompose, evaluate, report.

Settings: ``tms-5-2``, ``tms-40-10``, ``resid-mlp-1``, ``resid-mlp-2``, ``gated-trig``. Each has the paper's
hyperparameters (App. D) and a reduced ``quick`` preset for a CPU. Per seed ``s`` the run directory holds
``seed{s}/target.safetensors`` (+ JSON), ``seed{s}/apd/checkpoint.safetensors`` (resumable),
``seed{s}/components.safetensors``, figures ``seed{s}/*.png``; the top level holds ``metrics.json`` and
``report.md`` + ``report.html`` (:mod:`mlpinterp.studies.report`) with the paper's numbers beside ours.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mlpinterp.apd import (
    APDConfig,
    activation_frequency,
    attributions,
    decompose,
    per_feature_mse,
    responsible_components,
    scrubbing,
    select_mask,
    topk_mask,
)
from mlpinterp.paramspace import Components, column_match, reference_rank, run_with_components
from mlpinterp.studies import report as rep
from mlpinterp.studies.paramspace.figures import plot_history, plot_scrubbing, plot_tms, pyplot, save_fig
from mlpinterp.studies.paramspace.rundir import check_out_dir, recipe_overrides
from mlpinterp.toys import (
    RESID_PRESETS,
    TMS_PRESETS,
    ResidMLPConfig,
    TMSConfig,
    build_gated_trig,
    gated_trig_ground_truth,
    gated_trig_inputs,
    load_toy,
    neuron_contributions,
    save_toy,
    sparse_features,
    step_generator,
    train_resid_mlp,
    train_tms,
)
from mlpinterp.toys.resid_mlp import ADDED_FIELDS as RESID_ADDED_FIELDS
from mlpinterp.toys.tms import ADDED_FIELDS as TMS_ADDED_FIELDS
from mlpinterp.utils.artifact import save_artifact, tensors_path
from mlpinterp.utils.figures import pyplot, save_figure
from mlpinterp.utils.io import atomic_write_json, read_json
from mlpinterp.utils.rundir import RunDir, open_run, wall_time_statement
from mlpinterp.utils.validation import check_bool, check_device, check_int, config_differences

SETTINGS = ("tms-5-2", "tms-40-10", "resid-mlp-1", "resid-mlp-2", "gated-trig")

PAPER = {
    "tms-5-2": {"mmcs": (0.998, 0.000), "ml2r": (0.893, 0.004)},
    "tms-40-10": {"mmcs": (0.996, 0.003), "ml2r": (0.935, 0.001)},
}

_TMS52 = APDConfig(targets=("W",), C=5, m=None, steps=20_000, batch_size=2048, lr=3e-2, lr_schedule="constant",
                   warmup_frac=0.05, topk=0.211, faithfulness_coeff=1.0, minimality_coeff=1.0,
                   simplicity_coeff=0.7, schatten_p=1.0, attribution_source="apd", log_every=500,
                   checkpoint_every=2000)
_TMS4010 = APDConfig(targets=("W",), C=50, m=None, steps=20_000, batch_size=2048, lr=1e-3, lr_schedule="cosine",
                     warmup_frac=0.05, topk=1.0, faithfulness_coeff=1.0, minimality_coeff=10.0,
                     simplicity_coeff=20.0, schatten_p=0.9, attribution_source="target", log_every=500,
                     checkpoint_every=500)
_RESID1 = APDConfig(targets=("layers.0.mlp_in", "layers.0.mlp_out"), C=130, m=1, steps=40_000, batch_size=2048,
                    lr=1e-3, lr_schedule="cosine", warmup_frac=0.01, topk=1.28, faithfulness_coeff=1.0,
                    minimality_coeff=1.0, simplicity_coeff=10.0, schatten_p=0.9, act_recon_coeff=1.0,
                    act_names=("layers.0.act",), unit_norm_B=True, log_every=500, checkpoint_every=250)
_RESID2 = APDConfig(targets=("layers.0.mlp_in", "layers.0.mlp_out", "layers.1.mlp_in", "layers.1.mlp_out"),
                    C=200, m=1, steps=10_000, batch_size=2048, lr=1e-3, lr_schedule="cosine", warmup_frac=0.01,
                    topk=1.28, faithfulness_coeff=1.0, minimality_coeff=2.0, simplicity_coeff=7.0, schatten_p=0.9,
                    act_recon_coeff=1.0, act_names=("layers.0.act", "layers.1.act"), log_every=500,
                    checkpoint_every=250)
_GATED = APDConfig(targets=("layers.0.mlp_in", "layers.0.mlp_out", "layers.1.mlp_in", "layers.1.mlp_out"), C=4,
                   m=None, steps=200_000, batch_size=10_000, lr=3e-3, lr_schedule="cosine", warmup_frac=0.004,
                   topk=0.2217, faithfulness_coeff=0.1, minimality_coeff=5.0, simplicity_coeff=5.0, schatten_p=1.0,
                   log_every=1000, checkpoint_every=5000)

#: Paper presets (App. D). The paper does not state the inner rank m of the residual-MLP runs; we use m = 1
#: (the paper reports rank-one components work at least as well, App. C.2).
PRESETS: dict[str, APDConfig] = {"tms-5-2": _TMS52, "tms-40-10": _TMS4010, "resid-mlp-1": _RESID1,
                                 "resid-mlp-2": _RESID2, "gated-trig": _GATED}

#: Reduced presets for a CPU (same coefficients, fewer steps / smaller batches).
QUICK: dict[str, dict] = {
    "tms-5-2": dict(steps=5000, log_every=250),
    "tms-40-10": dict(steps=5000, log_every=250),
    "resid-mlp-1": dict(steps=5000, batch_size=256, log_every=250),
    "resid-mlp-2": dict(steps=4000, batch_size=256, log_every=250),
    "gated-trig": dict(steps=8000, batch_size=2048, lr_schedule="cosine", log_every=400),
}

#: ``fidelity``: ``"ours"`` (the presets above) or ``"reference"`` (the APD/SPD reference implementation's way: for
#: TMS the APD method and its target recipe, for the residual MLPs the target recipe only, :data:`REFERENCE_TARGET`).
FIDELITIES = ("ours", "reference")

#: The fidelity a setting runs at when none is given: the better one measured at the paper preset (docs/guides/apd.md). TMS 40-10: ``reference`` (MMCS 0.989 ± 0.007, ML2R 0.914 ± 0.022 against ``ours`` 0.968 ± 0.009 /
#: 0.882 ± 0.026, n = 3 each); TMS 5-2: ``ours`` (0.9983 / 0.8947, n = 10, the paper's row reproduced; ``reference``
#: not run at the paper preset); every other setting has only ``ours``.
DEFAULT_FIDELITY = {"tms-40-10": "reference"}


def default_fidelity(name: str) -> str:
    """The fidelity setting ``name`` runs at when none is given (:data:`DEFAULT_FIDELITY`, else ``"ours"``)."""
    return DEFAULT_FIDELITY.get(name, "ours")


def reference_overrides(name: str) -> dict:
    """APDConfig fields of ``fidelity="reference"`` for TMS setting ``name``: inner rank ``min(d_in, d_hidden) + 1``,
    the reference's small 4-D Xavier initialisation, AdamW without weight decay, quarter-cosine schedule after the
    preset's linear warm-up (5 % of the steps: 1000 of the paper's 20k), and the preset's attribution source
    (the target for TMS 40-10, the APD model for TMS 5-2, as the paper).

    Raises ``ValueError`` for a setting that is not TMS."""
    if not isinstance(name, str) or name not in TMS_PRESETS:
        raise ValueError(f"fidelity='reference' is defined for {tuple(TMS_PRESETS)} only, got setting {name!r}")
    t = TMS_PRESETS[name]
    return dict(m=reference_rank(t.d_hidden, t.n_features), init="reference", init_instances=3, weight_decay=0.0,
                lr_schedule="quarter_cosine")


def _resolve_fidelity(name: str, fidelity: str | None) -> str:
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
        raise ValueError(f"setting must be one of {SETTINGS} (or resid-mlp-3), got {name!r}")
    if name in TMS_PRESETS:
        n = TMS_PRESETS[name].n_features
        return SettingSpec(name, n, (0.0, 1.0), lambda b, g: sparse_features(b, n, 0.05, (0.0, 1.0), generator=g))
    if name in RESID_PRESETS:  # resid-mlp-1/2 (APD and SPD) and resid-mlp-3 (SPD)
        n = RESID_PRESETS[name].n_features
        return SettingSpec(name, n, (-1.0, 1.0), lambda b, g: sparse_features(b, n, 0.01, (-1.0, 1.0), generator=g))
    return SettingSpec(name, 4, (0.0, 1.0), lambda b, g: gated_trig_inputs(b, 4, 0.05, generator=g))


def apd_config(name: str, quick: bool, seed: int, fidelity: str | None = None, **overrides) -> APDConfig:
    """The APD configuration of ``name`` (paper or quick preset, ``fidelity`` ``"ours"`` or ``"reference"``; ``None``:
    the setting's default, :func:`default_fidelity`) with ``seed`` and ``overrides`` applied; ``TypeError`` for a
    ``quick`` that is not a bool."""
    check_bool(quick, "quick")  # a string such as "no" would be truthy: the quick preset, silently
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {name!r}")
    fidelity = _resolve_fidelity(name, fidelity)
    cfg = PRESETS[name]
    kw = dict(QUICK[name]) if quick else {}
    if fidelity == "reference" and name in TMS_PRESETS:  # elsewhere "reference" is the target's recipe only
        kw.update(reference_overrides(name))
    kw.update(overrides)
    kw["seed"] = seed
    from mlpinterp.apd import with_overrides

    return with_overrides(cfg, **kw)


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
    fidelity = _resolve_fidelity(name, fidelity)
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
    fidelity = _resolve_fidelity(name, fidelity)
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


# ------------------------------------------------------------------------------------------------ figures
def plot_contributions(model, comps: Components, responsible: np.ndarray, path: Path, n_show: int = 10) -> None:
    plt = pyplot()
    target = neuron_contributions(model).numpy()[:n_show]
    W = comps.weights()
    learned = np.stack([neuron_contributions(model, {k: v[responsible[i]] for k, v in W.items()}).numpy()[i]
                        for i in range(n_show)])
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.5), sharex=True)
    vmax = max(np.abs(target).max(), np.abs(learned).max())
    for ax, M, t in ((axes[0], target, "target"), (axes[1], learned, "responsible APD component")):
        ax.imshow(M, aspect="auto", cmap="RdBu", vmin=-vmax, vmax=vmax)
        ax.set_ylabel("feature")
        ax.set_title(f"neuron contributions: {t}", fontsize=9)
    axes[1].set_xlabel("neuron")
    save_figure(fig, path)


def plot_gated(model, comps: Components, info: dict, path: Path, cfg: APDConfig) -> None:
    from mlpinterp.toys import trig_functions

    plt = pyplot()
    xs = torch.linspace(0, 5, 200)
    fig, axes = plt.subplots(1, 4, figsize=(12, 2.6))
    for i, ax in enumerate(axes):
        inp = torch.zeros(200, 5)
        inp[:, 0] = xs
        inp[:, 1 + i] = 1.0
        with torch.no_grad():
            mask = topk_mask(attributions(model, comps, inp), 1)
            y_apd = run_with_components(model, comps, inp, mask.float())[:, 0]
            y_t = model(inp)[:, 0]
        ax.plot(xs, trig_functions(xs.numpy(), np.array(info["coefficients"]))[:, i], "k:", label="F_i")
        ax.plot(xs, y_t, label="target")
        ax.plot(xs, y_apd, "--", label="APD top-1")
        ax.set_title(f"function {i}", fontsize=9)
    axes[0].legend(fontsize=7)
    save_figure(fig, path)


# ---------------------------------------------------------------------------------------------- evaluate
def _flat_cos(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> np.ndarray:
    """``[n_a, n_b]`` cosine similarities of components flattened over all sites."""
    fa = torch.cat([a[k].flatten(1) for k in sorted(a)], 1).double()
    fb = torch.cat([b[k].flatten(1) for k in sorted(a)], 1).double()
    fa = fa / fa.norm(dim=1, keepdim=True).clamp_min(1e-300)
    fb = fb / fb.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return (fa @ fb.T).numpy()


@torch.no_grad()
def evaluate(name: str, model: nn.Module, comps: Components, cfg: APDConfig, info: dict, seed_dir: Path,
             seed: int, n_eval: int = 4000) -> dict:
    """Metrics of one decomposition (and its figures in ``seed_dir``), on ``~n_eval`` held-out samples."""
    spec = setting_spec(name)
    gen = step_generator(seed + 10_000, 0)
    batches = [spec.sample(max(cfg.batch_size, n_eval // 4), gen) for _ in range(4)]
    freq = activation_frequency(model, comps, batches, lambda a: select_mask(a, cfg), cfg.attribution_source)
    out: dict = {"dead_components": int((freq == 0).sum()), "alive_components": int((freq > 0).sum()),
                 "activation_frequency": freq.tolist()}
    x = torch.cat(batches)
    mask = select_mask(attributions(model, comps, x, cfg.attribution_source), cfg)
    y_t = model(x)
    out["topk_output_mse"] = float(((run_with_components(model, comps, x, mask.float()) - y_t) ** 2).mean())
    out["all_components_output_mse"] = float(((run_with_components(model, comps, x) - y_t) ** 2).mean())
    if name.startswith("tms"):
        W = model.W.detach()
        P = comps.weights()["W"].detach()
        out["mmcs"], out["ml2r"], mcs, cos, ratio = column_match(W, P)
        out["max_cos"], out["l2_ratio"] = cos.tolist(), ratio.tolist()
        out["mcs"] = mcs.tolist()
        plot_tms(W.numpy(), P.numpy(), seed_dir / "components.png")
    elif name.startswith("resid"):
        resp = responsible_components(model, comps, spec.n_features, 1.0, cfg.attribution_source)
        out["responsible"] = resp.tolist()
        out["distinct_responsible"] = int(len(np.unique(resp)))
        xs = spec.sample(n_eval, step_generator(seed + 20_000, 0))
        xs = xs[(xs != 0).any(1)]
        res = scrubbing(model, comps, xs, resp, lambda a: select_mask(a, cfg), seed=seed,
                        source=cfg.attribution_source)
        out.update(res.summary())
        pf = per_feature_mse(model, comps, spec.n_features, spec.value_range, n_per_feature=max(10, n_eval // 40), k=1,
                             source=cfg.attribution_source, seed=seed)
        out["per_feature_mse_top1"] = pf.tolist()
        out["per_feature_mse_top1_mean"] = float(pf.mean())
        plot_scrubbing(res, seed_dir / "scrubbing_hist.png")
        plot_contributions(model, comps, resp, seed_dir / "neuron_contributions.png")
    else:
        gt = gated_trig_ground_truth(model)
        cos = _flat_cos(gt, {k: v.detach() for k, v in comps.weights().items()})
        out["gt_param_mmcs"] = float(cos.max(axis=1).mean())
        out["gt_match"] = cos.argmax(axis=1).tolist()
        plot_gated(model, comps, info, seed_dir / "functions.png", cfg)
    return out


def paper_statistic(per_seed: list[dict]) -> dict:
    """The papers' Table 1 statistic: one run (the best by MMCS of the first three seeds, as APD's reference kept
    the best of 3 instances), mean ± std over the target's features of the per-feature max cosine and L2 ratio."""
    first = per_seed[:3]
    best = max(first, key=lambda m: m["mmcs"])
    cos, ratio = np.asarray(best["max_cos"]), np.asarray(best["l2_ratio"])
    sd = lambda a: float(a.std(ddof=1)) if len(a) > 1 else None
    return {"seed": best["seed"], "of_seeds": len(first), "mmcs": float(cos.mean()), "mmcs_std_over_features": sd(cos),
            "ml2r": float(ratio.mean()), "ml2r_std_over_features": sd(ratio), "n_features": len(cos)}


def _mean_std(vals: list[float]) -> tuple[float, float | None]:
    """``(mean, sample std)``; the std is ``None`` (JSON ``null``) for a single value, never a made-up 0."""
    a = np.asarray(vals, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else None


SUMMARY_KEYS = ("mmcs", "ml2r", "gt_param_mmcs", "topk_mse", "scrubbed_mse", "anti_scrubbed_mse",
                "per_feature_mse_top1_mean", "dead_components", "topk_output_mse", "seconds")


def reproduce(setting: str, seeds: int, out: str | Path, quick: bool = False, quiet: bool = False,
              overrides: dict | None = None, n_eval: int = 4000, device: str | None = None,
              fidelity: str | None = None) -> dict:
    """Train (or load) targets, decompose with APD for ``seeds`` seeds, evaluate and write ``metrics.json``,
    ``report.md`` and the self-contained ``report.html`` (figures embedded).

    ``overrides`` replaces APDConfig fields of the preset; ``n_eval`` is the number of held-out evaluation samples;
    ``device`` is where the decomposition trains (evaluation runs on the CPU); ``fidelity="reference"`` runs TMS the
    APD reference implementation's way (:func:`reference_overrides` and the reference's target recipe) and the
    residual MLPs on the reference's targets (:data:`REFERENCE_TARGET`: no biases), ``"ours"``
    our presets, ``None`` the setting's default (:data:`DEFAULT_FIDELITY`: ``reference`` for TMS 40-10).

    Returns the ``metrics.json`` content. Re-running resumes unfinished decompositions from their checkpoints.

    Raises
    ------
    ValueError
        For an unknown setting, ``seeds < 1`` or ``n_eval < 1``; before any training, when a seed's saved target
        in ``out`` was made with another recipe (:func:`check_target`: e.g. a ``--quick`` target under a paper run).
    TypeError
        For ``seeds`` or ``n_eval`` that is not an int (a bool, a float, a string).
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    check_int(seeds, "seeds")  # a bool or a string is refused, not counted as 1 seed or compared with 1
    check_int(n_eval, "n_eval")  # refused now, not ignored or failing after the first decomposition
    fidelity = _resolve_fidelity(setting, fidelity)
    if fidelity == "reference":
        target_config(setting, 0, quick, fidelity)  # raises for a setting without a reference recipe (gated-trig)
    # everything that can be refused is refused before minutes of target training
    cfg0 = apd_config(setting, quick, 0, fidelity, **(overrides or {}))
    if device is not None:
        check_device(device)
    out = check_out_dir(out, "apd")
    for seed in range(seeds):  # refuse targets of another recipe before hours of training
        check_target(setting, seed, out / f"seed{seed}" / "target.safetensors", quick, fidelity)
    run_cfg = {**asdict(cfg0), "setting": setting, "quick": quick, "fidelity": fidelity, "seeds": seeds,
               "n_eval": n_eval}
    with open_run(out, "reproduce apd", run_cfg, resumable=("log_every", "checkpoint_every")) as rd:
        return _reproduce_open(rd, setting, seeds, quick, quiet, overrides, n_eval, device, fidelity, cfg0)


def _reproduce_open(rd: RunDir, setting: str, seeds: int, quick: bool, quiet: bool, overrides: dict | None,
                    n_eval: int, device: str | None, fidelity: str, cfg0: APDConfig) -> dict:
    """:func:`reproduce` once ``out`` is open."""
    out = rd.path
    spec = setting_spec(setting)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    per_seed = []
    for seed in range(seeds):
        sd = out / f"seed{seed}"
        model, info = get_target(setting, seed, sd / "target.safetensors", quick, quiet, fidelity)
        model.requires_grad_(False)
        cfg = apd_config(setting, quick, seed, fidelity, **(overrides or {}))
        sample = lambda step, cfg=cfg, seed=seed: spec.sample(cfg.batch_size, step_generator(seed + 1000, step))
        res = decompose(model, sample, cfg, out_dir=sd / "apd", quiet=quiet, device=device)
        comps = res.components
        save_artifact(sd / "components.safetensors", {k: v.detach() for k, v in comps.state_dict().items()},
                      kind="apd_components", provenance={"setting": setting, "seed": seed},
                      meta={"setting": setting, "config": asdict(cfg), "sites": [asdict(s) for s in comps.sites]})
        atomic_write_json(sd / "history.json", res.history)
        plot_history(res.history, sd / "losses.png", f"{setting} seed {seed}")
        m = evaluate(setting, model, comps, cfg, info, sd, seed, n_eval)
        m.update(seed=seed, seconds=res.seconds, final=res.history[-1] if res.history else {},
                 target_loss=info.get("loss"))
        per_seed.append(m)
    summary = {k: _mean_std([m[k] for m in per_seed]) for k in SUMMARY_KEYS if all(k in m for m in per_seed)}
    result = {"method": "apd", "setting": setting, "quick": quick,
              "overrides": recipe_overrides(apd_config(setting, quick, 0, fidelity), overrides),
              "seeds": seeds, "fidelity": fidelity,
              "config": asdict(cfg0), "summary": summary, "paper": PAPER.get(setting, {}), "per_seed": per_seed,
              "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
              "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None, "device": device or "cpu",
              "wall_seconds": rd.wall_seconds, "sessions": rd.sessions}
    if all("max_cos" in m for m in per_seed):
        result["failed_seeds"] = int(sum(m["mmcs"] < 0.99 for m in per_seed))
        result["paper_statistic"] = paper_statistic(per_seed)
    atomic_write_json(out / "metrics.json", result)
    rep.write_report(out, render_report(result), title=f"APD reproduction: {setting}")
    return result


def _figures(result: dict) -> list[str]:
    """The per-seed figures of the setting, as they exist in the run directory (relative paths)."""
    by_setting = {"tms": ("losses.png", "components.png"), "resid": ("losses.png", "scrubbing_hist.png",
                                                                    "neuron_contributions.png"),
                  "gated": ("losses.png", "functions.png")}
    names = by_setting[result["setting"].split("-")[0]]
    return [f"seed{m['seed']}/{f}" for m in result["per_seed"] for f in names]


def render_report(result: dict) -> str:
    """Markdown report: our mean ± std over seeds (n shown, no spread for one seed) beside the paper's numbers, the
    per-seed values, every figure (embedded in ``report.html``) and the configuration."""
    paper, per = result["paper"], result["per_seed"]
    kind = rep.run_kind(result["quick"], result.get("overrides"))
    n = len(per)
    keys = [k for k in SUMMARY_KEYS if all(k in m for m in per)]
    lines = [f"# APD reproduction: {result['setting']}{rep.run_kind_note(kind, result.get('overrides'))}",
             "", f"Fidelity: {result.get('fidelity', 'ours')}. Seeds: n = {n}; device {result.get('device', 'cpu')}; torch threads: {result['threads']}; 1/5/15-min "
             f"load average at the end: {result.get('load_average')}; "
             f"{wall_time_statement(result.get('wall_seconds'), result.get('sessions'))} (`seconds` per seed is the "
             "APD wall time, summed over resumed sessions).", ""]
    rows = []
    for k in keys:
        p = paper.get(k)
        rows.append([k, rep.mean_std([m[k] for m in per], ".4g"), f"{p[0]:.3f} ± {p[1]:.3f}" if p else "—"])
    lines += [rep.md_table(["metric", f"ours (mean ± std over seeds, n = {n})", "paper (one run)"], rows), ""]
    if "mmcs" in keys and "mmcs" in paper:
        mm = [m["mmcs"] for m in per]
        failed = sum(v < 0.99 for v in mm)
        v = rep.verdict(abs(float(np.mean(mm)) - paper["mmcs"][0]) <= max(2 * paper["mmcs"][1], 0.002),
                        f"MMCS {np.mean(mm):.4f} (n = {n}) vs the paper's {paper['mmcs'][0]:.3f}; "
                        f"{failed} of {n} seeds below 0.99", run=kind)
        ps = result["paper_statistic"]
        sd = lambda v: "" if v is None else f" ± {v:.3f}"
        lines += [f"Failed seeds (MMCS < 0.99): {failed} of {n}.", "",
                  f"The paper's statistic computed the paper's way (one run: seed {ps['seed']}, the best by MMCS of the "
                  f"first {ps['of_seeds']}; ± over its {ps['n_features']} features): MMCS {ps['mmcs']:.3f}"
                  f"{sd(ps['mmcs_std_over_features'])}, ML2R {ps['ml2r']:.3f}{sd(ps['ml2r_std_over_features'])} "
                  f"(paper {paper['mmcs'][0]:.3f} ± {paper['mmcs'][1]:.3f}, {paper['ml2r'][0]:.3f} ± "
                  f"{paper['ml2r'][1]:.3f}).", "", f"Verdict: {v}", ""]
    else:
        lines += [f"Verdict: {rep.verdict(None, 'the paper reports this setting qualitatively (figures)', run=kind)}",
                  ""]
    lines += ["Per seed:", "", rep.md_table(["seed", *keys], [[m["seed"], *(rep.fmt_value(m[k], ".4g") for k in keys)]
                                                            for m in per]), "", "## Figures", ""]
    lines += [rep.figure(f, f.replace("/", ": ").removesuffix(".png").replace("_", " ")) + "\n" for f in _figures(result)]
    lines += ["## Configuration (APDConfig)", "", "```json", json.dumps(result["config"], indent=1), "```", "",
              "Paper: Braun, Bushnaq, Heimersheim, Mendel, Sharkey (2025), arXiv 2501.14926, Table 1 and App. D.", ""]
    return "\n".join(lines)
