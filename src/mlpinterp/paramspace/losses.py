"""Losses shared by the parameter-space methods (Braun et al. 2025, Sec. 2.2; Bushnaq, Braun, Sharkey 2025, Sec. 2).

- faithfulness: ``sum_s ||W*_s - sum_c P_{c,s}||_F^2 / N`` with ``N`` the number of decomposed parameters;
- minimality's output distance: ``D(f(x | theta*), f(x | kappa(x)))`` with ``D`` the MSE (mean over batch and
  outputs) or the KL divergence ``KL(softmax(target) || softmax(sparse))`` (nats, mean over batch).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from mlpinterp.paramspace.components import Components


def check_loss_tensor(x, name: str, shape: str) -> torch.Tensor:
    """``x`` must be a floating-point, non-empty, finite torch tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {shape}, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor {shape}, got dtype {x.dtype}")
    if x.numel() == 0:
        raise ValueError(f"{name} must be non-empty {shape}, got shape {list(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains {int((~torch.isfinite(x)).sum())} non-finite value(s) (NaN or inf)")
    return x


def faithfulness_loss(comps: Components, target: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``sum_s ||W*_s - sum_c P_{c,s}||_F^2 / N`` (scalar; mean squared parameter error).

    Raises ``TypeError``/``ValueError`` if ``target`` is not a mapping holding a finite ``[d_out, d_in]`` tensor for
    every site.
    """
    if not isinstance(target, Mapping):
        raise TypeError(f"target must be a mapping site name -> [d_out, d_in] tensor, got {type(target).__name__}")
    for s in comps.sites:
        if s.name not in target:
            raise ValueError(f"target lacks site {s.name!r}; has {sorted(target)}")
        check_loss_tensor(target[s.name], f"target[{s.name!r}]", f"[{s.d_out}, {s.d_in}]")
        if tuple(target[s.name].shape) != (s.d_out, s.d_in):
            raise ValueError(f"target[{s.name!r}] must have shape [{s.d_out}, {s.d_in}], got {list(target[s.name].shape)}")
    summed = comps.summed()
    total = sum(((target[s.name] - summed[s.name]) ** 2).sum() for s in comps.sites)
    return total / comps.n_params


def minimality_loss(out: torch.Tensor, target_out: torch.Tensor, kind: str = "mse") -> torch.Tensor:
    """Distance between the sparse-forward output and the target output.

    ``kind="mse"``: mean over all entries. ``kind="kl"``: ``KL(softmax(target_out) || softmax(out))`` over the last
    dimension, in nats, mean over the other dimensions.

    Raises
    ------
    ValueError
        If ``kind`` is unknown or the shapes differ.
    """
    check_loss_tensor(out, "out", "[batch, ...]")
    check_loss_tensor(target_out, "target_out", "[batch, ...]")
    if out.shape != target_out.shape:
        raise ValueError(f"out and target_out must have the same shape, got {list(out.shape)} and {list(target_out.shape)}")
    if kind == "mse":
        return ((out - target_out) ** 2).mean()
    if kind == "kl":
        logp = F.log_softmax(out, dim=-1)
        logq = F.log_softmax(target_out, dim=-1)
        return (logq.exp() * (logq - logp)).sum(-1).mean()
    raise ValueError(f"kind (minimality loss) must be 'mse' or 'kl', got {kind!r}")
