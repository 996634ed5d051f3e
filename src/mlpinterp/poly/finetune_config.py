"""Configuration of fine-tuning a readout polynomial (torch-free, so ``--help`` is built from it without importing torch)."""

from __future__ import annotations

from dataclasses import dataclass

from mlpinterp.utils.validation import Int, Real, check_fields


@dataclass(frozen=True)
class HybridConfig:
    """Fine-tuning settings."""

    steps: int = 500
    """Optimiser steps."""

    batch_size: int = 2048
    """Fit activations per step."""

    lr: float = 1e-3
    """Schedule-free AdamW learning rate."""

    warmup_steps: int = 50
    """Schedule-free warm-up."""

    eval_every: int = 100
    """Steps between validation FVU evaluations (recorded in the history)."""

    seed: int = 0
    """Seed of the batches."""

    def __post_init__(self) -> None:
        check_fields(self, {("steps", "batch_size", "eval_every"): Int(1), "warmup_steps": Int(0),
                            "lr": Real(0.0, lo_open=True), "seed": Int(0)})
