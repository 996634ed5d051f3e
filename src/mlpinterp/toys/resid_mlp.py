"""Residual MLP doing compressed computation (Braun et al. 2025, Secs. 3.2-3.3, App. D.2).

``n_features`` inputs ``x_i ~ U[-1, 1]`` (active with probability 0.01) are embedded by a fixed random matrix
``W_E``: ``[n_features, d_embed]`` with unit-norm rows, pass through ``n_layers`` residual MLP blocks
``r <- r + W_out ReLU(W_in r + b_in) + b_out`` (``bias=False``: without ``b_in``, ``b_out``, as the APD/SPD
reference implementation's targets) and are read out by ``W_U = W_E^T``. Labels: ``y_i = x_i + ReLU(x_i)``. Paper
sizes: 100 features, ``d_embed = 1000``, 50 neurons in one layer (resid-mlp-1) or 25 per layer in two layers
(resid-mlp-2). Training: AdamW, weight decay 0.01, learning rate 3e-3 with cosine decay, batch 2048.

Module names (the decomposition targets): ``layers.{i}.mlp_in`` (``[d_mlp, d_embed]``),
``layers.{i}.mlp_out`` (``[d_embed, d_mlp]``); the post-ReLU activation is the output of ``layers.{i}.act``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from mlpinterp.toys.data import sparse_features, step_generator
from mlpinterp.utils.progress import progress_bar
from mlpinterp.utils.schedules import cosine_half, cosine_quarter
from mlpinterp.utils.validation import Bool, Int, OneOf, Real, check_fields, check_int


class MLPBlock(nn.Module):
    """``r -> W_out ReLU(W_in r + b_in) + b_out`` with ``nn.Linear`` layers ``mlp_in`` and ``mlp_out`` (no ``b_in``,
    ``b_out`` when ``bias`` is False)."""

    def __init__(self, d_embed: int, d_mlp: int, bias: bool = True):
        super().__init__()
        self.mlp_in = nn.Linear(d_embed, d_mlp, bias=bias)
        self.act = nn.ReLU()
        self.mlp_out = nn.Linear(d_mlp, d_embed, bias=bias)

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        return self.mlp_out(self.act(self.mlp_in(r)))


def random_embedding(n_features: int, d_embed: int, seed: int) -> torch.Tensor:
    """``[n_features, d_embed]`` Gaussian matrix with unit-norm rows, from ``seed``."""
    g = torch.Generator().manual_seed(int(seed) + 7_777)
    W_E = torch.randn(n_features, d_embed, generator=g)
    return W_E / W_E.norm(dim=1, keepdim=True)


class ResidualMLP(nn.Module):
    """Residual MLP with fixed embedding ``W_E`` (buffer) and unembedding ``W_E^T``.

    ``forward``: ``[..., n_features] -> [..., n_features]``.
    """

    def __init__(self, n_features: int, d_embed: int, d_mlp: int, n_layers: int, W_E: torch.Tensor,
                 bias: bool = True):
        super().__init__()
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be a bool, got {bias!r}")
        for name, v in (("n_features", n_features), ("d_embed", d_embed), ("d_mlp", d_mlp), ("n_layers", n_layers)):
            check_int(v, name)
        if not isinstance(W_E, torch.Tensor) or not W_E.is_floating_point():
            raise TypeError(f"W_E must be a floating-point torch.Tensor [n_features, d_embed], got "
                            f"{W_E.dtype if isinstance(W_E, torch.Tensor) else type(W_E).__name__}")
        if not bool(torch.isfinite(W_E).all()):
            raise ValueError(f"W_E contains {int((~torch.isfinite(W_E)).sum())} non-finite value(s)")
        if W_E.shape != (n_features, d_embed):
            raise ValueError(f"W_E must have shape [{n_features}, {d_embed}], got {list(W_E.shape)}")
        self.n_features, self.d_embed, self.d_mlp, self.n_layers = n_features, d_embed, d_mlp, n_layers
        self.bias = bias
        self.register_buffer("W_E", W_E.clone())
        self.layers = nn.ModuleList([MLPBlock(d_embed, d_mlp, bias) for _ in range(n_layers)])

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., n_features] -> [..., d_embed]``: the residual stream before the first block."""
        return x @ self.W_E

    def readout_weight(self) -> torch.Tensor:
        """``W_U = W_E^T`` as an ``[out, in]`` matrix: ``[n_features, d_embed]`` (output = ``r @ W_U^T``)."""
        return self.W_E

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim < 1 or x.shape[-1] != self.n_features:
            raise ValueError(f"x must have shape [..., n_features={self.n_features}], got {list(x.shape)}")
        r = self.embed(x)
        for layer in self.layers:
            r = r + layer(r)
        return r @ self.readout_weight().T

    def target_names(self) -> list[str]:
        """The ``nn.Linear`` modules APD decomposes: every ``mlp_in`` and ``mlp_out``."""
        return [f"layers.{i}.{n}" for i in range(self.n_layers) for n in ("mlp_in", "mlp_out")]

    def act_names(self) -> list[str]:
        """Modules whose outputs are the post-ReLU activations (hidden-activation reconstruction)."""
        return [f"layers.{i}.act" for i in range(self.n_layers)]


def resid_labels(x: torch.Tensor) -> torch.Tensor:
    """``y = x + ReLU(x)``, elementwise."""
    return x + torch.relu(x)


