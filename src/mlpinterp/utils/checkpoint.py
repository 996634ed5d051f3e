"""Training checkpoints: the optimiser state every trainer stores (:func:`optimizer_tensors`,
:func:`split_optimizer_tensors`, :func:`restore_optimizer`) and the resumable state of a parameter decomposition
(APD, SPD): module + optimiser + step + config + history.

Every trainer (APD, SPD, MFR, the classifier, ``train-lm``) writes its checkpoint as an artifact
(:mod:`mlpinterp.utils.artifact`) with its optimiser's per-parameter state as ``<prefix>.<i>.<name>`` tensors
(``i``: the parameter's position in the optimiser's param groups) from :func:`optimizer_tensors`, and restores it
through :func:`restore_optimizer`.

A decomposition's checkpoint is one ``checkpoint.safetensors`` (the module's state dict as ``module.*``, the
optimiser's per-parameter state as ``opt.<i>.<name>``) and its ``.json`` (step, configuration, metric history, wall
seconds), written atomically by
:func:`mlpinterp.utils.artifact.save_artifact` (kind ``"<method>_checkpoint"``, e.g. ``"apd_checkpoint"``: hashed,
versioned, verified on loading). Data and masks come from per-step generators, so no RNG state is needed:
a resumed run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

from mlpinterp.utils.artifact import ArtifactError, load_artifact, save_artifact
from mlpinterp.utils.config_diff import config_differences
from mlpinterp.utils.validation import check_device, nonfinite_names

RESTART_FIX = ("delete the checkpoint (checkpoint.safetensors and checkpoint.json) to restart the run from step 0, "
               "or use another out directory")
"""The fix appended to every error about an unusable checkpoint."""


_KINDS = {"comp": "apd_checkpoint", "spd": "spd_checkpoint"}


def checkpoint_kind(prefix: str) -> str:
    """The artifact kind of a decomposition checkpoint whose module tensors are ``prefix.*`` (``"comp"``: APD)."""
    return _KINDS.get(prefix, f"{prefix}_checkpoint")


def _some(names) -> str:
    names = sorted(names)
    return repr(names) if len(names) <= 6 else f"{names[:6]!r} and {len(names) - 6} more"


def optimizer_tensors(opt: torch.optim.Optimizer, prefix: str = "opt") -> dict[str, torch.Tensor]:
    """The per-parameter state of ``opt`` as tensors ``{prefix}.{i}.{name}`` (``i``: the parameter's position in
    ``opt.param_groups``; a number such as a step count becomes a 0-d tensor). The param groups themselves
    (learning rate, a schedule-free optimiser's weight sums) are not included: store them in the metadata when the
    trainer does not set them itself."""
    out = {}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            out[f"{prefix}.{i}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return out


def split_optimizer_tensors(tensors: Mapping[str, torch.Tensor], opt: torch.optim.Optimizer,
                            prefix: str = "opt") -> tuple[dict[int, dict[str, torch.Tensor]], list[str]]:
    """``(state, unknown)``: the ``{prefix}.{i}.{name}`` tensors of ``tensors`` as ``{i: {name: tensor}}``, checked
    against the parameters of ``opt`` (``ValueError`` naming the tensor when its shape or dtype is not the
    parameter's, a ``step`` count aside), and the names under ``prefix`` that index no parameter of ``opt``."""
    params = [p for g in opt.param_groups for p in g["params"]]
    state: dict[int, dict[str, torch.Tensor]] = {}
    unknown = []
    for k, v in tensors.items():
        if not k.startswith(prefix + "."):
            continue
        parts = k[len(prefix) + 1:].split(".", 1)
        if len(parts) != 2 or not parts[0].isdigit() or int(parts[0]) >= len(params):
            unknown.append(k)
            continue
        i, name = int(parts[0]), parts[1]
        p = params[i]
        if name != "step" and (v.shape != p.shape or v.dtype != p.dtype):
            raise ValueError(f"optimiser state {k} of shape {list(v.shape)} and dtype {v.dtype}, expected shape "
                             f"{list(p.shape)} and dtype {p.dtype} (those of parameter {i})")
        state.setdefault(i, {})[name] = v
    return state, unknown


def restore_optimizer(opt: torch.optim.Optimizer, state: Mapping[int, Mapping[str, torch.Tensor]],
                      param_groups: list[dict] | None = None) -> None:
    """Load ``state`` (from :func:`split_optimizer_tensors`) into ``opt`` through ``opt.load_state_dict`` (values
    moved to the parameters' device, a ``step`` count left where it is), with ``param_groups`` (without their
    ``params``) when given, else the optimiser's own."""
    params = [p for g in opt.param_groups for p in g["params"]]
    sd = opt.state_dict()
    sd["state"] = {i: {k: v if k == "step" else v.to(params[i].device) for k, v in st.items()}
                   for i, st in state.items()}
    if param_groups is not None:
        if len(param_groups) != len(sd["param_groups"]):
            raise ValueError(f"{len(param_groups)} param groups saved, the optimiser has {len(sd['param_groups'])}")
        sd["param_groups"] = [{**g, "params": own["params"]} for g, own in zip(param_groups, sd["param_groups"],
                                                                                strict=True)]
    opt.load_state_dict(sd)


def save_training_state(path: Path, module: nn.Module, opt: torch.optim.Optimizer, step: int, config: dict,
                        history: list[dict], seconds: float, prefix: str = "comp") -> None:
    """Write the checkpoint atomically (``prefix`` names the module's tensors; APD's are ``comp.*``).

    Raises ``ValueError`` naming ``path`` (and writes nothing) when a parameter or optimiser tensor holds NaN or inf:
    a resumed run must never start from a diverged state.
    """
    tensors = {f"{prefix}.{k}": v.detach() for k, v in module.state_dict().items()}
    tensors.update(optimizer_tensors(opt, "opt"))
    bad = nonfinite_names(tensors)
    if bad:
        raise ValueError(f"refusing to write checkpoint {str(path)!r} at step {step}: tensors {_some(bad)} hold NaN or "
                         "inf (the training diverged); lower the learning rate")
    save_artifact(path, tensors, kind=checkpoint_kind(prefix), provenance={"step": step},
                  meta={"step": step, "config": config, "history": history, "seconds": seconds})


def _adam_state_names(opt: torch.optim.Optimizer) -> set[str] | None:
    """The per-parameter state an Adam/AdamW optimiser keeps once it has stepped (``None`` for other optimisers)."""
    if not isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        return None
    names = {"step", "exp_avg", "exp_avg_sq"}
    return names | {"max_exp_avg_sq"} if any(g.get("amsgrad") for g in opt.param_groups) else names


def _check_meta(meta: dict, meta_path: Path, config: dict, ignore: set[str],
                implicit: Mapping | None = None) -> tuple[int, list, float]:
    """``(step, history, seconds)`` from checkpoint metadata, checked field by field (``ValueError`` naming the file)."""

    def bad(problem: str) -> ValueError:
        return ValueError(f"checkpoint metadata {str(meta_path)!r} {problem}; {RESTART_FIX}")

    missing = [k for k in ("step", "config", "history") if k not in meta]
    if missing:
        raise bad(f"lacks the field(s) {missing} (it holds {sorted(meta)})")
    saved = meta["config"]
    if not isinstance(saved, dict):
        raise bad(f"has 'config' = {saved!r} ({type(saved).__name__}), expected a JSON object")
    diff = config_differences(saved, config, ignore, implicit)
    if diff:
        raise ValueError(f"checkpoint {str(meta_path.with_suffix('.safetensors'))!r} was written with a different "
                         f"configuration ({'; '.join(diff)}); request the saved values to resume it, or use "
                         "another out_dir, or delete the checkpoint")
    step = meta["step"]
    steps = config.get("steps")
    hi = steps if isinstance(steps, int) and not isinstance(steps, bool) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or (hi is not None and step > hi):
        rng = f"an integer in [0, {hi}] (the configured number of steps)" if hi is not None else "an integer >= 0"
        raise bad(f"has 'step' = {step!r}, expected {rng}")
    history = meta["history"]
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise bad(f"has 'history' of type {type(history).__name__}, expected a JSON list of objects")
    seconds = meta.get("seconds", 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
        raise bad(f"has 'seconds' = {seconds!r}, expected a finite number >= 0")
    return step, list(history), float(seconds)


def _check_tensors(tensors: dict[str, torch.Tensor], path: Path, module: nn.Module, opt: torch.optim.Optimizer,
                   step: int, prefix: str) -> tuple[dict[str, torch.Tensor], dict[int, dict[str, torch.Tensor]]]:
    """Split the checkpoint's tensors into the module's state dict and the optimiser's per-parameter state, checking
    names, shapes, dtypes and finiteness against ``module`` and ``opt`` (``ValueError`` naming ``path``)."""

    def bad(problem: str) -> ValueError:
        return ValueError(f"checkpoint {str(path)!r} {problem}; {RESTART_FIX}")

    expected = module.state_dict()
    mod = {k[len(prefix) + 1:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
    names = _adam_state_names(opt)
    rest = {k: v for k, v in tensors.items() if not k.startswith(prefix + ".")}
    unknown = [k for k in rest if not k.startswith("opt.")]
    if names is not None:
        unknown += [k for k in rest if k.startswith("opt.") and k.split(".", 2)[-1] not in names]
    try:
        state, bad_index = split_optimizer_tensors({k: v for k, v in rest.items() if k not in unknown}, opt, "opt")
    except ValueError as e:
        raise bad(f"has {e}") from e
    unknown += bad_index
    missing = [f"{prefix}.{k}" for k in expected if k not in mod]
    extra = [f"{prefix}.{k}" for k in mod if k not in expected] + unknown
    if missing or extra:
        parts = ([f"missing tensors {_some(missing)}"] if missing else []) + (
            [f"unexpected tensors {_some(extra)}"] if extra else [])
        raise bad(f"does not match this {type(module).__name__} ({', '.join(parts)})")
    for k, want in expected.items():
        got = mod[k]
        if got.shape != want.shape or got.dtype != want.dtype:
            raise bad(f"has tensor {prefix}.{k} of shape {list(got.shape)} and dtype {got.dtype}, expected shape "
                      f"{list(want.shape)} and dtype {want.dtype}")
    for i, st in sorted(state.items()):
        if names is not None and set(st) != names:
            raise bad(f"has optimiser state {sorted(st)} for parameter {i}, expected {sorted(names)}")
        if "step" in st:
            v = st["step"]
            ok = v.numel() == 1 and not v.is_complex() and v.dtype != torch.bool
            val = float(v.reshape(())) if ok else math.nan
            if not (math.isfinite(val) and val == int(val) and 0 <= val <= step):
                raise bad(f"has optimiser step count opt.{i}.step = {v.tolist()!r}, expected an integer in "
                          f"[0, {step}] (the checkpoint's step)")
    counts = [float(st["step"].reshape(())) for st in state.values() if "step" in st]
    if names is not None and step > 0 and (not counts or max(counts) != step):
        raise bad(f"says step {step} but its optimiser state has made {int(max(counts)) if counts else 0} step(s) "
                  "(hand-edited or mixed-up files)")
    nonfinite = nonfinite_names(tensors)
    if nonfinite:
        raise bad(f"holds NaN or inf in {_some(nonfinite)} (the run that wrote it diverged; lower the learning "
                  "rate)")
    return mod, state


def load_training_state(path: Path, module: nn.Module, opt: torch.optim.Optimizer, config: dict,
                        ignore: Iterable[str] = ("log_every", "checkpoint_every"),
                        prefix: str = "comp", implicit: Mapping | None = None) -> tuple[int, list, float]:
    """Restore ``module`` and ``opt`` from ``path``; returns ``(step, history, seconds)``.

    ``implicit``: the values of configuration fields added after a checkpoint may have been written, as the code
    behaved before them (:func:`mlpinterp.utils.config_diff.config_diff`): a checkpoint of an earlier version that
    lacks such a field resumes when the request keeps that behaviour.

    Nothing is cast or guessed: every tensor must have the name, shape and dtype of the module's state dict or the
    optimiser's state and be finite, and the metadata must hold an integer ``step`` in ``[0, config["steps"]]``
    (matching the optimiser's own step count), a ``config`` object and a ``history`` list.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        When the checkpoint was written with a different configuration (fields other than ``ignore``), naming the
        fields; or (:class:`~mlpinterp.utils.artifact.ArtifactError`) when either file is corrupt, truncated or does
        not match its hash, or was written by a newer mlpinterp; or it has missing or malformed metadata fields, missing,
        unexpected, mis-shaped or mis-typed tensors, or NaN/inf values. Each message names the file, what is wrong
        and the fix (delete the checkpoint to restart, or use another out directory).
    """
    path = Path(path)
    art = load_artifact(path, kind=checkpoint_kind(prefix), fix=RESTART_FIX, what="checkpoint")
    tensors, meta = art.tensors, art.meta
    if not isinstance(meta, dict):
        raise ArtifactError(art.path.with_suffix(".json"), f"holds a JSON {type(meta).__name__}, expected a JSON "
                            "object", RESTART_FIX, "checkpoint metadata")
    step, history, seconds = _check_meta(meta, path.with_suffix(".json"), config, set(ignore), implicit)
    mod, state = _check_tensors(tensors, path, module, opt, step, prefix)
    try:
        module.load_state_dict(mod)
        restore_optimizer(opt, state)
    except (RuntimeError, KeyError, ValueError) as e:  # defensive: the checks above should have caught it
        raise ValueError(f"checkpoint {str(path)!r} does not fit the model or optimiser ({e}); {RESTART_FIX}") from e
    return step, history, seconds


class TrainingDiverged(ValueError):
    """A training run produced NaN or inf (a ``ValueError``); ``step`` is where, ``fix`` the line the CLI prints."""

    fix = ("rerun with a lower --lr and another --out (the checkpoint in this --out belongs to the old lr; no "
           "checkpoint with NaN or inf is ever written)")

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


def diverged(what: str, step: int, detail: str, lr: float) -> TrainingDiverged:
    """The error of a training run (``what``: "APD", "SPD") that produced NaN or inf at ``step``."""
    return TrainingDiverged(f"{what} training diverged at step {step} ({detail}); lower the learning rate "
                            f"(lr = {lr:g}; --lr on the command line)", step)


def check_loss_finite(what: str, step: int, loss: float, lr: float) -> None:
    """Raise :func:`diverged` when the loss of ``step`` (a Python float the loop has already read) is NaN or inf."""
    if not math.isfinite(loss):
        raise diverged(what, step, f"loss {loss}", lr)


def _check_finite(what: str, step: int, module: nn.Module, lr: float, probe: Callable[[], torch.Tensor] | None,
                  prefix: str, suffix: str, err: Exception | None = None) -> None:
    """Raise :func:`diverged` (chained to ``err``) when a parameter of ``module`` or ``probe()`` is NaN or inf;
    ``prefix`` and ``suffix`` frame what is found."""
    bad = nonfinite_names(module.named_parameters())
    if bad:
        raise diverged(what, step, f"{prefix}parameters {_some(bad)} are NaN or inf{suffix}", lr) from err
    if probe is not None:
        with torch.no_grad():
            value = float(probe())
        if not math.isfinite(value):
            raise diverged(what, step, f"{prefix}the parameters overflow{suffix}: faithfulness loss {value}",
                           lr) from err


def check_params_finite(what: str, step: int, module: nn.Module, lr: float,
                        probe: Callable[[], torch.Tensor] | None = None) -> None:
    """Raise :func:`diverged` when a parameter of ``module`` holds NaN or inf after the optimiser step of ``step``, or
    when ``probe()`` (a loss that depends on the parameters only, e.g. faithfulness) does: finite parameters so large
    that they overflow (a huge learning rate). Two device synchronisations: call it before writing a checkpoint and at
    the end, not every step."""
    _check_finite(what, step, module, lr, probe, "", " after the optimiser step")


def explain_failure(what: str, step: int, err: ValueError, module: nn.Module, probe: Callable[[], torch.Tensor],
                    lr: float) -> None:
    """Called when the losses of ``step`` raised ``err`` (e.g. a NaN/inf check inside the forward pass): raise
    :func:`diverged` (chained to ``err``) when the parameters of ``module`` or ``probe()`` (a loss that depends on the
    parameters only, e.g. faithfulness) are NaN or inf, i.e. when the previous update blew the parameters up; return
    otherwise, so that the caller re-raises ``err``."""
    _check_finite(what, step, module, lr, probe, f"{err}; ", "", err)


def on_device(model: nn.Module, device) -> tuple[nn.Module, torch.device]:
    """``(model, device)``: the model itself when it already lives on ``device`` (or ``device`` is ``None``), else a
    copy moved there (the caller's model is never moved). Raises ``ValueError`` for an unknown or unavailable device
    (e.g. ``"cuda"`` without CUDA)."""
    import copy

    cur = next((t.device for t in (*model.parameters(), *model.buffers())), torch.device("cpu"))
    if device is None:
        return model, cur
    dev = check_device(device)
    if cur == dev or (cur.type == dev.type and dev.index is None):
        return model, cur
    return copy.deepcopy(model).to(dev), dev
