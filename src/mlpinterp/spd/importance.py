"""Causal-importance functions of SPD (Bushnaq, Braun, Sharkey 2025, Sec. 2, "Formally defining a subcomponent's
causal importance"; architecture in the appendix).

Subcomponent ``c`` of a weight ``W = sum_c U_c V_c^T`` gets its own tiny MLP ``gamma_c: R -> R`` on its inner
activation ``h_c(x) = V_c^T a(x)`` (``a``: the input that ``W`` multiplies in the target): one hidden layer of
``d_gate`` GELU units, ``gamma_c(h) = w2_c . gelu(w1_c h + b1_c) + b2_c``. The causal importance is
``g_c = sigma_H(gamma_c(h_c))`` (:mod:`mlpinterp.spd.sigmoids`).

All ``C`` MLPs of a site are evaluated at once: ``[..., C] -> [..., C, d_gate] -> [..., C]``. Initialisation as in
the reference implementation: ``w1 ~ N(0, 2)`` (Kaiming, fan-in 1, ReLU gain), ``w2 ~ N(0, 1 / d_gate)``, biases 0.

These MLPs are SPD's hot path on the CPU (``batch x C x d_gate`` GELU units per site, forward and backward: about
two thirds of a TMS 5-2 step in eager mode, each pass over a tensor too large for the core's cache). With
``compile=True`` the formula runs through ``torch.compile`` (inductor fuses the broadcast, the GELU and the
reduction and their backward into loops that stay in cache), for a few seconds of compilation per input shape.
Rows of ``h`` that are all zero (sparse toys' inputs with no active feature) are evaluated once for all
(``SKIP_ZERO_ROWS``) when at least half the rows are. ``benchmarks/bench_spd_steps.py`` measures both; the
measured speed-ups are in ``docs/measurements.md``.
Tested to match the eager formula (values and gradients), on batches with and without zero rows.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from mlpinterp.spd.importance_fused import fused_scalar_mlps
from mlpinterp.utils.validation import check_int


def _scalar_mlps(h, w1, b1, w2, b2):
    """``raw[..., c] = w2_c . gelu(w1_c h[..., c] + b1_c) + b2_c``."""
    return torch.linalg.vecdot(F.gelu(h[..., None] * w1 + b1), w2) + b2


_BUCKET = 256
"""Row count granularity of the MLPs' evaluation on the non-zero rows (:meth:`CausalImportance.forward`)."""

_MIN_ZERO_SHARE = 0.5
"""The zero-row path runs only when at least this share of the rows is zero: below it, gathering and scattering
the rows cost more than the rows saved (``benchmarks/bench_spd_steps.py``; ``docs/measurements.md``)."""

FUSED = {False: True, True: False}
"""Per ``compile`` flag: run the MLPs through the fused autograd Function that recomputes the hidden layer in the
backward pass (:mod:`mlpinterp.spd.importance_fused`; same values and gradients) instead of autograd of the formula;
eager only for sites with ``C * d_gate >= FUSED_EAGER_MIN_WIDTH``. Chosen by measurement per step
(``benchmarks/bench_spd_steps.py``, docs/measurements.md "SPD"): compiled, the fused form was not faster (inductor
already recomputes instead of storing); eager, it was much faster for wide sites (TMS 40-10), as fast at resid-MLP-1's
width with a fraction of the memory, and slower for narrow ones (TMS 5-2)."""

FUSED_EAGER_MIN_WIDTH = 1600
"""``C * d_gate`` from which the eager path is fused (``FUSED[False]``): resid-MLP-1 (100 x 16) and wider."""

SKIP_ZERO_ROWS = True
"""Evaluate the MLPs once for all all-zero rows of ``h`` (:meth:`CausalImportance.forward`); ``False`` evaluates
every row (``benchmarks/bench_spd_steps.py`` measures both)."""


@functools.cache
def _compiled_scalar_mlps():
    # one compiled function per process (static shapes: one graph per batch size, recompiled on a new one)
    return torch.compile(_scalar_mlps, dynamic=False)


class CausalImportance(nn.Module):
    """``C`` independent scalar MLPs ``gamma_c`` with ``d_gate`` GELU hidden units each.

    Parameters: ``w1``, ``b1``, ``w2``: ``[C, d_gate]``; ``b2``: ``[C]``. ``forward``: ``[..., C] -> [..., C]`` (raw
    outputs, before the hard sigmoid; ``compile=True``: through ``torch.compile``). Raises ``TypeError`` or
    ``ValueError`` unless ``C`` and ``d_gate`` are ints >= 1.
    """

    def __init__(self, C: int, d_gate: int, generator: torch.Generator | None = None):
        super().__init__()
        self.C = check_int(C, "C (subcomponents per site)")
        self.d_gate = check_int(d_gate, "d_gate (hidden units of each causal-importance MLP)")
        self.w1 = nn.Parameter(torch.randn(C, d_gate, generator=generator) * math.sqrt(2.0))
        self.b1 = nn.Parameter(torch.zeros(C, d_gate))
        self.w2 = nn.Parameter(torch.randn(C, d_gate, generator=generator) / math.sqrt(d_gate))
        self.b2 = nn.Parameter(torch.zeros(C))

    def forward(self, h: torch.Tensor, compile: bool = False) -> torch.Tensor:
        if h.shape[-1] != self.C:
            raise ValueError(f"inner activations must have shape [..., C={self.C}], got {list(h.shape)}")
        if FUSED[bool(compile)] and (compile or self.C * self.d_gate >= FUSED_EAGER_MIN_WIDTH):
            f = functools.partial(fused_scalar_mlps, compile=bool(compile))
        else:
            f = _compiled_scalar_mlps() if compile else _scalar_mlps
        params = (self.w1, self.b1, self.w2, self.b2)
        flat = h.reshape(-1, self.C)
        n = flat.shape[0]
        if not SKIP_ZERO_ROWS or n < 2 * _BUCKET:
            return f(h, *params)
        # Hot path (docs/measurements.md): rows of h that are all zero (every
        # input of a sparse-feature toy with no active feature: 77 % of TMS 5-2's samples, 37 % of resid-MLP-1's) all
        # give gamma(0), so the MLPs run on the other rows and one zero row only. A zero row's output is written
        # gamma(0) + h gamma'(0) (gamma'(0) in closed form, GELU' = Phi + z phi): the value is gamma(0), the gradient
        # in h is gamma'(0) and in the parameters that of gamma(0), as the plain formula's. The evaluated rows are
        # padded with zero rows to a multiple of _BUCKET so that torch.compile sees few shapes.
        nz = torch.nonzero(flat.ne(0).any(-1)).squeeze(-1)
        n_nz = int(nz.numel())
        if n_nz > (1 - _MIN_ZERO_SHARE) * n:  # gathering and scattering would cost more than the rows saved
            return f(h, *params)
        rows = -(-(n_nz + 1) // _BUCKET) * _BUCKET
        sel = torch.cat([flat.index_select(0, nz), flat.new_zeros(rows - n_nz, self.C)])
        out = f(sel, *params)
        z = self.b1
        slope = (self.w2 * self.w1 * (0.5 * (1 + torch.erf(z / math.sqrt(2)))
                                      + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi))).sum(-1)
        full = (out[n_nz] + flat * slope).index_put((nz,), out[:n_nz])
        return full.reshape(h.shape)
