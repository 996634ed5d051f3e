"""Import the FFN block of a Hugging Face transformer as an exact float64 :class:`~mlpinterp.networks.MLP` / ``GLU``.

``ffn_site(model, path)`` finds the block at ``path`` (the dotted module path as users write it, with or without
the wrapper prefix: ``h.3.mlp`` and ``transformer.h.3.mlp`` on ``GPT2LMHeadModel``; ``encoder.layer.3`` and
``bert.encoder.layer.3`` on a ``BertFor...`` model), recognises its naming convention
(:data:`mlpinterp.hf.layouts.LAYOUTS`), reads the weights, resolves and verifies the activation
(:mod:`mlpinterp.hf.activation`) and checks the imported network against the block itself
(:func:`mlpinterp.hf.layouts.check_forward`). Paths per family:

========================= ======================================== ============================================
family                    path                                     FFN f(x)
========================= ======================================== ============================================
BERT / RoBERTa / MiniLM   the layer ``encoder.layer.3``            ``output.dense(act(intermediate.dense(x)))``
GPT-2                     ``h.3.mlp``                              ``c_proj(act(c_fc(x)))`` (Conv1D, transposed)
GPT-NeoX / Pythia         ``layers.3.mlp``                         ``dense_4h_to_h(act(dense_h_to_4h(x)))``
OPT                       the decoder layer ``decoder.layers.3``   ``fc2(activation_fn(fc1(x)))``
GPT-J                     ``h.3.mlp``                              ``fc_out(act(fc_in(x)))``
Llama / Mistral / Qwen2 / ``layers.3.mlp``                         ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``
Gemma / Phi-3
Falcon / BLOOM            ``h.3.mlp``                              ``dense_4h_to_h(act(dense_h_to_4h(x)))``
Phi-2                     ``layers.3.mlp``                         ``fc2(activation_fn(fc1(x)))``
GPT-BigCode               ``h.3.mlp``                              ``c_proj(act(c_fc(x)))``
DistilBERT                ``transformer.layer.3.ffn``              ``lin2(activation(lin1(x)))``
Mixtral / Qwen-MoE        one expert: ``layers.3.mlp.experts.5``   ``down_proj[5](act_fn(gate[5](x)) * up[5](x))``
experts (fused, ``[E, .]``)                                        (``gate_up_proj[5]`` = [gate; up]); the router
                                                                   and the routing weights are outside the block
T5 (plain / gated)        ``encoder.block.0.layer.1.DenseReluDense``  ``wo(act(wi(x)))`` / ``wo(act(wi_0(x)) * wi_1(x))``
                          (or the ``T5LayerFF`` ``...layer.1``)
========================= ======================================== ============================================

The FFN excludes what surrounds it: dropout, the residual add and LayerNorms (BERT's ``output.LayerNorm``, OPT's
``final_layer_norm``, T5's ``layer_norm``, the residual BLOOM's ``BloomMLP`` adds). A mixture-of-experts layer is
not one block: each expert is (the router's choice and weights stay outside), and Qwen-MoE's ``shared_expert`` is
a plain gated block of its own. For BERT the path is the layer, not ``<layer>.intermediate`` (which is
only the first half of the FFN: ``dense`` + activation): one path per block; ``<layer>.intermediate`` is refused
with the layer's path in the message.

Errors (``ValueError`` unless noted, each naming what was found): ``model`` not a ``torch.nn.Module``
(``TypeError``); a path that does not exist (closest paths by ``difflib``); a module that is not an FFN block (an
attention module, a part of a block, a block containing FFNs: what it is, and the model's FFN paths); an FFN-like
module of unsupported structure (its children and the expected ones); meta-device or quantised weights; an
unknown or unverifiable activation; a block whose forward disagrees with the imported network.
"""

from __future__ import annotations

import difflib

from mlpinterp.hf.activation import resolve_activation
from mlpinterp.hf.experts import expert_site
from mlpinterp.hf.layouts import (
    ACT_ATTRS,
    LAYOUTS,
    check_forward,
    find_act,
    get_part,
    match_layout,
    read_network,
)
from mlpinterp.hf.site import FFNSite, candidate_paths, config_activation, is_fused_experts
from mlpinterp.networks import GLU, MLP

