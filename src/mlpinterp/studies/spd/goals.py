"""The goals an SPD run is judged by: the failed-seed bar of TMS and the residual-MLP goal."""

from __future__ import annotations

DMLP_BAND = 0.2
"""W_out counts as "about d_mlp" subcomponents when it uses between (1 - this) and (1 + this) times d_mlp."""
COACTIVE = 0.25
"""W_out counts as one co-active group (not split per feature) when its used subcomponents are important, on
average, for this share of the one-hot inputs or more. The paper's text says they "always co-activate"; its Fig. 8
(beta = 1e-5, "BEST"), read off the figure cell by cell, has 50 used subcomponents each important for 42-72 % of the
features (mean 0.51), none for all; a per-feature split (its beta too high) is near 1 / n_features."""


def resid_goal(m: dict, n_features: int) -> bool:
    """The residual-MLP goal on one seed's metrics ``m`` (from :func:`evaluate`): on every W_in site each of
    the ``n_features`` features has exactly one important subcomponent, the owners are distinct and important for
    their feature alone; the W_out sites together use ``d_mlp`` (± ``DMLP_BAND``) subcomponents with co-activity
    ``>= COACTIVE`` each (one group, as the paper's Fig. 8); anti-scrubbed MSE ``>= 3`` × scrubbed MSE."""
    w_in = all(v == n_features for v in m["features_with_one_subcomponent"].values()) and all(
        v == n_features for v in m["features_one_distinct"].values()) and m["features_monosemantic"] == n_features
    outs = m["mlp_out_one_hot"].values()
    used = sum(v["used"] for v in outs)
    w_out = abs(used - m["d_mlp"]) <= DMLP_BAND * m["d_mlp"] and all(v["fraction"] >= COACTIVE for v in outs)
    return bool(w_in and w_out and m["anti_scrubbed_mse"] >= 3 * m["scrubbed_mse"])

