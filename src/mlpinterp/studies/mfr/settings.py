"""Settings of ``reproduce mfr`` (Marks et al. 2024): the conditions compared, the paper's numbers, and one
configuration dataclass per setting (synthetic data, MiniLM, a causal LM, EEG) whose defaults are the presets and
whose ``quick()`` is the reduced CPU preset. Torch-free: the CLI builds ``--help`` from these."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mlpinterp.data.eeg import EegConfig

PAPER = {
    "synthetic_correlation_baseline": 0.625,
    "synthetic_correlation_reinit": 0.668,
    "gpt2_max_reconstruction_improvement_pct": 21.21,
    "eeg_max_reconstruction_improvement_pct": 6.67,
    "gpt2_layer0_mlp_ce_clean": 3.12,
    "gpt2_layer0_mlp_ce_zero_ablated": 132.27,
}
"""Numbers quoted in Marks et al. 2024 (abstract and sec. 4)."""

CONDITIONS = {"baseline": (False, False), "reinit": (False, True), "mfr": (True, True)}
"""Condition -> (penalty, reinit)."""


def conditions(base: tuple[str, ...], alpha: float | None,
               extra_alphas: tuple[float, ...]) -> dict[str, tuple[bool, bool, float | None]]:
    """Condition name -> (penalty, reinit, alpha): the ``base`` names of :data:`CONDITIONS` with ``alpha``,
    then ``mfr_alpha{a}`` (penalty + re-initialisation) for every fixed weight ``a`` in ``extra_alphas``.

    Raises ``ValueError`` for a negative or non-finite extra alpha."""
    out = {name: (*CONDITIONS[name], alpha) for name in base}
    for a in extra_alphas:
        if not (np.isfinite(a) and a >= 0):
            raise ValueError(f"extra_alphas must hold finite weights >= 0, got {a!r}")
        out[f"mfr_alpha{a:g}"] = (True, True, float(a))
    return out


@dataclass(frozen=True)
class MfrRuns:
    """The runs of every MFR setting: k values x seeds x conditions (baseline, MFR, fixed-alpha MFR)."""

    k_values: tuple[int, ...] = (6, 12, 18, 24, 30)
    """TopK k values."""

    seeds: int = 3
    """Seeds per (k, condition)."""

    n_saes: int = 2
    """SAEs trained in parallel."""

    alpha: float | None = None
    """MFR penalty weight; None: initial penalty = initial reconstruction loss (the paper's rule)."""

    extra_alphas: tuple[float, ...] = (0.1,)
    """Fixed penalty weights run as extra conditions ``mfr_alpha{a}``."""

    optimizer: str = "adam"
    """SAE optimiser (:class:`~mlpinterp.sae.mfr.MfrConfig` ``optimizer``); Adam, as the paper."""

    auxk_alpha: float = 0.0
    """Weight of the AuxK loss; 0, as the paper's SAEs (AuxK revives the dead latents re-initialisation acts on)."""

    inactivity_measure: str = "mean_relative_deviation"
    """Inactivity measure (:data:`mlpinterp.sae.inactivity.INACTIVITY_MEASURES`): the paper's example by default."""

    inactivity_threshold: float = 1.0
    """Re-initialise an SAE whose measure exceeds this (the paper's threshold for its measure)."""


@dataclass(frozen=True)
class SyntheticExperiment(MfrRuns):
    """Settings of the synthetic reproduction (defaults: the paper's data, G=512, d=256, E=12, lambda=0.99)."""

    k_values: tuple[int, ...] = (6, 12, 18, 24, 30)
    """TopK k, also the number of active features K per sample."""

    steps: int = 4000
    """Optimisation steps per run."""

    batch_size: int = 1024
    """Samples per step."""

    d_sae: int = 512
    """Latents (= G, the number of true features)."""

    tied: bool = True
    """Tied decoder (the paper's setting)."""

    reinit_until_frac: float = 0.5
    """No re-initialisation in the second half of training."""

    eval_samples: int = 8192
    """Held-out samples for FVU and firing rates."""

    @classmethod
    def quick(cls, **kw) -> SyntheticExperiment:
        """A pipeline check within minutes on a CPU: k = 6, 2 seeds, 400 steps of 512 samples."""
        return cls(**{"k_values": (6,), "seeds": 2, "steps": 400, "batch_size": 512, "eval_samples": 4096, **kw})


@dataclass(frozen=True)
class MinilmExperiment(MfrRuns):
    """Settings of the MiniLM reproduction."""

    seeds: int = 1
    """Seeds per (k, condition)."""

    model: str = "minilm"
    """'minilm' (embedded, sentence-embedding loss recovered) or a local causal LM such as 'gpt2' (CE loss recovered)."""

    hook_point: str = "encoder.layer.3.output"
    """Residual stream after block 3 (d_in = 384); for GPT-2 use e.g. ``transformer.h.5``."""

    d_sae: int = 3072
    """Latents (expansion factor 8)."""

    steps: int = 2000
    """Optimisation steps."""

    batch_size: int = 2048
    """Activations per step."""

    ctx_len: int = 128
    """Tokens per sequence."""

    train_chunks: int = 4000
    """Text chunks used for training activations."""

    eval_chunks: int = 64
    """Held-out chunks (wikitext-2 test) for FVU and loss recovered."""

    rematch_every: int = 10
    """Hungarian re-matching period (steps)."""

    @classmethod
    def quick(cls, **kw) -> MinilmExperiment:
        """A pipeline check within minutes on a CPU: k = 6, 1 seed, 200 steps of 1024 activations."""
        return cls(**{"k_values": (6,), "seeds": 1, "d_sae": 1536, "steps": 200, "batch_size": 1024, "ctx_len": 64,
                      "train_chunks": 600, "eval_chunks": 32, "rematch_every": 25, **kw})


@dataclass(frozen=True)
class LmExperiment(MinilmExperiment):
    """Settings of ``reproduce mfr --setting lm``: the paper's Table 2 protocol on a causal LM's layer-0 MLP output
    (GPT-2 Small in the paper; a model trained by ``mlpinterp train-lm``, or any local causal LM)."""

    model: str = "gpt2"
    """A local causal LM: a ``train-lm`` output directory, or ``gpt2`` (its weights must be on disk)."""

    hook_point: str = "transformer.h.0.mlp"
    """Layer-0 MLP output, before the residual add (the paper's GPT-2 Small hook)."""



@dataclass(frozen=True)
class EegExperiment(MfrRuns):
    """Settings of ``reproduce mfr --setting eeg`` (defaults: the paper's k, latents, batch and learning rate)."""

    k_values: tuple[int, ...] = (12, 24, 36, 48, 60)
    """TopK k values (the paper's)."""
    seeds: int = 1
    """Seeds per (k, condition)."""
    d_sae: int = 4096
    """Latents (the paper's hidden size)."""
    steps: int = 2000
    """Optimisation steps (ours; the paper does not state them)."""
    batch_size: int = 1024
    """Vectors per step (the paper's)."""
    lr: float = 1e-3
    """Adam learning rate (the paper's)."""
    rematch_every: int = 10
    """Hungarian re-matching period (steps)."""
    eval_vectors: int = 16384
    """Held-out vectors for the metrics (at most; the first ones of the held-out recordings)."""
    eeg: EegConfig = field(default_factory=EegConfig)
    """Preprocessing and vectorisation (band-pass 0.5-45 Hz order 5 at 128 Hz, windows of 32 samples)."""

    @classmethod
    def quick(cls, **kw) -> EegExperiment:
        """A pipeline check in minutes on a CPU: k = 6, 1 seed, 512 latents, 200 steps of 256 vectors."""
        return cls(**{"k_values": (6,), "seeds": 1, "d_sae": 512, "steps": 200, "batch_size": 256, "rematch_every": 25,
                      "eval_vectors": 4096, **kw})
