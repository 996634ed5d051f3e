"""Figures of ``reproduce polynomial`` (PNG, matplotlib, Agg backend): the paper's Figs. 1-5 with error bands."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlpinterp.poly.spectral import ablate
from mlpinterp.utils.figures import pyplot, save_figure

plt = pyplot()

STYLE = {
    "linear_mixture": dict(color="tab:blue", ls="-", label="linear (mixture, exact)"),
    "quadratic_mixture": dict(color="tab:orange", ls="-", label="quadratic (mixture, exact)"),
    "linear_gaussian": dict(color="tab:blue", ls="--", label="linear (one Gaussian)"),
    "quadratic_gaussian": dict(color="tab:orange", ls="--", label="quadratic (one Gaussian)"),
    "network": dict(color="black", ls="-", label="network", lw=2.0, zorder=4),
}
"""Line style per curve; the network's own curve is drawn last and thicker, so approximants that match it do not hide
it."""


def _band(ax, x, d, style, *, clip_low=None):
    # None -> nan: no point where a metric was not computed, no band where there is no spread (one seed)
    m, s = np.array(d["mean"], dtype=float), np.array(d["std"], dtype=float)
    ax.plot(x, m, color=style["color"], ls=style["ls"], label=style["label"], marker="o", ms=2.5,
            lw=style.get("lw", 1.5), zorder=style.get("zorder", 2))
    lo = m - s if clip_low is None else np.maximum(m - s, clip_low)
    ax.fill_between(x, lo, m + s, color=style["color"], alpha=0.15, lw=0)


def _spread_title(res) -> str:
    n = res["seeds"]
    what = f"mean ± std over {n} seeds (bands)" if n > 1 else "one seed (no spread)"
    return what + (" - smoke run, not a reproduction" if res["config"].get("smoke") else "")


def _curve_figure(res, metric_pairs, ylabel, path, *, logy=True):
    steps = res["steps"]
    fig, axes = plt.subplots(1, len(metric_pairs), figsize=(5.5 * len(metric_pairs), 4), squeeze=False)
    for ax, (metric, title) in zip(axes[0], metric_pairs, strict=True):
        for name, d in res["curves"].items():
            if metric in d:
                _band(ax, steps, d[metric], STYLE[name], clip_low=1e-8 if logy else None)
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)  # off the data
    fig.suptitle(f"{res['dataset']['name']}: {_spread_title(res)}")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def _features_figure(per_seed, data, path):
    """Rows: classes; columns: linear coefficient images at 3 checkpoints, then the top quadratic eigenvectors.

    Each column shares one symmetric colour scale (its colour bar underneath), so magnitudes compare across
    classes; eigenvector panels carry their eigenvalue underneath.
    """
    z = np.load(per_seed[0]["features"])
    steps = [int(s) for s in z["steps"]]
    h, w = data.image_shape
    n_cls = data.n_classes
    cols = [(f"linear B\nstep {s}", z[f"linear_{s}"], None) for s in steps]
    fin = steps[-1]
    ev, vecs = z[f"eigvals_{fin}"], z[f"eigvecs_{fin}"]
    for i in range(vecs.shape[1]):
        cols.append((f"quadratic eigvec {i + 1}\nstep {fin}", vecs[:, i, :], ev[:, i]))
    fig, axes = plt.subplots(n_cls, len(cols), figsize=(1.75 * len(cols) + 0.6, 1.75 * n_cls + 1.2),
                             squeeze=False, layout="constrained")
    for j, (title, M, eig) in enumerate(cols):
        v = float(np.abs(M[:n_cls]).max()) or 1.0
        for c in range(n_cls):
            ax = axes[c][j]
            im = ax.imshow(M[c].reshape(h, w), cmap="RdBu_r", vmin=-v, vmax=v)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_title(title, fontsize=9)
            if j == 0:
                ax.set_ylabel(f"class {c}", fontsize=9)
            if eig is not None:
                ax.set_xlabel(f"λ = {eig[c]:+.3g}", fontsize=9, labelpad=2)
        cb = fig.colorbar(im, ax=axes[:, j], orientation="horizontal", fraction=0.025, pad=0.01, aspect=12)
        cb.ax.tick_params(labelsize=7)
        cb.ax.locator_params(nbins=3)
    fig.suptitle("Linear coefficients and top quadratic eigenvectors (mixture approximants, seed 0);\n"
                 "red positive, blue negative; one colour scale per column", fontsize=10)
    save_figure(fig, path, dpi=110)


def _attack_figure(res, path):
    att = res["attack"]
    ks = att["k"]
    methods = [m for m in ("svd", "svd-raw", "random", "pca") if m in att]
    ncols = 2 if len(methods) > 2 else len(methods)  # 2 x 2: readable at report width
    nrows = -(-len(methods) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.9 * nrows), sharey=True, squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(methods):]:
        ax.set_visible(False)
    titles = {"svd": "top-k SVD directions of B Σ = Cov(f, x)", "svd-raw": "top-k SVD directions of raw B",
              "random": "k random directions", "pca": "top-k PCA directions of the data"}
    for ax, method in zip(axes.flat, methods, strict=False):
        for model, d in att[method].items():
            _band(ax, ks, d, STYLE[model])
        ax.axhline(1.0 / res["dataset"]["n_classes"], color="gray", ls=":", label="chance")
        ax.set_title(titles[method], fontsize=10)
        ax.set_xlabel("k ablated directions")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("test accuracy")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Network and approximant accuracy as k input directions are projected out: {_spread_title(res)}",
                 fontsize=10)
    save_figure(fig, path, dpi=120)


def _attack_grid(per_seed, data, path, ks=(0, 2, 4, 6, 8, 10), n_images: int = 6):
    """Test images as the top-k SVD directions of Cov(f, x) are projected out, with the true label of each row and
    the network's prediction under each panel (green: correct, red: wrong)."""
    from mlpinterp.models import load_classifier

    V = np.load(per_seed[0]["features"])["attack_directions"]  # top SVD directions of Cov(f, x), as in the attack
    net = load_classifier(per_seed[0]["final_checkpoint"])[0].to_network()
    ks = [k for k in ks if k <= V.shape[1]]
    X = data.X_test[:n_images].astype(np.float64)
    y = data.y_test[:n_images]
    fig, axes = plt.subplots(len(X), len(ks), figsize=(1.45 * len(ks) + 0.5, 1.6 * len(X) + 0.6), squeeze=False,
                             layout="constrained")
    for j, k in enumerate(ks):
        Xa = ablate(X, V[:, :k])
        pred = net(Xa).argmax(1)
        for i in range(len(X)):
            ax = axes[i][j]
            ax.imshow(Xa[i].reshape(data.image_shape), cmap="gray")
            ax.set_xticks([])
            ax.set_yticks([])
            ok = pred[i] == y[i]
            ax.set_xlabel(f"pred {pred[i]}", fontsize=9, color="tab:green" if ok else "tab:red", labelpad=2)
            if i == 0:
                ax.set_title(f"k = {k}", fontsize=10)
            if j == 0:
                ax.set_ylabel(f"true {y[i]}", fontsize=10)
    fig.suptitle("Test images with the top-k SVD directions of Cov(f, x) projected out (seed 0);\n"
                 "row: true label; under each image: the network's prediction (green correct, red wrong)", fontsize=9)
    save_figure(fig, path, dpi=110)


def make_figures(res: dict, per_seed: list[dict], data, out_dir: str | Path) -> list[Path]:
    """Write all figures into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f for f in ("fvu_vs_step.png", "kl_vs_step.png", "accuracy_vs_step.png", "features.png",
                                   "svd_attack.png", "attack_grid.png")]
    _curve_figure(res, [("fvu_mixture", "FVU under the Gaussian mixture"), ("fvu_test", "FVU on the real test set")],
                  "FVU", paths[0])
    _curve_figure(res, [("kl_mixture", "KL under the Gaussian mixture"), ("kl_test", "KL on the real test set")],
                  "KL(network || approximant) [nats]", paths[1])
    _curve_figure(res, [("test_accuracy", "test accuracy")], "accuracy", paths[2], logy=False)
    _features_figure(per_seed, data, paths[3])
    _attack_figure(res, paths[4])
    _attack_grid(per_seed, data, paths[5])
    return paths
