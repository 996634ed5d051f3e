"""``report.md`` / ``report.html`` of ``reproduce mfr``: the numbers of ``metrics.json`` filled into ``report.md.j2``
(mean ± standard error over seeds per (condition, k), the verdicts against the baseline, re-initialisation, the
SAEBench core metrics and, on a causal LM, the paper's Table 2 protocol)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlpinterp.sae.core_metrics import CORE_KEYS
from mlpinterp.studies import report as rep
from mlpinterp.studies.mfr.figures import summary_png
from mlpinterp.studies.mfr.settings import PAPER
from mlpinterp.utils.rundir import wall_time_statement

#: What each inactivity measure (:data:`mlpinterp.sae.inactivity.INACTIVITY_MEASURES`) scores, for the report.
INACTIVITY_FORMULAS = {
    "mean_relative_deviation": "mean_j |r_j / (k / d_sae) - 1| (the paper's example measure: 0 = uniform use, 1 = all "
                               "dead, 2 f for a fraction f of dead latents with the rest uniform)",
    "cubed_relative_deviation": "mean_j |r_j / (k / d_sae) - 1|^3 (0 = uniform use, 1 = all dead)",
}

_EXTRA_CORE = ("embedding_preservation.embedding_cossim_score", "model_behavior_preservation.kl_div_score",
               "model_performance_preservation.ce_loss_score")


def fmt_entry(e: dict, fmt: str = ".4f") -> str:
    """``mean ± se (n = N)`` of a summary entry; ``mean (n = 1)``; ``—`` when undefined."""
    if not np.isfinite(e["mean"]):
        return rep.DASH
    n = e.get("n", 0)
    if np.isfinite(e["se"]):
        return f"{e['mean']:{fmt}} ± {e['se']:{fmt}} (n = {n})"
    return f"{e['mean']:{fmt}} (n = {n})"


def _cell(v) -> str:
    return rep.DASH if v is None or not np.isfinite(v) else f"{v:.4g}"


def _by_k(per_k: dict) -> list[tuple[str, dict]]:
    return sorted(per_k.items(), key=lambda kv: int(kv[0]))


def _reinits(runs: list[dict], cond: str, k: int) -> str:
    """Total re-initialisations of a (condition, k) over its seeds, e.g. ``"0 in 3 seeds"``."""
    rs = [r for r in runs if r["condition"] == cond and r["k"] == k]
    return f"{sum(int(r.get('n_reinits', 0)) for r in rs)} in {len(rs)} seed{'s' if len(rs) != 1 else ''}"


def _synthetic(metrics: dict) -> dict:
    s, runs = metrics["summary"], metrics["runs"]
    paper = {"baseline": PAPER["synthetic_correlation_baseline"], "reinit": PAPER["synthetic_correlation_reinit"]}
    rows = [[k, cond, fmt_entry(e["mmcs_truth"]), fmt_entry(e["fvu"]), fmt_entry(e["mmcs_cross"]),
             fmt_entry(e["correlation"]), paper.get(cond, rep.DASH), _reinits(runs, cond, int(k))]
            for cond in s for k, e in _by_k(s[cond])]
    cluster = [[r["k"], r["condition"], r["seed"], r["shared_false"]["count"], f"{r['shared_false']['fraction']:.4f}",
                _cell(r["shared_false"]["rate_in_cluster"]), _cell(r["shared_false"]["rate_outside"])] for r in runs]
    return {"table": rep.md_table(["k", "condition", "MMCS to truth", "held-out FVU", "cross-SAE MMCS",
                                   "corr(cross, truth)", "paper corr", "re-initialisations"], rows),
            "cluster": rep.md_table(["k", "condition", "seed", "count", "fraction", "firing rate in cluster",
                                     "firing rate elsewhere"], cluster)}


def _table2(metrics: dict) -> str | None:
    """The paper's Table 2 protocol: next-token cross-entropy clean / SAE spliced in / zero-ablated and the loss
    recovered, per (k, condition), beside the paper's GPT-2 Small numbers; ``None`` without them."""
    s = metrics["summary"]
    rows = [[k, cond, fmt_entry(e["ce_clean"], ".3f"), fmt_entry(e["ce_spliced"], ".3f"),
             fmt_entry(e["ce_zero"], ".3f"), fmt_entry(e["loss_recovered"]), PAPER["gpt2_layer0_mlp_ce_clean"],
             PAPER["gpt2_layer0_mlp_ce_zero_ablated"]]
            for cond in s for k, e in _by_k(s[cond]) if "ce_spliced" in e]
    if not rows:
        return None
    return rep.md_table(["k", "condition", "CE clean", "CE spliced", "CE zero-ablated", "loss recovered",
                         "paper CE clean", "paper CE zero-ablated"], rows)


