"""Attribution-based Parameter Decomposition (Braun, Bushnaq, Heimersheim, Mendel, Sharkey 2025, arXiv 2501.14926).

Decompose chosen weights of any ``nn.Module`` (``nn.Linear`` modules or named 2-D parameters, tied ones included)
into ``C`` low-rank parameter components that sum to the target (faithful), of which few are needed per input
(minimal: gradient attributions + top-k sparse forward) and each of low Schatten-p norm (simple).

Main entry points: :func:`decompose` with an :class:`APDConfig`; :func:`attributions` (batched forward mode) and
:func:`attributions_reference` (per-output loop); metrics :func:`scrubbing` (and the shared ones in
:mod:`mlpinterp.paramspace`, on which this method is built).
"""

from mlpinterp.apd.attributions import (
    attributions,
    attributions_reference,
    closed_form_applies,
    is_residual_mlp,
    is_tied_relu_autoencoder,
)
from mlpinterp.apd.losses import (
    act_recon_loss,
    component_schatten,
    lp_minimality_loss,
    lp_simplicity_loss,
    schatten_pp,
    simplicity_loss,
)
from mlpinterp.apd.masks import batch_topk_mask, topk_mask
from mlpinterp.apd.metrics import (
    activation_frequency,
    per_feature_mse,
    responsible_components,
    scrubbing,
)
from mlpinterp.apd.train import APDConfig, APDResult, apd_losses, decompose, lr_at, select_mask, with_overrides

__all__ = [
    "APDConfig", "APDResult", "act_recon_loss", "activation_frequency", "apd_losses", "attributions",
    "attributions_reference", "batch_topk_mask", "closed_form_applies", "component_schatten", "decompose",
    "is_residual_mlp", "is_tied_relu_autoencoder", "lp_minimality_loss", "lp_simplicity_loss", "lr_at",
    "per_feature_mse", "responsible_components", "schatten_pp", "scrubbing", "select_mask", "simplicity_loss",
    "topk_mask", "with_overrides",
]
