"""``report.md`` / ``report.html`` of ``reproduce three-spaces``: the measured numbers of a run filled into
``report.md.j2``, with plain sentences on which method recovers what and where the methods disagree."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlpinterp.studies.report import DASH, figure, md_table, render_template, summary, write_report
from mlpinterp.studies.three_spaces import figures as figs
from mlpinterp.studies.three_spaces.settings import METHOD_LABELS, METHODS, RECOVERED_COSINE, TOYS

ABOVE_RANDOM_SE = 3.0
"""A pairwise MMCS counts as above its random baseline when it exceeds the baseline's mean by more than 3 combined
standard errors, as below it when it falls short by more than that, and as indistinguishable from it otherwise: the
MMCS's s.e. (over seeds, or over the reference directions for one seed) and the baseline's (over its draws, seeds
pooled), in quadrature."""


def mean_se(values, fmt: str) -> str:
    """``"m ± s.e."``: the mean over seeds and its standard error (sample std / sqrt(n)); ``"m"`` for one seed, which
    has no spread across seeds (the report states n and the statistic once)."""
    values = list(values)
    return summary(values).format(fmt, spread="se", n=len(values)).replace(f" (s.e., n = {len(values)})", "")


def count_cell(values) -> str:
    """A count (directions, features, alive latents) over seeds: the integer itself for one seed (``"18"``), the
    mean ± s.e. with one decimal for several (``"17.7 ± 0.3"``)."""
    values = list(values)
    return f"{round(values[0]):d}" if len(values) == 1 else mean_se(values, ".1f")


def count_mean(values) -> str:
    """The mean of a count over seeds for a sentence: the integer for one seed, one decimal for several."""
    values = list(values)
    return f"{round(values[0]):d}" if len(values) == 1 else f"{float(np.mean(values)):.1f}"


def mmcs_mean_se(entries: list[dict]) -> tuple[float, float]:
    """Mean MMCS and its s.e.: over seeds for several, over the reference directions (``mmcs_se``) for one (0 when
    not recorded)."""
    v = [x["mmcs"] for x in entries]
    if len(v) > 1:
        return float(np.mean(v)), float(np.std(v, ddof=1) / np.sqrt(len(v)))
    se = entries[0].get("mmcs_se")
    return float(v[0]), float(se) if se is not None and np.isfinite(se) else 0.0


def _mmcs_cell(entries: list[dict]) -> str:
    m, se = mmcs_mean_se(entries)
    return f"{m:.3f} ± {se:.3f}"


def _pooled_se(values: list[float]) -> float:
    """Standard error of the mean of per-seed means, each itself with a standard error (quadrature mean)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)])
    return float(np.sqrt((v**2).sum()) / v.size) if v.size else float("nan")


def truth_table(per: list[dict]) -> tuple[str, list[str]]:
    """The ground-truth table and one sentence per method."""
    names = [m for m in METHODS if m in per[0]["truth"]]
    n_feat = len(per[0]["truth"][names[0]]["max_cos"])
    rows, lines = [], []
    for m in names:
        t = [s["truth"][m] for s in per]
        rows.append([METHOD_LABELS[m], count_cell([x["count"] for x in t]), _mmcs_cell(t),
                     mean_se([x["random"]["mmcs"] for x in t], ".3f"), count_cell([x["recovered"] for x in t]),
                     mean_se([x["random"]["recovered"] for x in t], ".2f"), count_cell([x["distinct"] for x in t])])
        rec = count_mean([x["recovered"] for x in t])
        rnd = float(np.mean([x["random"]["recovered"] for x in t]))
        lines.append(f"{METHOD_LABELS[m]} recover {rec} of {n_feat} true features at |cos| ≥ {RECOVERED_COSINE} "
                     f"(random sets of the same size: {rnd:.2f}); MMCS {np.mean([x['mmcs'] for x in t]):.3f} against "
                     f"{np.mean([x['random']['mmcs'] for x in t]):.3f} at random.")
    spread = "s.e. over seeds" if len(per) > 1 else "s.e. over the true features"
    head = ["method", "directions", f"MMCS to truth (± {spread})",
            "random MMCS (uniform on the support, same count; mean over draws)",
            f"features recovered (|cos| ≥ {RECOVERED_COSINE}, of {n_feat})", "random recovered (mean over draws)",
            "distinct directions recovering"]
    return md_table(head, rows), lines


