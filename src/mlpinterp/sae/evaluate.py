"""SAEs as replacements inside a model: the reconstruction to splice in, the full evaluation, an exact identity SAE.

* :func:`sae_fn`: ``h -> x_hat`` for :mod:`mlpinterp.lm.recovery` (loss recovered, embedding recovered).
* :func:`evaluate_sae`: SAEBench core metrics (:mod:`mlpinterp.sae.core_metrics`) of an SAE at its hook point,
  plus the downstream ones: KL-divergence / CE-loss scores for causal LMs, sentence-embedding cosine for
  encoders. Refuses another hook point or model than the SAE records (:func:`mlpinterp.sae.io.check_provenance`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from mlpinterp.sae.topk import SaeConfig, TopKSae


def sae_fn(sae: TopKSae) -> Callable[[Tensor], Tensor]:
    """``h [..., d_in] -> x_hat [..., d_in]`` through ``sae`` (raises ``ValueError`` on a width mismatch)."""

    def fn(h: Tensor) -> Tensor:
        if h.shape[-1] != sae.d_in:
            raise ValueError(f"hook point width {h.shape[-1]} does not match the SAE's d_in={sae.d_in}")
        flat = h.reshape(-1, h.shape[-1]).to(sae.device)
        return sae(flat).sae_out.reshape(h.shape).to(h.device, h.dtype)

    return fn


def _merge(a: dict, b: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in a.items()}
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k].update(v)
        else:
            out[k] = v
    return out


@torch.no_grad()
def evaluate_sae(sae: TopKSae, model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                 hook_point: str | None = None, model_name: str | None = None, allow_mismatch: bool = False,
                 special_ids: Sequence[int] = (), batch_size: int = 8) -> dict:
    """SAEBench core metrics of ``sae`` spliced into ``model`` at its hook point, on ``input_ids [batch, seq]``.

    Activations at special tokens (``special_ids``) and padding are left out of every average, as SAEBench
    ignores pad/BOS/EOS tokens. Causal LMs add ``model_behavior_preservation`` / ``model_performance_preservation``
    (:func:`mlpinterp.lm.recovery.kl_ce_scores`); encoders add ``embedding_preservation`` (ours, not
    SAEBench's): ``embedding_cossim_with_sae`` / ``embedding_cossim_with_ablation`` (mean cosine of the
    sentence embedding to the clean one), ``embedding_cossim_score = (cos_sae - cos_abl) / (1 - cos_abl)`` and
    the rest of :func:`mlpinterp.lm.recovery.embedding_recovered`.

    ``hook_point`` defaults to the SAE's recorded one; ``model_name`` is compared with the recorded model when
    both are known.

    Raises
    ------
    ValueError
        If neither ``hook_point`` nor the SAE gives a hook point, or they (or the models) differ and
        ``allow_mismatch`` is False (with it: a ``UserWarning``).
    """
    from mlpinterp.lm.hooks import hook_activations
    from mlpinterp.lm.recovery import embedding_recovered, is_causal_lm, kl_ce_scores
    from mlpinterp.sae.core_metrics import core_metrics
    from mlpinterp.sae.io import check_provenance

    hook = hook_point or sae.hook_point
    if hook is None:
        raise ValueError("the SAE records no hook point: pass hook_point (the module path it was trained on)")
    check_provenance("evaluating the SAE", recorded_model=sae.model_name, recorded_hook=sae.hook_point,
                     model_name=model_name, hook_point=hook, allow_mismatch=allow_mismatch,
                     override="allow_mismatch=True (CLI: --allow-hook-mismatch)")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    acts = hook_activations(model, hook, input_ids, mask)
    keep = (mask != 0) & ~torch.isin(input_ids, torch.tensor(sorted(set(special_ids)), dtype=input_ids.dtype))
    x = acts[keep.to(acts.device)].float().cpu()
    out = core_metrics(sae, x)
    fn = sae_fn(sae)
    if is_causal_lm(model):
        out = _merge(out, kl_ce_scores(model, hook, fn, input_ids, attention_mask, batch_size, list(special_ids)))
    else:
        rec = embedding_recovered(model, hook, fn, input_ids, attention_mask, batch_size)
        out["embedding_preservation"] = {
            "embedding_cossim_score": rec["cosine_recovered"], "embedding_cossim_with_sae": rec["cos_spliced"],
            "embedding_cossim_with_ablation": rec["cos_zero"], "embedding_mse_with_sae": rec["mse_spliced"],
            "embedding_mse_with_ablation": rec["mse_zero"], "embedding_mse_score": rec["mse_recovered"]}
    return out


def identity_sae(d_in: int, dtype: torch.dtype = torch.float32) -> TopKSae:
    """An exact identity TopK SAE: ``d_sae = 2 d_in``, ``k = d_in``, ``W_enc = W_dec = [I; -I]``, zero biases.

    For each coordinate one of ``x_i, -x_i`` is ``|x_i| >= 0``; TopK keeps exactly those ``d_in`` entries and
    the decoder maps them back to ``x``. Useful as a reference (loss recovered = 1).
    """
    sae = TopKSae(d_in, SaeConfig(d_sae=2 * d_in, k=d_in, tied=False, pre_bias=False), dtype=dtype)
    eye = torch.eye(d_in, dtype=dtype)
    with torch.no_grad():
        sae.encoder.weight.copy_(torch.cat([eye, -eye]))
        sae.encoder.bias.zero_()
        sae.W_dec_param.copy_(torch.cat([eye, -eye]))
        sae.b_dec.zero_()
    return sae
