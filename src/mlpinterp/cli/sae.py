"""CLI commands for the sae part of mlpinterp.

* ``mlpinterp reproduce mfr --setting synthetic|minilm|lm --k 6 12 18 24 30 --seeds N --out DIR [--quick] [--quiet]``
  (``--setting lm --model PATH|gpt2``: the paper's Table 2 protocol on a causal LM's layer-0 MLP output;
  ``--setting eeg --data DIR``: EDF recordings under DIR, e.g. the TUH EEG corpus)
* ``mlpinterp sae train --model minilm --hook-point encoder.layer.3.output --k 32 --d-sae 3072 --out DIR``
  (one TopK SAE, or ``--n-saes N --mfr`` for MFR; ``torchrun ... --distributed ddp|ensemble`` for several
  processes); writes SAEBench core metrics of every SAE on held-out text to ``OUT/metrics.json``.
* ``mlpinterp sae eval SAE_DIR [--model M] [--hook-point H]``: SAEBench core metrics of a saved SAE (ours,
  sparsify's or SAELens's) at the hook point it records.

Expected failures (bad path, corrupt or mismatched file, resume conflict) print ``Error: ...`` and exit 1,
without a traceback.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path

import typer

from mlpinterp.cli.errors import expected_errors, fail
from mlpinterp.cli.options import THREADS_DEFAULT, Device, Out, Quick, Quiet, Threads, flag, many, only_for, set_threads

_MULTI = {"allow_extra_args": True, "ignore_unknown_options": False}


class MfrSetting(StrEnum):
    """Settings of ``reproduce mfr``."""

    synthetic = "synthetic"
    minilm = "minilm"
    lm = "lm"
    gpt2 = "gpt2"
    eeg = "eeg"


class Normalize(StrEnum):
    none = "none"
    expected_average_only_in = "expected_average_only_in"


class Autocast(StrEnum):
    none = "none"
    bf16 = "bf16"


class Distributed(StrEnum):
    none = "none"
    ddp = "ddp"
    ensemble = "ensemble"


_TEXT_SETTINGS = ("minilm", "lm", "gpt2")


def _eval_texts(text_dir: Path | None) -> tuple[list[str], list[str], list[str]]:
    """(training texts, held-out texts, held-out file names), split by :func:`mlpinterp.lm.text.split_files`."""
    from mlpinterp.lm.text import read_texts, split_files

    train, held = split_files(text_dir)
    return read_texts(train), read_texts(held), [f.name for f in held]


def _k_values(k: list[str], extra: list[str]) -> tuple[int, ...]:
    """``--k 6 12 18``, ``--k 6 --k 12`` and ``--k 6,12`` all mean (6, 12, 18)/(6, 12)."""
    vals = []
    for tok in [*k, *extra]:
        for part in str(tok).split(","):
            if not part:
                continue
            try:
                v = int(part)
            except ValueError:
                raise typer.BadParameter(f"--k expects integers, got {part!r}") from None
            if v < 1:
                raise typer.BadParameter(f"--k values must be positive, got {v}")
            vals.append(v)
    if not vals:
        raise typer.BadParameter("--k needs at least one value")
    return tuple(vals)


def reproduce_mfr(
    ctx: typer.Context,
    setting: MfrSetting = typer.Option(MfrSetting.synthetic, help="synthetic | minilm | lm (a causal LM's layer-0 MLP "
                                       "output, the paper's Table 2) | gpt2 (mid-depth residual stream; weights on "
                                       "disk) | eeg (EDF recordings under --data)."),
    model: str | None = typer.Option(None, help="--setting lm: a train-lm output directory or 'gpt2' (weights on "
                                     "disk).", show_default="gpt2"),
    k: list[str] | None = many(None, "--k", metavar="K", help="TopK k values: --k 6 12 18 24 30 (or --k 6,12).",
                               show_default="the setting's (synthetic, minilm: 6 12 18 24 30); --quick: one k"),
    seeds: int | None = typer.Option(None, min=1, help="Seeds per (k, condition).",
                                     show_default="3; --quick: 1"),
    out: Out = Path("runs/mfr"),
    quick: Quick = False,
    quiet: Quiet = False,
    steps: int | None = typer.Option(None, min=1, help="Override the setting's number of steps.",
                                     show_default="the setting's"),
    device: Device = "cpu",
    hook_point: str | None = typer.Option(None, help="minilm/gpt2/lm: the hook point.", show_default="minilm, gpt2: a "
                                          "mid-depth residual stream; lm: transformer.h.0.mlp"),
    text_dir: Path | None = typer.Option(None, help="minilm/lm/gpt2: directory of *.txt documents (files with 'test' "
                                         "in the name are held out).", show_default="../shared/data/text"),
    data: Path | None = typer.Option(None, help="--setting eeg: directory of EDF/EDF+ recordings (searched "
                                     "recursively), e.g. a TUH EEG download."),
    channels: str | None = typer.Option(None, help="--setting eeg: comma-separated channel labels as in the EDF "
                                        "header.", show_default="those common to every recording"),
    window: int | None = typer.Option(None, min=1, help="--setting eeg: samples per vector at 128 Hz (1: one "
                                      "channel vector per time step).", show_default="32"),
    n_saes: int = typer.Option(2, min=2, help="SAEs trained in parallel."),
    alpha: float | None = typer.Option(None, help="MFR penalty weight (>= 0).",
                                       show_default="auto: initial penalty = initial loss"),
    extra_alpha: list[float] = many([0.1], "--extra-alpha", metavar="ALPHA",
                                    help="Fixed penalty weight run as an extra condition mfr_alpha<a>; repeat for "
                                         "several."),
    no_extra_alpha: bool = flag("--no-extra-alpha", default=False, help="Run no fixed-alpha condition."),
    threads: Threads = THREADS_DEFAULT,
    inactivity_threshold: float | None = typer.Option(None, min=0.0, help="Re-initialise an SAE whose inactivity "
                                                      "measure exceeds this.", show_default="1, the paper's"),
) -> None:
    """Reproduce Marks et al. 2024 (MFR): figures, metrics.json, report.md and report.html in OUT."""
    from mlpinterp.studies.mfr import run as exp_mod
    from mlpinterp.studies.mfr import settings as mfr_settings

    setting = MfrSetting(setting).value
    only_for(setting, {"--data": (data, ("eeg",)), "--channels": (channels, ("eeg",)),
                       "--window": (window, ("eeg",)), "--model": (model, ("lm",)),
                       "--hook-point": (hook_point, _TEXT_SETTINGS), "--text-dir": (text_dir, _TEXT_SETTINGS)})
    set_threads(threads)
    kw = {"n_saes": n_saes, "alpha": alpha,
          **({"k_values": _k_values(k or [], ctx.args)} if k or ctx.args else {}),
          **({"seeds": seeds} if seeds is not None else {}),
          "extra_alphas": () if no_extra_alpha else tuple(extra_alpha),
          **({"steps": steps} if steps is not None else {}),
          **({"inactivity_threshold": inactivity_threshold} if inactivity_threshold is not None else {})}
    with expected_errors():
        if setting == "eeg":
            metrics = _run_eeg(kw, quick, quiet, device, out, data, channels, window)
        else:
            metrics = _run_mfr(exp_mod, mfr_settings, setting, kw, quick, quiet, device, hook_point, out, model, text_dir)
    from mlpinterp.utils.rundir import wall_time_statement

    typer.echo(f"wrote {out / 'report.md'} ({wall_time_statement(metrics['seconds'], metrics.get('sessions'))})")


def _run_eeg(kw: dict, quick: bool, quiet: bool, device: str, out: Path, data: Path | None, channels: str | None,
             window: int | None) -> dict:
    """``reproduce mfr --setting eeg``; returns the metrics dict."""
    from mlpinterp.data.eeg import EegConfig
    from mlpinterp.studies.mfr.eeg import run_eeg
    from mlpinterp.studies.mfr.settings import EegExperiment

    if data is None:
        fail("--setting eeg needs --data DIR (a directory of EDF recordings)",
             "pass --data, e.g. the edf/ folder of a TUH EEG download (see docs/guides/sae.md, EEG)")
    eeg = EegConfig(channels=tuple(c.strip() for c in (channels or "").split(",") if c.strip()) or None,
                    **({"window": window} if window is not None else {}))
    exp = EegExperiment.quick(eeg=eeg, **kw) if quick else EegExperiment(eeg=eeg, **kw)
    return run_eeg(out, exp, data, quiet=quiet, device=device)


def _run_mfr(exp_mod, mfr_settings, setting: str, kw: dict, quick: bool, quiet: bool, device: str, hook_point: str | None,
             out: Path, model: str | None = None, text_dir: Path | None = None) -> dict:
    """Dispatch ``reproduce mfr --setting``; returns the metrics dict."""
    if setting == "lm":
        kw.update(model=model or "gpt2", **({"hook_point": hook_point} if hook_point else {}))
        exp = mfr_settings.LmExperiment.quick(**kw) if quick else mfr_settings.LmExperiment(**kw)
        return exp_mod.run_minilm(out, exp, quiet=quiet, device=device, text_dir=text_dir)
    if setting == "synthetic":
        exp = mfr_settings.SyntheticExperiment.quick(**kw) if quick else mfr_settings.SyntheticExperiment(**kw)
        return exp_mod.run_synthetic(out, exp, quiet=quiet, device=device)
    if setting == "gpt2":  # needs GPT-2 weights on disk (no download)
        kw.update(model="gpt2", hook_point=hook_point or "transformer.h.5")
    elif hook_point:
        kw["hook_point"] = hook_point
    exp = mfr_settings.MinilmExperiment.quick(**kw) if quick else mfr_settings.MinilmExperiment(**kw)
    return exp_mod.run_minilm(out, exp, quiet=quiet, device=device, text_dir=text_dir)


def sae_train(
    ctx: typer.Context,
    model: str = typer.Option("minilm", help="'minilm' (embedded), or a local Hugging Face name/path."),
    hook_point: str = typer.Option("encoder.layer.3.output", help="Module path whose output is read."),
    k: int = typer.Option(32, min=1, help="TopK k."),
    d_sae: int = typer.Option(3072, min=1, help="Number of latents."),
    tied: bool = flag("--tied/--no-tied", default=False, help="Tie the decoder to the encoder."),
    n_saes: int = typer.Option(1, min=1, help="SAEs trained in parallel."),
    mfr: bool = flag("--mfr/--no-mfr", default=False, help="MFR penalty and re-initialisation (needs --n-saes >= 2)."),
    steps: int = typer.Option(1000, min=1, help="Optimisation steps (re-run with more to extend a run)."),
    batch_size: int = typer.Option(4096, min=1, help="Activations per step (global)."),
    ctx_len: int = typer.Option(128, min=2, help="Tokens per sequence."),
    max_chunks: int | None = typer.Option(None, min=1, help="Use at most this many text chunks.", show_default="all"),
    text_dir: Path | None = typer.Option(None, help="Directory of *.txt files; files with 'test' in the name are held "
                                         "out for the metrics.", show_default="bundled corpora"),
    eval_chunks: int = typer.Option(32, min=0, help="Held-out chunks for SAEBench core metrics (0: none)."),
    normalize_activations: Normalize = typer.Option(Normalize.none, help="expected_average_only_in: scale inputs so "
                                                    "E||x|| = sqrt(d_in) (metrics stay in original units)."),
    autocast: Autocast = typer.Option(Autocast.none, help="bf16: torch.autocast bfloat16 for training."),
    allow_hook_mismatch: bool = flag("--allow-hook-mismatch/--no-allow-hook-mismatch", default=False,
                                     help="Resume a checkpoint of another hook point/model anyway (warns)."),
    cache: bool = flag("--cache/--no-cache", default=False, help="Cache activations to OUT/activation_cache."),
    out: Out = Path("runs/sae"),
    seed: int = typer.Option(0, help="Seed."),
    distributed: Distributed = typer.Option(Distributed.none, help="ddp | ensemble: launch with torchrun."),
    device: Device = "cpu",
    quiet: Quiet = False,
    threads: Threads = THREADS_DEFAULT,
    activations: Path | None = typer.Option(None, help="Train one SAE on activations on disk instead of a model: a "
                                            "safetensors file with 'train' [n, d_in] and optionally 'test' (metrics)."),
    tokens: int | None = typer.Option(None, min=1, help="Training activations with --activations.",
                                      show_default="--steps x --batch-size"),
) -> None:
    """Train TopK SAE(s) on the activations of MODEL at HOOK_POINT (or of --activations FILE); resumes from OUT."""
    from mlpinterp.lm.models import check_model_dir
    from mlpinterp.utils.rundir import check_out_dir

    with expected_errors():  # refused before the model is loaded
        out = check_out_dir(out)
    if k > d_sae:
        raise typer.BadParameter(f"--k {k} must be <= --d-sae {d_sae} (TopK keeps k of the d_sae latents)",
                                 param_hint="--k")
    if activations is not None:
        _refuse_model_options_with_activations(ctx)
        set_threads(threads)
        _train_on_file(activations, out, d_sae, k, tokens or steps * batch_size, batch_size, seed, quiet)
        return
    with expected_errors():
        if Path(model).expanduser().is_dir():
            check_model_dir(Path(model).expanduser())
    set_threads(threads)
    from mlpinterp.lm.models import canonical_model_name
    from mlpinterp.sae.distributed import init_distributed
    from mlpinterp.sae.mfr import MfrConfig
    from mlpinterp.sae.topk import SaeConfig

    with expected_errors():
        try:
            cfg = MfrConfig(sae=SaeConfig(d_sae=d_sae, k=k, tied=tied), n_saes=n_saes, penalty=mfr, reinit=mfr,
                            seed=seed, normalize_activations=normalize_activations.value)  # type: ignore[arg-type]
        except (TypeError, ValueError) as e:
            raise typer.BadParameter(str(e)) from e
        dcfg = init_distributed(distributed.value)  # type: ignore[arg-type]
        ddp = dcfg.mode == "ddp"
        if ddp and batch_size % dcfg.world:
            raise typer.BadParameter(f"--batch-size {batch_size} must be divisible by the world size {dcfg.world}")
        # one writer per directory: rank 0 holds the run directory (the others write their own shards under it)
        run_cfg = {"model": canonical_model_name(model), "hook_point": hook_point, "k": k, "d_sae": d_sae,
                   "tied": tied, "n_saes": n_saes, "mfr": mfr, "batch_size": batch_size, "ctx_len": ctx_len,
                   "max_chunks": max_chunks, "normalize_activations": normalize_activations.value, "seed": seed,
                   "distributed": distributed.value}
        with _open_if_rank0(dcfg.rank, out, run_cfg, allow_hook_mismatch):
            _sae_train_open(cfg, dcfg, out, model=model, hook_point=hook_point, steps=steps, batch_size=batch_size,
                            ctx_len=ctx_len, max_chunks=max_chunks, text_dir=text_dir, eval_chunks=eval_chunks,
                            autocast=autocast, allow_hook_mismatch=allow_hook_mismatch, cache=cache, seed=seed,
                            device=device, quiet=quiet)


_MODEL_ONLY = ("model", "hook_point", "tied", "n_saes", "mfr", "ctx_len", "max_chunks", "text_dir", "eval_chunks",
               "normalize_activations", "autocast", "allow_hook_mismatch", "cache", "distributed", "device")
"""``sae train`` parameters that act on the model-streaming path only; ``--activations`` trains one plain SAE on CPU."""


def _refuse_model_options_with_activations(ctx: typer.Context) -> None:
    """Refuse options given on the command line that ``--activations FILE`` would silently ignore."""
    given = [p.opts[0] for p in ctx.command.params if p.name in _MODEL_ONLY
             and getattr(ctx.get_parameter_source(p.name), "name", None) == "COMMANDLINE"]
    if given:
        fail(f"{', '.join(given)} given with --activations, which trains one untied TopK SAE without MFR on the "
             "file's activations (on the CPU) and would ignore them",
             "drop those options, or drop --activations to train on a model's activations")


def _train_on_file(path: Path, out: Path, d_sae: int, k: int, tokens: int, batch_size: int, seed: int,
                   quiet: bool) -> None:
    """``sae train --activations FILE``: one SAE with the default recipe (:func:`train_on_activations`)."""
    from mlpinterp.sae.train import train_on_activations

    fix = ("pass a safetensors file with a finite floating-point 'train' tensor [n, d_in] (and optionally 'test' "
           "[n_test, d_in]), e.g. written by mlpinterp.sae.cached.write_activations")
    with expected_errors(fix):
        _, metrics = train_on_activations(path, out, d_sae=d_sae, k=k, tokens=tokens, batch_size=batch_size,
                                          seed=seed, quiet=quiet)
    core = metrics["saebench_core"]
    ev = (f"; held-out explained variance {core[0]['reconstruction_quality']['explained_variance']:.4f} on "
          f"{metrics['n_test']} test activations" if core else "")
    typer.echo(f"saved the SAE under {out / 'sae_0'} ({metrics['steps']} steps, {metrics['tokens']} tokens){ev}")


def _open_if_rank0(rank: int, out: Path, run_cfg: dict, allow_hook_mismatch: bool):
    """The run directory opened by rank 0 (steps may grow between sessions; with --allow-hook-mismatch the model
    and hook point may change too)."""
    from contextlib import nullcontext

    from mlpinterp.utils.rundir import open_run

    if rank != 0:
        return nullcontext()
    resumable = ("steps", "model", "hook_point") if allow_hook_mismatch else ("steps",)
    return _hook_conflicts_named(open_run(out, "sae train", run_cfg, resumable=resumable))


@contextmanager
def _hook_conflicts_named(run):
    """``run`` (an :func:`open_run` context), with a conflict in the model or hook point alone reported as such,
    naming the flag that allows it (``--allow-hook-mismatch``)."""
    from mlpinterp.utils.rundir import RunConflictError

    try:
        with run as rd:
            yield rd
    except RunConflictError as e:
        if not e.diff or not set(e.diff) <= {"model", "hook_point"}:
            raise
        what = "; ".join(f"trained on {k.replace('_', ' ')} {a!r}, not {b!r}" for k, (a, b) in e.diff.items())
        err = ValueError(f"the SAE run in {str(e.out_dir)!r} was {what}")
        err.fix = ("pass the saved --model/--hook-point to continue it, --allow-hook-mismatch to resume it anyway, or "
                   "another --out")
        raise err from None


def _sae_train_open(cfg, dcfg, out: Path, *, model: str, hook_point: str, steps: int, batch_size: int, ctx_len: int,
                    max_chunks: int | None, text_dir: Path | None, eval_chunks: int, autocast: Autocast,
                    allow_hook_mismatch: bool, cache: bool, seed: int, device: str, quiet: bool) -> None:
    """``sae train`` once ``out`` is open: load the model, stream activations, train, evaluate."""
    import torch

    from mlpinterp.lm.models import canonical_model_name, load_model
    from mlpinterp.sae.activations import ActivationConfig, ActivationSource
    from mlpinterp.sae.mfr import MfrTrainer

    train_texts, held_texts, held_files = _eval_texts(text_dir)  # a bad --text-dir before the model is loaded
    net, tok = load_model(model)
    # ddp: every rank reads its own shard of the text and contributes batch_size / world activations
    ddp = dcfg.mode == "ddp"
    acfg = ActivationConfig(hook_point=hook_point, ctx_len=ctx_len,
                            batch_size=batch_size // dcfg.world if ddp else batch_size,
                            max_chunks=max_chunks, seed=seed,
                            rank=dcfg.rank if ddp else 0, world=dcfg.world if ddp else 1)
    cache_dir = out / (f"activation_cache_rank{acfg.rank}" if ddp else "activation_cache") if cache else None
    src = ActivationSource(net, tok, acfg, texts=train_texts, cache_dir=cache_dir)
    trainer = MfrTrainer(src.d_in, cfg, dcfg, device=device, model_name=canonical_model_name(model),
                         hook_point=hook_point)
    trainer.load_checkpoint(out, allow_mismatch=allow_hook_mismatch, override="--allow-hook-mismatch")
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast == Autocast.bf16):
        trainer.fit(iter(src), steps, quiet=quiet, checkpoint_dir=out, desc="SAE")
    last = trainer.history[-1] if trainer.history else {}
    typer.echo(f"saved {len(trainer.saes)} SAE(s) under {out}; last reconstruction loss {last.get('recon')}")
    if eval_chunks and dcfg.rank == 0:
        from mlpinterp.lm.text import token_chunks
        from mlpinterp.sae.evaluate import evaluate_sae
        from mlpinterp.utils.io import atomic_write_json

        ids = token_chunks(tok, held_texts, ctx_len, eval_chunks)
        with trainer.averaged() as saes:  # the weights that were saved
            results = [{"sae": f"sae_{i}", **evaluate_sae(sae.cpu().eval(), net, ids,
                                                          special_ids=tok.all_special_ids)}
                       for i, sae in zip(trainer.owned, saes, strict=True)]
        atomic_write_json(out / "metrics.json", {
            "model_name": trainer.model_name, "hook_point": hook_point, "steps": trainer.step,
            "input_scale": trainer.input_scale, "eval": {"files": held_files, "chunks": int(ids.shape[0]),
                                                         "ctx_len": ctx_len}, "saebench_core": results})
        ev = [r["reconstruction_quality"]["explained_variance"] for r in results]
        typer.echo(f"SAEBench core metrics of {len(results)} SAE(s) on {int(ids.shape[0])} held-out chunks "
                   f"-> {out / 'metrics.json'} (explained variance {', '.join(f'{v:.3f}' for v in ev)})")


def sae_eval(
    sae_dir: Path = typer.Argument(..., help="Directory holding cfg.json + the .safetensors (ours, sparsify's or "
                                   "SAELens's)."),
    model: str | None = typer.Option(None, help="Model: 'minilm' or a local path.",
                                     show_default="the one the SAE records"),
    hook_point: str | None = typer.Option(None, help="Hook point.", show_default="the one the SAE records"),
    allow_hook_mismatch: bool = flag("--allow-hook-mismatch/--no-allow-hook-mismatch", default=False,
                                     help="Evaluate at another hook point/model than the SAE records anyway (warns)."),
    eval_chunks: int = typer.Option(400, min=1, help="Held-out text chunks (400 of 128 tokens: 50,400 content "
                                    "tokens, enough for the density metrics at a 1/50,000 resolution)."),
    ctx_len: int = typer.Option(128, min=2, help="Tokens per sequence."),
    text_dir: Path | None = typer.Option(None, help="Directory of *.txt files; files with 'test' in the name are "
                                         "used."),
    out: Path | None = typer.Option(None, help="Write the metrics to this JSON file.", show_default="print them"),
) -> None:
    """SAEBench core metrics of a saved SAE at its hook point (KL / CE scores for causal LMs)."""
    from mlpinterp.lm.models import canonical_model_name, load_model
    from mlpinterp.lm.text import token_chunks
    from mlpinterp.sae.evaluate import evaluate_sae
    from mlpinterp.sae.io import check_provenance, load_sae

    with expected_errors():
        if out is not None and out.is_dir():
            fail(f"--out {str(out)!r} is a directory, expected the path of a JSON file", "pass a file path")
        sae = load_sae(sae_dir)
        name = model or sae.model_name
        if not name:
            fail(f"{str(sae_dir)!r} records no model", "pass --model")
        # refused before the model is loaded: another model or hook point than the SAE records
        check_provenance("evaluating the SAE", recorded_model=sae.model_name, recorded_hook=sae.hook_point,
                         model_name=canonical_model_name(name), hook_point=hook_point,
                         allow_mismatch=allow_hook_mismatch, override="--allow-hook-mismatch")
        _, held_texts, held_files = _eval_texts(text_dir)
        net, tok = load_model(name)
        ids = token_chunks(tok, held_texts, ctx_len, eval_chunks)
        res = evaluate_sae(sae.eval(), net, ids, hook_point=hook_point, model_name=canonical_model_name(name),
                           allow_mismatch=allow_hook_mismatch, special_ids=tok.all_special_ids)
    res = {"sae": str(sae_dir), "hook_point": hook_point or sae.hook_point, "eval_files": held_files, **res}
    if out is not None:
        from mlpinterp.utils.io import atomic_write_json

        atomic_write_json(out, res)
        typer.echo(f"wrote {out}")
    else:
        from mlpinterp.utils.io import _finite_or_null

        typer.echo(json.dumps(_finite_or_null(res), indent=2, allow_nan=False))


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``reproduce mfr`` and the ``sae`` group (``sae train``, ``sae eval``)."""
    sae_app = typer.Typer(help="Sparse autoencoders: train TopK SAEs (optionally with MFR) on any module.",
                          no_args_is_help=True)
    reproduce_app.command("mfr", context_settings=_MULTI)(reproduce_mfr)
    sae_app.command("train")(sae_train)
    sae_app.command("eval")(sae_eval)
    app.add_typer(sae_app, name="sae")
