"""Settings of ``reproduce three-spaces``: which MLP each setting opens, and the quick and full budgets of the three
decompositions (presets are data).

- ``resid-mlp-1``: the residual MLP of the SPD paper (100 features embedded by ``W_E`` into ``d_embed = 1000``, one
  block of 50 ReLU neurons); the MLP is the block ``r -> W_out ReLU(W_in r + b_in) + b_out``, its input the residual
  stream ``r = x W_E``, its ground-truth input directions the rows of ``W_E``; outputs are read through the
  unembedding ``W_U = W_E^T`` (the 100 directions the model reads the block's output along).
- ``tms-5-2``: the toy model of superposition ``ReLU(W^T W x + b)``; the MLP is ``h -> ReLU(W^T h + b)`` on the
  hidden activation ``h = W x`` (``d_in = 2``), its ground-truth input directions the feature columns ``W[:, i]``.
- ``minilm``: all-MiniLM-L6-v2's FFN block at ``--layer`` on captured real inputs (no ground truth).
- ``lm``: a causal LM's FFN block at ``--layer`` (``--model DIR``, or a small one trained by ``train-lm``), with the
  downstream loss recovered when each decomposition replaces the block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SETTINGS = ("resid-mlp-1", "tms-5-2", "minilm", "lm")
TOYS = ("resid-mlp-1", "tms-5-2")

RECOVERED_COSINE = 0.9
"""A true feature counts as recovered by a method when one of the method's directions has ``|cos| >= 0.9`` with it."""

BASELINE_DRAWS = 20
"""Random direction sets per baseline (mean and standard error over them)."""

METHODS = ("quadratic", "linear", "spd", "sae")
"""Direction sets compared: the approximant's quadratic eigen-features and linear singular directions (function
space), SPD's alive input-site read directions ``V_c`` (parameter space), the SAE's alive decoder directions
(activation space)."""

METHOD_LABELS = {"quadratic": "quadratic eigen-features", "linear": "linear SVD directions",
                 "spd": "SPD read directions V_c", "sae": "SAE decoder directions"}


@dataclass(frozen=True)
class Preset:
    """Budgets of one setting at one preset."""

    n_fit: int
    """Inputs the approximants are fitted on (toys: drawn; transformers: at most this many captured tokens)."""
    n_test: int
    """Held-out inputs every faithfulness number and every alive/L0 count is measured on."""
    sae_d_sae: int
    """SAE latents."""
    sae_k: int
    """SAE TopK k."""
    sae_steps: int
    """SAE optimiser steps. resid-MLP-1's full preset: 3,000 at batch 1024 (3 M inputs, each feature active in about
    30,000 of them), four times the quick preset's inputs, at which the Adam SAE recovered 99 of the 100 features
    (docs/measurements.md, "Three spaces"); SPD's 20,000 steps, not the SAE, set the run's length."""
    sae_batch: int
    """SAE batch size."""
    sae_config: dict = field(default_factory=dict)
    """Other :class:`~mlpinterp.sae.mfr.MfrConfig` fields of the SAE (empty: the package's default recipe)."""
    spd: dict = field(default_factory=dict)
    """SPD: the SPD study's preset of the setting at its default recipe with these fields replaced (toys), or the
    configuration fields of a block decomposition (transformers). resid-MLP-1's full preset is the SPD study's
    reduced preset unchanged (20,000 steps at batch 256, C = 100, the current recipe, on the reference's bias-free
    target): the budget at which that study finds one causally important ``mlp_in`` subcomponent per feature on 94 to
    100 of the 100 features per seed (docs/measurements.md, "SPD"), against 42 of 100 at 5,000 steps."""
    spd_preset: str = "quick"
    """Toys: the SPD study's preset (``"quick"`` or ``"paper"``) that :attr:`spd` overrides."""
    n_readouts: int = 0
    """Transformers: output principal directions whose quadratic forms give the eigen-features (toys: the model's
    own readouts)."""
    max_tokens: int = 0
    """Transformers: tokens captured (fit + held-out)."""
    lm_train: dict = field(default_factory=dict)
    """``lm`` without ``--model``: the ``train-lm`` configuration fields of the small LM trained first."""
    splice_sequences: int = 0
    """Transformers: held-out sequences of the downstream comparison."""


