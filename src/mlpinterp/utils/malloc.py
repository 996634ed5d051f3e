"""glibc malloc settings for the matrix-free mixture solver's hot path (no-ops without glibc).

Two opposite costs (the figures below are for MNIST: 784-512-10, Ledoit-Wolf classes, r = 784, 10 outputs):

* **Resident memory.** glibc serves blocks below its mmap threshold from its heap and raises the threshold (up to
  32 MB on 64-bit) to the size of every mmapped block that is freed; after the first float32 CG vector (24.6 MB) is
  freed every later one came from the heap, whose freed pages stayed resident: 270 MB after one solve, 500 MB after
  two. ``fix_mmap_threshold`` fixes the threshold at ``MMAP_THRESHOLD`` (4 MB, which also turns the adjustment
  off), so each large tensor's pages are returned when it is freed.
* **Page faults.** Returning pages means faulting them in again. The operator's bfloat16 GEMMs each allocate a
  float32 accumulator of their output (oneDNN scratch); the operator therefore runs them one output at a time
  (2 MB of scratch, below the mmap threshold), and the trim threshold is raised to ``TRIM_THRESHOLD`` so that the
  scratch freed at the top of the heap is reused instead of being returned and faulted in again (glibc's default
  of 128 kB, or one 24.6 MB GEMM per component, multiply the page faults per operator application; the counts
  are in ``docs/measurements.md``).

* **Reuse during a solve.** Inside :func:`reuse_heap` (the CG solve) the thresholds are raised to
  ``SOLVE_MMAP_THRESHOLD`` and ``SOLVE_TRIM_THRESHOLD``: each CG vector (20 MB at MNIST scale, ten or so allocated
  and freed per iteration) then comes from the heap's freed blocks instead of fresh pages: 6 to 8 times fewer
  page faults and a quarter of the system time, for a heap whose high-water mark adds about 200 MB to the solve's
  peak at MNIST scale (the solve's memory estimate counts it); on exit the fixed thresholds are restored and the
  heap's free pages returned (``malloc_trim``), so the resident memory after a solve is what it was without it
  (the counts are in ``docs/measurements.md``).

* **Transparent huge pages.** What page faults remain (every freed CG vector's pages are faulted in again when the
  next one is allocated) cost 4 kB each. ``enable_transparent_huge_pages`` asks torch's CPU allocator to align
  allocations of 2 MB and more to 2 MB and ``madvise(MADV_HUGEPAGE)`` them (torch's own ``THP_MEM_ALLOC_ENABLE``;
  the kernel's THP setting ``madvise`` or ``always`` is needed): about 15 times fewer faults for a CG vector, the
  same iterations and residuals (``docs/measurements.md``).

Nothing here is used when the environment sets ``MALLOC_MMAP_THRESHOLD_`` (the user's own glibc settings win);
``THP_MEM_ALLOC_ENABLE`` set by the user wins likewise.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os

#: Blocks of at least this many bytes are mmapped by glibc's malloc (and unmapped when freed).
MMAP_THRESHOLD = 4 * 2**20
#: Free memory at the top of the heap is returned to the system once it exceeds this many bytes.
TRIM_THRESHOLD = 8 * 2**20
#: Inside ``reuse_heap``: glibc's largest mmap threshold on 64-bit (larger blocks are mmapped whatever is asked).
SOLVE_MMAP_THRESHOLD = 32 * 2**20
#: Inside ``reuse_heap``: the heap keeps up to this many free bytes at its top for reuse.
SOLVE_TRIM_THRESHOLD = 64 * 2**20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: torch's switch for huge-page-aligned CPU allocations (read once, at torch's first CPU allocation).
THP_ENV = "THP_MEM_ALLOC_ENABLE"


@functools.cache
def _libc():
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt  # noqa: B018 (AttributeError without glibc)
        return libc
    except (OSError, AttributeError):
        return None


def _set_thresholds(libc, mmap_threshold: int, trim_threshold: int) -> bool:
    """Set glibc's mmap and trim thresholds; True when both are set (False without glibc)."""
    if libc is None:
        return False
    mmap_set = bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold))
    return mmap_set and bool(libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold))


@functools.cache
def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD`` and its trim threshold at ``TRIM_THRESHOLD`` (once per
    process); True when both are set (False without glibc, or when ``MALLOC_MMAP_THRESHOLD_`` is set)."""
    return _set_thresholds(_libc(), MMAP_THRESHOLD, TRIM_THRESHOLD)


@contextlib.contextmanager
def reuse_heap():
    """Within the block, serve blocks of up to ``SOLVE_MMAP_THRESHOLD`` from glibc's heap and keep up to
    ``SOLVE_TRIM_THRESHOLD`` free bytes there for reuse; on exit restore the thresholds of
    :func:`fix_mmap_threshold` and return the heap's free pages (:func:`release_free_memory`). Yields True when the
    settings took effect (False without glibc, or when ``MALLOC_MMAP_THRESHOLD_`` is set: then nothing changes).
    The settings are process-wide: other threads' allocations in the block are served the same way.
    """
    libc = _libc()
    try:
        yield _set_thresholds(libc, SOLVE_MMAP_THRESHOLD, SOLVE_TRIM_THRESHOLD)
    finally:
        if libc is not None:
            _set_thresholds(libc, MMAP_THRESHOLD, TRIM_THRESHOLD)
            release_free_memory()


def release_free_memory() -> bool:
    """Return the heap's free pages to the system (``malloc_trim(0)``, which also releases free pages inside the
    heap); True when glibc released any. Called after each solve, so that what the heap held for one solve is not
    carried into the next checkpoint's."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def enable_transparent_huge_pages() -> bool:
    """Ask torch to back CPU allocations of >= 2 MB with transparent huge pages (``THP_MEM_ALLOC_ENABLE=1``, unless the
    environment already sets it); True when it is then on.

    torch reads the variable once, at its first CPU allocation, so this must run before any tensor is made: the
    ``mlpinterp`` command calls it first thing; a library user sets ``THP_MEM_ALLOC_ENABLE=1`` in the environment.
    """
    os.environ.setdefault(THP_ENV, "1")
    return os.environ[THP_ENV] == "1"
