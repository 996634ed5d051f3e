"""``mlpinterp reproduce transformer``: exact polynomial approximants of a real transformer's FFN blocks.

For each FFN block of the model (MiniLM by default, any Hugging Face model already on disk): capture the block's
real inputs from text, fit input models to them, fit the approximants of every degree under each input model,
and measure how well each works, where it matters: on held-out real tokens and inside the model (splice-in).

Input models (``input_models``):

* ``gaussian``: one Gaussian (empirical or Ledoit-Wolf covariance of all fit tokens); the exact optimal approximant
  under it (Rigg & Belrose 2025, eq. 2), its exact FVU under the Gaussian (MLP blocks; Monte Carlo for GLUs).
* ``mixture``: a scikit-learn ``GaussianMixture`` (K full covariances, seeded) fitted to the fit tokens; degree 1
  is the exact optimum under the mixture (law of total covariance); degrees >= 2 are the least-squares projection
  onto the block's ridge family under the mixture (:mod:`mlpinterp.poly.readout`).
* ``data``: the exact least-squares projection onto the ridge family under the empirical law of the fit tokens
  (:mod:`mlpinterp.poly.projection`); degree 1 is the affine OLS baseline.
* ``hybrid``: the paper's remedy (closed form, then schedule-free fine-tuning of every factor on the fit tokens;
  :mod:`mlpinterp.poly.readout_finetune`).

Layout of ``out``::

    config.json                 the run's configuration (a re-run with another one is refused)
    capture.safetensors/.json   captured activations (fit subsample, held-out, moments) and token ids (resumable)
    layers/<i>.json             per-block results (skipped when present: resumable)
    layers/<i>_features.npz     eigen-features of the recommended degree-2 approximant
    results.json, figures/*.png, report.md, report.html
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from mlpinterp.lm.capture import BlockCapture, Capture, Moments, capture_ffn_inputs
from mlpinterp.studies.transformer.settings import ADDED_FIELDS, TransformerExperiment
from mlpinterp.utils.artifact import load_artifact, save_artifact
from mlpinterp.utils.config_diff import config_diff
from mlpinterp.utils.rundir import RunDir, open_run, read_output, write_output

# ------------------------------------------------------------------------------------------------ capture cache


def _save_capture(path: Path, cap: Capture) -> None:
    tensors, meta = {"fit_ids": cap.fit_ids, "heldout_ids": cap.heldout_ids}, {"blocks": []}
    for i, (p, b) in enumerate(cap.blocks.items()):
        tensors.update({f"b{i}.fit": b.fit, f"b{i}.heldout": b.heldout, f"b{i}.s1": torch.from_numpy(b.moments.s1),
                        f"b{i}.s2": torch.from_numpy(b.moments.s2)})
        meta["blocks"].append({"path": p, "n": b.moments.n})
    meta.update(n_fit_tokens=cap.n_fit_tokens, n_heldout_tokens=cap.n_heldout_tokens, seconds=cap.seconds,
                info=cap.info)
    save_artifact(path, tensors, kind="ffn_capture", meta=meta)


def _load_capture(path: Path, d_in: dict[str, int], ctx_len: int) -> Capture:
    """The capture saved at ``path``, checked against the blocks analysed (``d_in`` per FFN path) and ``ctx_len``.

    Raises ``ValueError`` naming the file for a corrupt or truncated file, missing entries or shapes that do not
    fit the blocks (a capture of another model or configuration).
    """
    fix = f"delete {path.name} and {path.with_suffix('.json').name} in {str(path.parent)!r} to capture again"
    art = load_artifact(path, kind="ffn_capture", fix=fix, what="capture")
    t, meta = art.tensors, art.meta
    try:
        blocks = {}
        for i, b in enumerate(meta["blocks"]):
            m = Moments(int(b["n"]), t[f"b{i}.s1"].numpy(), t[f"b{i}.s2"].numpy())
            blocks[b["path"]] = BlockCapture(fit=t[f"b{i}.fit"], heldout=t[f"b{i}.heldout"], moments=m)
        cap = Capture(blocks=blocks, fit_ids=t["fit_ids"], heldout_ids=t["heldout_ids"],
                      n_fit_tokens=int(meta["n_fit_tokens"]), n_heldout_tokens=int(meta["n_heldout_tokens"]),
                      seconds=float(meta["seconds"]), info=meta.get("info", {}))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"capture {str(path)!r} is incomplete or corrupt ({type(e).__name__}: {e}); {fix}") from e
    missing = sorted(set(d_in) - set(cap.blocks))
    if missing:
        raise ValueError(f"capture {str(path)!r} holds no activations of the block(s) {missing}; {fix}")
    for p, d in d_in.items():
        b = cap.blocks[p]
        shapes = [tuple(b.fit.shape), tuple(b.heldout.shape), tuple(b.moments.s1.shape)]
        if b.fit.ndim != 2 or b.heldout.ndim != 2 or b.fit.shape[1] != d or b.heldout.shape[1] != d or \
                b.moments.s1.shape[0] != d or not bool(torch.isfinite(b.fit).all() and torch.isfinite(b.heldout).all()):
            raise ValueError(f"capture {str(path)!r}: the activations of block {p!r} (shapes {shapes}) are not finite "
                             f"[n, d_in={d}] inputs of that block; {fix}")
    for name, ids in (("fit_ids", cap.fit_ids), ("heldout_ids", cap.heldout_ids)):
        if ids.ndim != 2 or ids.shape[1] != ctx_len or ids.is_floating_point():
            raise ValueError(f"capture {str(path)!r}: {name} {list(ids.shape)} are not token sequences of ctx_len="
                             f"{ctx_len}; {fix}")
    return cap


def _check_inputs(out: Path, model_digest: str, text_digest: str) -> None:
    """Refuse a run directory whose cached activations and results came from other weights or another text.

    ``inputs.json`` records the digests of the model's weights and of the corpus the first time; a resumed run
    must match them (the configuration alone does not say which weights a model path held, nor which text).
    """
    path = out / "inputs.json"
    now = {"model_digest": model_digest, "text_digest": text_digest}
    if path.exists():
        old = read_output(path, what="run inputs")
        diff = [k.removesuffix("_digest") for k in config_diff({k: old.get(k) for k in now}, now)]
        if diff:
            raise ValueError(f"{str(out)!r} holds a run made from another {' and another '.join(diff)} (the "
                             f"{'weights at the model path' if 'model' in diff else 'text'} changed since); use a new "
                             "--out or delete the directory")
        return
    cached = [n for n in ("capture.safetensors", "layers") if (out / n).exists()]
    if cached:
        raise ValueError(f"{str(out)!r} holds {', '.join(cached)} but no inputs.json, so it cannot be checked that they "
                         "came from this model and text; use a new --out or delete the directory")
    write_output(path, now)


# ------------------------------------------------------------------------------------------------ one block


class _Clock:
    """Wall and CPU seconds per named step (``with clock("data"): ...``); ``total(name)`` since creation."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self._t0 = (time.perf_counter(), time.process_time())

    def total(self, name: str) -> None:
        self.wall[name] = time.perf_counter() - self._t0[0]
        self.cpu[name] = time.process_time() - self._t0[1]

    def __call__(self, name: str):
        from contextlib import contextmanager

        @contextmanager
        def span():
            w, c = time.perf_counter(), time.process_time()
            try:
                yield
            finally:
                self.wall[name] = time.perf_counter() - w
                self.cpu[name] = time.process_time() - c

        return span()


