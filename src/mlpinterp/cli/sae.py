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
from pathlib import Path

import typer

from mlpinterp.cli.errors import expected_errors, fail

_MULTI = {"allow_extra_args": True, "ignore_unknown_options": False}


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


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach this module's commands to the top-level app and to reproduce."""
    sae_app = typer.Typer(help="Sparse autoencoders: train TopK SAEs (optionally with MFR) on any module.",
                          no_args_is_help=True)
    app.add_typer(sae_app, name="sae")

    @reproduce_app.command("mfr", context_settings=_MULTI)
    def reproduce_mfr(
        ctx: typer.Context,
        setting: str = typer.Option("synthetic", help="synthetic | minilm | lm (a causal LM's layer-0 MLP output, "
                                    "the paper's Table 2) | gpt2 (mid-depth residual stream; weights on disk)"),
        model: str = typer.Option("", help="--setting lm: a train-lm output directory or 'gpt2' (weights on disk; "
                                  "default gpt2)."),
        k: list[str] = typer.Option([], help="TopK k values: --k 6 12 18 24 30 (default: the setting's; "
                                    "--quick: fewer)"),
        seeds: int = typer.Option(0, min=0, help="Seeds per (k, condition) (0: the setting's default)."),
        out: Path = typer.Option(Path("runs/mfr"), help="Output directory (resumable)."),
        quick: bool = typer.Option(False, help="Small budget (minutes on a CPU)."),
        quiet: bool = typer.Option(False, help="No progress bars."),
        steps: int = typer.Option(0, min=0, help="Override the number of steps (0: setting default)."),
        device: str = typer.Option("cpu", help="torch device, e.g. cuda."),
        hook_point: str = typer.Option("", help="Hook point for minilm/gpt2 (default: a mid-depth residual stream) "
                                       "or lm (default: transformer.h.0.mlp)."),
        text_dir: Path = typer.Option(None, help="minilm/lm/gpt2: directory of *.txt documents (default: "
                                      "../shared/data/text; files with 'test' in the name are held out)."),
        data: Path = typer.Option(None, help="--setting eeg: directory of EDF/EDF+ recordings (searched "
                                  "recursively), e.g. a TUH EEG download."),
        channels: str = typer.Option("", help="--setting eeg: comma-separated channel labels as in the EDF header "
                                     "(default: those common to every recording)."),
        window: int = typer.Option(0, min=0, help="--setting eeg: samples per vector at 128 Hz (0: 32; 1: one "
                                   "channel vector per time step)."),
        n_saes: int = typer.Option(2, min=2, help="SAEs trained in parallel."),
        alpha: float = typer.Option(-1.0, help="MFR penalty weight (negative: auto, initial penalty = initial loss)."),
        extra_alpha: list[float] = typer.Option([0.1], help="Fixed penalty weight run as an extra condition "
                                                "mfr_alpha<a>; repeat for several; a negative value: none."),
        threads: int = typer.Option(1, "--threads", min=1, help="torch CPU threads (1 is fastest on a shared CPU)."),
        inactivity_threshold: float = typer.Option(-1.0, help="Re-initialise an SAE whose inactivity measure exceeds "
                                                   "this (negative: the setting's default, 1, the paper's)."),
    ) -> None:
        """Reproduce Marks et al. 2024 (MFR): figures, metrics.json, report.md and report.html in OUT."""
        import torch

        from mlpinterp.experiments import mfr as exp_mod

        torch.set_num_threads(threads)
        kw = {**({"k_values": _k_values(k, ctx.args)} if k or ctx.args else {}),
              **({"seeds": seeds} if seeds else {}), "n_saes": n_saes, "alpha": None if alpha < 0 else alpha,
              "extra_alphas": tuple(a for a in extra_alpha if not a < 0),
              **({"steps": steps} if steps else {}),
              **({"inactivity_threshold": inactivity_threshold} if inactivity_threshold >= 0 else {})}
        with expected_errors():
            if (data is not None or channels or window) and setting != "eeg":
                raise typer.BadParameter(f"--data, --channels and --window apply to --setting eeg, got --setting "
                                         f"{setting!r}")
            if setting == "eeg":
                metrics = _run_eeg(kw, quick, quiet, device, out, data, channels, window)
            else:
                metrics = _run_mfr(exp_mod, setting, kw, quick, quiet, device, hook_point, out, model, text_dir)
        typer.echo(f"wrote {out / 'report.md'} ({metrics['seconds']:.0f} s)")

    def _run_eeg(kw: dict, quick: bool, quiet: bool, device: str, out: Path, data: Path | None, channels: str,
                 window: int) -> dict:
        """``reproduce mfr --setting eeg``; returns the metrics dict."""
        from mlpinterp.data.eeg import EegConfig
        from mlpinterp.experiments.mfr_eeg import EegExperiment, run_eeg

        if data is None:
            fail("--setting eeg needs --data DIR (a directory of EDF recordings)",
                 "pass --data, e.g. the edf/ folder of a TUH EEG download (see docs/guides/sae.md, EEG)")
        eeg = EegConfig(channels=tuple(c.strip() for c in channels.split(",") if c.strip()) or None,
                        **({"window": window} if window else {}))
        exp = EegExperiment.quick(eeg=eeg, **kw) if quick else EegExperiment(eeg=eeg, **kw)
        return run_eeg(out, exp, data, quiet=quiet, device=device)

    def _run_mfr(exp_mod, setting: str, kw: dict, quick: bool, quiet: bool, device: str, hook_point: str,
                 out: Path, model: str = "", text_dir: Path | None = None) -> dict:
        """Dispatch ``reproduce mfr --setting``; returns the metrics dict."""
        if model and setting != "lm":
            raise typer.BadParameter(f"--model applies to --setting lm, got --setting {setting!r}")
        if setting == "lm":
            kw.update(model=model or "gpt2", **({"hook_point": hook_point} if hook_point else {}))
            exp = exp_mod.LmExperiment.quick(**kw) if quick else exp_mod.LmExperiment(**kw)
            return exp_mod.run_minilm(out, exp, quiet=quiet, device=device, text_dir=text_dir)
        if setting == "synthetic":
            exp = exp_mod.SyntheticExperiment.quick(**kw) if quick else exp_mod.SyntheticExperiment(**kw)
            return exp_mod.run_synthetic(out, exp, quiet=quiet, device=device)
        if setting in ("minilm", "gpt2"):
            if setting == "gpt2":  # needs GPT-2 weights on disk (no download)
                kw.update(model="gpt2", hook_point=hook_point or "transformer.h.5")
            elif hook_point:
                kw["hook_point"] = hook_point
            exp = exp_mod.MinilmExperiment.quick(**kw) if quick else exp_mod.MinilmExperiment(**kw)
            return exp_mod.run_minilm(out, exp, quiet=quiet, device=device, text_dir=text_dir)
        raise typer.BadParameter(f"--setting must be 'synthetic', 'minilm', 'lm', 'gpt2' or 'eeg', got {setting!r}")

    @sae_app.command("train")
    def train(
        model: str = typer.Option("minilm", help="'minilm' (embedded), or a local Hugging Face name/path."),
        hook_point: str = typer.Option("encoder.layer.3.output", help="Module path whose output is read."),
        k: int = typer.Option(32, min=1, help="TopK k."),
        d_sae: int = typer.Option(3072, min=1, help="Number of latents."),
        tied: bool = typer.Option(False, help="Tie the decoder to the encoder."),
        n_saes: int = typer.Option(1, min=1, help="SAEs trained in parallel."),
        mfr: bool = typer.Option(False, help="MFR penalty and re-initialisation (needs --n-saes >= 2)."),
        steps: int = typer.Option(1000, min=1, help="Optimisation steps (re-run with more to extend a run)."),
        batch_size: int = typer.Option(4096, min=1, help="Activations per step (global)."),
        ctx_len: int = typer.Option(128, min=2, help="Tokens per sequence."),
        max_chunks: int = typer.Option(0, min=0, help="Use at most this many text chunks (0: all)."),
        text_dir: Path = typer.Option(None, help="Directory of *.txt files (default: bundled corpora); files with "
                                      "'test' in the name are held out for the metrics."),
        eval_chunks: int = typer.Option(32, min=0, help="Held-out chunks for SAEBench core metrics (0: none)."),
        normalize_activations: str = typer.Option("none", help="none | expected_average_only_in (scale inputs "
                                                  "so E||x|| = sqrt(d_in); metrics stay in original units)."),
        autocast: str = typer.Option("none", help="none | bf16: torch.autocast bfloat16 for training."),
        allow_hook_mismatch: bool = typer.Option(False, help="Resume a checkpoint of another hook point/model "
                                                 "anyway (warns)."),
        cache: bool = typer.Option(False, help="Cache activations to OUT/activation_cache."),
        out: Path = typer.Option(Path("runs/sae"), help="Output directory (sae_{i}/sae.safetensors + cfg.json)."),
        seed: int = typer.Option(0, help="Seed."),
        distributed: str = typer.Option("none", help="none | ddp | ensemble (launch with torchrun)."),
        device: str = typer.Option("cpu", help="torch device."),
        quiet: bool = typer.Option(False, help="No progress bar."),
        threads: int = typer.Option(0, "--threads", min=0, help="torch CPU threads (0: torch's default)."),
        activations: Path = typer.Option(None, help="Train one SAE on activations on disk instead of a model: a "
                                         "safetensors file with 'train' [n, d_in] and optionally 'test' (metrics)."),
        tokens: int = typer.Option(0, min=0, help="Training activations (0: --steps x --batch-size)."),
    ) -> None:
        """Train TopK SAE(s) on the activations of MODEL at HOOK_POINT (or of --activations FILE); resumes from OUT."""
        import torch

        if threads:
            torch.set_num_threads(threads)
        if activations is not None:
            _train_on_file(activations, out, d_sae, k, tokens or steps * batch_size, batch_size, seed, quiet)
            return
        if autocast not in ("none", "bf16"):
            raise typer.BadParameter(f"--autocast must be 'none' or 'bf16', got {autocast!r}")
        from mlpinterp.lm.models import canonical_model_name, load_model
        from mlpinterp.sae.activations import ActivationConfig, ActivationSource
        from mlpinterp.sae.mfr import MfrConfig, MfrTrainer, init_distributed
        from mlpinterp.sae.topk import SaeConfig

        with expected_errors():
            try:
                cfg = MfrConfig(sae=SaeConfig(d_sae=d_sae, k=k, tied=tied), n_saes=n_saes, penalty=mfr, reinit=mfr,
                                seed=seed, normalize_activations=normalize_activations)  # type: ignore[arg-type]
            except (TypeError, ValueError) as e:
                raise typer.BadParameter(str(e)) from e
            dcfg = init_distributed(distributed)  # type: ignore[arg-type]
            net, tok = load_model(model)
            train_texts, held_texts, held_files = _eval_texts(text_dir)
            # ddp: every rank reads its own shard of the text and contributes batch_size / world activations
            ddp = dcfg.mode == "ddp"
            if ddp and batch_size % dcfg.world:
                raise typer.BadParameter(f"--batch-size {batch_size} must be divisible by the world size {dcfg.world}")
            acfg = ActivationConfig(hook_point=hook_point, ctx_len=ctx_len,
                                    batch_size=batch_size // dcfg.world if ddp else batch_size,
                                    max_chunks=max_chunks or None, seed=seed,
                                    rank=dcfg.rank if ddp else 0, world=dcfg.world if ddp else 1)
            cache_dir = out / (f"activation_cache_rank{acfg.rank}" if ddp else "activation_cache") if cache else None
            src = ActivationSource(net, tok, acfg, texts=train_texts, cache_dir=cache_dir)
            trainer = MfrTrainer(src.d_in, cfg, dcfg, device=device, model_name=canonical_model_name(model),
                                 hook_point=hook_point)
            trainer.load_checkpoint(out, allow_mismatch=allow_hook_mismatch, override="--allow-hook-mismatch")
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast == "bf16"):
                trainer.fit(iter(src), steps, quiet=quiet, checkpoint_dir=out, desc="SAE")
            last = trainer.history[-1] if trainer.history else {}
            typer.echo(f"saved {len(trainer.saes)} SAE(s) under {out}; last reconstruction loss {last.get('recon')}")
            if eval_chunks and dcfg.rank == 0:
                from mlpinterp.lm.text import token_chunks
                from mlpinterp.sae.evaluate import evaluate_sae

                ids = token_chunks(tok, held_texts, ctx_len, eval_chunks)
                with trainer.averaged() as saes:  # the weights that were saved
                    results = [{"sae": f"sae_{i}", **evaluate_sae(sae.cpu().eval(), net, ids,
                                                                  special_ids=tok.all_special_ids)}
                               for i, sae in zip(trainer.owned, saes, strict=True)]
                from mlpinterp.utils.io import atomic_write_json

                atomic_write_json(out / "metrics.json", {
                    "model_name": trainer.model_name, "hook_point": hook_point, "steps": trainer.step,
                    "input_scale": trainer.input_scale, "eval": {"files": held_files, "chunks": int(ids.shape[0]),
                                                                 "ctx_len": ctx_len}, "saebench_core": results})
                ev = [r["reconstruction_quality"]["explained_variance"] for r in results]
                typer.echo(f"SAEBench core metrics of {len(results)} SAE(s) on {int(ids.shape[0])} held-out chunks "
                           f"-> {out / 'metrics.json'} (explained variance {', '.join(f'{v:.3f}' for v in ev)})")

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
        ev = f"; held-out explained variance {core[0]['reconstruction_quality']['explained_variance']:.4f} on " \
             f"{metrics['n_test']} test activations" if core else ""
        typer.echo(f"saved the SAE under {out / 'sae_0'} ({metrics['steps']} steps, {metrics['tokens']} tokens){ev}")

    @sae_app.command("eval")
    def evaluate(
        sae_dir: Path = typer.Argument(..., help="Directory holding cfg.json + the .safetensors (ours, sparsify's "
                                       "or SAELens's)."),
        model: str = typer.Option("", help="Model (default: the one the SAE records; 'minilm' or a local path)."),
        hook_point: str = typer.Option("", help="Hook point (default: the one the SAE records)."),
        allow_hook_mismatch: bool = typer.Option(False, help="Evaluate at another hook point/model than the SAE "
                                                 "records anyway (warns)."),
        eval_chunks: int = typer.Option(400, min=1, help="Held-out text chunks (400 of 128 tokens: 50,400 content "
                                        "tokens, enough for the density metrics at a 1/50,000 resolution)."),
        ctx_len: int = typer.Option(128, min=2, help="Tokens per sequence."),
        text_dir: Path = typer.Option(None, help="Directory of *.txt files; files with 'test' in the name are used."),
        out: Path = typer.Option(None, help="Write the metrics to this JSON file (default: print them)."),
    ) -> None:
        """SAEBench core metrics of a saved SAE at its hook point (KL / CE scores for causal LMs)."""
        from mlpinterp.lm.models import canonical_model_name, load_model
        from mlpinterp.lm.text import token_chunks
        from mlpinterp.sae.evaluate import evaluate_sae
        from mlpinterp.sae.io import load_sae

        with expected_errors():
            sae = load_sae(sae_dir)
            name = model or sae.model_name
            if not name:
                fail(f"{str(sae_dir)!r} records no model", "pass --model")
            net, tok = load_model(name)
            _, held_texts, held_files = _eval_texts(text_dir)
            ids = token_chunks(tok, held_texts, ctx_len, eval_chunks)
            res = evaluate_sae(sae.eval(), net, ids, hook_point=hook_point or None,
                               model_name=canonical_model_name(name), allow_mismatch=allow_hook_mismatch,
                               special_ids=tok.all_special_ids)
        res = {"sae": str(sae_dir), "hook_point": hook_point or sae.hook_point, "eval_files": held_files, **res}
        text = json.dumps(res, indent=2)
        if out is not None:
            from mlpinterp.utils.io import atomic_write_json

            atomic_write_json(out, res)
            typer.echo(f"wrote {out}")
        else:
            typer.echo(text)
