"""Hook points of any torch module (the Hugging Face module-path vocabulary): read an output, splice one in.

A *hook point* is a module path as printed by ``model.named_modules()``:

* all-MiniLM-L6-v2 / BERT: ``encoder.layer.3.output`` (residual stream after block 3, after LayerNorm),
  ``encoder.layer.0.output.dense`` (MLP output before the residual add), ``encoder.layer.0.intermediate``;
* GPT-2: ``transformer.h.5`` (residual stream after block 5), ``transformer.h.5.mlp`` (MLP output).

The tensor read is the module's output (the first element when it returns a tuple, the first field of a
``ModelOutput``), ``[batch, seq, d]``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


def resolve_hook_point(model: nn.Module, hook_point: str) -> nn.Module:
    """The submodule at ``hook_point``; raises ``ValueError`` naming the closest valid paths if absent."""
    if not isinstance(hook_point, str) or not hook_point:
        raise TypeError(f"hook_point must be a non-empty module path string, got {hook_point!r}")
    try:
        return model.get_submodule(hook_point)
    except AttributeError:
        names = [n for n, _ in model.named_modules() if n]
        close = difflib.get_close_matches(hook_point, names, n=5, cutoff=0.5)
        raise ValueError(f"hook_point {hook_point!r} is not a submodule of {type(model).__name__}; "
                         f"closest: {close or names[:5]}") from None


def module_output(output):
    """The activation tensor of a module output: itself, the first element of a tuple, or the first value of a
    Hugging Face ``ModelOutput`` / dict (e.g. ``last_hidden_state``)."""
    if isinstance(output, (tuple, list)):
        return output[0]
    if isinstance(output, dict):
        return next(iter(output.values()))
    return output


class _Stop(Exception):
    pass


@torch.no_grad()
def hook_activations(model: nn.Module, hook_point: str, input_ids: Tensor, attention_mask: Tensor | None = None,
                     stop_early: bool = True) -> Tensor:
    """Run ``model`` on ``input_ids [batch, seq]`` and return the hook point's output ``[batch, seq, d]``.

    With ``stop_early`` the forward pass is aborted right after the hook point (later layers are not run).
    """
    module = resolve_hook_point(model, hook_point)
    store: dict[str, Tensor] = {}

    def hook(_mod, _inp, out):
        store["out"] = module_output(out).detach()
        if stop_early:
            raise _Stop

    handle = module.register_forward_hook(hook)
    device = next(model.parameters()).device
    try:
        model(input_ids=input_ids.to(device),
              attention_mask=None if attention_mask is None else attention_mask.to(device))
    except _Stop:
        pass
    finally:
        handle.remove()
    if "out" not in store:
        raise ValueError(f"hook_point {hook_point!r} was not called during the forward pass")
    return store["out"]


@contextmanager
def splice(model: nn.Module, hook_point: str, fn: Callable[[Tensor], Tensor]) -> Iterator[None]:
    """Within the block, the output ``h [..., d]`` of ``hook_point`` is replaced by ``fn(h)`` (same shape)."""
    module = resolve_hook_point(model, hook_point)

    def hook(_mod, _inp, out):
        if isinstance(out, (tuple, list)):
            return type(out)([fn(out[0]), *out[1:]])
        if isinstance(out, dict):  # Hugging Face ModelOutput: replace its first field
            key = next(iter(out.keys()))
            out[key] = fn(out[key])
            return out
        return fn(out)

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
