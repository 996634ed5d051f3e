"""``report.md`` / ``report.html`` of ``reproduce transformer``: the numbers of ``results.json`` filled into
``report.md.j2`` (goals per block, per-block tables, Gaussianity diagnostics, timing, every figure)."""

from __future__ import annotations

from pathlib import Path

from mlpinterp.studies import report as rep
from mlpinterp.studies.report import fmt_value, md_table, verdict
from mlpinterp.studies.transformer.figures import make_figures
from mlpinterp.studies.transformer.values import GAUSS_TAIL, LABEL, get, splice_value
from mlpinterp.utils.rundir import wall_time_statement


def _fvu(v: dict | None) -> str:
    """``"fvu ± se"`` (one standard error over tokens), ``"—"`` when not measured."""
    if v is None:
        return rep.DASH
    se = v.get("fvu_se", v.get("se"))
    return fmt_value(v["fvu"], ".4g") + (f" ± {se:.2g}" if se else "")


def _goals(results: dict, run: str, kind: str) -> str:
    models, degrees = results["config"]["input_models"], results["config"]["degrees"]
    rows = []
    for lay in results["layers"]:
        rec = lay["recommended"]
        ols = get(lay, "data", 1, "heldout", "fvu")
        best2 = min((v for m in models if (v := get(lay, m, 2, "heldout", "fvu")) is not None), default=None)
        mono = [get(lay, rec, n, "heldout", "fvu") for n in degrees]
        ok_mono = all(a is not None and b is not None and b <= a * (1 + 1e-9)
                      for a, b in zip(mono, mono[1:], strict=False))
        cos2 = splice_value(lay, rec, 2) if kind == "embedding" else None
        rows.append([lay["layer"], rec, fmt_value(ols), fmt_value(best2),
                     verdict(None if best2 is None or ols is None else best2 < ols,
                             f"{fmt_value(best2)} vs OLS {fmt_value(ols)}", run=run, failed="worse than baseline"),
                     verdict(ok_mono, " -> ".join(fmt_value(v) for v in mono), run=run, failed="not reproduced"),
                     verdict(None if cos2 is None else cos2 >= 0.95,
                             f"cosine {fmt_value(cos2, '.4f')} (zero ablation "
                             f"{fmt_value(lay['splice']['zero']['cos'], '.4f')}, mean ablation "
                             f"{fmt_value(lay['splice']['mean']['cos'], '.4f')})", run=run)
                     if kind == "embedding" else rep.DASH])
    return md_table(["block", "recommended input model (validation)" + (" — indicative only" if run != "full" else ""),
                     "linear OLS held-out FVU", "best degree-2 held-out FVU", "degree 2 beats OLS",
                     "degree n+1 never worse (recommended)", "degree-2 splice keeps embedding cosine >= 0.95"], rows)


def _block(lay: dict, results: dict, kind: str) -> dict:
    models, degrees = results["config"]["input_models"], results["config"]["degrees"]
    rows = []
    for m in models:
        for n in degrees:
            e = lay["models"].get(m, {}).get(str(n))
            if e is None:
                continue
            s = lay["splice"]["models"].get(m, {}).get(str(n), {})
            rows.append([LABEL[m], n, _fvu(e["under_model"]), _fvu(e["heldout"]), fmt_value(e["heldout"]["cosine"], ".4f"),
                         fmt_value(s.get("cos" if kind == "embedding" else "ce"), ".4f"),
                         fmt_value(s.get("recovered_vs_zero"), ".3f"), fmt_value(s.get("recovered_vs_mean"), ".3f")])
    sp, key = lay["splice"], "cos" if kind == "embedding" else "ce"
    out = {"layer": lay["layer"], "path": lay["path"], "family": lay["family"],
           "table": md_table(["input model", "degree", "FVU under the model", "held-out FVU", "held-out cosine",
                              "embedding cosine (splice)" if kind == "embedding" else "CE spliced (nats)",
                              "recovered vs zero", "recovered vs mean"], rows),
           "splice": {"n": sp["n_sequences"], "key": key, "zero": fmt_value(sp["zero"][key], ".4f"),
                      "mean": fmt_value(sp["mean"][key], ".4f"),
                      "clean": fmt_value(sp["clean"]["ce"], ".4f") if kind == "lm" else None},
           "degree3": None, "features": None, "sae": None, "tokens": None}
    g2, g3 = get(lay, "gaussian", 2, "heldout", "fvu"), get(lay, "gaussian", 3, "heldout", "fvu")
    d = lay["diagnostics"]
    if g2 is not None and g3 is not None and g3 > g2:
        out["degree3"] = {"g2": f"{g2:.4g}", "g3": f"{g3:.4g}", "m2": _fvu(get(lay, "gaussian", 2, "under_model")),
                          "m3": _fvu(get(lay, "gaussian", 3, "under_model")),
                          "tail": f"{100 * d.get('neuron_tail_fraction', float('nan')):.2f}",
                          "gauss_tail": f"{100 * GAUSS_TAIL:.2f}",
                          "kurtosis": f"{d.get('neuron_excess_kurtosis_median', float('nan')):.2f}"}
    f = lay.get("features")
    if f:
        out["features"] = {"model": lay["recommended"], "variance": f"{100 * f['output_variance_fraction'][0]:.1f}",
                           "eigenvalues": ", ".join(f"{v:.3g}" for v in f["eigenvalues"][0][:5]),
                           "top": len(f["eigenvalues"][0]), "energy": f"{100 * f['top_energy'][0]:.1f}"}
        if f.get("sae"):
            a = f["sae"]
            out["sae"] = {"d_sae": a["d_sae"], "hook_point": a["hook_point"], "n": len(a["max_cos"]),
                          "max_cos": ", ".join(f"{v:.2f}" for v in a["max_cos"]), "random": f"{a['random_mean']:.2f}",
                          "p95": f"{a['random_p95']:.2f}", "above": f"{100 * a['fraction_above_random_p95']:.0f}"}
        if f.get("output_direction_tokens"):
            t = f["output_direction_tokens"][0]
            out["tokens"] = {"positive": ", ".join(map(repr, t["positive"][:6])),
                             "negative": ", ".join(map(repr, t["negative"][:6]))}
    return out


