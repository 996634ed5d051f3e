"""Figures of the MFR study: per-k summaries of every setting (mean ± standard error over seeds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlpinterp.studies.mfr.analysis import summarise
from mlpinterp.studies.mfr.settings import PAPER, SyntheticExperiment
from mlpinterp.utils.figures import pyplot, save_figure

COLORS = {"baseline": "C0", "reinit": "C3", "mfr": "C1", "mfr_alpha0.1": "C2"}


def integer_k_axis(ax, ks: list[int]) -> None:
    """Ticks at the k values only; a single k gets a window of +-3 around it (not a 0.6-wide stretched axis)."""
    ax.set_xticks(ks)
    if len(ks) == 1:
        ax.set_xlim(ks[0] - 3, ks[0] + 3)


def figures_synthetic(out: Path, exp: SyntheticExperiment, results: list[dict]) -> None:
    plt = pyplot()

    summary = summarise(results, ["mmcs_truth", "fvu", "correlation"])
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    all_ks = sorted({int(k) for cond in summary for k in summary[cond]})
    for ax, key, label in zip(axes, ["mmcs_truth", "fvu", "correlation"],
                              ["MMCS to true features (Hungarian)", "held-out FVU",
                               "corr(cross-SAE sim., truth sim.)"], strict=True):
        for i, cond in enumerate(summary):
            ks = sorted(int(k) for k in summary[cond])
            m = [summary[cond][str(k)][key]["mean"] for k in ks]
            se = [np.nan_to_num(summary[cond][str(k)][key]["se"]) for k in ks]
            # reinit often equals the baseline (no re-initialisation fired): dashed, so both stay visible
            ax.errorbar(ks, m, yerr=se, marker="x" if cond == "reinit" else "o", ls="--" if cond == "reinit" else "-",
                        capsize=3, label=cond, color=COLORS.get(cond, f"C{3 + i}"))
        if key == "correlation":
            ax.axhline(PAPER["synthetic_correlation_baseline"], ls=":", c=COLORS["baseline"], lw=1,
                       label="paper baseline")
            ax.axhline(PAPER["synthetic_correlation_reinit"], ls=":", c=COLORS["reinit"], lw=1, label="paper reinit")
        integer_k_axis(ax, all_ks)
        ax.set_xlabel("k (= active features per sample)")
        ax.set_ylabel(label)
        ax.ticklabel_format(axis="y", useOffset=False)  # plain values, no "1e-7 + 0.19" offset
        ax.set_title(label)
        ax.legend(fontsize=8)
    save_figure(fig, out / "synthetic_summary.png", dpi=120)



def summary_png(is_lm: bool) -> str:
    return "lm_summary.png" if is_lm else "minilm_summary.png"


def figures_summary(out: Path, summary: dict, downstream: str | None = "cosine_recovered",
                    name: str = "minilm_summary.png") -> None:
    """Per-k panels of held-out FVU, the ``downstream`` metric (none when None) and the dead fraction."""
    plt = pyplot()

    keys = ["fvu", *([downstream] if downstream else []), "dead_fraction"]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.7 * len(keys), 4))
    for ax, key in zip(axes, keys, strict=True):
        label = {"fvu": "held-out FVU"}.get(key, key.replace("_", " "))
        for i, cond in enumerate(summary):
            ks = sorted(int(k) for k in summary[cond])
            ax.errorbar(ks, [summary[cond][str(k)][key]["mean"] for k in ks], color=COLORS.get(cond, f"C{3 + i}"),
                        yerr=[np.nan_to_num(summary[cond][str(k)][key]["se"]) for k in ks],
                        marker="o", capsize=3, label=cond)
        integer_k_axis(ax, sorted({int(k) for cond in summary for k in summary[cond]}))
        ax.set_xlabel("k (TopK active latents)")
        ax.set_ylabel(label)
        ax.ticklabel_format(axis="y", useOffset=False)  # plain values, no offset
        ax.set_title(label)
        ax.legend(fontsize=8)
    save_figure(fig, out / name, dpi=120)

