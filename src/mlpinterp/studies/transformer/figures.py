"""Figures of ``reproduce transformer``: FVU per block and degree, under the model vs on data, splice-in,
eigen-spectra and Gaussianity diagnostics."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlpinterp.studies.transformer.values import COLORS, GAUSS_TAIL, LABEL, get, splice_value
from mlpinterp.utils.figures import pyplot, save_figure


def make_figures(out: Path, results: dict) -> list[tuple[str, str]]:
    """Every figure of the report under ``out/figures``; returns ``(path relative to out, caption)`` pairs."""
    import matplotlib.ticker

    plt = pyplot()

    figs = out / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    layers = results["layers"]
    degrees = results["config"]["degrees"]
    models = results["config"]["input_models"]
    x = [lay["layer"] for lay in layers]
    made = []

    fig, axes = plt.subplots(1, len(degrees), figsize=(4.2 * len(degrees), 3.6), squeeze=False, sharey=True)
    for ax, n in zip(axes[0], degrees, strict=True):
        for m in models:
            y = [get(lay, m, n, "heldout", "fvu") for lay in layers]
            se = [get(lay, m, n, "heldout", "fvu_se") or 0.0 for lay in layers]
            if any(v is not None for v in y):
                ax.errorbar(x, [np.nan if v is None else v for v in y], yerr=se, marker="o", capsize=2,
                            color=COLORS[m], label=LABEL[m])
        ols = [get(lay, "data", 1, "heldout", "fvu") for lay in layers]
        if any(v is not None for v in ols):
            ax.plot(x, [np.nan if v is None else v for v in ols], "k--", marker="x", ms=7, lw=1,
                    label="linear OLS on real tokens")  # markers: visible with a single block too
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.LogFormatterSciNotation(labelOnlyBase=False))
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlabel("FFN block (layer)")
        ax.set_title(f"degree {n}")
        ax.set_xticks(x)
    axes[0][0].set_ylabel("FVU on held-out real tokens")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, figs / "fvu_vs_layer.png")
    made.append(("figures/fvu_vs_layer.png", "FVU on held-out real tokens per block, degree and input model"))

    fig, ax = plt.subplots(figsize=(5, 4.4))
    lo, hi = np.inf, 0.0
    markers = dict(zip(degrees, "os^Dv", strict=False))
    for m in models:
        for n in degrees:
            pts = [(get(lay, m, n, "under_model", "fvu"), get(lay, m, n, "heldout", "fvu")) for lay in layers]
            pts = [(a, b) for a, b in pts if a is not None and b is not None and a > 0 and b > 0]
            if pts:
                a, b = np.array(pts).T
                ax.scatter(a, b, color=COLORS[m], marker=markers.get(n, "o"), s=22)
                lo, hi = min(lo, a.min(), b.min()), max(hi, a.max(), b.max())
    for m in models:  # legend: colour = input model, marker = degree
        ax.scatter([], [], color=COLORS[m], marker="o", s=22, label=LABEL[m])
    for n in degrees:
        ax.scatter([], [], color="grey", marker=markers.get(n, "o"), s=22, label=f"degree {n}")
    ax.set_title("FVU under the input model vs on real held-out tokens", fontsize=9)
    if hi > 0:
        ax.plot([lo, hi], [lo, hi], "k:", lw=1, label="on data = under the model")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FVU under the input model (fit tokens for data / hybrid)")
    ax.set_ylabel("FVU on held-out real tokens")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, figs / "model_vs_data.png")
    made.append(("figures/model_vs_data.png", "FVU under each input model vs on held-out real tokens"))

    kind = layers[0]["splice"]["kind"] if layers else "embedding"
    cols = min(len(layers), 3) or 1
    rows = int(np.ceil(len(layers) / cols)) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, lay in zip(axes.ravel(), layers, strict=False):
        for m in models:
            y = [splice_value(lay, m, n) for n in degrees]
            ax.plot(degrees, [np.nan if v is None else v for v in y], marker="o", color=COLORS[m], label=LABEL[m])
        key = "cos" if kind == "embedding" else "ce"
        ax.axhline(lay["splice"]["zero"][key], color="grey", ls="--", lw=1, label="zero ablation")
        ax.axhline(lay["splice"]["mean"][key], color="grey", ls=":", lw=1, label="mean ablation")
        if kind == "lm":
            ax.axhline(lay["splice"]["clean"]["ce"], color="k", lw=1, label="clean")
        ax.set_title(f"block {lay['layer']}")
        ax.set_xticks(degrees)
        ax.set_xlabel("degree")
        ax.set_ylabel("sentence-embedding cosine to clean" if kind == "embedding" else "next-token CE (nats)")
        ax.ticklabel_format(axis="y", useOffset=False)  # plain values (cosines near 1), no offset
    for ax in axes.ravel()[len(layers):]:
        ax.axis("off")
    axes.ravel()[0].legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, figs / "splice.png")
    made.append(("figures/splice.png", "Splice-in: the model's own output with each approximant in place of the block"))

    spectra = [(lay["layer"], out / "layers" / f"{lay['layer']}_features.npz") for lay in layers
               if lay.get("features")]
    if spectra:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for i, path in spectra:
            s = np.load(path)["spectra"][0]
            ax.semilogy(np.arange(1, s.size + 1), np.abs(s) / np.abs(s).max(), label=f"block {i}")
        ax.set_xscale("log")
        ax.set_xlabel("eigenvalue rank")
        ax.set_ylabel("|eigenvalue| / max")
        ax.set_title("quadratic form along the top output direction")
        ax.legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, figs / "features.png")
        made.append(("figures/features.png", "Eigenvalue spectra of the degree-2 term along each block's top output "
                                             "direction (recommended input model)"))

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.3))
    diag = [lay["diagnostics"] for lay in layers]
    for ax, key, title, ylabel, ref in zip(axes, ["neuron_tail_fraction", "neuron_excess_kurtosis_median",
                                                  "outlier_variance_fraction"],
                                           ["pre-activations with |z| > 3", "median neuron excess kurtosis",
                                            "variance in outlier input dims"],
                                           ["fraction of pre-activations", "excess kurtosis",
                                            "fraction of input variance"], [GAUSS_TAIL, 0.0, None], strict=True):
        ax.bar(x, [d.get(key, np.nan) for d in diag], color="C4")
        if ref is not None:
            ax.axhline(ref, color="k", ls="--", lw=1, label="Gaussian")
            ax.legend(fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(x)
        ax.set_xlabel("FFN block")
        ax.set_ylabel(ylabel)
    fig.tight_layout()
    save_figure(fig, figs / "diagnostics.png")
    made.append(("figures/diagnostics.png", "Gaussianity diagnostics of each block's real inputs"))
    return made
