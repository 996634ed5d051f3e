"""Settings of ``reproduce spd`` (Bushnaq, Braun, Sharkey 2025): the paper's presets, reduced CPU presets, the
reference implementation's current recipe, the target recipe of each setting and the papers' numbers. Presets are
data: ``SPDConfig`` values and the field overrides of each recipe.
"""

from __future__ import annotations

from mlpinterp.spd import SPDConfig, with_overrides
from mlpinterp.utils.validation import check_bool

SETTINGS = ("tms-5-2", "tms-40-10", "tms-5-2-id", "tms-40-10-id", "resid-mlp-1", "resid-mlp-2", "resid-mlp-3")

#: SPD paper, Table 1 (one run each; the ± is the spread over the target's features).
PAPER = {"tms-5-2": {"mmcs": (1.000, 0.000), "ml2r": (0.993, 0.002)},
         "tms-40-10": {"mmcs": (1.000, 0.000), "ml2r": (1.010, 0.007)},
         "tms-5-2-id": {"mmcs": (1.000, 0.000), "ml2r": (0.992, 0.010)},
         "tms-40-10-id": {"mmcs": (1.000, 0.000), "ml2r": (1.031, 0.001)}}

#: APD paper, Table 1 (Braun et al. 2025; one run each, ± over the target's features): cited beside SPD's numbers.
APD_PAPER = {"tms-5-2": {"mmcs": (0.998, 0.000), "ml2r": (0.893, 0.004)},
             "tms-40-10": {"mmcs": (0.996, 0.003), "ml2r": (0.935, 0.001)}}

# TMS as the SPD reference decomposes it: linear2's subcomponents are linear1's transposed (tied), each site with its
# own causal importances, and the reference's initialisation of the paper's time (each subcomponent the target's
# projection on random unit directions); both measured in docs/measurements.md "SPD"
_TMS = dict(C=20, d_gate=16, steps=40_000, batch_size=4096, lr=1e-3, lr_schedule="cosine",
            importance_minimality_coeff=3e-3, pnorm=1.0, log_every=500, checkpoint_every=2000, compile=True,
            tied=(("linear1", "linear2"),), init="paper-era")
_TMS40 = dict(_TMS, C=200, importance_minimality_coeff=1e-4, pnorm=2.0, checkpoint_every=500)
_RESID = dict(d_gate=16, batch_size=2048, lr_schedule="constant", pnorm=2.0, log_every=500, checkpoint_every=500,
              compile=True)

#: Paper presets (SPD paper, appendix).
PRESETS: dict[str, SPDConfig] = {
    "tms-5-2": SPDConfig(targets=("linear1", "linear2"), **_TMS),
    "tms-40-10": SPDConfig(targets=("linear1", "linear2"), **_TMS40),
    "tms-5-2-id": SPDConfig(targets=("linear1", "identity", "linear2"), **_TMS),
    "tms-40-10-id": SPDConfig(targets=("linear1", "identity", "linear2"), **_TMS40),
    "resid-mlp-1": SPDConfig(targets=("layers.0.mlp_in", "layers.0.mlp_out"), C=100, steps=30_000, lr=2e-3,
                             importance_minimality_coeff=1e-5, **_RESID),
    "resid-mlp-2": SPDConfig(targets=tuple(f"layers.{i}.{n}" for i in range(2) for n in ("mlp_in", "mlp_out")),
                             C=400, steps=50_000, lr=1e-3, importance_minimality_coeff=1e-5, **_RESID),
    "resid-mlp-3": SPDConfig(targets=tuple(f"layers.{i}.{n}" for i in range(3) for n in ("mlp_in", "mlp_out")),
                             C=500, steps=200_000, lr=1e-3, importance_minimality_coeff=5e-6,
                             **dict(_RESID, d_gate=128)),
}

#: Reduced presets for a CPU (same losses and coefficients; fewer steps, smaller batches). TMS 5-2 takes lr 1e-2 at
#: this budget and resid-MLP-1 20k steps at batch 256 (the probes behind both: docs/measurements.md); resid-MLP-2
#: and -3 are pipeline checks.
QUICK: dict[str, dict] = {
    "tms-5-2": dict(steps=5000, batch_size=1024, lr=1e-2, log_every=250),
    "tms-40-10": dict(steps=2000, batch_size=512, log_every=100),
    "tms-5-2-id": dict(steps=5000, batch_size=1024, lr=1e-2, log_every=250),
    "tms-40-10-id": dict(steps=2000, batch_size=512, log_every=100),
    "resid-mlp-1": dict(steps=20_000, batch_size=256, log_every=1000),
    "resid-mlp-2": dict(steps=2000, batch_size=128, log_every=100),
    "resid-mlp-3": dict(steps=500, batch_size=64, log_every=50),
}

