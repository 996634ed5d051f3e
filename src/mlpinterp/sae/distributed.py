"""How a process takes part in a ``torch.distributed`` SAE run (``torchrun``; gloo on CPU, NCCL on GPU): the
:class:`Distributed` description, its initialisation from torchrun's environment and a sum over ranks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class Distributed:
    """How this process takes part in a ``torch.distributed`` run (defaults: a single process)."""

    mode: Literal["none", "ddp", "ensemble"] = "none"
    """'ddp': split every batch across ranks; 'ensemble': split the SAEs across ranks."""

    @property
    def rank(self) -> int:
        return dist.get_rank() if self.mode != "none" else 0

    @property
    def world(self) -> int:
        return dist.get_world_size() if self.mode != "none" else 1

    def local_batch(self, x: Tensor) -> Tensor:
        """This rank's share of a global batch ``[batch, d_in]`` (contiguous slice in ddp mode, else all of it).

        Raises ``ValueError`` in ddp mode when ``batch`` is not divisible by the world size.
        """
        if self.mode != "ddp":
            return x
        world, rank = self.world, self.rank
        if x.shape[0] % world:
            raise ValueError(f"batch size {x.shape[0]} must be divisible by the world size {world} in ddp mode")
        n = x.shape[0] // world
        return x[rank * n:(rank + 1) * n]


def init_distributed(mode: Literal["none", "ddp", "ensemble"]) -> Distributed:
    """Initialise ``torch.distributed`` from torchrun's environment (NCCL with CUDA, gloo otherwise)."""
    if mode not in ("none", "ddp", "ensemble"):
        raise ValueError(f"mode must be 'none', 'ddp' or 'ensemble', got {mode!r}")
    if mode != "none" and not dist.is_initialized():
        if "RANK" not in os.environ:
            raise ValueError(f"mode={mode!r} must be launched with torchrun (RANK/WORLD_SIZE are not set)")
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Distributed(mode)


def _sum_ranks(t: Tensor) -> Tensor:
    """Sum of a detached tensor over all ranks (moved to CUDA for NCCL, back to its device afterwards)."""
    device = t.device
    comm = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else device
    t = t.detach().to(comm, copy=True)
    dist.all_reduce(t)
    return t.to(device)
