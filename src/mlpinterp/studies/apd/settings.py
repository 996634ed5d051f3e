"""Settings of ``reproduce apd`` (Braun et al. 2025): the paper's presets (App. D), reduced CPU presets, the
reference implementation's recipe for TMS, and the paper's Table 1 numbers. Presets are data: ``APDConfig`` values.
"""

from __future__ import annotations

from mlpinterp.apd import APDConfig
from mlpinterp.paramspace import reference_rank
from mlpinterp.toys import TMS_PRESETS
from mlpinterp.toys.settings import resolve_fidelity
from mlpinterp.utils.validation import check_bool

SETTINGS = ("tms-5-2", "tms-40-10", "resid-mlp-1", "resid-mlp-2", "gated-trig")

#: APD paper, Table 1 (one run each; the ± is the spread over the target's features).
PAPER = {
    "tms-5-2": {"mmcs": (0.998, 0.000), "ml2r": (0.893, 0.004)},
    "tms-40-10": {"mmcs": (0.996, 0.003), "ml2r": (0.935, 0.001)},
}

_TMS52 = APDConfig(targets=("W",), C=5, m=None, steps=20_000, batch_size=2048, lr=3e-2, lr_schedule="constant",
                   warmup_frac=0.05, topk=0.211, faithfulness_coeff=1.0, minimality_coeff=1.0,
                   simplicity_coeff=0.7, schatten_p=1.0, attribution_source="apd", log_every=500,
                   checkpoint_every=2000)
_TMS4010 = APDConfig(targets=("W",), C=50, m=None, steps=20_000, batch_size=2048, lr=1e-3, lr_schedule="cosine",
                     warmup_frac=0.05, topk=1.0, faithfulness_coeff=1.0, minimality_coeff=10.0,
                     simplicity_coeff=20.0, schatten_p=0.9, attribution_source="target", log_every=500,
                     checkpoint_every=500)
_RESID1 = APDConfig(targets=("layers.0.mlp_in", "layers.0.mlp_out"), C=130, m=1, steps=40_000, batch_size=2048,
                    lr=1e-3, lr_schedule="cosine", warmup_frac=0.01, topk=1.28, faithfulness_coeff=1.0,
                    minimality_coeff=1.0, simplicity_coeff=10.0, schatten_p=0.9, act_recon_coeff=1.0,
                    act_names=("layers.0.act",), unit_norm_B=True, log_every=500, checkpoint_every=250)
_RESID2 = APDConfig(targets=("layers.0.mlp_in", "layers.0.mlp_out", "layers.1.mlp_in", "layers.1.mlp_out"),
                    C=200, m=1, steps=10_000, batch_size=2048, lr=1e-3, lr_schedule="cosine", warmup_frac=0.01,
                    topk=1.28, faithfulness_coeff=1.0, minimality_coeff=2.0, simplicity_coeff=7.0, schatten_p=0.9,
                    act_recon_coeff=1.0, act_names=("layers.0.act", "layers.1.act"), log_every=500,
                    checkpoint_every=250)
_GATED = APDConfig(targets=("layers.0.mlp_in", "layers.0.mlp_out", "layers.1.mlp_in", "layers.1.mlp_out"), C=4,
                   m=None, steps=200_000, batch_size=10_000, lr=3e-3, lr_schedule="cosine", warmup_frac=0.004,
                   topk=0.2217, faithfulness_coeff=0.1, minimality_coeff=5.0, simplicity_coeff=5.0, schatten_p=1.0,
                   log_every=1000, checkpoint_every=5000)

#: Paper presets (App. D). The paper does not state the inner rank m of the residual-MLP runs; we use m = 1
#: (the paper reports rank-one components work at least as well, App. C.2).
PRESETS: dict[str, APDConfig] = {"tms-5-2": _TMS52, "tms-40-10": _TMS4010, "resid-mlp-1": _RESID1,
                                 "resid-mlp-2": _RESID2, "gated-trig": _GATED}

#: Reduced presets for a CPU (same coefficients, fewer steps / smaller batches).
QUICK: dict[str, dict] = {
    "tms-5-2": dict(steps=5000, log_every=250),
    "tms-40-10": dict(steps=5000, log_every=250),
    "resid-mlp-1": dict(steps=5000, batch_size=256, log_every=250),
    "resid-mlp-2": dict(steps=4000, batch_size=256, log_every=250),
    "gated-trig": dict(steps=8000, batch_size=2048, lr_schedule="cosine", log_every=400),
}

#: ``fidelity``: ``"ours"`` (the presets above) or ``"reference"`` (the APD/SPD reference implementation's way: for

def reference_overrides(name: str) -> dict:
    """APDConfig fields of ``fidelity="reference"`` for TMS setting ``name``: inner rank ``min(d_in, d_hidden) + 1``,
    the reference's small 4-D Xavier initialisation, AdamW without weight decay, quarter-cosine schedule after the
    preset's linear warm-up (5 % of the steps: 1000 of the paper's 20k), and the preset's attribution source
    (the target for TMS 40-10, the APD model for TMS 5-2, as the paper).

    Raises ``ValueError`` for a setting that is not TMS."""
    if not isinstance(name, str) or name not in TMS_PRESETS:
        raise ValueError(f"fidelity='reference' is defined for {tuple(TMS_PRESETS)} only, got setting {name!r}")
    t = TMS_PRESETS[name]
    return dict(m=reference_rank(t.d_hidden, t.n_features), init="reference", init_instances=3, weight_decay=0.0,
                lr_schedule="quarter_cosine")



def apd_config(name: str, quick: bool, seed: int, fidelity: str | None = None, **overrides) -> APDConfig:
    """The APD configuration of ``name`` (paper or quick preset, ``fidelity`` ``"ours"`` or ``"reference"``; ``None``:
    the setting's default, :func:`default_fidelity`) with ``seed`` and ``overrides`` applied; ``TypeError`` for a
    ``quick`` that is not a bool."""
    check_bool(quick, "quick")  # a string such as "no" would be truthy: the quick preset, silently
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {name!r}")
    fidelity = resolve_fidelity(name, fidelity)
    cfg = PRESETS[name]
    kw = dict(QUICK[name]) if quick else {}
    if fidelity == "reference" and name in TMS_PRESETS:  # elsewhere "reference" is the target's recipe only
        kw.update(reference_overrides(name))
    kw.update(overrides)
    kw["seed"] = seed
    from mlpinterp.apd import with_overrides

    return with_overrides(cfg, **kw)

