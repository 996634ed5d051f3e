"""One-hidden-layer MLP/GLU classifiers trained with schedule-free AdamW; atomic, resumable checkpoints.

Names are imported lazily (as in ``mlpinterp``): ``mlpinterp.models.config`` stays torch-free, so the CLI can read
the configuration's defaults and field docs without importing torch.
"""

from __future__ import annotations

from mlpinterp.utils.lazy import lazy_getattr

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


__getattr__ = lazy_getattr(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return __all__
