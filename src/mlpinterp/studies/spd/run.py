"""End-to-end SPD reproductions (Bushnaq, Braun, Sharkey 2025): train or load the toy target, decompose, evaluate,
report beside the paper's numbers (and an APD run's, given one).

Settings (:mod:`mlpinterp.studies.spd.settings`): ``tms-5-2``, ``tms-40-10``, ``tms-5-2-id``, ``tms-40-10-id`` (an
identity layer between down- and up-projection), ``resid-mlp-1``, ``resid-mlp-2``, ``resid-mlp-3``. The targets are
the toy targets APD decomposes (same recipe and seeds, :func:`mlpinterp.toys.settings.get_target`; TMS at the
``ours`` recipe, constant lr 5e-3, which is the SPD reference's), so the two methods decompose the same networks;
TMS is decomposed in its ``nn.Linear`` form (:func:`mlpinterp.toys.as_linears`: ``linear1`` = W, ``linear2`` = Wᵀ as
in the reference). Per seed ``s`` the run directory holds ``seed{s}/target.safetensors``,
``seed{s}/spd/checkpoint.safetensors`` (resumable), ``seed{s}/decomposition.safetensors`` and figures; the top level
``metrics.json``, ``report.md`` and a self-contained ``report.html``.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mlpinterp.paramspace import column_match
from mlpinterp.spd import (
    SPDConfig,
    alive_subcomponents,
    causal_importances,
    decompose,
    masked_output_mse,
    one_hot_importances,
    responsible_sets,
    scrubbing,
    subcomponents_per_feature,
)
from mlpinterp.spd.decomposition import Decomposition
from mlpinterp.spd.metrics import ALIVE_THRESHOLD, ONE_HOT_VALUE, coactivity, dense_ci_error, identity_ci_error
from mlpinterp.studies import report as rep
from mlpinterp.studies.paramspace.figures import plot_history, plot_scrubbing, plot_tms
from mlpinterp.studies.paramspace.rundir import check_out_dir, recipe_overrides
from mlpinterp.studies.paramspace.statistics import FAILED_MMCS, paper_statistic
from mlpinterp.studies.spd.compare import check_same_target, compare_apd, read_apd_run
from mlpinterp.studies.spd.figures import plot_ci_per_feature
from mlpinterp.studies.spd.report import write_spd_report
from mlpinterp.studies.spd.settings import SETTINGS, default_recipe, spd_config, target_fidelity
from mlpinterp.toys import as_linears, step_generator, with_identity
from mlpinterp.toys.settings import check_target, get_target, setting_spec
from mlpinterp.utils.artifact import save_artifact
from mlpinterp.utils.io import atomic_write_json
from mlpinterp.utils.rundir import RunDir, open_run, read_output, write_output
from mlpinterp.utils.validation import check_device, check_int

_LOSSES = ("faithfulness", "stochastic_recon", "layerwise_recon", "importance_minimality")


def spd_target(name: str, seed: int, path: Path, quick: bool, quiet: bool, fidelity: str | None = None
               ) -> tuple[nn.Module, nn.Module, dict]:
    """``(toy, decomposed form, info)``: APD's target of the base setting at ``fidelity`` (``None``:
    :func:`target_fidelity`), trained or loaded at ``path``, with the identity inserted for the ``-id`` settings;
    TMS as its ``nn.Linear`` form.

    Raises ``ValueError`` as :func:`mlpinterp.toys.settings.get_target`: when the target saved at ``path`` was made
    with another recipe than the base setting's at ``seed`` (another setting, seed, ``quick`` recipe or lr schedule;
    the "-id" settings share their base setting's target) or records none; for an unknown setting."""
    if name not in SETTINGS:  # None or a list: not an AttributeError from removesuffix
        raise ValueError(f"setting must be one of {SETTINGS}, got {name!r}")
    base = name.removesuffix("-id")
    # the base TMS is saved; "+ID" inserts I on loading
    toy, info = get_target(base, seed, path, quick, quiet,
                           fidelity=target_fidelity(base) if fidelity is None else fidelity)
    if name.endswith("-id") and toy.identity is None:
        toy = with_identity(toy)
    return toy, (as_linears(toy) if base.startswith("tms") else toy), info



