"""Module modes for reading a torch model: eval mode for the duration, each submodule's flag restored after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Eval mode (dropout off) for the duration, restoring every submodule's own ``training`` flag afterwards.

    Every reading of a model's activations or outputs runs under it: a model left in train mode would apply
    dropout, so captures, clean outputs and spliced outputs would differ from run to run.
    """
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, flag in flags:
            m.training = flag
