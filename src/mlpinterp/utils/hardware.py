"""What this machine's CPU does fast: read from the instruction sets torch reports, timed only where torch cannot say."""

from __future__ import annotations

import platform
import time

_FAST_BF16: dict = {}


def bfloat16_instructions() -> bool | None:
    """Whether this x86 CPU has bfloat16 matrix instructions (AVX512-BF16 or AMX tiles), as torch reports them;
    ``None`` where torch cannot say (another architecture, or a torch without the query)."""
    import torch

    cpu = getattr(torch, "cpu", None)
    queries = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if platform.machine().lower() not in ("x86_64", "amd64") or any(q is None for q in queries):
        return None
    return any(bool(q()) for q in queries)


def cpu_has_fast_bfloat16() -> bool:
    """True when this CPU runs bfloat16 matrix products fast (several times float32's rate).

    On x86 the answer is the instruction sets (:func:`bfloat16_instructions`): AVX512-BF16 or AMX, through which
    torch's bfloat16 GEMMs run natively; without them torch emulates bfloat16 and is slower than float32. The answer
    is then the same on every run of one machine, whatever the load. Elsewhere it is timed once per process and
    thread count (best of 3 products of two 512 x 512 matrices; fast = bfloat16 at least 2x faster than float32).
    """
    import torch

    known = bfloat16_instructions()
    if known is not None:
        return known
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
