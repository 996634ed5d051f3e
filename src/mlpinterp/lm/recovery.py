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
* SAEBench's causal-LM core metrics (:func:`kl_ce_scores`): KL-divergence score and CE-loss score vs zero
  ablation, with SAEBench's key names and token masking.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mlpinterp.lm.hooks import splice
from mlpinterp.utils.modes import eval_mode
from mlpinterp.utils.validation import check_callable, check_int, check_module, check_real, check_token_ids


def zero_fn(h: Tensor) -> Tensor:
    """Zero ablation."""
    return torch.zeros_like(h)


def _check_inputs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, batch_size: int) -> None:
    """Validate at the public boundary (model, ids in the vocabulary and positions, mask, batch size)."""
    check_module(model, loaded=True)
    check_token_ids(input_ids, "input_ids", model, attention_mask)
    check_int(batch_size, "batch_size", minimum=1)


def _batches(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, batch_size: int):
    _check_inputs(model, input_ids, attention_mask, batch_size)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    device = next(model.parameters()).device
    for s in range(0, input_ids.shape[0], batch_size):
        yield input_ids[s:s + batch_size].to(device), mask[s:s + batch_size].to(device)


def _logits(model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    out = model(input_ids=ids, attention_mask=mask)
    logits = getattr(out, "logits", None)
    if not isinstance(logits, Tensor):
        raise ValueError(f"{type(model).__name__} returns no next-token logits (no LM head): cross-entropy needs a "
                         "causal LM such as GPT2LMHeadModel; for an encoder use embedding_recovered")
    return logits


@torch.no_grad()
def _lm_ce(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, batch_size: int) -> float:
    total, count = 0.0, 0
    for ids, mask in _batches(model, input_ids, attention_mask, batch_size):
        logits = _logits(model, ids, mask)[:, :-1]
        target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1),
                             ignore_index=-100, reduction="sum")
        total += float(ce)
        count += int((target != -100).sum())
    if count == 0:
        raise ValueError(f"input_ids {list(input_ids.shape)} leave no next-token target (sequences need >= 2 "
                         "non-padding tokens)")
    return total / count


