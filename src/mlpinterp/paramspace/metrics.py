"""Metrics shared by the parameter-space methods (Braun et al. 2025, Secs. 3.1-3.2; Bushnaq, Braun, Sharkey 2025,
Secs. 3.1-3.3).

- :func:`mmcs_ml2r` / :func:`column_match`: mean max cosine similarity and mean L2 ratio of target columns vs
  component columns;
- :class:`ScrubbingResult` and :func:`scrub_keep_masks`: the keep-masks and results of the causal-scrubbing /
  anti-scrubbing experiment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mlpinterp.utils.validation import check_shape, to_numpy


def mmcs_ml2r(W, P) -> tuple[float, float, np.ndarray]:
    """MMCS and ML2R (paper Sec. 3.1) between the columns of ``W`` and those of the components ``P``.

    ``W``: ``[d_out, n]`` (for TMS the ``[d_hidden, n_features]`` matrix, columns = features); ``P``:
    ``[C, d_out, n]``. For each column ``j``, ``mcs(j) = argmax_c cos(P[c, :, j], W[:, j])`` (a zero column has
    cosine 0); ``MMCS = mean_j max_c cos``, ``ML2R = mean_j ||P[mcs(j), :, j]|| / ||W[:, j]||``.
    Returns ``(mmcs, ml2r, mcs)`` with ``mcs``: ``[n]`` int.

    Raises
    ------
    ValueError
        On shape mismatch, non-finite values or a zero column of ``W``.
    """
    return column_match(W, P)[:3]


def column_match(W, P) -> tuple[float, float, np.ndarray, np.ndarray, np.ndarray]:
    """Per-column version of :func:`mmcs_ml2r`: ``(mmcs, ml2r, mcs, max_cos, l2_ratio)`` with ``max_cos`` and
    ``l2_ratio``: ``[n]`` (their means are MMCS and ML2R; their spread over columns is the "± std" of the APD and
    SPD papers' Table 1, which report one run)."""
    W = to_numpy(W, "W")
    P = to_numpy(P, "P")
    if W.ndim != 2:
        raise ValueError(f"W must have shape [d_out, n], got {list(W.shape)}")
    check_shape(P, "P", [None, W.shape[0], W.shape[1]])
    if min(W.shape) < 1 or P.shape[0] < 1:
        raise ValueError(f"W [d_out, n] and P [C, d_out, n] must be non-empty, got {list(W.shape)} and {list(P.shape)}")
    wn = np.linalg.norm(W, axis=0)
    if np.any(wn == 0):
        raise ValueError(f"W has zero columns {np.flatnonzero(wn == 0).tolist()}; MMCS is undefined there")
    pn = np.linalg.norm(P, axis=1)  # [C, n]
    dots = np.einsum("cdn,dn->cn", P, W)
    cos = np.where(pn > 0, dots / np.maximum(pn, 1e-300) / wn, 0.0)
    mcs = cos.argmax(axis=0)
    cols = np.arange(W.shape[1])
    best_cos, ratio = cos[mcs, cols], pn[mcs, cols] / wn
    return float(best_cos.mean()), float(ratio.mean()), mcs, best_cos, ratio


@dataclass(frozen=True)
class ScrubbingResult:
    """Per-sample MSEs to the target output (each ``[n_samples]``) and their means."""

    topk: np.ndarray
    scrubbed: np.ndarray
    anti_scrubbed: np.ndarray

    def summary(self) -> dict[str, float]:
        return {"topk_mse": float(self.topk.mean()), "scrubbed_mse": float(self.scrubbed.mean()),
                "anti_scrubbed_mse": float(self.anti_scrubbed.mean())}


def scrub_keep_masks(active: np.ndarray, responsible, C: int,
                     rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep-masks ``[n, C]`` (1 = kept, 0 = ablated) of the scrubbing experiment (paper Sec. 3.2), ``C // 2``
    ablated per sample.

    ``active``: ``[n, n_features]`` bool (which features each sample has); ``responsible[i]``: the component
    indices responsible for feature ``i`` (one for APD; a set of subcomponents for SPD). *Scrubbed*: the ablated
    half is drawn among the components responsible for none of the sample's features. *Anti-scrubbed*: the
    responsible ones are ablated and the rest of the half drawn from the others.
    """
    n = active.shape[0]
    half = C // 2
    responsible = [np.asarray(r, dtype=np.int64).reshape(-1) for r in responsible]
    keep_s = torch.ones(n, C)
    keep_a = torch.ones(n, C)
    for b in range(n):
        feats = np.flatnonzero(active[b])
        resp = np.unique(np.concatenate([responsible[i] for i in feats])) if len(feats) else np.zeros(0, np.int64)
        others = np.setdiff1d(np.arange(C), resp)
        keep_s[b, rng.choice(others, size=min(half, len(others)), replace=False)] = 0
        extra = rng.choice(others, size=min(len(others), max(0, half - len(resp))), replace=False)
        keep_a[b, np.concatenate([resp, extra]).astype(int)] = 0
    return keep_s, keep_a
