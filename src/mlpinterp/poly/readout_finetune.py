"""The paper's remedy for non-Gaussian inputs: start from the closed form, fine-tune on real activations.

Rigg & Belrose (2025, arXiv 2502.01032, Limitations and §4) initialise at the closed-form approximant and
fine-tune it on data. Here the fine-tuning runs in the factored ridge parameterisation
(:mod:`mlpinterp.poly.readout`), so degrees 2 and 3 stay tractable at d_in = 384..4096: every parameter moves,
including the neuron directions ``A`` (and the GLU gate-residual directions ``G``), which the exact data projection
(:mod:`mlpinterp.poly.projection`) keeps fixed. Optimiser: schedule-free AdamW (Defazio et al. 2024,
``schedulefree.AdamWScheduleFree``) on the mean squared error normalised by the output variance (the FVU),
float32, seeded batches of the captured fit activations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from mlpinterp.networks import GLU, MLP, Network
from mlpinterp.poly.finetune_config import HybridConfig
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
    """``{"step", "seconds", "fvu_val"}`` entries (validation FVU on held-back fit activations)."""

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


def finetune(network: Network, start: Readout, X_fit, cfg: HybridConfig = HybridConfig(), *, X_val=None,
             quiet: bool = True, desc: str = "hybrid fine-tune") -> HybridResult:
    """Fine-tune every factor of ``start`` (e.g. ``Readout.from_closed_form(gaussian_fit, basis)``) on ``X_fit``.

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
    import schedulefree

    from mlpinterp.utils.progress import progress_bar

    check_instance(network, (MLP, GLU), "network")
    check_instance(start, Readout, "start", "Readout (e.g. Readout.from_closed_form(p, basis))")
    check_instance(cfg, HybridConfig, "cfg")
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
        return torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(Y, dtype=torch.float32)

    X, Y = targets(X_fit, "X_fit")
    var = float(((Y - Y.mean(0)) ** 2).sum(1).mean())
    if X_val is not None:
        Xv, Yv = targets(X_val, "X_val")
        var_v = float(((Yv - Yv.mean(0)) ** 2).sum())
    module = ReadoutModule(start)
    opt = schedulefree.AdamWScheduleFree(module.parameters(), lr=cfg.lr, warmup_steps=cfg.warmup_steps)
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    best: dict = {}
    t0 = time.perf_counter()

    def validate(step: int) -> None:
        if X_val is None:
            return
        opt.eval()  # schedule-free: evaluation weights (the averaged iterate)
        with torch.no_grad():
            err = sum(float(((module(Xv[s:s + 8192]) - Yv[s:s + 8192]) ** 2).sum()) for s in range(0, Xv.shape[0], 8192))
            fvu_val = err / var_v
            if not best or fvu_val < best["fvu_val"]:
                best.update(step=step, fvu_val=fvu_val, readout=module.to_readout(start.basis))
        opt.train()
        history.append({"step": step, "seconds": time.perf_counter() - t0, "fvu_val": fvu_val})

    opt.train()
    validate(0)
    with progress_bar(total=cfg.steps, desc=desc, quiet=quiet) as bar:
        for step in range(1, cfg.steps + 1):
            idx = torch.randint(0, X.shape[0], (min(cfg.batch_size, X.shape[0]),), generator=gen)
            loss = ((module(X[idx]) - Y[idx]) ** 2).sum(1).mean() / var
            if not torch.isfinite(loss):
                raise ValueError(f"hybrid fine-tuning diverged at step {step} (loss {float(loss)}); lower lr (got {cfg.lr})")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % cfg.eval_every == 0 or step == cfg.steps:
                validate(step)
            bar.advance()
    opt.eval()
    last = module.to_readout(start.basis)
    if not best:
        return HybridResult(last, history, time.perf_counter() - t0, last, None)
    return HybridResult(best["readout"], history, time.perf_counter() - t0, last, best["step"])
