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

from mlpinterp.utils.modes import eval_mode
from mlpinterp.utils.validation import check_callable, check_module, check_token_ids


def resolve_hook_point(model: nn.Module, hook_point: str) -> nn.Module:
    """The submodule at ``hook_point``; raises ``ValueError`` naming the closest valid paths if absent
    (``TypeError`` if ``model`` is not a ``torch.nn.Module`` or ``hook_point`` not a non-empty string)."""
    check_module(model)
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

    With ``stop_early`` the forward pass is aborted right after the hook point (later layers are not run). The model
    runs in eval mode (:func:`~mlpinterp.utils.modes.eval_mode`). Raises ``TypeError``/``ValueError`` for ids that are not an integer
    ``[batch, seq]`` tensor, lie outside the vocabulary or exceed the model's positions, or a mismatched mask
    (:func:`~mlpinterp.utils.validation.check_token_ids`).
    """
    module = resolve_hook_point(model, hook_point)
    check_token_ids(input_ids, "input_ids", model, attention_mask)
    store: dict[str, Tensor] = {}

    def hook(_mod, _inp, out):
        store["out"] = module_output(out).detach()
        if stop_early:
            raise _Stop

    handle = module.register_forward_hook(hook)
    device = next(model.parameters()).device
    try:
        with eval_mode(model):
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
def splice(model: nn.Module, hook_point: str, fn: Callable[[Tensor], Tensor], *,
           input_of: str | None = None, keep: Callable[[], Tensor | None] | None = None) -> Iterator[None]:
    """Within the block, the output ``h [..., d]`` of ``hook_point`` is replaced by ``fn(h)``.

    With ``input_of`` (another module path), ``fn`` receives instead the tensor that module was called with
    (its first positional argument) in the same forward pass: e.g. an FFN approximant ``p`` spliced in with
    ``splice(model, "encoder.layer.3.output.dense", p, input_of="encoder.layer.3.intermediate.dense")``
    replaces the block's output by ``p(x)`` of the block's own input ``x``. The replacement must have the
    shape of the output it replaces (``ValueError`` otherwise); it is cast to the output's dtype and device.
    With ``keep`` (a callable returning a boolean mask over the output's leading dimensions, e.g. ``[batch, seq]``
    from :func:`track_positions`), the original output is kept where the mask is True (positions a replacement was
    not fitted on, such as special tokens).
    Raises ``TypeError`` if ``fn`` / ``keep`` are not callable, and during the forward pass ``ValueError`` if
    ``input_of`` was not called before ``hook_point``, or the replacement is not a real floating-point tensor of the
    output's shape, holds NaN/inf (it would turn every downstream number into NaN), or ``keep()`` is not a boolean
    mask of the output's leading shape.
    """
    check_callable(fn, "fn", "a callable h -> replacement tensor")
    if keep is not None:
        check_callable(keep, "keep", "a callable returning a boolean mask (e.g. from track_positions) or None")
    module = resolve_hook_point(model, hook_point)
    source = resolve_hook_point(model, input_of) if input_of is not None else None
    seen: list[Tensor] = []

    def replace(h: Tensor) -> Tensor:
        if source is None:
            arg = h
        elif not seen:
            raise ValueError(f"module {input_of!r} was not called before {hook_point!r} in this forward pass")
        else:
            arg = seen.pop()
        new = fn(arg)
        if not isinstance(new, Tensor) or new.shape != h.shape:
            raise ValueError(f"the replacement for {hook_point!r} must be a tensor of shape {list(h.shape)}, got "
                             f"{list(new.shape) if isinstance(new, Tensor) else type(new).__name__}")
        if not new.is_floating_point():
            raise ValueError(f"the replacement for {hook_point!r} must be a real floating-point tensor, got dtype "
                             f"{new.dtype}")
        new = new.to(h.device, h.dtype)
        if not bool(torch.isfinite(new).all()):
            raise ValueError(f"the replacement for {hook_point!r} holds {int((~torch.isfinite(new)).sum())} "
                             f"non-finite value(s) (NaN or inf, after casting to the output's {h.dtype}); every "
                             "downstream number would be NaN")
        mask = keep() if keep is not None else None
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                raise ValueError(f"keep() must give a boolean mask tensor, got "
                                 f"{mask.dtype if isinstance(mask, Tensor) else type(mask).__name__}")
            if mask.shape != h.shape[:-1]:
                raise ValueError(f"keep() must give a mask of shape {list(h.shape[:-1])}, got {list(mask.shape)}")
            new = torch.where(mask.to(h.device)[..., None], h, new)
        return new

    def hook(_mod, _inp, out):
        if isinstance(out, (tuple, list)):
            return type(out)([replace(out[0]), *out[1:]])
        if isinstance(out, dict):  # Hugging Face ModelOutput: replace its first field
            key = next(iter(out.keys()))
            out[key] = replace(out[key])
            return out
        return replace(out)

    def pre_hook(_mod, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()), None)
        seen[:] = [x]

    handles = [module.register_forward_hook(hook)]
    if source is not None:
        handles.append(source.register_forward_pre_hook(pre_hook, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def track_positions(model: nn.Module, token_ids) -> Iterator[Callable[[], Tensor | None]]:
    """Within the block, ``mask()`` is True at the positions of the current forward pass whose token is one of
    ``token_ids`` (e.g. the tokenizer's special tokens); ``None`` before any call. For :func:`splice`'s ``keep``.

    Raises ``TypeError`` if ``token_ids`` is not an iterable of ints (a string, None entries).
    """
    import numpy as np

    check_module(model)
    if isinstance(token_ids, (str, bytes)) or not hasattr(token_ids, "__iter__"):
        raise TypeError(f"token_ids must be an iterable of int token ids, got {type(token_ids).__name__}")
    token_ids = list(token_ids)
    bad = [t for t in token_ids if isinstance(t, bool) or not isinstance(t, (int, np.integer))]
    if bad:
        raise TypeError(f"token_ids must hold int token ids, got {type(bad[0]).__name__} {bad[0]!r}")
    ids_t = torch.tensor(sorted({int(i) for i in token_ids}), dtype=torch.long)
    current: list[Tensor] = []

    def pre_hook(_mod, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        current[:] = [torch.isin(ids.cpu(), ids_t)] if isinstance(ids, Tensor) else []

    handle = model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        yield lambda: current[0] if current else None
    finally:
        handle.remove()
