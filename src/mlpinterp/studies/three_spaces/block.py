"""The one MLP a three-spaces run opens, read in its input space: the network, its inputs (fit, validation,
held-out), the output directions it is read along, its ground truth where known, and what SPD decomposes.

:func:`toy_block` builds it from a trained toy (residual MLP or TMS), :func:`transformer_block` from a captured FFN
block of a transformer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from mlpinterp.networks import MLP
from mlpinterp.toys.data import step_generator
from mlpinterp.toys.resid_mlp import ResidualMLP
from mlpinterp.toys.tms import TMSLinears


@dataclass
class Block:
    """One MLP and everything the three decompositions read of it (arrays float64, inputs ``[n, d_in]``)."""

    network: MLP
    """The MLP ``f: [n, d_in] -> [n, d_out]``."""
    X_fit: np.ndarray
    """Inputs the approximants and the SAE's first batches come from."""
    X_val: np.ndarray
    """Inputs choosing the data projection's ridge and the approximant (not fitted on, not reported)."""
    X_test: np.ndarray
    """Held-out inputs of every reported faithfulness, alive and L0 number."""
    readout: np.ndarray
    """``[d_out, q]``: output directions every faithfulness is measured along (the model's unembedding where it
    has one, else the identity)."""
    eigen_readout: np.ndarray
    """``[d_out, m]``: output directions whose quadratic forms give the eigen-features (one per direction)."""
    truth: np.ndarray | None
    """``[n_features, d_in]`` ground-truth input directions (toys), else None."""
    sae_batch: Callable[[int, int], torch.Tensor]
    """``(step, batch_size) -> [batch_size, d_in]`` float32 SAE training inputs (deterministic per step)."""
    spd_model: nn.Module
    """What SPD decomposes (the toy model, or the block as ``Sequential(Linear, act, Linear)``)."""
    spd_sample: Callable[[int, int], torch.Tensor]
    """``(step, batch_size) -> [batch_size, ...]`` inputs of ``spd_model``."""
    spd_input_site: str
    """The SPD site whose read directions ``V_c`` live in the MLP's input space."""
    spd_test: torch.Tensor
    """Held-out inputs of ``spd_model``."""
    spd_readout: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """``(spd_model output, spd_model input) -> [n, q]``: the block output along :attr:`readout`."""
    info: dict = field(default_factory=dict)


def _rows(sample: Callable[[int, torch.Generator], torch.Tensor], n: int, seed: int, tag: int) -> torch.Tensor:
    return sample(n, step_generator(seed, -tag))