def _real(metrics: dict) -> dict:
    s, setting = metrics["summary"], metrics["setting"]
    down = {"minilm": ["cosine_recovered", "mse_recovered"], "eeg": []}.get(setting, ["loss_recovered"])
    rows = [[k, cond, *(fmt_entry(e[key]) for key in ["fvu", "l0", "dead_fraction", *down])]
            for cond in s for k, e in _by_k(s[cond])]
    improvement = [{"condition": cond, "values": ", ".join(f"k={k}: {v:+.2f} %" for k, v in imp.items())}
                   for cond, imp in metrics.get("improvement_pct", {}).items()]
    out = {"table": rep.md_table(["k", "condition", "held-out FVU", "L0", "dead fraction",
                                  *(d.replace("_", " ") for d in down)], rows),
           "improvement": improvement, "eeg": None, "figure": summary_png(setting == "lm"),
           "table2": _table2(metrics) if setting == "lm" else None, "model": metrics.get("model"),
           "hook_point": metrics.get("hook_point")}
    if setting == "eeg":
        d, tp = metrics["data"], metrics["throughput"]
        out["figure"] = "eeg_summary.png"
        out["eeg"] = {"files": d["files"], "dir": d["dir"], "held_out_files": len(d["held_out_files"]),
                      "channels": len(d["channels"]), "d_in": d["d_in"],
                      "train_vectors": f"{d['train_vectors']:,}", "held_out_vectors": f"{d['held_out_vectors']:,}",
                      "pipeline": f"{tp['pipeline_vectors_per_second']:,.0f}",
                      "training": f"{tp['train_vectors_per_second_median']:,.0f}",
                      "load": rep.fmt_load_average(tp.get("load_average"))}
    return out


def _core(metrics: dict) -> str | None:
    core = metrics.get("saebench_core", {})
    if not core:
        return None
    extra = [c for c in _EXTRA_CORE if any(c in e for cond in core.values() for e in cond.values())]
    cols = [f"{a}.{b}" for a, b in CORE_KEYS] + extra
    rows = [[k, cond, *(_cell(e.get(c)) for c in cols)] for cond, per_k in core.items() for k, e in _by_k(per_k)]
    return rep.md_table(["k", "condition", *(c.split(".")[1] for c in cols)], rows)


def context(metrics: dict) -> dict:
    """What ``report.md.j2`` shows, from the ``metrics.json`` content of a ``reproduce mfr`` run."""
    runs = metrics["runs"]
    kind = metrics.get("run_kind", "full")
    maxes = [r["max_inactivity"] for r in runs if isinstance(r.get("max_inactivity"), (int, float))
             and np.isfinite(r["max_inactivity"])]
    measure = metrics["experiment"].get("inactivity_measure", "cubed_relative_deviation")
    verdicts = rep.md_table(["k", "condition", "verdict", "why"],
                            [[v["k"], v["condition"], v["verdict"], v["reason"]] for v in metrics.get("verdicts", [])])
    return {"setting": metrics["setting"], "kind": kind, "n": len({r["seed"] for r in runs}), "paper": PAPER,
            "synthetic": _synthetic(metrics) if metrics["setting"] == "synthetic" else None,
            "real": None if metrics["setting"] == "synthetic" else _real(metrics), "verdicts": verdicts,
            "threshold": metrics["experiment"].get("inactivity_threshold", rep.DASH),
            "reinits": sum(int(r.get("n_reinits", 0)) for r in runs), "n_runs": len(runs),
            "reinits_per_run": ", ".join(map(str, sorted({int(r.get("n_reinits", 0)) for r in runs}))) or rep.DASH,
            "measure": measure, "measure_formula": INACTIVITY_FORMULAS.get(measure, measure),
            "max_inactivity": f"{max(maxes):.3g}" if maxes else None, "core": _core(metrics),
            "wall_time": wall_time_statement(metrics.get("seconds"), metrics.get("sessions"))}


def render_markdown(metrics: dict) -> str:
    """``report.md`` of an MFR run: :func:`context` filled into ``report.md.j2``."""
    return rep.render_template(__package__, "report.md.j2", context(metrics))


def write_mfr_report(out: str | Path, metrics: dict) -> tuple[Path, Path]:
    """Write ``out/report.md`` and the self-contained ``out/report.html`` (every figure embedded)."""
    return rep.write_report(out, render_markdown(metrics), title=f"MFR reproduction: {metrics['setting']}")