__all__ = ["FFNSite", "ffn_paths", "ffn_site", "from_hf"]

_ATTENTION_NAMES = ("attn", "attention", "selfattention", "self_attn", "crossattention", "encdecattention")


def _check_model(model) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (e.g. a transformers PreTrainedModel), got {type(model).__name__}")
    if getattr(model, "is_quantized", False) or getattr(model, "hf_quantizer", None) is not None:
        q = getattr(getattr(model, "hf_quantizer", None), "quantization_config", None)
        method = getattr(q, "quant_method", None) or type(q).__name__
        raise ValueError(
            f"model {type(model).__name__} is quantised (quantization method {method}); closed-form approximants need "
            "the float weights: load it without quantization_config / load_in_8bit / load_in_4bit"
        )


def _summary(paths: list[str]) -> str:
    if not paths:
        return "none found"
    if len(paths) <= 6:
        return ", ".join(paths)
    return f"{', '.join(paths[:3])}, ..., {', '.join(paths[-2:])} ({len(paths)} blocks)"


def resolve_path(model, path: str):
    """``(full path from the model root, module)`` for a user's ``path``; ``ValueError`` with the closest paths."""
    import torch

    if not isinstance(path, str):
        raise TypeError(f"path must be a dotted module path (str) such as 'h.3.mlp', got {type(path).__name__}")
    if not path.strip():
        raise ValueError("path must be a non-empty dotted module path such as 'h.3.mlp' (see ffn_paths(model)); for "
                         "a module that is itself the FFN use mlpinterp.from_module")
    for cand in candidate_paths(model, path):
        try:
            mod = model.get_submodule(cand)
        except AttributeError:
            continue
        if isinstance(mod, torch.nn.Module):
            return cand, mod
    names = [n for n, _ in model.named_modules() if n]
    prefix = getattr(model, "base_model_prefix", "") or ""
    if prefix and not path.startswith(prefix + "."):  # suggest in the style the user wrote
        names += [n[len(prefix) + 1 :] for n in names if n.startswith(prefix + ".")]
    close = difflib.get_close_matches(path, names, n=3, cutoff=0.6)
    hint = f"; closest module paths: {', '.join(close)}" if close else ""
    raise ValueError(
        f"path {path!r} does not exist in {type(model).__name__}{hint}; FFN blocks of this model: "
        f"{_summary(ffn_paths(model))}"
    )


