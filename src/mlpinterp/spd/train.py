"""The SPD optimisation loop (Bushnaq, Braun, Sharkey 2025, appendix pseudocode), for any ``nn.Module``.

Per step: sample a batch, run the target (recording the inputs of the decomposed weights), compute the causal
importances ``g`` of every subcomponent, draw ``n_mask_samples`` masks ``m = g + (1 - g) r``, and minimise

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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from mlpinterp.paramspace.components import resolve_sites, target_weight
from mlpinterp.spd.decomposition import SPD_INITS, Decomposition, resolve_reads
from mlpinterp.spd.losses import (
    faithfulness_loss,
    importance_minimality_loss,
    layerwise_recon_loss,
    stochastic_recon_loss,
)
from mlpinterp.spd.masks import stochastic_mask
from mlpinterp.spd.sigmoids import LOWER_SIGMOIDS
from mlpinterp.spd.tying import TIED_UPDATES
from mlpinterp.toys.data import step_generator
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
from mlpinterp.utils.schedules import cosine_half, cosine_quarter
from mlpinterp.utils.validation import (
    Bool,
    Int,
    OneOf,
    Real,
    check_batch_tensor,
    check_fields,
    check_int,
    check_real,
    nonfinite_names,
)

DTYPES = {"float32": torch.float32, "float64": torch.float64}
LAYERWISE_MASKS = ("shared", "fresh")
#: SPDConfig fields added after the first release, with the behaviour before each (not always today's default:
#: ``compile`` was eager): a checkpoint written before a field existed resumes when the request keeps that behaviour
#: (``load_training_state``'s ``implicit``). Add a field here when it is added to SPDConfig.
ADDED_FIELDS = {"init": "scaled", "tied": (), "compile": False, "layerwise_masks": "shared",
                "delta_component": False, "faithfulness_warmup_steps": 0, "faithfulness_warmup_lr": 0.01,
                "faithfulness_warmup_weight_decay": 0.1, "lower_sigmoid": "leaky", "tied_updates": "summed"}
LR_SCHEDULES = ("cosine", "constant", "cosine-annealing")


@dataclass(frozen=True)
class SPDConfig:
    """Hyperparameters of one SPD run (defaults: the paper's TMS 5-2 preset)."""

    targets: tuple[str, ...] = ("W",)
    """Decomposed weights: nn.Linear module names or 2-D parameter names (tied ones included)."""
    reads: tuple[tuple[str, str], ...] = ()
    """(parameter site, module) pairs: the causal importance of that site reads the module's input ("" = model input, the default)."""
    C: int = 20
    """Rank-one subcomponents per decomposed weight."""
    d_gate: int = 16
    """GELU hidden units of each subcomponent's causal-importance MLP."""
    tied: tuple[tuple[str, str], ...] = ()
    """(source, tied) site pairs whose target weights are transposes of each other (TMS: linear1 = W, linear2 = W^T):
    the tied site's subcomponents are the source's transposed (U and V swapped), as in the SPD reference
    implementation; each site keeps its own causal importances and masks."""
    tied_updates: str = "summed"
    """How Adam trains a tied pair: "summed" (one set of factors, the gradients of both uses summed, one update) or
    "separate" (the SPD reference's: the tied site's own parameters over the source's storage, two Adam states and
    two updates per step; :mod:`mlpinterp.spd.tying`)."""
    lower_sigmoid: str = "leaky"
    """sigma_H,lower of the masks: "leaky" (the SPD paper's: slope 0.01 x below 0, value and gradient) or "clamped"
    (the current SPD reference's: value clamped to [0, 1], below 0 only a gradient that raises the value passes,
    times 0.01; :mod:`mlpinterp.spd.sigmoids`)."""
    init: str = "scaled"
    """Subcomponent initialisation: "scaled" (``U_c ~ N(0, 1/C)``, ``V_c ~ N(0, 1/d_in)``, as the current SPD
    reference: the summed weight starts with entry std ``1/sqrt(d_in)``) or "paper-era" (the reference of the
    paper's time, June 2025: ``U_c``, ``V_c`` random unit vectors and ``U_c`` scaled by ``U_c^T W V_c``, each
    subcomponent starting as the target's projection on it)."""
    steps: int = 40_000
    """Optimiser steps."""
    batch_size: int = 4096
    """Samples per step."""
    lr: float = 1e-3
    """Peak Adam learning rate."""
    lr_schedule: str = "cosine"
    """"cosine" (lr cos(pi/2 t/(T-1)), the SPD paper's), "cosine-annealing" (lr (1 + cos(pi t/(T-1))) / 2, the
    current reference's "cosine"; both reach zero at the last step) or "constant"."""
    faithfulness_coeff: float = 1.0
    """Coefficient of the faithfulness loss (parameter MSE)."""
    stochastic_recon_coeff: float = 1.0
    """Coefficient of the stochastic reconstruction loss (all sites masked)."""
    layerwise_recon_coeff: float = 1.0
    """Coefficient of the layerwise stochastic reconstruction loss (one site masked at a time)."""
    importance_minimality_coeff: float = 3e-3
    """Coefficient of the importance-minimality loss (beta_min)."""
    pnorm: float = 1.0
    """Exponent p > 0 of the importance-minimality loss."""
    output_loss: str = "mse"
    """Output distance of the reconstruction losses: "mse" or "kl" (logits)."""
    n_mask_samples: int = 1
    """Mask samples S per step."""
    delta_component: bool = False
    """Add the delta component ``r_b (W - sum_c U_c V_c^T)`` to every masked site, ``r_b ~ U(0, 1)`` per sample and
    site (drawn after the subcomponent masks, again for "fresh" layerwise masks): the current SPD reference's
    ``use_delta_component``. With every mask at 1, the delta's included, the masked model is the target."""
    faithfulness_warmup_steps: int = 0
    """AdamW steps on the faithfulness loss alone, over the subcomponents only, before step 0 (the current reference's
    warm-up; 0: none)."""
    faithfulness_warmup_lr: float = 0.01
    """Learning rate of the faithfulness warm-up."""
    faithfulness_warmup_weight_decay: float = 0.1
    """AdamW weight decay of the faithfulness warm-up."""
    layerwise_masks: str = "shared"
    """Masks of the layerwise loss: "shared" (the full loss's draw, reused) or "fresh" (a second, independent draw
    per mask sample, as the SPD reference implementation does)."""
    dtype: str = "float32"
    """Floating-point type of the decomposition, the target copy and the batches: "float32" or "float64"."""
    compile: bool = False
    """Run the causal-importance MLPs (the step's hot path) through ``torch.compile``: faster steps on the CPU
    (``docs/measurements.md``) for a few seconds of compilation; same values to float32 rounding."""
    seed: int = 0
    """Seed of the initialisation and of the masks' uniform noise."""
    log_every: int = 500
    """Record metrics every this many steps (and at the first and last step)."""
    checkpoint_every: int = 2000
    """Write a checkpoint every this many steps when out_dir is given."""

    def __post_init__(self) -> None:
        check_fields(self, {
            ("C", "d_gate", "steps", "batch_size", "n_mask_samples", "log_every", "checkpoint_every"): Int(1),
            "seed": Int(None), "lr": Real(0.0, lo_open=True), "faithfulness_warmup_steps": Int(0),
            "faithfulness_warmup_lr": Real(0.0, lo_open=True), "faithfulness_warmup_weight_decay": Real(0.0),
            ("faithfulness_coeff", "stochastic_recon_coeff", "layerwise_recon_coeff",
             "importance_minimality_coeff"): Real(0.0),
            "lr_schedule": OneOf(LR_SCHEDULES), "layerwise_masks": OneOf(LAYERWISE_MASKS),
            "output_loss": OneOf(("mse", "kl"), either=True), ("compile", "delta_component"): Bool(), "init": OneOf(SPD_INITS),
            "dtype": OneOf(sorted(DTYPES)), "tied_updates": OneOf(TIED_UPDATES),
            "lower_sigmoid": OneOf(tuple(LOWER_SIGMOIDS))})
        check_real(self.pnorm, "pnorm (importance-minimality exponent p)", 0.0, lo_open=True)
        t = self.targets
        if isinstance(t, str) or not isinstance(t, (tuple, list)) or not t or not all(isinstance(v, str) for v in t):
            raise TypeError(f"targets must be a non-empty tuple of module/parameter names (str), got {t!r}")
        for name, what in (("reads", "(site, module)"), ("tied", "(source site, tied site)")):
            r = getattr(self, name)
            if isinstance(r, str) or not isinstance(r, (tuple, list)) or not all(
                    isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(v, str) for v in p) for p in r):
                raise TypeError(f"{name} must be a tuple of {what} string pairs, got {r!r}")
            object.__setattr__(self, name, tuple(tuple(p) for p in r))
        tied_sites = [p[1] for p in self.tied]
        if len(set(tied_sites)) != len(tied_sites):
            raise ValueError(f"tied: a site can be tied to one source only, got {self.tied!r}")
        object.__setattr__(self, "targets", tuple(t))


