"""Parameter space: SPD (Bushnaq, Braun, Sharkey 2025) of the MLP's weight matrices, read in its input space.

The read directions are the rows ``V_c`` of the alive subcomponents of the site whose input is the MLP's input
(a subcomponent is alive when its causal importance exceeds :data:`mlpinterp.spd.metrics.ALIVE_THRESHOLD` on some
held-out input); the sparsity is the causal-importance L0 (subcomponents above that threshold per input, mean over
held-out inputs, per site); the faithfulness is the FVU of the CI-masked forward (masks = the causal importances,
paper Sec. 2) against the target, along the block's readout.
"""

from __future__ import annotations

import numpy as np
import torch

from mlpinterp.paramspace.forward import run_with_components
from mlpinterp.poly.metrics import fvu_from_outputs
from mlpinterp.spd.metrics import ALIVE_THRESHOLD, causal_importances
from mlpinterp.spd.train import SPDConfig, decompose
from mlpinterp.studies.three_spaces.block import Block


def parameter_space(block: Block, cfg: SPDConfig, *, quiet: bool = True, out_dir=None) -> dict:
    """Decompose ``block.spd_model`` with SPD (``cfg``) and read it: ``{"directions": {"spd": [n_alive, d_in]},
    "alive": {site: int}, "ci_l0": {site: float}, "fvu", "fvu_se", "seconds", "config"}``. With ``out_dir``, SPD
    checkpoints there every ``cfg.checkpoint_every`` steps and resumes from it (:func:`mlpinterp.spd.train.decompose`).

    Raises ``ValueError`` when no subcomponent of the input site is alive (no direction to compare), and what
    :func:`mlpinterp.spd.train.decompose` raises.
    """
    res = decompose(block.spd_model, lambda step: block.spd_sample(step, cfg.batch_size), cfg, out_dir=out_dir,
                    quiet=quiet)
    dec = res.decomposition
    model = block.spd_model
    dtype = next(dec.parameters()).dtype
    x = block.spd_test.to(dtype)
    model = model.to(dtype)
    ci = causal_importances(model, dec, x)
    alive = {k: (g > ALIVE_THRESHOLD).any(0).numpy() for k, g in ci.items()}
    l0 = {k: float((g > ALIVE_THRESHOLD).sum(1).double().mean()) for k, g in ci.items()}
    with torch.no_grad():
        target, acts = dec.target_forward(model, x)
        g_low = dec.causal_importance(acts)[0]
        masked = run_with_components(model, dec.components, x, g_low)
    r = fvu_from_outputs(block.spd_readout(target, x).numpy(), block.spd_readout(masked, x).numpy())
    V = dec.V(block.spd_input_site).detach().double().numpy()
    keep = alive[block.spd_input_site] & (np.linalg.norm(V, axis=1) > 0)
    if not keep.any():
        raise ValueError(f"SPD left no subcomponent of site {block.spd_input_site!r} alive (causal importance above "
                         f"{ALIVE_THRESHOLD} on no held-out input): no read direction to compare; train longer or "
                         "lower importance_minimality_coeff")
    return {"directions": {"spd": V[keep]}, "alive": {k: int(v.sum()) for k, v in alive.items()}, "ci_l0": l0,
            "ci_l0_total": float(sum(l0.values())), "fvu": float(r.fvu), "fvu_se": float(r.stderr),
            "seconds": res.seconds, "C": cfg.C, "steps": cfg.steps, "batch_size": cfg.batch_size,
            "decomposition": dec}