def ffn_paths(model) -> list[str]:
    """Every FFN block path of ``model`` (from the model root) in module order, i.e. layer order (encoder first).

    These are the paths :func:`ffn_site` accepts, one per block (T5 lists ``...DenseReluDense``, BERT the layer).
    Raises ``TypeError`` if ``model`` is not a ``torch.nn.Module``.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    out: list[str] = []
    for name, mod in model.named_modules():  # pre-order: a block's children follow it
        if not name or (out and name.startswith(out[-1] + ".")):
            continue
        if match_layout(mod) is not None:
            out.append(name)
        elif is_fused_experts(mod):
            out.extend(f"{name}.{e}" for e in range(mod.gate_up_proj.shape[0]))
    return out


def _not_an_ffn(model, path: str, full: str, block) -> ValueError:
    cls = type(block).__name__
    paths = ffn_paths(model)
    tail = f"; FFN blocks of this {type(model).__name__}: {_summary(paths)}"
    inside = [p for p in paths if full.startswith(p + ".")]
    last = full.rsplit(".", 1)[-1].lower()
    attention = "attention" in cls.lower() or "attn" in cls.lower() or last in _ATTENTION_NAMES
    if attention and inside:
        parts = match_layout(model.get_submodule(inside[0]))
        what = f" ({' -> '.join(parts.projections)})" if parts is not None else ""
        return ValueError(f"{path!r} is the attention module ({cls}) of the layer {inside[0]!r}, not part of its FFN"
                          f"{what}: the FFN block is read at the path {inside[0]!r}, with this attention excluded")
    if inside:
        return ValueError(f"{path!r} ({cls}) is part of the FFN block {inside[0]!r}; pass the block's path "
                          f"{inside[0]!r} (its input and output are found from there){tail}")
    if attention:
        return ValueError(f"{path!r} is an attention module ({cls}), not an FFN block{tail}")
    contains = [p for p in paths if p.startswith(full + ".")]
    if contains:
        moe = any(is_fused_experts(m) for m in block.modules())
        note = " (a mixture-of-experts layer: each expert is a block, the router stays outside)" if moe else ""
        return ValueError(f"{path!r} ({cls}) is not an FFN block but contains {len(contains)}{note}: "
                          f"{_summary(contains)}; pass one of those paths")
    children = [n for n, _ in block.named_children()]
    no_act = match_layout(block, need_act=False)
    if no_act is not None:
        return ValueError(f"{path!r} ({cls}) has the projections of a {no_act.family} FFN "
                          f"({', '.join(no_act.projections)}) but no activation: looked for attributes "
                          f"{', '.join(dict.fromkeys((no_act.act, *ACT_ATTRS)))}; children found: {children}")
    partial = [lay for lay in LAYOUTS if any(get_part(block, p) is not None for p in lay.projections)]
    if partial:
        expected = "; ".join(lay.describe() for lay in LAYOUTS)
        return ValueError(f"{path!r} ({cls}) looks like an FFN block but its structure is not supported: found "
                          f"children {children}; expected one of: {expected}{tail}")
    return ValueError(f"{path!r} ({cls}, children {children}) is not an FFN block{tail}")


def ffn_site(model, path: str) -> FFNSite:
    """The FFN block at ``path`` in ``model`` as an :class:`FFNSite` (network, family, hook modules, activation source).

    Args:
        model: a ``transformers`` model (any ``torch.nn.Module`` whose FFN blocks follow a known layout), in any
            floating dtype and on any device; the returned weights are float64 numpy copies.
        path: the block's dotted path as users write it, with or without the wrapper prefix (module docstring).

    Returns:
        :class:`FFNSite`; ``site.network(x)`` equals the block on ``x [n, d_in]`` to float64 rounding (checked
        on import).

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module`` or ``path`` not a string.
        ValueError: see the module docstring (missing path, not an FFN block, unsupported structure, meta-device or
            quantised weights, unknown activation, forward mismatch).
    """
    _check_model(model)
    try:
        full, block = resolve_path(model, path)
    except ValueError:
        site = expert_site(model, path, _family(model, "fused-experts"))
        if site is None:
            raise
        return site
    if match_layout(block) is None and type(block).__name__ == "T5LayerFF" and hasattr(block, "DenseReluDense"):
        full, block = f"{full}.DenseReluDense", block.DenseReluDense  # T5's FF layer = LayerNorm + this + dropout
    layout = match_layout(block)
    if layout is None:
        raise _not_an_ffn(model, path, full, block)
    if any(p.is_meta for p in block.parameters()):
        raise ValueError(
            f"{full} has its weights on the meta device (the model was created without loading them, e.g. under "
            "torch.device('meta') / init_empty_weights(), or offloaded by device_map); load the weights first"
        )
    _, act_obj = find_act(block, layout)
    key, value = config_activation(model, block, layout)
    activation, source = resolve_activation(act_obj, value, key, where=full)
    network = read_network(block, layout, activation, where=full)
    check_forward(block, layout, network, where=full)
    return FFNSite(network, path, _family(model, layout.family), f"{full}.{layout.projections[0]}",
                   f"{full}.{layout.down}", source, layout.family)


def _family(model, convention: str) -> str:
    """``model.config.model_type`` (the model's own family name), else the naming convention."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    return kind if isinstance(kind, str) and kind else convention


def from_hf(model, path: str) -> MLP | GLU:
    """The FFN block at ``path`` as a float64 ``MLP`` / ``GLU``: ``ffn_site(model, path).network``.

    Example: ``mlpinterp.from_hf(GPT2LMHeadModel.from_pretrained("gpt2"), "h.3.mlp")`` -> ``MLP`` with
    ``W1 [3072, 768]`` (``c_fc`` transposed), activation ``gelu_tanh`` (``gelu_new``). See :func:`ffn_site` for
    paths and errors.
    """
    return ffn_site(model, path).network
