"""Toy Model of Superposition with tied weights (Elhage et al. 2022), as used by APD.

The model is ``x_hat = ReLU(W^T W x + b)`` with ``W`` of shape ``[d_hidden, n_features]`` (``[out, in]`` of
the encoder ``h = W x``) and ``b`` of shape ``[n_features]``. Inputs are ``[batch, n_features]``.

Ground-truth mechanisms (Braun et al. 2025, Sec. 3.1): ``Z^(c) = W[:, c] e_c^T``, rank one, summing to ``W``.
Training recipe (App. D.1): AdamW, weight decay 0.01, constant learning rate 0.005 (the reference code in fact
decayed it linearly: ``lr_schedule="linear"``); TMS 5-2 for 5k steps at
batch 1024, TMS 40-10 for 2k steps at batch 2048; features active with probability 0.05, values ``U[0, 1]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mlpinterp.toys.data import sparse_features, step_generator
from mlpinterp.utils.progress import progress_bar
from mlpinterp.utils.schedules import linear_decay
from mlpinterp.utils.validation import Int, OneOf, Real, check_bool, check_fields, check_int


class TMS(nn.Module):
    """``x_hat = ReLU(W^T W x + b)``; ``W``: ``[d_hidden, n_features]``, ``b``: ``[n_features]``.

    With ``identity=True`` an ``nn.Linear`` module ``identity`` (``[d_hidden, d_hidden]``, no bias, weight ``I``)
    sits between the down- and the up-projection: ``x_hat = ReLU(W^T I W x + b)`` (the "+ID" models of the SPD
    paper, Sec. 3.2), the same function with one more weight matrix to decompose.
    """

    def __init__(self, n_features: int, d_hidden: int, identity: bool = False):
        super().__init__()
        check_int(n_features, "n_features")
        check_int(d_hidden, "d_hidden")
        check_bool(identity, "identity")
        self.n_features, self.d_hidden = int(n_features), int(d_hidden)
        self.W = nn.Parameter(torch.empty(d_hidden, n_features))
        self.b = nn.Parameter(torch.zeros(n_features))
        nn.init.xavier_normal_(self.W)
        self.identity = None
        if identity:
            self.identity = nn.Linear(d_hidden, d_hidden, bias=False)
            with torch.no_grad():
                self.identity.weight.copy_(torch.eye(d_hidden))

    @property
    def tied_relu_autoencoder(self) -> bool:
        """True when this model computes ``ReLU(W^T W x + b)`` from its tied ``W`` and ``b`` alone (no identity layer):
        the structure the closed-form APD attributions read (:func:`mlpinterp.apd.attributions.is_tied_relu_autoencoder`)."""
        return self.identity is None

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., n_features] -> [..., d_hidden]``: ``h = W x``."""
        return F.linear(x, self.W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., n_features] -> [..., n_features]``."""
        if x.ndim < 1 or x.shape[-1] != self.n_features:
            raise ValueError(f"x must have shape [..., n_features={self.n_features}], got {list(x.shape)}")
        h = self.hidden(x)
        if self.identity is not None:
            h = self.identity(h)
        return torch.relu(F.linear(h, self.W.T, self.b))


class TMSLinears(nn.Module):
    """The same function as a :class:`TMS` written with ``nn.Linear`` modules, as in the SPD reference implementation:
    ``linear1`` (weight ``W``, no bias), optionally ``identity`` (weight ``I``), ``linear2`` (weight ``W^T``, bias
    ``b``) and a ReLU. SPD decomposes ``linear1`` and ``linear2`` as two sites, each with its own causal importances
    and masks: the causal importance of a subcomponent of ``linear2`` then reads the hidden activation ``h`` (its
    input), which decides whether the interference on an inactive output passes the ReLU. (With the tied ``W`` as one
    site, the importances could only read ``x``.) The SPD presets tie the two sites' subcomponents (``linear2``'s
    are ``linear1``'s transposed: ``SPDConfig.tied``; how the optimiser sees them: ``SPDConfig.tied_updates``,
    :mod:`mlpinterp.spd.tying`). ``linear2.weight`` here is a frozen copy of ``W^T``, where the reference's
    ``TMSModel.tie_weights_`` (``spd/experiments/tms/models.py``) shares storage: the same target, which is never
    trained here. Build it with :func:`as_linears`.
    """

    def __init__(self, n_features: int, d_hidden: int, identity: bool = False):
        super().__init__()
        self.n_features, self.d_hidden = check_int(n_features, "n_features"), check_int(d_hidden, "d_hidden")
        self.linear1 = nn.Linear(n_features, d_hidden, bias=False)
        self.identity = nn.Linear(d_hidden, d_hidden, bias=False) if check_bool(identity, "identity") else None
        self.linear2 = nn.Linear(d_hidden, n_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., n_features] -> [..., n_features]``."""
        if x.ndim < 1 or x.shape[-1] != self.n_features:
            raise ValueError(f"x must have shape [..., n_features={self.n_features}], got {list(x.shape)}")
        h = self.linear1(x)
        if self.identity is not None:
            h = self.identity(h)
        return torch.relu(self.linear2(h))

    def target_names(self) -> list[str]:
        """The weights SPD decomposes: ``linear1``, (``identity``,) ``linear2``."""
        return ["linear1", *(["identity"] if self.identity is not None else []), "linear2"]


