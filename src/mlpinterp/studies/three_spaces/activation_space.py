"""Activation space: a TopK SAE (Gao et al. 2024; :mod:`mlpinterp.sae`) trained on the MLP's inputs.

The directions are the decoder rows of the latents that fire on some held-out input; the sparsity is L0 (latents
firing per held-out input); the faithfulness is measured twice: the FVU of the reconstructed inputs (the SAE's own
objective) and the FVU of the block's output when its input is replaced by the reconstruction, along the block's
readout (comparable with the approximant's and SPD's FVU).
"""

from __future__ import annotations

import numpy as np
import torch

from mlpinterp.sae.metrics import fvu, l0
from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
from mlpinterp.sae.topk import SaeConfig
from mlpinterp.studies.three_spaces.block import Block
from mlpinterp.studies.three_spaces.function_space import readout_fvu


def activation_space(block: Block, *, d_sae: int, k: int, steps: int, batch_size: int, seed: int,
                     quiet: bool = True, **config) -> dict:
    """Train one TopK SAE (the default :class:`~mlpinterp.sae.mfr.MfrConfig` recipe, no MFR; ``config``: other
    ``MfrConfig`` fields) on ``steps`` batches of ``block.sae_batch`` and read it: ``{"directions": {"sae": [n_alive, d_in]}, "alive", "l0", "fvu_input",
    "fvu_input_se"?, "fvu", "fvu_se"}``.

    Raises ``ValueError`` when no latent fires on the held-out inputs.
    """
    cfg = MfrConfig(sae=SaeConfig(d_sae=d_sae, k=min(k, d_sae)), n_saes=1, penalty=False, reinit=False, seed=seed,
                    **config)
    trainer = MfrTrainer(block.network.d_in, cfg)
    trainer.fit((block.sae_batch(s, batch_size) for s in range(steps)), steps, quiet=quiet, desc="SAE")
    sae = trainer.saes[0].eval()
    x = torch.from_numpy(block.X_test).float()
    with torch.no_grad():
        out = sae(x)
        latents = sae.dense_latents(x)
    alive = (latents > 0).any(0).numpy()
    if not alive.any():
        raise ValueError("no SAE latent fires on the held-out inputs: no decoder direction to compare")
    W = sae.W_dec.detach().double().numpy()[alive]
    x_hat = out.sae_out.double().numpy()
    return {"directions": {"sae": W}, "alive": int(alive.sum()), "d_sae": d_sae, "k": cfg.sae.k,
            "l0": float(l0(out.latent_acts)), "fvu_input": float(fvu(x.double(), out.sae_out.double())),
            **readout_fvu(block, block.X_test, block.network(np.asarray(x_hat, dtype=np.float64))), "sae": sae}
