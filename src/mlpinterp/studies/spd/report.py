"""``report.md`` / ``report.html`` of ``reproduce spd``: the numbers of ``metrics.json`` filled into ``report.md.j2``
(per-seed values, failed seeds, our mean ± std beside the paper's statistic and, given an APD run, APD's)."""

from __future__ import annotations

import json
from pathlib import Path

from mlpinterp.spd.metrics import ALIVE_THRESHOLD, ONE_HOT_VALUE
from mlpinterp.studies import report as rep
from mlpinterp.studies.paramspace.statistics import FAILED_MMCS, paper_statistic
from mlpinterp.studies.spd.goals import COACTIVE, DMLP_BAND, resid_goal
from mlpinterp.studies.spd.settings import APD_PAPER, PAPER
from mlpinterp.toys.settings import setting_spec
from mlpinterp.utils.rundir import wall_time_statement


def _way(ps: dict | None) -> str:
    """The papers' statistic: ``"MMCS / ML2R (seed s)"``, ± over features."""
    if ps is None:
        return rep.DASH
    return (f"{rep.paper_pm(ps['mmcs'], ps['mmcs_std_over_features'])} / "
            f"{rep.paper_pm(ps['ml2r'], ps['ml2r_std_over_features'])} (seed {ps['seed']})")


def _cited(paper: dict | None) -> str:
    return rep.DASH if paper is None else f"{rep.paper_pm(*paper['mmcs'])} / {rep.paper_pm(*paper['ml2r'])}"


def apd_tables(result: dict, setting: str) -> dict:
    """SPD and APD on the same targets, seed by seed, with both statistics: ``{"statistics", "per_seed"}`` tables."""
    apd, per = result["apd"], {m["seed"]: m for m in result["per_seed"]}
    seeds = apd["seeds"]
    spd_mm, spd_l2 = [per[s]["mmcs"] for s in seeds], [per[s]["ml2r"] for s in seeds]

    def fails(v):
        return f"{int(sum(x < FAILED_MMCS for x in v))} of {len(v)}"

    rows = [["MMCS, mean ± std over seeds", rep.mean_std(spd_mm, ".4f"), rep.mean_std(apd["mmcs"], ".4f")],
            ["ML2R, mean ± std over seeds", rep.mean_std(spd_l2, ".4f"), rep.mean_std(apd["ml2r"], ".4f")],
            [f"failed seeds (MMCS < {FAILED_MMCS})", fails(spd_mm), fails(apd["mmcs"])],
            ["the papers' statistic (best of the first 3 seeds, ± over features): MMCS / ML2R",
             _way(paper_statistic([per[s] for s in seeds]) if seeds else None), _way(apd["paper_statistic"])],
            ["the paper's own numbers: MMCS / ML2R", _cited(PAPER[setting]), _cited(APD_PAPER.get(setting))]]
    body = [[s, f"{per[s]['mmcs']:.4f}", f"{per[s]['ml2r']:.4f}", f"{a:.4f}", f"{b:.4f}"]
            for s, a, b in zip(seeds, apd["mmcs"], apd["ml2r"], strict=True)]
    return {"dir": apd["dir"], "fidelity": apd["fidelity"], "preset": "quick" if apd["quick"] else "paper",
            "steps": apd["steps"], "n": len(seeds),
            "statistics": rep.md_table(["statistic", "SPD", "APD"], rows),
            "per_seed": rep.md_table(["seed", "SPD MMCS", "SPD ML2R", "APD MMCS", "APD ML2R"], body)}


def _tms(result: dict, kind: str) -> dict:
    setting, per = result["setting"], result["per_seed"]
    n, ps, paper = len(per), result["paper_statistic"], PAPER[setting]
    ok = [m["mmcs"] >= 0.999 and abs(m["ml2r"] - 1) <= 0.02 for m in per]
    few = "" if n >= 10 else f"; only {n} seed{'' if n == 1 else 's'} run, too few to decide that goal"
    v = rep.verdict(sum(ok) >= 0.9 * n, f"{sum(ok)} of {n} seeds with MMCS ≥ 0.999 and |ML2R − 1| ≤ 0.02 "
                    f"(goal: ≥ 9 of 10 seeds{few})", run=kind)
    apd_paper = APD_PAPER.get(setting)
    rows = [["MMCS", rep.mean_std(result["mmcs"], ".4f"), rep.paper_pm(ps["mmcs"], ps["mmcs_std_over_features"]),
             rep.paper_pm(*paper["mmcs"]), rep.paper_pm(*apd_paper["mmcs"]) if apd_paper else rep.DASH],
            ["ML2R", rep.mean_std(result["ml2r"], ".4f"), rep.paper_pm(ps["ml2r"], ps["ml2r_std_over_features"]),
             rep.paper_pm(*paper["ml2r"]), rep.paper_pm(*apd_paper["ml2r"]) if apd_paper else rep.DASH]]
    head = ["seed", "MMCS", "ML2R", "MMCS / ML2R over alive subcomponents", "distinct matches", "MMCS linear2",
            "alive per site", "CI-masked MSE", "stochastic-masked MSE", "seconds"]
    body = [[m["seed"], f"{m['mmcs']:.4f}", f"{m['ml2r']:.4f}",
             f"{m['mmcs_alive']:.4f} / {m['ml2r_alive']:.4f}" if "mmcs_alive" in m else rep.DASH,
             m["distinct_matches"], f"{m['mmcs_linear2']:.4f}", ", ".join(f"{k}: {v}" for k, v in m["alive"].items()),
             f"{m['ci_masked_mse']:.3g}", f"{m['stochastic_masked_mse']:.3g}", f"{m['seconds']:.0f}"] for m in per]
    return {"verdict": v, "failed": result["failed_seeds"],
            "result": rep.md_table(
                ["metric", "SPD ours: mean ± std over seeds",
                 f"SPD ours, the paper's way (seed {ps['seed']}, best of {ps['of_seeds']}; ± over "
                 f"{ps['n_features']} features)", "SPD paper (one run; ± over features)",
                 "APD paper (one run; ± over features)"], rows),
            "per_seed": rep.md_table(head, body), "identity": setting.endswith("-id"),
            "apd": apd_tables(result, setting) if "apd" in result else None}


