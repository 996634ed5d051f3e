"""Figures of ``reproduce three-spaces``: MMCS per method (to the ground truth, or to the other methods), the
pairwise alignment heat map, recovered-feature counts (toys) and held-out faithfulness per method."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlpinterp.studies.three_spaces.settings import METHOD_LABELS, METHODS, RECOVERED_COSINE
from mlpinterp.utils.figures import pyplot, save_figure


def _plt():
    return pyplot()


def _save(fig, path: Path) -> str:
    save_figure(fig, path)
    return path.name


def _ms(values) -> tuple[float, float | None]:
    """Mean over seeds and its s.e.; the s.e. is ``None`` for one seed (no spread across seeds: no error bar)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if v.size == 0:
        return float("nan"), None
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else None


def _yerr(stats: list[tuple[float, float | None]]) -> list[float] | None:
    """Error-bar half-heights (s.e. over seeds), or ``None`` (no bars) when any bar rests on one seed."""
    return None if any(s is None for _, s in stats) else [s for _, s in stats]


def spread_note(per_seed: list[dict]) -> str:
    """What a figure's values are: ``"mean ± s.e. over n = 3 seeds"``, or ``"seed 0 only, n = 1: no spread
    across seeds"``."""
    n = len(per_seed)
    return f"mean ± s.e. over n = {n} seeds" if n > 1 else \
        f"seed {per_seed[0].get('seed', 0)} only, n = 1: no spread across seeds"


def _legend_outside(ax) -> None:
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _bars(ax, names, ours, rand, ylabel, title, ours_label, rand_label):
    x = np.arange(len(names))
    ax.bar(x - 0.2, [m for m, _ in ours], 0.4, yerr=_yerr(ours), capsize=3, label=ours_label, color="tab:blue")
    ax.bar(x + 0.2, [m for m, _ in rand], 0.4, yerr=_yerr(rand), capsize=3, label=rand_label,
           color="lightgray", hatch="//", edgecolor="gray")
    ax.set_xticks(x, [METHOD_LABELS[n].replace(" ", "\n", 1) for n in names], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)


def plot_truth_mmcs(per_seed: list[dict], path: Path) -> str:
    """Bars: each method's MMCS to the true directions and its random baseline (uniform on the inputs' support);
    mean ± s.e. over seeds, no error bars for one seed."""
    plt = _plt()
    names = [m for m in METHODS if m in per_seed[0]["truth"]]
    ours = [_ms([s["truth"][n]["mmcs"] for s in per_seed]) for n in names]
    rand = [_ms([s["truth"][n]["random"]["mmcs"] for s in per_seed]) for n in names]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    _bars(ax, names, ours, rand, "MMCS to the true directions (|cos|)",
          f"Each method against ground truth\n({spread_note(per_seed)})",
          "method", "random on the inputs' support,\nsame count")
    ax.set_ylim(0, 1.05)
    _legend_outside(ax)
    return _save(fig, path)


def plot_recovered(per_seed: list[dict], path: Path, n_features: int) -> str:
    """Bars: true features recovered at ``|cos| >= RECOVERED_COSINE`` by each method and by its random baseline;
    mean ± s.e. over seeds, no error bars for one seed."""
    plt = _plt()
    names = [m for m in METHODS if m in per_seed[0]["truth"]]
    ours = [_ms([s["truth"][n]["recovered"] for s in per_seed]) for n in names]
    rand = [_ms([s["truth"][n]["random"]["recovered"] for s in per_seed]) for n in names]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    _bars(ax, names, ours, rand, f"true features recovered (|cos| ≥ {RECOVERED_COSINE})",
          f"Recovered features of {n_features}\n({spread_note(per_seed)})",
          "method", "random on the inputs' support,\nsame count")
    ax.axhline(n_features, color="k", lw=0.8, ls="--", label="all features")
    ax.set_ylim(0, n_features * 1.1)
    _legend_outside(ax)
    return _save(fig, path)


