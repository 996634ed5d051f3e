"""Configuration of ``mlpinterp train-lm`` (torch-free: the CLI builds its options and ``--help`` from it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mlpinterp.utils.validation import Int, Real, check_fields

#: LmTrainConfig fields added after the first version that wrote train-lm checkpoints, with the behaviour
#: before each: a checkpoint written before a field existed resumes when the request keeps that behaviour
#: (:func:`mlpinterp.utils.config_diff.config_diff`'s ``implicit``). None so far: every field dates from the first version.
#: Add a field here when it is added to LmTrainConfig.
ADDED_FIELDS: dict = {}


@dataclass(frozen=True)
class LmTrainConfig:
    """A small GPT-2-architecture causal LM and its byte-level BPE tokenizer, trained on text documents.

    Defaults: 4 layers, d_model 256, 4 heads, 128 positions, vocabulary 4096 (5.2 M parameters, 1.0 M of them
    the tied embedding); AdamW with linear warm-up and half-cosine decay; the default 400 steps of 32 x 128
    tokens are 1.6 M tokens, about one pass over the bundled corpora without wikitext-2 test (throughput in
    ``docs/measurements.md``). Raises ``TypeError``/``ValueError`` on
    construction for an invalid field (named in the message).
    """

    vocab_size: int = 4096
    """Byte-level BPE vocabulary size, the 256 byte tokens and <|endoftext|> included."""
    tokenizer_min_frequency: int = 2
    """A BPE merge needs at least this many occurrences in the training documents."""
    n_layer: int = 4
    """Transformer blocks."""
    d_model: int = 256
    """Residual stream width (GPT-2's n_embd); the MLP is 4 d_model wide."""
    n_head: int = 4
    """Attention heads (must divide d_model)."""
    n_positions: int = 128
    """Context length in tokens; training and held-out sequences are chunks of exactly this length."""
    dropout: float = 0.0
    """Dropout on embeddings, residual branches and attention (GPT-2 uses 0.1; off for a run under one epoch)."""
    steps: int = 400
    """Optimisation steps."""
    batch_size: int = 32
    """Sequences per step."""
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    min_lr_fraction: float = 0.1
    """The cosine decay ends at this fraction of lr."""
    warmup_steps: int = 40
    """Linear learning-rate warm-up steps."""
    weight_decay: float = 0.1
    """Decoupled weight decay of AdamW on matrices (not on biases, LayerNorms or the position embedding)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0: none)."""
    seed: int = 0
    """Seed of the initialisation, the batch order and dropout."""
    eval_every: int = 100
    """Steps between held-out cross-entropy checks on eval_progress_chunks chunks (0: only at the end)."""
    eval_progress_chunks: int = 16
    """Held-out chunks of the periodic checks."""
    eval_chunks: int = 512
    """Held-out chunks of the final perplexity (0: all)."""
    checkpoint_every: int = 50
    """Steps between atomic checkpoints (the run resumes from the newest)."""

    def __post_init__(self) -> None:
        check_fields(self, {("vocab_size", "n_layer", "d_model", "n_head", "n_positions", "steps", "batch_size",
                             "tokenizer_min_frequency", "checkpoint_every", "eval_progress_chunks"): Int(1),
                            ("warmup_steps", "seed", "eval_every", "eval_chunks"): Int(0),
                            "lr": Real(0, lo_open=True), "min_lr_fraction": Real(0, 1),
                            "dropout": Real(0, 1, hi_open=True), ("weight_decay", "grad_clip"): Real(0)})
        if self.vocab_size < 257:
            raise ValueError(f"vocab_size must be >= 257 (256 byte tokens and <|endoftext|>), got {self.vocab_size}")
        if self.n_positions < 2:
            raise ValueError(f"n_positions must be >= 2 (a next-token target needs two tokens), got {self.n_positions}")
        if self.d_model % self.n_head:
            raise ValueError(f"n_head must divide d_model, got d_model={self.d_model}, n_head={self.n_head}")

    def to_dict(self) -> dict:
        """JSON-serialisable dict of all fields."""
        return asdict(self)
