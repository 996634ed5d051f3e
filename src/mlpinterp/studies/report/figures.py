"""The one figure saver of every study: matplotlib on the non-interactive Agg backend, PNGs written atomically so a
report never embeds a half-written file."""

from __future__ import annotations

from pathlib import Path

from mlpinterp.utils.io import atomic_write_bytes


def pyplot():
    """``matplotlib.pyplot`` with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_fig(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG at ``path`` atomically (tight bounding box, ``dpi`` dots per inch), close it and
    return the path."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    atomic_write_bytes(Path(path), buf.getvalue())
    pyplot().close(fig)
    return Path(path)
