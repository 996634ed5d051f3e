"""One FFN site of a Hugging Face model: the :class:`FFNSite` record and the path and config look-ups shared by the
block import (:mod:`mlpinterp.hf.blocks`) and the fused-experts import (:mod:`mlpinterp.hf.experts`)."""

from __future__ import annotations

from dataclasses import dataclass

from mlpinterp.hf.layouts import Layout
from mlpinterp.networks import GLU, MLP


@dataclass(frozen=True)
class FFNSite:
    """An FFN block of a model: its exact float64 network and where its input and output live in the model.

    The hook contract (paths relative to the model root, as ``model.get_submodule`` takes them):
    ``x = args[0]`` of a forward pre-hook on ``input_module`` is the FFN input, ``[..., d_in]`` (the leading shape
    is the model's: ``[batch, seq, d_in]``, or ``[batch * seq, d_in]`` in OPT, which flattens before its FFN), and
    the output of ``output_module`` is exactly ``network(x)`` (``[..., d_out]``) before any dropout, residual add or
    LayerNorm, so a forward hook on ``output_module`` that returns ``p(x)`` splices an approximant ``p`` in.
    """

    network: MLP | GLU
    """The block as ``MLP`` (W1 = up, W2 = down) or ``GLU`` (W = gate, V = up, W2 = down), float64 numpy weights."""
    path: str
    """The path as the user gave it."""
    family: str
    """The model family: ``config.model_type`` of the model (``"phi"``, ``"falcon"``, ``"gpt_bigcode"``, ``"qwen2"``),
    or the naming convention when the model has no config."""
    input_module: str
    """Module whose forward input ``args[0]`` is the FFN input x (the block's first projection; for an expert of a
    fused-experts module, that module: ``args[0]`` holds every token the router sees, routed here or not)."""
    output_module: str | None
    """Module whose output is the FFN output f(x) (the block's output projection); None for an expert of a
    fused-experts module, whose output no module returns alone (the experts module returns the routed, weighted
    sum), so an expert cannot be spliced by a hook."""
    activation_source: str
    """Where the activation was read from, e.g. ``"config.activation_function='gelu_new' (NewGELUActivation module)"``."""
    convention: str = ""
    """Naming convention recognised (:data:`~mlpinterp.hf.layouts.LAYOUTS`): bert, gpt2, gpt_neox, bloom, opt,
    distilbert, gptj, t5, llama, t5-gated, mixtral, phi3, or fused-experts."""

    def __repr__(self) -> str:
        n = self.network
        return (f"FFNSite(path={self.path!r}, family={self.family!r}, convention={self.convention!r}, "
                f"network={type(n).__name__}(d_in={n.d_in}, "
                f"d_hidden={n.d_hidden}, d_out={n.d_out}, activation={n.activation!r}), "
                f"input_module={self.input_module!r}, output_module={self.output_module!r}, "
                f"activation_source={self.activation_source!r})")


def candidate_paths(model, path: str) -> list[str]:
    """``path``, then with the wrapper prefix added (``transformer.`` on GPT2LMHeadModel) or removed (on GPT2Model)."""
    import torch

    out = [path]
    prefix = getattr(model, "base_model_prefix", "") or ""
    if prefix:
        if path.startswith(prefix + "."):
            out.append(path[len(prefix) + 1 :])
        elif isinstance(getattr(model, prefix, None), torch.nn.Module):
            out.append(f"{prefix}.{path}")
    return out


def is_fused_experts(mod) -> bool:
    """True for a fused-experts module (transformers 5 Mixtral / Qwen-MoE): ``gate_up_proj [E, 2 h, d]``,
    ``down_proj [E, d, h]`` tensors and an ``act_fn``."""
    import torch

    gu, dn = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    return (isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and gu.ndim == 3 and dn.ndim == 3
            and callable(getattr(mod, "act_fn", None)))


def config_activation(model, block, layout: Layout):
    """``(config key, value)`` of the activation entry the family reads, from the block's or the model's config."""
    configs = [getattr(block, "config", None), getattr(model, "config", None)]
    text = getattr(configs[1], "get_text_config", None)
    if callable(text):
        configs.append(text())
    for cfg in configs:
        for key in layout.config_keys if cfg is not None else ():
            value = getattr(cfg, key, None)
            if value is not None:
                return key, value
    return None, None