def _heldout_metrics(Y: np.ndarray, P: np.ndarray) -> dict:
    from mlpinterp.poly.metrics import fvu_from_outputs

    r = fvu_from_outputs(Y, P)
    cos = (Y * P).sum(1) / np.maximum(np.linalg.norm(Y, axis=1) * np.linalg.norm(P, axis=1), 1e-300)
    return {"fvu": r.fvu, "fvu_se": r.stderr, "cosine": float(cos.mean()), "n": int(Y.shape[0])}


def analyse_block(network, block: BlockCapture, exp: TransformerExperiment, *, quiet: bool = True) -> tuple[dict, dict]:
    """Every input model x degree for one block: held-out FVU / cosine, FVU under the model, validation FVU.

    Returns ``(results, approximants)`` with ``approximants[(input_model, degree)]`` a callable numpy
    approximant (``RidgePolynomial`` or ``DensePolynomial``).
    """
    import mlpinterp as mi
    from mlpinterp.lm.gaussianity import gaussianity
    from mlpinterp.lm.input_models import fit_gaussian, fit_mixture
    from mlpinterp.networks import MLP
    from mlpinterp.poly.mixture.readout_moments import mixture_normal_equations
    from mlpinterp.poly.projection import project_on_data, solve_projection
    from mlpinterp.poly.readout import Readout, RidgeBasis
    from mlpinterp.poly.readout_finetune import finetune

    clock = _Clock()
    X_all = block.fit.double().numpy()
    n_val = max(2, int(round(exp.val_fraction * X_all.shape[0])))
    # held back from fitting: one half picks the data projection's ridge, the other the recommended input model
    X_fit, X_tune, X_val = X_all[:-n_val], X_all[-n_val:-n_val // 2], X_all[-n_val // 2:]
    X_held = block.heldout.double().numpy()
    Y_val, Y_held = network(X_val), network(X_held)
    degrees = sorted(set(exp.degrees))
    res: dict = {"n_fit_tokens": block.moments.n, "n_kept": int(X_fit.shape[0]), "n_tune": int(X_tune.shape[0]),
                 "n_val": int(X_val.shape[0]), "n_heldout": int(X_held.shape[0]), "models": {}, "timing_s": clock.wall,
                 "cpu_s": clock.cpu}
    approx: dict = {}
    W = network.W1 if isinstance(network, MLP) else network.W
    b = network.b1 if isinstance(network, MLP) else network.b
    res["diagnostics"] = gaussianity(X_fit, W, b, seed=exp.seed)

    with clock("gaussian_fit"):
        g = fit_gaussian(block.moments, exp.covariance, X_fit[:20_000])
        closed = {n: mi.fit_polynomial(network, g, n) for n in degrees}
        basis = RidgeBasis.from_closed_form(closed[degrees[-1]], g)

    def record(model: str, n: int, p, under: dict | None) -> None:
        approx[(model, n)] = p
        entry = {"heldout": _heldout_metrics(Y_held, p(X_held)), "val_fvu": _heldout_metrics(Y_val, p(X_val))["fvu"],
                 "under_model": under}
        res["models"].setdefault(model, {})[str(n)] = entry

    if "gaussian" in exp.input_models:
        with clock("gaussian"):
            for n in degrees:
                if isinstance(network, MLP):  # exact FVU from bivariate Gaussian integrals
                    r = mi.fvu(network, closed[n], g)
                    under = {"fvu": r.fvu, "se": None, "method": "exact"}
                else:  # GLU: the projection under the Gaussian *is* the closed form; its exact in-model FVU
                    info = solve_projection(mixture_normal_equations(network, basis, g, n), basis)[1]
                    under = {"fvu": info["fvu"], "se": None, "method": "exact (Gaussian moments)"}
                record("gaussian", n, closed[n], under)

    if "data" in exp.input_models:
        with clock("data"):
            proj = project_on_data(network, basis, X_fit, degrees, ridge="validation", X_val=X_tune)
            for n in degrees:
                ro, info = proj[n]
                p = ro.to_polynomial(info={"input_model": "data", **info})
                record("data", n, p, {"fvu": info["fvu"], "se": None, "method": "in-sample (fit tokens)",
                                      "ridge": info["ridge"]})

    if "mixture" in exp.input_models:
        with clock("mixture"):
            with clock("mixture_em"):
                mix, mix_info = fit_mixture(X_fit, exp.mixture_components, exp.mixture_fit_samples, exp.seed)
            res["mixture"] = {"K": mix.K, **mix_info}
            # exact expectations under the mixture: degree 1 is the exact affine optimum (= law of total covariance),
            # degrees >= 2 the ridge-family optimum; the solve's FVU is the exact FVU under the mixture
            neq = mixture_normal_equations(network, basis, mix, degrees[-1])
            for n in degrees:
                ro, info = solve_projection(neq.leading(n, basis), basis)
                p = ro.to_polynomial(info={"input_model": "mixture", **info})
                record("mixture", n, p, {"fvu": info["fvu"], "se": None,
                                         "method": "exact (mixture moments)" if n > 1 else "exact (affine optimum)"})

    if "hybrid" in exp.input_models:
        with clock("hybrid"):
            res["hybrid_history"], res["hybrid_steps"] = {}, {}
            for n in degrees:
                start = Readout.from_closed_form(closed[n], RidgeBasis.from_closed_form(closed[n], g))
                # the best step is chosen on the tuning tokens (as the data projection's ridge), so the validation
                # tokens stay unused for the recommendation below
                hr = finetune(network, start, X_fit, replace(exp.hybrid, seed=exp.seed), X_val=X_tune, quiet=quiet,
                              desc=f"hybrid degree {n}")
                res["hybrid_history"][str(n)] = hr.history
                res["hybrid_steps"][str(n)] = hr.summary()
                p = hr.readout.to_polynomial(info={"input_model": "hybrid"})
                Y_fit_sub = network(X_fit[:20_000])
                r = _heldout_metrics(Y_fit_sub, p(X_fit[:20_000]))
                record("hybrid", n, p, {"fvu": r["fvu"], "se": r["fvu_se"], "method": "in-sample (fit tokens)"})

    # the input model recommended for this block: lowest validation FVU at the highest degree (never the held-out)
    top = str(degrees[-1])
    res["recommended"] = min(res["models"], key=lambda m: res["models"][m][top]["val_fvu"])
    clock.total("block")
    return res, approx


# ------------------------------------------------------------------------------------------------ the run


def _check_config(out: Path, exp: TransformerExperiment) -> dict:
    """Refuse ``out`` if it holds a run with another configuration (a ``config.json`` written before a field of
    :data:`~mlpinterp.studies.transformer.settings.ADDED_FIELDS` existed compares as the behaviour of that time);
    returns this run's configuration as JSON (written to ``out/config.json`` by the caller once the run's inputs are
    validated, so a command that fails on a bad model or layer leaves nothing that blocks the corrected command)."""
    cfg_path = out / "config.json"
    cfg = json.loads(json.dumps(asdict(exp)))
    if cfg_path.exists():
        old = read_output(cfg_path, what="run configuration")
        diff = config_diff(old, cfg, implicit=ADDED_FIELDS)
        if diff:
            from mlpinterp.models import RunConflictError

            raise RunConflictError(out, "config.json of a run with another configuration", diff,
                                   fix="continue it with its own settings, use a new --out or delete the directory")
    return cfg


def run_transformer(out, exp: TransformerExperiment = TransformerExperiment(), *, quiet: bool = False,
                    texts: list[str] | None = None) -> dict:
    """Run the experiment into ``out`` (resumable); returns the ``results.json`` content."""
    from mlpinterp.hf.blocks import ffn_paths, ffn_site
    from mlpinterp.lm.models import load_model
    from mlpinterp.lm.text import read_texts

    out = Path(out)
    cfg = _check_config(out, exp) if out.is_dir() else json.loads(json.dumps(asdict(exp)))
    model, tok = load_model(exp.model)
    paths = ffn_paths(model)
    bad = [i for i in exp.layers or () if not -len(paths) <= i < len(paths)]
    if bad:
        raise ValueError(f"layers {bad} out of range: the model has {len(paths)} FFN blocks (0..{len(paths) - 1}, "
                         f"or -{len(paths)}..-1 from the last)")
    idx = list(range(len(paths))) if exp.layers is None else \
        list(dict.fromkeys(i % len(paths) for i in exp.layers))  # -1 -> the last; (0, -1) of one block -> [0]
    saes = dict(exp.saes)
    if set(saes) - set(idx):
        raise ValueError(f"SAEs given for layers {sorted(set(saes) - set(idx))}, which are not analysed ({idx})")
    sites = {paths[i]: ffn_site(model, paths[i]) for i in idx}
    texts = read_texts() if texts is None else texts
    # opened once the model, layers and SAEs are validated: a command refused for them leaves no run record
    with open_run(out, "reproduce transformer", cfg, implicit=ADDED_FIELDS) as rd:
        return _run_open(rd, exp, cfg, model, tok, paths, idx, saes, sites, texts, quiet)


def _run_open(rd: RunDir, exp: TransformerExperiment, cfg: dict, model, tok, paths: list, idx: list, saes: dict,
              sites: dict, texts: list[str], quiet: bool) -> dict:
    """:func:`run_transformer` once ``out`` is open."""
    from mlpinterp.lm.models import model_digest
    from mlpinterp.lm.text import texts_digest
    from mlpinterp.studies.transformer.report import write_transformer_report

    out = rd.path
    if not (out / "config.json").exists():
        write_output(out / "config.json", cfg)
    _check_inputs(out, model_digest(model), texts_digest(texts))
    cap_path = out / "capture.safetensors"
    if cap_path.exists() and cap_path.with_suffix(".json").exists():  # both written: a complete capture
        cap = _load_capture(cap_path, {p: s.network.d_in for p, s in sites.items()}, exp.capture.ctx_len)
    else:  # none, or interrupted between the tensors and their metadata: capture (again)
        cap = capture_ffn_inputs(model, tok, {p: s.input_module for p, s in sites.items()},
                                 replace(exp.capture, seed=exp.seed), texts, quiet=quiet)
        _save_capture(cap_path, cap)
    layers = []
    for i, (path, site) in zip(idx, sites.items(), strict=True):
        done = out / "layers" / f"{i}.json"
        if done.exists():
            layers.append(read_output(done, what="finished block"))
            continue
        res, approx = analyse_block(site.network, cap.blocks[path], exp, quiet=quiet)
        res.update({"layer": i, "path": path, "family": site.family, "network": repr(site.network)})
        res["splice"] = _splice(model, tok, site, approx, cap, exp)
        res["features"] = _features(model, tok, site, approx[(res["recommended"], 2)] if 2 in exp.degrees else None,
                                    cap.blocks[path], out / "layers" / f"{i}_features.npz", exp)
        if i in saes and res["features"] is not None:
            res["features"]["sae"] = _sae_alignment(model, site, saes[i], cap, out / "layers" / f"{i}_features.npz")
        write_output(done, res)
        layers.append(res)
    results = {"config": json.loads(json.dumps(asdict(exp))), "model": exp.model, "n_blocks": len(paths),
               "capture": {"n_fit_tokens": cap.n_fit_tokens, "n_heldout_tokens": cap.n_heldout_tokens,
                           "seconds": cap.seconds, "tokens_per_s": cap.tokens_per_s},
               "layers": layers, "seconds": rd.wall_seconds, "sessions": rd.sessions}
    write_output(out / "results.json", results)
    write_transformer_report(out, results)
    return results


def _splice(model, tok, site, approx: dict, cap: Capture, exp: TransformerExperiment) -> dict:
    """Splice-in recovery of every approximant of one block, with zero and mean ablation beside it."""
    from mlpinterp.lm.hooks import track_positions
    from mlpinterp.lm.recovery import Replacement, downstream_comparison, recovered

    ids = cap.heldout_ids[: exp.splice_sequences]
    mean_out = torch.tensor(site.network(cap.blocks[site.path].fit[:20_000].double().numpy()).mean(0))

    def poly_fn(p):
        module = p.to_module()

        def fn(x):
            return module(x.reshape(-1, x.shape[-1]).double()).reshape(*x.shape[:-1], -1)

        return fn

    special = tok.all_special_ids if exp.capture.exclude_special else []
    with track_positions(model, special) as keep, torch.no_grad():
        # positions excluded from the fit (special tokens) keep the exact block output, for every replacement
        reps = {"zero": Replacement(site.output_module, lambda h: torch.zeros_like(h), keep=keep),
                "mean": Replacement(site.output_module, lambda h: mean_out.to(h.dtype).expand_as(h).clone(), keep=keep)}
        for (m, n), p in approx.items():
            reps[f"{m}:{n}"] = Replacement(site.output_module, poly_fn(p), input_of=site.input_module, keep=keep)
        raw = downstream_comparison(model, reps, ids)
    out = {"kind": raw["kind"], "n_sequences": int(ids.shape[0]), "zero": raw["zero"], "mean": raw["mean"],
           "models": {}, "positions": "content tokens (special tokens keep the exact block output)" if special
           else "all tokens"}
    for (m, n) in approx:
        r = raw[f"{m}:{n}"]
        if raw["kind"] == "lm":
            clean = raw["clean"]["ce"]
            r = {**r, "recovered_vs_zero": recovered(r["ce"], clean, raw["zero"]["ce"]),
                 "recovered_vs_mean": recovered(r["ce"], clean, raw["mean"]["ce"])}
        else:
            r = {**r, "recovered_vs_zero": recovered(r["cos"], 1.0, raw["zero"]["cos"]),
                 "recovered_vs_mean": recovered(r["cos"], 1.0, raw["mean"]["cos"])}
        out["models"].setdefault(m, {})[str(n)] = r
    if raw["kind"] == "lm":
        out["clean"] = raw["clean"]
    return out


def _features(model, tok, site, p, block: BlockCapture, path: Path, exp: TransformerExperiment) -> dict | None:
    """Eigen-features of the degree-2 approximant along the block's top output directions (saved as npz)."""
    from mlpinterp.lm.features import eigen_features, output_directions, unembedding_tokens
    from mlpinterp.lm.recovery import is_causal_lm

    if p is None:
        return None
    Y = site.network(block.fit[:20_000].double().numpy())
    U, frac = output_directions(Y, exp.n_output_dirs)
    ef = eigen_features(p, U, exp.n_eigen)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, U=U, eigenvalues=ef["eigenvalues"], eigenvectors=ef["eigenvectors"], spectra=ef["spectra"])
    res = {"output_variance_fraction": frac.tolist(), "eigenvalues": ef["eigenvalues"].tolist(),
           "top_energy": ef["top_energy"].tolist()}
    if is_causal_lm(model):
        W_U = model.get_output_embeddings().weight.detach().double().numpy()
        res["output_direction_tokens"] = unembedding_tokens(U, W_U, tok)
        res["eigenvector_tokens"] = [unembedding_tokens(ef["eigenvectors"][m][:, :3], W_U, tok)
                                     for m in range(U.shape[1])]
    return res


