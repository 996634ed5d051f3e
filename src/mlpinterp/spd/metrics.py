"""Evaluation of SPD decompositions (Bushnaq, Braun, Sharkey 2025, Secs. 3.1-3.3).

- causal importances on a batch or on one-hot inputs (the causal-importance-per-feature plots);
- alive subcomponents: causal importance above a threshold (0.1, as in the reference) on some input;
- subcomponents per feature: how many subcomponents of a site are causally important for a one-hot input (of
  value :data:`ONE_HOT_VALUE` = 0.75, the paper's);
- the reference implementation's target-pattern errors on the one-hot importances: identity (one subcomponent per
  feature, after the best matching) and dense (``k`` always-active subcomponents);
- the CI-masked forward (masks = causal importances, ``r = 0``): the worst case of the stochastic masks;
- scrubbing / anti-scrubbing (APD paper Sec. 3.2) with the responsible subcomponents of the chosen sites, via the shared
  :func:`mlpinterp.paramspace.scrub_keep_masks`.

MMCS / ML2R are the shared :func:`mlpinterp.paramspace.mmcs_ml2r` / :func:`mlpinterp.paramspace.column_match` on
``decomposition.components.weights()[site]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from mlpinterp.paramspace.forward import run_with_components
from mlpinterp.paramspace.metrics import ScrubbingResult, scrub_keep_masks
from mlpinterp.spd.decomposition import Decomposition
from mlpinterp.utils.validation import check_batch_tensor, check_int, check_real

ALIVE_THRESHOLD = 0.1
"""Causal importance above which a subcomponent counts as used (the reference implementation's ``ci_alive_threshold``)."""

ONE_HOT_VALUE = 0.75
"""Value of the active feature in the one-hot inputs of the causal-importance-per-feature analyses (SPD paper,
Figs. 8, 12, 13: ``x_i = 0.75``; the reference's ``input_magnitude``)."""


@torch.no_grad()
def causal_importances(model: nn.Module, dec: Decomposition, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{site: [batch, C]}`` causal importances on ``x``, clipped to ``[0, 1]`` (the hard sigmoid without leak)."""
    check_batch_tensor(x, "x", model)
    _, acts = dec.target_forward(model, x)
    return {k: g.clamp(0, 1) for k, g in dec.causal_importance(acts)[0].items()}


def one_hot_importances(model: nn.Module, dec: Decomposition, n_features: int,
                        value: float = 1.0) -> dict[str, torch.Tensor]:
    """``{site: [n_features, C]}``: causal importances on the inputs ``value * e_i`` (one active feature each)."""
    n_features = check_int(n_features, "n_features")
    value = check_real(value, "value")
    p = next(dec.parameters())
    return causal_importances(model, dec, torch.eye(n_features, dtype=p.dtype) * value)


def alive_subcomponents(ci: dict[str, torch.Tensor], threshold: float = ALIVE_THRESHOLD) -> dict[str, np.ndarray]:
    """``{site: [C] bool}``: causal importance ``> threshold`` on at least one of the rows of ``ci[site]``."""
    threshold = check_real(threshold, "threshold", 0.0, 1.0)
    return {k: (g > threshold).any(0).cpu().numpy() for k, g in ci.items()}


def subcomponents_per_feature(ci_one_hot: dict[str, torch.Tensor],
                              threshold: float = ALIVE_THRESHOLD) -> dict[str, np.ndarray]:
    """``{site: [n_features] int}``: subcomponents with causal importance ``> threshold`` for each one-hot input."""
    threshold = check_real(threshold, "threshold", 0.0, 1.0)
    return {k: (g > threshold).sum(1).cpu().numpy() for k, g in ci_one_hot.items()}


def identity_ci_error(ci_one_hot: torch.Tensor, tolerance: float = ALIVE_THRESHOLD) -> int:
    """Entries of ``ci_one_hot`` (``[n_features, C]``, ``C >= n_features``) that break the identity pattern, after the
    assignment of one distinct subcomponent to each feature that maximises their summed importance (Hungarian):
    off-assignment entries ``> tolerance`` plus assigned entries ``< 1 - tolerance``. ``0`` iff every feature has
    exactly one subcomponent important for it, important for no other feature, with importance ``>= 1 - tolerance``.
    The reference implementation's ``IdentityCIPattern`` distance (its ``IdentityCIError`` metric).

    Raises ``ValueError`` unless ``ci_one_hot`` is 2-D with at least as many columns as rows."""
    tolerance = check_real(tolerance, "tolerance", 0.0, 1.0)
    g = ci_one_hot.detach().cpu().numpy() if isinstance(ci_one_hot, torch.Tensor) else np.asarray(ci_one_hot)
    if g.ndim != 2 or g.shape[1] < g.shape[0]:
        raise ValueError(f"ci_one_hot must be [n_features, C] with C >= n_features, got shape {list(g.shape)}")
    rows, cols = linear_sum_assignment(-g)
    on = np.zeros(g.shape, bool)
    on[rows, cols] = True
    return int((g[~on] > tolerance).sum() + (g[on] < 1 - tolerance).sum())


def dense_ci_error(ci_one_hot: torch.Tensor, k: int, tolerance: float = ALIVE_THRESHOLD) -> int:
    """Distance of ``ci_one_hot`` (``[n_features, C]``) from ``k`` dense subcomponents and no others: with the
    columns ordered by total importance, the first ``k`` columns without any entry ``>= 1 - tolerance`` plus the
    entries ``> tolerance`` of the other columns (the reference implementation's ``DenseCIPattern``, one strong entry
    per column; it does not ask the ``k`` columns to be important on every input: :func:`coactivity` does).

    Raises ``ValueError`` unless ``ci_one_hot`` is 2-D with at least ``k >= 1`` columns."""
    k = check_int(k, "k")
    tolerance = check_real(tolerance, "tolerance", 0.0, 1.0)
    g = ci_one_hot.detach().cpu().numpy() if isinstance(ci_one_hot, torch.Tensor) else np.asarray(ci_one_hot)
    if g.ndim != 2 or g.shape[1] < k:
        raise ValueError(f"ci_one_hot must be [n_features, C] with C >= k = {k}, got shape {list(g.shape)}")
    g = g[:, np.argsort(-g.sum(0), kind="stable")]
    return int((~(g[:, :k] >= 1 - tolerance).any(0)).sum() + (g[:, k:] > tolerance).sum())


def coactivity(ci_one_hot: torch.Tensor, threshold: float = ALIVE_THRESHOLD) -> dict[str, float | int]:
    """How far a site's subcomponents act as one always-active group on the one-hot inputs (``[n_features, C]``):
    ``used`` (subcomponents important for some feature), ``always`` (important for every feature), ``fraction``
    (mean over the used subcomponents of the share of features they are important for; 1 = always co-active;
    ``nan`` if none is used)."""
    threshold = check_real(threshold, "threshold", 0.0, 1.0)
    on = (ci_one_hot > threshold).cpu()
    used = on.any(0)
    return {"used": int(used.sum()), "always": int(on.all(0).sum()),
            "fraction": float(on[:, used].float().mean()) if used.any() else float("nan")}


def responsible_sets(ci_one_hot: torch.Tensor, threshold: float = ALIVE_THRESHOLD) -> list[np.ndarray]:
    """Per feature ``i``, the subcomponents with causal importance ``> threshold`` on ``e_i`` (``ci_one_hot``:
    ``[n_features, C]``)."""
    return [np.flatnonzero(row.cpu().numpy() > threshold) for row in ci_one_hot]


@torch.no_grad()
def masked_output_mse(model: nn.Module, dec: Decomposition, x: torch.Tensor) -> dict[str, float]:
    """MSE to the target output of the CI-masked forward (masks = causal importances), of the all-ones forward (the
    sum of the subcomponents) and of the forward with random masks ``U(g, 1)`` (one draw, seed 0)."""
    check_batch_tensor(x, "x", model)
    target, acts = dec.target_forward(model, x)
    g = dec.causal_importance(acts)[0]
    comps = dec.components
    gen = torch.Generator(device=x.device).manual_seed(0)
    rnd = {k: v + (1 - v) * torch.rand(v.shape, generator=gen, dtype=v.dtype, device=v.device) for k, v in g.items()}
    mse = lambda y: float(((y - target) ** 2).mean())
    return {"ci_masked_mse": mse(run_with_components(model, comps, x, g)),
            "all_ones_mse": mse(run_with_components(model, comps, x)),
            "stochastic_masked_mse": mse(run_with_components(model, comps, x, rnd))}


@torch.no_grad()
def scrubbing(model: nn.Module, dec: Decomposition, x: torch.Tensor, responsible: dict[str, Sequence[np.ndarray]],
              seed: int = 0) -> ScrubbingResult:
    """Scrubbing with SPD subcomponents (APD paper Sec. 3.2).

    ``responsible[site][i]``: subcomponents of ``site`` responsible for feature ``i`` (e.g. :func:`responsible_sets`).
    On every listed site ``C // 2`` subcomponents are ablated per sample: among those responsible for none of the
    sample's features (*scrubbed*) or the responsible ones first (*anti-scrubbed*); unlisted sites keep all their
    subcomponents. The first field of the result (``topk``) is the CI-masked forward's MSE. ``x``: ``[n, n_features]``.
    """
    check_batch_tensor(x, "x", model)
    if not isinstance(responsible, dict) or not responsible:
        raise ValueError("responsible must be a non-empty dict site -> per-feature subcomponent sets")
    names = [s.name for s in dec.sites]
    unknown = sorted(set(responsible) - set(names))
    if unknown:
        raise ValueError(f"responsible names unknown sites {unknown}; sites: {names}")
    rng = np.random.default_rng(seed)
    target, acts = dec.target_forward(model, x)
    g = dec.causal_importance(acts)[0]
    comps = dec.components
    active = (x != 0).cpu().numpy()
    keep_s, keep_a = {}, {}
    for site, sets in responsible.items():
        if len(sets) != x.shape[1]:
            raise ValueError(f"responsible[{site!r}] must have one entry per feature ({x.shape[1]}), got {len(sets)}")
        ks, ka = scrub_keep_masks(active, sets, comps.C, rng)
        keep_s[site], keep_a[site] = ks.to(x), ka.to(x)
    mse = lambda y: ((y - target) ** 2).mean(dim=tuple(range(1, y.ndim))).cpu().numpy()
    return ScrubbingResult(mse(run_with_components(model, comps, x, g)), mse(run_with_components(model, comps, x, keep_s)),
                           mse(run_with_components(model, comps, x, keep_a)))
