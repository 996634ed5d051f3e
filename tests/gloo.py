"""Run a test worker in 2 gloo processes on localhost (forked: the children reuse the parent's imports)."""

from __future__ import annotations

import time

import pytest


def run_forked(worker, args: tuple, nprocs: int = 2, timeout: float = 120.0, what: str = "the gloo run") -> None:
    """``worker(rank, *args)`` in ``nprocs`` forked processes; a deadline turns a hang into a test failure."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(worker, args=args, nprocs=nprocs, join=False, start_method="fork")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{what} did not finish within {timeout:.0f} s")