def neuron_contributions(model: ResidualMLP, weights: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """``[n_features, n_layers * d_mlp]``: ``(W_U[i] W_out) * (W_in W_E[i])`` per feature ``i`` (paper Fig. 4).

    ``weights`` optionally overrides ``layers.{l}.mlp_in`` / ``layers.{l}.mlp_out`` weights (e.g. one APD component).
    """
    weights = weights or {}
    if not isinstance(weights, dict):
        raise TypeError(f"weights must be a dict name -> weight tensor, got {type(weights).__name__}")
    shapes = {}
    for i in range(model.n_layers):
        shapes[f"layers.{i}.mlp_in"] = (model.d_mlp, model.d_embed)
        shapes[f"layers.{i}.mlp_out"] = (model.d_embed, model.d_mlp)
    unknown = sorted(set(weights) - set(shapes))
    if unknown:
        raise ValueError(f"weights names unknown layers {unknown}; expected some of {sorted(shapes)}")
    for name, w in weights.items():
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != shapes[name]:
            got = list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
            raise ValueError(f"weights[{name!r}] must be a tensor of shape {list(shapes[name])}, got {got}")
    out = []
    for i, layer in enumerate(model.layers):
        W_in = weights.get(f"layers.{i}.mlp_in", layer.mlp_in.weight).detach()  # [d_mlp, d_embed]
        W_out = weights.get(f"layers.{i}.mlp_out", layer.mlp_out.weight).detach()  # [d_embed, d_mlp]
        read = model.W_E @ W_in.T  # [n_features, d_mlp]
        write = model.W_E @ W_out  # [n_features, d_mlp]  (W_U[i] = W_E[i])
        out.append(read * write)
    return torch.cat(out, dim=1)


RESID_LR_SCHEDULES = ("cosine", "quarter_cosine")


@dataclass(frozen=True)
class ResidMLPConfig:
    """Training recipe for a residual-MLP target (APD paper App. D.2)."""

    n_features: int = 100
    """Number of input features."""
    d_embed: int = 1000
    """Residual stream width."""
    d_mlp: int = 50
    """Neurons per MLP layer."""
    n_layers: int = 1
    """Number of residual MLP blocks."""
    feature_probability: float = 0.01
    """Probability that a feature is active; active values are U[-1, 1]."""
    steps: int = 10_000
    """Optimiser steps."""
    batch_size: int = 2048
    """Samples per step."""
    lr: float = 3e-3
    """Peak AdamW learning rate (cosine decay to 0)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    lr_schedule: str = "cosine"
    """"cosine" (``lr (1 + cos(pi t / T)) / 2``) or "quarter_cosine" (``lr cos(pi/2 t / (T - 1))``, the APD/SPD
    reference's target training)."""
    bias: bool = True
    """Biases ``b_in``, ``b_out`` in the MLPs (the reference's targets have none)."""
    seed: int = 0
    """Seed for the embedding, the initialisation and the data."""

    def __post_init__(self) -> None:
        check_fields(self, {("n_features", "d_embed", "d_mlp", "n_layers", "steps", "batch_size"): Int(1),
                            "seed": Int(None), "feature_probability": Real(0.0, 1.0, lo_open=True),
                            "lr": Real(0.0, lo_open=True), "weight_decay": Real(0.0),
                            "lr_schedule": OneOf(RESID_LR_SCHEDULES), "bias": Bool()})


#: ResidMLPConfig fields added after targets were first saved with their configuration, with the behaviour before
#: each (``config_diff``'s ``implicit``): biases, the half-period cosine. Add a field here when it is added.
ADDED_FIELDS = {"lr_schedule": "cosine", "bias": True}

RESID_PRESETS: dict[str, ResidMLPConfig] = {
    "resid-mlp-1": ResidMLPConfig(d_mlp=50, n_layers=1),
    "resid-mlp-2": ResidMLPConfig(d_mlp=25, n_layers=2),
    # SPD paper, appendix: 102 features, 17 neurons in each of 3 layers (51 in total)
    "resid-mlp-3": ResidMLPConfig(n_features=102, d_mlp=17, n_layers=3),
}


def build_resid_mlp(cfg: ResidMLPConfig) -> ResidualMLP:
    """An untrained :class:`ResidualMLP` with the embedding drawn from ``cfg.seed``."""
    if not isinstance(cfg, ResidMLPConfig):
        raise TypeError(f"cfg must be a ResidMLPConfig, got {type(cfg).__name__}")
    torch.manual_seed(cfg.seed)
    W_E = random_embedding(cfg.n_features, cfg.d_embed, cfg.seed)
    return ResidualMLP(cfg.n_features, cfg.d_embed, cfg.d_mlp, cfg.n_layers, W_E, bias=cfg.bias)


def _target_lr(cfg: ResidMLPConfig, step: int) -> float:
    if cfg.lr_schedule == "quarter_cosine":
        return cfg.lr * cosine_quarter(step, cfg.steps)
    return cfg.lr * cosine_half(step, cfg.steps, zero_at_last_step=False)


def train_resid_mlp(cfg: ResidMLPConfig, quiet: bool = False) -> tuple[ResidualMLP, dict]:
    """Train a residual MLP on ``y = x + ReLU(x)`` with MSE. Returns ``(model, info)``.

    ``info["loss"]`` is the held-out MSE (mean over features and 20 000 samples).
    """
    model = build_resid_mlp(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    with progress_bar(cfg.steps, desc="train resid-MLP", quiet=quiet) as bar:
        for step in range(cfg.steps):
            for group in opt.param_groups:
                group["lr"] = _target_lr(cfg, step)
            x = sparse_features(cfg.batch_size, cfg.n_features, cfg.feature_probability, (-1.0, 1.0),
                                generator=step_generator(cfg.seed, step))
            loss = ((model(x) - resid_labels(x)) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            bar.advance()
    with torch.no_grad():
        x = sparse_features(20_000, cfg.n_features, cfg.feature_probability, (-1.0, 1.0),
                            generator=step_generator(cfg.seed, -1))
        loss = float(((model(x) - resid_labels(x)) ** 2).mean())
    return model, {"loss": loss, "config": asdict(cfg)}
