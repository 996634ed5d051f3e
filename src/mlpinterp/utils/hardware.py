"""What this machine's CPU does fast (probed once per process, never assumed from its name)."""

from __future__ import annotations

import time

_FAST_BF16: dict = {}


def cpu_has_fast_bfloat16() -> bool:
    """True when a bfloat16 matrix product runs at least 2x faster than float32 on this CPU.

    Timed once per process and thread count (best of 3 products of two 512 x 512 matrices): CPUs with AVX512-BF16
    or AMX run bfloat16 GEMMs several times faster; without them torch emulates bfloat16 and is slower than
    float32.
    """
    import torch

    key = torch.get_num_threads()
    if key not in _FAST_BF16:
        a = torch.randn(512, 512)
        times = {}
        for dt in (torch.float32, torch.bfloat16):
            x = a.to(dt)
            x @ x
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                x @ x
                best = min(best, time.perf_counter() - t)
            times[dt] = best
        _FAST_BF16[key] = bool(times[torch.bfloat16] * 2 <= times[torch.float32])
    return _FAST_BF16[key]
