"""Aggregate per-seed results of ``reproduce polynomial`` and write ``report.md`` / ``report.html``.

The report puts each claim of Rigg & Belrose (2025, arXiv 2502.01032) beside our measurement
(mean +- std over seeds) and says plainly where ours differs.
"""

from __future__ import annotations

import base64
import csv
import html
import warnings
from pathlib import Path

import numpy as np

from mlpinterp.experiments.polynomial_eval import APPROXIMANTS
from mlpinterp.utils.io import atomic_write_bytes

ATTACKS = ("svd", "svd-raw", "random", "pca")
"""Ablation directions of the attack (see ``polynomial_eval.svd_attack``)."""

METRICS = {
    "fvu_mixture": ("fvu_mixture", "fvu"),
    "fvu_test": ("fvu_test", "fvu"),
    "kl_test": ("kl_test", "nats"),
    "kl_mixture": ("kl_mixture", "nats"),
    "test_accuracy": ("test_accuracy", None),
    "top1_agreement_test": ("top1_agreement_test", None),
}


def _ms(values) -> dict:
    """Mean and std over seeds (axis 0); entries missing in every seed (None) stay None."""
    a = np.asarray(values, dtype=np.float64)  # None -> nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-nan columns
        mean = np.nanmean(a, 0)
        std = np.nanstd(a, 0, ddof=1) if a.shape[0] > 1 else np.zeros(a.shape[1:])

    def clean(x):
        return [None if not np.isfinite(v) else float(v) for v in np.atleast_1d(x)]

    return {"mean": clean(mean), "std": clean(np.where(np.isfinite(mean), np.nan_to_num(std), np.nan))}


def _metric(entry: dict | None, key: str, sub: str | None):
    if entry is None:  # approximant not fitted at this checkpoint
        return None
    return entry[key][sub] if sub else entry[key]


def summarise(per_seed: list[dict], cfg: dict, data) -> dict:
    """Mean +- std over seeds of every curve, the final values, the attack curves and the claims table."""
    steps = [c["step"] for c in per_seed[0]["curves"]]
    for s in per_seed[1:]:
        if [c["step"] for c in s["curves"]] != steps:
            raise ValueError("seeds have different checkpoint steps; delete the output directory and rerun")
    names = [n for n, _, _ in APPROXIMANTS if n in per_seed[0]["curves"][-1]["approximants"]]
    curves: dict = {"network": {"test_accuracy": _ms([[c["network"]["test_accuracy"] for c in s["curves"]]
                                                     for s in per_seed])}}
    for name in names:
        curves[name] = {}
        for metric, (key, sub) in METRICS.items():
            vals = [[_metric(c["approximants"].get(name), key, sub) for c in s["curves"]] for s in per_seed]
            curves[name][metric] = _ms(vals)
    final = {m: {k: {"mean": v["mean"][-1], "std": v["std"][-1]} for k, v in d.items()} for m, d in curves.items()}
    attack = {"k": per_seed[0]["attack"]["k"]}
    for method in ATTACKS:
        attack[method] = {m: _ms([s["attack"][method][m] for s in per_seed]) for m in per_seed[0]["attack"][method]}
    results = {
        "config": cfg,
        "dataset": {"name": data.name, "n_train": int(data.X_train.shape[0]), "n_test": int(data.X_test.shape[0]),
                    "d_in": int(data.d_in), "n_classes": int(data.n_classes)},
        "steps": steps, "curves": curves, "final": final, "attack": attack, "seeds": len(per_seed),
    }
    results["claims"] = claims_table(results)
    return results


def _nearest(steps: list[int], target: int) -> int:
    return int(np.argmin([abs(np.log(s) - np.log(target)) for s in steps]))


def _fmt(m: float, s: float, pct: bool = False) -> str:
    """``mean ± std`` (as percentages with ``pct``)."""
    return f"{100 * m:.1f}% ± {100 * s:.1f}" if pct else f"{m:.4f} ± {s:.4f}"


def _ms_str(d: dict) -> str:
    return _fmt(d["mean"], d["std"])


