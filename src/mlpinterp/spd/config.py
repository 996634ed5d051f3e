"""The configuration of one SPD run (:class:`SPDConfig`) and what follows from it alone: the learning rate of each
step (:func:`lr_at`), overrides by field name (:func:`with_overrides`) and the behaviour of fields added after a
checkpoint was written (:data:`ADDED_FIELDS`). Every field is checked once, when the configuration is made."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mlpinterp.spd.decomposition import SPD_INITS
from mlpinterp.spd.sigmoids import LOWER_SIGMOIDS
from mlpinterp.spd.tying import TIED_UPDATES
from mlpinterp.utils.schedules import constant, cosine_half, cosine_quarter
from mlpinterp.utils.validation import Bool, Int, OneOf, Real, check_fields, check_real, replace_fields

DTYPES = {"float32": torch.float32, "float64": torch.float64}
LAYERWISE_MASKS = ("shared", "fresh")
#: SPDConfig fields added after the first release, with the behaviour before each (not always today's default:
#: ``compile`` was eager): a checkpoint written before a field existed resumes when the request keeps that behaviour
#: (``load_training_state``'s ``implicit``). Add a field here when it is added to SPDConfig.
ADDED_FIELDS = {"init": "scaled", "tied": (), "compile": False, "layerwise_masks": "shared",
                "delta_component": False, "faithfulness_warmup_steps": 0, "faithfulness_warmup_lr": 0.01,
                "faithfulness_warmup_weight_decay": 0.1, "lower_sigmoid": "leaky", "tied_updates": "summed"}
LR_SCHEDULES = ("cosine", "constant", "cosine-annealing")
LR_FACTORS = {"cosine": cosine_quarter, "cosine-annealing": cosine_half, "constant": constant}
"""The schedule factor of each ``lr_schedule`` (a function of ``(step, steps)``)."""


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


def lr_at(step: int, cfg: SPDConfig) -> float:
    """``lr`` (constant), ``lr cos(pi/2 * t)`` (cosine) or ``lr (1 + cos(pi t)) / 2`` (cosine-annealing), with
    ``t = step / (steps - 1)`` (``lr`` when ``steps == 1``): the factors of :mod:`mlpinterp.utils.schedules`, which
    raise ``ValueError`` for ``step < 0``."""
    return cfg.lr * LR_FACTORS[cfg.lr_schedule](step, cfg.steps)


def with_overrides(cfg: SPDConfig, **kw) -> SPDConfig:
    """``dataclasses.replace`` that rejects unknown field names with a ``ValueError``."""
    return replace_fields(cfg, SPDConfig, "an SPDConfig", **kw)