def plot_pairwise_mmcs(per_seed: list[dict], path: Path) -> str:
    """Bars: for each method, its MMCS to each other method's set beside the covariance baseline, one group per
    ordered pair; mean ± s.e. over seeds, no error bars for one seed."""
    plt = _plt()
    names = [m for m in METHODS if m in per_seed[0]["pairwise"]]
    pairs = [(a, b) for a in names for b in names if a != b]
    ours = [_ms([s["pairwise"][a][b]["mmcs"] for s in per_seed]) for a, b in pairs]
    rand = [_ms([s["pairwise"][a][b]["random"]["mmcs"] for s in per_seed]) for a, b in pairs]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    x = np.arange(len(pairs))
    ax.bar(x - 0.2, [m for m, _ in ours], 0.4, yerr=_yerr(ours), capsize=2, label="method pair", color="tab:blue")
    ax.bar(x + 0.2, [m for m, _ in rand], 0.4, yerr=_yerr(rand), capsize=2,
           label="random from the input\ncovariance, same count", color="lightgray", hatch="//", edgecolor="gray")
    ax.set_xticks(x, [f"{a}\n→ {b}" for a, b in pairs], fontsize=7)
    ax.set_ylabel("MMCS of the first set to the second (|cos|)")
    ax.set_title(f"Each method against each other one ({spread_note(per_seed)})", fontsize=10)
    ax.set_ylim(0, 1.05)
    _legend_outside(ax)
    return _save(fig, path)


def plot_heatmap(per_seed: list[dict], path: Path) -> str:
    """Heat map: MMCS of row method's directions to column method's set (mean over seeds), random baseline in
    brackets."""
    plt = _plt()
    names = [m for m in METHODS if m in per_seed[0]["pairwise"]]
    k = len(names)
    M, B = np.full((k, k), np.nan), np.full((k, k), np.nan)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if a != b:
                M[i, j] = _ms([s["pairwise"][a][b]["mmcs"] for s in per_seed])[0]
                B[i, j] = _ms([s["pairwise"][a][b]["random"]["mmcs"] for s in per_seed])[0]
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    im = ax.imshow(M, vmin=0, vmax=1, cmap="viridis")
    for i in range(k):
        for j in range(k):
            text = "—" if i == j else f"{M[i, j]:.2f}\n({B[i, j]:.2f})"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="w" if i == j or M[i, j] < 0.6 else "k")
    ax.set_xticks(range(k), names, rotation=30)
    ax.set_yticks(range(k), names)
    ax.set_xlabel("candidate set")
    ax.set_ylabel("reference set (mean over its directions)")
    mean = f"mean over n = {len(per_seed)} seeds" if len(per_seed) > 1 else \
        f"seed {per_seed[0].get('seed', 0)} only, n = 1"
    ax.set_title(f"Pairwise MMCS, random baseline in brackets\n({mean})", fontsize=10)
    fig.colorbar(im, ax=ax, label="MMCS (|cos|)")
    return _save(fig, path)


def plot_faithfulness(per_seed: list[dict], path: Path) -> str:
    """Dots on a log axis: held-out FVU of each method's reconstruction of the block output, each value written
    beside its dot (a log axis shows ratios, so dots, not bars whose height would depend on the axis floor); with
    several seeds each seed's FVU as a small dot and the mean ± s.e. over seeds as the large one."""
    plt = _plt()
    rows = [("approximant", "function"), ("SPD CI-masked", "parameter"), ("SAE → block", "activation")]
    vals = [_ms([s[k]["fvu"] for s in per_seed]) for _, k in rows]
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    x = np.arange(len(rows))
    if len(per_seed) > 1:
        for i, (_, k) in enumerate(rows):
            v = [s[k]["fvu"] for s in per_seed]
            ax.plot(np.full(len(v), x[i] - 0.12), v, "o", ms=3, color="gray", alpha=0.7)
    yerr = _yerr(vals)
    if yerr is None:
        ax.plot(x, [m for m, _ in vals], "o", ms=7, color="tab:green")
    else:
        ax.errorbar(x, [m for m, _ in vals], yerr=yerr, fmt="o", ms=7, color="tab:green", capsize=4)
    for i, (m, se) in enumerate(vals):
        text = f"{m:.3g}" if se is None else \
            f"{m:.3g} ± {np.format_float_positional(se, precision=2, unique=True, fractional=False)}"
        ax.annotate(text, (x[i], m), xytext=(8, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yscale("log")
    finite = [m for m, _ in vals if np.isfinite(m) and m > 0]
    if finite:
        ax.set_ylim(min(finite) / 2.5, max(finite) * 2.5)
    ax.set_xlim(-0.5, len(rows) - 0.2)
    ax.set_xticks(x, [r for r, _ in rows])
    ax.set_ylabel("held-out FVU of the block output\n(log scale)")
    seeds = "; gray: each seed" if len(per_seed) > 1 else ""
    ax.set_title(f"Faithfulness on held-out inputs\n({spread_note(per_seed)}{seeds})", fontsize=10)
    return _save(fig, path)
