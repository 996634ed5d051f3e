"""One-hidden-layer MLP/GLU classifiers trained with schedule-free AdamW; atomic, resumable checkpoints."""

from mlpinterp.models.classifier import ACTIVATIONS, ARCHS, Classifier, ClassifierConfig
from mlpinterp.models.train import (
    RunConflictError,
    checkpoint_path,
    checkpoint_steps,
    find_checkpoints,
    load_classifier,
    train_classifier,
)

__all__ = [
    "ACTIVATIONS",
    "ARCHS",
    "Classifier",
    "ClassifierConfig",
    "RunConflictError",
    "checkpoint_path",
    "checkpoint_steps",
    "find_checkpoints",
    "load_classifier",
    "train_classifier",
]
