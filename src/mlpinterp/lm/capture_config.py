"""Configuration of capturing FFN-block inputs from text (torch-free, so ``--help`` is built from it without importing
torch)."""

from __future__ import annotations

from dataclasses import dataclass

from mlpinterp.utils.validation import Bool, Int, Real, check_fields


@dataclass(frozen=True)
class CaptureConfig:
    """How FFN inputs are read from text."""

    ctx_len: int = 128
    """Tokens per sequence, special tokens included."""

    seq_batch: int = 32
    """Sequences per forward pass."""

    max_tokens: int = 100_000
    """Content tokens to read in all (fit + held-out); fewer if the corpus is smaller."""

    heldout_fraction: float = 0.2
    """Fraction of passages held out for evaluation."""

    passage_chunks: int = 8
    """Consecutive sequences of one file that form a passage, the unit of the fit / held-out split."""

    keep_fit: int = 100_000
    """Fit activations kept per block for sample-based fits (moments always use every fit token)."""

    exclude_special: bool = True
    """Drop positions holding special tokens ([CLS], [SEP], padding, BOS/EOS)."""

    seed: int = 0
    """Seed of the passage split, the passage order and the kept subsample."""

    def __post_init__(self) -> None:
        check_fields(self, {("ctx_len", "seq_batch", "max_tokens", "passage_chunks", "keep_fit"): Int(1),
                            "heldout_fraction": Real(0.0, 1.0, lo_open=True), "exclude_special": Bool("True or False"),
                            "seed": Int(0)})
        if self.heldout_fraction >= 1.0:
            raise ValueError(f"heldout_fraction must be < 1 (something must be left to fit), got {self.heldout_fraction}")
