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

Settings: :mod:`mlpinterp.studies.mfr.settings`. Outputs in ``out``: ``metrics.json``, ``report.md`` and the
self-contained ``report.html`` (``report.md.j2`` through the shared :mod:`mlpinterp.studies.report`, every figure embedded), PNG figures, and one directory of SAEs per run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from mlpinterp.sae.analysis import cross_truth_correlation, mmcs_to_truth, shared_false_cluster
from mlpinterp.sae.core_metrics import core_metrics
from mlpinterp.sae.metrics import firing_counts, mmcs
from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
from mlpinterp.sae.synthetic import SyntheticConfig, SyntheticData
from mlpinterp.sae.topk import SaeConfig
from mlpinterp.studies.mfr.analysis import core_summary, fvu_improvement_pct, run_kind, summarise, verdicts
from mlpinterp.studies.mfr.figures import figures_summary, figures_synthetic, summary_png
from mlpinterp.studies.mfr.report import write_mfr_report
from mlpinterp.studies.mfr.settings import (
    CONDITIONS,
    PAPER,
    LmExperiment,
    MinilmExperiment,
    SyntheticExperiment,
    conditions,
)
from mlpinterp.utils.io import atomic_write_json
from mlpinterp.utils.rundir import RunDir, open_run


def eval_saes(trainer: MfrTrainer, x: torch.Tensor) -> tuple[list[float], np.ndarray, list[float]]:
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


def pending_runs(out: Path, exp, conds: dict, results: list[dict]) -> Iterator[tuple]:
    """The runs of a study's grid (every k of ``exp.k_values`` x seed x condition of ``conds``), in that order: a
    finished run (``out/runs/k{k}_seed{seed}_{cond}/result.json``) has its result appended to ``results`` and is
    skipped; each other one is yielded as ``(k, seed, cond, (penalty, reinit, alpha), run_dir)``. Its caller appends
    its result to ``results`` before asking for the next run (or leaving the loop), and that result is then written
    to the run's ``result.json`` (atomically), so ``results`` stays in grid order and every result is on disk once
    the grid is done. Raises ``RuntimeError`` if the caller asked for the next run without appending a result."""
    for k in exp.k_values:
        for seed in range(exp.seeds):
            for cond, spec in conds.items():
                run_dir = out / "runs" / f"k{k}_seed{seed}_{cond}"
                done = run_dir / "result.json"
                if done.exists():
                    results.append(json.loads(done.read_text()))
                    continue
                n = len(results)
                yield k, seed, cond, spec, run_dir
                if len(results) != n + 1:
                    raise RuntimeError(f"run k={k} seed={seed} {cond}: append its result to results before asking "
                                       "for the next run")
                atomic_write_json(done, results[-1])


def run_synthetic(out: str | os.PathLike, exp: SyntheticExperiment = SyntheticExperiment(), *,
                  quiet: bool = False, device: str = "cpu") -> dict:
    """Run the synthetic reproduction; resumes finished runs from ``out/runs/*/result.json``."""
    conds = conditions(tuple(CONDITIONS), exp.alpha, exp.extra_alphas)  # validates before anything is written
    with open_mfr_run(out, exp) as rd:
        return _run_synthetic(rd, exp, conds, quiet, device)


def _run_synthetic(rd: RunDir, exp: SyntheticExperiment, conds: dict, quiet: bool, device: str) -> dict:
    out = rd.path
    results: list[dict] = []
    data_of = None
    for k, seed, cond, (penalty, reinit, alpha), run_dir in pending_runs(out, exp, conds, results):
        if (k, seed) != data_of:  # the synthetic data of this (k, seed), made once for its conditions
            data_of, data = (k, seed), SyntheticData(SyntheticConfig(k_active=k, seed=seed))
            held = data.batch(10_000_000, exp.eval_samples).x  # far beyond any training index
        base = results[-1] if cond == "reinit" else None
        if base is not None and base["condition"] == "baseline" and not base.get("would_reinit", True):
            # Re-initialisation is a deterministic function of the trajectory: if the baseline's
            # inactivity measure never crossed the threshold, the reinit run is the baseline run.
            results.append({**base, "condition": "reinit", "reused_baseline": True})
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
        fvus, rates, l0s = eval_saes(trainer, held)
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
        results.append(res)
    summary = summarise(results, ["mmcs_truth", "fvu", "mmcs_cross", "correlation", "n_reinits"])
    metrics = {"setting": "synthetic", "experiment": asdict(exp), "run_kind": run_kind(exp), "paper": PAPER,
               "runs": results, "summary": summary, "verdicts": verdicts(results, "mmcs_truth", run_kind(exp)),
               "saebench_core": core_summary(results), "seconds": rd.wall_seconds, "sessions": rd.sessions}
    atomic_write_json(out / "metrics.json", metrics)
    figures_synthetic(out, exp, results)
    write_mfr_report(out, metrics)
    return metrics


@contextmanager
def open_mfr_run(out: str | os.PathLike, exp) -> Iterator[RunDir]:
    """Open ``out`` for ``reproduce mfr`` with ``exp`` (:func:`mlpinterp.utils.rundir.open_run`): every field,
    the k values and seeds included, must match a run already there (a report of another set of runs would
    silently cover a subset); the wall time is summed over the sessions."""
    config = {"experiment": type(exp).__name__, **asdict(exp)}
    with open_run(out, "reproduce mfr", config, check=lambda path: guard_settings(path, exp)) as rd:
        yield rd


def guard_settings(out: Path, exp) -> None:
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
    for k, seed, cond, (penalty, reinit, alpha), run_dir in pending_runs(out, exp, conds, results):
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
        fvus, rates, l0s = eval_saes(trainer, held)
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
        results.append(res)
    keys = ["fvu", "l0", "dead_fraction", "loss_recovered", "ce_clean", "ce_spliced", "ce_zero"] if is_lm else \
        ["fvu", "l0", "dead_fraction", "cosine_recovered", "mse_recovered"]
    summary = summarise(results, keys)
    improvement = fvu_improvement_pct(summary, exp.k_values)
    metrics = {"setting": "lm" if is_lm else exp.model, "model": exp.model, "hook_point": exp.hook_point,
               "experiment": asdict(exp), "run_kind": run_kind(exp), "paper": PAPER,
               "runs": results, "summary": summary, "improvement_pct": improvement,
               "verdicts": verdicts(results, "fvu", run_kind(exp)), "saebench_core": core_summary(results),
               "seconds": rd.wall_seconds, "sessions": rd.sessions}
    atomic_write_json(out / "metrics.json", metrics)
    figures_summary(out, summary, "loss_recovered" if is_lm else "cosine_recovered", summary_png(is_lm))
    write_mfr_report(out, metrics)
    return metrics


