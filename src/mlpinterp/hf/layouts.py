"""Naming conventions of FFN blocks and reading their weights into :class:`~mlpinterp.networks.MLP` / ``GLU``.

A :class:`Layout` names the parts of one convention relative to the block module (Hugging Face families name
them the same way across a family; the table :data:`LAYOUTS` is matched in order):

=========== ============================================= ===================================================
family      parts (up / gate / down + activation)         used by
=========== ============================================= ===================================================
bert        intermediate.dense / - / output.dense +       BERT, RoBERTa, MiniLM, ELECTRA, ... layers
            intermediate.intermediate_act_fn
gpt2        c_fc / - / c_proj + act (``Conv1D``:          GPT-2 (``Conv1D`` stores ``[in, out]``), GPT-Neo
            transposed)                                   (``nn.Linear``)
gpt_neox    dense_h_to_4h / - / dense_4h_to_h + act       GPT-NeoX, Pythia, Falcon
bloom       dense_h_to_4h / - / dense_4h_to_h + gelu_impl BLOOM (its forward adds the residual it is passed)
opt         fc1 / - / fc2 + activation_fn                 OPT decoder layers, CLIP/Phi-1/Phi-2 MLPs, ...
distilbert  lin1 / - / lin2 + activation                  DistilBERT ``ffn``
gptj        fc_in / - / fc_out + act                      GPT-J, CodeGen
t5          wi / - / wo + act                             T5 ``DenseReluDense`` (T5DenseActDense)
llama       up_proj / gate_proj / down_proj + act_fn      Llama, Mistral, Qwen2, Gemma, ... gated MLPs
t5-gated    wi_1 / wi_0 / wo + act                        T5 v1.1 / Flan-T5 (T5DenseGatedActDense)
mixtral     w3 / w1 / w2 + act_fn                         Mixtral-style experts (w1 gate, w3 up, w2 down)
phi3        gate_up_proj ([gate; up] fused) / down_proj   Phi-3
            + activation_fn
=========== ============================================= ===================================================

An MLP reads ``f(x) = down(phi(up(x)))`` and a GLU ``f(x) = down(phi(gate(x)) * up(x))``, i.e.
``GLU(W=gate, V=up, W2=down)``, with the biases of the projections (zeros where a projection has none).
Projections must be plain floating-point ``nn.Linear`` or ``transformers`` ``Conv1D`` modules with loaded
(non-meta) weights; quantised layers (bitsandbytes, GPTQ, AWQ, HQQ, torchao, fp8 / integer dtypes) are refused.
Every import is checked against the block itself (:func:`check_forward`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlpinterp.networks import GLU, MLP
from mlpinterp.utils.validation import to_numpy

__all__ = ["ACT_ATTRS", "LAYOUTS", "Layout", "check_forward", "find_act", "from_module", "get_part", "match_layout",
           "read_network"]

#: Attribute names that may hold a block's activation (module or function), tried after the layout's own.
ACT_ATTRS: tuple[str, ...] = ("act_fn", "act", "activation_fn", "activation")

_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_QUANT_MARKERS = ("8bit", "4bit", "int8", "int4", "fp8", "nf4", "quant", "gptq", "awq", "hqq", "marlin", "exllama")
_QUANT_PACKAGES = ("bitsandbytes", "auto_gptq", "gptqmodel", "awq", "hqq", "optimum", "torchao", "quanto",
                   "compressed_tensors", "fbgemm_gpu")


@dataclass(frozen=True)
class Layout:
    """One naming convention of an FFN block's parts (dotted child paths relative to the block)."""

    family: str
    """Convention name reported in :class:`~mlpinterp.hf.blocks.FFNSite` (``"llama"`` also for Qwen2, ...)."""
    up: str
    """MLP: the first projection W1; GLU: the linear branch V (``Phi-3``: the fused [gate; up] projection)."""
    down: str
    """The output projection W2."""
    act: str
    """Attribute (dotted) holding the activation module or function; :data:`ACT_ATTRS` are tried after it."""
    config_keys: tuple[str, ...]
    """Config attributes naming the activation, in the order the family's code reads them."""
    gate: str | None = None
    """GLU: the projection phi applies to (W); None for an MLP."""
    fused: bool = False
    """``up`` holds the gate rows then the up rows (Phi-3's ``gate_up_proj``, split by ``chunk(2, -1)``)."""
    residual_arg: bool = False
    """The block's forward is ``forward(x, residual)`` and returns FFN(x) + residual (BLOOM): checked with a zero
    residual."""

    @property
    def gated(self) -> bool:
        """True for GLU layouts."""
        return self.gate is not None or self.fused

    @property
    def projections(self) -> tuple[str, ...]:
        """Child paths of the projections in forward order (the first one receives the FFN input)."""
        return tuple(p for p in (self.gate, self.up, self.down) if p is not None)

    def describe(self) -> str:
        """``'llama: gate_proj, up_proj, down_proj + act_fn'``."""
        return f"{self.family}: {', '.join(self.projections)} + {self.act}"


