"""Memory budget of large allocations: estimate the bytes first, refuse with a clear error when they would not fit.

Every route that allocates arrays whose size grows with the width (``d_hidden^2`` products, ``[F, F]`` Gram
matrices, ``K F^2`` mixture Grams, Monte Carlo chunks) calls :func:`require` with its estimate *before* allocating,
and chooses chunk sizes with :func:`chunk_rows`. Available memory is the smaller of the kernel's ``MemAvailable``
(``/proc/meminfo``) and the room left under the cgroup's ``memory.max`` (containers); tests replace
:func:`available_bytes` to check that a refusal comes before the allocation.
"""

from __future__ import annotations

import os

__all__ = ["InsufficientMemoryError", "available_bytes", "chunk_rows", "format_bytes", "require", "working_budget"]

#: Fraction of the available memory one step may plan to use (the rest is headroom for the interpreter, BLAS
#: workspaces and whatever else runs).
USABLE_FRACTION = 0.6

#: Default working-set budget of one streamed step (Monte Carlo chunk, row block of a product matrix), in bytes.
DEFAULT_CHUNK_BYTES = 256 * 2**20


class InsufficientMemoryError(MemoryError):
    """An allocation was refused before it was made: its estimate exceeds the memory available."""


def format_bytes(n: float) -> str:
    """``'1.5 GB'`` (decimal units, as ``free -g`` and ``/proc/meminfo`` users read them)."""
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """``memory.max - memory.current`` of this process's cgroup (v2), or None without a limit."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
        return max(int(limit) - current, 0)
    except (OSError, ValueError):
        return None


def available_bytes() -> int:
    """Bytes this process can still allocate without swapping: min(MemAvailable, cgroup room).

    Falls back to ``os.sysconf`` (physical pages) where ``/proc`` is absent (macOS, Windows).
    """
    values = [v for v in (_meminfo_available(), _cgroup_room()) if v is not None]
    if values:
        return min(values)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - no way to know: do not refuse
        return 2**62


def working_budget(limit: int | None = None) -> int:
    """Bytes one streamed step may use: ``limit`` if given, else min(DEFAULT_CHUNK_BYTES, usable available)."""
    if limit is not None:
        return int(limit)
    return int(min(DEFAULT_CHUNK_BYTES, USABLE_FRACTION * available_bytes()))


def require(nbytes: float, what: str, fix: str) -> None:
    """Raise :class:`InsufficientMemoryError` unless ``nbytes`` fit in ``USABLE_FRACTION`` of the available memory.

    ``what`` names the allocation (``"the exact FVU's [d_hidden, chunk] product blocks"``), ``fix`` what to change
    (``"pass chunk_size=... or method='monte-carlo'"``). The message carries the estimate and the available bytes.
    """
    avail = available_bytes()
    if nbytes > USABLE_FRACTION * avail:
        raise InsufficientMemoryError(
            f"{what} needs about {format_bytes(nbytes)}, but only {format_bytes(avail)} of memory is available "
            f"({USABLE_FRACTION:.0%} of it may be planned for one step); {fix}"
        )


def chunk_rows(bytes_per_row: float, what: str, fix: str, *, budget: int | None = None, minimum: int = 1,
               maximum: int | None = None) -> int:
    """Rows per chunk so that ``rows * bytes_per_row`` stays within :func:`working_budget` (at least ``minimum``).

    Raises :class:`InsufficientMemoryError` (through :func:`require`) when even ``minimum`` rows do not fit.
    """
    rows = max(int(working_budget(budget) // max(bytes_per_row, 1.0)), minimum)
    if maximum is not None:
        rows = min(rows, max(int(maximum), 1))
    require(rows * bytes_per_row, what, fix)
    return rows