def spd_per_feature_line(per: list[dict]) -> str | None:
    """The SPD paper's resid-MLP criterion (features with exactly one causally important input-site subcomponent on
    their one-hot input), over seeds; None when the run has no such count."""
    if "per_feature" not in per[0]["parameter"]:
        return None
    f = [s["parameter"]["per_feature"] for s in per]
    n = f[0]["n_features"]
    one = [x["features_with_one_subcomponent"] for x in f]
    return (f"SPD's {f[0]['site']} (the SPD paper's criterion, one-hot inputs 0.75 e_i): "
            f"{count_cell(one)} of {n} features have exactly one causally important subcomponent "
            f"(per seed: {', '.join(str(v) for v in one)}; {sum(v == n for v in one)} of {len(one)} seeds all {n}); "
            f"distinct owners {', '.join(str(x['distinct_owners']) for x in f)}; identity-pattern errors "
            f"{', '.join(str(x['identity_ci_error']) for x in f)}.")


def recovery_summary(per: list[dict], share: float = 0.9) -> list[str]:
    """Plain sentences: which methods recover at least ``share`` of the true features (mean over seeds), which do
    not, and for each pair of methods how many features one recovers and the other does not (mean over seeds)."""
    names = [m for m in METHODS if m in per[0]["truth"]]
    n_feat = len(per[0]["truth"][names[0]]["max_cos"])
    rec = {m: float(np.mean([s["truth"][m]["recovered"] for s in per])) for m in names}
    shown = {m: count_mean([s["truth"][m]["recovered"] for s in per]) for m in names}
    yes = [f"{METHOD_LABELS[m]} ({shown[m]})" for m in names if rec[m] >= share * n_feat]
    no = [f"{METHOD_LABELS[m]} ({shown[m]})" for m in names if rec[m] < share * n_feat]
    where = f"at least {share:.0%} of the {n_feat} true features at |cos| ≥ {RECOVERED_COSINE}, mean over " \
            f"n = {len(per)} seed{'s' if len(per) > 1 else ''}"
    out = [f"Recover the planted features ({where}): {', '.join(yes)}." if yes else
           f"No method recovers {where}."]
    if no:
        out.append(f"{'Do not' if yes else 'Recovered'}: {', '.join(no)}.")
    hits = {m: [np.asarray(s["truth"][m]["max_cos"]) >= RECOVERED_COSINE for s in per] for m in names}
    diffs = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ab = [int((x & ~y).sum()) for x, y in zip(hits[a], hits[b], strict=True)]
            ba = [int((y & ~x).sum()) for x, y in zip(hits[a], hits[b], strict=True)]
            if any(ab) or any(ba):
                diffs.append(f"{a} not {b} {count_mean(ab)}, {b} not {a} {count_mean(ba)}")
    if diffs:
        out.append(f"Where they disagree on the truth (features recovered by one method and not the other, mean over "
                   f"seeds): {'; '.join(diffs)}.")
    return out


def pairwise_table(per: list[dict]) -> tuple[str, dict[str, list[str]]]:
    """The pairwise table and the ordered pairs by verdict against their random baseline (:data:`ABOVE_RANDOM_SE`):
    ``{"above": [...], "below": [...], "within": [...]}``, each entry ``"a → b (mmcs vs random)"``."""
    names = [m for m in METHODS if m in per[0]["pairwise"]]
    rows, verdicts = [], {"above": [], "below": [], "within": []}
    for a in names:
        for b in names:
            if a == b:
                continue
            p = [s["pairwise"][a][b] for s in per]
            mm, mse = mmcs_mean_se(p)
            rm = float(np.mean([x["random"]["mmcs"] for x in p]))
            rse = _pooled_se([x["random"]["mmcs_se"] for x in p])
            margin = ABOVE_RANDOM_SE * float(np.hypot(mse, rse))
            verdict = "above" if mm - rm > margin else "below" if rm - mm > margin else "within"
            verdicts[verdict].append(f"{a} → {b} ({mm:.3f} vs {rm:.3f})")
            rows.append([f"{a} → {b}", f"{p[0]['count_a']} → {p[0]['count_b']}", f"{mm:.3f} ± {mse:.3f}",
                         f"{rm:.3f} ± {rse:.3f}", {"above": "yes", "below": "no (below)", "within": "no (within)"}[
                             verdict]])
    spread = "s.e. over seeds" if len(per) > 1 else "s.e. over the reference's directions"
    head = ["reference → candidates", "directions", f"MMCS (mean over the reference's directions; ± {spread})",
            "random from the input covariance (± s.e. over draws)",
            f"above random (difference > {ABOVE_RANDOM_SE:g} combined s.e.; below: short of it by as much; within: "
            "neither)"]
    return md_table(head, rows), verdicts