LAYOUTS: tuple[Layout, ...] = (
    Layout("bert", "intermediate.dense", "output.dense", "intermediate.intermediate_act_fn", ("hidden_act",)),
    Layout("gpt2", "c_fc", "c_proj", "act", ("activation_function",)),
    Layout("gpt_neox", "dense_h_to_4h", "dense_4h_to_h", "act", ("hidden_act", "activation")),  # Falcon: activation
    Layout("bloom", "dense_h_to_4h", "dense_4h_to_h", "gelu_impl", (), residual_arg=True),
    Layout("opt", "fc1", "fc2", "activation_fn", ("activation_function", "hidden_act")),
    Layout("distilbert", "lin1", "lin2", "activation", ("activation",)),
    Layout("gptj", "fc_in", "fc_out", "act", ("activation_function",)),
    Layout("t5", "wi", "wo", "act", ("dense_act_fn",)),
    Layout("llama", "up_proj", "down_proj", "act_fn", ("hidden_activation", "hidden_act"), gate="gate_proj"),
    Layout("t5-gated", "wi_1", "wo", "act", ("dense_act_fn",), gate="wi_0"),
    Layout("mixtral", "w3", "w2", "act_fn", ("hidden_act",), gate="w1"),
    Layout("phi3", "gate_up_proj", "down_proj", "activation_fn", ("hidden_act",), fused=True),
)


def get_part(module, dotted: str):
    """``module.<dotted>`` (attributes, not only submodules: an activation may be a plain function), or None."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _is_projection(obj) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module) and isinstance(getattr(obj, "weight", None), torch.Tensor)


def find_act(block, layout: Layout):
    """``(attribute path, activation object)`` of ``block`` for ``layout``, or ``(None, None)``."""
    for name in (layout.act, *ACT_ATTRS):
        obj = get_part(block, name)
        if obj is not None and callable(obj):
            return name, obj
    return None, None


def match_layout(block, layouts=LAYOUTS, need_act: bool = True) -> Layout | None:
    """The first layout whose projections are all present in ``block`` (with an activation if ``need_act``)."""
    for layout in layouts:
        if all(_is_projection(get_part(block, p)) for p in layout.projections):
            if not need_act or find_act(block, layout)[1] is not None:
                return layout
    return None


def _check_loaded(proj, where: str) -> None:
    """Refuse meta-device and quantised projections (ValueError naming ``where`` and what was found)."""
    cls = type(proj)
    label = f"{cls.__module__}.{cls.__qualname__}"
    w = proj.weight
    params = type(w).__name__
    if w.is_complex():
        raise ValueError(f"{where} ({label}) has complex weights ({w.dtype}); an FFN block's approximant needs real "
                         "floating-point weights")
    if (cls.__module__.split(".")[0] in _QUANT_PACKAGES or any(m in (cls.__name__ + params).lower() for m in _QUANT_MARKERS)
            or str(w.dtype).removeprefix("torch.") not in _FLOAT_DTYPES):
        raise ValueError(
            f"{where} is a quantised layer ({label}, weight {params} of dtype {w.dtype}); closed-form approximants "
            "need the float weights: load the model without quantisation (e.g. torch_dtype=torch.float32 and no "
            "quantization_config / load_in_8bit / load_in_4bit)"
        )
    if w.is_meta:
        raise ValueError(
            f"{where} has its weights on the meta device (the model was created without loading them, e.g. under "
            "init_empty_weights() or offloaded by device_map); load the weights first (from_pretrained without "
            "device_map offloading)"
        )


def _weight(proj, where: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``(W [out, in], b [out] or None)`` of an ``nn.Linear`` or ``Conv1D`` (``[in, out]``, transposed here)."""
    import torch

    _check_loaded(proj, where)
    w = proj.weight.detach()
    if type(proj).__name__ == "Conv1D" and hasattr(proj, "nf") and hasattr(proj, "nx"):
        w = w.T  # transformers.pytorch_utils.Conv1D stores [in, out] and computes x @ W + b
    elif not isinstance(proj, torch.nn.Linear):
        raise ValueError(
            f"{where} is a {type(proj).__name__}, expected torch.nn.Linear or transformers Conv1D (a projection "
            "y = W x + b)"
        )
    bias = getattr(proj, "bias", None)
    b = None if bias is None else to_numpy(bias, f"{where}.bias")
    return to_numpy(w, f"{where}.weight"), b


