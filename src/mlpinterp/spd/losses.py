"""SPD losses (Bushnaq, Braun, Sharkey 2025, Sec. 2 and the appendix pseudocode), normalised as there.

- faithfulness ``(1/N) sum_s ||W_s - U_s V_s||_F^2`` (``N`` decomposed parameters): APD's
  :func:`mlpinterp.paramspace.faithfulness_loss` on the rank-one components;
- stochastic reconstruction ``D(f(x | W'(x, r)), f(x | W))`` with every site masked, ``D`` the MSE (mean over batch
  and outputs) or ``KL(softmax(target) || softmax(masked))`` (nats, mean over the batch): APD's output distance
  :func:`mlpinterp.paramspace.minimality_loss`;
- layerwise stochastic reconstruction: the same with one site masked at a time (the other sites keep the target's
  weights), averaged over the ``L`` sites;
- importance minimality ``(1/B) sum_b sum_s sum_c |g_upper[s][b, c]|^p``.

Masks are ``{site: [batch, C]}`` (:func:`mlpinterp.spd.masks.stochastic_mask`). With ``delta`` (``{site: [batch]}``,
``r_b ~ U(0, 1)``) each masked site also carries the current SPD reference implementation's *delta component*
``r_b (W_s - U_s V_s)``, the part of the target weight the subcomponents miss, under its own random mask (the
reference's ``use_delta_component``, which replaces the faithfulness loss; goodfire-ai/spd, 2026).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from mlpinterp.paramspace.components import Components
from mlpinterp.paramspace.forward import run_with_components
from mlpinterp.paramspace.losses import faithfulness_loss, minimality_loss
from mlpinterp.utils.validation import check_real

__all__ = ["faithfulness_loss", "importance_minimality", "importance_minimality_loss", "layerwise_recon_loss",
           "stochastic_recon_loss"]


def _check_per_site(comps: Components, values: Mapping[str, torch.Tensor], what: str, kind: str,
                    shape: tuple[int, ...], shape_text: str) -> None:
    """``values``: a mapping with one tensor of ``shape`` per site of ``comps`` (errors name ``what``)."""
    if not isinstance(values, Mapping):
        raise TypeError(f"{what} must be a mapping site name -> {kind} tensor, got {type(values).__name__}")
    names = [s.name for s in comps.sites]
    if sorted(values) != sorted(names):
        raise ValueError(f"{what} must have one entry per site {names}, got {sorted(values)}")
    for k, v in values.items():
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != shape:
            got = list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise ValueError(f"{what}[{k!r}] must have shape {shape_text}, got {got}")


def _check_masks(comps: Components, masks: Mapping[str, torch.Tensor], n: int) -> None:
    """``masks``: one ``[batch, C]`` tensor per site, of the subcomponents' dtype (errors name ``masks``, not the
    ``coef``/``base`` they become in ``run_with_components`` nor a raw torch dtype error)."""
    _check_per_site(comps, masks, "masks", "[batch, C]", (n, comps.C), f"[batch={n}, C={comps.C}]")
    dtype = next(comps.parameters()).dtype
    for k, m in masks.items():
        if m.dtype != dtype:
            raise ValueError(f"masks[{k!r}] must have the subcomponents' dtype {dtype}, got {m.dtype}")


def _check_delta(comps: Components, delta: Mapping[str, torch.Tensor] | None, n: int,
                 masks: Mapping[str, torch.Tensor]) -> None:
    """``delta`` (after :func:`_check_masks`): ``None`` or one finite floating-point ``[batch]`` tensor per site, of
    its masks' dtype (errors name ``delta``, not the ``base``/``coef`` it becomes in ``run_with_components``)."""
    if delta is None:
        return
    _check_per_site(comps, delta, "delta", "[batch] mask", (n,), f"[batch={n}]")
    for k, r in delta.items():
        if not r.is_floating_point():
            raise ValueError(f"delta[{k!r}] must be a floating-point tensor, got {r.dtype}")
        if r.dtype != masks[k].dtype:
            raise ValueError(f"delta[{k!r}] must have the masks' dtype {masks[k].dtype}, got {r.dtype}")
    finite = torch.stack([torch.isfinite(r).all() for r in delta.values()]).tolist()  # one device sync
    bad = [k for k, ok in zip(delta, finite, strict=True) if not ok]
    if bad:
        raise ValueError(f"delta[{bad[0]!r}] contains NaN or inf")


def _masked(masks: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor] | None, names) -> dict:
    """``run_with_components`` arguments of the masked sites ``names``: ``sum_c m_c P_c + r (W - sum_c P_c)`` is
    ``r W + sum_c (m_c - r) P_c`` (no per-step summed weight; the same values and gradients)."""
    if delta is None:
        return {"coef": {k: masks[k] for k in names}}
    return {"coef": {k: masks[k] - delta[k][:, None] for k in names}, "base": {k: delta[k] for k in names}}


def stochastic_recon_loss(model: nn.Module, comps: Components, x: torch.Tensor, masks: Mapping[str, torch.Tensor],
                          target_out: torch.Tensor, kind: str = "mse",
                          delta: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """``D(f(x | {U_s diag(m_s) V_s [+ r_s (W_s - U_s V_s)]}), target_out)`` with every site masked (scalar);
    the bracket only with ``delta`` (``{site: r_s [batch]}``)."""
    _check_masks(comps, masks, x.shape[0])
    _check_delta(comps, delta, x.shape[0], masks)
    return minimality_loss(run_with_components(model, comps, x, **_masked(masks, delta, masks)), target_out, kind)


def layerwise_recon_loss(model: nn.Module, comps: Components, x: torch.Tensor, masks: Mapping[str, torch.Tensor],
                         target_out: torch.Tensor, kind: str = "mse",
                         delta: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """``(1/L) sum_s D(f(x | W_1, ..., U_s diag(m_s) V_s [+ r_s (W_s - U_s V_s)], ..., W_L), target_out)``
    (scalar)."""
    _check_masks(comps, masks, x.shape[0])
    _check_delta(comps, delta, x.shape[0], masks)
    total = 0.0
    for s in comps.sites:
        out = run_with_components(model, comps, x, **_masked(masks, delta, [s.name]), only=(s.name,))
        total = total + minimality_loss(out, target_out, kind)
    return total / len(comps.sites)


def importance_minimality_loss(g_upper: Mapping[str, torch.Tensor], p: float, eps: float = 1e-12) -> torch.Tensor:
    """``(1/B) sum_b sum_s sum_c (|g| + eps)^p`` over ``{site: [batch, C]}`` upper-leaky causal importances.

    ``eps`` keeps the gradient finite at ``g = 0`` for ``p < 1`` (it moves the value by at most ``C L eps^p``).
    Raises ``ValueError`` for ``p <= 0`` or an empty mapping.
    """
    p = check_real(p, "p (importance-minimality exponent)", 0.0, lo_open=True)
    if not isinstance(g_upper, Mapping) or not g_upper:
        raise ValueError("g_upper must be a non-empty mapping site name -> [batch, C] causal importances")
    return importance_minimality(g_upper, p, eps)


def importance_minimality(g_upper: Mapping[str, torch.Tensor], p: float, eps: float = 1e-12) -> torch.Tensor:
    """:func:`importance_minimality_loss` without its argument checks: for a caller whose ``p`` was checked once
    already (:class:`~mlpinterp.spd.config.SPDConfig`'s ``pnorm``) and whose ``g_upper`` it computed itself."""
    total = 0.0
    for g in g_upper.values():
        total = total + ((g.abs() + eps) ** p).sum(-1).mean()
    return total
