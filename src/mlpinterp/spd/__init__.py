"""Stochastic Parameter Decomposition (Bushnaq, Braun, Sharkey 2025, "Stochastic Parameter Decomposition").

Decompose chosen weights of any ``nn.Module`` (``nn.Linear`` modules or named 2-D parameters, tied ones
included) into ``C`` rank-one subcomponents ``U_c V_c^T`` per weight, each with a learned causal importance
``g_c(x)`` (a tiny MLP on ``V_c^T a``); train them so that the target's output survives any stochastic ablation
``m = g + (1 - g) r`` while as few subcomponents as possible are important. Built on the parameter-space core
shared with APD (:mod:`mlpinterp.paramspace`): components (rank one), sites, masked forward, faithfulness loss,
output distances and metrics.

Main entry points: :func:`decompose` with an :class:`SPDConfig`; metrics in :mod:`mlpinterp.spd.metrics`.
"""

from mlpinterp.spd.config import SPDConfig, lr_at, with_overrides
from mlpinterp.spd.decomposition import Decomposition, capture_reads, resolve_reads
from mlpinterp.spd.importance import CausalImportance
from mlpinterp.spd.losses import (
    faithfulness_loss,
    importance_minimality_loss,
    layerwise_recon_loss,
    stochastic_recon_loss,
)
from mlpinterp.spd.masks import stochastic_mask
from mlpinterp.spd.metrics import (
    alive_subcomponents,
    causal_importances,
    masked_output_mse,
    one_hot_importances,
    responsible_sets,
    scrubbing,
    subcomponents_per_feature,
)
from mlpinterp.spd.objective import spd_losses
from mlpinterp.spd.sigmoids import clamped_hard_sigmoid, leaky_hard_sigmoid, upper_leaky_hard_sigmoid
from mlpinterp.spd.train import SPDResult, decompose

__all__ = [
    "CausalImportance", "Decomposition", "SPDConfig", "SPDResult", "alive_subcomponents", "capture_reads",
    "causal_importances", "clamped_hard_sigmoid", "decompose", "faithfulness_loss", "importance_minimality_loss", "layerwise_recon_loss",
    "leaky_hard_sigmoid", "lr_at", "masked_output_mse", "one_hot_importances", "resolve_reads", "responsible_sets",
    "scrubbing", "spd_losses", "stochastic_mask", "stochastic_recon_loss", "subcomponents_per_feature",
    "upper_leaky_hard_sigmoid", "with_overrides",
]
