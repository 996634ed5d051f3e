"""Configuration of the one-hidden-layer classifiers (torch-free, so the CLI can build ``--help`` from it quickly)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from mlpinterp.utils.validation import Int, OneOf, Real, check_fields

ARCHS: tuple[str, ...] = ("mlp", "glu")
"""Supported architectures."""

ACTIVATION_NAMES: tuple[str, ...] = ("relu", "gelu", "silu", "tanh", "identity")
"""Hidden activations (the keys of ``mlpinterp.models.classifier.ACTIVATIONS``)."""

#: ClassifierConfig fields added after the first version that wrote classifier checkpoints, with the
#: behaviour before each: a checkpoint written before a field existed resumes (and loads) with that value when the
#: request keeps that behaviour (:func:`mlpinterp.utils.config_diff.config_diff`'s ``implicit``). None so far: every
#: field dates from the first version. Add a field here when it is added to ClassifierConfig.
ADDED_FIELDS: dict = {}


@dataclass(frozen=True)
class ClassifierConfig:
    """Architecture and training hyper-parameters of a one-hidden-layer classifier.

    Defaults follow Rigg & Belrose (2025, §4): schedule-free AdamW, 1,000 warm-up steps,
    batch 64, weight decay 0.1. The learning rate ``lr=5e-3`` is our choice: the same final accuracy as
    1e-3 and 2e-3, reached in fewer steps (the comparison is in ``docs/measurements.md``).

    Raises ``ValueError``/``TypeError`` on construction for an invalid field (named in the message).
    """

    d_in: int
    """Input dimension (64 for digits, 784 for MNIST)."""
    n_classes: int
    """Number of output classes (logits)."""
    d_hidden: int = 512
    """Hidden width: number of neurons (mlp) or of gated units (glu)."""
    arch: str = "mlp"
    """``"mlp"`` or ``"glu"``."""
    activation: str = "relu"
    """One of ``relu``, ``gelu``, ``silu``, ``tanh``, ``identity``; for glu the gate activation."""
    lr: float = 5e-3
    """Peak learning rate of schedule-free AdamW."""
    weight_decay: float = 0.1
    """Decoupled weight decay of schedule-free AdamW (applied at y)."""
    warmup_steps: int = 1000
    """Linear learning-rate warm-up steps."""
    batch_size: int = 64
    """Examples per optimisation step."""
    steps: int = 10_000
    """Total optimisation steps."""
    seed: int = 0
    """Seed of the initialisation and of the batch order."""

    def __post_init__(self) -> None:
        check_fields(self, {("d_in", "n_classes", "d_hidden", "batch_size", "steps"): Int(1, what="a positive int"),
                            ("warmup_steps", "seed"): Int(0, what="a non-negative int"),
                            "arch": OneOf(list(ARCHS)), "activation": OneOf(list(ACTIVATION_NAMES)),
                            ("lr", "weight_decay"): Real(0.0, what="a finite float >= 0")})
        if self.lr == 0:
            raise ValueError("lr must be > 0, got 0")
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be >= 2, got {self.n_classes}")

    def to_dict(self) -> dict:
        """JSON-serialisable dict of all fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ClassifierConfig:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` on unknown or missing keys. A field of
        :data:`ADDED_FIELDS` that ``d`` lacks (written before it existed) takes its value from there."""
        if not isinstance(d, dict):
            raise TypeError(f"config must be a dict, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"config has unknown key(s) {unknown}; expected a subset of {sorted(names)}")
        try:
            return cls(**{**ADDED_FIELDS, **d})
        except TypeError as e:
            raise ValueError(f"invalid config {d!r}: {e}") from e