def _diagnostics(layers: list[dict]) -> str:
    rows = [[lay["layer"], fmt_value(lay["diagnostics"].get("neuron_tail_fraction"), ".4f"),
             fmt_value(lay["diagnostics"].get("neuron_excess_kurtosis_median"), ".3g"),
             fmt_value(lay["diagnostics"].get("neuron_w1_median"), ".3g"),
             fmt_value(lay["diagnostics"].get("neuron_bimodality_fraction"), ".3f"),
             len(lay["diagnostics"]["outlier_dims"]), fmt_value(lay["diagnostics"]["outlier_variance_fraction"], ".3f"),
             fmt_value(max(lay["diagnostics"]["pc_excess_kurtosis"]), ".3g")] for lay in layers]
    return md_table(["block", "pre-activation tail fraction", "median neuron excess kurtosis", "median W1 to N(0,1)",
                     "bimodal neurons", "outlier dims", "variance in outlier dims",
                     "max excess kurtosis (top-10 PCs)"], rows)


def _timing(layers: list[dict]) -> str:
    steps = ("gaussian_fit", "gaussian", "data", "mixture", "hybrid", "block")
    rows = [[lay["layer"]] + [f"{fmt_value(lay['timing_s'].get(k), '.1f')} "
                              f"({fmt_value(lay.get('cpu_s', {}).get(k), '.1f')})" for k in steps] for lay in layers]
    return md_table(["block", "Gaussian fit", "Gaussian FVUs", "data", "mixture", "hybrid", "whole block"], rows)


def _hybrid_steps(layers: list[dict], degrees: list[int]) -> str | None:
    """The hybrid fine-tuning's best validated step and last step per block and degree (``None``: no hybrid run)."""
    hyb = [(lay["layer"], n, lay["hybrid_steps"][str(n)]) for lay in layers for n in degrees
           if str(n) in lay.get("hybrid_steps", {}) and lay["hybrid_steps"][str(n)]["best_step"] is not None]
    if not hyb:
        return None
    rows = [[layer, n, h["best_step"], fmt_value(h["best_fvu_val"], ".3g"), h["last_step"],
             fmt_value(h["last_fvu_val"], ".3g")] for layer, n, h in hyb]
    return md_table(["block", "degree", "best step", "FVU (best)", "last step", "FVU (last)"], rows)


def context(results: dict, figs: list[tuple[str, str]]) -> dict:
    """What ``report.md.j2`` shows, from ``results.json`` and the figures made (``(path, caption)`` pairs)."""
    cfg, layers, cap = results["config"], results["layers"], results["capture"]
    kind = layers[0]["splice"]["kind"] if layers else "embedding"
    return {"model": results["model"], "run": cfg["run"], "n_layers": len(layers), "n_blocks": results["n_blocks"],
            "fit_tokens": f"{cap['n_fit_tokens']:,}", "heldout_tokens": f"{cap['n_heldout_tokens']:,}",
            "n_heldout": cap["n_heldout_tokens"], "tokens_per_s": f"{cap['tokens_per_s']:,.0f}",
            "degrees": cfg["degrees"], "models": ", ".join(LABEL[m] for m in cfg["input_models"]),
            "wall_time": wall_time_statement(results["seconds"], results.get("sessions")),
            "hybrid_steps": _hybrid_steps(layers, cfg["degrees"]), "goals": _goals(results, cfg["run"], kind),
            "blocks": [_block(lay, results, kind) for lay in layers], "lm": kind == "lm",
            "diagnostics": _diagnostics(layers), "gauss_tail": GAUSS_TAIL, "timing": _timing(layers),
            "fig": {Path(path).stem: rep.figure(path, alt) for path, alt in figs}}


def build_markdown(results: dict, figs: list[tuple[str, str]]) -> str:
    """``report.md`` of a run: :func:`context` filled into ``report.md.j2``."""
    return rep.render_template(__package__, "report.md.j2", context(results, figs))


def write_transformer_report(out: Path, results: dict) -> tuple[Path, Path]:
    """Figures under ``out/figures`` and ``out/report.md`` + self-contained ``out/report.html``."""
    figs = make_figures(Path(out), results)
    return rep.write_report(out, build_markdown(results, figs), title=f"FFN blocks of {results['model']}")