def lm_loss_recovered(model: nn.Module, hook_point: str, fn: Callable[[Tensor], Tensor],
                      input_ids: Tensor, attention_mask: Tensor | None = None, batch_size: int = 16) -> dict:
    """Cross-entropy (nats/token) clean, spliced and zero-ablated, and the loss-recovered fraction.

    ``fn``: the replacement ``h -> h_hat`` (e.g. :func:`mlpinterp.sae.evaluate.sae_fn`). ``input_ids``: ``[batch, seq]``.
    The model runs in eval mode (:func:`mlpinterp.utils.modes.eval_mode`).
    """
    check_callable(fn, "fn")
    with eval_mode(check_module(model)):
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
    ``normalize`` (sentence-transformers' pooling for all-MiniLM-L6-v2). The model runs in eval mode.

    Raises ``ValueError`` for a sequence without any non-padding token (its embedding is undefined) or a model
    without ``last_hidden_state`` (a causal LM head model: use :func:`lm_loss_recovered`).
    """
    _check_inputs(model, input_ids, attention_mask, batch_size)
    if attention_mask is not None:
        empty = (attention_mask.sum(1) == 0).nonzero().flatten()
        if empty.numel():
            raise ValueError(f"attention_mask: sequence(s) {empty[:5].tolist()} hold no non-padding token; their "
                             "sentence embedding is undefined")
    outs = []
    with eval_mode(check_module(model)):
        for ids, mask in _batches(model, input_ids, attention_mask, batch_size):
            out = model(input_ids=ids, attention_mask=mask)
            h = getattr(out, "last_hidden_state", None)
            if not isinstance(h, Tensor):
                raise ValueError(f"{type(model).__name__} returns no last_hidden_state (a model with an LM head?): "
                                 "sentence embeddings need the encoder (e.g. AutoModel); for causal LMs use "
                                 "lm_loss_recovered")
            outs.append(_pool(h, mask, normalize))
    return torch.cat(outs)


def _pool(h: Tensor, mask: Tensor, normalize: bool) -> Tensor:
    """Mean over non-padding tokens of ``h [batch, seq, d]`` (float32, float64 kept), L2-normalised if asked."""
    h = h if h.dtype == torch.float64 else h.float()  # float64 models stay exact
    m = mask[..., None].to(h.dtype)
    pooled = (h * m).sum(1) / m.sum(1).clamp_min(1)
    return F.normalize(pooled, dim=-1) if normalize else pooled


def embedding_recovered(model: nn.Module, hook_point: str, fn: Callable[[Tensor], Tensor],
                        input_ids: Tensor, attention_mask: Tensor | None = None, batch_size: int = 32) -> dict:
    """Sentence-embedding fidelity with the SAE spliced in vs zero ablation (encoder models, e.g. MiniLM).

    Returns ``cos_spliced``, ``cos_zero`` (mean cosine similarity to the clean sentence embedding),
    ``mse_spliced``, ``mse_zero`` (mean squared error per dimension of the mean-pooled embedding *before* the
    L2 normalisation: after it, MSE = (2 - 2 cos) / d would carry no information beyond the cosine),
    ``cosine_recovered`` and ``mse_recovered`` (fractions). The model runs in eval mode.
    """
    check_callable(fn, "fn")
    with eval_mode(check_module(model)):
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


@dataclass(frozen=True)
class Replacement:
    """One splice: the output of ``hook_point`` replaced by ``fn`` of that output, or of ``input_of``'s input."""

    hook_point: str
    """Module whose output is replaced."""
    fn: Callable[[Tensor], Tensor]
    """The replacement (same output shape)."""
    input_of: str | None = None
    """If set, ``fn`` receives the input of this module instead (see :func:`mlpinterp.lm.hooks.splice`)."""
    keep: Callable[[], Tensor | None] | None = None
    """If set, positions where ``keep()`` is True keep the original output (see :func:`mlpinterp.lm.hooks.splice`)."""


def is_causal_lm(model: nn.Module) -> bool:
    """True for a model that returns next-token ``logits``: an output head (``get_output_embeddings()`` is not
    None, or an ``lm_head`` module without a config) on a decoder, that is ``config.is_decoder`` or an
    architecture in transformers' causal-LM mapping (``GPT2LMHeadModel``, ``LlamaForCausalLM``, ...). False for
    encoders (``BertModel``, MiniLM: sentence embeddings) and for masked LMs (``BertForMaskedLM``: an LM head
    whose logits are not next-token predictions). The one test of that: :func:`downstream_comparison` and the
    SAE evaluation both branch on it."""
    get = getattr(model, "get_output_embeddings", None)
    cfg = getattr(model, "config", None)
    if cfg is None:
        return isinstance(getattr(model, "lm_head", None), nn.Module)
    if not (callable(get) and get() is not None):
        return False
    if getattr(cfg, "is_decoder", False):
        return True
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return type(model).__name__ in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def downstream_comparison(model: nn.Module, replacements: dict[str, Replacement], input_ids: Tensor,
                          attention_mask: Tensor | None = None, *, batch_size: int = 16) -> dict:
    """The model's own output clean and under each replacement, in one call (clean computed once).

    Causal LMs: ``{"kind": "lm", "clean": {"ce": CE}, name: {"ce": CE}}`` (next-token cross-entropy, nats/token).
    Encoders: ``{"kind": "embedding", name: {"cos": mean cosine of the mean-pooled sentence embedding to the clean
    one, "mse": its mean squared error per dimension}}``. Combine with :func:`recovered` for fractions.
    The model runs in eval mode (dropout off), so an exact replacement gives exactly the clean numbers.

    Raises ``TypeError`` if ``replacements`` is not a dict of :class:`Replacement`, and ``ValueError`` for bad token
    ids / mask (:func:`~mlpinterp.utils.validation.check_token_ids`) or a replacement that fails (see
    :func:`~mlpinterp.lm.hooks.splice`).
    """
    if not isinstance(replacements, dict) or not all(isinstance(r, Replacement) for r in replacements.values()):
        bad = type(replacements).__name__ if not isinstance(replacements, dict) else \
            next(type(r).__name__ for r in replacements.values() if not isinstance(r, Replacement))
        raise TypeError(f"replacements must be a dict name -> Replacement(hook_point, fn, ...), got {bad}")
    _check_inputs(model, input_ids, attention_mask, batch_size)
    with eval_mode(model):
        return _downstream(model, replacements, input_ids, attention_mask, batch_size)


def _downstream(model, replacements, input_ids, attention_mask, batch_size) -> dict:
    if is_causal_lm(model):
        out: dict = {"kind": "lm", "clean": {"ce": _lm_ce(model, input_ids, attention_mask, batch_size)}}
        for name, r in replacements.items():
            with splice(model, r.hook_point, r.fn, input_of=r.input_of, keep=r.keep):
                out[name] = {"ce": _lm_ce(model, input_ids, attention_mask, batch_size)}
        return out
    clean = sentence_embeddings(model, input_ids, attention_mask, batch_size, normalize=False)
    out = {"kind": "embedding"}
    for name, r in replacements.items():
        with splice(model, r.hook_point, r.fn, input_of=r.input_of, keep=r.keep):
            e = sentence_embeddings(model, input_ids, attention_mask, batch_size, normalize=False)
        out[name] = {"cos": float(F.cosine_similarity(e, clean, dim=-1).mean()),
                     "mse": float((e - clean).pow(2).mean())}
    return out


def recovered(value: float, clean: float, ablated: float) -> float:
    """``(ablated - value) / (ablated - clean)``: 1 = as good as the clean model, 0 = no better than the ablation
    (loss recovered for cross-entropies; ``cosine_recovered`` for cosines with ``clean = 1``). NaN if undefined
    (``ablated == clean``; reports print it as "—"). Raises ``TypeError``/``ValueError`` for a non-finite or
    non-numeric argument (a NaN loss must be found where it arose, not hidden in a fraction)."""
    value, clean, ablated = (check_real(v, n) for v, n in ((value, "value"), (clean, "clean"), (ablated, "ablated")))
    denom = ablated - clean
    return (ablated - value) / denom if denom != 0 else float("nan")


@torch.no_grad()
def kl_ce_scores(model: nn.Module, hook_point: str, fn: Callable[[Tensor], Tensor], input_ids: Tensor,
                 attention_mask: Tensor | None = None, batch_size: int = 8,
                 ignore_ids: tuple[int, ...] | list[int] = ()) -> dict:
    """SAEBench's downstream core metrics of a replacement ``fn`` at ``hook_point`` of a causal LM, vs zero ablation.

    With ``p`` the clean next-token distribution and ``q`` the one with ``fn`` (or zero ablation) spliced in, per
    position ``t``: ``KL_t = sum_v p_v (log p_v - log q_v)`` (nats) and the cross-entropy of the next token
    (nats). Means over the positions whose own token is not in ``ignore_ids`` (SAEBench ignores pad/BOS/EOS)
    and not padding (the CE also needs a non-padding target). Scores, as SAEBench (``evals/core/main.py``):

    * ``kl_div_score = (KL_ablation - KL_sae) / KL_ablation``;
    * ``ce_loss_score = (CE_ablation - CE_sae) / (CE_ablation - CE_clean)``.

    Returns ``{"model_behavior_preservation": {kl_div_score, kl_div_with_ablation, kl_div_with_sae},
    "model_performance_preservation": {ce_loss_score, ce_loss_with_ablation, ce_loss_with_sae, ce_loss_without_sae},
    "token_stats": {total_tokens_eval_reconstruction}}``. ``input_ids``: ``[batch, seq]``. Raises ``ValueError``
    for mis-shaped inputs or when no position is left to average over.
    """
    check_callable(fn, "fn")
    ignore = torch.tensor(sorted({int(i) for i in ignore_ids if i is not None}), dtype=torch.int64)
    with eval_mode(check_module(model)):
        return _kl_ce(model, hook_point, fn, input_ids, attention_mask, batch_size, ignore)


def _kl_ce(model, hook_point, fn, input_ids, attention_mask, batch_size, ignore) -> dict:
    sums = dict.fromkeys(["kl_sae", "kl_abl", "ce_clean", "ce_sae", "ce_abl"], 0.0)
    n_kl = n_ce = 0
    for ids, mask in _batches(model, input_ids, attention_mask, batch_size):
        keep = (mask != 0) & ~torch.isin(ids, ignore.to(ids.device))
        keep_ce = keep[:, :-1] & (mask[:, 1:] != 0)
        clean = _wide(_logits(model, ids, mask))
        with splice(model, hook_point, fn):
            spliced = _wide(_logits(model, ids, mask))
        with splice(model, hook_point, zero_fn):
            zero = _wide(_logits(model, ids, mask))
        log_p = F.log_softmax(clean, dim=-1)
        target = ids[:, 1:]
        for name, logits in (("sae", spliced), ("abl", zero)):
            log_q = F.log_softmax(logits, dim=-1)
            kl = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)  # sum_v p (log p - log q)
            sums[f"kl_{name}"] += float(kl[keep].double().sum())
        for name, logits in (("clean", clean), ("sae", spliced), ("abl", zero)):
            ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), target, reduction="none")
            sums[f"ce_{name}"] += float(ce[keep_ce].double().sum())
        n_kl += int(keep.sum())
        n_ce += int(keep_ce.sum())
    if n_kl == 0 or n_ce == 0:
        raise ValueError("no position left to average over (all tokens are padding or in ignore_ids)")
    kl_sae, kl_abl = sums["kl_sae"] / n_kl, sums["kl_abl"] / n_kl
    ce_clean, ce_sae, ce_abl = sums["ce_clean"] / n_ce, sums["ce_sae"] / n_ce, sums["ce_abl"] / n_ce
    return {
        "model_behavior_preservation": {
            "kl_div_score": (kl_abl - kl_sae) / kl_abl if kl_abl != 0 else float("nan"),
            "kl_div_with_ablation": kl_abl, "kl_div_with_sae": kl_sae},
        "model_performance_preservation": {
            "ce_loss_score": (ce_abl - ce_sae) / (ce_abl - ce_clean) if ce_abl != ce_clean else float("nan"),
            "ce_loss_with_ablation": ce_abl, "ce_loss_with_sae": ce_sae, "ce_loss_without_sae": ce_clean},
        "token_stats": {"total_tokens_eval_reconstruction": n_kl},
    }


def _wide(logits: Tensor) -> Tensor:
    """Logits in at least float32 (float64 models keep float64, so tiny KLs keep their digits)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))
