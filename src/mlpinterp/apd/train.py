"""The APD optimisation loop (Braun et al. 2025, Sec. 2.2, App. A.3), for any ``nn.Module``.

Per step: sample a batch, run the target, compute gradient attributions of every component (batched forward
mode), select components with batch or per-sample top-k, run the sparse forward with only those, and minimise
``c_F L_faithfulness + c_M L_minimality + c_S L_simplicity (+ c_H L_hidden)`` with AdamW, linear warm-up and a
constant or cosine schedule. The Lp variant replaces top-k by ``L_Lp`` penalties on attributions.

Runs are deterministic given the seed (each step's batch comes from ``sample(step)``) and resumable: with an
``out_dir`` an atomic checkpoint (factors + AdamW state + step + history) is written every
``checkpoint_every`` steps and picked up again by a rerun with the same configuration.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from mlpinterp.apd.attributions import SOURCES, attributions
from mlpinterp.apd.losses import (
    SCHATTEN_MODES,
    act_recon_loss,
    lp_minimality_loss,
    lp_simplicity_loss,
    simplicity_loss,
)
from mlpinterp.apd.masks import batch_topk_mask, topk_mask
from mlpinterp.paramspace.components import INITS, Components, resolve_sites, target_weight
from mlpinterp.paramspace.forward import capture_outputs, run_with_components
from mlpinterp.paramspace.losses import faithfulness_loss, minimality_loss
from mlpinterp.utils.checkpoint import (
    check_loss_finite,
    check_params_finite,
    explain_failure,
    load_training_state,
    on_device,
    save_training_state,
)
from mlpinterp.utils.progress import progress_bar
from mlpinterp.utils.schedules import cosine_half, cosine_quarter, linear_warmup
from mlpinterp.utils.validation import Bool, Int, Real, check_batch_tensor, check_fields, replace_fields

LR_SCHEDULES = ("constant", "cosine", "quarter_cosine")
#: APDConfig fields added after the first release, with the behaviour before each: a checkpoint written before a
#: field existed resumes when the request keeps that behaviour (``load_training_state``'s ``implicit``). Add a field
#: here when it is added to APDConfig.
ADDED_FIELDS = {"init": "scaled", "init_instances": 3}


@dataclass(frozen=True)
class APDConfig:
    """Hyperparameters of one APD run (defaults: the paper's TMS 5-2 preset, App. D.1)."""

    targets: tuple[str, ...] = ("W",)
    """Decomposed weights: ``nn.Linear`` module names or 2-D parameter names."""
    C: int = 5
    """Number of parameter components."""
    m: int | None = None
    """Inner rank of each component at each site; ``None`` = full rank ``min(d_out, d_in)``."""
    steps: int = 20_000
    """Optimiser steps."""
    batch_size: int = 2048
    """Samples per step."""
    lr: float = 3e-2
    """Peak learning rate."""
    lr_schedule: str = "constant"
    """After warm-up: ``"constant"``, ``"cosine"`` (half period to zero) or ``"quarter_cosine"`` (the APD reference's ``cos(π/2 t/(T-1))``)."""
    warmup_frac: float = 0.05
    """Fraction of steps with a linear learning-rate warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay on the factors."""
    sparsity: str = "topk"
    """``"topk"`` (the paper's main formulation) or ``"lp"`` (App. A.4)."""
    topk: float = 0.211
    """Batch top-k: mean active components per sample; per-sample top-k: integer k."""
    batch_topk: bool = True
    """Select over the whole batch (Bussmann et al. 2024) rather than per sample."""
    faithfulness_coeff: float = 1.0
    """Coefficient of the faithfulness loss."""
    minimality_coeff: float = 1.0
    """Coefficient of the minimality (top-k reconstruction) loss."""
    simplicity_coeff: float = 0.7
    """Coefficient of the Schatten-p simplicity loss."""
    schatten_p: float = 1.0
    """Schatten exponent ``p`` of the simplicity loss."""
    schatten_mode: str = "exact"
    """``"exact"`` (eigenvalues of the m x m Gram product) or ``"factor"`` (paper's surrogate)."""
    output_loss: str = "mse"
    """Minimality distance: ``"mse"`` or ``"kl"`` (logits)."""
    act_recon_coeff: float = 0.0
    """Coefficient of the hidden-activation reconstruction loss (0 disables)."""
    act_names: tuple[str, ...] = ()
    """Modules whose outputs are reconstructed (e.g. ``("layers.0.act",)``)."""
    lp_p1: float = 1.0
    """Lp variant: exponent of the attributions."""
    lp_p2: float = 1.0
    """Lp variant: Schatten exponent."""
    attribution_source: str = "target"
    """Attributions at ``theta*`` (``"target"``) or at the summed components (``"apd"``)."""
    unit_norm_B: bool = False
    """Renormalise the rows of ``B`` (reading factors) to unit norm after every step (paper, resid-MLP-1)."""
    init_scale: float = 1.0
    """Initial scale of the ``A`` factors."""
    init: str = "scaled"
    """Factor initialisation: ``"scaled"`` (sum starts at nn.Linear scale) or ``"reference"`` (the reference's small 4-D Xavier)."""
    init_instances: int = 3
    """``init="reference"``: model instances in the reference's Xavier fan-out ``[instances, C, d, m]``."""
    chunk_size: int | None = None
    """Components propagated at once in the attribution pass (``None``: all)."""
    seed: int = 0
    """Seed of the initialisation (the data stream is the caller's ``sample(step)``)."""
    log_every: int = 200
    """Record metrics every this many steps (and at the last step)."""
    checkpoint_every: int = 2000
    """Write a checkpoint every this many steps when ``out_dir`` is given."""

    def validate(self) -> None:
        """Raise ``TypeError``/``ValueError`` naming the first ill-typed or inconsistent field."""
        positive = Int(1, range_what="positive (an int >= 1)")
        check_fields(self, {
            ("C", "steps", "batch_size", "log_every", "checkpoint_every"): positive, "seed": Int(None),
            ("m", "chunk_size"): Int(1, range_what="positive (an int >= 1)", optional=True), "init_instances": positive,
            ("lr", "init_scale"): Real(0.0, lo_open=True, range_what="> 0"),
            ("weight_decay", "faithfulness_coeff", "minimality_coeff", "simplicity_coeff", "act_recon_coeff"):
                Real(0.0, range_what=">= 0"),
            ("warmup_frac", "topk", "schatten_p", "lp_p1", "lp_p2"): Real(range_what="finite"),
            ("batch_topk", "unit_norm_B"): Bool()})
        for name in ("targets", "act_names"):
            v = getattr(self, name)
            if isinstance(v, str) or not isinstance(v, (tuple, list)) or not all(isinstance(t, str) for t in v):
                raise TypeError(f"{name} must be a tuple of module/parameter names (str), got {v!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if not 0.0 <= self.warmup_frac < 1.0:
            raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if self.sparsity not in ("topk", "lp"):
            raise ValueError(f"sparsity must be 'topk' or 'lp', got {self.sparsity!r}")
        if self.sparsity == "topk":
            if self.batch_topk and not 0 < self.topk <= self.C:
                raise ValueError(f"topk (batch top-k) must be in (0, C={self.C}], got {self.topk}")
            if self.batch_topk and int(self.topk * self.batch_size) < 1:
                raise ValueError(f"topk * batch_size = {self.topk * self.batch_size} selects no component")
            if not self.batch_topk and (int(self.topk) != self.topk or not 1 <= self.topk <= self.C):
                raise ValueError(f"topk (per-sample) must be an integer in [1, C={self.C}], got {self.topk}")
        if self.schatten_mode not in SCHATTEN_MODES:
            raise ValueError(f"schatten_mode must be one of {SCHATTEN_MODES}, got {self.schatten_mode!r}")
        if self.schatten_p <= 0 or self.lp_p1 <= 0 or self.lp_p2 <= 0:
            raise ValueError("schatten_p, lp_p1 and lp_p2 must be > 0")
        if self.output_loss not in ("mse", "kl"):
            raise ValueError(f"output_loss must be 'mse' or 'kl', got {self.output_loss!r}")
        if self.attribution_source not in SOURCES:
            raise ValueError(f"attribution_source must be one of {SOURCES}, got {self.attribution_source!r}")
        if self.act_recon_coeff > 0 and not self.act_names:
            raise ValueError("act_recon_coeff > 0 needs act_names (modules whose outputs to reconstruct)")


@dataclass
class APDResult:
    """Output of :func:`decompose`: the components, the metric history and the wall time (s, summed over
    resumed sessions)."""

    components: Components
    config: APDConfig
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def lr_at(step: int, cfg: APDConfig) -> float:
    """Learning rate at ``step``: linear warm-up ``lr (step + 1) / w`` over ``w = int(warmup_frac * steps)`` steps, then
    constant, cosine ``lr (1 + cos(π t / T')) / 2`` or quarter cosine ``lr cos(π/2 · t / (T' - 1))`` (the APD
    reference's schedule, 0 at the last step), with ``t = step - w`` and ``T' = steps - w``."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    warm = int(cfg.warmup_frac * cfg.steps)
    if step < warm:
        return cfg.lr * linear_warmup(step, warm)
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "quarter_cosine":
        return cfg.lr * cosine_quarter(step - warm, cfg.steps - warm)
    return cfg.lr * cosine_half(step - warm, cfg.steps - warm, zero_at_last_step=False)


def select_mask(attr: torch.Tensor, cfg: APDConfig) -> torch.Tensor:
    """Top-k mask ``[batch, C]`` according to ``cfg.topk`` / ``cfg.batch_topk``."""
    return batch_topk_mask(attr, cfg.topk) if cfg.batch_topk else topk_mask(attr, int(cfg.topk))


def apd_losses(model: nn.Module, comps: Components, x: torch.Tensor, cfg: APDConfig,
               target_weights: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and its named terms for one batch ``x`` (also ``L0``: mean active components per sample)."""
    act_names = list(cfg.act_names) if cfg.act_recon_coeff > 0 else []
    with torch.no_grad(), capture_outputs(model, act_names) as t_acts:
        target_out = model(x)
        target_acts = dict(t_acts)
    terms: dict[str, torch.Tensor] = {"faithfulness": faithfulness_loss(comps, target_weights)}
    total = cfg.faithfulness_coeff * terms["faithfulness"]
    if cfg.sparsity == "topk":
        with torch.no_grad():
            attr = attributions(model, comps, x, cfg.attribution_source, cfg.chunk_size)
            mask = select_mask(attr, cfg)
        coef = mask.to(x.dtype)
        with capture_outputs(model, act_names) as s_acts:
            out = run_with_components(model, comps, x, coef, base=False)
            acts = dict(s_acts)
        terms["minimality"] = minimality_loss(out, target_out, cfg.output_loss)
        terms["simplicity"] = simplicity_loss(comps, mask, cfg.schatten_p, cfg.schatten_mode)
        total = total + cfg.minimality_coeff * terms["minimality"] + cfg.simplicity_coeff * terms["simplicity"]
        l0 = float(mask.sum(1).float().mean())
    else:
        attr = attributions(model, comps, x, cfg.attribution_source, cfg.chunk_size)
        with capture_outputs(model, act_names) as s_acts:
            run_with_components(model, comps, x, None, base=False) if act_names else None
            acts = dict(s_acts)
        terms["lp_minimality"] = lp_minimality_loss(attr, cfg.lp_p1)
        terms["lp_simplicity"] = lp_simplicity_loss(comps, attr, cfg.lp_p1, cfg.lp_p2, cfg.schatten_mode)
        total = total + cfg.minimality_coeff * terms["lp_minimality"] + cfg.simplicity_coeff * terms["lp_simplicity"]
        l0 = float((attr > 1e-6 * attr.amax().clamp_min(1e-30)).sum(1).float().mean())
    if act_names:
        terms["act_recon"] = act_recon_loss(acts, target_acts)
        total = total + cfg.act_recon_coeff * terms["act_recon"]
    logs = {k: float(v.detach()) for k, v in terms.items()}
    logs["total"] = float(total.detach())
    logs["L0"] = l0
    return total, logs


def decompose(model: nn.Module, sample: Callable[[int], torch.Tensor], cfg: APDConfig,
              out_dir: str | Path | None = None, quiet: bool = False,
              callback: Callable[[int, Components, dict], None] | None = None,
              device: str | torch.device | None = None) -> APDResult:
    """Run APD on ``model`` (frozen) with batches ``sample(step) -> [batch_size, ...]``.

    Parameters
    ----------
    model
        Target network; its parameters are not modified (``requires_grad`` is restored on exit).
    sample
        Deterministic batch for each step (e.g. from :func:`mlpinterp.toys.step_generator`).
    cfg
        Hyperparameters (validated first).
    out_dir
        If given, ``out_dir/checkpoint.safetensors`` (+ ``.json``) is written atomically every
        ``cfg.checkpoint_every`` steps and at the end, and an existing checkpoint is resumed.
    quiet
        Disable the progress bar.
    callback
        Called as ``callback(step, components, logs)`` at every logging step.
    device
        Where to train (``"cuda"``, ``"cpu"``; ``None``: the model's device). The model is copied there if it lives
        elsewhere, batches are moved there, and the returned components are on the CPU. A checkpoint resumes on
        any device.

    Raises
    ------
    ValueError
        On an invalid configuration, unknown targets, an unavailable device, a checkpoint written with another
        configuration or unusable (malformed, mis-shaped, non-finite; see
        :func:`mlpinterp.utils.checkpoint.load_training_state`), or when the training diverges (a NaN/inf loss or
        parameters: "APD training diverged at step N ...; lower the learning rate"); no non-finite checkpoint is
        ever written.
    """
    if not isinstance(cfg, APDConfig):
        raise TypeError(f"cfg must be an APDConfig, got {type(cfg).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(sample):
        raise TypeError(f"sample must be a callable step -> [batch_size, ...] tensor, got {type(sample).__name__}")
    cfg.validate()
    model, dev = on_device(model, device)
    sites = resolve_sites(model, cfg.targets)
    if cfg.act_recon_coeff > 0 and any(s.kind == "param" for s in sites):
        raise ValueError("hidden-activation reconstruction is only supported when every target is an nn.Linear")
    gen = torch.Generator().manual_seed(cfg.seed)
    comps = Components(sites, cfg.C, cfg.m, init_scale=cfg.init_scale, generator=gen, init=cfg.init,
                       instances=cfg.init_instances)
    if cfg.unit_norm_B:
        comps.normalize_B_()
    comps.to(dev)
    target_weights = {s.name: target_weight(model, s).detach() for s in sites}
    opt = torch.optim.AdamW(comps.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    ckpt = Path(out_dir) / "checkpoint.safetensors" if out_dir is not None else None
    start, history, prev_seconds = 0, [], 0.0
    if ckpt is not None and ckpt.exists() and ckpt.with_suffix(".json").exists():
        start, history, prev_seconds = load_training_state(ckpt, comps, opt, asdict(cfg), implicit=ADDED_FIELDS)
    t0 = time.perf_counter()
    # frozen only inside the try: a refused checkpoint (above) leaves the caller's flags alone
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    model.requires_grad_(False)
    try:
        with progress_bar(cfg.steps, initial=start, desc="APD", quiet=quiet) as bar:
            for step in range(start, cfg.steps):
                _apd_step(model, comps, opt, sample, cfg, target_weights, step, start, history, bar, callback)
                last = step == cfg.steps - 1
                if last or (ckpt is not None and (step + 1) % cfg.checkpoint_every == 0):
                    # never return or checkpoint NaN / inf (or parameters so large that they overflow)
                    check_params_finite("APD", step, comps, cfg.lr, lambda: faithfulness_loss(comps, target_weights))
                    if ckpt is not None:
                        save_training_state(ckpt, comps, opt, step + 1, asdict(cfg), history,
                                            prev_seconds + time.perf_counter() - t0)
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(flags[n])
    return APDResult(comps.cpu(), cfg, history, prev_seconds + time.perf_counter() - t0)


def _apd_step(model, comps, opt, sample, cfg, target_weights, step, start, history, bar, callback) -> None:
    """One optimiser step of :func:`decompose` (logs into ``history`` every ``cfg.log_every`` steps)."""
    lr = lr_at(step, cfg)
    for g in opt.param_groups:
        g["lr"] = lr
    x = sample(step)
    x = x.to(target_weights[comps.sites[0].name].device) if isinstance(x, torch.Tensor) else x
    x = _check_batch(model, x, step, first=step == start)
    try:
        total, logs = apd_losses(model, comps, x, cfg, target_weights)
    except ValueError as e:  # NaN/inf attributions or masks: diverged if the parameters blew up
        explain_failure("APD", step, e, comps, lambda: faithfulness_loss(comps, target_weights), cfg.lr)
        raise
    check_loss_finite("APD", step, logs["total"], cfg.lr)  # already read for the logs: no extra synchronisation
    opt.zero_grad(set_to_none=True)
    total.backward()
    opt.step()
    if cfg.unit_norm_B:
        comps.normalize_B_()
    if step % cfg.log_every == 0 or step == cfg.steps - 1:
        logs.update(step=step, lr=lr)
        history.append(logs)
        bar.postfix(**{k: logs[k] for k in ("total", "L0") if k in logs})
        if callback is not None:
            callback(step, comps, logs)
    bar.advance()


def _check_batch(model: nn.Module, x, step: int, first: bool) -> torch.Tensor:
    """``sample(step)`` must return a finite floating-point ``[batch, ...]`` tensor (on the first step also one that the
    model accepts)."""
    return check_batch_tensor(x, f"sample({step})", model if first else None)


def with_overrides(cfg: APDConfig, **kw) -> APDConfig:
    """``dataclasses.replace`` that rejects unknown field names with a ``ValueError``."""
    return replace_fields(cfg, APDConfig, "an APDConfig", **kw)