_ADAM_SAE = dict(optimizer="adam")
"""Every setting's SAE trains with Adam, at the small d_sae and batch sizes of these presets. The default schedule-free
Signum recipe (measured at d_sae 3072, batch 4096) scales its lr as
``5e-3 / sqrt(d_sae / 2**14)``, 0.045 per coordinate at d_sae = 200, and on these 1000-wide inputs (100-dimensional
support) its SAE ended worse than the mean (input FVU 1.72, 64 of 100 features recovered) where Adam's recovered
99 of 100 at input FVU 0.031 (quick preset, seed 0, the same target; docs/measurements.md, "Three spaces"); on the
MiniLM quick preset (d_sae 768, batch 256) the Signum SAE spliced into the model recovered less than zeroing the block
(cosine recovered -0.23)."""

_BLOCK_SPD = dict(d_gate=16, lr=1e-3, lr_schedule="constant", importance_minimality_coeff=1e-4, pnorm=2.0,
                  log_every=100, checkpoint_every=250, compile=False)
"""SPD of a transformer block: checkpointed every 250 steps under ``out/spd/seed_{seed}``, so an interrupted full
preset resumes there instead of starting again."""

PRESETS: dict[str, dict[str, Preset]] = {
    "resid-mlp-1": {
        "quick": Preset(n_fit=20_000, n_test=10_000, sae_d_sae=200, sae_k=3, sae_steps=1500, sae_batch=512,
                        sae_config=_ADAM_SAE, spd=dict(steps=2000, batch_size=256, log_every=500, compile=False)),
        "full": Preset(n_fit=100_000, n_test=20_000, sae_d_sae=200, sae_k=3, sae_steps=3000, sae_batch=1024,
                       sae_config=_ADAM_SAE, spd=dict()),
    },
    "tms-5-2": {
        "quick": Preset(n_fit=20_000, n_test=10_000, sae_d_sae=5, sae_k=1, sae_steps=800, sae_batch=512,
                        sae_config=_ADAM_SAE, spd=dict(steps=3000, log_every=500, compile=False)),
        "full": Preset(n_fit=100_000, n_test=20_000, sae_d_sae=5, sae_k=1, sae_steps=10_000, sae_batch=1024,
                       sae_config=_ADAM_SAE, spd=dict(), spd_preset="paper"),
    },
    "minilm": {
        "quick": Preset(n_fit=8_000, n_test=2_000, sae_d_sae=768, sae_k=16, sae_steps=600, sae_batch=256,
                        sae_config=_ADAM_SAE, spd=dict(_BLOCK_SPD, C=128, steps=300, batch_size=128),
                        n_readouts=16, max_tokens=12_000, splice_sequences=16),
        "full": Preset(n_fit=40_000, n_test=10_000, sae_d_sae=1536, sae_k=32, sae_steps=4000, sae_batch=512,
                       sae_config=_ADAM_SAE, spd=dict(_BLOCK_SPD, C=512, steps=3000, batch_size=256),
                       n_readouts=64, max_tokens=60_000, splice_sequences=64),
    },
    "lm": {
        "quick": Preset(n_fit=8_000, n_test=2_000, sae_d_sae=512, sae_k=16, sae_steps=600, sae_batch=256,
                        sae_config=_ADAM_SAE, spd=dict(_BLOCK_SPD, C=128, steps=300, batch_size=128),
                        n_readouts=16, max_tokens=12_000, splice_sequences=16,
                        lm_train=dict(steps=150, n_layer=2, d_model=128, n_head=4, vocab_size=2048)),
        "full": Preset(n_fit=40_000, n_test=10_000, sae_d_sae=1024, sae_k=32, sae_steps=4000, sae_batch=512,
                       sae_config=_ADAM_SAE, spd=dict(_BLOCK_SPD, C=512, steps=3000, batch_size=256),
                       n_readouts=64, max_tokens=60_000, lm_train=dict(), splice_sequences=64),
    },
}

DEFAULT_LAYER = {"minilm": 3, "lm": 1}
"""The FFN block read when ``--layer`` is not given."""


def preset(setting: str, quick: bool) -> Preset:
    """The :class:`Preset` of ``setting`` (``quick`` or ``full``); ``ValueError`` for an unknown setting."""
    if not isinstance(setting, str) or setting not in PRESETS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    return PRESETS[setting]["quick" if quick else "full"]