RECIPES = ("paper", "current")
"""``paper``: the SPD paper's presets (above). ``current``: the SPD reference implementation's recipe of today
(goodfire-ai/spd at 3f0bb61e, Feb 2026, its ``tms_*_config.yaml`` and ``resid_mlp{1,3}_config.yaml``)."""

#: What the current reference recipe changes in every preset: a delta component instead of the faithfulness loss,
#: a 200-step faithfulness warm-up (AdamW, lr 0.01, weight decay 0.1), fresh masks for the layerwise loss, the
#: "scaled" initialisation, the lower hard sigmoid clamped to [0, 1] with an upward-only gradient leak
#: (spd/models/sigmoids.py) and tied TMS factors as two optimiser parameters over one storage (run_spd.py).
_CURRENT_ALL = dict(delta_component=True, faithfulness_coeff=0.0, faithfulness_warmup_steps=200,
                    faithfulness_warmup_lr=0.01, faithfulness_warmup_weight_decay=0.1, layerwise_masks="fresh",
                    init="scaled", lower_sigmoid="clamped", tied_updates="separate")
#: ... and per setting (its step counts; its "cosine" is a half-period cosine annealing).
_CURRENT_TMS = dict(_CURRENT_ALL, steps=10_000, lr_schedule="cosine-annealing")
CURRENT: dict[str, dict] = {
    "tms-5-2": _CURRENT_TMS,
    "tms-40-10": _CURRENT_TMS,
    "tms-5-2-id": _CURRENT_TMS,
    "tms-40-10-id": dict(_CURRENT_TMS, steps=20_000),
    "resid-mlp-1": dict(_CURRENT_ALL, steps=20_000),
    "resid-mlp-3": dict(_CURRENT_ALL, steps=50_000, importance_minimality_coeff=1e-5),
}
_NO_CURRENT = {"resid-mlp-2": "the reference's current resid-MLP-2 recipe uses a causal-importance MLP shared by all "
                              "subcomponents and PGD reconstruction losses, which mlpinterp does not implement"}


def default_recipe(setting: str) -> str:
    """The recipe ``reproduce spd`` runs without ``--recipe``: ``"current"`` wherever it is implemented, ``"paper"``
    for resid-MLP-2 (the current recipe is not): the current recipe measured better across seeds wherever both ran
    (docs/measurements.md "SPD"). Raises ``ValueError`` for an unknown setting."""
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    return "paper" if setting in _NO_CURRENT else "current"


def spd_config(name: str, quick: bool, seed: int, recipe: str = "paper", **overrides) -> SPDConfig:
    """The SPD configuration of ``name`` (paper or quick preset of ``recipe``, see :data:`RECIPES`) with ``seed`` and
    ``overrides`` applied (the quick preset's fields replace the recipe's: steps, batch size, logging and, for
    TMS 5-2 with or without the identity, the learning rate 1e-2).

    Raises ``ValueError`` for an unknown setting or recipe, the current recipe of resid-MLP-2 (not implemented:
    the message says why) or unknown override fields; ``TypeError`` for a ``quick`` that is not a bool."""
    check_bool(quick, "quick")  # a string such as "no" would be truthy: the quick preset, silently
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {name!r}")
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    if recipe == "current" and name in _NO_CURRENT:
        raise ValueError(f"recipe 'current' is not available for {name}: {_NO_CURRENT[name]}; use recipe 'paper'")
    kw = dict(CURRENT[name]) if recipe == "current" else {}
    kw.update(QUICK[name] if quick else {})
    kw.update(overrides)
    kw["seed"] = seed
    return with_overrides(PRESETS[name], **kw)


def target_fidelity(name: str) -> str:
    """The APD target recipe (``fidelity``) whose targets are the SPD reference's for setting ``name``: ``"ours"``
    for TMS (lr 5e-3, constant: the SPD reference's, whatever APD's default for the setting is, TMS 40-10's being
    linear decay), ``"reference"`` for the residual MLPs (MLPs without biases, 1k steps (10k for resid-MLP-3),
    :data:`mlpinterp.toys.settings.REFERENCE_TARGET`; on the biased targets of ``"ours"`` resid-MLP-1's ``W_out``
    splits, docs/measurements.md "SPD"). Raises ``ValueError`` for an unknown setting (it would otherwise get
    ``"reference"``)."""
    if name not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {name!r}")
    return "ours" if name.startswith("tms") else "reference"

