"""One-hidden-layer networks whose polynomial approximants we compute.

* ``MLP``: f(x) = W2 phi(W1 x + b1) + b2
* ``GLU``: f(x) = W2 (phi(W x + b) * (V x + c)) + b2  (bilinear: phi = identity; ReGLU, GeGLU, SwiGLU:
  phi = relu, gelu, silu). ``W2``/``b2`` may be omitted (identity read-out of the d_hidden gates).

Weights follow ``torch.nn.Linear``: ``W1 [d_hidden, d_in]``, ``W2 [d_out, d_hidden]``. Arrays are
stored as float64 numpy; numpy arrays and torch tensors are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mlpinterp.gaussian.activations import Activation, get_activation
from mlpinterp.utils.reprs import digest, short_repr
from mlpinterp.utils.validation import as_inputs, check_shape, frozen, to_numpy


@dataclass(frozen=True, eq=False)
class MLP:
    """f(x) = W2 phi(W1 x + b1) + b2 (Rigg & Belrose 2025, eq. 1).

    Parameters
    ----------
    W1 : ``[d_hidden, d_in]``; b1 : ``[d_hidden]``; W2 : ``[d_out, d_hidden]``; b2 : ``[d_out]``
    activation : name (``"relu"``, ``"gelu"``, ...), ``Activation`` or elementwise callable.

    Raises ``ValueError`` on mismatched shapes or non-finite weights (the message names the argument).
    Calling the network on ``X [n, d_in]`` (or ``[d_in]``) returns ``[n, d_out]`` (or ``[d_out]``).
    """

    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray
    activation: Activation | str = "relu"
    act: Activation = field(init=False, repr=False)

    def __post_init__(self) -> None:
        W1 = to_numpy(self.W1, "W1")
        if W1.ndim != 2:
            raise ValueError(f"W1 must have shape [d_hidden, d_in], got {list(W1.shape)}")
        h = W1.shape[0]
        b1 = check_shape(to_numpy(self.b1, "b1"), "b1", (h,))
        W2 = to_numpy(self.W2, "W2")
        if W2.ndim != 2 or W2.shape[1] != h:
            raise ValueError(f"W2 must have shape [d_out, d_hidden={h}], got {list(W2.shape)}")
        b2 = check_shape(to_numpy(self.b2, "b2"), "b2", (W2.shape[0],))
        for k, v in dict(W1=W1, b1=b1, W2=W2, b2=b2).items():
            object.__setattr__(self, k, frozen(v))
        object.__setattr__(self, "act", get_activation(self.activation))
        object.__setattr__(self, "activation", self.act.name)

    d_in = property(lambda self: self.W1.shape[1], doc="Input dimension.")
    d_hidden = property(lambda self: self.W1.shape[0], doc="Number of hidden neurons.")
    d_out = property(lambda self: self.W2.shape[0], doc="Output dimension.")

    def __repr__(self) -> str:
        """Shapes, activation, dtype and a digest of the weights (equal digest: bit-identical weights)."""
        return short_repr("MLP", d_in=self.d_in, d_hidden=self.d_hidden, d_out=self.d_out, activation=self.activation,
                          dtype=self.W1.dtype, digest=digest(self.W1, self.b1, self.W2, self.b2))

    def hidden(self, X) -> np.ndarray:
        """Post-activations ``phi(W1 x + b1)``: ``[n, d_hidden]``."""
        X, _ = as_inputs(X, self.d_in)
        return self.act.fn(X @ self.W1.T + self.b1)

    def __call__(self, X) -> np.ndarray:
        X, single = as_inputs(X, self.d_in)
        out = self.act.fn(X @ self.W1.T + self.b1) @ self.W2.T + self.b2
        return out[0] if single else out

    def to_module(self):
        """Equivalent float64 ``torch.nn.Sequential``."""
        import torch
        import torch.nn as nn

        l1 = nn.Linear(self.d_in, self.d_hidden, dtype=torch.float64)
        l2 = nn.Linear(self.d_hidden, self.d_out, dtype=torch.float64)
        with torch.no_grad():
            l1.weight.copy_(torch.tensor(self.W1))
            l1.bias.copy_(torch.tensor(self.b1))
            l2.weight.copy_(torch.tensor(self.W2))
            l2.bias.copy_(torch.tensor(self.b2))
        return nn.Sequential(l1, _TorchAct(self.act), l2)


@dataclass(frozen=True, eq=False)
class GLU:
    """f(x) = W2 (phi(W x + b) * (V x + c)) + b2 (gated linear unit; Rigg & Belrose 2025, §3.3).

    Parameters
    ----------
    W, V : ``[d_hidden, d_in]``; b, c : ``[d_hidden]`` (default zeros);
    W2 : ``[d_out, d_hidden]`` (default identity, d_out = d_hidden); b2 : ``[d_out]`` (default zeros);
    activation : gate nonlinearity phi; ``"identity"`` gives a bilinear layer, ``"relu"`` ReGLU,
    ``"gelu"`` GeGLU, ``"silu"`` SwiGLU.
    """

    W: np.ndarray
    b: np.ndarray | None
    V: np.ndarray
    c: np.ndarray | None
    W2: np.ndarray | None = None
    b2: np.ndarray | None = None
    activation: Activation | str = "relu"
    act: Activation = field(init=False, repr=False)

    def __post_init__(self) -> None:
        W = to_numpy(self.W, "W")
        if W.ndim != 2:
            raise ValueError(f"W must have shape [d_hidden, d_in], got {list(W.shape)}")
        h, d = W.shape
        V = check_shape(to_numpy(self.V, "V"), "V", (h, d))
        b = np.zeros(h) if self.b is None else check_shape(to_numpy(self.b, "b"), "b", (h,))
        c = np.zeros(h) if self.c is None else check_shape(to_numpy(self.c, "c"), "c", (h,))
        W2 = np.eye(h) if self.W2 is None else to_numpy(self.W2, "W2")
        if W2.ndim != 2 or W2.shape[1] != h:
            raise ValueError(f"W2 must have shape [d_out, d_hidden={h}], got {list(W2.shape)}")
        b2 = np.zeros(W2.shape[0]) if self.b2 is None else check_shape(to_numpy(self.b2, "b2"), "b2", (W2.shape[0],))
        for k, v in dict(W=W, b=b, V=V, c=c, W2=W2, b2=b2).items():
            object.__setattr__(self, k, frozen(v))
        object.__setattr__(self, "act", get_activation(self.activation))
        object.__setattr__(self, "activation", self.act.name)

    d_in = property(lambda self: self.W.shape[1], doc="Input dimension.")
    d_hidden = property(lambda self: self.W.shape[0], doc="Number of gated units.")
    d_out = property(lambda self: self.W2.shape[0], doc="Output dimension.")

    def __repr__(self) -> str:
        """Shapes, gate activation, dtype and a digest of the weights (equal digest: bit-identical weights)."""
        return short_repr("GLU", d_in=self.d_in, d_hidden=self.d_hidden, d_out=self.d_out, activation=self.activation,
                          dtype=self.W.dtype, digest=digest(self.W, self.b, self.V, self.c, self.W2, self.b2))

    def hidden(self, X) -> np.ndarray:
        """Gated activations ``phi(W x + b) * (V x + c)``: ``[n, d_hidden]``."""
        X, _ = as_inputs(X, self.d_in)
        return self.act.fn(X @ self.W.T + self.b) * (X @ self.V.T + self.c)

    def __call__(self, X) -> np.ndarray:
        X, single = as_inputs(X, self.d_in)
        out = (self.act.fn(X @ self.W.T + self.b) * (X @ self.V.T + self.c)) @ self.W2.T + self.b2
        return out[0] if single else out


Network = MLP | GLU


class _TorchAct:
    """Wrap an ``Activation`` as a parameter-free torch module (created lazily to keep torch optional here)."""

    def __new__(cls, act: Activation):
        import torch.nn as nn

        class ActModule(nn.Module):
            def __init__(self):
                super().__init__()
                self.name = act.name

            def forward(self, x):
                return act.torch_fn(x)

            def extra_repr(self) -> str:
                return self.name

        return ActModule()


def validate_network(network) -> Network:
    """Raise ``TypeError`` unless ``network`` is an ``MLP`` or ``GLU``."""
    if not isinstance(network, MLP | GLU):
        raise TypeError(
            f"network must be mlpinterp.MLP or mlpinterp.GLU, got {type(network).__name__}; "
            "use mlpinterp.from_module(...) for a torch module"
        )
    return network
