"""Figures shared by the parameter-space reproductions (APD, SPD): loss curves, TMS columns, scrubbing histograms.

Every figure is written atomically through the one saver (:func:`mlpinterp.utils.figures.save_figure`), so a report
never embeds a half-written file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlpinterp.utils.figures import pyplot, save_figure

APD_LOSSES = ("faithfulness", "minimality", "simplicity", "act_recon", "lp_minimality", "lp_simplicity")
"""Loss terms of an APD history (:func:`mlpinterp.apd.apd_losses`)."""


def plot_history(history: list[dict], path: Path, title: str, keys=APD_LOSSES) -> None:
    """Loss terms ``keys`` of a training history (log scale) against the step."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [h["step"] for h in history]
    for key in keys:
        if key in history[0]:
            ax.semilogy(steps, [max(h[key], 1e-12) for h in history], label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_tms(W: np.ndarray, P: np.ndarray, path: Path) -> None:
    """Columns of ``W`` and of each component (2-D arrows when ``d_hidden = 2``, coloured by feature with a legend;
    heatmaps of column norms otherwise)."""
    plt = pyplot()
    C = P.shape[0]
    if W.shape[0] == 2:
        n_panels = C + 2
        ncols = min(n_panels, 7)  # wrapped rows: a panel stays readable with many components
        nrows = -(-n_panels // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(2.2 * ncols, 2.5 * nrows + 0.4), squeeze=False)
        lim = 1.1 * np.abs(W).max()
        flat = axes.ravel()
        for ax, M, t in zip(flat, [W, P.sum(0), *P], ["target W", "sum of components"] +
                            [f"component {c}" for c in range(C)], strict=False):
            for j in range(M.shape[1]):
                ax.arrow(0, 0, M[0, j], M[1, j], head_width=0.05 * lim, length_includes_head=True,
                         color=plt.cm.tab10(j % 10))
            ax.set_xlim(-lim, lim)
            ax.set_ylim(-lim, lim)
            ax.set_aspect("equal")
            ax.set_title(t, fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_xlabel("hidden dim 1", fontsize=8)
            ax.set_ylabel("hidden dim 2", fontsize=8)
        for ax in flat[n_panels:]:
            ax.axis("off")
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=plt.cm.tab10(j % 10), lw=2, label=f"feature {j}") for j in range(W.shape[1])]
        fig.legend(handles=handles, loc="lower center", ncol=min(W.shape[1], 10), fontsize=8, frameon=False,
                   bbox_to_anchor=(0.5, -0.06 / nrows), title="column of W (arrow colour)", title_fontsize=8)
        fig.tight_layout()
    else:
        norms = np.linalg.norm(P, axis=1)  # [C, n_features]
        order = np.argsort(norms.argmax(axis=1) + 1e-3 * (-norms.max(axis=1)))
        fig, ax = plt.subplots(figsize=(7, 5))
        im = ax.imshow(norms[order], aspect="auto", cmap="viridis")
        ax.set_xlabel("feature (column of W)")
        ax.set_ylabel("component (sorted)")
        ax.set_title("||P_c[:, j]||: column norms of every component")
        fig.colorbar(im, ax=ax, label="column norm")
    save_figure(fig, path)


def plot_scrubbing(res, path: Path) -> None:
    """Histograms of the per-sample MSE to the target output under top-k, scrubbed and anti-scrubbed masks (log
    bins; dashed lines: means)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    allv = np.concatenate([res.topk, res.scrubbed, res.anti_scrubbed])
    bins = np.logspace(np.log10(max(allv.min(), 1e-8)), np.log10(allv.max() + 1e-12), 60)
    for vals, lab, col in ((res.topk, "top-k", "C0"), (res.scrubbed, "scrubbed", "C6"),
                           (res.anti_scrubbed, "anti-scrubbed", "C2")):
        ax.hist(np.maximum(vals, 1e-8), bins=bins, alpha=0.5, label=lab, color=col)
        ax.axvline(vals.mean(), color=col, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("MSE to the target output")
    ax.set_ylabel("samples")
    ax.legend()
    save_figure(fig, path)
