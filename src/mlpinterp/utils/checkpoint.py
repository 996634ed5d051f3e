"""Resumable training state of a parameter decomposition (APD, SPD): module + optimiser + step + config + history.

One ``checkpoint.safetensors`` (the module's state dict as ``module.*``, the optimiser's per-parameter state as
``opt.<i>.<name>``) and its ``.json`` (step, configuration, metric history, wall seconds), written atomically by
:func:`mlpinterp.utils.io.save_tensors`. Data and masks come from per-step generators, so no RNG state is needed:
a resumed run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from mlpinterp.utils.io import load_tensors, save_tensors
from mlpinterp.utils.validation import check_device


def _norm(v):
    return [_norm(x) for x in v] if isinstance(v, (tuple, list)) else v


def save_training_state(path: Path, module: nn.Module, opt: torch.optim.Optimizer, step: int, config: dict,
                        history: list[dict], seconds: float, prefix: str = "comp") -> None:
    """Write the checkpoint atomically (``prefix`` names the module's tensors; APD's are ``comp.*``)."""
    tensors = {f"{prefix}.{k}": v.detach() for k, v in module.state_dict().items()}
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            tensors[f"opt.{i}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    save_tensors(path, tensors, {"step": step, "config": config, "history": history, "seconds": seconds})


def load_training_state(path: Path, module: nn.Module, opt: torch.optim.Optimizer, config: dict,
                        ignore: Iterable[str] = ("log_every", "checkpoint_every"),
                        prefix: str = "comp") -> tuple[int, list, float]:
    """Restore ``module`` and ``opt`` from ``path``; returns ``(step, history, seconds)``.

    Raises ``ValueError`` when the checkpoint was written with a different configuration (fields other than
    ``ignore``), naming the fields, or when it is corrupt (from :func:`mlpinterp.utils.io.load_tensors`).
    """
    tensors, meta = load_tensors(path)
    saved = meta.get("config", {})
    ignore = set(ignore)
    diff = {k for k in config if k not in ignore and _norm(saved.get(k)) != _norm(config[k])}
    if diff:
        raise ValueError(f"checkpoint {str(path)!r} was written with a different configuration (fields {sorted(diff)}); "
                         "use another out_dir or delete the checkpoint")
    dev = next((p.device for p in module.parameters()), torch.device("cpu"))
    n = len(prefix) + 1
    module.load_state_dict({k[n:]: v for k, v in tensors.items() if k.startswith(prefix + ".")})
    sd = opt.state_dict()
    state: dict = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, i, name = k.split(".", 2)
            state.setdefault(int(i), {})[name] = v if name == "step" else v.to(dev)
    sd["state"] = state
    opt.load_state_dict(sd)
    return int(meta["step"]), list(meta.get("history", [])), float(meta.get("seconds", 0.0))


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
