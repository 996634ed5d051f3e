"""Synthetic activations with known features (Marks et al. 2024, sec. 4.1; after Sharkey et al. 2022).

``G`` unit-norm ground-truth features in ``d`` dimensions (i.i.d. Gaussian directions, normalised) are split
into ``E`` contiguous groups (``numpy.array_split``: sizes differ by at most one when ``E`` does not divide
``G``, e.g. 512 / 12 -> eight groups of 43 and four of 42). For **every sample independently**:

1. a group ``e`` is drawn uniformly from the ``E`` groups;
2. ``K`` distinct features of that group are drawn *without replacement*, feature ``j`` (position within the
   group, 0-based) with weight ``lambda**j`` (successive sampling, implemented exactly with the Gumbel-top-K
   trick of Efraimidis & Spirakis 2006 / Kool et al. 2019);
3. their coefficients are i.i.d. ``U(0, 1)``; the sample is ``x = sum_i c_i f_i``.

Batches are a pure function of ``(seed, batch_index)``, so a stream of 100 M samples is never materialised,
runs resume at any batch, and two processes agree on the data without communicating.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from mlpinterp.utils.seeding import torch_generator
from mlpinterp.utils.validation import Int, check_fields


@dataclass(frozen=True)
class SyntheticConfig:
    """Generator of synthetic activations with grouped ground-truth features."""

    n_features: int = 512
    """G: number of ground-truth features."""

    d: int = 256
    """Dimension of the activations."""

    n_groups: int = 12
    """E: number of feature groups (each sample uses one group)."""

    decay: float = 0.99
    """lambda: within-group sampling weight of the j-th feature is ``decay**j``."""

    k_active: int = 12
    """K: active features per sample (drawn without replacement within the group)."""

    seed: int = 0
    """Seed of the features and of the data stream."""

    def __post_init__(self) -> None:
        check_fields(self, {("n_features", "d", "n_groups", "k_active"): Int(1, what="a positive int")})
        if self.n_groups > self.n_features:
            raise ValueError(f"n_groups must be <= n_features, got {self.n_groups} > {self.n_features}")
        smallest = self.n_features // self.n_groups
        if self.k_active > smallest:
            raise ValueError(f"k_active must be <= the smallest group size {smallest} "
                             f"(n_features // n_groups), got {self.k_active}")
        if isinstance(self.decay, bool) or not isinstance(self.decay, (int, float)):
            raise TypeError(f"decay must be a real number in (0, 1], got {type(self.decay).__name__} {self.decay!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__} {self.seed!r}")
        if not (0.0 < float(self.decay) <= 1.0):
            raise ValueError(f"decay must be in (0, 1], got {self.decay!r}")


class SyntheticBatch(NamedTuple):
    """One batch of synthetic data and its ground truth."""

    x: Tensor
    """Activations ``[batch, d]``."""

    group: Tensor
    """Group of each sample, int64 ``[batch]``."""

    indices: Tensor
    """Global indices of the active features, int64 ``[batch, K]``."""

    coefs: Tensor
    """Their coefficients ``[batch, K]`` in (0, 1)."""


class SyntheticData:
    """Streamed, seeded synthetic data (see the module docstring).

    Attributes
    ----------
    features : Tensor ``[G, d]``
        Unit-norm ground-truth features (rows), float32.
    group_of : Tensor ``[G]``
        Group index of each feature.
    """

    def __init__(self, cfg: SyntheticConfig):
        if not isinstance(cfg, SyntheticConfig):
            raise TypeError(f"cfg must be a SyntheticConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        g = torch_generator(cfg.seed, "synthetic-features")
        f = torch.randn(cfg.n_features, cfg.d, generator=g, dtype=torch.float64)
        self.features = (f / f.norm(dim=1, keepdim=True)).float()
        splits = np.array_split(np.arange(cfg.n_features), cfg.n_groups)
        self.group_sizes = torch.tensor([len(s) for s in splits])
        self.group_start = torch.tensor([int(s[0]) for s in splits])
        self.group_of = torch.repeat_interleave(torch.arange(cfg.n_groups), self.group_sizes)
        width = int(self.group_sizes.max())
        j = torch.arange(width, dtype=torch.float64)
        logw = j * np.log(cfg.decay) if cfg.decay < 1 else torch.zeros(width, dtype=torch.float64)
        # [E, width]: log weight of position j in group e, -inf beyond the group's size
        self._logw = torch.where(j[None, :] < self.group_sizes[:, None], logw[None, :], -torch.inf)

    def within_group_probs(self, group: int) -> np.ndarray:
        """Normalised single-draw probabilities ``lambda**j / sum`` of the features of ``group``."""
        if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < self.cfg.n_groups:
            raise ValueError(f"group must be an int in [0, n_groups={self.cfg.n_groups}), got {group!r}")
        n = int(self.group_sizes[group])
        w = float(self.cfg.decay) ** np.arange(n)
        return w / w.sum()

    def batch(self, index: int, batch_size: int) -> SyntheticBatch:
        """The ``index``-th batch of the stream (pure function of ``(cfg.seed, index, batch_size)``)."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"index must be a non-negative int, got {index!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        g = torch_generator(self.cfg.seed, "synthetic-batch", index)
        group = torch.randint(self.cfg.n_groups, (batch_size,), generator=g)
        u = torch.rand(batch_size, self._logw.shape[1], generator=g, dtype=torch.float64)
        gumbel = -torch.log(-torch.log(u.clamp_min(1e-300)))
        pos = (self._logw[group] + gumbel).topk(self.cfg.k_active, dim=1).indices
        indices = self.group_start[group][:, None] + pos
        coefs = torch.rand(batch_size, self.cfg.k_active, generator=g)
        x = torch.einsum("bk,bkd->bd", coefs, self.features[indices])
        return SyntheticBatch(x, group, indices, coefs)

    def stream(self, batch_size: int, n_batches: int | None = None, start: int = 0) -> Iterator[Tensor]:
        """Yield activation batches ``[batch_size, d]`` number ``start, start + 1, ...`` (forever if
        ``n_batches`` is None)."""
        if n_batches is not None and (isinstance(n_batches, bool) or not isinstance(n_batches, int) or n_batches < 0):
            raise ValueError(f"n_batches must be a non-negative int or None, got {n_batches!r}")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"start must be a non-negative int, got {start!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        i = start
        while n_batches is None or i < start + n_batches:
            yield self.batch(i, batch_size).x
            i += 1
