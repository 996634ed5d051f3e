"""``reproduce three-spaces``: one MLP, three decompositions read in its input space, one report.

For each seed: the target (toys: trained or loaded like the SPD study's; transformers: captured once), the function-
space approximant and its directions, SPD's alive read directions, a TopK SAE's alive decoder directions; then each
set against the ground truth (toys) and against each other, each method's held-out faithfulness and sparsity and,
for transformers, the downstream effect of each replacing the block. Writes ``results.json``, ``figures/`` and
``report.md`` / ``report.html``.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import torch

from mlpinterp.studies.three_spaces.activation_space import activation_space
from mlpinterp.studies.three_spaces.block import Block, toy_block, transformer_block
from mlpinterp.studies.three_spaces.compare import against_truth, pairwise
from mlpinterp.studies.three_spaces.directions import on_support, support_basis
from mlpinterp.studies.three_spaces.function_space import function_space
from mlpinterp.studies.three_spaces.parameter_space import parameter_space
from mlpinterp.studies.three_spaces.settings import DEFAULT_LAYER, SETTINGS, TOYS, Preset, preset
from mlpinterp.utils.io import atomic_write_json, read_json
from mlpinterp.utils.validation import check_bool, check_int


def _cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (user + system)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _decompose(block: Block, pre: Preset, spd_cfg, seed: int, quiet: bool, spd_dir: Path) -> tuple[dict, dict]:
    """The three decompositions of ``block``: ``(measurements, {method: directions})``; SPD checkpoints in
    ``spd_dir`` (an interrupted run resumes there)."""
    t = {}
    t0 = time.perf_counter()
    fs = function_space(block)
    t["function"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ps = parameter_space(block, spd_cfg, quiet=quiet, out_dir=spd_dir)
    t["parameter"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    acts = activation_space(block, d_sae=pre.sae_d_sae, k=pre.sae_k, steps=pre.sae_steps, batch_size=pre.sae_batch,
                            seed=seed, quiet=quiet, **pre.sae_config)
    t["activation"] = time.perf_counter() - t0
    sets = {**fs["directions"], **ps["directions"], **acts["directions"]}
    meas = {"function": {k: v for k, v in fs.items() if k not in ("directions", "polynomial")},
            "parameter": {k: v for k, v in ps.items() if k not in ("directions", "decomposition")},
            "activation": {k: v for k, v in acts.items() if k not in ("directions", "sae")},
            "seconds": t, "_objects": {"decomposition": ps["decomposition"], "sae": acts["sae"],
                                                "polynomial": fs["polynomial"]}}
    return meas, sets


def _compare(block: Block, sets: dict, seed: int) -> dict:
    """Every set projected onto the held-out inputs' support (:func:`directions.on_support`), then compared."""
    cov = np.cov(block.X_test, rowvar=False).reshape(block.network.d_in, block.network.d_in)
    basis = support_basis(cov)
    proj, share = {}, {}
    for k, v in sets.items():
        proj[k], sh = on_support(v, basis, k)
        share[k] = {"mean": float(sh.mean()), "min": float(sh.min())}
    res = {"pairwise": pairwise(proj, cov, seed=seed), "counts": {k: int(v.shape[0]) for k, v in sets.items()},
           "support_dim": int(basis.shape[0]), "share_on_support": share}
    if block.truth is not None:
        res["truth"] = against_truth(block.truth, proj, seed=seed, support=basis)
    return res


def _spd_per_feature(block: Block, dec, n_features: int) -> dict:
    """The SPD paper's resid-MLP criterion on the input site: causal importances on the one-hot inputs
    ``0.75 e_i``; features with exactly one subcomponent above the alive threshold, distinct such owners, and the
    identity-pattern errors (:func:`mlpinterp.spd.metrics.identity_ci_error`)."""
    from mlpinterp.spd.metrics import ONE_HOT_VALUE, identity_ci_error, one_hot_importances, responsible_sets

    ci1 = one_hot_importances(block.spd_model, dec, n_features, ONE_HOT_VALUE)[block.spd_input_site]
    sets = responsible_sets(ci1)
    owners = [int(r[0]) for r in sets if len(r) == 1]
    return {"site": block.spd_input_site, "n_features": n_features,
            "features_with_one_subcomponent": int(sum(len(r) == 1 for r in sets)),
            "distinct_owners": len(set(owners)), "identity_ci_error": identity_ci_error(ci1)}


def _toy_seed(setting: str, seed: int, pre: Preset, out: Path, quick: bool, quiet: bool) -> dict:
    from mlpinterp.studies.spd.run import spd_target
    from mlpinterp.studies.spd.settings import default_recipe, spd_config
    from mlpinterp.toys.settings import setting_spec

    toy, model, info = spd_target(setting, seed, out / "targets" / f"seed_{seed}", quick, quiet)
    block = toy_block(setting, toy, model, setting_spec(setting).sample, seed, pre.n_fit, pre.n_test)
    cfg = spd_config(setting, pre.spd_preset == "quick", seed, recipe=default_recipe(setting), **pre.spd)
    meas, sets = _decompose(block, pre, cfg, seed, quiet, out / "spd" / f"seed_{seed}")
    objects = meas.pop("_objects")
    if setting == "resid-mlp-1":
        meas["parameter"]["per_feature"] = _spd_per_feature(block, objects["decomposition"], block.truth.shape[0])
    return {"seed": seed, "target_loss": info.get("loss"), "block": block.info, **meas, **_compare(block, sets, seed),
            "directions": {k: v.tolist() for k, v in sets.items()} if block.network.d_in <= 16 else None,
            "truth_directions": block.truth.tolist() if block.network.d_in <= 16 else None}