def toy_block(name: str, toy: nn.Module, model: nn.Module, sample: Callable[[int, torch.Generator], torch.Tensor],
              seed: int, n_fit: int, n_test: int) -> Block:
    """The MLP of toy setting ``name`` (``toy``: the trained target; ``model``: its decomposed form; ``sample``:
    the setting's feature distribution ``(batch, generator) -> x``), with ``n_fit`` fit, ``n_fit // 4`` validation
    and ``n_test`` held-out inputs drawn from seeded streams of their own.

    Raises ``ValueError`` for a setting that is not a toy of this study.
    """
    x_fit, x_val, x_test = (_rows(sample, n, seed, t) for n, t in ((n_fit, 11), (max(n_fit // 4, 2), 12),
                                                                      (n_test, 13)))
    if name == "resid-mlp-1":
        if not isinstance(toy, ResidualMLP) or toy.n_layers != 1:
            raise ValueError(f"resid-mlp-1 needs a one-layer ResidualMLP, got {type(toy).__name__}")
        layer = toy.layers[0]
        W_E = toy.W_E.detach().double()

        def zeros_or(b, n):
            return np.zeros(n) if b is None else b.detach().double().numpy()

        net = MLP(layer.mlp_in.weight.detach().double().numpy(), zeros_or(layer.mlp_in.bias, toy.d_mlp),
                  layer.mlp_out.weight.detach().double().numpy(), zeros_or(layer.mlp_out.bias, toy.d_embed), "relu")

        def to_input(x):
            return (x.double() @ W_E).numpy()

        readout = W_E.numpy().T  # [d_embed, n_features]: W_U = W_E^T reads the block's output
        truth = W_E.numpy()
        site = "layers.0.mlp_in"

        def spd_readout(y, x):  # the model's output minus the residual stream's own readout: W_U f(r)
            return (y - x.to(y.dtype) @ W_E.to(y.dtype) @ W_E.T.to(y.dtype)).double()

        def sae_batch(step, b):
            return (sample(b, step_generator(seed + 101, step)) @ W_E.float())
    elif name == "tms-5-2":
        if not isinstance(model, TMSLinears) or model.identity is not None:
            raise ValueError(f"tms-5-2 needs the TMS as TMSLinears without identity, got {type(model).__name__}")
        W = model.linear1.weight.detach().double()  # [d_hidden, n_features]
        b = model.linear2.bias.detach().double().numpy()
        net = MLP(W.numpy().T, b, np.eye(toy.n_features), np.zeros(toy.n_features), "relu")

        def to_input(x):
            return (x.double() @ W.T).numpy()

        readout = np.eye(toy.n_features)
        truth = W.numpy().T  # [n_features, d_hidden]: the feature columns W[:, i]
        site = "linear2"

        def spd_readout(y, x):
            return y.double()

        def sae_batch(step, b):
            return sample(b, step_generator(seed + 101, step)) @ W.float().T
    else:
        raise ValueError(f"toy setting must be one of ('resid-mlp-1', 'tms-5-2'), got {name!r}")
    return Block(network=net, X_fit=to_input(x_fit), X_val=to_input(x_val), X_test=to_input(x_test),
                 readout=readout, eigen_readout=readout, truth=truth, sae_batch=sae_batch, spd_model=model,
                 spd_sample=lambda step, b: sample(b, step_generator(seed + 202, step)), spd_input_site=site,
                 spd_test=x_test, spd_readout=spd_readout,
                 info={"d_in": net.d_in, "d_hidden": net.d_hidden, "d_out": net.d_out, "input": (
                     "the residual stream r = x W_E" if name == "resid-mlp-1" else "the hidden activation h = W x")})


def transformer_block(network: MLP, X_fit: np.ndarray, X_test: np.ndarray, n_readouts: int, seed: int) -> Block:
    """A captured FFN block: ``X_fit`` (its last fifth is the validation split) and ``X_test`` ``[n, d_in]``; the
    eigen-features are read along the top ``n_readouts`` principal directions of the block's output on the fit
    inputs (:func:`mlpinterp.lm.features.output_directions`); faithfulness on every output coordinate.

    Raises ``ValueError`` for fewer than 10 fit or 2 held-out inputs or widths other than ``network.d_in``.
    """
    from mlpinterp.lm.features import output_directions

    X_fit, X_test = np.asarray(X_fit, dtype=np.float64), np.asarray(X_test, dtype=np.float64)
    for name, X, least in (("X_fit", X_fit, 10), ("X_test", X_test, 2)):
        if X.ndim != 2 or X.shape[0] < least or X.shape[1] != network.d_in:
            raise ValueError(f"{name} must have shape [n >= {least}, d_in={network.d_in}], got {list(X.shape)}")
    n_val = X_fit.shape[0] // 5
    X_val, X_fit = X_fit[-n_val:], X_fit[:-n_val]
    U, frac = output_directions(network(X_fit[:20_000]), n_readouts)
    module = network.to_module().float()
    fit_t = torch.from_numpy(X_fit).float()

    def rows(step, b, offset):
        g = step_generator(seed + offset, step)
        return fit_t[torch.randint(0, fit_t.shape[0], (b,), generator=g)]

    return Block(network=network, X_fit=X_fit, X_val=X_val, X_test=X_test, readout=np.eye(network.d_out),
                 eigen_readout=U, truth=None, sae_batch=lambda step, b: rows(step, b, 101), spd_model=module,
                 spd_sample=lambda step, b: rows(step, b, 202), spd_input_site="0",
                 spd_test=torch.from_numpy(X_test).float(), spd_readout=lambda y, x: y.double(),
                 info={"d_in": network.d_in, "d_hidden": network.d_hidden, "d_out": network.d_out,
                       "input": "the FFN block's input (captured tokens)",
                       "eigen_readout_variance": [float(v) for v in frac]})
