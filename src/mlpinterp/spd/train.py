"""The SPD optimisation loop (Bushnaq, Braun, Sharkey 2025, appendix pseudocode), for any ``nn.Module``.

Per step: sample a batch, run the target (recording the inputs of the decomposed weights), compute the causal
importances ``g`` of every subcomponent, draw ``n_mask_samples`` masks ``m = g + (1 - g) r``, and minimise
(:mod:`mlpinterp.spd.objective`)

``c_F L_faithfulness + c_R L_stochastic-recon + c_L L_stochastic-recon-layerwise + c_I L_importance-minimality``

with Adam (no weight decay) and a constant, ``cos(pi/2 * t / (T - 1))`` (the paper's) or cosine-annealing
``(1 + cos(pi t / (T - 1))) / 2`` (the current reference's) learning rate. The current SPD reference implementation's
recipe (goodfire-ai/spd, 2026) is available too: a *delta component* ``r (W - U V)`` per masked site with its own
uniform mask ``r`` (``delta_component``; its configs then drop the faithfulness loss, ``faithfulness_coeff=0``), and a
faithfulness warm-up of the subcomponents alone before step 0 (``faithfulness_warmup_steps`` AdamW steps), its lower
hard sigmoid clamped to [0, 1] (``lower_sigmoid``) and its two optimiser parameters per tied factor
(``tied_updates``). Batches come from
``sample(step)`` and the masks' ``r`` from a generator seeded by ``(seed, step)``, so a run is deterministic and an
interrupted run resumed from its atomic checkpoint (``out_dir/checkpoint.safetensors``) is bit-identical.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from mlpinterp.paramspace.components import resolve_sites, target_weight
from mlpinterp.spd.config import ADDED_FIELDS, DTYPES, SPDConfig, lr_at
from mlpinterp.spd.decomposition import Decomposition, resolve_reads
from mlpinterp.spd.losses import faithfulness_loss
from mlpinterp.spd.masks import mask_generator
from mlpinterp.spd.objective import spd_losses
from mlpinterp.utils.checkpoint import (
    TrainingDiverged,
    check_loss_finite,
    check_params_finite,
    explain_failure,
    load_training_state,
    on_device,
    save_training_state,
)
from mlpinterp.utils.progress import progress_bar
from mlpinterp.utils.validation import check_batch_tensor, nonfinite_names


@dataclass
class SPDResult:
    """Output of :func:`decompose`: the trained decomposition (on the CPU), the configuration, the metric history
    and the wall time in seconds (summed over resumed sessions)."""

    decomposition: Decomposition
    config: SPDConfig
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def faithfulness_warmup(dec: Decomposition, target_weights: dict[str, torch.Tensor], cfg: SPDConfig) -> list[float]:
    """The current SPD reference's warm-up: ``cfg.faithfulness_warmup_steps`` AdamW steps (``faithfulness_warmup_lr``,
    ``faithfulness_warmup_weight_decay``) on the faithfulness loss alone, over the subcomponents' ``U``, ``V`` only
    (the causal-importance MLPs are untouched). Deterministic; returns the loss before each step. Raises
    :class:`~mlpinterp.utils.checkpoint.TrainingDiverged` naming the warm-up's settings when a loss or a parameter
    is NaN or inf (``--lr`` does not set the warm-up's rate)."""
    params = list(dec.components.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.faithfulness_warmup_lr, weight_decay=cfg.faithfulness_warmup_weight_decay)
    losses = []
    for _ in range(cfg.faithfulness_warmup_steps):
        loss = faithfulness_loss(dec.components, target_weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    bad = nonfinite_names(dec.components.named_parameters())
    with torch.no_grad():
        final = float(faithfulness_loss(dec.components, target_weights))
    if bad or not all(math.isfinite(v) for v in (*losses, final)):
        what = f"parameters {bad[:4]} are NaN or inf" if bad else f"faithfulness loss {final}"
        err = TrainingDiverged(
            f"SPD faithfulness warm-up diverged ({what} after {cfg.faithfulness_warmup_steps} AdamW steps); lower "
            f"faithfulness_warmup_lr = {cfg.faithfulness_warmup_lr:g} or faithfulness_warmup_weight_decay = "
            f"{cfg.faithfulness_warmup_weight_decay:g}", 0)
        err.fix = ("lower faithfulness_warmup_lr or faithfulness_warmup_weight_decay in the SPDConfig (the presets' "
                   "0.01 and 0.1 are the reference's); no checkpoint was written")
        raise err
    return losses


def decompose(model: nn.Module, sample: Callable[[int], torch.Tensor], cfg: SPDConfig,
              out_dir: str | Path | None = None, quiet: bool = False,
              callback: Callable[[int, Decomposition, dict], None] | None = None,
              device: str | torch.device | None = None) -> SPDResult:
    """Run SPD on ``model`` (frozen) with batches ``sample(step) -> [batch_size, ...]``.

    Parameters
    ----------
    model
        Target network; never modified (it is copied when ``device`` or ``cfg.dtype`` differ from its own).
    sample
        Deterministic batch of each step (e.g. from :func:`mlpinterp.toys.step_generator`); moved to ``device``.
    cfg
        Hyperparameters.
    out_dir
        If given, ``out_dir/checkpoint.safetensors`` (+ ``.json``) is written atomically every
        ``cfg.checkpoint_every`` steps and at the end, and an existing checkpoint is resumed (on any device).
    quiet
        No progress bar.
    callback
        ``callback(step, decomposition, logs)`` at every logging step.
    device
        ``"cpu"``, ``"cuda"``, ... (``None``: the model's device).

    Raises
    ------
    ValueError
        On unknown targets, ``reads`` or ``tied`` sites, tied sites whose target weights are not transposes, an
        unavailable device, a batch the model rejects, a checkpoint written with another configuration or unusable
        (malformed, mis-shaped, non-finite; see :func:`mlpinterp.utils.checkpoint.load_training_state`), or when the
        training diverges (a NaN/inf loss or parameters: "SPD training diverged at step N ...; lower the learning
        rate"); no non-finite checkpoint is ever written.
    """
    if not isinstance(cfg, SPDConfig):
        raise TypeError(f"cfg must be an SPDConfig, got {type(cfg).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(sample):
        raise TypeError(f"sample must be a callable step -> [batch_size, ...] tensor, got {type(sample).__name__}")
    dtype = DTYPES[cfg.dtype]
    model, dev = on_device(model, device)
    if any(p.dtype != dtype for p in model.parameters()):
        import copy

        model = copy.deepcopy(model).to(dtype)
    sites = resolve_sites(model, cfg.targets)
    reads = resolve_reads(model, sites, dict(cfg.reads))
    target_weights = {s.name: target_weight(model, s).detach() for s in sites}
    dec = Decomposition(sites, cfg.C, cfg.d_gate, reads, generator=torch.Generator().manual_seed(cfg.seed),
                        init=cfg.init, tied={dst: src for src, dst in cfg.tied}, target_weights=target_weights,
                        tied_updates=cfg.tied_updates, lower_sigmoid=cfg.lower_sigmoid)
    dec.to(device=dev, dtype=dtype)
    opt = torch.optim.Adam(dec.parameters(), lr=cfg.lr)
    ckpt = Path(out_dir) / "checkpoint.safetensors" if out_dir is not None else None
    start, history, prev = 0, [], 0.0
    if ckpt is not None and ckpt.exists() and ckpt.with_suffix(".json").exists():
        start, history, prev = load_training_state(ckpt, dec, opt, asdict(cfg), prefix="spd", implicit=ADDED_FIELDS)
    t0 = time.perf_counter()
    if start == 0 and cfg.faithfulness_warmup_steps:  # a checkpoint is written after step 0, so after the warm-up
        warm = faithfulness_warmup(dec, target_weights, cfg)
        warm_logs = {"faithfulness_warmup_first": warm[0], "faithfulness_warmup_last": warm[-1]}
    else:
        warm_logs = {}
    # frozen only inside the try: a refused checkpoint or a diverged warm-up (above) leaves the caller's flags alone
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    model.requires_grad_(False)
    try:
        with progress_bar(cfg.steps, initial=start, desc="SPD", quiet=quiet) as bar:
            for step in range(start, cfg.steps):
                lr = lr_at(step, cfg)
                for g in opt.param_groups:
                    g["lr"] = lr
                x = sample(step)
                x = x.to(device=dev, dtype=dtype) if isinstance(x, torch.Tensor) else x
                x = check_batch_tensor(x, f"sample({step})", model if step == start else None)
                try:
                    total, logs = spd_losses(model, dec, x, cfg, target_weights, mask_generator(cfg.seed, step, dev))
                except ValueError as e:  # NaN/inf importances or masks: diverged if the parameters blew up
                    explain_failure("SPD", step, e, dec,
                                    lambda: faithfulness_loss(dec.components, target_weights), cfg.lr)
                    raise
                check_loss_finite("SPD", step, logs["total"], cfg.lr)  # read for the logs anyway: no extra sync
                opt.zero_grad(set_to_none=True)
                total.backward()
                opt.step()
                if step % cfg.log_every == 0 or step == cfg.steps - 1:
                    logs.update(step=step, lr=lr, **(warm_logs if step == 0 else {}))
                    history.append(logs)
                    bar.postfix(total=logs["total"], L0=logs["L0"])
                    if callback is not None:
                        callback(step, dec, logs)
                bar.advance()
                last = step == cfg.steps - 1
                if last or (ckpt is not None and (step + 1) % cfg.checkpoint_every == 0):
                    # never return or checkpoint NaN / inf (or parameters so large that they overflow)
                    check_params_finite("SPD", step, dec, cfg.lr,
                                        lambda: faithfulness_loss(dec.components, target_weights))
                    if ckpt is not None:
                        save_training_state(ckpt, dec, opt, step + 1, asdict(cfg), history,
                                            prev + time.perf_counter() - t0, prefix="spd")
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])
    return SPDResult(dec.cpu(), cfg, history, prev + time.perf_counter() - t0)


