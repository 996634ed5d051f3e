"""The SPD objective of one step (Bushnaq, Braun, Sharkey 2025, Sec. 2 and the appendix pseudocode):

``c_F L_faithfulness + c_R L_stochastic-recon + c_L L_stochastic-recon-layerwise + c_I L_importance-minimality``

for one batch: the target is run once (its output and the inputs of the decomposed weights), the causal
importances are computed once, the step's masks are drawn (:func:`mlpinterp.spd.masks.step_draws`), then the four
losses of :mod:`mlpinterp.spd.losses` are weighted by the configuration, which was checked when it was made.
"""

from __future__ import annotations

import torch
from torch import nn

from mlpinterp.spd.config import SPDConfig
from mlpinterp.spd.decomposition import Decomposition
from mlpinterp.spd.losses import faithfulness_loss, importance_minimality, layerwise_recon_loss, stochastic_recon_loss
from mlpinterp.spd.masks import step_draws


def spd_losses(model: nn.Module, dec: Decomposition, x: torch.Tensor, cfg: SPDConfig,
               target_weights: dict[str, torch.Tensor],
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and its named terms for one batch ``x`` (also ``L0``: mean number of subcomponents per sample and
    site with causal importance > 0, summed over sites). The masks' noise comes from ``generator``."""
    with torch.no_grad():
        target_out, acts = dec.target_forward(model, x)
    comps = dec.components
    g_low, g_up = dec.causal_importance(acts, cfg.compile)
    draws = step_draws(g_low, cfg.n_mask_samples, cfg.delta_component, cfg.layerwise_masks == "fresh", generator)
    minimality = importance_minimality(g_up, cfg.pnorm)
    # with a single site and the same masks the layerwise loss is the full one: not computed twice
    same = cfg.layerwise_masks == "shared" and len(comps.sites) == 1
    rec = lay = 0.0
    for (masks, delta), (lay_masks, lay_delta) in draws:
        r = stochastic_recon_loss(model, comps, x, masks, target_out, cfg.output_loss, delta)
        rec = rec + r
        lay = lay + (r if same else
                     layerwise_recon_loss(model, comps, x, lay_masks, target_out, cfg.output_loss, lay_delta))
    terms = {"faithfulness": faithfulness_loss(comps, target_weights), "importance_minimality": minimality,
             "stochastic_recon": rec / cfg.n_mask_samples, "layerwise_recon": lay / cfg.n_mask_samples}
    total = (cfg.faithfulness_coeff * terms["faithfulness"] + cfg.stochastic_recon_coeff * terms["stochastic_recon"]
             + cfg.layerwise_recon_coeff * terms["layerwise_recon"]
             + cfg.importance_minimality_coeff * terms["importance_minimality"])
    logs = {k: float(v.detach()) for k, v in terms.items()}
    logs["total"] = float(total.detach())
    logs["L0"] = float(sum((g > 0).sum(-1).float().mean() for g in g_low.values()))
    return total, logs
