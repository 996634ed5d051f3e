"""SAEs as replacements inside a model: the reconstruction function to splice in, and an exact identity SAE.

The downstream measures (loss recovered, sentence-embedding fidelity) live in :mod:`mlpinterp.lm.recovery`;
pass them ``sae_fn(sae)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from mlpinterp.sae.topk import TopKSae


def sae_fn(sae: TopKSae) -> Callable[[Tensor], Tensor]:
    """``h [..., d_in] -> x_hat [..., d_in]`` through ``sae`` (raises ``ValueError`` on a width mismatch)."""

    def fn(h: Tensor) -> Tensor:
        if h.shape[-1] != sae.d_in:
            raise ValueError(f"hook point width {h.shape[-1]} does not match the SAE's d_in={sae.d_in}")
        flat = h.reshape(-1, h.shape[-1]).to(sae.device)
        return sae(flat).sae_out.reshape(h.shape).to(h.device, h.dtype)

    return fn


def identity_sae(d_in: int, dtype: torch.dtype = torch.float32) -> TopKSae:
    """An exact identity TopK SAE: ``d_sae = 2 d_in``, ``k = d_in``, ``W_enc = W_dec = [I; -I]``, zero biases.

    For each coordinate one of ``x_i, -x_i`` is ``|x_i| >= 0``; TopK keeps exactly those ``d_in`` entries and
    the decoder maps them back to ``x``. Useful as a reference (loss recovered = 1).
    """
    from mlpinterp.sae.topk import SaeConfig

    sae = TopKSae(d_in, SaeConfig(d_sae=2 * d_in, k=d_in, tied=False, pre_bias=False), dtype=dtype)
    eye = torch.eye(d_in, dtype=dtype)
    with torch.no_grad():
        sae.encoder.weight.copy_(torch.cat([eye, -eye]))
        sae.encoder.bias.zero_()
        sae.W_dec_param.copy_(torch.cat([eye, -eye]))
        sae.b_dec.zero_()
    return sae