def check_sae_site(model, site, sae, ids) -> None:
    """Raise ``ValueError`` unless ``sae`` reads the input of the FFN block ``site``: same width, and, when the SAE
    records its hook point, that module's output equals the block's input on ``ids [batch, seq]``."""
    from mlpinterp.lm.hooks import hook_activations

    if sae.d_in != site.network.d_in:
        raise ValueError(f"the SAE has d_in = {sae.d_in} but FFN block {site.path!r} has d_in = {site.network.d_in}")
    if sae.hook_point is None:
        return
    store: dict = {}
    handle = model.get_submodule(site.input_module).register_forward_pre_hook(
        lambda _m, args: store.setdefault("x", args[0].detach()))
    try:
        h = hook_activations(model, sae.hook_point, ids, stop_early=False)
    finally:
        handle.remove()
    x = store.get("x")
    if x is None or h.shape != x.shape or not torch.allclose(h.float(), x.float(), rtol=1e-4, atol=1e-5):
        raise ValueError(f"the SAE was trained at hook point {sae.hook_point!r}, whose output is not the input of FFN "
                         f"block {site.path!r} (the tensor {site.input_module!r} receives); train the SAE there")


def _sae_alignment(model, site, sae_dir: str, cap: Capture, npz: Path) -> dict:
    """Top eigen-features of the recommended degree-2 approximant against the SAE's decoder directions."""
    from mlpinterp.lm.features import sae_alignment
    from mlpinterp.sae.io import load_sae

    sae = load_sae(sae_dir)
    check_sae_site(model, site, sae, cap.heldout_ids[:2])
    V = np.load(npz)["eigenvectors"][0]  # [d_in, n_eigen] along the top output direction
    res = sae_alignment(V, sae.W_dec.detach().double().cpu().numpy())
    return {"dir": str(sae_dir), "hook_point": sae.hook_point, "d_sae": int(sae.W_dec.shape[0]), **res}


__all__ = ["analyse_block", "run_transformer"]
