"""Statistics shared by the parameter-space studies: the papers' Table 1 statistic and the failed-seed bar."""

from __future__ import annotations

import numpy as np

FAILED_MMCS = 0.99
"""A seed whose MMCS is below this counts as failed (the SPD reference's own seed sweep uses this bar)."""


def paper_statistic(per_seed: list[dict]) -> dict:
    """The papers' Table 1 statistic: one run (the best by MMCS of the first three seeds, as APD's reference kept
    the best of 3 instances), mean ± std over the target's features of the per-feature max cosine and L2 ratio."""
    first = per_seed[:3]
    best = max(first, key=lambda m: m["mmcs"])
    cos, ratio = np.asarray(best["max_cos"]), np.asarray(best["l2_ratio"])
    sd = lambda a: float(a.std(ddof=1)) if len(a) > 1 else None
    return {"seed": best["seed"], "of_seeds": len(first), "mmcs": float(cos.mean()), "mmcs_std_over_features": sd(cos),
            "ml2r": float(ratio.mean()), "ml2r_std_over_features": sd(ratio), "n_features": len(cos)}
