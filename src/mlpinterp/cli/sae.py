"""CLI: the ``sae`` group.

* ``mlpinterp sae train --model minilm --hook-point encoder.layer.3.output --k 32 --d-sae 3072 --out DIR``
  (one TopK SAE, or ``--n-saes N --mfr`` for MFR; ``torchrun ... --distributed ddp|ensemble`` for several
  processes; ``--activations FILE`` for activations on disk); writes SAEBench core metrics of every SAE on held-out
  text to ``OUT/metrics.json``.
* ``mlpinterp sae eval SAE_DIR [--model M] [--hook-point H]``: SAEBench core metrics of a saved SAE (ours,
  sparsify's or SAELens's) at the hook point it records.

Expected failures (bad path, corrupt or mismatched file, resume conflict) print ``Error: ...`` and exit 1,
without a traceback.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import typer

from mlpinterp.cli.config_options import CommandConfig, add_command, config_options, invalid, option, option_name
from mlpinterp.cli.errors import expected_errors, fail
from mlpinterp.cli.options import Device, Out, Quiet, Threads, out_dir, set_threads
from mlpinterp.utils.validation import Int


def _text_dir():
    return option(None, aliases=("--text-dir",), metavar="DIR", show_default="../shared/data/text")


@dataclass(frozen=True, kw_only=True)
class SaeTrainCommand(CommandConfig, Out, Device, Quiet, Threads):
    """Inputs of ``sae train``: a TopK SAE (or MFR ensemble) on a model's activations at a hook point, or on
    activations on disk (``--activations``)."""

    model: str = "minilm"
    """'minilm' (embedded), or a local Hugging Face name/path."""
    hook_point: str = "encoder.layer.3.output"
    """Module path whose output is read."""
    k: int = option(32, check=Int(1))
    """TopK k."""
    d_sae: int = option(3072, check=Int(1))
    """Number of latents."""
    tied: bool = False
    """Tie the decoder to the encoder."""
    n_saes: int = option(1, check=Int(1))
    """SAEs trained in parallel."""
    mfr: bool = False
    """MFR penalty and re-initialisation (needs --n-saes >= 2)."""
    steps: int = option(1000, check=Int(1))
    """Optimisation steps (re-run with more to extend a run)."""
    batch_size: int = option(4096, check=Int(1))
    """Activations per step (global)."""
    ctx_len: int = option(128, check=Int(2))
    """Tokens per sequence."""
    max_chunks: int | None = option(None, check=Int(1), show_default="all")
    """Use at most this many text chunks."""
    data: Path | None = _text_dir()
    """Directory of *.txt documents; files with 'test' in the name are held out for the metrics."""
    eval_chunks: int = option(32, check=Int(0))
    """Held-out chunks for SAEBench core metrics (0: none)."""
    normalize_activations: Literal["none", "expected_average_only_in"] = "none"
    """expected_average_only_in: scale inputs so E||x|| = sqrt(d_in) (metrics stay in original units)."""
    autocast: Literal["none", "bf16"] = "none"
    """bf16: torch.autocast bfloat16 for training."""
    allow_hook_mismatch: bool = False
    """Resume a checkpoint of another hook point/model anyway (warns)."""
    cache: bool = False
    """Cache activations to OUT/activation_cache."""
    out: Path = out_dir("runs/sae")
    seed: int = option(0, check=Int(0))
    """Seed."""
    distributed: Literal["none", "ddp", "ensemble"] = "none"
    """ddp | ensemble: launch with torchrun."""
    activations: Path | None = option(None, metavar="FILE")
    """Train one SAE on activations on disk instead of a model: a safetensors file with 'train' [n, d_in] and
    optionally 'test' (metrics)."""
    tokens: int | None = option(None, check=Int(1), show_default="--steps x --batch-size")
    """Training activations with --activations."""

    MODEL_ONLY = ("model", "hook_point", "tied", "n_saes", "mfr", "ctx_len", "max_chunks", "data", "eval_chunks",
                  "normalize_activations", "autocast", "allow_hook_mismatch", "cache", "distributed", "device")
    """Fields that act on the model-streaming path only; ``--activations`` trains one plain SAE on the CPU."""

    def validate(self) -> None:
        if self.mfr and self.n_saes < 2:  # MfrConfig's rule (penalty needs two SAEs), in the options' words
            raise invalid(f"--mfr needs --n-saes >= 2 (the penalty compares SAEs), got --n-saes {self.n_saes}",
                          "pass --n-saes 2 or more, or drop --mfr")
        if self.k > self.d_sae:
            raise invalid(f"--k {self.k} must be <= --d-sae {self.d_sae} (TopK keeps k of the d_sae latents)",
                          "pass a smaller --k or a larger --d-sae")
        if self.activations is not None:
            given = [option_name(f) for f in fields(self) if f.name in self.MODEL_ONLY
                     and getattr(self, f.name) != f.default]
            if given:
                raise invalid(f"{', '.join(given)} given with --activations, which trains one untied TopK SAE "
                              "without MFR on the file's activations (on the CPU) and would ignore them",
                              "drop those options, or drop --activations to train on a model's activations")


@dataclass(frozen=True, kw_only=True)
class SaeEvalCommand(CommandConfig):
    """Inputs of ``sae eval``."""

    sae_dir: Path = option(argument=True, metavar="SAE_DIR")
    """Directory holding cfg.json + the .safetensors (ours, sparsify's or SAELens's)."""
    model: str | None = option(None, show_default="the one the SAE records")
    """Model: 'minilm' or a local path."""
    hook_point: str | None = option(None, show_default="the one the SAE records")
    """Hook point."""
    allow_hook_mismatch: bool = False
    """Evaluate at another hook point/model than the SAE records anyway (warns)."""
    eval_chunks: int = option(400, check=Int(1))
    """Held-out text chunks (400 of 128 tokens: 50,400 content tokens, enough for the density metrics at a
    1/50,000 resolution)."""
    ctx_len: int = option(128, check=Int(2))
    """Tokens per sequence."""
    data: Path | None = _text_dir()
    """Directory of *.txt documents; files with 'test' in the name are used."""
    out: Path | None = option(None, metavar="FILE", show_default="print them")
    """Write the metrics to this JSON file."""

    def validate(self) -> None:
        if self.out is not None and self.out.is_dir():
            raise invalid(f"--out {str(self.out)!r} is a directory, expected the path of a JSON file",
                          "pass a file path")


def _eval_texts(text_dir: Path | None) -> tuple[list[str], list[str], list[str]]:
    """(training texts, held-out texts, held-out file names), split by :func:`mlpinterp.lm.text.split_files`."""
    from mlpinterp.lm.text import read_texts, split_files

    train, held = split_files(text_dir)
    return read_texts(train), read_texts(held), [f.name for f in held]


@config_options(SaeTrainCommand)
def sae_train(cfg: SaeTrainCommand) -> None:
    """Train TopK SAE(s) on the activations of MODEL at HOOK_POINT (or of --activations FILE); resumes from OUT."""
    from mlpinterp.lm.models import check_model_dir

    if cfg.activations is not None:
        set_threads(cfg.threads)
        _train_on_file(cfg.activations, cfg.out, cfg.d_sae, cfg.k, cfg.tokens or cfg.steps * cfg.batch_size,
                       cfg.batch_size, cfg.seed, cfg.quiet)
        return
    with expected_errors():  # refused before the model is loaded
        if Path(cfg.model).expanduser().is_dir():
            check_model_dir(Path(cfg.model).expanduser())
    set_threads(cfg.threads)
    from mlpinterp.lm.models import canonical_model_name
    from mlpinterp.sae.distributed import init_distributed
    from mlpinterp.sae.mfr import MfrConfig
    from mlpinterp.sae.topk import SaeConfig

    with expected_errors():
        mfr_cfg = MfrConfig(sae=SaeConfig(d_sae=cfg.d_sae, k=cfg.k, tied=cfg.tied), n_saes=cfg.n_saes,
                            penalty=cfg.mfr, reinit=cfg.mfr, seed=cfg.seed,
                            normalize_activations=cfg.normalize_activations)
        dcfg = init_distributed(cfg.distributed)
        if dcfg.mode == "ddp" and cfg.batch_size % dcfg.world:
            fail(f"--batch-size {cfg.batch_size} must be divisible by the world size {dcfg.world}",
                 f"pass a --batch-size that is a multiple of {dcfg.world}")
        # one writer per directory: rank 0 holds the run directory (the others write their own shards under it)
        run_cfg = {"model": canonical_model_name(cfg.model), "hook_point": cfg.hook_point, "k": cfg.k,
                   "d_sae": cfg.d_sae, "tied": cfg.tied, "n_saes": cfg.n_saes, "mfr": cfg.mfr,
                   "batch_size": cfg.batch_size, "ctx_len": cfg.ctx_len, "max_chunks": cfg.max_chunks,
                   "normalize_activations": cfg.normalize_activations, "seed": cfg.seed,
                   "distributed": cfg.distributed}
        with _open_if_rank0(dcfg.rank, cfg.out, run_cfg, cfg.allow_hook_mismatch):
            _sae_train_open(mfr_cfg, dcfg, cfg)


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


def _sae_train_open(cfg, dcfg, cmd: SaeTrainCommand) -> None:
    """``sae train`` once ``out`` is open: load the model, stream activations, train, evaluate."""
    import torch

    from mlpinterp.lm.models import canonical_model_name, load_model
    from mlpinterp.sae.activations import ActivationConfig, ActivationSource
    from mlpinterp.sae.mfr import MfrTrainer

    out, model, hook_point, ctx_len = cmd.out, cmd.model, cmd.hook_point, cmd.ctx_len
    batch_size, device = cmd.batch_size, cmd.device
    train_texts, held_texts, held_files = _eval_texts(cmd.data)  # a bad --data before the model is loaded
    net, tok = load_model(model)
    # ddp: every rank reads its own shard of the text and contributes batch_size / world activations
    ddp = dcfg.mode == "ddp"
    acfg = ActivationConfig(hook_point=hook_point, ctx_len=ctx_len,
                            batch_size=batch_size // dcfg.world if ddp else batch_size,
                            max_chunks=cmd.max_chunks, seed=cmd.seed,
                            rank=dcfg.rank if ddp else 0, world=dcfg.world if ddp else 1)
    cache_dir = out / (f"activation_cache_rank{acfg.rank}" if ddp else "activation_cache") if cmd.cache else None
    src = ActivationSource(net, tok, acfg, texts=train_texts, cache_dir=cache_dir)
    trainer = MfrTrainer(src.d_in, cfg, dcfg, device=device, model_name=canonical_model_name(model),
                         hook_point=hook_point)
    trainer.load_checkpoint(out, allow_mismatch=cmd.allow_hook_mismatch, override="--allow-hook-mismatch")
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=cmd.autocast == "bf16"):
        trainer.fit(iter(src), cmd.steps, quiet=cmd.quiet, checkpoint_dir=out, desc="SAE")
    last = trainer.history[-1] if trainer.history else {}
    typer.echo(f"saved {len(trainer.saes)} SAE(s) under {out}; last reconstruction loss {last.get('recon')}")
    if cmd.eval_chunks and dcfg.rank == 0:
        from mlpinterp.lm.text import token_chunks
        from mlpinterp.sae.evaluate import evaluate_sae
        from mlpinterp.utils.io import atomic_write_json

        ids = token_chunks(tok, held_texts, ctx_len, cmd.eval_chunks)
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


@config_options(SaeEvalCommand)
def sae_eval(cfg: SaeEvalCommand) -> None:
    """SAEBench core metrics of a saved SAE at its hook point (KL / CE scores for causal LMs)."""
    from mlpinterp.lm.models import canonical_model_name, load_model
    from mlpinterp.lm.text import token_chunks
    from mlpinterp.sae.evaluate import evaluate_sae
    from mlpinterp.sae.io import check_provenance, load_sae

    with expected_errors():
        sae = load_sae(cfg.sae_dir)
        name = cfg.model or sae.model_name
        if not name:
            fail(f"{str(cfg.sae_dir)!r} records no model", "pass --model")
        # refused before the model is loaded: another model or hook point than the SAE records
        check_provenance("evaluating the SAE", recorded_model=sae.model_name, recorded_hook=sae.hook_point,
                         model_name=canonical_model_name(name), hook_point=cfg.hook_point,
                         allow_mismatch=cfg.allow_hook_mismatch, override="--allow-hook-mismatch")
        _, held_texts, held_files = _eval_texts(cfg.data)
        net, tok = load_model(name)
        ids = token_chunks(tok, held_texts, cfg.ctx_len, cfg.eval_chunks)
        res = evaluate_sae(sae.eval(), net, ids, hook_point=cfg.hook_point, model_name=canonical_model_name(name),
                           allow_mismatch=cfg.allow_hook_mismatch, special_ids=tok.all_special_ids)
    res = {"sae": str(cfg.sae_dir), "hook_point": cfg.hook_point or sae.hook_point, "eval_files": held_files, **res}
    if cfg.out is not None:
        from mlpinterp.utils.io import atomic_write_json

        atomic_write_json(cfg.out, res)
        typer.echo(f"wrote {cfg.out}")
    else:
        from mlpinterp.utils.io import _finite_or_null

        typer.echo(json.dumps(_finite_or_null(res), indent=2, allow_nan=False))


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach the ``sae`` group (``sae train``, ``sae eval``)."""
    sae_app = typer.Typer(rich_markup_mode=None, help="Sparse autoencoders: train TopK SAEs (optionally with MFR) on any module.",
                          no_args_is_help=True)
    add_command(sae_app, "train", sae_train)
    add_command(sae_app, "eval", sae_eval)
    app.add_typer(sae_app, name="sae")
