"""Reproduction of Marks et al. 2024 (MFR, arXiv 2411.01220): synthetic data and real MiniLM activations.

``run_synthetic``: for every ``k`` (TopK k = active features per sample K) and seed, these conditions on the
same data stream: ``baseline`` (N independent SAEs), ``reinit`` (re-initialisation only), ``mfr``
(penalty + re-initialisation, the paper's automatic alpha) and ``mfr_alpha{a}`` for each fixed penalty weight
``a`` in ``extra_alphas`` (the automatic alpha is about 1 on these FVU losses and, at the quick budget, makes
the SAEs copy each other before they learn the data; a smaller fixed alpha is the control a user needs). Measured: Hungarian MMCS of each SAE to the true features, FVU on held-out
data, the correlation between cross-SAE similarity and similarity to the truth (paper sec. 4.1: 0.625
baseline, 0.668 with re-initialisation) and the shared-but-false feature cluster with its firing rate.

``run_minilm``: SAEs on the residual stream of all-MiniLM-L6-v2 (default ``encoder.layer.3.output``) fed by
the bundled text; baseline vs MFR per ``k``: FVU, L0, dead fraction and sentence-embedding loss recovered.
The paper's real-model experiment is on GPT-2 Small (reconstruction improved by up to 21.21 %); MiniLM is
the embedded stand-in, so only the direction of the effect is comparable.

Every trained SAE also gets SAEBench's core metrics (:mod:`mlpinterp.sae.core_metrics`; on MiniLM with the
sentence-embedding cosine, on causal LMs with the KL-divergence and CE-loss scores) under ``saebench_core``.

Outputs in ``out``: ``metrics.json``, ``report.md`` and the self-contained ``report.html`` (every figure embedded,
through the shared :mod:`mlpinterp.studies.report`), PNG figures, and one directory of SAEs per run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from mlpinterp.sae.analysis import cross_truth_correlation, mmcs_to_truth, shared_false_cluster
from mlpinterp.sae.core_metrics import CORE_KEYS, core_metrics
from mlpinterp.sae.metrics import firing_counts, mmcs
from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
from mlpinterp.sae.synthetic import SyntheticConfig, SyntheticData
from mlpinterp.sae.topk import SaeConfig
from mlpinterp.studies.report import figure, write_report
from mlpinterp.utils.io import atomic_write_bytes, atomic_write_json

PAPER = {
    "synthetic_correlation_baseline": 0.625,
    "synthetic_correlation_reinit": 0.668,
    "gpt2_max_reconstruction_improvement_pct": 21.21,
    "eeg_max_reconstruction_improvement_pct": 6.67,
    "gpt2_layer0_mlp_ce_clean": 3.12,
    "gpt2_layer0_mlp_ce_zero_ablated": 132.27,
}
"""Numbers quoted in Marks et al. 2024 (abstract and sec. 4)."""

CONDITIONS = {"baseline": (False, False), "reinit": (False, True), "mfr": (True, True)}
"""Condition -> (penalty, reinit)."""


def conditions(base: tuple[str, ...], alpha: float | None,
               extra_alphas: tuple[float, ...]) -> dict[str, tuple[bool, bool, float | None]]:
    """Condition name -> (penalty, reinit, alpha): the ``base`` names of :data:`CONDITIONS` with ``alpha``,
    then ``mfr_alpha{a}`` (penalty + re-initialisation) for every fixed weight ``a`` in ``extra_alphas``.

    Raises ``ValueError`` for a negative or non-finite extra alpha."""
    out = {name: (*CONDITIONS[name], alpha) for name in base}
    for a in extra_alphas:
        if not (np.isfinite(a) and a >= 0):
            raise ValueError(f"extra_alphas must hold finite weights >= 0, got {a!r}")
        out[f"mfr_alpha{a:g}"] = (True, True, float(a))
    return out


@dataclass(frozen=True)
class MfrRuns:
    """The runs of every MFR setting: k values x seeds x conditions (baseline, MFR, fixed-alpha MFR)."""

    k_values: tuple[int, ...] = (6, 12, 18, 24, 30)
    """TopK k values."""

    seeds: int = 3
    """Seeds per (k, condition)."""

    n_saes: int = 2
    """SAEs trained in parallel."""

    alpha: float | None = None
    """MFR penalty weight; None: initial penalty = initial reconstruction loss (the paper's rule)."""

    extra_alphas: tuple[float, ...] = (0.1,)
    """Fixed penalty weights run as extra conditions ``mfr_alpha{a}``."""

    optimizer: str = "adam"
    """SAE optimiser (:class:`MfrConfig` ``optimizer``); Adam, as the paper."""

    auxk_alpha: float = 0.0
    """Weight of the AuxK loss; 0, as the paper's SAEs (AuxK revives the dead latents re-initialisation acts on)."""

    inactivity_measure: str = "mean_relative_deviation"
    """Inactivity measure (:data:`mlpinterp.sae.mfr.INACTIVITY_MEASURES`): the paper's example by default."""

    inactivity_threshold: float = 1.0
    """Re-initialise an SAE whose measure exceeds this (the paper's threshold for its measure)."""



@dataclass(frozen=True)
class SyntheticExperiment(MfrRuns):
    """Settings of the synthetic reproduction (defaults: the paper's data, G=512, d=256, E=12, lambda=0.99)."""

    k_values: tuple[int, ...] = (6, 12, 18, 24, 30)
    """TopK k, also the number of active features K per sample."""

    steps: int = 4000
    """Optimisation steps per run."""

    batch_size: int = 1024
    """Samples per step."""

    d_sae: int = 512
    """Latents (= G, the number of true features)."""

    tied: bool = True
    """Tied decoder (the paper's setting)."""

    reinit_until_frac: float = 0.5
    """No re-initialisation in the second half of training."""

    eval_samples: int = 8192
    """Held-out samples for FVU and firing rates."""

    @classmethod
    def quick(cls, **kw) -> SyntheticExperiment:
        """A pipeline check within minutes on a CPU: k = 6, 2 seeds, 400 steps of 512 samples."""
        return cls(**{"k_values": (6,), "seeds": 2, "steps": 400, "batch_size": 512, "eval_samples": 4096, **kw})


def _eval_saes(trainer: MfrTrainer, x: torch.Tensor) -> tuple[list[float], np.ndarray, list[float]]:
    """FVU per SAE, firing rates ``[N, d_sae]`` and L0 per SAE on held-out ``x`` (at the weights that are saved)."""
    fvus, rates, l0s = [], [], []
    with torch.no_grad(), trainer.averaged() as saes:
        for sae in saes:
            out = sae(x.to(sae.device, sae.dtype))
            fvus.append(float(out.fvu))
            rates.append((firing_counts(out.latent_acts, out.latent_indices, sae.cfg.d_sae).double()
                          / x.shape[0]).numpy())
            l0s.append(float((out.latent_acts > 0).sum(-1).double().mean()))
    return fvus, np.stack(rates), l0s


def run_synthetic(out: str | os.PathLike, exp: SyntheticExperiment = SyntheticExperiment(), *,
                  quiet: bool = False, device: str = "cpu") -> dict:
    """Run the synthetic reproduction; resumes finished runs from ``out/runs/*/result.json``."""
    conds = conditions(tuple(CONDITIONS), exp.alpha, exp.extra_alphas)  # validates before anything is written
    with open_mfr_run(out, exp) as rd:
        return _run_synthetic(rd, exp, conds, quiet, device)


def _run_synthetic(rd: RunDir, exp: SyntheticExperiment, conds: dict, quiet: bool, device: str) -> dict:
    out = rd.path
    results: list[dict] = []
    for k in exp.k_values:
        for seed in range(exp.seeds):
            data = SyntheticData(SyntheticConfig(k_active=k, seed=seed))
            held = data.batch(10_000_000, exp.eval_samples).x  # far beyond any training index
            for cond, (penalty, reinit, alpha) in conds.items():
                run_dir = out / "runs" / f"k{k}_seed{seed}_{cond}"
                done = run_dir / "result.json"
                if done.exists():
                    results.append(json.loads(done.read_text()))
                    continue
                base = results[-1] if cond == "reinit" else None
                if base is not None and base["condition"] == "baseline" and not base.get("would_reinit", True):
                    # Re-initialisation is a deterministic function of the trajectory: if the baseline's
                    # inactivity measure never crossed the threshold, the reinit run is the baseline run.
                    res = {**base, "condition": "reinit", "reused_baseline": True}
                    atomic_write_json(done, res)
                    results.append(res)
                    continue
                cfg = MfrConfig(sae=SaeConfig(d_sae=exp.d_sae, k=k, tied=exp.tied), n_saes=exp.n_saes,
                                penalty=penalty, reinit=reinit, inactivity_threshold=exp.inactivity_threshold,
                                alpha=alpha, optimizer=exp.optimizer, auxk_alpha=exp.auxk_alpha,
                                inactivity_measure=exp.inactivity_measure,
                                reinit_until=int(exp.steps * exp.reinit_until_frac), seed=1000 + seed)
                trainer = MfrTrainer(256, cfg, device=device)
                trainer.load_checkpoint(run_dir)
                t0 = time.time()
                trainer.fit(data.stream(exp.batch_size, start=trainer.step), exp.steps, quiet=quiet,
                            checkpoint_dir=run_dir, checkpoint_every=max(exp.steps // 4, 1),
                            desc=f"k={k} seed={seed} {cond}")
                decs = [s.W_dec.detach().cpu() for s in trainer.saes]
                fvus, rates, l0s = _eval_saes(trainer, held)
                res = {
                    "k": k, "seed": seed, "condition": cond, "seconds": time.time() - t0,
                    "mmcs_truth": [mmcs_to_truth(w, data.features) for w in decs],
                    "mmcs_cross": float(np.mean([float(mmcs(decs[i].double(), decs[j].double()))
                                                 for i in range(len(decs)) for j in range(i + 1, len(decs))])),
                    "fvu": fvus, "l0": l0s, "dead_fraction": [float((r == 0).mean()) for r in rates],
                    "correlation": cross_truth_correlation(decs, data.features),
                    "shared_false": shared_false_cluster(decs, data.features, rates),
                    "n_reinits": len(trainer.reinit_events), "alpha": trainer.alpha,
                    "would_reinit": any(c["measure"] > exp.inactivity_threshold and c["step"] <= cfg.reinit_until
                                        for c in trainer.checks),
                    "max_inactivity": max((c["measure"] for c in trainer.checks), default=float("nan")),
                    "inactivity_threshold": exp.inactivity_threshold,
                    "saebench_core": [core_metrics(sae, held) for sae in trainer.saes],
                }
                atomic_write_json(done, res)
                results.append(res)
    summary = _summarise(results, ["mmcs_truth", "fvu", "mmcs_cross", "correlation", "n_reinits"])
    metrics = {"setting": "synthetic", "experiment": asdict(exp), "run_kind": _run_kind(exp), "paper": PAPER,
               "runs": results, "summary": summary, "verdicts": _verdicts(results, "mmcs_truth", _run_kind(exp)),
               "saebench_core": _core_summary(results), "seconds": rd.wall_seconds, "sessions": rd.sessions}
    atomic_write_json(out / "metrics.json", metrics)
    _figures_synthetic(out, exp, results)
    _report(out, metrics)
    return metrics


@contextmanager
def open_mfr_run(out: str | os.PathLike, exp) -> Iterator[RunDir]:
    """Open ``out`` for ``reproduce mfr`` with ``exp`` (:func:`mlpinterp.utils.rundir.open_run`): every field,
    the k values and seeds included, must match a run already there (a report of another set of runs would
    silently cover a subset); the wall time is summed over the sessions."""
    config = {"experiment": type(exp).__name__, **asdict(exp)}
    with open_run(out, "reproduce mfr", config, check=lambda path: _guard_settings(path, exp)) as rd:
        yield rd


def _guard_settings(out: Path, exp) -> None:
    """Refuse a directory whose ``experiment.json`` (written before ``run.json`` existed) holds other settings."""
    want = {k: v for k, v in asdict(exp).items() if k not in ("k_values", "seeds")}
    want = json.loads(json.dumps(want))  # tuples -> lists, as stored
    path = out / "experiment.json"
    if path.exists():
        have = json.loads(path.read_text())
        diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
        if diff:
            raise ValueError(f"{str(out)!r} holds runs made with different settings ({', '.join(diff)}); "
                             f"use another --out")
    else:
        atomic_write_json(path, want)


def _value(r: dict, key: str) -> float:
    v = r[key]
    if isinstance(v, dict):
        v = v["r"]
    return float(np.mean(v))


def _summarise(results: list[dict], keys: list[str]) -> dict:
    """Mean and standard error over seeds, per (condition, k)."""
    summary: dict = {}
    for cond in dict.fromkeys(r["condition"] for r in results):  # run order: baseline, reinit, mfr, mfr_alpha*
        for k in sorted({r["k"] for r in results}):
            rs = [r for r in results if r["condition"] == cond and r["k"] == k]
            if not rs:
                continue
            entry = {}
            for key in keys:
                vals = np.array([_value(r, key) for r in rs if key in r], dtype=np.float64)
                vals = vals[np.isfinite(vals)]
                entry[key] = {"mean": float(vals.mean()) if vals.size else float("nan"),
                              "se": float(vals.std(ddof=1) / np.sqrt(vals.size)) if vals.size > 1 else float("nan"),
                              "n": int(vals.size)}
            summary.setdefault(cond, {})[str(k)] = entry
    return summary


_COLORS = {"baseline": "C0", "reinit": "C3", "mfr": "C1", "mfr_alpha0.1": "C2"}


def _integer_k_axis(ax, ks: list[int]) -> None:
    """Ticks at the k values only; a single k gets a window of +-3 around it (not a 0.6-wide stretched axis)."""
    ax.set_xticks(ks)
    if len(ks) == 1:
        ax.set_xlim(ks[0] - 3, ks[0] + 3)


def _figures_synthetic(out: Path, exp: SyntheticExperiment, results: list[dict]) -> None:
    plt = pyplot()
    summary = _summarise(results, ["mmcs_truth", "fvu", "correlation"])
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    all_ks = sorted({int(k) for cond in summary for k in summary[cond]})
    for ax, key, label in zip(axes, ["mmcs_truth", "fvu", "correlation"],
                              ["MMCS to true features (Hungarian)", "held-out FVU",
                               "corr(cross-SAE sim., truth sim.)"], strict=True):
        for i, cond in enumerate(summary):
            ks = sorted(int(k) for k in summary[cond])
            m = [summary[cond][str(k)][key]["mean"] for k in ks]
            se = [np.nan_to_num(summary[cond][str(k)][key]["se"]) for k in ks]
            # reinit often equals the baseline (no re-initialisation fired): dashed, so both stay visible
            ax.errorbar(ks, m, yerr=se, marker="x" if cond == "reinit" else "o", ls="--" if cond == "reinit" else "-",
                        capsize=3, label=cond, color=_COLORS.get(cond, f"C{3 + i}"))
        if key == "correlation":
            ax.axhline(PAPER["synthetic_correlation_baseline"], ls=":", c=_COLORS["baseline"], lw=1,
                       label="paper baseline")
            ax.axhline(PAPER["synthetic_correlation_reinit"], ls=":", c=_COLORS["reinit"], lw=1, label="paper reinit")
        _integer_k_axis(ax, all_ks)
        ax.set_xlabel("k (= active features per sample)")
        ax.set_title(label)
        ax.legend(fontsize=8)
    save_figure(fig, out / "synthetic_summary.png", dpi=120)


# ----------------------------------------------------------------------------- statistics, verdicts, report
def _run_kind(exp) -> str:
    """``"full"`` when every budget field has the setting's default, else ``"quick"`` (no verdicts from it)."""
    full = type(exp)()
    budget = ("steps", "batch_size", "d_sae", "eval_samples", "train_chunks", "eval_chunks", "ctx_len")
    return "full" if all(getattr(exp, f) == getattr(full, f) for f in budget if hasattr(exp, f)) else "quick"


def _paired(results: list[dict], cond: str, k: int, key: str) -> np.ndarray:
    """Per-seed differences ``cond - baseline`` of the SAE-mean of ``key`` (relative, in %, for FVU)."""
    base = {r["seed"]: _value(r, key) for r in results if r["condition"] == "baseline" and r["k"] == k}
    out = []
    for r in results:
        if r["condition"] == cond and r["k"] == k and r["seed"] in base and key in r:
            b, v = base[r["seed"]], _value(r, key)
            out.append(100 * (v - b) / b if key == "fvu" else v - b)
    return np.array(out, dtype=np.float64)


def _verdicts(results: list[dict], primary: str, run_kind: str) -> list[dict]:
    """One verdict per (condition != baseline, k): ``better than baseline`` / ``worse than baseline`` (the paired
    difference of ``primary`` beyond 2 standard errors over >= 2 seeds), ``no clear difference``, ``one seed: no
    verdict`` or ``quick run: not a reproduction``, with the one-line reason."""
    higher_is_better = primary != "fvu"
    out = []
    for cond in dict.fromkeys(r["condition"] for r in results):
        if cond == "baseline":
            continue
        for k in sorted({r["k"] for r in results if r["condition"] == cond}):
            d = _paired(results, cond, k, primary)
            d_fvu = _paired(results, cond, k, "fvu")
            cross = [r.get("mmcs_cross") for r in results if r["condition"] == cond and r["k"] == k]
            cross = [c for c in cross if c is not None]
            n = int(np.isfinite(d).sum())
            mean = float(np.nanmean(d)) if n else float("nan")
            se = float(np.nanstd(d, ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
            gain = mean if higher_is_better else -mean
            if run_kind != "full":
                word = "quick run: not a reproduction"
            elif n < 2:
                word = "one seed: no verdict"
            elif gain > 2 * se:
                word = "better than baseline"
            elif gain < -2 * se:
                word = "worse than baseline"
            else:
                word = "no clear difference"
            what = "MMCS to truth" if primary == "mmcs_truth" else "held-out FVU"
            value = f"{mean:+.1f} %" if primary == "fvu" else f"{mean:+.4f}"
            reason = (f"{what} {value} vs baseline (paired over {n} seed{'s' if n != 1 else ''})" if n
                      else "no paired baseline run")
            if primary != "fvu" and d_fvu.size:
                reason += f", FVU {np.nanmean(d_fvu):+.1f} %"
            if cross and float(np.mean(cross)) > 0.99 and gain < 0:
                reason += f"; the SAEs are near copies of each other (cross-SAE MMCS {float(np.mean(cross)):.3f})"
            out.append({"condition": cond, "k": k, "verdict": word, "reason": reason, "n": n,
                        "mean_diff": mean, "se_diff": se})
    return out


def _core_summary(results: list[dict]) -> dict:
    """Mean over seeds and SAEs of every SAEBench core metric, per condition and k: ``{cond: {k: {cat.key: v}}}``."""
    out: dict = {}
    for cond in dict.fromkeys(r["condition"] for r in results):
        for k in sorted({r["k"] for r in results}):
            cores = [c for r in results if r["condition"] == cond and r["k"] == k for c in r.get("saebench_core", [])]
            if not cores:
                continue
            flat: dict[str, list[float]] = {}
            for c in cores:
                for cat, d in c.items():
                    for key, v in d.items():
                        if isinstance(v, (int, float)):
                            flat.setdefault(f"{cat}.{key}", []).append(float(v))
            out.setdefault(cond, {})[str(k)] = {key: float(np.mean(v)) for key, v in flat.items()}
    return out


def _cell(v) -> str:
    return "—" if v is None or not np.isfinite(v) else f"{v:.4g}"


def _report(out: Path, metrics: dict) -> None:
    s = metrics["summary"]
    runs = metrics["runs"]
    kind = metrics.get("run_kind", "full")
    n_seeds = len({r["seed"] for r in runs})
    lines = [f"# MFR reproduction: {metrics['setting']}", "",
             "Marks et al. 2024, *Enhancing Neural Network Interpretability with Feature-Aligned Sparse "
             "Autoencoders* (arXiv 2411.01220).", "",
             f"Run: **{kind}** ({'the settings meant to reproduce' if kind == 'full' else 'a shortened budget that checks the pipeline: a quick run is not a reproduction and gets no verdict'}); "
             f"{n_seeds} seed(s). Cells show the mean ± standard error over seeds with n; one seed shows no ±; "
             "per-seed values are first averaged over the run's SAEs; — means undefined.", ""]
    if metrics["setting"] == "synthetic":
        lines += ["| k | condition | MMCS to truth | held-out FVU | cross-SAE MMCS | corr(cross, truth) | "
                  "paper corr | re-initialisations |", "|---|---|---|---|---|---|---|---|"]
        paper = {"baseline": PAPER["synthetic_correlation_baseline"], "reinit": PAPER["synthetic_correlation_reinit"]}
        for cond in s:
            for k, e in sorted(s[cond].items(), key=lambda kv: int(kv[0])):
                lines.append(f"| {k} | {cond} | {_fmt(e['mmcs_truth'])} | {_fmt(e['fvu'])} | {_fmt(e['mmcs_cross'])} "
                             f"| {_fmt(e['correlation'])} | {paper.get(cond, '—')} | {_reinits(runs, cond, int(k))} |")
        lines += ["", "Shared-but-false cluster (cross-SAE similarity >= 0.9, truth similarity < 0.5); firing rates "
                  "are fractions of samples, — for an empty cluster:", "",
                  "| k | condition | seed | count | fraction | firing rate in cluster | firing rate elsewhere |",
                  "|---|---|---|---|---|---|---|"]
        for r in runs:
            c = r["shared_false"]
            lines.append(f"| {r['k']} | {r['condition']} | {r['seed']} | {c['count']} | {c['fraction']:.4f} | "
                         f"{_cell(c['rate_in_cluster'])} | {_cell(c['rate_outside'])} |")
        lines += ["", figure("synthetic_summary.png", "MMCS to truth, held-out FVU and corr(cross, truth) per k")]
    else:
        setting = metrics["setting"]
        down = {"minilm": ["cosine_recovered", "mse_recovered"], "eeg": []}.get(setting, ["loss_recovered"])
        lines += ["| " + " | ".join(["k", "condition", "held-out FVU", "L0", "dead fraction",
                                      *(d.replace("_", " ") for d in down)]) + " |",
                  "|---|---|---|---|---|" + "---|" * len(down)]
        for cond in s:
            for k, e in sorted(s[cond].items(), key=lambda kv: int(kv[0])):
                cells = [k, cond, *(_fmt(e[key]) for key in ["fvu", "l0", "dead_fraction", *down])]
                lines.append("| " + " | ".join(cells) + " |")
        for cond, imp in metrics.get("improvement_pct", {}).items():
            lines += ["", f"Relative reconstruction improvement of {cond} over the baseline (FVU; the paper's "
                      "statistic is the relative change of the reconstruction loss), per k: "
                      + ", ".join(f"k={k}: {v:+.2f} %" for k, v in imp.items())]
        if setting == "eeg":
            d, tp = metrics["data"], metrics["throughput"]
            lines += ["", f"(paper, TUH EEG: reconstruction {PAPER['eeg_max_reconstruction_improvement_pct']} % better "
                      "with MFR at k = 24).", "",
                      f"Data: {d['files']} recording(s) under `{d['dir']}` ({len(d['held_out_files'])} held out), "
                      f"{len(d['channels'])} channels, d_in = {d['d_in']}; {d['train_vectors']:,} training and "
                      f"{d['held_out_vectors']:,} held-out vectors. Throughput: reading + preprocessing "
                      f"{tp['pipeline_vectors_per_second']:,.0f} vectors/s, SAE training (median over runs, all "
                      f"SAEs of a run together) {tp['train_vectors_per_second_median']:,.0f} vectors/s; load average "
                      f"{', '.join(f'{v:.1f}' for v in tp['load_average'])}.", "",
                      figure("eeg_summary.png", "held-out FVU and dead fraction per k")]
        else:
            lines += ["", f"(paper, GPT-2 Small: up to {PAPER['gpt2_max_reconstruction_improvement_pct']} % better).",
                      "", figure(_summary_png(setting == "lm"),
                                 "held-out FVU, downstream recovery and dead fraction per k")]
        if setting == "lm":
            lines += ["", _table2(metrics)]
    lines += ["", "## Verdict against the baseline", "",
              "Paired per seed (same data and initial seeds); better / worse = beyond 2 standard errors over "
              ">= 2 seeds.", "", "| k | condition | verdict | why |", "|---|---|---|---|"]
    for v in metrics.get("verdicts", []):
        lines.append(f"| {v['k']} | {v['condition']} | {v['verdict']} | {v['reason']} |")
    lines += ["", "## Re-initialisation", "", _reinit_text(metrics)]
    core = metrics.get("saebench_core", {})
    if core:
        extra = [c for c in ("embedding_preservation.embedding_cossim_score", "model_behavior_preservation.kl_div_score",
                             "model_performance_preservation.ce_loss_score")
                 if any(c in e for cond in core.values() for e in cond.values())]
        cols = [f"{a}.{b}" for a, b in CORE_KEYS] + extra
        lines += ["", "## SAEBench core metrics", "",
                  "SAEBench's definitions and keys (`metrics.json` -> `runs[*].saebench_core` has every category); "
                  "held-out data, original units; mean over seeds and SAEs.", "",
                  "| k | condition | " + " | ".join(c.split(".")[1] for c in cols) + " |",
                  "|---|---|" + "---|" * len(cols)]
        for cond, per_k in core.items():
            for k, e in sorted(per_k.items(), key=lambda kv: int(kv[0])):
                lines.append(f"| {k} | {cond} | " + " | ".join(_cell(e.get(c)) for c in cols) + " |")
    lines += ["", f"Total time: {wall_time_statement(metrics['seconds'], metrics.get('sessions'))}."]
    write_report(out, "\n".join(lines), title=f"MFR reproduction: {metrics['setting']}")  # report.md + report.html


def _table2(metrics: dict) -> str:
    """The paper's Table 2 protocol: next-token cross-entropy clean / SAE spliced in / zero-ablated and the loss
    recovered, per (k, condition), beside the paper's GPT-2 Small numbers."""
    s = metrics["summary"]
    lines = ["## Cross-entropy with the SAE spliced in (the paper's Table 2 protocol)", "",
             f"Model `{metrics.get('model')}`, hook point `{metrics.get('hook_point')}` (its output replaced by the "
             "SAE's reconstruction, or by zeros); next-token cross-entropy in nats/token on the held-out chunks; loss "
             "recovered = (CE_zero - CE_spliced) / (CE_zero - CE_clean). The paper's columns are GPT-2 Small's "
             "layer-0 MLP (its clean and zero-ablated CE; the per-k spliced CE of the paper are not quoted here). "
             "Another model and tokenizer: compare the loss recovered, not the cross-entropies.", "",
             "| k | condition | CE clean | CE spliced | CE zero-ablated | loss recovered | paper CE clean | "
             "paper CE zero-ablated |", "|---|---|---|---|---|---|---|---|"]
    for cond in s:
        for k, e in sorted(s[cond].items(), key=lambda kv: int(kv[0])):
            if "ce_spliced" not in e:
                continue
            lines.append(f"| {k} | {cond} | {_fmt(e['ce_clean'], '.3f')} | {_fmt(e['ce_spliced'], '.3f')} | "
                         f"{_fmt(e['ce_zero'], '.3f')} | {_fmt(e['loss_recovered'])} | "
                         f"{PAPER['gpt2_layer0_mlp_ce_clean']} | {PAPER['gpt2_layer0_mlp_ce_zero_ablated']} |")
    return "\n".join(lines)


def _reinits(runs: list[dict], cond: str, k: int) -> str:
    """Total re-initialisations of a (condition, k) over its seeds, e.g. ``"0 in 3 seeds"``."""
    rs = [r for r in runs if r["condition"] == cond and r["k"] == k]
    return f"{sum(int(r.get('n_reinits', 0)) for r in rs)} in {len(rs)} seed{'s' if len(rs) != 1 else ''}"


def _reinit_text(metrics: dict) -> str:
    """Which inactivity measure triggers re-initialisation, vs the paper's, and whether it fired."""
    runs = metrics["runs"]
    exp = metrics["experiment"]
    fired = sum(int(r.get("n_reinits", 0)) for r in runs)
    maxes = [r["max_inactivity"] for r in runs if isinstance(r.get("max_inactivity"), (int, float))
             and np.isfinite(r["max_inactivity"])]
    mx = f"; the largest measure seen in any check was {max(maxes):.3g}" if maxes else ""
    measure = exp.get("inactivity_measure", "cubed_relative_deviation")
    formula = {"mean_relative_deviation": "mean_j |r_j / (k / d_sae) - 1| (the paper's example measure: 0 = uniform "
               "use, 1 = all dead, 2 f for a fraction f of dead latents with the rest uniform)",
               "cubed_relative_deviation": "mean_j |r_j / (k / d_sae) - 1|^3 (0 = uniform use, 1 = all dead)"}
    per_run = sorted({int(r.get("n_reinits", 0)) for r in runs})
    return (f"Every 100 steps each SAE's firing rates r_j after TopK over the window are scored by `{measure}` = "
            f"{formula.get(measure, measure)} and the SAE is re-initialised when it exceeds "
            f"{exp.get('inactivity_threshold', '—')} (during the first half of training; the paper, sec. 3.3, uses "
            f"threshold 1 for its measure). Re-initialisations in this run: {fired} in {len(runs)} runs (per run: "
            f"{', '.join(map(str, per_run)) or '—'}){mx}.")


def _fmt(e: dict, fmt: str = ".4f") -> str:
    """``mean ± se (n = N)`` of a summary entry; ``mean (n = 1)``; ``—`` when undefined."""
    if not np.isfinite(e["mean"]):
        return "—"
    n = e.get("n", 0)
    if np.isfinite(e["se"]):
        return f"{e['mean']:{fmt}} ± {e['se']:{fmt}} (n = {n})"
    return f"{e['mean']:{fmt}} (n = {n})"


# ----------------------------------------------------------------------------- MiniLM
@dataclass(frozen=True)
class MinilmExperiment(MfrRuns):
    """Settings of the MiniLM reproduction."""

    seeds: int = 1
    """Seeds per (k, condition)."""

    model: str = "minilm"
    """'minilm' (embedded, sentence-embedding loss recovered) or a local causal LM such as 'gpt2' (CE loss recovered)."""

    hook_point: str = "encoder.layer.3.output"
    """Residual stream after block 3 (d_in = 384); for GPT-2 use e.g. ``transformer.h.5``."""

    d_sae: int = 3072
    """Latents (expansion factor 8)."""

    steps: int = 2000
    """Optimisation steps."""

    batch_size: int = 2048
    """Activations per step."""

    ctx_len: int = 128
    """Tokens per sequence."""

    train_chunks: int = 4000
    """Text chunks used for training activations."""

    eval_chunks: int = 64
    """Held-out chunks (wikitext-2 test) for FVU and loss recovered."""

    rematch_every: int = 10
    """Hungarian re-matching period (steps)."""

    @classmethod
    def quick(cls, **kw) -> MinilmExperiment:
        """A pipeline check within minutes on a CPU: k = 6, 1 seed, 200 steps of 1024 activations."""
        return cls(**{"k_values": (6,), "seeds": 1, "d_sae": 1536, "steps": 200, "batch_size": 1024, "ctx_len": 64,
                      "train_chunks": 600, "eval_chunks": 32, "rematch_every": 25, **kw})


@dataclass(frozen=True)
class LmExperiment(MinilmExperiment):
    """Settings of ``reproduce mfr --setting lm``: the paper's Table 2 protocol on a causal LM's layer-0 MLP output
    (GPT-2 Small in the paper; a model trained by ``mlpinterp train-lm``, or any local causal LM)."""

    model: str = "gpt2"
    """A local causal LM: a ``train-lm`` output directory, or ``gpt2`` (its weights must be on disk)."""

    hook_point: str = "transformer.h.0.mlp"
    """Layer-0 MLP output, before the residual add (the paper's GPT-2 Small hook)."""


def run_minilm(out: str | os.PathLike, exp: MinilmExperiment = MinilmExperiment(), *, quiet: bool = False,
               device: str = "cpu", text_dir: str | os.PathLike | None = None) -> dict:
    """Baseline vs MFR SAEs on all-MiniLM-L6-v2 activations; resumes finished runs."""

    conds = conditions(("baseline", "mfr"), exp.alpha, exp.extra_alphas)  # validates before anything is written
    with open_mfr_run(out, exp) as rd:
        return _run_minilm(rd, exp, conds, quiet, device, text_dir)


def _run_minilm(rd: RunDir, exp: MinilmExperiment, conds: dict, quiet: bool, device: str,
                text_dir: str | os.PathLike | None) -> dict:
    from mlpinterp.lm.hooks import hook_activations
    from mlpinterp.lm.models import canonical_model_name, load_model
    from mlpinterp.lm.recovery import is_causal_lm
    from mlpinterp.lm.text import read_texts, split_files, token_chunks
    from mlpinterp.sae.activations import ActivationConfig, ActivationSource
    from mlpinterp.sae.evaluate import evaluate_sae

    out = rd.path
    model, tok = load_model(exp.model)
    is_lm = is_causal_lm(model)
    if isinstance(exp, LmExperiment) and not is_lm:
        raise ValueError(f"model {exp.model!r} has no LM head ({type(model).__name__}): the lm setting measures "
                         "next-token cross-entropy and needs a causal LM (e.g. a train-lm output directory)")
    train_files, eval_files = split_files(text_dir)
    eval_ids = token_chunks(tok, read_texts(eval_files), exp.ctx_len, exp.eval_chunks)
    acfg = ActivationConfig(hook_point=exp.hook_point, ctx_len=exp.ctx_len, batch_size=exp.batch_size,
                            buffer_size=max(16 * exp.batch_size, 65536), max_chunks=exp.train_chunks)
    train_texts = read_texts(train_files)
    cache = out / "activation_cache"
    # fill the cache once; every run then streams from it with its own shuffle
    warm = ActivationSource(model, tok, acfg, texts=train_texts, cache_dir=cache)
    if not (cache / "manifest.json").exists():
        for _ in warm._cached_stream(0):
            pass
    held = hook_activations(model, exp.hook_point, eval_ids)
    held = held[~torch.isin(eval_ids, torch.tensor(tok.all_special_ids))].float()
    results: list[dict] = []
    for k in exp.k_values:
        for seed in range(exp.seeds):
            for cond, (penalty, reinit, alpha) in conds.items():
                run_dir = out / "runs" / f"k{k}_seed{seed}_{cond}"
                done = run_dir / "result.json"
                if done.exists():
                    results.append(json.loads(done.read_text()))
                    continue
                src = ActivationSource(model, tok, replace(acfg, seed=seed), texts=train_texts, cache_dir=cache)
                cfg = MfrConfig(sae=SaeConfig(d_sae=exp.d_sae, k=k), n_saes=exp.n_saes, penalty=penalty,
                                reinit=reinit, rematch_every=exp.rematch_every, alpha=alpha,
                                inactivity_threshold=exp.inactivity_threshold, reinit_until=exp.steps // 2,
                                optimizer=exp.optimizer, auxk_alpha=exp.auxk_alpha,
                                inactivity_measure=exp.inactivity_measure, seed=2000 + seed)
                trainer = MfrTrainer(held.shape[1], cfg, device=device, model_name=canonical_model_name(exp.model),
                                     hook_point=exp.hook_point)
                trainer.load_checkpoint(run_dir)  # resumes weights and optimiser; the data stream restarts
                t0 = time.time()
                trainer.fit(iter(src), exp.steps, quiet=quiet, checkpoint_dir=run_dir,
                            checkpoint_every=max(exp.steps // 4, 1), desc=f"k={k} seed={seed} {cond}")
                fvus, rates, l0s = _eval_saes(trainer, held)
                res = {"k": k, "seed": seed, "condition": cond, "seconds": time.time() - t0, "fvu": fvus,
                       "l0": l0s, "dead_fraction": [float((r == 0).mean()) for r in rates],
                       "n_reinits": len(trainer.reinit_events), "alpha": trainer.alpha,
                       "max_inactivity": max((c["measure"] for c in trainer.checks), default=float("nan"))}
                core = [evaluate_sae(s.cpu().eval(), model, eval_ids, special_ids=tok.all_special_ids)
                        for s in trainer.saes]
                res["saebench_core"] = core
                if is_lm:
                    perf = [c["model_performance_preservation"] for c in core]
                    res["loss_recovered"] = [p["ce_loss_score"] for p in perf]
                    res["lm"] = [{"ce_clean": p["ce_loss_without_sae"], "ce_spliced": p["ce_loss_with_sae"],
                                  "ce_zero": p["ce_loss_with_ablation"], "loss_recovered": p["ce_loss_score"]}
                                 for p in perf]
                    for key in ("ce_clean", "ce_spliced", "ce_zero"):
                        res[key] = [e[key] for e in res["lm"]]
                else:
                    res.update({"cosine_recovered": [c["embedding_preservation"]["embedding_cossim_score"] for c in core],
                                "mse_recovered": [c["embedding_preservation"]["embedding_mse_score"] for c in core]})
                atomic_write_json(done, res)
                results.append(res)
    keys = ["fvu", "l0", "dead_fraction", "loss_recovered", "ce_clean", "ce_spliced", "ce_zero"] if is_lm else \
        ["fvu", "l0", "dead_fraction", "cosine_recovered", "mse_recovered"]
    summary = _summarise(results, keys)
    improvement: dict[str, dict[str, float]] = {}
    for cond in summary:
        for k in exp.k_values:
            b, m = summary.get("baseline", {}).get(str(k)), summary[cond].get(str(k))
            if cond != "baseline" and b and m:
                improvement.setdefault(cond, {})[str(k)] = 100 * (b["fvu"]["mean"] - m["fvu"]["mean"]) / b["fvu"]["mean"]
    metrics = {"setting": "lm" if is_lm else exp.model, "model": exp.model, "hook_point": exp.hook_point,
               "experiment": asdict(exp), "run_kind": _run_kind(exp), "paper": PAPER,
               "runs": results, "summary": summary, "improvement_pct": improvement,
               "verdicts": _verdicts(results, "fvu", _run_kind(exp)), "saebench_core": _core_summary(results),
               "seconds": rd.wall_seconds, "sessions": rd.sessions}
    atomic_write_json(out / "metrics.json", metrics)
    _figures_minilm(out, summary, "loss_recovered" if is_lm else "cosine_recovered", _summary_png(is_lm))
    _report(out, metrics)
    return metrics


def _summary_png(is_lm: bool) -> str:
    return "lm_summary.png" if is_lm else "minilm_summary.png"


def _figures_minilm(out: Path, summary: dict, downstream: str | None = "cosine_recovered",
                    name: str = "minilm_summary.png") -> None:
    """Per-k panels of held-out FVU, the ``downstream`` metric (none when None) and the dead fraction."""
    plt = pyplot()
    keys = ["fvu", *([downstream] if downstream else []), "dead_fraction"]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.7 * len(keys), 4))
    for ax, key in zip(axes, keys, strict=True):
        label = {"fvu": "held-out FVU"}.get(key, key.replace("_", " "))
        for i, cond in enumerate(summary):
            ks = sorted(int(k) for k in summary[cond])
            ax.errorbar(ks, [summary[cond][str(k)][key]["mean"] for k in ks], color=_COLORS.get(cond, f"C{3 + i}"),
                        yerr=[np.nan_to_num(summary[cond][str(k)][key]["se"]) for k in ks],
                        marker="o", capsize=3, label=cond)
        _integer_k_axis(ax, sorted({int(k) for cond in summary for k in summary[cond]}))
        ax.set_xlabel("k")
        ax.set_title(label)
        ax.legend(fontsize=8)
    save_figure(fig, out / name, dpi=120)