def seed_result(setting: str, seed: int, out: str | os.PathLike, *, quick: bool = False, quiet: bool = True) -> dict:
    """One seed of a toy setting: read from ``out/seeds/seed_{seed}.json`` when a finished run of the same setting
    and budget left it there, else computed and written there (atomically). A resumed study skips its finished
    seeds, and seeds may be computed by separate processes into one ``out`` before ``reproduce`` reports them.

    Raises ``ValueError`` for a setting that is not a toy (:data:`TOYS`) or a negative seed, and what the
    decompositions raise.
    """
    if setting not in TOYS:
        raise ValueError(f"setting must be one of {TOYS} (the toys; the transformer settings share one capture), "
                         f"got {setting!r}")
    seed = check_int(seed, "seed", minimum=0)
    check_bool(quick, "quick")
    out = Path(out)
    pre = preset(setting, quick)
    key = {"setting": setting, "quick": quick, "budget": json.loads(json.dumps(vars(pre)))}
    path = out / "seeds" / f"seed_{seed}.json"
    if path.is_file():
        saved = read_json(path)
        if saved.get("key") == key:
            return saved["result"]
    res = _toy_seed(setting, seed, pre, out, quick, quiet)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"key": key, "result": res})
    return read_json(path)["result"]  # as a resumed run reads it (non-finite values as None)


def _lm_model(setting: str, model: str | None, pre: Preset, out: Path, quiet: bool, text_dir):
    from mlpinterp.lm.models import load_model

    if setting == "minilm":
        return load_model("minilm"), "minilm"
    if model is not None:
        return load_model(os.fspath(model)), os.fspath(model)
    from mlpinterp.lm.train import train_lm
    from mlpinterp.lm.train_config import LmTrainConfig

    lm_dir = (out / "lm").resolve()
    train_lm(LmTrainConfig(**pre.lm_train), lm_dir, text_dir=text_dir, quiet=quiet)
    return load_model(str(lm_dir)), f"train-lm ({', '.join(f'{k}={v}' for k, v in pre.lm_train.items()) or 'defaults'})"


