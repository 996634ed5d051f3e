"""Activations already on disk: the file format, its checks, and shuffled batches drawn from it.

Format: one safetensors file with a ``train`` tensor ``[n, d_in]`` (any floating dtype; read as float32) and
optionally a ``test`` tensor ``[n_test, d_in]`` held out for evaluation. Any other tensor is ignored; the
safetensors header's ``__metadata__`` may record ``model_name`` and ``hook_point`` (strings), which are copied into
the SAEs trained on the file. It is a user's input (written by any program), so it is checked, not hash-verified. :func:`write_activations` writes it,
:func:`read_activations` reads and checks it, :func:`shuffled_batches` draws the training batches.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from mlpinterp.utils.artifact import read_safetensors
from mlpinterp.utils.io import atomic_replace


@dataclass(frozen=True)
class ActivationFile:
    """The contents of an activations file (see the module docstring)."""

    train: Tensor
    """``[n, d_in]`` float32 training activations."""

    test: Tensor | None
    """``[n_test, d_in]`` float32 held-out activations, or None."""

    model_name: str | None = None
    """Model the activations were read from, as recorded in the metadata (None: unknown)."""

    hook_point: str | None = None
    """Hook point they were read at (None: unknown)."""

    @property
    def d_in(self) -> int:
        return int(self.train.shape[1])


def _check_matrix(t: Tensor, name: str, where: str, d_in: int | None = None) -> Tensor:
    if not t.is_floating_point():
        raise ValueError(f"{where}: tensor {name!r} must be floating point, got dtype {t.dtype}")
    if t.ndim != 2:
        raise ValueError(f"{where}: tensor {name!r} must have rank 2 [n, d_in], got shape {list(t.shape)}")
    if t.shape[0] < 2 or t.shape[1] < 1:
        raise ValueError(f"{where}: tensor {name!r} must hold at least 2 rows of width >= 1, got shape "
                         f"{list(t.shape)}")
    if d_in is not None and t.shape[1] != d_in:
        raise ValueError(f"{where}: tensor {name!r} has width {t.shape[1]}, 'train' has d_in={d_in}")
    t = t.float()
    bad = int((~torch.isfinite(t)).sum())
    if bad:
        raise ValueError(f"{where}: tensor {name!r} holds {bad} non-finite value(s) (NaN or inf)")
    return t


def read_activations(path: str | os.PathLike) -> ActivationFile:
    """Read and check an activations file.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If it is not a safetensors file, has no ``train`` tensor, or ``train`` / ``test`` is not a finite
        floating-point rank-2 tensor with at least 2 rows and the same width (the message names the tensor).
    """
    path = Path(path)
    tensors, meta = read_safetensors(path, what="activations file")
    where = f"activations file {str(path)!r}"
    if "train" not in tensors:
        raise ValueError(f"{where} has no 'train' tensor (it holds {sorted(tensors)}); it must hold 'train' "
                         "[n, d_in] and optionally 'test' [n_test, d_in]")
    train = _check_matrix(tensors["train"], "train", where)
    test = _check_matrix(tensors["test"], "test", where, train.shape[1]) if "test" in tensors else None
    model_name, hook_point = meta.get("model_name"), meta.get("hook_point")
    return ActivationFile(train, test, model_name if isinstance(model_name, str) and model_name else None,
                          hook_point if isinstance(hook_point, str) and hook_point else None)


def write_activations(path: str | os.PathLike, train: Tensor, test: Tensor | None = None, *,
                      model_name: str | None = None, hook_point: str | None = None, **meta) -> Path:
    """Write ``train [n, d_in]`` (and ``test``) to ``path`` in the format of the module docstring, atomically,
    with ``model_name``, ``hook_point`` and ``meta`` (JSON values, stored as strings) in the header. Returns ``path``.

    Raises ``ValueError`` for tensors :func:`read_activations` would refuse.
    """
    where = f"write_activations({str(path)!r})"
    tensors = {"train": _check_matrix(train, "train", where)}
    if test is not None:
        tensors["test"] = _check_matrix(test, "test", where, train.shape[1])
    from safetensors.torch import save_file

    header = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
    header.update({k: v for k, v in (("model_name", model_name), ("hook_point", hook_point)) if v})
    flat = {k: v.contiguous().cpu() for k, v in tensors.items()}
    path = Path(path)
    atomic_replace(path, lambda tmp: save_file(flat, tmp, metadata=header))
    return path


def shuffled_batches(x: Tensor, batch_size: int, seed: int = 0) -> Iterator[Tensor]:
    """Endless ``[batch_size, d_in]`` batches of the rows of ``x``: each pass over ``x`` in a new random order
    (seeded by ``seed``); rows left over at the end of a pass start the next one, so every row is used once per
    pass and batches are always full.

    Raises ``ValueError`` if ``batch_size`` is not a positive int.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    g = torch.Generator().manual_seed(seed)
    carry = x[:0]
    while True:
        order = x[torch.randperm(x.shape[0], generator=g)]
        pool = torch.cat([carry, order]) if carry.shape[0] else order
        n_full = pool.shape[0] // batch_size
        for b in range(n_full):
            yield pool[b * batch_size:(b + 1) * batch_size]
        carry = pool[n_full * batch_size:]
