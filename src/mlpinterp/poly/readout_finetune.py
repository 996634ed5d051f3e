"""The paper's remedy for non-Gaussian inputs: start from the closed form, fine-tune on real activations.

Rigg & Belrose (2025, arXiv 2502.01032, Limitations and §4) initialise at the closed-form approximant and
fine-tune it on data. Here the fine-tuning runs in the factored ridge parameterisation
(:mod:`mlpinterp.poly.readout`), so degrees 2 and 3 stay tractable at d_in = 384..4096: every parameter moves,
including the neuron directions ``A`` (and the GLU gate-residual directions ``G``), which the exact data projection
(:mod:`mlpinterp.poly.projection`) keeps fixed. The loop is the one hybrid fine-tune of
:mod:`mlpinterp.poly.finetune` (schedule-free AdamW by default, Defazio et al. 2024) on the mean squared error
normalised by the output variance (the FVU), float32, seeded batches of the captured fit activations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from mlpinterp.networks import GLU, MLP, Network
from mlpinterp.poly.finetune import ArrayBatches, Validation
from mlpinterp.poly.finetune import finetune as finetune_loop
from mlpinterp.poly.finetune_config import FinetuneConfig
from mlpinterp.poly.readout import Readout, RidgeBasis
from mlpinterp.utils.validation import check_instance, check_shape, to_numpy


class ReadoutModule(nn.Module):
    """A :class:`Readout` with every factor trainable: ``[batch, d_in] -> [batch, d_out]`` (float32)."""

    def __init__(self, ro: Readout, dtype: torch.dtype = torch.float32):
        super().__init__()
        bs = ro.basis
        t = lambda a: torch.tensor(np.asarray(a), dtype=dtype)  # noqa: E731
        self.register_buffer("center", t(bs.center))
        self.register_buffer("white", t(bs.white))
        self.A = nn.Parameter(t(bs.A))
        self.G = nn.Parameter(t(bs.G)) if bs.gated else None
        self.b, self.L, self.R = nn.Parameter(t(ro.b)), nn.Parameter(t(ro.L)), nn.Parameter(t(ro.R))
        self.S = nn.Parameter(t(ro.S)) if ro.S is not None else None
        self.degree = ro.degree

    def forward(self, x: Tensor) -> Tensor:
        xc = x.to(self.center.dtype) - self.center
        out = self.b + (xc @ self.white) @ self.L.T
        if self.degree >= 2:
            z = xc @ self.A.T
            hs = [torch.ones_like(z), z]
            for k in range(1, self.degree):
                hs.append(z * hs[k] - k * hs[k - 1])
            eps = xc @ self.G.T if self.G is not None else None
            for t in range(2, self.degree + 1):
                out = out + hs[t] @ self.R[t - 2].T
                if eps is not None:
                    out = out + (eps * hs[t - 1]) @ self.S[t - 2].T
        return out

    def to_readout(self, basis: RidgeBasis) -> Readout:
        """The trained factors as a float64 :class:`Readout` (its basis carries the trained directions)."""
        a = lambda p: p.detach().to(torch.float64).cpu().numpy().copy()  # noqa: E731
        new_basis = RidgeBasis(center=basis.center, A=a(self.A), G=a(self.G) if self.G is not None else None,
                               white=basis.white)
        return Readout(new_basis, a(self.b), a(self.L), a(self.R), a(self.S) if self.S is not None else None)


@dataclass
class HybridResult:
    """A fine-tuned readout and its training record.

    With validation samples the returned ``readout`` is the one of the validated step with the lowest validation
    FVU (``best_step``; the start, step 0, included, so fine-tuning never returns something worse on them than the
    closed form it started from); ``last_readout`` is the final step's. Without them both are the final step's.
    """

    readout: Readout
    history: list[dict] = field(default_factory=list)
    """``{"step", "seconds", "fvu_val"}`` entries (validation FVU on held-back fit activations; ``seconds``: training
    time so far, validation excluded)."""

    seconds: float = 0.0
    last_readout: Readout | None = None
    """The readout after the last step (the same object as ``readout`` without validation samples)."""
    best_step: int | None = None
    """Step of ``readout`` (None without validation samples)."""

    def summary(self) -> dict:
        """``{"best_step", "best_fvu_val", "last_step", "last_fvu_val"}`` from the history (None entries without it)."""
        if not self.history:
            return {"best_step": None, "best_fvu_val": None, "last_step": None, "last_fvu_val": None}
        best = next(h for h in self.history if h["step"] == self.best_step)
        return {"best_step": self.best_step, "best_fvu_val": best["fvu_val"], "last_step": self.history[-1]["step"],
                "last_fvu_val": self.history[-1]["fvu_val"]}


def finetune(network: Network, start: Readout, X_fit, cfg: FinetuneConfig = FinetuneConfig(), *, X_val=None,
             quiet: bool = True, desc: str = "hybrid fine-tune") -> HybridResult:
    """Fine-tune every factor of ``start`` (e.g. ``Readout.from_closed_form(gaussian_fit, basis)``) on ``X_fit``.

    The loop is :func:`mlpinterp.poly.finetune.finetune` with :class:`~mlpinterp.poly.finetune.ArrayBatches` of
    ``X_fit`` and the loss divided by the variance of the fit targets (the training FVU).

    Parameters
    ----------
    network : the block (targets ``f(x)`` are computed once, in float64, then cast to float32).
    start : the initial member of the ridge family.
    X_fit : ``[m, d_in]`` fit activations (numpy or torch).
    X_val : optional ``[m', d_in]`` activations for the validation FVU in the history (not used for training);
        with them the returned readout is the best validated step's (:class:`HybridResult`).

    Raises ``TypeError`` for a ``network`` / ``start`` / ``cfg`` of the wrong kind, ``ValueError`` when ``start``
    does not fit ``network`` (other d_in / d_out), for ``X_fit`` / ``X_val`` that are non-numeric (complex
    included), non-finite, not ``[m >= 2, d_in]`` or on which the block's output does not vary, and for a
    diverging (non-finite) loss.
    """
    check_instance(network, (MLP, GLU), "network")
    check_instance(start, Readout, "start", "Readout (e.g. Readout.from_closed_form(p, basis))")
    check_instance(cfg, FinetuneConfig, "cfg")
    if start.basis.d_in != network.d_in or start.b.shape[0] != network.d_out:
        raise ValueError(f"start maps d_in={start.basis.d_in} -> d_out={start.b.shape[0]}, but network is "
                         f"{type(network).__name__}(d_in={network.d_in}, d_out={network.d_out}): start from this "
                         "block's closed form")

    def targets(X, name):
        X = check_shape(to_numpy(X, name), name, (None, network.d_in)).astype(np.float32)  # trained in float32
        Y = network(X.astype(np.float64))
        if X.shape[0] < 2 or not float(((Y - Y.mean(0)) ** 2).sum()) > 1e-10 * float((Y**2).sum()):
            raise ValueError(f"{name} must hold >= 2 inputs on which the block's output varies (the FVU divides by "
                             f"its variance), got {X.shape[0]} input(s)")
        return torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(Y)

    X, Y64 = targets(X_fit, "X_fit")
    Y = Y64.to(torch.float32)
    var = float(((Y - Y.mean(0)) ** 2).sum(1).mean())
    validation = Validation(*targets(X_val, "X_val")) if X_val is not None else None
    module = ReadoutModule(start)
    t0 = time.perf_counter()
    run = finetune_loop(module, ArrayBatches(X, Y, cfg.batch_size, cfg.seed), cfg, validation=validation,
                        loss_scale=var, keep_best=validation is not None, what="hybrid fine-tuning", desc=desc,
                        quiet=quiet)
    seconds = time.perf_counter() - t0
    history = [{"step": h["step"], "seconds": h["seconds"], "fvu_val": h["fvu"]} for h in run.history]
    last = module.to_readout(start.basis)
    if validation is None:
        return HybridResult(last, history, seconds, last, None)
    module.load_state_dict(run.best_state)
    return HybridResult(module.to_readout(start.basis), history, seconds, last, run.best_step)