def _downstream(model, tok, site, block: Block, objects: dict, ids) -> dict:
    """Each decomposition replacing the block (special tokens keep the exact output), with zero ablation beside."""
    from mlpinterp.lm.hooks import track_positions
    from mlpinterp.lm.recovery import Replacement, downstream_comparison, recovered
    from mlpinterp.paramspace.forward import run_with_components

    poly = objects["polynomial"].to_module()
    sae, dec = objects["sae"], objects["decomposition"]
    block_mod = block.spd_model

    def flat(fn):
        def wrapped(x):
            return fn(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        return wrapped

    def spd_fn(x):
        x = x.float()
        _, acts = dec.target_forward(block_mod, x)
        return run_with_components(block_mod, dec.components, x, dec.causal_importance(acts)[0])

    with track_positions(model, tok.all_special_ids) as keep, torch.no_grad():
        reps = {"zero": Replacement(site.output_module, lambda h: torch.zeros_like(h), keep=keep),
                "approximant": Replacement(site.output_module, flat(lambda x: poly(x.double())),
                                           input_of=site.input_module, keep=keep),
                "sae": Replacement(site.output_module, flat(lambda x: block_mod(sae(x.float()).sae_out)),
                                   input_of=site.input_module, keep=keep),
                "spd": Replacement(site.output_module, flat(spd_fn), input_of=site.input_module, keep=keep)}
        raw = downstream_comparison(model, reps, ids)
    res = {"kind": raw["kind"], "n_sequences": int(ids.shape[0])}
    for name in ("approximant", "sae", "spd", "zero"):
        r = dict(raw[name])
        if raw["kind"] == "lm":
            r["recovered"] = recovered(r["ce"], raw["clean"]["ce"], raw["zero"]["ce"])
        else:
            r["recovered"] = recovered(r["cos"], 1.0, raw["zero"]["cos"])
        res[name] = r
    if raw["kind"] == "lm":
        res["clean"] = raw["clean"]
    return res


def _transformer_seeds(setting: str, seeds: int, pre: Preset, out: Path, layer: int | None, model_name, quiet: bool,
                       text_dir) -> tuple[list[dict], dict]:
    import mlpinterp as mi
    from mlpinterp.lm.capture import capture_ffn_inputs
    from mlpinterp.lm.capture_config import CaptureConfig
    from mlpinterp.lm.text import read_texts
    from mlpinterp.spd.train import SPDConfig

    (model, tok), label = _lm_model(setting, model_name, pre, out, quiet, text_dir)
    paths = mi.ffn_paths(model)
    layer = DEFAULT_LAYER[setting] if layer is None else layer
    if not 0 <= layer < len(paths):
        raise ValueError(f"layer must be in [0, {len(paths)}) for this model ({len(paths)} FFN blocks), got {layer}")
    site = mi.ffn_site(model, paths[layer])
    t0 = time.perf_counter()
    cap = capture_ffn_inputs(model, tok, {site.path: site.input_module},
                             CaptureConfig(max_tokens=pre.max_tokens, keep_fit=pre.n_fit),
                             texts=None if text_dir is None else read_texts(text_dir), quiet=quiet)
    bc = cap.blocks[site.path]
    block = transformer_block(site.network, bc.fit.double().numpy(), bc.heldout[:pre.n_test].double().numpy(),
                              pre.n_readouts, 0)
    ctx = {"model": label, "layer": layer, "site": site.path,
           "n_fit_tokens": cap.n_fit_tokens, "n_heldout_tokens": cap.n_heldout_tokens,
           "capture_seconds": time.perf_counter() - t0}
    per = []
    for seed in range(seeds):
        cfg = SPDConfig(targets=("0", "2"), seed=seed, **pre.spd)
        meas, sets = _decompose(block, pre, cfg, seed, quiet, out / "spd" / f"seed_{seed}")
        objects = meas.pop("_objects")
        down = _downstream(model, tok, site, block, objects, cap.heldout_ids[:pre.splice_sequences])
        per.append({"seed": seed, "block": block.info, **meas, **_compare(block, sets, seed), "downstream": down})
    return per, ctx


def reproduce(setting: str, out: str | os.PathLike, *, quick: bool = False, seeds: int = 1, layer: int | None = None,
              model: str | os.PathLike | None = None, text_dir: str | os.PathLike | None = None,
              quiet: bool = False) -> dict:
    """Run the study and write ``out/results.json``, ``out/figures/*.png``, ``out/report.md`` and ``report.html``.

    ``setting``: one of :data:`SETTINGS`; ``quick``: the smoke preset (a pipeline check, no conclusion);
    ``seeds``: seeds of the target (toys) and of SPD and the SAE; ``layer``: the FFN block of a transformer
    (default :data:`DEFAULT_LAYER`); ``model``: the causal LM's directory for ``lm`` (default: a small one trained
    by ``train-lm`` into ``out/lm``); ``text_dir``: the transformer settings' text (default: the bundled corpora).

    Raises ``ValueError`` for an unknown setting, ``seeds < 1``, ``layer`` / ``model`` given for a setting that has
    none, a layer outside the model, and what the decompositions raise; ``FileNotFoundError`` for a ``text_dir``
    that does not exist (before any model is loaded).
    """
    if not isinstance(setting, str) or setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    check_bool(quick, "quick")
    seeds = check_int(seeds, "seeds")
    if setting in TOYS and layer is not None:
        raise ValueError(f"layer applies to the transformer settings (minilm, lm), not to {setting}")
    if setting != "lm" and model is not None:
        raise ValueError(f"model applies to the lm setting only, not to {setting}")
    if setting in TOYS and text_dir is not None:
        raise ValueError(f"text_dir applies to the transformer settings (minilm, lm), not to {setting}")
    if text_dir is not None and not Path(text_dir).exists():  # before a model is loaded or trained
        raise FileNotFoundError(f"text_dir {os.fspath(text_dir)!r} does not exist")
    if layer is not None:
        check_int(layer, "layer", minimum=0)
    from mlpinterp.utils.rundir import open_run

    pre = preset(setting, quick)
    config = {"setting": setting, "quick": quick, "seeds": seeds, "layer": layer,
              "model": None if model is None else os.fspath(model), "budget": dict(vars(pre))}
    with open_run(out, "reproduce three-spaces", config) as _:
        return _reproduce(setting, Path(out), pre, quick, seeds, layer, model, text_dir, quiet)


def _reproduce(setting: str, out: Path, pre: Preset, quick: bool, seeds: int, layer, model, text_dir, quiet: bool
               ) -> dict:
    t0, c0 = time.perf_counter(), _cpu_seconds()
    if setting in TOYS:
        per = [seed_result(setting, s, out, quick=quick, quiet=quiet) for s in range(seeds)]
        ctx = {}
    else:
        per, ctx = _transformer_seeds(setting, seeds, pre, out, layer, model, quiet, text_dir)
    results = {"study": "three-spaces", "setting": setting, "preset": "quick" if quick else "full", "seeds": seeds,
               "budget": {k: v for k, v in vars(pre).items()}, "context": ctx, "per_seed": per,
               "seconds": time.perf_counter() - t0, "cpu_seconds": _cpu_seconds() - c0,
               "load_average": list(os.getloadavg()), "threads": torch.get_num_threads()}
    from mlpinterp.studies.three_spaces.report import write

    results["figures"] = write(out, results)
    atomic_write_json(out / "results.json", results)
    return results