def as_linears(model: TMS) -> TMSLinears:
    """:class:`TMSLinears` computing exactly ``model``'s function (weights copied; ``linear2.weight = W^T``)."""
    if not isinstance(model, TMS):
        raise TypeError(f"model must be a TMS, got {type(model).__name__}")
    out = TMSLinears(model.n_features, model.d_hidden, identity=model.identity is not None)
    with torch.no_grad():
        out.linear1.weight.copy_(model.W)
        out.linear2.weight.copy_(model.W.T)
        out.linear2.bias.copy_(model.b)
        if model.identity is not None:
            out.identity.weight.copy_(model.identity.weight)
    return out


def with_identity(model: TMS) -> TMS:
    """A copy of ``model`` with the identity layer inserted (:class:`TMS` with ``identity=True``): same function."""
    if not isinstance(model, TMS):
        raise TypeError(f"model must be a TMS, got {type(model).__name__}")
    out = TMS(model.n_features, model.d_hidden, identity=True)
    with torch.no_grad():
        out.W.copy_(model.W)
        out.b.copy_(model.b)
    return out


def tms_ground_truth(model: TMS) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors of the ground-truth mechanisms ``Z^(c) = W[:, c] e_c^T``.

    Returns ``(A, B)`` with ``A``: ``[n_features, d_hidden, 1]`` and ``B``: ``[n_features, 1, n_features]`` so that
    ``A[c] @ B[c] = Z^(c)`` and ``sum_c Z^(c) = W`` exactly.
    """
    W = model.W.detach()
    A = W.T.unsqueeze(-1).clone()  # [C, d_hidden, 1], column c of W
    B = torch.eye(model.n_features, dtype=W.dtype).unsqueeze(1)  # [C, 1, n_features], e_c^T
    return A, B

#: TMSConfig fields added after the first version that saved targets with their configuration, with the behaviour of
#: a target without each: ``lr_schedule``, a constant learning rate. A saved target whose configuration lacks such a
#: field is the target of that value (:func:`mlpinterp.toys.settings.check_target`). Add a field here when it is
#: added to TMSConfig.
ADDED_FIELDS = {"lr_schedule": "constant"}


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
    """Peak AdamW learning rate."""
    lr_schedule: str = "constant"
    """``"constant"`` or ``"linear"`` (``lr (1 - step / steps)``, the APD reference's TMS recipe)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    n_instances: int = 8
    """Independent instances trained at once; the one with the lowest held-out loss is kept."""
    seed: int = 0
    """Seed for initialisation and data."""

    def __post_init__(self) -> None:
        check_fields(self, {("n_features", "d_hidden", "steps", "batch_size", "n_instances"): Int(1),
                            "seed": Int(None), "feature_probability": Real(0.0, 1.0, lo_open=True),
                            "lr": Real(0.0, lo_open=True), "weight_decay": Real(0.0),
                            "lr_schedule": OneOf(("constant", "linear"), either=True)})


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

    with progress_bar(cfg.steps, desc="train TMS", quiet=quiet) as bar:
        for step in range(cfg.steps):
            if cfg.lr_schedule == "linear":
                for g in opt.param_groups:
                    g["lr"] = cfg.lr * linear_decay(step, cfg.steps)
            x = sparse_features(cfg.batch_size, n, cfg.feature_probability, generator=step_generator(cfg.seed, step))
            loss = ((fwd(x) - x) ** 2).mean(dim=(1, 2)).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            bar.advance()
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