# ---------------------------------------------------------------------------------------------- evaluate
@torch.no_grad()
def evaluate(name: str, toy: nn.Module, model: nn.Module, dec: Decomposition, cfg: SPDConfig, seed_dir: Path,
             seed: int, n_eval: int = 4000) -> dict:
    """Metrics of one decomposition (figures in ``seed_dir``) on ``n_eval`` held-out samples."""
    spec = setting_spec(name.removesuffix("-id"))
    x = spec.sample(n_eval, step_generator(seed + 10_000, 0))
    ci = causal_importances(model, dec, x)
    alive = alive_subcomponents(ci)
    ci1 = one_hot_importances(model, dec, spec.n_features, ONE_HOT_VALUE)  # x_i = 0.75, as in the paper
    out: dict = {"alive": {k: int(v.sum()) for k, v in alive.items()}, **masked_output_mse(model, dec, x),
                 "L0": {k: float((g > 0).sum(1).float().mean()) for k, g in ci.items()}}
    plot_ci_per_feature(ci1, seed_dir / "ci_per_feature.png", alive)
    P = {k: v.detach() for k, v in dec.components.weights().items()}
    if name.startswith("tms"):
        W = toy.W.detach()
        mmcs, ml2r, mcs, cos, ratio = column_match(W, P["linear1"])
        out.update(mmcs=mmcs, ml2r=ml2r, mcs=mcs.tolist(), max_cos=cos.tolist(), l2_ratio=ratio.tolist(),
                   distinct_matches=int(len(set(mcs.tolist()))))
        m2, r2, *_ = column_match(W, P["linear2"].transpose(1, 2))
        out.update(mmcs_linear2=m2, ml2r_linear2=r2)
        # the same over the alive subcomponents only: a dead subcomponent keeps a tiny norm, and faithfulness makes
        # it absorb the live one's shortfall W_j - U V_j, which is parallel to W_j, so it can win the argmax with a
        # cosine of 1 and an L2 ratio near 0
        live = torch.from_numpy(alive["linear1"])
        if live.any():
            ma, ra, mcs_a, *_ = column_match(W, P["linear1"][live])
            out.update(mmcs_alive=ma, ml2r_alive=ra, n_alive_linear1=int(live.sum()))
        norms = P["linear1"].flatten(1).norm(dim=1).numpy()
        shown = np.argsort(-norms)[:min(dec.C, 2 * spec.n_features if W.shape[0] == 2 else dec.C)]
        plot_tms(W.numpy(), P["linear1"][torch.from_numpy(np.sort(shown))].numpy(), seed_dir / "components.png")
    else:
        ins = [s.name for s in dec.sites if s.name.endswith("mlp_in")]
        per = subcomponents_per_feature(ci1)
        out["subcomponents_per_feature"] = {k: v.tolist() for k, v in per.items()}
        sets = {k: responsible_sets(ci1[k]) for k in ins}
        owners = {k: [int(s[0]) for s in v if len(s) == 1] for k, v in sets.items()}
        out["features_with_one_subcomponent"] = {k: int(sum(len(s) == 1 for s in v)) for k, v in sets.items()}
        out["features_covered"] = int(sum(any(len(sets[k][i]) >= 1 for k in ins) for i in range(spec.n_features)))
        served = {k: (ci1[k] > ALIVE_THRESHOLD).sum(0).cpu().numpy() for k in ins}  # features each subcomponent serves
        out["identity_ci_error"] = {k: identity_ci_error(ci1[k]) for k in ins}
        out["features_monosemantic"] = int(sum(
            any(len(sets[k][i]) for k in ins) and all((served[k][sets[k][i]] == 1).all() for k in ins)
            for i in range(spec.n_features)))
        out["features_one_distinct"] = {k: int(len(set(v))) for k, v in owners.items()}
        outs = [s.name for s in dec.sites if s.name.endswith("mlp_out")]
        out["mlp_out_coactive"] = {k: float((ci1[k][:, torch.from_numpy(alive[k])] > ALIVE_THRESHOLD).float().mean())
                                   if alive[k].any() else None for k in outs}
        out["mlp_out_one_hot"] = {k: coactivity(ci1[k]) for k in outs}
        width = {s.name: s.d_in for s in dec.sites if s.name in outs}  # W_out: [d_resid, d_mlp of its layer]
        out["d_mlp"] = int(sum(width.values()))
        out["dense_ci_error"] = {k: dense_ci_error(ci1[k], min(width[k], dec.C)) for k in outs}
        xs = x[(x != 0).any(1)]
        res = scrubbing(model, dec, xs, sets, seed=seed)
        summ = res.summary()
        out.update(ci_masked_mse_scrub=summ["topk_mse"], scrubbed_mse=summ["scrubbed_mse"],
                   anti_scrubbed_mse=summ["anti_scrubbed_mse"])
        plot_scrubbing(res, seed_dir / "scrubbing_hist.png")
    return out


