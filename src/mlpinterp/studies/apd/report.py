"""``report.md`` / ``report.html`` of ``reproduce apd``: the numbers of ``metrics.json`` filled into
``report.md.j2`` (our mean ± std over seeds beside the paper's Table 1, per-seed values, every figure, the
configuration)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mlpinterp.studies import report as rep
from mlpinterp.studies.paramspace.statistics import FAILED_MMCS
from mlpinterp.utils.rundir import wall_time_statement

SUMMARY_KEYS = ("mmcs", "ml2r", "gt_param_mmcs", "topk_mse", "scrubbed_mse", "anti_scrubbed_mse",
                "per_feature_mse_top1_mean", "dead_components", "topk_output_mse", "seconds")
"""Per-seed metrics summarised over seeds (those every seed of the setting has)."""

FIGURES = {"tms": (("losses.png", "losses"), ("components.png", "target columns and APD components")),
           "resid": (("losses.png", "losses"), ("scrubbing_hist.png", "scrubbing: MSE to the target"),
                     ("neuron_contributions.png", "neuron contributions")),
           "gated": (("losses.png", "losses"), ("functions.png", "target and APD top-1 functions"))}
"""Per-seed figures of each setting family: (file under ``seed{s}/``, caption)."""


def figures(result: dict) -> list[dict]:
    """``{"path", "title"}`` of every per-seed figure of the run (paths relative to its directory)."""
    names = FIGURES[result["setting"].split("-")[0]]
    return [{"path": f"seed{m['seed']}/{f}", "title": f"Seed {m['seed']}: {t}"}
            for m in result["per_seed"] for f, t in names]


def context(result: dict) -> dict:
    """What ``report.md.j2`` shows, from the ``metrics.json`` content ``result`` of :func:`reproduce`."""
    paper, per = result["paper"], result["per_seed"]
    kind = rep.run_kind(result["quick"], result.get("overrides"))
    n = len(per)
    keys = [k for k in SUMMARY_KEYS if all(k in m for m in per)]
    rows = [[k, rep.mean_std([m[k] for m in per], ".4g"), rep.paper_pm(*paper[k]) if k in paper else rep.DASH]
            for k in keys]
    ctx = {"setting": result["setting"], "title_note": rep.run_kind_note(kind, result.get("overrides")),
           "fidelity": result.get("fidelity", "ours"), "n": n, "device": result.get("device", "cpu"),
           "threads": result["threads"], "load": result.get("load_average"),
           "wall_time": wall_time_statement(result.get("wall_seconds"), result.get("sessions")),
           "summary": rep.md_table(["metric", "ours (mean ± std over seeds)", "paper (one run; ± over features)"],
                                   rows),
           "per_seed": rep.md_table(["seed", *keys], [[m["seed"], *(rep.fmt_value(m[k], ".4g") for k in keys)]
                                                     for m in per]),
           "figures": figures(result), "config": json.dumps(result["config"], indent=1), "mmcs": None,
           "verdict": rep.verdict(None, "the paper reports this setting qualitatively (figures)", run=kind)}
    if "mmcs" in keys and "mmcs" in paper:
        mm = [m["mmcs"] for m in per]
        failed = sum(v < FAILED_MMCS for v in mm)
        ctx["verdict"] = rep.verdict(
            abs(float(np.mean(mm)) - paper["mmcs"][0]) <= max(2 * paper["mmcs"][1], 0.002),
            f"MMCS {np.mean(mm):.4f} (n = {n}) vs the paper's {paper['mmcs'][0]:.3f}; {failed} of {n} seeds below "
            f"{FAILED_MMCS}", run=kind)
        ps = result["paper_statistic"]
        ctx["mmcs"] = {"failed": failed, "bar": FAILED_MMCS, "ps": ps,
                       "ours_mmcs": rep.paper_pm(ps["mmcs"], ps["mmcs_std_over_features"]),
                       "ours_ml2r": rep.paper_pm(ps["ml2r"], ps["ml2r_std_over_features"]),
                       "paper_mmcs": rep.paper_pm(*paper["mmcs"]), "paper_ml2r": rep.paper_pm(*paper["ml2r"])}
    return ctx


def render_markdown(result: dict) -> str:
    """``report.md`` of an APD run: :func:`context` filled into ``report.md.j2``."""
    return rep.render_template(__package__, "report.md.j2", context(result))


def write_apd_report(out: str | Path, result: dict) -> tuple[Path, Path]:
    """Write ``out/report.md`` and the self-contained ``out/report.html`` (every figure embedded)."""
    return rep.write_report(out, render_markdown(result), title=f"APD reproduction: {result['setting']}")
