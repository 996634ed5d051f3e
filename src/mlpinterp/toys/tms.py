"""Toy Model of Superposition with tied weights (Elhage et al. 2022), as used by APD.

The model is ``x_hat = ReLU(W^T W x + b)`` with ``W`` of shape ``[d_hidden, n_features]`` (``[out, in]`` of
the encoder ``h = W x``) and ``b`` of shape ``[n_features]``. Inputs are ``[batch, n_features]``.

Ground-truth mechanisms (Braun et al. 2025, Sec. 3.1): ``Z^(c) = W[:, c] e_c^T``, rank one, summing to ``W``.
Training recipe (App. D.1): AdamW, weight decay 0.01, constant learning rate 0.005; TMS 5-2 for 5k steps at
batch 1024, TMS 40-10 for 2k steps at batch 2048; features active with probability 0.05, values ``U[0, 1]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from mlpinterp.toys.data import sparse_features, step_generator
from mlpinterp.utils.validation import check_int, check_real


class TMS(nn.Module):
    """``x_hat = ReLU(W^T W x + b)``; ``W``: ``[d_hidden, n_features]``, ``b``: ``[n_features]``."""

    def __init__(self, n_features: int, d_hidden: int):
        super().__init__()
        check_int(n_features, "n_features")
        check_int(d_hidden, "d_hidden")
        self.n_features, self.d_hidden = int(n_features), int(d_hidden)
        self.W = nn.Parameter(torch.empty(d_hidden, n_features))
        self.b = nn.Parameter(torch.zeros(n_features))
        nn.init.xavier_normal_(self.W)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., n_features] -> [..., d_hidden]``: ``h = W x``."""
        return F.linear(x, self.W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., n_features] -> [..., n_features]``."""
        if x.ndim < 1 or x.shape[-1] != self.n_features:
            raise ValueError(f"x must have shape [..., n_features={self.n_features}], got {list(x.shape)}")
        return torch.relu(F.linear(self.hidden(x), self.W.T, self.b))


def tms_ground_truth(model: TMS) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors of the ground-truth mechanisms ``Z^(c) = W[:, c] e_c^T``.

    Returns ``(A, B)`` with ``A``: ``[n_features, d_hidden, 1]`` and ``B``: ``[n_features, 1, n_features]`` so that
    ``A[c] @ B[c] = Z^(c)`` and ``sum_c Z^(c) = W`` exactly.
    """
    W = model.W.detach()
    A = W.T.unsqueeze(-1).clone()  # [C, d_hidden, 1], column c of W
    B = torch.eye(model.n_features, dtype=W.dtype).unsqueeze(1)  # [C, 1, n_features], e_c^T
    return A, B


@dataclass(frozen=True)
class TMSConfig:
    """Training recipe for a TMS target (APD paper App. D.1)."""

    n_features: int = 5
    """Number of input features (m_2 in the paper)."""
    d_hidden: int = 2
    """Bottleneck width (m_1 in the paper)."""
    feature_probability: float = 0.05
    """Probability that a feature is active; active values are U[0, 1]."""
    steps: int = 5000
    """Optimiser steps."""
    batch_size: int = 1024
    """Samples per step."""
    lr: float = 5e-3
    """Constant AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    n_instances: int = 8
    """Independent instances trained at once; the one with the lowest held-out loss is kept."""
    seed: int = 0
    """Seed for initialisation and data."""

    def __post_init__(self) -> None:
        for name in ("n_features", "d_hidden", "steps", "batch_size", "n_instances"):
            check_int(getattr(self, name), name)
        check_int(self.seed, "seed", minimum=None)
        check_real(self.feature_probability, "feature_probability", 0.0, 1.0, lo_open=True)
        check_real(self.lr, "lr", 0.0, lo_open=True)
        check_real(self.weight_decay, "weight_decay", 0.0)


TMS_PRESETS: dict[str, TMSConfig] = {
    "tms-5-2": TMSConfig(n_features=5, d_hidden=2, steps=5000, batch_size=1024),
    "tms-40-10": TMSConfig(n_features=40, d_hidden=10, steps=2000, batch_size=2048),
}


def train_tms(cfg: TMSConfig, quiet: bool = False) -> tuple[TMS, dict]:
    """Train ``cfg.n_instances`` TMS models in one batched run and return the best one.

    All instances share the data stream; each has its own initialisation. Selection is by MSE on a held-out
    batch of 20 000 samples. Returns ``(model, info)`` where ``info`` has ``loss`` (held-out MSE of the kept
    instance, per feature and sample), ``instance_losses`` and ``instance``.
    """
    if not isinstance(cfg, TMSConfig):
        raise TypeError(f"cfg must be a TMSConfig, got {type(cfg).__name__}")
    torch.manual_seed(cfg.seed)
    I, n, h = cfg.n_instances, cfg.n_features, cfg.d_hidden
    W = torch.empty(I, h, n)
    for i in range(I):
        nn.init.xavier_normal_(W[i])
    W = nn.Parameter(W)
    b = nn.Parameter(torch.zeros(I, n))
    opt = torch.optim.AdamW([W, b], lr=cfg.lr, weight_decay=cfg.weight_decay)

    def fwd(x: torch.Tensor) -> torch.Tensor:  # x [batch, n] -> [I, batch, n]
        hid = torch.einsum("ihn,bn->ibh", W, x)
        return torch.relu(torch.einsum("ihn,ibh->ibn", W, hid) + b[:, None, :])

    for step in tqdm(range(cfg.steps), desc="train TMS", disable=quiet, leave=False):
        x = sparse_features(cfg.batch_size, n, cfg.feature_probability, generator=step_generator(cfg.seed, step))
        loss = ((fwd(x) - x) ** 2).mean(dim=(1, 2)).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    with torch.no_grad():
        x = sparse_features(20_000, n, cfg.feature_probability, generator=step_generator(cfg.seed, -1))
        losses = ((fwd(x) - x) ** 2).mean(dim=(1, 2))
    best = int(torch.argmin(losses))
    model = TMS(n, h)
    with torch.no_grad():
        model.W.copy_(W[best])
        model.b.copy_(b[best])
    info = {"loss": float(losses[best]), "instance_losses": losses.tolist(), "instance": best, "config": asdict(cfg)}
    return model, info
