"""One-hidden-layer MLP/GLU classifiers trained with schedule-free AdamW; atomic, resumable checkpoints.

Names are imported lazily (as in ``mlpinterp``): ``mlpinterp.models.config`` stays torch-free, so the CLI can read
the configuration's defaults and field docs without importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ACTIVATIONS": "mlpinterp.models.classifier",
    "ARCHS": "mlpinterp.models.config",
    "Classifier": "mlpinterp.models.classifier",
    "ClassifierConfig": "mlpinterp.models.config",
    "RunConflictError": "mlpinterp.models.train",
    "checkpoint_path": "mlpinterp.models.train",
    "checkpoint_steps": "mlpinterp.models.train",
    "find_checkpoints": "mlpinterp.models.train",
    "load_classifier": "mlpinterp.models.train",
    "train_classifier": "mlpinterp.models.train",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mlpinterp.models' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
