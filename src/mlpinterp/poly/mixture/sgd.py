"""The paper's hybrid fit under a Gaussian mixture: closed-form N(0, I) start + schedule-free SGD.

Rigg & Belrose (2025, arXiv 2502.01032, §4) call the exact mixture quadratic intractable and instead
initialise the coefficients at the optimal approximant under N(0, I) (closed form) and fine-tune them on
samples of the class-conditional Gaussian mixture. This module reproduces that baseline so that the exact
solver (``poly.mixture.exact.fit_mixture``) can be compared with it at equal wall time.

The coefficients are the raw-coordinate tensors ``T0 [d_out]``, ``T1 [d_out, d_in]``, ``T2 [d_out, d_in, d_in]``
of ``p(x) = T0 + T1 x + x^T T2 x``; each step draws a fresh batch from the mixture and takes one
schedule-free step (Defazio et al. 2024, ``schedulefree.SGDScheduleFree`` or ``AdamWScheduleFree``) on the
mean squared error. A fixed held-out mixture sample gives the FVU curve.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mlpinterp.gaussian.distributions import Gaussian, GaussianMixture
from mlpinterp.networks import Network, validate_network
from mlpinterp.poly.approximant import DensePolynomial
from mlpinterp.poly.ridge import fit_ridge
from mlpinterp.utils.progress import progress_bar

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
    import schedulefree
    import torch

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
    rng = np.random.default_rng(seed)
    init = fit_ridge(network, Gaussian.standard(network.d_in), degree)
    params = [torch.tensor(init.coefficients(k), device=dev, dtype=tdtype, requires_grad=True) for k in range(degree + 1)]
    if optimizer == "sgd":
        opt = schedulefree.SGDScheduleFree(params, lr=lr, momentum=momentum, warmup_steps=warmup_steps)
    else:
        opt = schedulefree.AdamWScheduleFree(params, lr=lr, warmup_steps=warmup_steps)

    X_eval = mixture.sample(n_eval, np.random.default_rng(seed + 1))
    f_eval = network(X_eval)
    Xe = torch.as_tensor(X_eval, device=dev, dtype=tdtype)
    fe = torch.as_tensor(f_eval, device=dev, dtype=torch.float64)
    var_e = float(((fe - fe.mean(0)) ** 2).sum())

    def evaluate() -> float:
        opt.eval()
        with torch.no_grad():
            pe = torch.cat([_poly_forward(params, Xe[s : s + 1024]) for s in range(0, n_eval, 1024)]).double()
        opt.train()
        return float(((fe - pe) ** 2).sum()) / var_e

    history: list[dict[str, Any]] = []
    opt.train()
    history.append({"step": 0, "wall_time_s": 0.0, "fvu": evaluate()})
    t_train = 0.0
    time_to_target = 0.0 if target_fvu is not None and history[0]["fvu"] <= target_fvu else None
    with progress_bar(total=steps, desc="hybrid SGD", quiet=not progress) as bar:
        step = 0
        while step < steps and time_to_target is None and (time_limit is None or t_train < time_limit):
            t0 = time.perf_counter()
            X = mixture.sample(batch_size, rng)
            y = torch.as_tensor(network(X), device=dev, dtype=tdtype)
            Xb = torch.as_tensor(X, device=dev, dtype=tdtype)
            opt.zero_grad(set_to_none=True)
            loss = ((_poly_forward(params, Xb) - y) ** 2).sum(1).mean()
            if not torch.isfinite(loss):
                raise ValueError(f"the hybrid SGD diverged at step {step} (non-finite loss {float(loss.detach())}); lower lr (got {lr})")
            loss.backward()
            opt.step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t_train += time.perf_counter() - t0
            step += 1
            bar.advance()
            last = step == steps or (time_limit is not None and t_train >= time_limit)
            if step % eval_every == 0 or last:
                fv = evaluate()
                history.append({"step": step, "wall_time_s": t_train, "fvu": fv})
                bar.postfix(fvu=fv)
                if target_fvu is not None and fv <= target_fvu:
                    time_to_target = t_train
    if history[-1]["step"] != step:
        history.append({"step": step, "wall_time_s": t_train, "fvu": evaluate()})
    if not np.isfinite(history[-1]["fvu"]):
        raise ValueError(f"the hybrid SGD diverged (non-finite held-out FVU after {step} steps); lower lr (got {lr})")
    opt.eval()
    tensors = tuple(p.detach().to("cpu", torch.float64).numpy().copy() for p in params)
    if degree == 2:
        T2 = tensors[2]
        tensors = (tensors[0], tensors[1], 0.5 * (T2 + np.swapaxes(T2, 1, 2)))
    info = {
        "network": type(network).__name__, "activation": network.activation,
        "distribution": f"GaussianMixture(K={mixture.K})", "method": "sgd-hybrid", "degree": degree,
        "d_in": network.d_in, "optimizer": optimizer, "lr": lr, "batch_size": batch_size, "steps": step,
        "history": history, "time_to_target_s": time_to_target, "target_fvu": target_fvu,
        "n_eval": n_eval, "device": str(dev), "dtype": str(tdtype).replace("torch.", ""),
    }
    return DensePolynomial(tensors, info=info)
