"""Evaluation of APD decompositions (Braun et al. 2025, Secs. 3.1-3.2).

- :func:`activation_frequency`: how often each component is selected (dead components have frequency 0);
- :func:`per_feature_mse`: sparse-forward MSE on inputs with one active feature, per feature;
- :func:`responsible_components` and :func:`scrubbing`: the causal-scrubbing / anti-scrubbing experiment.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from mlpinterp.apd.attributions import attributions
from mlpinterp.apd.masks import topk_mask
from mlpinterp.paramspace.components import Components
from mlpinterp.paramspace.forward import run_with_components
from mlpinterp.paramspace.metrics import ScrubbingResult, scrub_keep_masks
from mlpinterp.utils.validation import check_batch_tensor, to_numpy


def _pos_int(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise (ValueError if isinstance(v, numbers.Integral) and not isinstance(v, bool) else TypeError)(
            f"{name} must be a positive int, got {type(v).__name__} {v!r}")
    return int(v)


def _check_x(model: nn.Module, x, name: str = "x") -> torch.Tensor:
    """``x`` must be a finite floating-point tensor ``[batch >= 1, ...]`` that ``model`` accepts (tried on one row)."""
    return check_batch_tensor(x, name, model)


@torch.no_grad()
def activation_frequency(model: nn.Module, comps: Components, batches, mask_fn: Callable[[torch.Tensor], torch.Tensor],
                         source: str = "target") -> np.ndarray:
    """``[C]`` fraction of samples on which each component is selected by ``mask_fn(attributions)``.

    ``batches``: an iterable of (at least one) input batches ``[batch, ...]``; ``mask_fn`` maps ``[batch, C]``
    attributions to a ``[batch, C]`` mask.
    """
    if not callable(mask_fn):
        raise TypeError(f"mask_fn must be callable ([batch, C] attributions -> [batch, C] mask), got {type(mask_fn).__name__}")
    if isinstance(batches, torch.Tensor):
        raise TypeError("batches must be an iterable of [batch, ...] tensors (e.g. a list), got a single tensor; "
                        "wrap it in a list")
    counts, n = torch.zeros(comps.C), 0
    for i, x in enumerate(batches):
        _check_x(model, x, f"batches[{i}]")
        mask = mask_fn(attributions(model, comps, x, source))
        if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (x.shape[0], comps.C):
            got = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"mask_fn must return a [batch={x.shape[0]}, C={comps.C}] mask, got {got}")
        counts += mask.float().sum(0)
        n += x.shape[0]
    if n == 0:
        raise ValueError("batches is empty: need at least one sample to compute activation frequencies")
    return (counts / n).numpy()


@torch.no_grad()
def per_feature_mse(model: nn.Module, comps: Components, n_features: int, value_range=(-1.0, 1.0),
                    n_per_feature: int = 200, k: int = 1, source: str = "target", seed: int = 0) -> np.ndarray:
    """``[n_features]``: MSE between the per-sample top-``k`` sparse forward and the target on inputs whose only
    active feature is ``i`` (value ``U(value_range)``)."""
    n_features = _pos_int(n_features, "n_features")
    n_per_feature = _pos_int(n_per_feature, "n_per_feature")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError) as e:
        raise TypeError(f"value_range must be two real numbers (low, high), got {value_range!r}") from e
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"value_range must be finite with low < high, got {value_range!r}")
    _check_x(model, torch.zeros(1, n_features), f"inputs with n_features={n_features}")
    g = torch.Generator().manual_seed(seed)
    out = np.zeros(n_features)
    for i in range(n_features):
        x = torch.zeros(n_per_feature, n_features)
        x[:, i] = torch.rand(n_per_feature, generator=g) * (hi - lo) + lo
        mask = topk_mask(attributions(model, comps, x, source), k)
        y = run_with_components(model, comps, x, mask.float())
        out[i] = float(((y - model(x)) ** 2).mean())
    return out


@torch.no_grad()
def responsible_components(model: nn.Module, comps: Components, n_features: int, value: float = 1.0,
                           source: str = "target") -> np.ndarray:
    """``[n_features]``: the component with the largest attribution on the one-hot input ``value * e_i``."""
    n_features = _pos_int(n_features, "n_features")
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value == 0:
        raise ValueError(f"value must be a finite non-zero real number, got {value!r}")
    x = _check_x(model, torch.eye(n_features) * float(value), f"one-hot inputs with n_features={n_features}")
    return attributions(model, comps, x, source).argmax(dim=1).numpy()


@torch.no_grad()
def scrubbing(model: nn.Module, comps: Components, x: torch.Tensor, responsible: np.ndarray,
              topk_fn: Callable[[torch.Tensor], torch.Tensor], seed: int = 0,
              source: str = "target") -> ScrubbingResult:
    """Causal scrubbing (paper Sec. 3.2): ablate ``C // 2`` components per sample.

    *Scrubbed*: the ablated half is drawn among the components not responsible for the sample's active features.
    *Anti-scrubbed*: the responsible components are ablated, the rest of the half drawn at random from the others.
    ``x``: ``[n, n_features]`` (samples should have at least one active feature); ``responsible``: ``[n_features]``.
    """
    _check_x(model, x)
    if x.ndim != 2:
        raise ValueError(f"x must have shape [n, n_features], got {list(x.shape)}")
    if not callable(topk_fn):
        raise TypeError(f"topk_fn must be callable, got {type(topk_fn).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    C = comps.C
    resp = np.asarray(responsible)
    if resp.dtype.kind not in "iuf" or resp.shape != (x.shape[1],):
        raise ValueError(f"responsible must be an integer array [n_features={x.shape[1]}] of component indices, "
                         f"got dtype {resp.dtype} shape {list(resp.shape)}")
    if resp.dtype.kind == "f" and not np.all(np.isfinite(resp) & (resp == np.round(resp))):
        raise ValueError("responsible must hold integer component indices, got non-integer values")
    if resp.size and (resp.min() < 0 or resp.max() >= C):
        raise ValueError(f"responsible must hold component indices in [0, C={C}), got values in "
                         f"[{resp.min():g}, {resp.max():g}]")
    resp = resp.astype(np.int64)
    rng = np.random.default_rng(seed)
    target = model(x)
    mse = lambda y: ((y - target) ** 2).mean(dim=tuple(range(1, y.ndim))).numpy()
    topk_out = run_with_components(model, comps, x, topk_fn(attributions(model, comps, x, source)).float())
    keep_s, keep_a = scrub_keep_masks(to_numpy(x, "x") != 0, [resp[i:i + 1] for i in range(len(resp))], C, rng)
    return ScrubbingResult(mse(topk_out), mse(run_with_components(model, comps, x, keep_s)),
                           mse(run_with_components(model, comps, x, keep_a)))