def read_network(block, layout: Layout, activation, where: str) -> MLP | GLU:
    """The float64 ``MLP`` / ``GLU`` of ``block`` under ``layout`` with ``activation`` (a resolved Activation).

    Raises ``ValueError`` (meta / quantised / non-finite weights, mismatched shapes) naming the projection.
    """
    p = {name: _weight(get_part(block, name), f"{where}.{name}") for name in layout.projections}
    W2, b2 = p[layout.down]
    if not layout.gated:
        W1, b1 = p[layout.up]
        _check_chain(where, layout, W1.shape, W2.shape)
        return MLP(W1, np.zeros(W1.shape[0]) if b1 is None else b1, W2,
                   np.zeros(W2.shape[0]) if b2 is None else b2, activation)
    if layout.fused:
        Wgu, bgu = p[layout.up]
        if Wgu.shape[0] % 2:
            raise ValueError(f"{where}.{layout.up} must have an even number of output rows ([gate; up]), "
                             f"got weight shape {list(Wgu.shape)}")
        h = Wgu.shape[0] // 2
        W, V = Wgu[:h], Wgu[h:]
        b, c = (None, None) if bgu is None else (bgu[:h], bgu[h:])
    else:
        (W, b), (V, c) = p[layout.gate], p[layout.up]
    _check_chain(where, layout, V.shape, W2.shape, W.shape)
    return GLU(W, b, V, c, W2, b2, activation)


def _check_chain(where, layout, up_shape, down_shape, gate_shape=None) -> None:
    if gate_shape is not None and tuple(gate_shape) != tuple(up_shape):
        raise ValueError(f"{where}: {layout.gate} weight {list(gate_shape)} and {layout.up} weight "
                         f"{list(up_shape)} must have the same shape [d_hidden, d_in]")
    if down_shape[1] != up_shape[0]:
        raise ValueError(f"{where}: {layout.down} weight {list(down_shape)} must be [d_out, d_hidden={up_shape[0]}] "
                         f"to follow {layout.up} weight {list(up_shape)}")


#: Tolerance of :func:`check_forward`, by the block's weight dtype: ||ours - theirs|| / ||theirs||.
FORWARD_TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "float16": 3e-2, "bfloat16": 3e-2}


def own_forward_is_ffn(block, layout: Layout) -> bool:
    """True if ``block`` holds nothing but the layout's parts (and dropout), so ``block(x)`` is the FFN."""
    import torch

    parts = {p.split(".")[0] for p in layout.projections} | {find_act(block, layout)[0] or ""}
    return all(name in parts or isinstance(child, torch.nn.Dropout) for name, child in block.named_children())