# ---------------------------------------------------------------------------------------------- reproduce
def reproduce(setting: str, seeds: int, out: str | Path, quick: bool = False, quiet: bool = False,
              overrides: dict | None = None, n_eval: int = 4000, device: str | None = None,
              apd_run: str | Path | None = None, recipe: str | None = None, fidelity: str | None = None) -> dict:
    """Train (or load) targets, decompose with SPD for ``seeds`` seeds, evaluate, write ``metrics.json``,
    ``report.md`` and ``report.html``. Re-running resumes unfinished decompositions from their checkpoints.

    ``apd_run``: the output directory of ``reproduce apd`` on the same TMS setting (without the "-id"); its per-seed
    MMCS / ML2R, failed seeds and the paper's statistic go beside ours (:func:`compare_apd`), seed by seed.
    ``recipe``: :data:`~mlpinterp.studies.spd.settings.RECIPES` (``None``:
    :func:`~mlpinterp.studies.spd.settings.default_recipe`). A directory whose ``metrics.json`` records another recipe
    is refused, naming both. ``fidelity``: the targets' recipe (``None``: the SPD reference's,
    :func:`target_fidelity`; ``"ours"``: our residual-MLP targets, with biases).

    Raises ``ValueError`` for an unknown setting, ``seeds < 1``, ``n_eval < 1``, bad overrides, an unavailable
    device, an ``apd_run`` of another setting or with other targets, or (before any training) a seed's saved target
    in ``out`` made with another recipe (:func:`mlpinterp.toys.settings.check_target`).
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an int >= 1, got {seeds!r}")
    check_int(n_eval, "n_eval")  # refused now, not by the evaluation after the first decomposition
    recipe = default_recipe(setting) if recipe is None else recipe
    cfg0 = spd_config(setting, quick, 0, recipe, **(overrides or {}))
    fid = target_fidelity(setting) if fidelity is None else fidelity  # validated by check_target below
    if device is not None:
        check_device(device)
    out = check_out_dir(out, "spd")
    if (out / "metrics.json").is_file():  # the default recipe changed: say which one the directory holds
        saved = read_output(out / "metrics.json", what="metrics").get("recipe", "paper")
        if saved != recipe:
            raise ValueError(f"out {str(out)!r} holds a `--recipe {saved}` run (its metrics.json), but recipe "
                             f"{recipe!r} was requested (without --recipe: the default, \"{default_recipe(setting)}\" "
                             f"for {setting}); pass --recipe {saved} to resume it, or use another --out")
    apd = read_apd_run(apd_run, setting, out) if apd_run is not None else None  # fail before hours of training
    for seed in range(seeds):  # so are targets of another recipe
        check_target(setting.removesuffix("-id"), seed, out / f"seed{seed}" / "target.safetensors", quick, fid)
    run_cfg = {**asdict(cfg0), "setting": setting, "quick": quick, "fidelity": fid, "recipe": recipe,
               "seeds": seeds, "n_eval": n_eval}
    with open_run(out, "reproduce spd", run_cfg, resumable=("log_every", "checkpoint_every")) as rd:
        return _reproduce_open(rd, setting, seeds, quick, quiet, overrides, n_eval, device, apd, recipe, fid, cfg0)


def _reproduce_open(rd: RunDir, setting: str, seeds: int, quick: bool, quiet: bool, overrides: dict | None,
                    n_eval: int, device: str | None, apd, recipe: str, fid: str, cfg0) -> dict:
    """:func:`reproduce` once ``out`` is open."""
    out = rd.path
    per_seed = []
    for seed in range(seeds):
        sd = out / f"seed{seed}"
        toy, model, info = spd_target(setting, seed, sd / "target.safetensors", quick, quiet, fid)
        if apd is not None:
            check_same_target(apd, out, seed)  # before this seed's decomposition, not after all of them
        model.requires_grad_(False)
        cfg = spd_config(setting, quick, seed, recipe, **(overrides or {}))
        spec = setting_spec(setting.removesuffix("-id"))
        sample = lambda step, cfg=cfg, seed=seed, spec=spec: spec.sample(cfg.batch_size,
                                                                        step_generator(seed + 1000, step))
        res = decompose(model, sample, cfg, out_dir=sd / "spd", quiet=quiet, device=device)
        dec = res.decomposition.float()
        save_artifact(sd / "decomposition.safetensors", dict(dec.state_dict()), kind="spd_decomposition",
                      provenance={"setting": setting, "seed": seed},
                      meta={"setting": setting, "config": asdict(cfg), "sites": [asdict(s) for s in dec.sites],
                            "reads": dec.reads})
        atomic_write_json(sd / "history.json", res.history)
        plot_history(res.history, sd / "losses.png", f"SPD {setting} seed {seed}", keys=_LOSSES)
        m = evaluate(setting, toy, model, dec, cfg, sd, seed, n_eval)
        m.update(seed=seed, seconds=res.seconds, final=res.history[-1] if res.history else {},
                 target_loss=info.get("loss"))
        per_seed.append(m)
    result = {"method": "spd", "setting": setting, "quick": quick, "recipe": recipe, "target_fidelity": fid,
              "overrides": recipe_overrides(spd_config(setting, quick, 0, recipe), overrides), "seeds": seeds,
              "config": asdict(cfg0), "per_seed": per_seed,
              "device": device or "cpu", "threads": torch.get_num_threads(),
              "machine": platform.processor() or platform.machine(),
              "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
              "wall_seconds": rd.wall_seconds, "sessions": rd.sessions}
    if setting.startswith("tms"):
        result["mmcs"] = [m["mmcs"] for m in per_seed]
        result["ml2r"] = [m["ml2r"] for m in per_seed]
        result["failed_seeds"] = int(sum(v < FAILED_MMCS for v in result["mmcs"]))
        result["paper_statistic"] = paper_statistic(per_seed)
        if apd is not None:
            result["apd"] = compare_apd(apd, seeds)
    result["summary"] = {k: rep.summary([m[k] for m in per_seed]).to_dict()
                         for k in ("mmcs", "ml2r", "mmcs_alive", "ml2r_alive", "ci_masked_mse", "stochastic_masked_mse", "scrubbed_mse",
                                   "anti_scrubbed_mse", "seconds") if all(k in m for m in per_seed)}
    write_output(out / "metrics.json", result)
    write_spd_report(out, result)
    return result


