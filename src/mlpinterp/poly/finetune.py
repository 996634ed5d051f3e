"""The hybrid fine-tune: start from a closed form, then schedule-free optimisation on samples.

Rigg & Belrose (2025, arXiv 2502.01032, §4 and Limitations) initialise at a closed-form approximant and fine-tune
it on samples. :func:`finetune` is the one loop for every use of that recipe; what it trains and where its batches
come from are its arguments:

* the model: any ``nn.Module`` mapping ``[batch, d_in] -> [batch, d_out]`` (the factored ridge readout of
  :mod:`mlpinterp.poly.readout_finetune`, the raw-coordinate polynomial of :mod:`mlpinterp.poly.mixture.sgd`);
* the data source: :class:`ArrayBatches` (batches drawn with replacement from fixed arrays, e.g. captured
  activations) or :class:`SampledBatches` (fresh samples of a distribution, targets from the network);
* the validation set: :class:`Validation` (fixed inputs and float64 targets), whose FVU is recorded every
  ``eval_every`` steps, picks the best step and drives the caller's optional stopping rules.

Optimiser: ``schedulefree.AdamWScheduleFree`` or ``SGDScheduleFree`` (Defazio et al. 2024) on the mean squared
error (summed over outputs, averaged over the batch) divided by ``loss_scale``. Deterministic given
``cfg.seed`` (the source's generator) on one device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from mlpinterp.poly.finetune_config import FinetuneConfig
from mlpinterp.utils.validation import check_instance


class ArrayBatches:
    """Batches of ``min(batch_size, m)`` rows drawn with replacement from fixed ``X [m, d_in]``, ``Y [m, d_out]``
    (torch tensors, already in the training dtype and device), seeded by a ``torch.Generator`` of ``seed``."""

    def __init__(self, X: Tensor, Y: Tensor, batch_size: int, seed: int):
        if X.shape[0] != Y.shape[0]:
            raise ValueError(f"X and Y must have the same number of rows, got {X.shape[0]} and {Y.shape[0]}")
        self.X, self.Y, self.n = X, Y, min(batch_size, X.shape[0])
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self) -> tuple[Tensor, Tensor]:
        idx = torch.randint(0, self.X.shape[0], (self.n,), generator=self.gen)
        return self.X[idx], self.Y[idx]


class SampledBatches:
    """Fresh batches ``X ~ distribution`` (``distribution.sample(n, rng)``, numpy ``default_rng(seed)``) with targets
    ``network(X)`` computed in float64, cast to ``dtype`` on ``device``."""

    def __init__(self, network, distribution, batch_size: int, seed: int, *, device, dtype: torch.dtype):
        self.network, self.distribution, self.n = network, distribution, batch_size
        self.rng, self.device, self.dtype = np.random.default_rng(seed), device, dtype

    def __call__(self) -> tuple[Tensor, Tensor]:
        X = self.distribution.sample(self.n, self.rng)
        y = torch.as_tensor(self.network(X), device=self.device, dtype=self.dtype)
        return torch.as_tensor(X, device=self.device, dtype=self.dtype), y


class Validation:
    """A fixed validation set: ``X [m, d_in]`` in the training dtype and ``Y [m, d_out]`` float64, both on the
    training device. :meth:`fvu` is the pooled fraction of variance unexplained of a model on it (float64,
    evaluated in chunks of ``chunk`` rows). Raises ``ValueError`` when ``Y`` does not vary."""

    def __init__(self, X: Tensor, Y: Tensor, chunk: int = 8192):
        self.X, self.Y, self.chunk = X, Y.to(torch.float64), chunk
        self.var = float(((self.Y - self.Y.mean(0)) ** 2).sum())
        if not self.var > 0:
            raise ValueError("the validation targets do not vary (the FVU divides by their variance)")

    def fvu(self, model: nn.Module) -> float:
        with torch.no_grad():
            err = sum(float(((model(self.X[s:s + self.chunk]).to(torch.float64) - self.Y[s:s + self.chunk]) ** 2).sum())
                      for s in range(0, self.X.shape[0], self.chunk))
        return err / self.var


@dataclass
class FinetuneRun:
    """What :func:`finetune` did. The model is left at its last step's (evaluation) weights."""

    history: list[dict] = field(default_factory=list)
    """``{"step", "seconds", "fvu"}`` per validation (``seconds``: training time so far, validation excluded)."""
    steps: int = 0
    """Steps taken."""
    seconds: float = 0.0
    """Training time (batches and steps; validation excluded)."""
    best_step: int | None = None
    """The validated step with the lowest FVU (step 0, the start, included); None without validation."""
    best_state: dict | None = None
    """A copy of the model's state dict at ``best_step`` (with ``keep_best``)."""
    time_to_target: float | None = None
    """Training time at which the validation FVU first reached ``target_fvu`` (None: not reached or no target)."""


