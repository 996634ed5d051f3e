"""The Mutual Feature Regularization penalty (Marks et al. 2024, eq. 2): one minus the Hungarian-matched mean
max cosine similarity between SAE decoder dictionaries, averaged over pairs."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from mlpinterp.sae.metrics import cosine_matrix


def pair_dissimilarity(a: Tensor, b: Tensor, assignment: tuple[np.ndarray, np.ndarray] | None = None,
                       matching: Literal["hungarian", "max"] = "hungarian") -> tuple[Tensor, tuple]:
    """``1 - MMCS(a, b)`` for dictionaries ``[d_sae, d_in]`` and the assignment used (reusable later).

    With ``assignment`` given, the matching is not recomputed (gradients still flow through the cosines).
    """
    c = cosine_matrix(a, b)
    if matching == "max":
        return 1 - c.max(dim=1).values.mean(), None
    if matching != "hungarian":
        raise ValueError(f"matching must be 'hungarian' or 'max', got {matching!r}")
    if assignment is None:
        assignment = linear_sum_assignment(c.detach().cpu().double().numpy(), maximize=True)
    rows, cols = assignment
    return 1 - c[torch.as_tensor(rows), torch.as_tensor(cols)].mean(), assignment


def mfr_penalty(decoders: list[Tensor], matching: Literal["hungarian", "max"] = "hungarian") -> Tensor:
    """Unscaled MFR penalty ``1 / C(N, 2) * sum_{i<j} (1 - MMCS(W_i, W_j))`` (Marks et al. 2024, eq. 2).

    ``decoders``: ``N >= 2`` tensors ``[d_sae, d_in]``. Differentiable. Raises ``ValueError`` if ``N < 2``.
    """
    if len(decoders) < 2:
        raise ValueError(f"decoders must hold at least 2 dictionaries, got {len(decoders)}")
    terms = [pair_dissimilarity(decoders[i], decoders[j], matching=matching)[0]
             for i in range(len(decoders)) for j in range(i + 1, len(decoders))]
    return torch.stack(terms).mean()
