"""Coordinate changes of polynomial coefficient tensors, shared by the single-Gaussian and mixture routes."""

from __future__ import annotations

import math

import numpy as np


def centered_to_raw(tensors: list[np.ndarray], center: np.ndarray) -> tuple[np.ndarray, ...]:
    """Convert symmetric tensors of p(x) = sum_r S_r[t,...,t], t = x - center, to raw-coordinate tensors.

    T_k = sum_{r >= k} C(r, k) S_r contracted with (-center) on r - k axes. ``tensors[r] [d_out, d^r]``.
    """
    n = len(tensors) - 1
    out = []
    for k in range(n + 1):
        Tk = np.zeros_like(tensors[k])
        for r in range(k, n + 1):
            S = tensors[r]
            for _ in range(r - k):
                S = S @ (-center)  # contract the last axis
            Tk = Tk + math.comb(r, k) * S
        out.append(Tk)
    return tuple(out)
