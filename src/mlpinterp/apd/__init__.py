"""Attribution-based Parameter Decomposition (Braun, Bushnaq, Heimersheim, Mendel, Sharkey 2025, arXiv 2501.14926).

Decompose chosen weights of any ``nn.Module`` (``nn.Linear`` modules or named 2-D parameters, tied ones included)
into ``C`` low-rank parameter components that sum to the target (faithful), of which few are needed per input
(minimal: gradient attributions + top-k sparse forward) and each of low Schatten-p norm (simple).

Main entry points: :func:`decompose` with an :class:`APDConfig`; :func:`attributions` (batched forward mode) and
:func:`attributions_reference` (per-output loop); metrics :func:`mmcs_ml2r`, :func:`scrubbing`.
"""

from mlpinterp.apd.attributions import (
    attributions,
    attributions_reference,
    closed_form_applies,
    is_residual_mlp,
    is_tms,
)
from mlpinterp.apd.components import Components, Site, reference_init_std, reference_rank, resolve_sites, target_weight
from mlpinterp.apd.forward import capture_outputs, run_with_components
from mlpinterp.apd.losses import (
    act_recon_loss,
    component_schatten,
    faithfulness_loss,
    lp_minimality_loss,
    lp_simplicity_loss,
    minimality_loss,
    schatten_pp,
    simplicity_loss,
)
from mlpinterp.apd.masks import batch_topk_mask, topk_mask
from mlpinterp.apd.metrics import (
    ScrubbingResult,
    activation_frequency,
    column_match,
    mmcs_ml2r,
    per_feature_mse,
    responsible_components,
    scrub_keep_masks,
    scrubbing,
)
from mlpinterp.apd.train import APDConfig, APDResult, apd_losses, decompose, lr_at, select_mask, with_overrides

__all__ = [
    "APDConfig", "APDResult", "Components", "ScrubbingResult", "Site", "act_recon_loss", "activation_frequency",
    "apd_losses", "attributions", "attributions_reference", "batch_topk_mask", "capture_outputs",
    "closed_form_applies", "column_match", "component_schatten", "decompose", "is_residual_mlp", "is_tms", "faithfulness_loss", "lp_minimality_loss", "lp_simplicity_loss", "lr_at",
    "minimality_loss", "mmcs_ml2r", "reference_init_std", "reference_rank", "per_feature_mse", "resolve_sites", "responsible_components",
    "run_with_components", "schatten_pp", "scrub_keep_masks", "scrubbing", "select_mask", "simplicity_loss", "target_weight",
    "topk_mask", "with_overrides",
]
