"""Short ``repr`` strings for weight containers: shapes, activation, dtype and a digest instead of every weight.

``MLP(d_in=64, d_hidden=256, d_out=10, activation='relu', dtype=float64, digest=3f2a9c1e)``: two objects with the
same digest hold the same numbers (to the bit), so a log line or a notebook cell identifies a network or an
approximant without printing megabytes of arrays.
"""

from __future__ import annotations

import hashlib

import numpy as np


def digest(*arrays, length: int = 8) -> str:
    """Hex digest (``length`` characters, BLAKE2b) of the arrays' dtypes, shapes and bytes; ``None`` entries count.

    Equal arrays give equal digests; changing one element (or a shape) changes it. Raises ``ValueError`` for a
    ``length`` outside [4, 32].
    """
    if isinstance(length, bool) or not isinstance(length, int) or not 4 <= length <= 32:
        raise ValueError(f"length must be an int in [4, 32], got {length!r}")
    h = hashlib.blake2b(digest_size=(length + 1) // 2)
    for a in arrays:
        if a is None:
            h.update(b"none;")
            continue
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:length]


def short_repr(name: str, **fields) -> str:
    """``name(k1=v1, k2=v2, ...)`` with strings quoted (``repr``) and numpy dtypes by name; ``None`` fields omitted."""
    parts = []
    for k, v in fields.items():
        if v is None:
            continue
        if isinstance(v, np.dtype):
            v = v.name
        elif isinstance(v, str) and k not in ("digest", "dtype"):
            v = repr(v)
        parts.append(f"{k}={v}")
    return f"{name}({', '.join(parts)})"
