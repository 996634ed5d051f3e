"""One expert of a fused-experts module (transformers 5 Mixtral / Qwen-MoE) as an exact float64 ``GLU``.

In transformers 5 the experts of a mixture-of-experts layer are one module holding ``gate_up_proj [E, 2 h, d]``
(each expert's gate rows then up rows) and ``down_proj [E, d, h]``; expert ``e`` computes
``down_proj[e] (act_fn(gate_up_proj[e][:h] x) * gate_up_proj[e][h:] x)``, and the layer returns the router-weighted
sum over the top-k experts of each token. An expert is an FFN block in its own right (``GLU(W = gate, V = up,
W2 = down)``, no biases); the router, its top-k choice and its weights are outside it. The path of expert ``e`` is
``<experts module>.<e>`` (``layers.3.mlp.experts.5``), listed by :func:`mlpinterp.hf.blocks.ffn_paths`.

The import is checked against the experts module's own (eager) forward with every token routed to expert ``e`` at
weight 1 (the reference is then exactly that expert's function). Layouts other than concatenated ``[gate; up]``
rows without biases (transposed or interleaved storage, biases, a clamped activation as in GPT-OSS) are refused.
"""

from __future__ import annotations

import numpy as np

from mlpinterp.hf.site import FFNSite, candidate_paths, config_activation, is_fused_experts
from mlpinterp.networks import GLU
from mlpinterp.utils.validation import to_numpy

_PARTS = ("gate_up_proj", "down_proj")


def _resolve(model, head: str):
    """``(full path, module)`` of ``head`` with or without the model's wrapper prefix, or ``(None, None)``."""
    for cand in candidate_paths(model, head):
        try:
            return cand, model.get_submodule(cand)
        except AttributeError:
            continue
    return None, None


def expert_site(model, path: str, family: str):
    """The :class:`~mlpinterp.hf.blocks.FFNSite` of expert ``e`` at ``path = '<experts>.<e>'``, or None when
    ``path`` does not name an expert of a fused-experts module.

    Raises ``ValueError`` for an index out of range, parts of other shapes or extra parameters (biases, as in
    GPT-OSS, whose expert activation is not elementwise), meta-device or non-float weights, an unsupported
    activation, or a forward that disagrees with the import.
    """
    import torch

    from mlpinterp.hf.activation import resolve_activation
    from mlpinterp.hf.layouts import FORWARD_TOLERANCE, Layout

    head, _, tail = path.rpartition(".")
    if not head or not tail.isdigit():
        return None
    full, mod = _resolve(model, head)
    if mod is None or not is_fused_experts(mod):
        return None
    gu, dn = mod.gate_up_proj, mod.down_proj
    E, two_h, d = gu.shape
    e = int(tail)
    where = f"{full}.{e}"
    if e >= E:
        raise ValueError(f"{path!r}: expert index {e} out of range; {full} holds {E} experts (0..{E - 1})")
    extra = sorted(n for n, _ in mod.named_parameters(recurse=False) if n not in _PARTS)
    flags = {k: getattr(mod, k) for k in ("is_transposed", "has_bias") if getattr(mod, k, False)}
    flags.update({k: False for k in ("is_concatenated", "has_gate") if getattr(mod, k, True) is False})
    if extra or flags or two_h % 2 or tuple(dn.shape) != (E, d, two_h // 2):
        raise ValueError(f"{where}: fused experts with gate_up_proj {list(gu.shape)}, down_proj {list(dn.shape)} and "
                         f"other parameters {extra} (flags {flags}) are not supported; expected gate_up_proj [E, 2 h, d], down_proj "
                         "[E, d, h] and no others (x -> down(act(gate x) * up x))")
    if gu.is_meta or dn.is_meta:
        raise ValueError(f"{where} has its weights on the meta device; load the weights first")
    if not (gu.is_floating_point() and dn.is_floating_point()):
        raise ValueError(f"{where}: expert weights of dtype {gu.dtype} / {dn.dtype} (quantised?); closed-form "
                         "approximants need the float weights")
    h = two_h // 2
    Wgu = to_numpy(gu[e].detach(), f"{where}.gate_up_proj")
    W2 = to_numpy(dn[e].detach(), f"{where}.down_proj")
    layout = Layout("fused-experts", "gate_up_proj", "down_proj", "act_fn", ("hidden_act",), fused=True)
    key, value = config_activation(model, mod, layout)
    activation, source = resolve_activation(mod.act_fn, value, key, where=where)
    zeros = np.zeros(h)
    network = GLU(Wgu[:h], zeros, Wgu[h:], zeros, W2, np.zeros(d), activation)
    x64 = torch.randn(8, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = x64.to(dtype=gu.dtype, device=gu.device)
    idx = torch.full((8, 1), e, dtype=torch.long, device=gu.device)
    wts = torch.ones((8, 1), dtype=gu.dtype, device=gu.device)
    # the class's eager forward (transformers 5 dispatches to grouped-GEMM kernels that refuse float64)
    forward = getattr(type(mod).forward, "__wrapped__", type(mod).forward)
    try:
        with torch.no_grad():
            ref = forward(mod, x, idx, wts)
    except Exception as err:  # noqa: BLE001 - reported with the expert's path
        raise ValueError(f"{where}: running {type(mod).__name__} with every token routed to expert {e} failed "
                         f"({type(err).__name__}: {err})") from err
    theirs = ref.detach().to(device="cpu", dtype=torch.float64).numpy()
    ours = network(x.detach().to(device="cpu", dtype=torch.float64).numpy())
    rel = float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), np.finfo(float).tiny))
    tol = FORWARD_TOLERANCE.get(str(gu.dtype).removeprefix("torch."), 3e-2)
    if not rel <= tol:
        raise ValueError(f"{where}: the imported GLU differs from {type(mod).__name__}'s own forward (all tokens routed "
                         f"to expert {e}) by {rel:.2g} (relative; tolerance {tol:g})")
    return FFNSite(network, path, family, full, None, source, "fused-experts")