@dataclass
class SPDResult:
    """Output of :func:`decompose`: the trained decomposition (on the CPU), the configuration, the metric history
    and the wall time in seconds (summed over resumed sessions)."""

    decomposition: Decomposition
    config: SPDConfig
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def lr_at(step: int, cfg: SPDConfig) -> float:
    """``lr`` (constant), ``lr cos(pi/2 * t)`` (cosine) or ``lr (1 + cos(pi t)) / 2`` (cosine-annealing), with
    ``t = step / (steps - 1)`` (``lr`` when ``steps == 1``)."""
    check_int(step, "step", minimum=0)
    if cfg.lr_schedule == "constant" or cfg.steps == 1:
        return cfg.lr
    if cfg.lr_schedule == "cosine-annealing":
        return cfg.lr * cosine_half(step, cfg.steps, zero_at_last_step=True)
    return cfg.lr * cosine_quarter(step, cfg.steps)


def spd_losses(model: nn.Module, dec: Decomposition, x: torch.Tensor, cfg: SPDConfig,
               target_weights: dict[str, torch.Tensor],
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and its named terms for one batch ``x`` (also ``L0``: mean number of subcomponents per sample and
    site with causal importance > 0, summed over sites)."""
    with torch.no_grad():
        target_out, acts = dec.target_forward(model, x)
    comps = dec.components
    g_low, g_up = dec.causal_importance(acts, cfg.compile)
    terms = {"faithfulness": faithfulness_loss(comps, target_weights),
             "importance_minimality": importance_minimality_loss(g_up, cfg.pnorm)}
    rec = lay = 0.0
    for _ in range(cfg.n_mask_samples):
        masks, delta = draw_masks(g_low, cfg.delta_component, generator)
        r = stochastic_recon_loss(model, comps, x, masks, target_out, cfg.output_loss, delta)
        rec = rec + r
        if cfg.layerwise_masks == "fresh":  # the reference's second, independent draw
            masks, delta = draw_masks(g_low, cfg.delta_component, generator)
        # with a single site and the same masks the layerwise loss is the full one: not computed twice
        lay = lay + (r if cfg.layerwise_masks == "shared" and len(comps.sites) == 1 else
                     layerwise_recon_loss(model, comps, x, masks, target_out, cfg.output_loss, delta))
    terms["stochastic_recon"] = rec / cfg.n_mask_samples
    terms["layerwise_recon"] = lay / cfg.n_mask_samples
    total = (cfg.faithfulness_coeff * terms["faithfulness"] + cfg.stochastic_recon_coeff * terms["stochastic_recon"]
             + cfg.layerwise_recon_coeff * terms["layerwise_recon"]
             + cfg.importance_minimality_coeff * terms["importance_minimality"])
    logs = {k: float(v.detach()) for k, v in terms.items()}
    logs["total"] = float(total.detach())
    logs["L0"] = float(sum((g > 0).sum(-1).float().mean() for g in g_low.values()))
    return total, logs


def draw_masks(g_low: dict[str, torch.Tensor], delta_component: bool, generator: torch.Generator | None = None
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """One draw: the subcomponent masks ``{site: g + (1 - g) r}`` (``[batch, C]``, sites in order), then, with
    ``delta_component``, the delta component's masks ``{site: r ~ U(0, 1)}`` (``[batch]``), else ``None``."""
    masks = {k: stochastic_mask(g, generator) for k, g in g_low.items()}
    if not delta_component:
        return masks, None
    return masks, {k: torch.rand(g.shape[:-1], generator=generator, dtype=g.dtype, device=g.device)
                   for k, g in g_low.items()}


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


def mask_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    """The generator of step ``step``'s mask noise: depends only on ``(seed, step)`` (on ``device``)."""
    g = torch.Generator(device=device)
    g.manual_seed(step_generator(seed + 4_242, step).initial_seed())
    return g


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


def with_overrides(cfg: SPDConfig, **kw) -> SPDConfig:
    """``dataclasses.replace`` that rejects unknown field names with a ``ValueError``."""
    if not isinstance(cfg, SPDConfig):
        raise TypeError(f"cfg must be an SPDConfig, got {type(cfg).__name__}")
    unknown = set(kw) - set(asdict(cfg))
    if unknown:
        raise ValueError(f"unknown SPDConfig fields {sorted(unknown)}")
    return replace(cfg, **kw)