def finetune(model: nn.Module, batches, cfg: FinetuneConfig, *, validation: Validation | None = None,
             loss_scale: float = 1.0, keep_best: bool = False, target_fvu: float | None = None,
             time_limit: float | None = None, what: str = "fine-tuning", desc: str = "fine-tune",
             quiet: bool = True) -> FinetuneRun:
    """Fine-tune every parameter of ``model`` for up to ``cfg.steps`` steps on ``batches()`` (a callable returning
    ``(X [b, d_in], Y [b, d_out])``, e.g. :class:`ArrayBatches` or :class:`SampledBatches`).

    With ``validation`` its FVU is recorded at step 0, every ``cfg.eval_every`` steps and at the last step, under
    the schedule-free evaluation weights. ``keep_best``: keep a copy of the state at the best validated step.
    Stopping rules (both need nothing else): ``target_fvu``, stop once the validation FVU is ``<=`` it (a start
    already there takes no step); ``time_limit``, stop after that many seconds of training.

    Raises ``TypeError`` for a ``cfg`` that is not a :class:`FinetuneConfig`, ``ValueError`` for stopping rules
    without ``validation`` and when the loss turns NaN or inf (``"<what> diverged at step N ...; lower lr"``).
    """
    import schedulefree

    from mlpinterp.utils.progress import progress_bar

    check_instance(cfg, FinetuneConfig, "cfg")
    if validation is None and (keep_best or target_fvu is not None):
        raise ValueError("keep_best and target_fvu need a validation set")
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        opt = schedulefree.SGDScheduleFree(params, lr=cfg.lr, momentum=cfg.momentum, warmup_steps=cfg.warmup_steps)
    else:
        opt = schedulefree.AdamWScheduleFree(params, lr=cfg.lr, warmup_steps=cfg.warmup_steps)
    run = FinetuneRun()
    best_fvu = float("inf")

    def validate() -> float | None:
        nonlocal best_fvu
        if validation is None:
            return None
        opt.eval()  # schedule-free: evaluation weights (the averaged iterate)
        fv = validation.fvu(model)
        if fv < best_fvu:
            best_fvu, run.best_step = fv, run.steps
            if keep_best:
                run.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        opt.train()
        run.history.append({"step": run.steps, "seconds": run.seconds, "fvu": fv})
        if target_fvu is not None and fv <= target_fvu and run.time_to_target is None:
            run.time_to_target = run.seconds
        return fv

    opt.train()
    validate()
    sync = next((p.device.type == "cuda" for p in params), False)
    with progress_bar(total=cfg.steps, desc=desc, quiet=quiet) as bar:
        while (run.steps < cfg.steps and run.time_to_target is None
               and (time_limit is None or run.seconds < time_limit)):
            t0 = time.perf_counter()
            X, Y = batches()
            loss = ((model(X) - Y) ** 2).sum(1).mean() / loss_scale
            if not torch.isfinite(loss):
                raise ValueError(f"{what} diverged at step {run.steps + 1} (non-finite loss {float(loss.detach())}); "
                                 f"lower lr (got {cfg.lr})")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sync:
                torch.cuda.synchronize()
            run.seconds += time.perf_counter() - t0
            run.steps += 1
            bar.advance()
            last = run.steps == cfg.steps or (time_limit is not None and run.seconds >= time_limit)
            if run.steps % cfg.eval_every == 0 or last:
                fv = validate()
                if fv is not None:
                    bar.postfix(fvu=fv)
    if validation is not None and run.history[-1]["step"] != run.steps:
        validate()
    opt.eval()
    return run