def _resid(result: dict, kind: str) -> dict:
    setting, per = result["setting"], result["per_seed"]
    head = ["seed", "alive per site", "features with exactly one W_in subcomponent", "distinct owners",
            "features covered", "features served only by their own W_in subcomponents", "W_in identity-pattern errors",
            "W_out: used on one-hot inputs / always / co-activity", "W_out dense-pattern errors (k = d_mlp)",
            "CI-masked MSE", "scrubbed MSE", "anti-scrubbed MSE", "anti / scrubbed", "seconds"]
    join = lambda d: ", ".join(f"{k}: {v}" for k, v in d.items())
    body = [[m["seed"], join(m["alive"]), join(m["features_with_one_subcomponent"]), join(m["features_one_distinct"]),
             m["features_covered"], m["features_monosemantic"], join(m["identity_ci_error"]),
             ", ".join(f"{k}: {v['used']} / {v['always']} / {rep.fmt_value(v['fraction'], '.2f')}"
                       for k, v in m["mlp_out_one_hot"].items()),
             join(m["dense_ci_error"]), f"{m['ci_masked_mse']:.3g}", f"{m['scrubbed_mse']:.3g}",
             f"{m['anti_scrubbed_mse']:.3g}", f"{m['anti_scrubbed_mse'] / max(m['scrubbed_mse'], 1e-300):.2f}",
             f"{m['seconds']:.0f}"] for m in per]
    good = [resid_goal(m, setting_spec(setting).n_features) for m in per]
    v = rep.verdict(all(good), f"{sum(good)} of {len(per)} seeds meet the goal (every W_in site: each of the features "
                    "has exactly one important subcomponent, distinct and important for that feature alone; W_out: "
                    f"{1 - DMLP_BAND:.0%}-{1 + DMLP_BAND:.0%} of d_mlp subcomponents used, co-activity ≥ {COACTIVE}; "
                    "anti-scrubbed ≥ 3 × scrubbed MSE)", run=kind)
    return {"verdict": v, "result": rep.md_table(head, body), "one_hot": ONE_HOT_VALUE, "alive": ALIVE_THRESHOLD}


def figures(result: dict) -> list[dict]:
    """``{"path", "title"}`` of every per-seed figure of the run (paths relative to its directory)."""
    extra = ("components.png", "target columns and SPD subcomponents") if result["setting"].startswith("tms") \
        else ("scrubbing_hist.png", "scrubbing: MSE to the target")
    out = []
    for m in result["per_seed"]:
        for f, t in (("losses.png", "losses"), ("ci_per_feature.png", "causal importance per feature"), extra):
            out.append({"path": f"seed{m['seed']}/{f}", "title": f"Seed {m['seed']}: {t}"})
    return out


def context(result: dict) -> dict:
    """What ``report.md.j2`` shows, from the ``metrics.json`` content ``result`` of :func:`reproduce`."""
    setting, per = result["setting"], result["per_seed"]
    kind = rep.run_kind(result["quick"], result.get("overrides"))
    cfg = result["config"]
    tms = setting.startswith("tms")
    return {"setting": setting, "title_note": rep.run_kind_note(kind, result.get("overrides")), "n": len(per),
            "current": result.get("recipe", "paper") == "current", "cfg": cfg, "device": result["device"],
            "threads": result["threads"], "load": result.get("load_average"),
            "target_fidelity": result.get("target_fidelity", "ours"),
            "reference_resid": result.get("target_fidelity") == "reference" and not tms,
            "tied": "; ".join(f"{b} = {a}ᵀ" for a, b in cfg.get("tied", ())), "failed_bar": FAILED_MMCS,
            "tied_separate": cfg.get("tied_updates") == "separate",
            "lower_sigmoid": cfg.get("lower_sigmoid", "leaky"),
            "wall_time": wall_time_statement(result.get("wall_seconds"), result.get("sessions")),
            "tms": _tms(result, kind) if tms else None, "resid": None if tms else _resid(result, kind),
            "figures": figures(result), "config": json.dumps(cfg, indent=1)}


def render_markdown(result: dict) -> str:
    """``report.md`` of an SPD run: :func:`context` filled into ``report.md.j2``."""
    return rep.render_template(__package__, "report.md.j2", context(result))


def write_spd_report(out: str | Path, result: dict) -> tuple[Path, Path]:
    """Write ``out/report.md`` and the self-contained ``out/report.html`` (every figure embedded)."""
    return rep.write_report(out, render_markdown(result), title=f"SPD reproduction: {result['setting']}")
