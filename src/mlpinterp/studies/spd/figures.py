"""Figures of the SPD study beyond the shared parameter-space ones: causal importance per feature."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mlpinterp.utils.figures import pyplot, save_figure


def plot_ci_per_feature(ci: dict[str, torch.Tensor], path: Path, alive: dict[str, np.ndarray]) -> None:
    """Causal importance of every alive subcomponent (columns, ordered by the feature they serve) on each one-hot
    input (rows), one panel per site (the SPD paper's causal-importance plots)."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig, axes = plt.subplots(1, len(ci), figsize=(3.2 * len(ci) + 1, 3.2), squeeze=False)
    im = None
    for ax, (site, g) in zip(axes[0], ci.items(), strict=True):
        g = g.cpu().numpy()[:, alive[site]]
        order = np.argsort(g.argmax(0) if g.size else np.zeros(0))
        im = ax.imshow(g[:, order] if g.size else np.zeros((g.shape[0], 1)), aspect="auto", cmap="Blues",
                       vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"{site} ({g.shape[1]} alive)", fontsize=9)
        ax.set_xlabel("subcomponent (alive, sorted)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][0].set_ylabel("input feature (one-hot)")
    fig.colorbar(im, ax=axes[0].tolist(), label="causal importance")
    save_figure(fig, path)

