"""Configuration of the hybrid fine-tune (torch-free, so ``--help`` is built from it without importing torch).

One config for :func:`mlpinterp.poly.finetune.finetune`, whatever the data source: a readout fine-tuned on captured
activations (:func:`mlpinterp.poly.readout_finetune.finetune`) or a raw-coordinate polynomial on fresh samples of a
Gaussian mixture (:func:`mlpinterp.poly.mixture.sgd.fit_sgd`, which passes its own defaults).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlpinterp.utils.validation import Int, OneOf, Real, check_fields

OPTIMIZERS = ("adamw", "sgd")

#: Fields added to :class:`FinetuneConfig` after configurations holding it were first written, with the behaviour
#: before each: a run directory written before a field existed resumes when the request keeps that behaviour
#: (:func:`mlpinterp.utils.config_diff.config_diff`'s ``implicit``). Add a field here when it is added.
ADDED_FIELDS = {"optimizer": "adamw", "momentum": 0.9}


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tuning settings."""

    steps: int = 500
    """Optimiser steps (the most taken: a stopping rule of the caller may end the run earlier)."""

    batch_size: int = 2048
    """Samples per step."""

    lr: float = 1e-3
    """Schedule-free learning rate."""

    warmup_steps: int = 50
    """Schedule-free warm-up."""

    eval_every: int = 100
    """Steps between validation FVU evaluations (recorded in the history; also at step 0 and the last step)."""

    seed: int = 0
    """Seed of the batches."""

    optimizer: str = "adamw"
    """``adamw`` (``schedulefree.AdamWScheduleFree``) or ``sgd`` (``schedulefree.SGDScheduleFree``)."""

    momentum: float = 0.9
    """Momentum of ``sgd`` (unused by ``adamw``)."""

    def __post_init__(self) -> None:
        check_fields(self, {("steps", "batch_size", "eval_every"): Int(1), "warmup_steps": Int(0),
                            "lr": Real(0.0, lo_open=True), "seed": Int(0), "optimizer": OneOf(OPTIMIZERS),
                            "momentum": Real(0.0, 1.0, hi_open=True)})
