"""The paper's hybrid fit under a Gaussian mixture: closed-form N(0, I) start + schedule-free SGD.

Rigg & Belrose (2025, arXiv 2502.01032, §4) call the exact mixture quadratic intractable and instead
initialise the coefficients at the optimal approximant under N(0, I) (closed form) and fine-tune them on
samples of the class-conditional Gaussian mixture. This module reproduces that baseline so that the exact
solver (``poly.mixture.exact.fit_mixture``) can be compared with it at equal wall time.

The coefficients are the raw-coordinate tensors ``T0 [d_out]``, ``T1 [d_out, d_in]``, ``T2 [d_out, d_in, d_in]``
of ``p(x) = T0 + T1 x + x^T T2 x``; each step draws a fresh batch from the mixture and takes one
schedule-free step (Defazio et al. 2024, ``schedulefree.SGDScheduleFree`` or ``AdamWScheduleFree``) on the
mean squared error. A fixed held-out mixture sample gives the FVU curve. The loop is the one hybrid fine-tune of
:mod:`mlpinterp.poly.finetune` with :class:`~mlpinterp.poly.finetune.SampledBatches` of the mixture.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.networks import Network, validate_network
from mlpinterp.poly.approximant import DensePolynomial
from mlpinterp.poly.ridge import fit_ridge

_OPTIMIZERS = ("sgd", "adamw")
#: Default learning rates: stable on MNIST-scale inputs in [0, 1] (SGD needs lr < 1 / lambda_max(E[z z^T]) ~ 1 / E|x|^4).
DEFAULT_LR = {"sgd": 1e-4, "adamw": 1e-4}


def _poly_forward(params, X):
    """p(X) for raw-coordinate tensors ``params = [T0, T1, (T2)]`` and ``X [n, d]`` -> ``[n, d_out]``."""
    import torch

    out = params[0] + X @ params[1].T
    if len(params) > 2:
        T2 = params[2]
        o, d, _ = T2.shape
        Z = (X @ T2.permute(1, 0, 2).reshape(d, o * d)).reshape(X.shape[0], o, d)
        out = out + torch.einsum("nod,nd->no", Z, X)
    return out


def _raw_polynomial_module(coefficients):
    """An ``nn.Module`` computing ``p(x) = T0 + T1 x (+ x^T T2 x)`` (:func:`_poly_forward`) whose parameters are the
    raw-coordinate tensors ``coefficients`` (``.coefficients``, a ``ParameterList``); torch is imported lazily."""
    from torch import nn

    class RawPolynomial(nn.Module):
        def __init__(self):
            super().__init__()
            self.coefficients = nn.ParameterList([nn.Parameter(c) for c in coefficients])

        def forward(self, X):
            return _poly_forward(list(self.coefficients), X)

    return RawPolynomial()


def fit_sgd(
    network: Network,
    mixture: GaussianMixture,
    degree: int = 2,
    *,
    steps: int = 2000,
    batch_size: int = 256,
    lr: float | None = None,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    warmup_steps: int = 0,
    time_limit: float | None = None,
    target_fvu: float | None = None,
    eval_every: int = 50,
    n_eval: int = 4096,
    seed: int = 0,
    device=None,
    dtype=None,
    progress: bool = True,
) -> DensePolynomial:
    """Hybrid approximant: N(0, I) closed-form start, then schedule-free SGD on fresh mixture samples.

    Parameters
    ----------
    network : ``MLP`` or ``GLU``; mixture : ``GaussianMixture`` on R^{d_in}
    degree : 1 or 2
    steps : maximum number of optimiser steps; batch_size : fresh mixture samples per step
    lr : learning rate (default ``DEFAULT_LR[optimizer]``); optimizer : ``"sgd"`` (``SGDScheduleFree``,
        with ``momentum``) or ``"adamw"`` (``AdamWScheduleFree``); warmup_steps : schedule-free warm-up
    time_limit : stop after this many seconds of training (sampling + steps; evaluation not counted)
    target_fvu : stop as soon as the held-out FVU is <= this value
    eval_every : evaluate the held-out FVU every this many steps (and at steps 0 and the last)
    n_eval : size of the fixed held-out mixture sample (seed ``seed + 1``)
    seed : seeds the batches, the held-out sample and torch
    device : torch device (default CUDA when available); dtype : ``torch.float32`` (default) or ``torch.float64``
    progress : a progress bar (``mlpinterp.utils.progress``)

    Returns
    -------
    ``DensePolynomial`` (raw-coordinate tensors, float64). ``p.info["history"]`` is a list of
    ``{"step", "wall_time_s", "fvu"}`` (FVU: pooled fraction of variance unexplained on the held-out sample);
    ``p.info["time_to_target_s"]`` the training time at which ``target_fvu`` was reached (None if not).

    Raises
    ------
    TypeError : wrong network/mixture type. ValueError : d_in mismatch, degree not 1 or 2, bad optimiser,
    non-positive steps/batch_size/lr/eval_every/n_eval, unknown dtype.
    """
    import torch

    from mlpinterp.poly.finetune import SampledBatches, Validation
    from mlpinterp.poly.finetune import finetune as finetune_loop
    from mlpinterp.poly.finetune_config import FinetuneConfig

    network = validate_network(network)
    if not isinstance(mixture, GaussianMixture):
        raise TypeError(f"mixture must be mlpinterp.GaussianMixture, got {type(mixture).__name__}")
    if mixture.d != network.d_in:
        raise ValueError(f"mixture has dimension {mixture.d} but the network has d_in = {network.d_in}")
    if degree not in (1, 2) or isinstance(degree, bool):
        raise ValueError(f"degree must be 1 or 2 for method='sgd' (d_in^degree parameters), got {degree!r}")
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {_OPTIMIZERS}, got {optimizer!r}")
    for name, v in dict(steps=steps, batch_size=batch_size, eval_every=eval_every, n_eval=n_eval).items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if n_eval < 2:
        raise ValueError(f"n_eval must be >= 2 (the held-out FVU needs a variance), got {n_eval}")
    lr = DEFAULT_LR[optimizer] if lr is None else lr
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    if dtype in (None, "float32", torch.float32):
        tdtype = torch.float32
    elif dtype in ("float64", torch.float64):
        tdtype = torch.float64
    else:
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")

    torch.manual_seed(seed)
    init = fit_ridge(network, Gaussian.standard(network.d_in), degree)
    model = _raw_polynomial_module([torch.tensor(init.coefficients(k), device=dev, dtype=tdtype) for k in range(degree + 1)])
    cfg = FinetuneConfig(steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps, eval_every=eval_every,
                         seed=seed, optimizer=optimizer, momentum=momentum)
    X_eval = mixture.sample(n_eval, np.random.default_rng(seed + 1))
    validation = Validation(torch.as_tensor(X_eval, device=dev, dtype=tdtype),
                            torch.as_tensor(network(X_eval), device=dev, dtype=torch.float64), chunk=1024)
    run = finetune_loop(model, SampledBatches(network, mixture, batch_size, seed, device=dev, dtype=tdtype), cfg,
                        validation=validation, target_fvu=target_fvu, time_limit=time_limit, what="the hybrid SGD",
                        desc="hybrid SGD", quiet=not progress)
    history: list[dict[str, Any]] = [{"step": h["step"], "wall_time_s": h["seconds"], "fvu": h["fvu"]}
                                     for h in run.history]
    step = run.steps
    if not np.isfinite(history[-1]["fvu"]):
        raise ValueError(f"the hybrid SGD diverged (non-finite held-out FVU after {step} steps); lower lr (got {lr})")
    tensors = tuple(p.detach().to("cpu", torch.float64).numpy().copy() for p in model.coefficients)
    if degree == 2:
        T2 = tensors[2]
        tensors = (tensors[0], tensors[1], 0.5 * (T2 + np.swapaxes(T2, 1, 2)))
    info = {
        "network": type(network).__name__, "activation": network.activation,
        "distribution": f"GaussianMixture(K={mixture.K})", "method": "sgd-hybrid", "degree": degree,
        "d_in": network.d_in, "optimizer": optimizer, "lr": lr, "batch_size": batch_size, "steps": step,
        "history": history, "time_to_target_s": run.time_to_target, "target_fvu": target_fvu,
        "n_eval": n_eval, "device": str(dev), "dtype": str(tdtype).replace("torch.", ""),
    }
    return DensePolynomial(tensors, info=info)
