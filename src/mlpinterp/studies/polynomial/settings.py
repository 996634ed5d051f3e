"""Configuration of ``mlpinterp reproduce polynomial`` (torch-free: the CLI builds ``--help`` from it).

``DATASET_DEFAULTS`` and ``SMOKE`` are the values the run resolves to and the values ``--help`` shows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from mlpinterp.data.dataset import check_data_path
from mlpinterp.models.config import ClassifierConfig

DATASET_DEFAULTS = {
    # width, learning rate, steps, Monte Carlo samples of the mixture
    "digits": dict(d_hidden=256, lr=5e-3, steps=8192, mc_samples=20_000),
    "mnist": dict(d_hidden=512, lr=5e-3, steps=8192, mc_samples=20_000),
    "fashion-mnist": dict(d_hidden=512, lr=5e-3, steps=8192, mc_samples=20_000),
}
SMOKE = dict(d_hidden=32, steps=256, mc_samples=4000, warmup_steps=64, max_image_side=8)
#: PolynomialReproConfig fields added after the first version that wrote a run's config.json, with the behaviour
#: of a run without each (not today's defaults): a run directory written before a field existed resumes when the
#: request keeps that behaviour (:func:`mlpinterp.utils.config_diff.config_diff`'s ``implicit``). ``covariance``:
#: the plain class covariances; ``quadratic_mixture_steps``: the mixture quadratic at every checkpoint;
#: ``mixture_cg_dtype`` and ``max_image_side``: a float64 CG operator, no pooling. Add a field here when it is
#: added to PolynomialReproConfig.
ADDED_FIELDS = {"covariance": "empirical", "quadratic_mixture_steps": "all", "mixture_cg_dtype": "float64",
                "max_image_side": None}


@dataclass(frozen=True)
class PolynomialReproConfig:
    """Configuration of ``reproduce polynomial`` (every field documented for ``--help``)."""

    dataset: Literal["digits", "mnist", "fashion-mnist"] = "digits"
    """``digits`` (bundled with scikit-learn), ``mnist`` or ``fashion-mnist`` (IDX files)."""
    seeds: int = 3
    """Number of independent training seeds (0..seeds-1)."""
    steps: int | None = None
    """Training steps (default: the dataset's, ``DATASET_DEFAULTS``)."""
    d_hidden: int | None = None
    """Hidden width (default: the dataset's, ``DATASET_DEFAULTS``)."""
    lr: float | None = None
    """Peak learning rate of schedule-free AdamW (default: the dataset's, ``DATASET_DEFAULTS``)."""
    arch: Literal["mlp", "glu"] = "mlp"
    """``mlp`` or ``glu``."""
    activation: Literal["relu", "gelu", "silu", "tanh", "identity"] = "relu"
    """Hidden activation (for glu: the gate; relu = ReGLU, silu = SwiGLU)."""
    warmup_steps: int = 1000
    """Linear learning-rate warm-up steps (paper: 1000); used as given, also beyond ``steps``."""
    mc_samples: int | None = None
    """Monte Carlo samples of the mixture for FVU/KL under the mixture (default: the dataset's, ``DATASET_DEFAULTS``)."""
    covariance: Literal["ledoit-wolf", "empirical"] = "ledoit-wolf"
    """Class covariance estimator: ``ledoit-wolf`` (shrunk, full rank) or ``empirical`` (singular on real images)."""
    quadratic_mixture_steps: Literal["all", "final"] = "all"
    """Checkpoints that get the exact mixture quadratic: ``all`` (the paper's Figure 2; at MNIST scale each CG solve
    is warm-started from the previous checkpoint's) or ``final`` (``auto``, from earlier versions, means ``all``)."""
    mixture_cg_dtype: Literal["auto", "bfloat16", "float32", "float64"] = "auto"
    """Precision of the CG operator for the mixture quadratic when the dense solve does not fit (MNIST):
    ``auto`` (the library default: bfloat16 GEMMs on a CPU with fast bfloat16, whose answer on empirical classes
    is the canonical one on the classes' supports only; without fast bfloat16, float32 on full-rank classes, e.g.
    Ledoit-Wolf, and float64 when the operator is not provably non-singular, e.g. empirical classes),
    ``bfloat16``, ``float32`` (float64 residuals and refinement, the same stopping rule, decided in float64, for
    each) or ``float64`` (the canonical answer everywhere)."""
    max_image_side: int | None = None
    """Average-pool the images to at most this many pixels per side before anything else (default: full size)."""
    attack_k: int = 10
    """Largest number of ablated input directions in the SVD attack."""
    data_path: str | None = field(default=None, metadata={"cli": {"flag": "--data", "aliases": ("--data-path",),
                                                                  "metavar": "DIR"}})
    """Directory holding the IDX files (default: $MLPINTERP_DATA or ../shared/data/<dataset>)."""
    smoke: bool = field(default=False, metadata={"cli": {"flag": "--quick", "aliases": ("--smoke",)}})
    """Tiny configuration for CI that runs in seconds on every dataset: a small network, few steps, and images
    average-pooled to at most 8 pixels per side (MNIST / Fashion-MNIST 28x28 -> 7x7, so the mixture quadratic is
    a small dense solve; digits stay 8x8)."""
    extra: dict = field(default_factory=dict, metadata={"cli": {"cli": False}})
    """Further settings for the run (Python API only)."""

    def __post_init__(self) -> None:
        self.resolved()  # refuses an invalid field on construction

    def resolved(self) -> dict:
        """Fill dataset defaults (and the smoke overrides) into a plain dict."""
        if self.dataset not in DATASET_DEFAULTS:
            raise ValueError(f"dataset must be one of {sorted(DATASET_DEFAULTS)}, got {self.dataset!r}")
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        check_data_path(self.dataset, self.data_path, "data_path", "dataset")  # before anything is written
        d = dict(DATASET_DEFAULTS[self.dataset])
        d["warmup_steps"] = self.warmup_steps
        d["max_image_side"] = None
        if self.smoke:
            d.update(SMOKE)
        for k in ("steps", "d_hidden", "lr", "mc_samples", "max_image_side"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.covariance not in ("ledoit-wolf", "empirical"):
            raise ValueError(f"covariance must be 'ledoit-wolf' or 'empirical', got {self.covariance!r}")
        if self.quadratic_mixture_steps not in ("auto", "all", "final"):
            raise ValueError(f"quadratic_mixture_steps must be 'all' or 'final', got {self.quadratic_mixture_steps!r}")
        if self.mixture_cg_dtype not in ("auto", "bfloat16", "float32", "float64"):
            raise ValueError(f"mixture_cg_dtype must be 'auto', 'bfloat16', 'float32' or 'float64', got "
                             f"{self.mixture_cg_dtype!r}")
        if d["max_image_side"] is not None and (isinstance(d["max_image_side"], bool)
                                                or not isinstance(d["max_image_side"], int) or d["max_image_side"] < 1):
            raise ValueError(f"max_image_side must be a positive int or None, got {d['max_image_side']!r}")
        if d["steps"] < 16:
            raise ValueError(f"steps must be >= 16 (first checkpoint), got {d['steps']}")
        if d["mc_samples"] < 2:
            raise ValueError(f"mc_samples must be >= 2, got {d['mc_samples']}")
        if self.attack_k < 0:
            raise ValueError(f"attack_k must be >= 0, got {self.attack_k}")
        # validate the training hyper-parameters now, before anything is written
        ClassifierConfig(d_in=1, n_classes=2, d_hidden=d["d_hidden"], arch=self.arch, activation=self.activation,
                         lr=d["lr"], warmup_steps=d["warmup_steps"], steps=d["steps"])
        out = asdict(self)
        out.update(d)
        return out
