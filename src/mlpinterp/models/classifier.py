"""One-hidden-layer MLP and GLU classifiers, as trained in Rigg & Belrose (2025, arXiv 2502.01032, §4).

* ``arch="mlp"``: ``logits = W2 act(W1 x + b1) + b2``.
* ``arch="glu"`` (Shazeer 2020, "GLU Variants Improve Transformer"):
  ``logits = W2 (act(W x + b) * (V x + c)) + b2``; ``act`` relu -> ReGLU, silu -> SwiGLU,
  gelu -> GeGLU, identity -> bilinear layer.

Weights follow ``torch.nn.Linear``: ``[out, in]``. Inputs ``[batch, d_in]``, logits
``[batch, n_classes]``.
"""

from __future__ import annotations

import torch
from torch import nn

from mlpinterp.models.config import ACTIVATION_NAMES, ARCHS, ClassifierConfig

ACTIVATIONS: dict[str, object] = {
    "relu": torch.relu,
    "gelu": nn.functional.gelu,  # exact erf form, as assumed by the Gaussian closed forms
    "silu": nn.functional.silu,
    "tanh": torch.tanh,
    "identity": lambda x: x,
}
"""Activation name -> torch function (the names of :mod:`mlpinterp.networks`)."""
if tuple(ACTIVATIONS) != ACTIVATION_NAMES:  # pragma: no cover - the two lists must be edited together
    raise ImportError(f"ACTIVATIONS {tuple(ACTIVATIONS)} != models.config.ACTIVATION_NAMES {ACTIVATION_NAMES}")

__all__ = ["ACTIVATIONS", "ARCHS", "Classifier", "ClassifierConfig"]


class Classifier(nn.Module):
    """One-hidden-layer MLP or GLU classifier built from a :class:`ClassifierConfig`.

    Submodules (``torch.nn.Linear``, weights ``[out, in]``):

    * mlp: ``hidden`` (W1 ``[d_hidden, d_in]``, b1), ``out`` (W2 ``[n_classes, d_hidden]``, b2);
    * glu: ``gate`` (W, b: activated), ``value`` (V, c: linear), ``out`` (W2, b2).

    Parameters are initialised by PyTorch's default ``nn.Linear`` initialisation using a private
    generator seeded with ``cfg.seed`` (the global torch RNG is left untouched).
    """

    def __init__(self, cfg: ClassifierConfig) -> None:
        super().__init__()
        if not isinstance(cfg, ClassifierConfig):
            raise TypeError(f"cfg must be a ClassifierConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            if cfg.arch == "mlp":
                self.hidden = nn.Linear(cfg.d_in, cfg.d_hidden)
            else:
                self.gate = nn.Linear(cfg.d_in, cfg.d_hidden)
                self.value = nn.Linear(cfg.d_in, cfg.d_hidden)
            self.out = nn.Linear(cfg.d_hidden, cfg.n_classes)
        self._act = ACTIVATIONS[cfg.activation]

    def hidden_activations(self, x: torch.Tensor) -> torch.Tensor:
        """Post-activation hidden layer ``[batch, d_hidden]`` (for glu: the gated product)."""
        if self.cfg.arch == "mlp":
            return self._act(self.hidden(x))
        return self._act(self.gate(x)) * self.value(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, n_classes]`` for inputs ``x`` ``[batch, d_in]``."""
        if x.ndim != 2 or x.shape[1] != self.cfg.d_in:
            raise ValueError(f"x must have shape [batch, {self.cfg.d_in}], got {list(x.shape)}")
        return self.out(self.hidden_activations(x))

    def to_network(self):
        """The weights as a :class:`mlpinterp.networks.MLP` or :class:`mlpinterp.networks.GLU`.

        Arrays are float64 numpy copies, shapes ``[out, in]``; the activation name is passed on.
        """
        from mlpinterp import networks

        def np64(t: torch.Tensor):
            return t.detach().cpu().to(torch.float64).numpy().copy()

        if self.cfg.arch == "mlp":
            return networks.MLP(
                W1=np64(self.hidden.weight),
                b1=np64(self.hidden.bias),
                W2=np64(self.out.weight),
                b2=np64(self.out.bias),
                activation=self.cfg.activation,
            )
        return networks.GLU(
            W=np64(self.gate.weight),
            b=np64(self.gate.bias),
            V=np64(self.value.weight),
            c=np64(self.value.bias),
            W2=np64(self.out.weight),
            b2=np64(self.out.bias),
            activation=self.cfg.activation,
        )
