"""Gradient attributions of parameter components (Braun et al. 2025, App. A.1, eq. for ``A_c(x)``).

For each sample ``x`` and component ``c`` we return the sum over outputs of the squared first-order effect

``attr[b, c] = sum_o ( sum_{s,i,j} d f_o(x_b, theta) / d theta_{s,i,j} * P_{c,s,i,j} )^2``

evaluated at ``theta = theta*`` (``source="target"``) or at ``theta = sum_c P_c`` (``source="apd"``, the variant the
paper used for TMS 5-2). The paper's ``A_c(x)`` is ``sqrt(attr / d_L)``; the monotone transform does not change
top-k selections. All non-batch output dimensions are summed over.

The inner sum is a directional derivative: ``d/d eps_c f(x | theta + sum_c eps_c P_c)`` at ``eps = 0``. So
:func:`attributions` gets all ``C`` of them with forward-mode automatic differentiation,
``vmap`` over the ``C`` one-hot tangents of one :func:`torch.func.jvp` — one batched pass whose cost is ``C``
tangent propagations, and at ``nn.Linear`` sites the tangent ``A_c (B_c x)`` never materialises ``P_c``.
:func:`attributions_reference` is the paper's reference algorithm: one reverse-mode backward pass per output
dimension, accumulating squares (kept as the oracle and for benchmarks).
"""

from __future__ import annotations

import torch
from torch import nn

from mlpinterp.apd.components import Components
from mlpinterp.apd.forward import run_with_components

SOURCES = ("target", "apd")


def _check_source(source: str) -> bool:
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    return source == "target"


def attributions(model: nn.Module, comps: Components, x: torch.Tensor, source: str = "target",
                 chunk_size: int | None = None) -> torch.Tensor:
    """Batched gradient attributions ``[batch, C]`` (forward mode, all outputs and components at once).

    Differentiable with respect to the component factors (needed by the Lp variant); call it under
    ``torch.no_grad()`` when only a top-k mask is needed. ``chunk_size`` bounds how many components are
    propagated at once (memory ``~ chunk_size x`` one forward).

    Raises
    ------
    ValueError
        If ``source`` is not ``"target"`` or ``"apd"``.
    """
    base = _check_source(source)
    C = comps.C
    eps0 = torch.zeros(C, dtype=x.dtype, device=x.device)

    def f(eps: torch.Tensor) -> torch.Tensor:
        return run_with_components(model, comps, x, eps if base else 1.0 + eps, base=base)

    def tangent_out(t: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(f, (eps0,), (t,))[1]

    J = torch.func.vmap(tangent_out, chunk_size=chunk_size)(torch.eye(C, dtype=x.dtype, device=x.device))
    return J.pow(2).flatten(2).sum(-1).T  # [C, batch, ...] -> [batch, C]


def attributions_reference(model: nn.Module, comps: Components, x: torch.Tensor,
                           source: str = "target") -> torch.Tensor:
    """Per-output reference ``[batch, C]``: one backward pass per output dimension (the APD paper's loop).

    Uses per-sample coefficients ``eps[b, c]`` (zero), so the gradient of ``sum_b f_o(x_b)`` with respect to
    ``eps`` is the per-sample derivative; squares are accumulated over outputs. Not differentiable.
    """
    base = _check_source(source)
    with torch.enable_grad():
        eps = torch.zeros(x.shape[0], comps.C, dtype=x.dtype, device=x.device, requires_grad=True)
        out = run_with_components(model, comps, x, eps if base else 1.0 + eps, base=base)
        flat = out.reshape(out.shape[0], -1)
        attr = torch.zeros(x.shape[0], comps.C, dtype=x.dtype, device=x.device)
        for o in range(flat.shape[1]):
            (g,) = torch.autograd.grad(flat[:, o].sum(), eps, retain_graph=o + 1 < flat.shape[1])
            attr += g.detach() ** 2
    return attr
