"""Downstream fidelity of a replacement spliced into a model at a hook point (an SAE, an FFN approximant, an ablation).

* Causal LMs (GPT-2): next-token cross-entropy (nats/token) clean, with the SAE reconstruction replacing the
  hook point's output, and with that output zero-ablated;
  ``loss_recovered = (CE_zero - CE_sae) / (CE_zero - CE_clean)`` (1 = perfect, 0 = no better than ablation;
  Bricken et al. 2023, Gao et al. 2024 sec. 4.1).
* Encoder models without an LM head (all-MiniLM-L6-v2): the same idea on the final sentence embeddings
  (mean pooling over non-padding tokens, then L2 normalisation, as sentence-transformers does): cosine
  similarity (and MSE of the pooled, un-normalised embedding) to the clean embeddings with the SAE spliced in
  vs zero-ablated;
  ``cosine_recovered = (cos_sae - cos_zero) / (1 - cos_zero)`` and ``mse_recovered = 1 - MSE_sae / MSE_zero``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mlpinterp.lm.hooks import splice


def zero_fn(h: Tensor) -> Tensor:
    """Zero ablation."""
    return torch.zeros_like(h)


def _batches(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, batch_size: int):
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must have shape [batch, seq], got {list(input_ids.shape)}")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have shape {list(input_ids.shape)}, got {list(mask.shape)}")
    device = next(model.parameters()).device
    for s in range(0, input_ids.shape[0], batch_size):
        yield input_ids[s:s + batch_size].to(device), mask[s:s + batch_size].to(device)


@torch.no_grad()
def _lm_ce(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, batch_size: int) -> float:
    total, count = 0.0, 0
    for ids, mask in _batches(model, input_ids, attention_mask, batch_size):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1),
                             ignore_index=-100, reduction="sum")
        total += float(ce)
        count += int((target != -100).sum())
    return total / count


def lm_loss_recovered(model: nn.Module, hook_point: str, fn: Callable[[Tensor], Tensor],
                      input_ids: Tensor, attention_mask: Tensor | None = None, batch_size: int = 16) -> dict:
    """Cross-entropy (nats/token) clean, spliced and zero-ablated, and the loss-recovered fraction.

    ``fn``: the replacement ``h -> h_hat`` (e.g. :func:`mlpinterp.sae.evaluate.sae_fn`). ``input_ids``: ``[batch, seq]``.
    """
    clean = _lm_ce(model, input_ids, attention_mask, batch_size)
    with splice(model, hook_point, fn):
        spliced = _lm_ce(model, input_ids, attention_mask, batch_size)
    with splice(model, hook_point, zero_fn):
        zero = _lm_ce(model, input_ids, attention_mask, batch_size)
    denom = zero - clean
    return {"ce_clean": clean, "ce_spliced": spliced, "ce_zero": zero,
            "loss_recovered": (zero - spliced) / denom if denom != 0 else float("nan")}


@torch.no_grad()
def sentence_embeddings(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
                        batch_size: int = 32, normalize: bool = True) -> Tensor:
    """Mean-pooled last hidden states over non-padding tokens ``[batch, d_model]``, L2-normalised when
    ``normalize`` (sentence-transformers' pooling for all-MiniLM-L6-v2)."""
    outs = []
    for ids, mask in _batches(model, input_ids, attention_mask, batch_size):
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        m = mask[..., None].float()
        pooled = (h * m).sum(1) / m.sum(1).clamp_min(1)
        outs.append(F.normalize(pooled, dim=-1) if normalize else pooled)
    return torch.cat(outs)


def embedding_recovered(model: nn.Module, hook_point: str, fn: Callable[[Tensor], Tensor],
                        input_ids: Tensor, attention_mask: Tensor | None = None, batch_size: int = 32) -> dict:
    """Sentence-embedding fidelity with the SAE spliced in vs zero ablation (encoder models, e.g. MiniLM).

    Returns ``cos_spliced``, ``cos_zero`` (mean cosine similarity to the clean sentence embedding),
    ``mse_spliced``, ``mse_zero`` (mean squared error per dimension of the mean-pooled embedding *before* the
    L2 normalisation: after it, MSE = (2 - 2 cos) / d would carry no information beyond the cosine),
    ``cosine_recovered`` and ``mse_recovered`` (fractions).
    """
    clean = sentence_embeddings(model, input_ids, attention_mask, batch_size, normalize=False)
    with splice(model, hook_point, fn):
        spl = sentence_embeddings(model, input_ids, attention_mask, batch_size, normalize=False)
    with splice(model, hook_point, zero_fn):
        zer = sentence_embeddings(model, input_ids, attention_mask, batch_size, normalize=False)
    cos_s = float(F.cosine_similarity(spl, clean, dim=-1).mean())
    cos_z = float(F.cosine_similarity(zer, clean, dim=-1).mean())
    mse_s = float((spl - clean).pow(2).mean())
    mse_z = float((zer - clean).pow(2).mean())
    return {"cos_spliced": cos_s, "cos_zero": cos_z, "mse_spliced": mse_s, "mse_zero": mse_z,
            "cosine_recovered": (cos_s - cos_z) / (1 - cos_z) if cos_z != 1 else float("nan"),
            "mse_recovered": 1 - mse_s / mse_z if mse_z > 0 else float("nan")}
