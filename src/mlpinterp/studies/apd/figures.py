"""Figures of the APD study beyond the shared parameter-space ones: neuron contributions of the residual MLPs
and the gated-trig functions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mlpinterp.apd import APDConfig, attributions, topk_mask
from mlpinterp.paramspace import Components, run_with_components
from mlpinterp.toys import neuron_contributions
from mlpinterp.utils.figures import pyplot, save_figure


def plot_contributions(model, comps: Components, responsible: np.ndarray, path: Path, n_show: int = 10) -> None:
    """Neuron contributions ``[feature, neuron]`` of the first ``n_show`` features: the target's, and those of each
    feature's responsible APD component (``responsible[i]``)."""
    plt = pyplot()
    target = neuron_contributions(model).numpy()[:n_show]
    W = comps.weights()
    learned = np.stack([neuron_contributions(model, {k: v[responsible[i]] for k, v in W.items()}).numpy()[i]
                        for i in range(n_show)])
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.5), sharex=True)
    vmax = max(np.abs(target).max(), np.abs(learned).max())
    for ax, M, t in ((axes[0], target, "target"), (axes[1], learned, "responsible APD component")):
        im = ax.imshow(M, aspect="auto", cmap="RdBu", vmin=-vmax, vmax=vmax)
        ax.set_ylabel("feature")
        ax.set_title(f"neuron contributions: {t}", fontsize=9)
    axes[1].set_xlabel("neuron")
    fig.colorbar(im, ax=axes.tolist(), label="contribution to the feature's output")
    save_figure(fig, path)


def plot_gated(model, comps: Components, info: dict, path: Path, cfg: APDConfig) -> None:
    """Each gated-trig function ``F_i`` against ``x_0``: the ground truth, the target and APD with its top-1
    component."""
    from mlpinterp.toys import trig_functions

    plt = pyplot()
    xs = torch.linspace(0, 5, 200)
    fig, axes = plt.subplots(1, 4, figsize=(12, 2.6))
    for i, ax in enumerate(axes):
        inp = torch.zeros(200, 5)
        inp[:, 0] = xs
        inp[:, 1 + i] = 1.0
        with torch.no_grad():
            mask = topk_mask(attributions(model, comps, inp), 1)
            y_apd = run_with_components(model, comps, inp, mask.float())[:, 0]
            y_t = model(inp)[:, 0]
        ax.plot(xs, trig_functions(xs.numpy(), np.array(info["coefficients"]))[:, i], "k:", label="F_i")
        ax.plot(xs, y_t, label="target")
        ax.plot(xs, y_apd, "--", label="APD top-1")
        ax.set_title(f"function {i}", fontsize=9)
        ax.set_xlabel("x_0 (the shared input)")
    axes[0].set_ylabel("output")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)