def claims_table(res: dict) -> list[dict]:
    """The paper's claims beside our measurements, each with a plain verdict."""
    steps, cur, fin, att = res["steps"], res["curves"], res["final"], res["attack"]
    chance = 1.0 / res["dataset"]["n_classes"]
    rows = []
    q = fin["quadratic_mixture"]
    expl = 1 - q["fvu_mixture"]["mean"]
    expl_test = 1 - q["fvu_test"]["mean"]
    rows.append({
        "claim": "The quadratic approximant explains > 95% of output variance at the end of training (Gaussian mixture, SGD-fitted in the paper)",
        "paper": "> 95%",
        "ours": f"{_fmt(expl, q['fvu_mixture']['std'], True)} under the mixture (exact fit); "
                f"{_fmt(expl_test, q['fvu_test']['std'], True)} on the real test set",
        "verdict": "reproduced" if expl > 0.95 else "not reproduced",
    })
    lin = cur["linear_mixture"]["fvu_mixture"]["mean"]
    quad_name = "quadratic_mixture" if None not in cur["quadratic_mixture"]["fvu_mixture"]["mean"] else "quadratic_gaussian"
    quad = cur[quad_name]["fvu_mixture"]["mean"]
    if steps[-1] >= 4096:
        i_early, i_late = _nearest(steps, 768), _nearest(steps, 4096)
        rise = lin[i_late] / max(lin[i_early], 1e-12)
        qchange = max(quad[i_early:]) - min(quad[i_early:])
        lchange = lin[i_late] - lin[i_early]
        rows.append({
            "claim": "Linear FVU rises sharply from ~500-1K steps until ~4K, while quadratic FVU stays nearly flat",
            "paper": "qualitative (Fig. 2)",
            "ours": f"linear FVU {lin[i_early]:.3f} at step {steps[i_early]} -> {lin[i_late]:.3f} at step {steps[i_late]} "
                    f"(x{rise:.2f}); {quad_name.replace('_', ' ')} FVU range after step {steps[i_early]}: {qchange:.3f}",
            "verdict": "reproduced" if (rise > 1.5 and qchange < abs(lchange)) else "not reproduced",
        })
    else:
        rows.append({"claim": "Linear FVU rises sharply from ~500-1K steps until ~4K, quadratic nearly flat",
                     "paper": "qualitative (Fig. 2)", "ours": f"not measured: training stopped at step {steps[-1]} < 4096",
                     "verdict": "not measured"})
    ks = att["k"]
    net = att["svd"]["network"]
    if len(ks) > 4:
        a4, a_last = net["mean"][4], net["mean"][-1]
        lin_curve = np.array(att["svd"]["linear_mixture"]["mean"])
        quad_curve = np.array(att["svd"]["quadratic_mixture"]["mean"])
        netc = np.array(net["mean"])
        gap = float(max(np.abs(lin_curve - netc).max(), np.abs(quad_curve - netc).max()))
        rnd4, pca4 = att["random"]["network"]["mean"][4], att["pca"]["network"]["mean"][4]
        raw4 = att["svd-raw"]["network"]["mean"][4]
        rows.append({
            "claim": "Ablating the top 4 SVD directions of the linear approximant drops network accuracy below 50%",
            "paper": "< 50% at k = 4",
            "ours": f"{_fmt(a4, net['std'][4], True)} at k = 4 with directions of Cov(f, x) = B Sigma (raw B: {100 * raw4:.1f}%; "
                    f"baselines: random {100 * rnd4:.1f}%, PCA {100 * pca4:.1f}%)",
            "verdict": "reproduced" if a4 < 0.5 else "not reproduced",
        })
        rows.append({
            "claim": f"Ablating 10 SVD directions brings the network to chance ({100 * chance:.0f}%)",
            "paper": "≈ chance at k = 10",
            "ours": f"{_fmt(a_last, net['std'][-1], True)} at k = {ks[-1]}",
            "verdict": "reproduced" if a_last < 2 * chance else "not reproduced",
        })
        rows.append({
            "claim": "Network and approximant accuracies fall in lockstep under the attack",
            "paper": "qualitative (Fig. 5)",
            "ours": f"largest network-vs-approximant accuracy gap over k = 0..{ks[-1]}: {100 * gap:.1f} points",
            "verdict": "reproduced" if gap < 0.15 else "not reproduced",
        })
    return rows


