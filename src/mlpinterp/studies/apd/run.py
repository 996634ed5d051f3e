"""End-to-end APD reproductions (Braun et al. 2025): train or load the toy target, decompose, evaluate, report.

Settings: ``tms-5-2``, ``tms-40-10``, ``resid-mlp-1``, ``resid-mlp-2``, ``gated-trig``. Each has the paper's
hyperparameters (App. D) and a reduced ``quick`` preset for a CPU. Per seed ``s`` the run directory holds
``seed{s}/target.safetensors`` (+ JSON), ``seed{s}/apd/checkpoint.safetensors`` (resumable),
``seed{s}/components.safetensors``, figures ``seed{s}/*.png``; the top level holds ``metrics.json`` and
``report.md`` + ``report.html`` (``report.md.j2`` through :mod:`mlpinterp.studies.report`) with the paper's numbers
beside ours. Settings and presets: :mod:`mlpinterp.studies.apd.settings`; targets: :mod:`mlpinterp.toys.settings`.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mlpinterp.apd import (
    APDConfig,
    activation_frequency,
    attributions,
    decompose,
    per_feature_mse,
    responsible_components,
    scrubbing,
    select_mask,
)
from mlpinterp.paramspace import Components, column_match, run_with_components
from mlpinterp.studies.apd.figures import plot_contributions, plot_gated
from mlpinterp.studies.apd.report import write_apd_report
from mlpinterp.studies.apd.settings import PAPER, SETTINGS, apd_config
from mlpinterp.studies.paramspace.figures import plot_history, plot_scrubbing, plot_tms
from mlpinterp.studies.paramspace.rundir import check_out_dir, recipe_overrides
from mlpinterp.studies.paramspace.statistics import FAILED_MMCS, paper_statistic
from mlpinterp.toys import gated_trig_ground_truth, step_generator
from mlpinterp.toys.settings import check_target, get_target, resolve_fidelity, setting_spec, target_config
from mlpinterp.utils.artifact import save_artifact
from mlpinterp.utils.io import atomic_write_json
from mlpinterp.utils.rundir import RunDir, open_run, write_output
from mlpinterp.utils.validation import check_device, check_int


def _flat_cos(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> np.ndarray:
    """``[n_a, n_b]`` cosine similarities of components flattened over all sites."""
    fa = torch.cat([a[k].flatten(1) for k in sorted(a)], 1).double()
    fb = torch.cat([b[k].flatten(1) for k in sorted(a)], 1).double()
    fa = fa / fa.norm(dim=1, keepdim=True).clamp_min(1e-300)
    fb = fb / fb.norm(dim=1, keepdim=True).clamp_min(1e-300)
    return (fa @ fb.T).numpy()


@torch.no_grad()
def evaluate(name: str, model: nn.Module, comps: Components, cfg: APDConfig, info: dict, seed_dir: Path,
             seed: int, n_eval: int = 4000) -> dict:
    """Metrics of one decomposition (and its figures in ``seed_dir``), on ``~n_eval`` held-out samples."""
    spec = setting_spec(name)
    gen = step_generator(seed + 10_000, 0)
    batches = [spec.sample(max(cfg.batch_size, n_eval // 4), gen) for _ in range(4)]
    freq = activation_frequency(model, comps, batches, lambda a: select_mask(a, cfg), cfg.attribution_source)
    out: dict = {"dead_components": int((freq == 0).sum()), "alive_components": int((freq > 0).sum()),
                 "activation_frequency": freq.tolist()}
    x = torch.cat(batches)
    mask = select_mask(attributions(model, comps, x, cfg.attribution_source), cfg)
    y_t = model(x)
    out["topk_output_mse"] = float(((run_with_components(model, comps, x, mask.float()) - y_t) ** 2).mean())
    out["all_components_output_mse"] = float(((run_with_components(model, comps, x) - y_t) ** 2).mean())
    if name.startswith("tms"):
        W = model.W.detach()
        P = comps.weights()["W"].detach()
        out["mmcs"], out["ml2r"], mcs, cos, ratio = column_match(W, P)
        out["max_cos"], out["l2_ratio"] = cos.tolist(), ratio.tolist()
        out["mcs"] = mcs.tolist()
        plot_tms(W.numpy(), P.numpy(), seed_dir / "components.png")
    elif name.startswith("resid"):
        resp = responsible_components(model, comps, spec.n_features, 1.0, cfg.attribution_source)
        out["responsible"] = resp.tolist()
        out["distinct_responsible"] = int(len(np.unique(resp)))
        xs = spec.sample(n_eval, step_generator(seed + 20_000, 0))
        xs = xs[(xs != 0).any(1)]
        res = scrubbing(model, comps, xs, resp, lambda a: select_mask(a, cfg), seed=seed,
                        source=cfg.attribution_source)
        out.update(res.summary())
        pf = per_feature_mse(model, comps, spec.n_features, spec.value_range, n_per_feature=max(10, n_eval // 40), k=1,
                             source=cfg.attribution_source, seed=seed)
        out["per_feature_mse_top1"] = pf.tolist()
        out["per_feature_mse_top1_mean"] = float(pf.mean())
        plot_scrubbing(res, seed_dir / "scrubbing_hist.png")
        plot_contributions(model, comps, resp, seed_dir / "neuron_contributions.png")
    else:
        gt = gated_trig_ground_truth(model)
        cos = _flat_cos(gt, {k: v.detach() for k, v in comps.weights().items()})
        out["gt_param_mmcs"] = float(cos.max(axis=1).mean())
        out["gt_match"] = cos.argmax(axis=1).tolist()
        plot_gated(model, comps, info, seed_dir / "functions.png", cfg)
    return out


def _mean_std(vals: list[float]) -> tuple[float, float | None]:
    """``(mean, sample std)``; the std is ``None`` (JSON ``null``) for a single value, never a made-up 0."""
    a = np.asarray(vals, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else None


SUMMARY_KEYS = ("mmcs", "ml2r", "gt_param_mmcs", "topk_mse", "scrubbed_mse", "anti_scrubbed_mse",
                "per_feature_mse_top1_mean", "dead_components", "topk_output_mse", "seconds")


def reproduce(setting: str, seeds: int, out: str | Path, quick: bool = False, quiet: bool = False,
              overrides: dict | None = None, n_eval: int = 4000, device: str | None = None,
              fidelity: str | None = None) -> dict:
    """Train (or load) targets, decompose with APD for ``seeds`` seeds, evaluate and write ``metrics.json``,
    ``report.md`` and the self-contained ``report.html`` (figures embedded).

    ``overrides`` replaces APDConfig fields of the preset; ``n_eval`` is the number of held-out evaluation samples;
    ``device`` is where the decomposition trains (evaluation runs on the CPU); ``fidelity="reference"`` runs TMS the
    APD reference implementation's way (:func:`reference_overrides` and the reference's target recipe) and the
    residual MLPs on the reference's targets (:data:`REFERENCE_TARGET`: no biases), ``"ours"``
    our presets, ``None`` the setting's default (:data:`DEFAULT_FIDELITY`: ``reference`` for TMS 40-10).

    Returns the ``metrics.json`` content. Re-running resumes unfinished decompositions from their checkpoints.

    Raises
    ------
    ValueError
        For an unknown setting, ``seeds < 1`` or ``n_eval < 1``; before any training, when a seed's saved target
        in ``out`` was made with another recipe (:func:`check_target`: e.g. a ``--quick`` target under a paper run).
    TypeError
        For ``seeds`` or ``n_eval`` that is not an int (a bool, a float, a string).
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    check_int(seeds, "seeds")  # a bool or a string is refused, not counted as 1 seed or compared with 1
    check_int(n_eval, "n_eval")  # refused now, not ignored or failing after the first decomposition
    fidelity = resolve_fidelity(setting, fidelity)
    if fidelity == "reference":
        target_config(setting, 0, quick, fidelity)  # raises for a setting without a reference recipe (gated-trig)
    # everything that can be refused is refused before minutes of target training
    cfg0 = apd_config(setting, quick, 0, fidelity, **(overrides or {}))
    if device is not None:
        check_device(device)
    out = check_out_dir(out, "apd")
    for seed in range(seeds):  # refuse targets of another recipe before hours of training
        check_target(setting, seed, out / f"seed{seed}" / "target.safetensors", quick, fidelity)
    run_cfg = {**asdict(cfg0), "setting": setting, "quick": quick, "fidelity": fidelity, "seeds": seeds,
               "n_eval": n_eval}
    with open_run(out, "reproduce apd", run_cfg, resumable=("log_every", "checkpoint_every")) as rd:
        return _reproduce_open(rd, setting, seeds, quick, quiet, overrides, n_eval, device, fidelity, cfg0)


