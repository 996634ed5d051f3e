"""MFR on EEG (Marks et al. 2024, sec. 4.3: TUH EEG corpus): baseline vs MFR SAEs on vectorised recordings.

``run_eeg(out, EegExperiment(), data_dir)``: every ``*.edf`` under ``data_dir`` is read, resampled, band-passed
(0.5-45 Hz, order 5, zero phase) and vectorised by :func:`mlpinterp.data.eeg.load_eeg`; for every ``k`` (paper:
12, 24, 36, 48, 60) and seed, ``baseline`` (independent SAEs) and ``mfr`` (penalty + re-initialisation) SAEs with
the paper's sizes (4096 latents, batch 1024, Adam lr 1e-3) train on the training vectors (batches drawn by
:func:`mlpinterp.utils.batches.epoch_batch_indices`) and are measured on the held-out recordings: FVU, L0, dead
fraction, SAEBench core metrics, and the relative FVU improvement of MFR over the baseline (the paper: reconstruction
6.67 % better at k = 24). Inputs are normalised (``expected_average_only_in``); metrics are in microvolts.
Outputs as every MFR setting (metrics.json, report.md, report.html through the shared report module, runs/*).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import numpy as np
import torch

from mlpinterp.data.eeg import load_eeg
from mlpinterp.sae.core_metrics import core_metrics
from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
from mlpinterp.sae.topk import SaeConfig
from mlpinterp.studies.mfr.analysis import core_summary, fvu_improvement_pct, run_kind, summarise, verdicts
from mlpinterp.studies.mfr.figures import figures_summary
from mlpinterp.studies.mfr.report import write_mfr_report
from mlpinterp.studies.mfr.run import eval_saes, open_mfr_run, pending_runs
from mlpinterp.studies.mfr.settings import PAPER, EegExperiment, conditions
from mlpinterp.utils.batches import epoch_batch_indices
from mlpinterp.utils.io import atomic_write_json
from mlpinterp.utils.rundir import RunDir


def run_eeg(out: str | os.PathLike, exp: EegExperiment, data_dir: str | os.PathLike, *, quiet: bool = False,
            device: str = "cpu") -> dict:
    """Baseline vs MFR SAEs on the EEG recordings under ``data_dir``; resumes finished runs from ``out/runs``.

    Raises the errors of :func:`mlpinterp.data.eeg.load_eeg` (no EDF file, not EDF, truncated, missing channel)
    and ``ValueError`` when the recordings give fewer training vectors than ``batch_size`` or a ``k`` exceeds
    ``d_sae``.
    """
    conds = conditions(("baseline", "mfr"), exp.alpha, exp.extra_alphas)
    bad_k = [k for k in exp.k_values if k > exp.d_sae]
    if bad_k:
        raise ValueError(f"k values {bad_k} exceed d_sae = {exp.d_sae}")
    with open_mfr_run(out, exp) as rd:
        return _run_eeg(rd, exp, conds, data_dir, quiet, device)


def _run_eeg(rd: RunDir, exp: EegExperiment, conds: dict, data_dir: str | os.PathLike, quiet: bool,
             device: str) -> dict:
    data = load_eeg(data_dir, exp.eeg)
    train, held = torch.from_numpy(data["train"]), torch.from_numpy(data["held_out"][:exp.eval_vectors])
    if train.shape[0] < exp.batch_size:
        raise ValueError(f"the recordings under {str(data_dir)!r} give {train.shape[0]} training vectors, fewer than "
                         f"batch_size = {exp.batch_size}; add recordings or lower the batch size")
    if held.shape[0] < 2:
        raise ValueError(f"the held-out recordings give {held.shape[0]} vector(s); the metrics need at least 2")
    out = rd.path
    n_vectors = data["train"].shape[0] + data["held_out"].shape[0]
    pipeline_s = data["seconds"]["read"] + data["seconds"]["preprocess"]
    results: list[dict] = []
    for k, seed, cond, (penalty, reinit, alpha), run_dir in pending_runs(out, exp, conds, results):
        cfg = MfrConfig(sae=SaeConfig(d_sae=exp.d_sae, k=k), n_saes=exp.n_saes, penalty=penalty,
                        reinit=reinit, lr=exp.lr, rematch_every=exp.rematch_every, alpha=alpha,
                        inactivity_threshold=exp.inactivity_threshold, reinit_until=exp.steps // 2,
                        optimizer=exp.optimizer, auxk_alpha=exp.auxk_alpha,
                        inactivity_measure=exp.inactivity_measure,
                        normalize_activations="expected_average_only_in", seed=3000 + seed)
        trainer = MfrTrainer(train.shape[1], cfg, device=device, model_name="eeg",
                             hook_point=f"eeg:{exp.eeg.window}x{len(data['channels'])}")
        trainer.load_checkpoint(run_dir)
        t0, step0 = time.time(), trainer.step
        trainer.fit(_batches(train, exp.batch_size, seed, trainer.step), exp.steps, quiet=quiet,
                    checkpoint_dir=run_dir, checkpoint_every=max(exp.steps // 4, 1),
                    desc=f"eeg k={k} seed={seed} {cond}")
        seconds = time.time() - t0
        fvus, rates, l0s = eval_saes(trainer, held)
        res = {"k": k, "seed": seed, "condition": cond, "seconds": seconds, "fvu": fvus, "l0": l0s,
               "dead_fraction": [float((r == 0).mean()) for r in rates],
               "n_reinits": len(trainer.reinit_events), "alpha": trainer.alpha,
               "max_inactivity": max((c["measure"] for c in trainer.checks), default=float("nan")),
               "train_vectors_per_second": (exp.steps - step0) * exp.batch_size / seconds if seconds else
               float("nan"),
               "saebench_core": [core_metrics(s.cpu().eval(), held) for s in trainer.saes]}
        results.append(res)
    summary = summarise(results, ["fvu", "l0", "dead_fraction"])
    improvement = fvu_improvement_pct(summary, exp.k_values)
    rates = [r["train_vectors_per_second"] for r in results
             if isinstance(r.get("train_vectors_per_second"), (int, float)) and np.isfinite(r["train_vectors_per_second"])]
    metrics = {"setting": "eeg", "experiment": json.loads(json.dumps(asdict(exp))), "run_kind": run_kind(exp),
               "paper": PAPER, "runs": results, "summary": summary, "improvement_pct": improvement,
               "verdicts": verdicts(results, "fvu", run_kind(exp)), "saebench_core": core_summary(results),
               "data": {"dir": str(data_dir), "files": len(data["files"]), "held_out_files": data["held_out_files"],
                        "channels": data["channels"], "d_in": int(train.shape[1]), "train_vectors":
                        int(train.shape[0]), "held_out_vectors": int(held.shape[0]), "samples": data["samples"]},
               "throughput": {"pipeline_vectors_per_second": n_vectors / pipeline_s if pipeline_s else float("nan"),
                              "pipeline_seconds": data["seconds"],
                              "train_vectors_per_second_median": float(np.median(rates)) if rates else float("nan"),
                              "load_average": list(os.getloadavg())},
               "seconds": rd.wall_seconds, "sessions": rd.sessions}
    atomic_write_json(out / "metrics.json", metrics)
    figures_summary(out, summary, None, "eeg_summary.png")
    write_mfr_report(out, metrics)
    return metrics


def _batches(x: torch.Tensor, batch_size: int, seed: int, start: int):
    """Batch ``t`` (from ``start`` on) of the seeded epoch-wise permutations of ``x``'s rows."""
    cache: dict = {}
    t = start
    while True:
        yield x[torch.from_numpy(epoch_batch_indices(seed, x.shape[0], batch_size, t, cache))]
        t += 1
