"""The one figure saver: matplotlib on its non-interactive backend, PNGs written atomically.

A report embeds figures from disk, so a figure is never seen half-written: :func:`save_figure` renders to memory
and replaces the file in one rename (:func:`mlpinterp.utils.io.atomic_write_bytes`).
"""

from __future__ import annotations

import io
import os

from mlpinterp.utils.io import atomic_write_bytes


def pyplot():
    """``matplotlib.pyplot`` with the non-interactive Agg backend (no display needed; imported on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike, *, dpi: int = 110) -> None:
    """Write ``fig`` to ``path`` as a PNG (``dpi`` dots per inch, cropped to its drawn area) atomically, then
    close it. Raises ``OSError`` if ``path`` cannot be written (the figure is closed either way)."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        pyplot().close(fig)
    atomic_write_bytes(path, buf.getvalue())