def faithfulness_table(per: list[dict]) -> str:
    f = [s["function"] for s in per]
    p = [s["parameter"] for s in per]
    a = [s["activation"] for s in per]
    ci = ", ".join(f"{site}: {mean_se([s['parameter']['ci_l0'][site] for s in per], '.2f')}" for site in p[0]["ci_l0"])
    alive = ", ".join(f"{site}: {count_cell([s['parameter']['alive'][site] for s in per])}"
                      for site in p[0]["alive"])
    rows = [[f"approximant (degree 2, {f[0]['chosen']})", mean_se([x["fvu"] for x in f], ".3g"), DASH,
             f"candidates' held-out FVU: gaussian {mean_se([x['candidates']['gaussian']['fvu'] for x in f], '.3g')}, "
             f"data {mean_se([x['candidates']['data']['fvu'] for x in f], '.3g')}"],
            ["SPD, CI-masked forward", mean_se([x["fvu"] for x in p], ".3g"), f"CI L0 {ci}",
             f"C = {p[0]['C']}, {p[0]['steps']} steps at batch {p[0]['batch_size']}; alive {alive}"],
            ["SAE reconstruction fed to the block", mean_se([x["fvu"] for x in a], ".3g"),
             f"L0 {mean_se([x['l0'] for x in a], '.2f')}",
             f"d_sae {a[0]['d_sae']}, k {a[0]['k']}; input FVU {mean_se([x['fvu_input'] for x in a], '.3g')}; "
             f"alive {count_cell([x['alive'] for x in a])}"]]
    return md_table(["method", "held-out FVU of the block output", "sparsity", "notes"], rows)


def downstream_table(per: list[dict]) -> str | None:
    if "downstream" not in per[0]:
        return None
    d0 = per[0]["downstream"]
    lm = d0["kind"] == "lm"
    rows = []
    for name in ("approximant", "sae", "spd", "zero"):
        vals = [s["downstream"][name] for s in per]
        rows.append([name, mean_se([v["ce" if lm else "cos"] for v in vals], ".4g"),
                     mean_se([v["recovered"] for v in vals], ".3f")])
    head = ["replaces the block", "next-token CE (nats/token)" if lm else "sentence-embedding cosine to clean",
            "loss recovered vs zero ablation" if lm else "cosine recovered vs zero ablation"]
    note = (f"clean CE {mean_se([s['downstream']['clean']['ce'] for s in per], '.4g')}; " if lm else "") + \
        f"{d0['n_sequences']} held-out sequences; special tokens keep the exact block output"
    return md_table(head, rows) + f"\n\n{note}."


def write(out: Path, results: dict) -> list[str]:
    """Draw the figures into ``out/figures`` and write ``out/report.md`` / ``report.html``; returns the figure
    file names."""
    per = results["per_seed"]
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    toy = results["setting"] in TOYS
    made = {}
    if toy:
        made["truth"] = figs.plot_truth_mmcs(per, fig_dir / "mmcs_per_method.png")
        made["recovered"] = figs.plot_recovered(per, fig_dir / "recovered_counts.png",
                                                len(next(iter(per[0]["truth"].values()))["max_cos"]))
    else:
        made["pairwise_bars"] = figs.plot_pairwise_mmcs(per, fig_dir / "mmcs_per_method.png")
    made["heatmap"] = figs.plot_heatmap(per, fig_dir / "pairwise_heatmap.png")
    made["faithfulness"] = figs.plot_faithfulness(per, fig_dir / "faithfulness.png")
    pair, verdicts = pairwise_table(per)
    truth, truth_lines = truth_table(per) if toy else (None, [])
    spd_line = spd_per_feature_line(per)
    support = [s.get("support_dim") for s in per]
    shares = {m: float(np.mean([s["share_on_support"][m]["mean"] for s in per])) for m in per[0].get(
        "share_on_support", {})}
    ctx = {"r": results, "quick": results["preset"] == "quick", "toy": toy, "n": len(per),
           "seed": per[0].get("seed", 0),
           "truth_table": truth, "truth_lines": truth_lines, "pairwise_table": pair, "spd_line": spd_line,
           "recovery": recovery_summary(per) if toy else [], "support_dim": support[0],
           "shares": ", ".join(f"{METHOD_LABELS[m]} {v:.2f}" for m, v in shares.items()), "verdicts": verdicts, "faithfulness_table": faithfulness_table(per),
           "downstream_table": downstream_table(per), "block": per[0]["block"], "methods": METHOD_LABELS,
           "chosen": sorted({s["function"]["chosen"] for s in per}), "threshold": RECOVERED_COSINE,
           "above_se": ABOVE_RANDOM_SE,
           "figures": {k: figure(f"figures/{v}", k.replace("_", " ")) for k, v in made.items()}}
    write_report(out, render_template("mlpinterp.studies.three_spaces", "report.md.j2", ctx), title=f"Three spaces: {results['setting']}")
    return sorted(made.values())