def _reproduce_open(rd: RunDir, setting: str, seeds: int, quick: bool, quiet: bool, overrides: dict | None,
                    n_eval: int, device: str | None, fidelity: str, cfg0: APDConfig) -> dict:
    """:func:`reproduce` once ``out`` is open."""
    out = rd.path
    spec = setting_spec(setting)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    per_seed = []
    for seed in range(seeds):
        sd = out / f"seed{seed}"
        model, info = get_target(setting, seed, sd / "target.safetensors", quick, quiet, fidelity)
        model.requires_grad_(False)
        cfg = apd_config(setting, quick, seed, fidelity, **(overrides or {}))
        sample = lambda step, cfg=cfg, seed=seed: spec.sample(cfg.batch_size, step_generator(seed + 1000, step))
        res = decompose(model, sample, cfg, out_dir=sd / "apd", quiet=quiet, device=device)
        comps = res.components
        save_artifact(sd / "components.safetensors", {k: v.detach() for k, v in comps.state_dict().items()},
                      kind="apd_components", provenance={"setting": setting, "seed": seed},
                      meta={"setting": setting, "config": asdict(cfg), "sites": [asdict(s) for s in comps.sites]})
        atomic_write_json(sd / "history.json", res.history)
        plot_history(res.history, sd / "losses.png", f"{setting} seed {seed}")
        m = evaluate(setting, model, comps, cfg, info, sd, seed, n_eval)
        m.update(seed=seed, seconds=res.seconds, final=res.history[-1] if res.history else {},
                 target_loss=info.get("loss"))
        per_seed.append(m)
    summary = {k: _mean_std([m[k] for m in per_seed]) for k in SUMMARY_KEYS if all(k in m for m in per_seed)}
    result = {"method": "apd", "setting": setting, "quick": quick,
              "overrides": recipe_overrides(apd_config(setting, quick, 0, fidelity), overrides),
              "seeds": seeds, "fidelity": fidelity,
              "config": asdict(cfg0), "summary": summary, "paper": PAPER.get(setting, {}), "per_seed": per_seed,
              "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
              "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None, "device": device or "cpu",
              "wall_seconds": rd.wall_seconds, "sessions": rd.sessions}
    if all("max_cos" in m for m in per_seed):
        result["failed_seeds"] = int(sum(m["mmcs"] < FAILED_MMCS for m in per_seed))
        result["paper_statistic"] = paper_statistic(per_seed)
    write_output(out / "metrics.json", result)
    write_apd_report(out, result)
    return result


