"""Mutual Feature Regularization trainer (Marks et al. 2024, "Enhancing Neural Network Interpretability with
Feature-Aligned Sparse Autoencoders", arXiv 2411.01220, sec. 3).

``N`` TopK SAEs are trained on the same batches. Two additions to the usual per-SAE loss
(reconstruction + ``auxk_alpha`` * AuxK):

* **Penalty** (sec. 3, eq. 2): ``alpha(t) / C(N, 2) * sum_{i<j} (1 - MMCS(W_i, W_j))`` on the decoder
  dictionaries, with Hungarian-matched cosine similarity (gradients through the matched cosines) and a cosine
  warm-up ``alpha(t) = alpha * (1 - cos(pi * min(t, T) / T)) / 2`` over ``T = warmup_steps``. ``alpha`` is either
  given or chosen at step 0 so that ``alpha * penalty_0 = reconstruction_0`` (mean over the SAEs).
* **Re-initialisation** (sec. 3.3): every ``inactivity_window`` steps each SAE's firing rates ``r_j`` after
  TopK over the window are scored by an inactivity measure (default: the paper's example, the mean deviation
  of the activation frequency from the uniform ``k / d_sae``, relative to it: ``mean_j |r_j / (k / d_sae) - 1|``,
  with the paper's threshold 1; the cubed deviation is an option, see :data:`mlpinterp.sae.inactivity.INACTIVITY_MEASURES`). An SAE
  whose measure *exceeds* ``inactivity_threshold`` is re-initialised whole, with a fresh optimiser;
  ``reinit_events`` / ``n_reinits`` count it.

Optimiser (``optimizer``): ``"signum_schedulefree"`` (default; :class:`mlpinterp.sae.optim.ScheduleFreeSignum`,
EleutherAI sparsify's default recipe, lr ``5e-3 / sqrt(d_sae / 2**14)``, with the average weighing step ``t`` in
proportion to ``t**average_power``, linearly by default, where sparsify's is uniform) or ``"adam"`` (constant lr
``2e-4 / sqrt(d_sae / 2**14)``, Gao et al. 2024). With the schedule-free optimiser the parameters hold the training
point during training, renormalised before each forward (sparsify's order); SAEs are saved and should be evaluated
at the average, inside :meth:`MfrTrainer.averaged`. With Adam the decoder is renormalised after each step.

Input normalisation (``normalize_activations="expected_average_only_in"``, SAELens's name for it): before the
first step the trainer estimates ``s = sqrt(d_in) / E||x||`` from the first ``norm_batches`` batches
(:meth:`MfrTrainer.estimate_input_scale`), so that ``E||s x|| = sqrt(d_in)``; every SAE then computes on ``s x``
and reports reconstructions and metrics in the original units (the scale is saved in ``cfg.json``).

Mixed precision: ``train_step`` works under ``torch.autocast(device, dtype=torch.bfloat16)`` (the encoder matmul runs
in bf16, gradients and the decoder in the parameters' dtype); float16 autocast is refused up front (no loss
scaling). bf16 *parameters* (``dtype=torch.bfloat16``) work too.

``penalty=False, reinit=False`` gives the baseline: the same SAEs on the same data, trained independently.
``n_saes=1`` with both off is plain TopK SAE training (``mlpinterp sae train``).

Distributed (``torchrun``; gloo on CPU, NCCL on GPU), see :class:`mlpinterp.sae.distributed.Distributed`:

* ``mode="ddp"``: every rank holds all SAEs wrapped in ``DistributedDataParallel`` and gets ``1/world`` of
  each batch; FVU and AuxK denominators are reduced across ranks so the averaged gradient is exactly the
  full-batch gradient (losses equal those of one process up to float rounding).
* ``mode="ensemble"``: rank ``r`` owns SAEs ``i % world == r`` and sees the whole batch; decoders are
  all-gathered for the penalty. Rank ``r`` differentiates ``sum_{i owned} sum_{j != i} (1 - MMCS(W_i, sg(W_j)))``
  (``sg`` = stop-gradient), which gives every owned ``W_i`` exactly the gradient of the full penalty.

This module is longer than the project's 500-line guide because :class:`MfrTrainer` is one object whose step,
penalty, re-initialisation and checkpoint methods read and write the same state (SAEs, optimisers, counts,
history); the stateless parts live beside it (:mod:`~mlpinterp.sae.inactivity`, :mod:`~mlpinterp.sae.mfr_penalty`,
:mod:`~mlpinterp.sae.distributed`).
"""

from __future__ import annotations