def write_csv(res: dict, out: Path) -> None:
    """``curves.csv`` (one row per step and approximant) and ``attack.csv``."""
    with open(out / "curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        metrics = list(METRICS)
        w.writerow(["step", "approximant"] + [f"{m}_{s}" for m in metrics for s in ("mean", "std")])
        for i, step in enumerate(res["steps"]):
            for name, d in res["curves"].items():
                if name == "network":
                    continue
                w.writerow([step, name] + [d[m][s][i] for m in metrics for s in ("mean", "std")])
    with open(out / "attack.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "model", "k", "accuracy_mean", "accuracy_std"])
        for method in ATTACKS:
            for model, d in res["attack"][method].items():
                for k, m, s in zip(res["attack"]["k"], d["mean"], d["std"], strict=True):
                    w.writerow([method, model, k, m, s])


FIGURES = [
    ("fvu_vs_step.png", "FVU over training (paper Fig. 2)"),
    ("kl_vs_step.png", "KL divergence over training (paper Fig. 3)"),
    ("accuracy_vs_step.png", "Test accuracy of the network and its approximants"),
    ("features.png", "Feature images: linear rows and top quadratic eigenvectors per class (paper Fig. 1)"),
    ("svd_attack.png", "SVD ablation attack with random and PCA baselines (paper Fig. 5)"),
    ("attack_grid.png", "Attacked test images (paper Fig. 4)"),
]


def _markdown(res: dict) -> str:
    c, ds = res["config"], res["dataset"]
    lines = [
        f"# Polynomial approximants of a one-hidden-layer {c['arch'].upper()} on {ds['name']}",
        "",
        "Reproduction of Rigg & Belrose (2025), *Converting MLPs into Polynomials in Closed Form* (arXiv 2502.01032), "
        "with every approximant computed **exactly** (no SGD), several seeds, baselines for the attack, and FVU on the "
        "real test set as well as under the Gaussian mixture.",
        "",
        f"Setup: {ds['name']} ({ds['n_train']} train / {ds['n_test']} test, d_in = {ds['d_in']}), width {c['d_hidden']}, "
        f"{c['activation']}, schedule-free AdamW lr {c['lr']}, weight decay 0.1, batch 64, warm-up {c['warmup_steps']}, "
        f"{c['steps']} steps, {res['seeds']} seeds; Monte Carlo under the mixture with {c['mc_samples']} samples; "
        f"wall time {res.get('wall_seconds', float('nan')):.0f} s. Exact mixture quadratic fitted at "
        + ("every checkpoint." if None not in res["curves"]["quadratic_mixture"]["fvu_mixture"]["mean"]
           else "the final checkpoint only (matrix-free CG; `--quadratic-mixture-steps all` fits every checkpoint)."),
        "",
        "## Claims",
        "",
        "| claim | paper | ours (mean ± std over seeds) | verdict |",
        "|---|---|---|---|",
    ]
    for r in res["claims"]:
        lines.append(f"| {r['claim']} | {r['paper']} | {r['ours']} | {r['verdict']} |")
    lines += ["", "## Final checkpoint", "", "| approximant | FVU (mixture) | FVU (test) | KL test (nats) | test accuracy | top-1 agreement |",
              "|---|---|---|---|---|---|"]
    for name, d in res["final"].items():
        if name == "network":
            continue
        lines.append(f"| {name} | {_ms_str(d['fvu_mixture'])} | {_ms_str(d['fvu_test'])} | {_ms_str(d['kl_test'])} | "
                     f"{_ms_str(d['test_accuracy'])} | {_ms_str(d['top1_agreement_test'])} |")
    n = res["final"]["network"]["test_accuracy"]
    lines += [f"| network | | | | {_ms_str(n)} | |", ""]
    lines += ["Differences from the paper, plainly: the paper fits the mixture quadratic by SGD from the N(0, I) "
              "solution because it calls the exact solve intractable; ours is the exact least-squares optimum. "
              "The paper reports one seed; we report mean ± std. FVU on real test images is not in the paper. "
              f"Class covariances: {c.get('covariance', 'ledoit-wolf')} (Ledoit-Wolf shrinkage keeps nearly constant pixels "
              "from receiving huge least-squares coefficients; `--covariance empirical` gives the unshrunk, singular "
              "setting, solved on its support).", ""]
    lines += ["## Figures", ""]
    for fname, title in FIGURES:
        lines += [f"### {title}", "", f"![{title}](figures/{fname})", ""]
    return "\n".join(lines)


def write_report(res: dict, out: Path) -> None:
    """Write ``report.md``, a self-contained ``report.html`` (figures inlined) and the CSVs into ``out``."""
    out = Path(out)
    write_csv(res, out)
    md = _markdown(res)
    atomic_write_bytes(out / "report.md", md.encode())
    body = []
    in_table = False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [html.escape(x.strip()) for x in line.strip("|").split("|")]
            if set(line) <= set("|-"):
                continue
            if not in_table:
                body.append("<table>")
                in_table = True
                body.append("<tr>" + "".join(f"<th>{x}</th>" for x in cells) + "</tr>")
            else:
                body.append("<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("!["):
            fname = line[line.index("(") + 1 : -1]
            p = out / fname
            if p.exists():
                b64 = base64.b64encode(p.read_bytes()).decode()
                body.append(f'<img src="data:image/png;base64,{b64}" style="max-width:100%">')
        elif line.startswith("### "):
            body.append(f"<h3>{html.escape(line[4:])}</h3>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.strip():
            body.append(f"<p>{html.escape(line).replace('**', '')}</p>")
    if in_table:
        body.append("</table>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>mlpinterp report</title><style>"
            "body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;font-size:14px}</style></head><body>"
            + "\n".join(body) + "</body></html>")
    atomic_write_bytes(out / "report.html", page.encode())
