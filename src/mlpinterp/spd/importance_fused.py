"""A fused form of SPD's causal-importance MLPs: forward and backward without storing ``[batch, C, d_gate]`` tensors.

The ``C`` scalar MLPs of a site (:mod:`mlpinterp.spd.importance`; Bushnaq, Braun, Sharkey 2025, Sec. 2) are

``raw[n, c] = sum_k w2[c, k] gelu(z[n, c, k]) + b2[c]``,   ``z[n, c, k] = w1[c, k] h[n, c] + b1[c, k]``

with the exact (erf) GELU. Autograd of that formula keeps ``z`` (or ``gelu(z)``) for the backward pass. Here a custom
autograd Function keeps only its inputs and recomputes ``z`` in the backward pass, where every gradient comes from one
recomputation. With ``G = dL/draw`` ``[n, C]``, ``gelu'(z) = Phi(z) + z phi(z)`` and ``T = G gelu'(z)``
``[n, C, d_gate]``:

- ``dL/dh[n, c] = sum_k T[n, c, k] w1[c, k] w2[c, k]``
- ``dL/dw1[c, k] = w2[c, k] sum_n T[n, c, k] h[n, c]``, ``dL/db1[c, k] = w2[c, k] sum_n T[n, c, k]``
- ``dL/dw2[c, k] = sum_n G[n, c] gelu(z[n, c, k])``, ``dL/db2[c] = sum_n G[n, c]``

Eager (``compile=False``): on the CPU, rows go through in blocks of about :data:`BLOCK_BYTES` of
``[rows, C, d_gate]`` so that each pass over a block stays in the core's cache (on a GPU, in one block). Compiled: the two passes are separate ``torch.compile`` graphs
over all rows (inductor tiles them itself). Tested equal to the autograd formula in value and gradient (float64,
1e-12). Which path a step uses is measured, not assumed (``benchmarks/bench_spd_steps.py``;
:data:`mlpinterp.spd.importance.FUSED`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F

BLOCK_BYTES = 1 << 19
"""Target size of one ``[rows, C, d_gate]`` block of the eager path (512 KiB: within a core's L2 cache)."""

_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _forward(h, w1, b1, w2, b2):
    """``raw`` ``[n, C]`` of ``h`` ``[n, C]``."""
    return torch.linalg.vecdot(F.gelu(torch.addcmul(b1, h[..., None], w1)), w2) + b2


def _backward(h, w1, b1, w2, g):
    """``(dh [n, C], dw1, db1, dw2 [C, d_gate] (sums over the n rows), db2 [C])`` for upstream ``g`` ``[n, C]``."""
    z = torch.addcmul(b1, h[..., None], w1)
    cdf = 0.5 * (1.0 + torch.erf(z * _SQRT_HALF))
    act = z * cdf
    t = g[..., None] * (cdf + z * torch.exp(-0.5 * z * z) * _INV_SQRT_2PI)
    dh = torch.linalg.vecdot(t, w1 * w2)
    return dh, w2 * (t * h[..., None]).sum(0), w2 * t.sum(0), (act * g[..., None]).sum(0), g.sum(0)


@functools.cache
def _compiled():
    # one pair per process (static shapes: one graph per row count)
    return torch.compile(_forward, dynamic=False), torch.compile(_backward, dynamic=False)


def _rows_per_block(h: torch.Tensor, C: int, d_gate: int) -> int:
    if h.device.type != "cpu":
        return max(1, len(h))
    return max(1, BLOCK_BYTES // (C * d_gate * h.element_size()))


class _FusedScalarMLPs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h, w1, b1, w2, b2, compile: bool):
        ctx.save_for_backward(h, w1, b1, w2)
        ctx.compile = compile
        if compile:
            return _compiled()[0](h, w1, b1, w2, b2)
        step = _rows_per_block(h, *w1.shape)
        return torch.cat([_forward(blk, w1, b1, w2, b2) for blk in h.split(step)]) if len(h) else _forward(
            h, w1, b1, w2, b2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g):
        h, w1, b1, w2 = ctx.saved_tensors
        if ctx.compile:
            return (*_compiled()[1](h, w1, b1, w2, g.contiguous()), None)
        step = _rows_per_block(h, *w1.shape)
        dh, dw1, db1, dw2, db2 = [], 0, 0, 0, 0
        for hb, gb in zip(h.split(step), g.split(step), strict=True):
            parts = _backward(hb, w1, b1, w2, gb)
            dh.append(parts[0])
            dw1, db1, dw2, db2 = dw1 + parts[1], db1 + parts[2], dw2 + parts[3], db2 + parts[4]
        if not dh:
            return (*_backward(h, w1, b1, w2, g), None)
        return torch.cat(dh), dw1, db1, dw2, db2, None


def fused_scalar_mlps(h: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                      compile: bool = False) -> torch.Tensor:
    """``raw[..., c] = w2_c . gelu(w1_c h[..., c] + b1_c) + b2_c``: ``h`` ``[..., C]``, ``w1``, ``b1``, ``w2``
    ``[C, d_gate]``, ``b2`` ``[C]`` -> ``[..., C]``; the backward pass recomputes the hidden layer (module docstring).
    ``compile``: both passes through ``torch.compile``. Not twice differentiable: the gradients it returns carry
    no graph, so a second backward through them raises ``RuntimeError``."""
    flat = h.reshape(-1, h.shape[-1])
    return _FusedScalarMLPs.apply(flat, w1, b1, w2, b2, compile).reshape(h.shape)