import itertools
import math
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from mlpinterp.sae.distributed import Distributed, _sum_ranks
from mlpinterp.sae.inactivity import (
    INACTIVITY_MEASURES,
    should_reinit,
)
from mlpinterp.sae.io import check_provenance, sae_artifact
from mlpinterp.sae.metrics import firing_counts
from mlpinterp.sae.mfr_penalty import pair_dissimilarity
from mlpinterp.sae.optim import ScheduleFreeSignum
from mlpinterp.sae.topk import SaeConfig, TopKSae
from mlpinterp.utils.artifact import Artifact, ArtifactError, load_artifact, save_artifacts
from mlpinterp.utils.checkpoint import (
    TrainingDiverged,
    optimizer_tensors,
    restore_optimizer,
    split_optimizer_tensors,
)
from mlpinterp.utils.config_diff import config_diff
from mlpinterp.utils.schedules import cosine_half_rise
from mlpinterp.utils.seeding import splitmix_seed
from mlpinterp.utils.validation import Int, OneOf, check_fields, nonfinite_names

CHECKPOINT_KIND = "mfr_checkpoint"
"""Artifact kind of the trainer state ``trainer_rank{r}.safetensors`` (:mod:`mlpinterp.utils.artifact`)."""


def _flat(d: dict, prefix: str = "") -> dict:
    """``{"sae": {"k": 4}}`` -> ``{"sae.k": 4}`` (for naming the differing fields of two configs)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _read_trainer_state(meta: dict, tensors: dict[str, Tensor], trainer: MfrTrainer) -> dict:
    """The trainer state a checkpoint holds (:meth:`MfrTrainer.save_checkpoint`), read and checked against
    ``trainer`` (its SAEs' parameter names and shapes, the firing-count shapes). Raises ``ValueError`` (a missing
    metadata entry, a wrong length or shape), ``KeyError`` (a missing tensor) or ``TypeError`` on a malformed file;
    changes nothing."""
    def shaped(name: str, like: Tensor) -> Tensor:
        v = tensors[name]
        if tuple(v.shape) != tuple(like.shape):
            raise ValueError(f"tensor {name!r} has shape {list(v.shape)}, these SAEs need {list(like.shape)}")
        return v

    missing = [k for k in ("step", "alpha", "n_reinits", "window_samples", "history", "reinit_events", "checks",
                           "assignments") if k not in meta]
    if missing:
        raise ValueError(f"metadata lacks {missing}")
    n_reinits = [int(v) for v in meta["n_reinits"]]
    if len(n_reinits) != len(trainer.n_reinits):
        raise ValueError(f"n_reinits has {len(n_reinits)} entries, not one per SAE ({len(trainer.n_reinits)})")
    history, events, checks = meta["history"], meta["reinit_events"], meta["checks"]
    if not all(isinstance(v, list) for v in (history, events, checks)):
        raise TypeError("history, reinit_events and checks must be lists")
    state = {"input_scale": meta.get("input_scale", 1.0), "step": int(meta["step"]), "n_reinits": n_reinits,
             "alpha": None if meta["alpha"] is None else float(meta["alpha"]),
             "window_samples": int(meta["window_samples"]), "bias_pending": set(meta.get("bias_pending", [])),
             "history": history, "reinit_events": events, "checks": checks,
             "assignments": {tuple(int(s) for s in k.split(",")): (np.array(v[0]), np.array(v[1]))
                             for k, v in dict(meta["assignments"]).items()},
             "window_counts": shaped("window_counts", trainer.window_counts),
             "since_fired": shaped("since_fired", trainer.since_fired), "params": [], "adam": []}
    for local, sae in enumerate(trainer.saes):
        i = trainer.owned[local]
        state["params"].append({n: shaped(f"sae{i}.param.{n}", v) for n, v in sae.state_dict().items()})
        adam, unknown = split_optimizer_tensors(tensors, trainer.opts[local], f"sae{i}.opt")
        if unknown:
            raise ValueError(f"optimiser state {unknown[:3]} belongs to no parameter of SAE {i}")
        state["adam"].append(adam)
    return state


# ----------------------------------------------------------------------------- config
#: :class:`MfrConfig` fields (flattened, as in checkpoints) added after checkpoints first recorded the configuration,
#: each with the behaviour of a checkpoint without it (not necessarily today's default): a checkpoint that lacks one
#: resumes when the request keeps that behaviour, and is refused, naming it, when it asks for another.
ADDED_FIELDS = {
    "optimizer": "adam",  # without it: every run was trained with Adam
    "init_b_dec_to_mean": False,  # without it: b_dec starts at zero
    "normalize_activations": "none",  # without it (and norm_batches): inputs are not rescaled
    "norm_batches": 10,
    "average_power": 0.0,  # without it: the schedule-free average was uniform
}


@dataclass(frozen=True)
class MfrConfig:
    """Training configuration of N TopK SAEs with (or without) Mutual Feature Regularization."""

    sae: SaeConfig = field(default_factory=SaeConfig)
    """Configuration shared by every SAE."""

    n_saes: int = 2
    """N: SAEs trained in parallel on the same batches."""

    optimizer: Literal["signum_schedulefree", "adam"] = "signum_schedulefree"
    """'signum_schedulefree' (sparsify's default recipe) or 'adam' (constant learning rate)."""

    lr: float | None = None
    """Learning rate; None means ``c / sqrt(d_sae / 2**14)`` (Gao et al. 2024 scaling, as sparsify) with
    ``c = 5e-3`` for signum_schedulefree and ``2e-4`` for adam (sparsify's constants)."""

    average_power: float = 1.0
    """signum_schedulefree: the evaluated average weighs step ``t``'s iterate in proportion to ``t**average_power``
    (Defazio et al. 2024's polynomial weighting, the wrapper's ``r``; 0: the uniform average, sparsify's)."""

    loss: Literal["fvu", "mse"] = "fvu"
    """Reconstruction loss: FVU (variance about the mean) or MSE per element."""

    auxk_alpha: float = 1 / 32
    """Weight of the AuxK loss (0 disables it)."""

    dead_after_samples: int = 20_000
    """A latent that has not fired for this many samples counts as dead for AuxK (at d_sae 3072, k 32 a latent at
    the uniform rate fires about 200 times in 20,000 samples)."""

    init_b_dec_to_mean: bool = True
    """Set ``b_dec`` to the mean of the first batch an SAE sees (also after a re-initialisation)."""

    penalty: bool = True
    """Use the MFR penalty (needs n_saes >= 2)."""

    alpha: float | None = None
    """Penalty weight; None: set at step 0 so that the initial penalty equals the initial reconstruction loss."""

    warmup_steps: int = 100
    """Cosine warm-up of the penalty weight, in steps."""

    matching: Literal["hungarian", "max"] = "hungarian"
    """MMCS matching: one-to-one Hungarian (paper) or plain max."""

    rematch_every: int = 1
    """Recompute the Hungarian assignment every this many steps (1 = every step, as the paper)."""

    reinit: bool = True
    """Re-initialise an SAE whose inactivity measure exceeds the threshold."""

    inactivity_measure: str = "mean_relative_deviation"
    """Name in INACTIVITY_MEASURES."""

    inactivity_threshold: float = 1.0
    """Re-initialise when the measure is strictly above this value."""

    inactivity_window: int = 100
    """Steps over which firing rates are counted before each check."""

    reinit_until: int | None = None
    """Last step at which a re-initialisation may happen (None: no limit)."""

    seed: int = 0
    """Seed of the SAE initialisations (SAE i, re-init r gets its own derived stream)."""

    normalize_activations: Literal["none", "expected_average_only_in"] = "none"
    """'expected_average_only_in': scale inputs by sqrt(d_in) / E||x|| (estimated from the first batches)."""

    norm_batches: int = 10
    """Batches used to estimate the input scale (the first ones of the stream; they are trained on too)."""

    def __post_init__(self) -> None:
        if not isinstance(self.sae, SaeConfig):
            raise TypeError(f"sae must be a SaeConfig, got {type(self.sae).__name__}")
        check_fields(self, {("n_saes", "norm_batches"): Int(1, what="a positive int"),
                            "loss": OneOf(("fvu", "mse"), either=True), "inactivity_measure": OneOf(sorted(INACTIVITY_MEASURES)),
                            "matching": OneOf(("hungarian", "max"), either=True), ("inactivity_window", "rematch_every"): Int(1),
                            "normalize_activations": OneOf(("none", "expected_average_only_in"), either=True)})
        if self.penalty and self.n_saes < 2:
            raise ValueError(f"penalty=True needs n_saes >= 2, got n_saes={self.n_saes}")
        if self.optimizer not in ("signum_schedulefree", "adam"):
            raise ValueError(f"optimizer must be 'signum_schedulefree' or 'adam', got {self.optimizer!r}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr >= 0):
            raise ValueError(f"lr must be a finite number >= 0 or None, got {self.lr!r}")
        if self.optimizer == "signum_schedulefree" and self.lr == 0:
            raise ValueError("lr must be > 0 with optimizer='signum_schedulefree'")
        if isinstance(self.average_power, bool) or not isinstance(self.average_power, (int, float)) \
                or not (math.isfinite(self.average_power) and self.average_power >= 0):
            raise ValueError(f"average_power must be a finite number >= 0, got {self.average_power!r}")
        if self.alpha is not None and not (self.alpha >= 0):
            raise ValueError(f"alpha must be >= 0 or None, got {self.alpha!r}")


# ----------------------------------------------------------------------------- trainer
class MfrTrainer:
    """Train ``cfg.n_saes`` TopK SAEs on shared batches with MFR (or the baseline).

    Parameters
    ----------
    d_in : int
        Activation width.
    cfg : MfrConfig
    dist_cfg : Distributed, optional
        Multi-process mode (requires an initialised process group).
    device : str or torch.device
    dtype : torch.dtype
        Parameter dtype of the SAEs.
    model_name, hook_point : str, optional
        Where the activations come from; recorded in every saved SAE and in checkpoints, and checked when a
        checkpoint is resumed (:meth:`load_checkpoint`).

    Attributes
    ----------
    saes : list[TopKSae]
        SAEs owned by this process (all of them unless ``mode="ensemble"``).
    owned : list[int]
        Global indices of ``saes``.
    history : list[dict]
        One record per step: ``recon`` (list over all SAEs), ``auxk``, ``penalty`` (unscaled), ``alpha_t``,
        ``l0``.
    reinit_events : list[dict]
        ``{"step", "sae", "measure"}`` for every re-initialisation.
    checks : list[dict]
        ``{"step", "sae", "measure"}`` for every inactivity check.
    """

    def __init__(self, d_in: int, cfg: MfrConfig, dist_cfg: Distributed | None = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, *,
                 model_name: str | None = None, hook_point: str | None = None):
        if not isinstance(cfg, MfrConfig):
            raise TypeError(f"cfg must be an MfrConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.d_in = d_in
        self.model_name = model_name
        self.hook_point = hook_point
        self.input_scale: float | None = 1.0 if cfg.normalize_activations == "none" else None
        self.dist = dist_cfg or Distributed()
        if self.dist.mode != "none" and not dist.is_initialized():
            raise ValueError(f"dist_cfg.mode={self.dist.mode!r} needs an initialised torch.distributed process group")
        self.device = torch.device(device)
        self.dtype = dtype
        n = cfg.n_saes
        if self.dist.mode == "ensemble":
            self.owned = [i for i in range(n) if i % self.dist.world == self.dist.rank]
        else:
            self.owned = list(range(n))
        self.n_reinits = [0] * n
        self.saes = [self._new_sae(i) for i in self.owned]
        base_lr = 5e-3 if cfg.optimizer == "signum_schedulefree" else 2e-4
        self.lr = cfg.lr if cfg.lr is not None else base_lr / math.sqrt(cfg.sae.d_sae / 2**14)
        self.opts = [self._new_opt(s) for s in self.saes]
        self.modules = self.saes
        if self.dist.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.modules = [DDP(s) for s in self.saes]  # SAEs have no buffers
        m = cfg.sae.d_sae
        self.window_counts = torch.zeros(len(self.saes), m, dtype=torch.int64)
        self.window_samples = 0
        self.since_fired = torch.zeros(len(self.saes), m, dtype=torch.int64)
        self.step = 0
        self.alpha = cfg.alpha
        self._bias_pending = set(range(len(self.saes))) if cfg.init_b_dec_to_mean else set()
        self._assignments: dict[tuple[int, int], tuple] = {}
        self.history: list[dict] = []
        self.reinit_events: list[dict] = []
        self.checks: list[dict] = []

    # -------------------------------------------------------------- construction helpers
    def _new_sae(self, i: int) -> TopKSae:
        g = torch.Generator().manual_seed(splitmix_seed(self.cfg.seed, 1000 * i + self.n_reinits[i]))
        return TopKSae(self.d_in, self.cfg.sae, generator=g, dtype=self.dtype, model_name=self.model_name,
                       hook_point=self.hook_point, input_scale=self.input_scale or 1.0).to(self.device)

    def estimate_input_scale(self, batches: Sequence[Tensor]) -> float:
        """Set ``input_scale = sqrt(d_in) / mean_i ||x_i||`` over the rows of ``batches`` (all ranks' rows in ddp
        mode) on the trainer and every SAE, and return it; afterwards ``E||input_scale * x|| = sqrt(d_in)``.

        Raises ``ValueError`` for no rows, a wrong width or a zero mean norm.
        """
        total = torch.zeros(2, dtype=torch.float64)
        for x in batches:
            if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != self.d_in:
                got = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"batches must hold tensors of shape [batch, d_in={self.d_in}], got {got}")
            total += torch.stack([x.detach().double().norm(dim=1).sum().cpu(), torch.tensor(float(x.shape[0]))])
        if self.dist.mode == "ddp":
            total = _sum_ranks(total)
        if total[1] == 0 or not bool(total[0] > 0) or not bool(torch.isfinite(total[0])):
            raise ValueError(f"cannot estimate the input scale from {int(total[1])} row(s) with total norm "
                             f"{float(total[0])!r}")
        scale = math.sqrt(self.d_in) / float(total[0] / total[1])
        self.input_scale = scale
        for sae in self.saes:
            sae.input_scale = scale
        return scale

    def _new_opt(self, sae: TopKSae) -> torch.optim.Optimizer:
        if self.cfg.optimizer == "signum_schedulefree":
            return ScheduleFreeSignum(sae.parameters(), lr=self.lr, momentum=0.95, average_power=self.cfg.average_power)
        return torch.optim.Adam(sae.parameters(), lr=self.lr, betas=(0.9, 0.999))

    @contextmanager
    def averaged(self) -> Iterator[list[TopKSae]]:
        """Within the block every owned SAE holds the weights to evaluate and save (the schedule-free average;
        with Adam the weights as they are); yields ``saes``. Training resumes from exactly the same point."""
        with ExitStack() as stack:
            for opt in self.opts:
                if isinstance(opt, ScheduleFreeSignum):
                    stack.enter_context(opt.averaged())
            yield self.saes

    def reinitialise(self, local: int) -> None:
        """Re-initialise owned SAE ``local`` (index into ``saes``) in place, with a fresh optimiser."""
        i = self.owned[local]
        self.n_reinits[i] += 1
        g = torch.Generator().manual_seed(splitmix_seed(self.cfg.seed, 1000 * i + self.n_reinits[i]))
        self.saes[local].reset_parameters(g)
        self.opts[local] = self._new_opt(self.saes[local])
        self.since_fired[local].zero_()
        if self.cfg.init_b_dec_to_mean:
            self._bias_pending.add(local)
        for key in [key for key in self._assignments if i in key]:  # the old matching is meaningless now
            del self._assignments[key]

    # -------------------------------------------------------------- one step
    def _all_decoders(self) -> list[Tensor]:
        """Decoders of all N SAEs, differentiable for the owned ones (ensemble mode gathers the others)."""
        if self.dist.mode != "ensemble":
            return [s.W_dec for s in self.saes]
        world = self.dist.world
        per_rank = math.ceil(self.cfg.n_saes / world)
        shape = self.saes[0].W_dec.shape
        mine = torch.zeros(per_rank, *shape, dtype=self.dtype, device=self.device)
        for j, s in enumerate(self.saes):
            mine[j] = s.W_dec.detach()
        gathered = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        out = []
        for i in range(self.cfg.n_saes):
            r, j = i % world, i // world
            out.append(self.saes[self.owned.index(i)].W_dec if r == self.dist.rank else gathered[r][j])
        return out

    def _penalty(self) -> tuple[Tensor, float]:
        """(surrogate to differentiate, unscaled penalty value summed over the world)."""
        n = self.cfg.n_saes
        decs = self._all_decoders()
        refresh = self.step % self.cfg.rematch_every == 0
        terms = []
        owned = set(self.owned)
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                if self.dist.mode == "ensemble":
                    if i not in owned:
                        continue
                    a, b = decs[i], decs[j].detach()
                elif i < j:
                    a, b = decs[i], decs[j]
                else:
                    continue
                assignment = None if refresh else self._assignments.get((i, j))
                term, used = pair_dissimilarity(a, b, assignment, self.cfg.matching)
                if used is not None:
                    self._assignments[(i, j)] = used
                terms.append(term)
        pairs = n * (n - 1) / 2
        local = torch.stack(terms).sum() / pairs if terms else torch.zeros((), dtype=self.dtype)
        value = local.detach()
        if self.dist.mode == "ensemble":
            value = _sum_ranks(value) / 2
        return local, float(value)

    def train_step(self, x: Tensor) -> dict:
        """One optimisation step of every owned SAE on batch ``x [batch, d_in]`` (in ddp mode: this rank's
        slice). Returns the step record appended to ``history``."""
        if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != self.d_in:
            got = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be a tensor of shape [batch, d_in={self.d_in}], got {got}")
        cfg = self.cfg
        dev = self.device.type
        if torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == torch.float16:
            raise ValueError("float16 autocast is not supported by train_step (there is no loss scaling, so small "
                             "gradients underflow): use torch.autocast(device, dtype=torch.bfloat16)")
        if self.input_scale is None:
            raise ValueError("normalize_activations='expected_average_only_in' needs the input scale before the first "
                             "step: call estimate_input_scale(first_batches) or train with fit()")
        x = x.to(self.device, self.dtype)
        ddp = self.dist.mode == "ddp"
        world = self.dist.world if ddp else 1
        reduce = _sum_ranks if ddp else None
        if cfg.sae.normalize_decoder and cfg.optimizer == "signum_schedulefree":
            # sparsify's order: the training point is renormalised before each forward and not after the last
            # step, so the saved average is the one sparsify evaluates (its decoder rows are near, not at, unit norm)
            for sae in self.saes:
                sae.set_decoder_norm_to_unit_norm()
        if self._bias_pending:
            with torch.no_grad():
                total = torch.cat([x.sum(0).double(),
                                   torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)])
                total = _sum_ranks(total) if ddp else total
                mean = (total[:-1] / total[-1] * self.input_scale).to(self.dtype)  # b_dec lives in the scaled space
                for local in sorted(self._bias_pending):
                    self.saes[local].b_dec.copy_(mean)
            self._bias_pending.clear()
        recon_terms, auxk_terms, counts = [], [], []
        for local, mod in enumerate(self.modules):
            dead = self.since_fired[local] >= cfg.dead_after_samples if cfg.auxk_alpha > 0 else None
            out = mod(x, dead_mask=dead, reduce_stats=reduce)
            # MSE in the normalised units (scale-free FVU is the same in both); out.mse is in original units
            recon_terms.append(out.fvu if cfg.loss == "fvu" else out.mse * self.input_scale ** 2)
            auxk_terms.append(out.auxk_loss)
            counts.append(firing_counts(out.latent_acts, out.latent_indices, cfg.sae.d_sae))
        loss = world * (torch.stack(recon_terms).sum() + cfg.auxk_alpha * torch.stack(auxk_terms).sum())
        recon_local = torch.stack([r.detach() for r in recon_terms])
        auxk_local = torch.stack([a.detach() for a in auxk_terms])
        if ddp:  # per-rank terms are partial sums of the global quantities
            recon_local, auxk_local = _sum_ranks(recon_local), _sum_ranks(auxk_local)
            counts = list(_sum_ranks(torch.stack(counts)))
            n_batch = int(_sum_ranks(torch.tensor(x.shape[0])))
        else:
            n_batch = x.shape[0]
        recon_all = self._gather_scalars(recon_local)
        auxk_all = self._gather_scalars(auxk_local)
        # L0 = (sum over latents of firing counts) / samples
        l0s = self._gather_scalars(torch.stack([c.sum().double() / n_batch for c in counts]))
        penalty_value, alpha_t = None, 0.0
        if cfg.penalty:
            surrogate, penalty_value = self._penalty()
            if self.alpha is None:
                self.alpha = float(np.mean(recon_all)) / penalty_value if penalty_value > 0 else 0.0
            alpha_t = self.alpha * cosine_half_rise(self.step, cfg.warmup_steps)
            loss = loss + alpha_t * surrogate
        if not all(math.isfinite(v) for v in (*recon_all, *auxk_all)):  # before the step: nothing diverged is kept
            raise TrainingDiverged(f"SAE training diverged at step {self.step + 1} (reconstruction loss {recon_all}, "
                                   f"auxiliary loss {auxk_all}); lower the learning rate (lr = {self.opts[0].param_groups[0]['lr']:g})",
                                   self.step + 1)
        for opt in self.opts:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        for sae, opt in zip(self.saes, self.opts, strict=True):
            if cfg.sae.normalize_decoder:
                sae.remove_gradient_parallel_to_decoder_directions()
            opt.step()
            if cfg.sae.normalize_decoder and cfg.optimizer == "adam":
                sae.set_decoder_norm_to_unit_norm()
        # firing statistics
        c = torch.stack([cc.cpu() for cc in counts])
        self.window_counts += c
        self.window_samples += n_batch
        self.since_fired += n_batch
        self.since_fired[c > 0] = 0
        record = {"step": self.step, "recon": recon_all, "auxk": auxk_all, "penalty": penalty_value,
                  "alpha_t": alpha_t, "l0": l0s}
        self.step += 1
        if self.step % cfg.inactivity_window == 0:
            self._check_inactivity()
        self.history.append(record)
        return record

    def _gather_scalars(self, local_values: Tensor) -> list[float]:
        """Per-SAE scalars of all N SAEs in global order (ensemble mode gathers them)."""
        if self.dist.mode != "ensemble":
            return [float(v) for v in local_values]
        full = torch.zeros(self.cfg.n_saes, dtype=torch.float64)
        for j, i in enumerate(self.owned):
            full[i] = local_values[j].double()
        return [float(v) for v in _sum_ranks(full)]

    def _check_inactivity(self) -> None:
        cfg = self.cfg
        measure = INACTIVITY_MEASURES[cfg.inactivity_measure]
        for local, i in enumerate(self.owned):
            m = measure(self.window_counts[local], self.window_samples, cfg.sae.k)
            self.checks.append({"step": self.step, "sae": i, "measure": m})
            allowed = cfg.reinit and (cfg.reinit_until is None or self.step <= cfg.reinit_until)
            if allowed and should_reinit(m, cfg.inactivity_threshold):
                self.reinitialise(local)
                self.reinit_events.append({"step": self.step, "sae": i, "measure": m})
        self.window_counts.zero_()
        self.window_samples = 0

    # -------------------------------------------------------------- loop, checkpoints
    def fit(self, batches: Iterable[Tensor], n_steps: int, *, quiet: bool = False,
            checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 1000,
            desc: str = "MFR") -> list[dict]:
        """Run up to ``n_steps`` total steps (continuing from ``self.step``) over ``batches``.

        ``batches`` must yield ``[batch, d_in]`` tensors, starting at batch ``self.step`` when resuming.
        Shows a progress bar unless ``quiet``; saves a checkpoint every ``checkpoint_every`` steps and at the end
        when ``checkpoint_dir`` is given. Returns ``history``.
        """
        from mlpinterp.utils.progress import progress_bar

        it = iter(batches)
        if self.input_scale is None:  # normalisation: estimate from the first batches, then train on them too
            first = list(itertools.islice(it, self.cfg.norm_batches))
            self.estimate_input_scale(first)
            it = itertools.chain(first, it)
        last = None
        with progress_bar(total=n_steps, initial=self.step, desc=desc, quiet=quiet or self.dist.rank != 0) as bar:
            while True:
                x = next(it, None) if self.step < n_steps else None  # None: the last step is done, or no batch left
                if x is not None:
                    rec = self.train_step(x)
                    last = x
                    bar.advance()
                    if self.step % 20 == 0:
                        bar.postfix(recon=float(np.mean(rec["recon"])), pen=float(rec["penalty"] or 0.0))
                if checkpoint_dir is not None and (x is None or self.step % checkpoint_every == 0):
                    self.save_checkpoint(checkpoint_dir)
                if x is None:
                    if last is not None:
                        self.warn_if_worse_than_mean(last)
                    return self.history

    def warn_if_worse_than_mean(self, x: Tensor) -> list[float]:
        """FVU of every owned SAE (the weights it saves: :meth:`averaged`) on batch ``x [batch, d_in]``; a
        ``RuntimeWarning`` names each SAE whose FVU is >= 1 (it reconstructs worse than predicting the batch mean,
        e.g. a learning rate too large for this ``d_sae`` and batch size), with the fix. Returns the FVUs."""
        x = x.to(self.device, self.dtype)
        with torch.no_grad(), self.averaged():
            fvus = [float(mod(x).fvu) for mod in self.modules]
        bad = [(self.owned[local], f) for local, f in enumerate(fvus) if not f < 1.0]
        if bad:
            cfg = self.cfg
            warnings.warn(f"SAE training ended worse than the mean: FVU {', '.join(f'{v:.3g} (SAE {i})' for i, v in bad)}"
                          f" on the last batch (optimizer {cfg.optimizer}, lr {self.lr:.3g}, d_sae {cfg.sae.d_sae}, "
                          f"batch {x.shape[0]}); {self._worse_than_mean_fix()}", RuntimeWarning, stacklevel=2)
        return fvus

    def _worse_than_mean_fix(self) -> str:
        """The fix :meth:`warn_if_worse_than_mean` names, for this trainer's optimiser."""
        if self.cfg.optimizer == "adam":
            return "lower MfrConfig.lr, or train longer"
        return ("lower MfrConfig.lr or use optimizer='adam' (the sign optimiser's lr rule was measured at batch 4096, "
                "d_sae 3072); on the command line, a larger --batch-size")

    def save_checkpoint(self, directory: str | os.PathLike) -> Path:
        """Write every owned SAE (``sae_{i}/``, sparsify layout) and the trainer state, atomically; raises
        :class:`~mlpinterp.utils.checkpoint.TrainingDiverged` and writes nothing when a weight is NaN or inf."""
        bad = [f"sae_{i}.{n}" for i, sae in zip(self.owned, self.saes, strict=True)
               for n in nonfinite_names(sae.named_parameters())]
        if bad:
            raise TrainingDiverged(f"SAE training diverged by step {self.step}: weights {bad[:4]} hold NaN or inf; "
                                   "lower the learning rate", self.step)
        directory = Path(directory)
        if self.dist.mode == "ddp" and self.dist.rank != 0:
            return directory
        tensors: dict[str, Tensor] = {"window_counts": self.window_counts, "since_fired": self.since_fired}
        files = []
        for local, (sae, opt) in enumerate(zip(self.saes, self.opts, strict=True)):
            i = self.owned[local]
            with self.averaged():
                files.append(sae_artifact(sae, directory / f"sae_{i}"))
            for k, v in sae.state_dict().items():
                tensors[f"sae{i}.param.{k}"] = v
            tensors.update(optimizer_tensors(opt, f"sae{i}.opt"))
        meta = {"step": self.step, "alpha": self.alpha, "n_reinits": self.n_reinits, "input_scale": self.input_scale,
                "model_name": self.model_name, "hook_point": self.hook_point, "d_in": self.d_in,
                "window_samples": self.window_samples, "cfg": asdict(self.cfg),
                "bias_pending": sorted(self._bias_pending), "owned": self.owned,
                "history": self.history, "reinit_events": self.reinit_events, "checks": self.checks,
                "assignments": {f"{a},{b}": [v[0].tolist(), v[1].tolist()] for (a, b), v in self._assignments.items()}}
        rank = self.dist.rank if self.dist.mode == "ensemble" else 0
        files.append(Artifact(tensors, meta, {"step": self.step, "model_name": self.model_name,
                                              "hook_point": self.hook_point},
                              CHECKPOINT_KIND, directory / f"trainer_rank{rank}.safetensors"))
        save_artifacts(files, {directory / "mfr_cfg.json": asdict(self.cfg)})
        return directory

    def load_checkpoint(self, directory: str | os.PathLike, *, allow_mismatch: bool = False,
                        override: str = "allow_mismatch=True") -> bool:
        """Resume from :meth:`save_checkpoint`'s files; returns False if there is no checkpoint.

        Raises ``ValueError`` (before changing anything) when the checkpoint was written for other SAEs (owned
        indices, d_in or any :class:`MfrConfig` field differ) or, unless ``allow_mismatch`` (then it warns), for
        another hook point or model; ``override`` names the flag that allows it in the message; also when its
        metadata's ``cfg`` is not a JSON object, a field the trainer state needs (``step``, ...) is missing, or a
        value or tensor does not fit these SAEs (type, length, shape); nothing of the trainer changes then.
        """
        rank = self.dist.rank if self.dist.mode == "ensemble" else 0
        path = Path(directory) / f"trainer_rank{rank}.safetensors"
        if not path.exists() or not path.with_suffix(".json").exists():
            return False
        art = load_artifact(path, kind=CHECKPOINT_KIND, what="checkpoint",
                            fix="use another output directory, or delete this one to train from step 0")
        tensors, meta = art.tensors, art.meta
        if not isinstance(meta, dict):
            raise ArtifactError(path, f"holds metadata of type {type(meta).__name__}, expected a JSON object",
                                "use another output directory", "checkpoint")
        where = f"checkpoint {str(path)!r}"
        if meta.get("owned") != self.owned:
            raise ValueError(f"{where} holds SAEs {meta.get('owned')}, this process owns {self.owned}")
        if meta.get("d_in", self.d_in) != self.d_in:
            raise ValueError(f"{where} holds SAEs with d_in={meta['d_in']}, these activations have d_in={self.d_in}")
        if not isinstance(meta.get("cfg", {}), dict):
            raise ValueError(f"{where}: its metadata's 'cfg' must be a JSON object (the MfrConfig), got "
                             f"{type(meta['cfg']).__name__}; use another output directory")
        diff = config_diff(_flat(meta.get("cfg", {})), _flat(asdict(self.cfg)), implicit=ADDED_FIELDS)
        if diff:
            raise ValueError(f"{where} was trained with other settings (" + ", ".join(
                f"{k}: {a!r} there, {b!r} here" for k, (a, b) in diff.items())
                + "); use another output directory")
        check_provenance(f"resuming {where}", recorded_model=meta.get("model_name"),
                         recorded_hook=meta.get("hook_point"), model_name=self.model_name,
                         hook_point=self.hook_point, allow_mismatch=allow_mismatch, override=override)
        # every value is read and checked before anything of this trainer changes: a malformed file is refused
        # whole, never half-loaded
        try:
            state = _read_trainer_state(meta, tensors, self)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise ValueError(f"{where}: its contents do not fit these SAEs ({type(e).__name__}: {e}); use another "
                             "output directory") from e
        self.input_scale = state["input_scale"]
        for sae in self.saes:
            sae.input_scale = self.input_scale or 1.0
        self.step, self.alpha, self.n_reinits = state["step"], state["alpha"], state["n_reinits"]
        self.window_samples, self._bias_pending = state["window_samples"], state["bias_pending"]
        self.history, self.reinit_events, self.checks = state["history"], state["reinit_events"], state["checks"]
        self._assignments = state["assignments"]
        self.window_counts.copy_(state["window_counts"])
        self.since_fired.copy_(state["since_fired"])
        for local, sae in enumerate(self.saes):
            sae.load_state_dict(state["params"][local])
            self.opts[local] = opt = self._new_opt(sae)
            restore_optimizer(opt, state["adam"][local])
        return True
