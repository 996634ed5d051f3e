"""Aggregate per-seed results of ``reproduce polynomial`` and write ``report.md`` / ``report.html``.

The report puts each claim of Rigg & Belrose (2025, arXiv 2502.01032) beside our measurement (mean ± sample
standard deviation over seeds, with n; no spread for one seed) and a verdict with its one-line reason, drawn only
from full runs (a ``--quick`` run says "smoke run: not a reproduction"). Rendering goes through the shared
:mod:`mlpinterp.studies.report` (every figure embedded in ``report.html``).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from mlpinterp.studies import report as rep
from mlpinterp.studies.polynomial.evaluate import APPROXIMANTS
from mlpinterp.utils.rundir import wall_time_statement

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

CHANCE_SE = 3.0
""""At chance" means an accuracy at most this many binomial standard errors (of the test-set size) above chance."""


def _ms(values) -> dict:
    """Per-column statistics over seeds (axis 0): ``{"mean", "std", "n"}`` lists (``rep.summary`` of each column).

    ``None`` entries (a metric not computed for a seed) are left out; ``std`` is ``None`` where fewer than two
    seeds have a value, ``mean`` ``None`` where none has.
    """
    a = np.asarray(values, dtype=np.float64)  # None -> nan
    cols = [rep.summary(a[:, j]) for j in range(a.shape[1])]
    return {"mean": [c.mean for c in cols], "std": [c.std for c in cols], "n": [c.n for c in cols]}


def _stat(d: dict, i: int = -1) -> rep.Summary:
    """Entry ``i`` of an ``_ms`` dict (or a final-checkpoint dict, ``i`` ignored) as a ``Summary``."""
    if isinstance(d["mean"], list):
        return rep.Summary(d["mean"][i], d["std"][i], d["n"][i])
    return rep.Summary(d["mean"], d["std"], d["n"])


def _metric(entry: dict | None, key: str, sub: str | None):
    if entry is None:  # approximant not fitted at this checkpoint
        return None
    return entry[key][sub] if sub else entry[key]


def summarise(per_seed: list[dict], cfg: dict, data) -> dict:
    """Mean, std and n over seeds of every curve, the final values, the attack curves and the claims table."""
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
    final = {m: {k: {"mean": v["mean"][-1], "std": v["std"][-1], "n": v["n"][-1]} for k, v in d.items()}
             for m, d in curves.items()}
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


def _pct(st: rep.Summary, n: int | None = None) -> str:
    """A fraction as a percentage with one decimal: ``"36.9% ± 2.9%"`` (``n`` as in ``Summary.format``)."""
    return st.format(".1f", scale=100, unit="%", n=n)


def run_kind(cfg: dict) -> str:
    """``"smoke"`` for ``--quick`` runs (no verdicts), else ``"full"``."""
    return "smoke" if cfg.get("smoke") else "full"


#: Fold change that counts as a rise of the FVU over training (and below which a curve counts as flat): the
#: figures plot FVU on a log scale, so changes are compared as ratios.
FOLD = 1.5


def _row(claim: str, paper: str, ours: str, v: rep.Verdict) -> dict:
    return {"claim": claim, "paper": paper, "ours": ours, "verdict": v.status, "reason": v.reason}


def claims_table(res: dict) -> list[dict]:
    """The paper's claims beside our measurements, each with a verdict and its one-line reason.

    Each row: ``claim``, ``paper``, ``ours`` (mean ± std over seeds, n in the report's header), ``verdict``
    (``reproduced``, ``not reproduced``, ``worse than baseline``, ``not measured`` or, for a smoke run,
    ``smoke run: not a reproduction``) and ``reason``.
    """
    steps, cur, fin, att = res["steps"], res["curves"], res["final"], res["attack"]
    run = run_kind(res["config"])
    n = res["seeds"]
    chance = 1.0 / res["dataset"]["n_classes"]
    rows = []
    q = fin["quadratic_mixture"]
    fvu_mix, fvu_test = _stat(q["fvu_mixture"]), _stat(q["fvu_test"])
    expl = rep.Summary(1 - fvu_mix.mean, fvu_mix.std, fvu_mix.n)
    expl_test = rep.Summary(1 - fvu_test.mean, fvu_test.std, fvu_test.n)
    rows.append(_row(
        "The quadratic approximant explains > 95% of output variance at the end of training (Gaussian mixture, "
        "SGD-fitted in the paper)", "> 95%",
        f"{_pct(expl, n)} under the mixture (exact fit); {_pct(expl_test, n)} on the real test set",
        rep.verdict(expl.mean > 0.95, f"{100 * expl.mean:.1f}% explained under the mixture "
                    f"{'>' if expl.mean > 0.95 else '<='} 95%", run=run)))
    lin = cur["linear_mixture"]["fvu_mixture"]["mean"]
    quad_name = "quadratic_mixture" if None not in cur["quadratic_mixture"]["fvu_mixture"]["mean"] else "quadratic_gaussian"
    quad = cur[quad_name]["fvu_mixture"]["mean"]
    claim = "Linear FVU rises sharply from ~500-1K steps until ~4K, while quadratic FVU stays nearly flat"
    if steps[-1] >= 4096:
        i_early, i_late = _nearest(steps, 768), _nearest(steps, 4096)
        # judged as fold changes (the log scale of the figure), the linear and the quadratic change side by side
        rise = lin[i_late] / max(lin[i_early], 1e-12)
        window = [q for q in quad[i_early:] if q is not None]
        qfold = max(window) / max(min(window), 1e-12)
        ok = rise > FOLD and qfold < FOLD
        why = (f"on the log scale: linear FVU x{rise:.2f} ({'>' if rise > FOLD else '<='} x{FOLD}), quadratic FVU "
               f"range x{qfold:.2f} ({'<' if qfold < FOLD else '>='} x{FOLD}, {'flat' if qfold < FOLD else 'not flat'})")
        rows.append(_row(claim, "qualitative (Fig. 2)",
                         f"linear FVU {lin[i_early]:.3g} at step {steps[i_early]} -> {lin[i_late]:.3g} at step "
                         f"{steps[i_late]} (x{rise:.2f}); {quad_name.replace('_', ' ')} FVU from step {steps[i_early]} "
                         f"{min(window):.3g} to {max(window):.3g} (x{qfold:.2f})"
                         + (f" (means over {n} seeds)" if n > 1 else " (one seed)"),
                         rep.verdict(ok, why, run=run)))
    else:
        rows.append(_row(claim, "qualitative (Fig. 2)", f"not measured: the run stopped at step {steps[-1]} < 4096",
                         rep.verdict(None, f"training stopped at step {steps[-1]} < 4096", run=run)))
    ks = att["k"]
    net = att["svd"]["network"]
    if len(ks) > 4:
        a4, a_last = _stat(net, 4), _stat(net, -1)
        lin_curve = np.array(att["svd"]["linear_mixture"]["mean"])
        quad_curve = np.array(att["svd"]["quadratic_mixture"]["mean"])
        netc = np.array(net["mean"])
        gap = float(max(np.abs(lin_curve - netc).max(), np.abs(quad_curve - netc).max()))
        rnd4, pca4 = _stat(att["random"]["network"], 4), _stat(att["pca"]["network"], 4)
        raw4 = _stat(att["svd-raw"]["network"], 4)
        rows.append(_row(
            "Ablating the top 4 SVD directions of the linear approximant drops network accuracy below 50%",
            "< 50% at k = 4",
            f"{_pct(a4, n)} at k = 4 with directions of Cov(f, x) = B Sigma (raw B: {_pct(raw4, n)})",
            rep.verdict(a4.mean < 0.5, f"{100 * a4.mean:.1f}% {'<' if a4.mean < 0.5 else '>='} 50%", run=run)))
        best = min((rnd4.mean, "random"), (pca4.mean, "PCA"))
        rows.append(_row(
            "The SVD directions matter more than other directions: ablating them hurts more than ablating as many "
            "random or PCA directions (k = 4)", "implied (Fig. 5)",
            f"SVD {_pct(a4, n)}, random {_pct(rnd4, n)}, PCA {_pct(pca4, n)} network accuracy at k = 4",
            rep.verdict(a4.mean < best[0], f"SVD {100 * a4.mean:.1f}% vs {best[1]} {100 * best[0]:.1f}% "
                        f"(the most damaging baseline)", run=run, failed="worse than baseline")))
        se = math.sqrt(chance * (1 - chance) / res["dataset"]["n_test"])
        limit = chance + CHANCE_SE * se
        rows.append(_row(
            f"Ablating 10 SVD directions brings the network to chance ({100 * chance:.0f}%)", "≈ chance at k = 10",
            f"{_pct(a_last, n)} at k = {ks[-1]}",
            rep.verdict(a_last.mean <= limit if ks[-1] >= 10 else None,
                        f"{100 * a_last.mean:.1f}% {'<=' if a_last.mean <= limit else '>'} {100 * limit:.1f}% "
                        f"(chance + {CHANCE_SE:g} binomial s.e. of {res['dataset']['n_test']} test images)"
                        if ks[-1] >= 10 else f"attack stopped at k = {ks[-1]} < 10", run=run)))
        rows.append(_row(
            "Network and approximant accuracies fall in lockstep under the attack", "qualitative (Fig. 5)",
            f"largest network-vs-approximant accuracy gap over k = 0..{ks[-1]}: {100 * gap:.1f} points"
            + (f" (means over {n} seeds)" if n > 1 else " (one seed)"),
            rep.verdict(gap < 0.15, f"largest gap {100 * gap:.1f} {'<' if gap < 0.15 else '>='} 15 points", run=run)))
    return rows


def write_csv(res: dict, out: Path) -> None:
    """``curves.csv`` (one row per step and approximant) and ``attack.csv``."""
    with open(out / "curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        metrics = list(METRICS)
        w.writerow(["step", "approximant"] + [f"{m}_{s}" for m in metrics for s in ("mean", "std", "n")])
        for i, step in enumerate(res["steps"]):
            for name, d in res["curves"].items():
                if name == "network":
                    continue
                w.writerow([step, name] + [d[m][s][i] for m in metrics for s in ("mean", "std", "n")])
    with open(out / "attack.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "model", "k", "accuracy_mean", "accuracy_std", "n"])
        for method in ATTACKS:
            for model, d in res["attack"][method].items():
                for k, m, s, c in zip(res["attack"]["k"], d["mean"], d["std"], d["n"], strict=True):
                    w.writerow([method, model, k, m, s, c])


FIGURES = [
    ("fvu_vs_step.png", "FVU over training (paper Fig. 2)"),
    ("kl_vs_step.png", "KL divergence over training (paper Fig. 3)"),
    ("accuracy_vs_step.png", "Test accuracy of the network and its approximants"),
    ("features.png", "Feature images: linear rows and top quadratic eigenvectors per class (paper Fig. 1)"),
    ("svd_attack.png", "SVD ablation attack with random and PCA baselines (paper Fig. 5)"),
    ("attack_grid.png", "Attacked test images with true and predicted labels (paper Fig. 4)"),
]
"""(file under ``figures/``, caption) of every figure of the report, in order."""


def _spread_note(n: int) -> str:
    return f"mean ± std over {n} seeds" if n > 1 else "n = 1: no spread shown"


def context(res: dict) -> dict:
    """What ``report.md.j2`` shows, assembled from the run's aggregated results ``res`` (:func:`summarise` plus
    ``wall_seconds``): the claims table, the final-checkpoint table, the setup numbers and the figures."""
    c, n = res["config"], res["seeds"]
    rows = []
    for name, d in res["final"].items():
        if name == "network":
            continue
        rows.append([name] + [_stat(d[m]).format(".4f", n=n) for m in
                              ("fvu_mixture", "fvu_test", "kl_test", "test_accuracy", "top1_agreement_test")])
    rows.append(["network", rep.DASH, rep.DASH, rep.DASH,
                 _stat(res["final"]["network"]["test_accuracy"]).format(".4f", n=n), rep.DASH])
    final = rep.md_table(["approximant", "FVU (mixture)", "FVU (test)", "KL test (nats)", "test accuracy",
                          "top-1 agreement"], rows, align=["l", "r", "r", "r", "r", "r"])
    return {"c": c, "ds": res["dataset"], "n": n, "run": run_kind(c), "arch": c["arch"].upper(),
            "every_checkpoint": None not in res["curves"]["quadratic_mixture"]["fvu_mixture"]["mean"],
            "wall": wall_time_statement(res.get("wall_seconds"), res.get("sessions")), "covariance": c.get("covariance", "ledoit-wolf"),
            "claims": md_table_claims(res["claims"], n), "final": final, "spread_note": _spread_note(n),
            "figures": [{"path": f"figures/{f}", "title": t} for f, t in FIGURES]}


def render_markdown(res: dict) -> str:
    """``report.md`` of a run: :func:`context` filled into ``report.md.j2``."""
    return rep.render_template(__package__, "report.md.j2", context(res))


def md_table_claims(claims: list[dict], n: int) -> str:
    """The claims table: claim, paper, ours (with the seed count in the header), verdict with its reason."""
    rows = [[r["claim"], r["paper"], r["ours"],
             str(rep.Verdict(r["verdict"], r.get("reason", "")))] for r in claims]
    return rep.md_table(["claim", "paper", f"ours ({_spread_note(n)})", "verdict"], rows)


def write_report(res: dict, out: Path) -> tuple[Path, Path]:
    """Write the CSVs, ``report.md`` and the self-contained ``report.html`` into ``out``; returns the two paths.

    Every figure of :data:`FIGURES` must exist under ``out/figures`` (``FileNotFoundError`` naming it otherwise).
    """
    out = Path(out)
    write_csv(res, out)
    title = f"{res['dataset']['name']}: polynomial approximants ({res['config']['arch']})"
    return rep.write_report(out, render_markdown(res), title)
