"""Configuration of ``reproduce transformer`` (torch-free: the CLI builds ``--help`` from it)."""

from __future__ import annotations

from dataclasses import dataclass

from mlpinterp.lm.capture_config import CaptureConfig
from mlpinterp.poly.finetune_config import ADDED_FIELDS as FINETUNE_ADDED_FIELDS
from mlpinterp.poly.finetune_config import FinetuneConfig
from mlpinterp.utils.validation import check_int

INPUT_MODELS = ("gaussian", "mixture", "data", "hybrid")
#: TransformerExperiment fields added after the first version that wrote a run's config.json, with the behaviour
#: of a run without each: a run directory written before a field existed resumes when the request keeps that
#: behaviour (:func:`mlpinterp.utils.config_diff.config_diff`'s ``implicit``; ``hybrid.<field>`` for a field of the
#: nested fine-tune configuration). ``saes``: no SAE alignment; ``hybrid.optimizer`` / ``hybrid.momentum``:
#: schedule-free AdamW. A directory that records the removed fields ``mixture_samples`` and ``mc_samples`` (sampled
#: mixture FVUs, exact now) differs from every request. CaptureConfig has gained no field. Add a field here when it
#: is added to TransformerExperiment or its nested configurations.
ADDED_FIELDS = {"saes": (), **{f"hybrid.{k}": v for k, v in FINETUNE_ADDED_FIELDS.items()}}


@dataclass(frozen=True)
class TransformerExperiment:
    """Configuration of ``reproduce transformer`` (every field documented for ``--help``)."""

    model: str = "minilm"
    """``minilm`` (the embedded all-MiniLM-L6-v2) or a Hugging Face name / path whose weights are on disk."""
    layers: tuple[int, ...] | None = None
    """Indices of the FFN blocks to analyse (None: all); negative ones count from the last block (-1: the last)."""
    degrees: tuple[int, ...] = (1, 2, 3)
    """Polynomial degrees."""
    input_models: tuple[str, ...] = INPUT_MODELS
    """Input models to fit (see the module docstring)."""
    capture: CaptureConfig = CaptureConfig()
    """How FFN inputs are read from text."""
    covariance: str = "empirical"
    """Covariance of the Gaussian input model: ``empirical`` or ``ledoit-wolf``."""
    mixture_components: int = 8
    """K of the Gaussian mixture input model."""
    mixture_fit_samples: int = 20_000
    """Fit tokens the mixture's EM sees (a seeded subsample)."""
    val_fraction: float = 0.1
    """Fraction of the kept fit tokens held back for validation (input-model choice, hybrid monitoring)."""
    hybrid: FinetuneConfig = FinetuneConfig()
    """Fine-tuning of the hybrid input model."""
    splice_sequences: int = 64
    """Held-out sequences for the splice-in evaluation."""
    n_output_dirs: int = 4
    """Top output directions whose quadratic forms are eigendecomposed."""
    n_eigen: int = 8
    """Eigen-features kept per output direction."""
    saes: tuple[tuple[int, str], ...] = ()
    """``(layer, SAE directory)`` pairs: SAEs trained on that block's input, whose decoder directions are compared with
    the eigen-features (the SAE's recorded hook point must output exactly the block's input; checked)."""
    seed: int = 0
    """Seed of the mixture fit, the Monte Carlo samples and the hybrid batches."""
    run: str = "full"
    """``full`` or ``quick`` (a shortened run: no verdicts)."""

    def __post_init__(self) -> None:
        bad = [m for m in self.input_models if m not in INPUT_MODELS]
        if bad or not self.input_models or len(set(self.input_models)) != len(self.input_models):
            raise ValueError(f"input_models must be a non-empty subset of {INPUT_MODELS} (each once), got "
                             f"{self.input_models}")
        if not self.degrees or any(isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 5
                                   for d in self.degrees) or len(set(self.degrees)) != len(self.degrees):
            raise ValueError(f"degrees must be distinct integers in 1..5, got {self.degrees}")
        if self.covariance not in ("empirical", "ledoit-wolf"):
            raise ValueError(f"covariance must be 'empirical' or 'ledoit-wolf', got {self.covariance!r}")
        if self.layers is not None:
            if not isinstance(self.layers, tuple) or not self.layers or \
                    any(isinstance(i, bool) or not isinstance(i, int) for i in self.layers) or \
                    len(set(self.layers)) != len(self.layers):
                raise ValueError(f"layers must be None (all blocks) or a non-empty tuple of distinct block indices "
                                 f"(negative ones count from the last block), got {self.layers!r}")
        if not isinstance(self.capture, CaptureConfig) or not isinstance(self.hybrid, FinetuneConfig):
            raise TypeError(f"capture must be a CaptureConfig and hybrid a FinetuneConfig, got "
                            f"{type(self.capture).__name__}, {type(self.hybrid).__name__}")
        check_int(self.mixture_components, "mixture_components", minimum=1)
        for name in ("mixture_fit_samples", "splice_sequences", "n_output_dirs", "n_eigen"):
            check_int(getattr(self, name), name, minimum=1)
        if not 0.0 < self.val_fraction < 0.5:
            raise ValueError(f"val_fraction must be in (0, 0.5), got {self.val_fraction}")
        if any(not (isinstance(i, int) and isinstance(s, str)) for i, s in self.saes):
            raise ValueError(f"saes must be (layer index, directory) pairs, got {self.saes!r}")
        if self.run not in ("full", "quick"):
            raise ValueError(f"run must be 'full' or 'quick', got {self.run!r}")

    @classmethod
    def quick(cls, **kw) -> TransformerExperiment:
        """A pipeline check in under 3 minutes on a 2-core CPU: the first block only (every input model and degree runs
        on it; a second block would repeat the same code), fewer tokens, a small mixture, a short fine-tune, fewer
        splice sequences (no verdicts)."""
        base = dict(layers=(0,), capture=CaptureConfig(max_tokens=8_000, keep_fit=8_000), mixture_components=3,
                    mixture_fit_samples=3_000, hybrid=FinetuneConfig(steps=30, batch_size=512),
                    splice_sequences=8, run="quick")
        base.update(kw)
        return cls(**base)