def check_forward(block, layout: Layout, network: MLP | GLU, where: str, act=None) -> float:
    """Check ``network`` against ``block`` on 8 seeded standard-normal inputs in the block's dtype and device.

    The reference is ``block(x)`` in eval mode when the block is nothing but the FFN (GPT-2 ``mlp``, Llama ``mlp``,
    T5 ``DenseReluDense``; see :func:`own_forward_is_ffn`), else the composition of its own parts
    (``down(act(up(x)))`` / ``down(act(gate(x)) * up(x))``, e.g. for a BERT or OPT layer, whose forward also runs
    attention). ``act`` is the activation the composition applies (default: the block's own, :func:`find_act`).
    Returns the relative error ``||ours - theirs|| / ||theirs||``.

    Raises ``ValueError`` if it exceeds :data:`FORWARD_TOLERANCE` for the dtype (e.g. a ``Linear`` subclass whose
    forward is not ``W x + b``, a block whose forward computes more than the FFN) or the block's forward fails.
    """
    import torch

    from mlpinterp.utils.modes import eval_mode

    first = get_part(block, layout.projections[0])
    dtype, device = first.weight.dtype, first.weight.device
    gen = torch.Generator().manual_seed(0)
    x64 = torch.randn(8, network.d_in, generator=gen, dtype=torch.float64)
    x = x64.to(dtype=dtype, device=device)
    own = own_forward_is_ffn(block, layout)
    act = find_act(block, layout)[1] if act is None else act
    try:
        with torch.no_grad(), eval_mode(block):
            if own and layout.residual_arg:
                ref = block(x, torch.zeros_like(x))
            elif own:
                ref = block(x)
            elif layout.fused:
                gate, up = get_part(block, layout.up)(x).chunk(2, dim=-1)
                ref = get_part(block, layout.down)(act(gate) * up)
            elif layout.gated:
                ref = get_part(block, layout.down)(act(get_part(block, layout.gate)(x)) * get_part(block, layout.up)(x))
            else:
                ref = get_part(block, layout.down)(act(get_part(block, layout.up)(x)))
    except Exception as e:  # noqa: BLE001 - reported with the block's path
        raise ValueError(f"{where}: running the block on an input [8, {network.d_in}] of dtype {dtype} to check "
                         f"the import failed ({type(e).__name__}: {e})") from e
    if isinstance(ref, tuple):
        ref = ref[0]
    theirs = ref.detach().to(device="cpu", dtype=torch.float64).numpy()
    ours = network(x.detach().to(device="cpu", dtype=torch.float64).numpy())
    if theirs.shape != ours.shape:
        raise ValueError(f"{where}: the block returns shape {list(theirs.shape)} for input [8, {network.d_in}], "
                         f"the imported network {list(ours.shape)}")
    rel = float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), np.finfo(float).tiny))
    tol = FORWARD_TOLERANCE.get(str(dtype).removeprefix("torch."), 3e-2)
    own_act = find_act(block, layout)[1]
    if own_act is not None and type(own_act).__module__.startswith("transformers."):
        from mlpinterp.hf.activation import CLASS_TOLERANCE

        # an activation written with fewer digits (BLOOM's GELU) moves the outputs by up to its grid tolerance
        tol = max(tol, 10 * CLASS_TOLERANCE.get(type(own_act).__name__, 0.0))
    if not rel <= tol:
        what = "its own forward" if own else f"the composition of its parts ({', '.join(layout.projections)})"
        raise ValueError(
            f"{where}: the imported {type(network).__name__} differs from {what} by {rel:.2g} (relative, on 8 "
            f"standard-normal inputs in {dtype}; tolerance {tol:g}): the block computes something other than the "
            f"{layout.family} FFN it looks like (a Linear subclass with another forward, an extra scale or residual)"
        )
    return rel


def _looked_for(layouts) -> str:
    return ", ".join("/".join(lay.projections) for lay in layouts)


