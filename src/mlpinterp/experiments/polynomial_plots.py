"""Figures of ``reproduce polynomial`` (PNG, matplotlib, Agg backend): the paper's Figs. 1-5 with error bands."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mlpinterp.poly.spectral import ablate  # noqa: E402

STYLE = {
    "linear_mixture": dict(color="tab:blue", ls="-", label="linear (mixture, exact)"),
    "quadratic_mixture": dict(color="tab:orange", ls="-", label="quadratic (mixture, exact)"),
    "linear_gaussian": dict(color="tab:blue", ls="--", label="linear (one Gaussian)"),
    "quadratic_gaussian": dict(color="tab:orange", ls="--", label="quadratic (one Gaussian)"),
    "network": dict(color="black", ls="-", label="network"),
}


def _band(ax, x, d, style, *, clip_low=None):
    m, s = np.array(d["mean"], dtype=float), np.array(d["std"], dtype=float)  # None (not fitted) -> nan
    ax.plot(x, m, color=style["color"], ls=style["ls"], label=style["label"], marker="o", ms=2.5)
    lo = m - s if clip_low is None else np.maximum(m - s, clip_low)
    ax.fill_between(x, lo, m + s, color=style["color"], alpha=0.15, lw=0)


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
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"{res['dataset']['name']}: mean ± std over {res['seeds']} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _features_figure(per_seed, data, path):
    z = np.load(per_seed[0]["features"])
    steps = [int(s) for s in z["steps"]]
    h, w = data.image_shape
    n_cls = data.n_classes
    cols = [(f"linear @ {s}", z[f"linear_{s}"]) for s in steps]
    fin = steps[-1]
    ev, vecs = z[f"eigvals_{fin}"], z[f"eigvecs_{fin}"]
    for i in range(vecs.shape[1]):
        cols.append((f"eig {i + 1} @ {fin}", vecs[:, i, :]))
    fig, axes = plt.subplots(n_cls, len(cols), figsize=(1.6 * len(cols), 1.6 * n_cls), squeeze=False)
    for j, (title, M) in enumerate(cols):
        for c in range(n_cls):
            img = M[c].reshape(h, w)
            v = np.abs(img).max() or 1.0
            ax = axes[c][j]
            ax.imshow(img, cmap="RdBu_r", vmin=-v, vmax=v)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_title(title, fontsize=7)
            if j == 0:
                ax.set_ylabel(f"class {c}", fontsize=7)
            if title.startswith("eig"):
                ax.text(0.02, 0.02, f"{ev[c, int(title.split()[1]) - 1]:+.2g}", transform=ax.transAxes, fontsize=6)
    fig.suptitle("Linear coefficients and top quadratic eigenvectors (mixture approximants, seed 0)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _attack_figure(res, path):
    att = res["attack"]
    ks = att["k"]
    methods = [m for m in ("svd", "svd-raw", "random", "pca") if m in att]
    fig, axes = plt.subplots(1, len(methods), figsize=(4.6 * len(methods), 4), sharey=True, squeeze=False)
    titles = {"svd": "top-k SVD directions of B Σ = Cov(f, x)", "svd-raw": "top-k SVD directions of raw B",
              "random": "k random directions", "pca": "top-k PCA directions of the data"}
    for ax, method in zip(axes[0], methods, strict=True):
        for model, d in att[method].items():
            _band(ax, ks, d, STYLE[model])
        ax.axhline(1.0 / res["dataset"]["n_classes"], color="gray", ls=":", label="chance")
        ax.set_title(titles[method], fontsize=10)
        ax.set_xlabel("k ablated directions")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _attack_grid(per_seed, data, path, ks=(0, 2, 4, 6, 8, 10)):
    V = np.load(per_seed[0]["features"])["attack_directions"]  # top SVD directions of Cov(f, x), as in the attack
    ks = [k for k in ks if k <= V.shape[1]]
    X = data.X_test[:6].astype(np.float64)
    fig, axes = plt.subplots(len(X), len(ks), figsize=(1.4 * len(ks), 1.4 * len(X)), squeeze=False)
    for j, k in enumerate(ks):
        Xa = ablate(X, V[:, :k])
        for i in range(len(X)):
            axes[i][j].imshow(Xa[i].reshape(data.image_shape), cmap="gray")
            axes[i][j].set_xticks([])
            axes[i][j].set_yticks([])
            if i == 0:
                axes[i][j].set_title(f"k = {k}", fontsize=8)
    fig.suptitle("Test images with the top-k SVD directions of Cov(f, x) projected out (seed 0)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
