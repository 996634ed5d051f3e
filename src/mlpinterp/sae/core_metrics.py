"""SAEBench core metrics of a TopK SAE on activations, with SAEBench's definitions and JSON key names.

SAEBench (Karvonen et al. 2025, ``sae_bench/evals/core``, itself "from SAELens" ``evals.py``) groups its
scalar core metrics into categories; :func:`core_metrics` returns the same nested dict for the categories that
need only activations. Over ``N`` evaluated tokens ``x_t`` (original units, special tokens already dropped),
reconstructions ``x̂_t`` and latent activations ``z_t`` (``d_sae`` entries, zeros outside the top k):

* ``reconstruction_quality``:
  ``explained_variance = 1 - mean_t ||x_t - x̂_t||^2 / (mean_t ||x_t||^2 - ||mean_t x_t||^2)`` (the pooled,
  conventional R^2 of SAELens' ``ExplainedVarianceCalculator`` = 1 - FVU);
  ``mse = mean_t ||x_t - x̂_t||^2`` (summed over dimensions, mean over tokens, SAELens 6.x);
  ``cossim = mean_t cos(x_t, x̂_t)``.
* ``shrinkage``: ``l2_norm_in = mean_t ||x_t||``, ``l2_norm_out = mean_t ||x̂_t||``,
  ``l2_ratio = mean_t ||x̂_t|| / ||x_t||`` (a norm below 1e-4 counts as 1 in the denominator, as SAEBench),
  ``relative_reconstruction_bias = mean_t ||x̂_t||^2 / mean_t <x_t, x̂_t>`` (Rajamanoharan et al. 2024, eq. 10;
  pooled over all tokens, which is SAEBench's per-batch value when everything is one batch).
* ``sparsity``: ``l0 = mean_t #{j: z_tj != 0}``, ``l1 = mean_t sum_j |z_tj|``.
* ``misc_metrics``: with feature densities ``f_j = #{t: z_tj != 0} / N``: ``frac_alive = mean_j [f_j > 0]``,
  ``freq_over_1_percent = mean_j [f_j > 0.01]``, ``freq_over_10_percent = mean_j [f_j > 0.1]``,
  ``normalized_freq_over_{1,10}_percent = sum_{f_j > 0.01 (0.1)} f_j / sum_j f_j``,
  ``average_max_decoder_cosine_sim = mean_j max_{i != j} cos(W_dec[j], W_dec[i])`` and the same for the encoder
  rows (``average_max_encoder_cosine_sim``).
* ``token_stats``: ``total_tokens_eval_sparsity_variance = N``.

Deviations, both in SAEBench 0.6.0's own code and fixed in SAELens: its ``mse`` also divides by the number of
tokens in the batch (so it changes with the batch size), and its batched ``explained_variance`` subtracts
``(mean_d E[x_d^2])^2`` instead of ``||E[x]||^2`` from ``E||x||^2``; we use the definitions those lines intend
(and SAELens computes). For comparison with published SAEBench numbers, ``reconstruction_quality`` also holds
``explained_variance_saebench_literal = 1 - mean_t ||x_t - x̂_t||^2 / (mean_t ||x_t||^2 - (mean_{t,d} x_td^2)^2)``,
the value SAEBench 0.6.0's code computes (its per-batch means pooled over equal batches, as it concatenates them). The causal-LM metrics (``model_behavior_preservation``, ``model_performance_preservation``)
are :func:`mlpinterp.lm.recovery.kl_ce_scores`; :func:`mlpinterp.sae.evaluate.evaluate_sae` runs everything.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mlpinterp.sae.topk import TopKSae


def average_max_cosine_sim(rows: Tensor, chunk: int = 1024) -> float:
    """``mean_j max_{i != j} cos(rows_j, rows_i)`` for ``rows [n, d]`` (``n >= 2``), in chunks of ``chunk`` rows.

    Raises ``ValueError`` for fewer than two rows.
    """
    if rows.ndim != 2 or rows.shape[0] < 2:
        raise ValueError(f"rows must have shape [n >= 2, d], got {list(rows.shape)}")
    unit = torch.nn.functional.normalize(rows.detach().double(), dim=1)
    best = torch.empty(unit.shape[0], dtype=torch.float64)
    for s in range(0, unit.shape[0], chunk):
        sims = unit[s:s + chunk] @ unit.t()
        sims[torch.arange(sims.shape[0]), torch.arange(s, s + sims.shape[0])] = -math.inf
        best[s:s + chunk] = sims.max(dim=1).values
    return float(best.mean())


@torch.no_grad()
def core_metrics(sae: TopKSae, x: Tensor, *, batch_size: int = 4096) -> dict:
    """SAEBench core metrics (see the module docstring) of ``sae`` on activations ``x [N, d_in]``.

    ``x`` is in the original units of the hook point (the SAE applies its own ``input_scale``). Accumulates in
    float64 over batches of ``batch_size`` rows; the result does not depend on ``batch_size``.

    Raises ``ValueError``/``TypeError`` for a mis-shaped, non-float or non-finite ``x``, or fewer than 2 rows.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor [N, d_in], got {type(x).__name__}")
    if x.ndim != 2 or x.shape[1] != sae.d_in or x.shape[0] < 2:
        raise ValueError(f"x must have shape [N >= 2, d_in={sae.d_in}], got {list(x.shape)}")
    n = x.shape[0]
    d_sae = sae.cfg.d_sae
    sum_x = torch.zeros(sae.d_in, dtype=torch.float64)
    acc = dict.fromkeys(["sq_norm", "resid", "cos", "norm_in", "norm_out", "ratio", "out_sq", "dot", "l0", "l1"], 0.0)
    counts = torch.zeros(d_sae, dtype=torch.float64)
    was_training = sae.training
    sae.eval()
    try:
        for s in range(0, n, batch_size):
            xb = x[s:s + batch_size]
            out = sae(xb.to(sae.device))
            xd, yd = xb.double().cpu(), out.sae_out.double().cpu()
            acts = out.latent_acts.double().cpu()
            nonzero = acts != 0
            sum_x += xd.sum(0)
            norm_in, norm_out = xd.norm(dim=1), yd.norm(dim=1)
            acc["sq_norm"] += float(xd.pow(2).sum())
            acc["resid"] += float((xd - yd).pow(2).sum())
            acc["cos"] += float(torch.nn.functional.cosine_similarity(xd, yd, dim=1, eps=1e-30).sum())
            acc["norm_in"] += float(norm_in.sum())
            acc["norm_out"] += float(norm_out.sum())
            acc["ratio"] += float((norm_out / torch.where(norm_in.abs() < 1e-4, 1.0, norm_in)).sum())
            acc["out_sq"] += float(yd.pow(2).sum())
            acc["dot"] += float((xd * yd).sum())
            acc["l0"] += float(nonzero.sum())
            acc["l1"] += float(acts.abs().sum())
            counts.index_add_(0, out.latent_indices.cpu()[nonzero], torch.ones(int(nonzero.sum()), dtype=torch.float64))
    finally:
        sae.train(was_training)
    total_var = acc["sq_norm"] / n - float((sum_x / n).pow(2).sum())
    literal_var = acc["sq_norm"] / n - (acc["sq_norm"] / (n * sae.d_in)) ** 2
    mse = acc["resid"] / n
    density = counts / n
    dens_sum = float(density.sum())
    return {
        "reconstruction_quality": {
            "explained_variance": (1.0 - mse / total_var) if total_var > 1e-10 else (1.0 if mse < 1e-10 else 0.0),
            "mse": mse,
            "cossim": acc["cos"] / n,
            "explained_variance_saebench_literal": 1.0 - mse / literal_var if literal_var != 0 else float("nan"),
        },
        "shrinkage": {
            "l2_norm_in": acc["norm_in"] / n,
            "l2_norm_out": acc["norm_out"] / n,
            "l2_ratio": acc["ratio"] / n,
            "relative_reconstruction_bias": acc["out_sq"] / acc["dot"] if acc["dot"] != 0 else float("nan"),
        },
        "sparsity": {"l0": acc["l0"] / n, "l1": acc["l1"] / n},
        "misc_metrics": {
            "frac_alive": float((density > 0).double().mean()),
            "freq_over_1_percent": float((density > 0.01).double().mean()),
            "freq_over_10_percent": float((density > 0.1).double().mean()),
            "normalized_freq_over_1_percent": float(density[density > 0.01].sum()) / dens_sum if dens_sum else 0.0,
            "normalized_freq_over_10_percent": float(density[density > 0.1].sum()) / dens_sum if dens_sum else 0.0,
            "average_max_encoder_cosine_sim": average_max_cosine_sim(sae.encoder.weight),
            "average_max_decoder_cosine_sim": average_max_cosine_sim(sae.W_dec),
        },
        "token_stats": {"total_tokens_eval_sparsity_variance": n},
    }


CORE_KEYS = [("reconstruction_quality", "explained_variance"), ("reconstruction_quality", "mse"),
             ("reconstruction_quality", "cossim"), ("shrinkage", "l2_ratio"),
             ("shrinkage", "relative_reconstruction_bias"), ("sparsity", "l0"), ("sparsity", "l1"),
             ("misc_metrics", "frac_alive"), ("misc_metrics", "freq_over_1_percent"),
             ("misc_metrics", "freq_over_10_percent"), ("misc_metrics", "average_max_decoder_cosine_sim")]
"""(category, key) pairs shown in reports, in SAEBench's order."""