def from_module(module, activation=None, *, gated: bool | None = None) -> MLP | GLU:
    """An exact float64 ``MLP`` or ``GLU`` from a user's torch module.

    Accepted forms: ``nn.Sequential(nn.Linear, activation module, nn.Linear)`` (an ``MLP``), or a module with
    named parts (:data:`LAYOUTS`): plain ``fc1``/``fc2``, ``c_fc``/``c_proj`` (``nn.Linear`` or transformers
    ``Conv1D``), ``dense_h_to_4h``/``dense_4h_to_h``, ``fc_in``/``fc_out``, ``wi``/``wo``; gated
    ``gate_proj``/``up_proj``/``down_proj`` (Llama-style), ``w1``/``w3``/``w2`` (Mixtral-style: w1 gate, w3 up, w2
    down), ``wi_0``/``wi_1``/``wo`` (T5 gated), ``gate_up_proj``/``down_proj`` (Phi-3, fused [gate; up]); biases kept
    when present. ``gated=None`` takes a ``GLU`` when the module has a gated layout's parts, else an ``MLP``;
    ``True`` / ``False`` ask for one kind. The activation is ``activation`` (name, Activation, module or callable)
    or the module's ``act_fn``/``act``/``activation_fn``/``activation`` attribute. The import is checked against
    the module's forward (or, if the module holds more than the FFN, against its parts). For a block inside a
    Hugging Face model use :func:`~mlpinterp.hf.blocks.from_hf`.

    Raises:
        TypeError: ``module`` is neither form (the message lists the names looked for), or ``gated`` is not a
            bool or None.
        ValueError: quantised / meta weights or a forward that disagrees with the imported network.
    """
    import torch.nn as nn

    from mlpinterp.gaussian.activations import get_activation

    if gated is not None and not isinstance(gated, bool):
        raise TypeError(f"gated must be True, False or None, got {gated!r}")
    if not gated:
        mods = list(module.children()) if isinstance(module, nn.Sequential) else []
        if len(mods) == 3 and isinstance(mods[0], nn.Linear) and isinstance(mods[2], nn.Linear):
            l1, act, l2 = mods

            def b(layer):
                return layer.bias if layer.bias is not None else np.zeros(layer.out_features)

            return MLP(l1.weight, b(l1), l2.weight, b(l2), get_activation(act if activation is None else activation))
    if gated is None:
        glu_parts = isinstance(module, nn.Module) and match_layout(
            module, [lay for lay in LAYOUTS if lay.gated], need_act=False) is not None
        gated = bool(glu_parts)
    return _network_from_module(module, activation, gated=gated)


def _network_from_module(module, activation=None, gated: bool = False) -> MLP | GLU:
    """``MLP`` (``gated=False``) or ``GLU`` from a user's module with named parts (see :data:`LAYOUTS`).

    The activation is ``activation`` if given (name, Activation, module or callable), else the module's
    ``act_fn`` / ``act`` / ``activation_fn`` / ``activation`` attribute (module or callable) through
    :func:`~mlpinterp.hf.activation.object_activation` (known modules and functions by name, verified; other callables
    wrapped). The result is checked against the module's own forward
    when the module holds nothing but the FFN's parts (:func:`check_forward`), else against its parts.

    Raises:
        TypeError: no layout of the requested kind matches (the message lists the child names looked for and
            found, and names the other ``gated`` value when the module has the other kind's parts).
        ValueError: quantised / meta weights, mismatched shapes, or a forward that disagrees with the import.
    """
    import torch

    from mlpinterp.hf.activation import object_activation

    kind = [lay for lay in LAYOUTS if lay.gated == gated]
    layout = match_layout(module, kind, need_act=activation is None) if isinstance(module, torch.nn.Module) else None
    if layout is None:
        name = f"from_module(gated={gated})"
        children = [n for n, _ in module.named_children()] if isinstance(module, torch.nn.Module) else []
        other = [lay for lay in LAYOUTS if lay.gated != gated]
        hint = ""
        if isinstance(module, torch.nn.Module) and match_layout(module, other, need_act=False) is not None:
            hint = f"; it has the parts of a {'plain' if gated else 'gated'} FFN: pass gated={not gated}"
        elif isinstance(module, torch.nn.Module) and match_layout(module, kind, need_act=False) is not None:
            hint = f"; its projections were found but no activation: pass activation=... or set one of {', '.join(ACT_ATTRS)}"
        seq = "nn.Sequential(nn.Linear, <activation>, nn.Linear) or " if not gated else ""
        raise TypeError(
            f"{name}: module must be {seq}a module with child projections {_looked_for(kind)} "
            f"(nn.Linear or transformers Conv1D; {'gate, up, down' if gated else 'in, out'}) and an activation "
            f"attribute {'/'.join(ACT_ATTRS)} or activation=...; got {type(module).__name__} with children "
            f"{children}{hint}"
        )
    act_obj = find_act(module, layout)[1] if activation is None else activation
    act = object_activation(act_obj)
    where = type(module).__name__
    network = read_network(module, layout, act, where)
    check_forward(module, layout, network, where, act=act.torch_fn)
    return network
