"""CLI commands for the sae part of mlpinterp.

* ``mlpinterp reproduce mfr --setting synthetic|minilm --k 6 12 18 24 30 --seeds N --out DIR [--quick] [--quiet]``
* ``mlpinterp sae train --model minilm --hook-point encoder.layer.3.output --k 32 --d-sae 3072 --out DIR``
  (one TopK SAE, or ``--n-saes N --mfr`` for MFR; ``torchrun ... --distributed ddp|ensemble`` for several
  processes).
"""

from __future__ import annotations

from pathlib import Path

import typer

_MULTI = {"allow_extra_args": True, "ignore_unknown_options": False}


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
        setting: str = typer.Option("synthetic", help="synthetic | minilm | gpt2 (GPT-2 weights must be on disk)"),
        k: list[str] = typer.Option(["6", "12", "18", "24", "30"], help="TopK k values: --k 6 12 18 24 30"),
        seeds: int = typer.Option(3, min=1, help="Seeds per (k, condition)."),
        out: Path = typer.Option(Path("runs/mfr"), help="Output directory (resumable)."),
        quick: bool = typer.Option(False, help="Small budget (minutes on a CPU)."),
        quiet: bool = typer.Option(False, help="No progress bars."),
        steps: int = typer.Option(0, min=0, help="Override the number of steps (0: setting default)."),
        device: str = typer.Option("cpu", help="torch device, e.g. cuda."),
        hook_point: str = typer.Option("", help="Hook point for minilm/gpt2 (default: a mid-depth residual stream)."),
        n_saes: int = typer.Option(2, min=2, help="SAEs trained in parallel."),
        alpha: float = typer.Option(-1.0, help="MFR penalty weight (negative: auto, initial penalty = initial loss)."),
        extra_alpha: list[float] = typer.Option([0.1], help="Fixed penalty weight run as an extra condition "
                                                "mfr_alpha<a>; repeat for several; a negative value: none."),
        threads: int = typer.Option(1, "--threads", min=1, help="torch CPU threads (1 is fastest on a shared CPU)."),
    ) -> None:
        """Reproduce Marks et al. 2024 (MFR): figures, metrics.json and report.md in OUT."""
        import torch

        from mlpinterp.experiments import mfr as exp_mod

        torch.set_num_threads(threads)
        ks = _k_values(k, ctx.args)
        kw = {"k_values": ks, "seeds": seeds, "n_saes": n_saes, "alpha": None if alpha < 0 else alpha,
              "extra_alphas": tuple(a for a in extra_alpha if not a < 0),
              **({"steps": steps} if steps else {})}
        if setting == "synthetic":
            exp = exp_mod.SyntheticExperiment.quick(**kw) if quick else exp_mod.SyntheticExperiment(**kw)
            metrics = exp_mod.run_synthetic(out, exp, quiet=quiet, device=device)
        elif setting in ("minilm", "gpt2"):
            if setting == "gpt2":  # needs GPT-2 weights on disk (no download)
                kw.update(model="gpt2", hook_point=hook_point or "transformer.h.5")
            elif hook_point:
                kw["hook_point"] = hook_point
            exp = exp_mod.MinilmExperiment.quick(**kw) if quick else exp_mod.MinilmExperiment(**kw)
            metrics = exp_mod.run_minilm(out, exp, quiet=quiet, device=device)
        else:
            raise typer.BadParameter(f"--setting must be 'synthetic', 'minilm' or 'gpt2', got {setting!r}")
        typer.echo(f"wrote {out / 'report.md'} ({metrics['seconds']:.0f} s)")

    @sae_app.command("train")
    def train(
        model: str = typer.Option("minilm", help="'minilm' (embedded), or a local Hugging Face name/path."),
        hook_point: str = typer.Option("encoder.layer.3.output", help="Module path whose output is read."),
        k: int = typer.Option(32, min=1, help="TopK k."),
        d_sae: int = typer.Option(3072, min=1, help="Number of latents."),
        tied: bool = typer.Option(False, help="Tie the decoder to the encoder."),
        n_saes: int = typer.Option(1, min=1, help="SAEs trained in parallel."),
        mfr: bool = typer.Option(False, help="MFR penalty and re-initialisation (needs --n-saes >= 2)."),
        steps: int = typer.Option(1000, min=1, help="Optimisation steps."),
        batch_size: int = typer.Option(4096, min=1, help="Activations per step (global)."),
        ctx_len: int = typer.Option(128, min=2, help="Tokens per sequence."),
        max_chunks: int = typer.Option(0, min=0, help="Use at most this many text chunks (0: all)."),
        text_dir: Path = typer.Option(None, help="Directory of *.txt files (default: bundled corpora)."),
        cache: bool = typer.Option(False, help="Cache activations to OUT/activation_cache."),
        out: Path = typer.Option(Path("runs/sae"), help="Output directory (sae_{i}/sae.safetensors + cfg.json)."),
        seed: int = typer.Option(0, help="Seed."),
        distributed: str = typer.Option("none", help="none | ddp | ensemble (launch with torchrun)."),
        device: str = typer.Option("cpu", help="torch device."),
        quiet: bool = typer.Option(False, help="No progress bar."),
        threads: int = typer.Option(0, "--threads", min=0, help="torch CPU threads (0: torch's default)."),
    ) -> None:
        """Train TopK SAE(s) on the activations of MODEL at HOOK_POINT; resumes from OUT."""
        if threads:
            import torch

            torch.set_num_threads(threads)
        from mlpinterp.lm.models import load_model
        from mlpinterp.lm.text import read_texts
        from mlpinterp.sae.activations import ActivationConfig, ActivationSource
        from mlpinterp.sae.mfr import MfrConfig, MfrTrainer, init_distributed
        from mlpinterp.sae.topk import SaeConfig

        dcfg = init_distributed(distributed)  # type: ignore[arg-type]
        net, tok = load_model(model)
        texts = read_texts(text_dir) if text_dir is not None else None
        # ddp: every rank reads its own shard of the text and contributes batch_size / world activations
        ddp = dcfg.mode == "ddp"
        if ddp and batch_size % dcfg.world:
            raise typer.BadParameter(f"--batch-size {batch_size} must be divisible by the world size {dcfg.world}")
        acfg = ActivationConfig(hook_point=hook_point, ctx_len=ctx_len,
                                batch_size=batch_size // dcfg.world if ddp else batch_size,
                                max_chunks=max_chunks or None, seed=seed,
                                rank=dcfg.rank if ddp else 0, world=dcfg.world if ddp else 1)
        cache_dir = out / (f"activation_cache_rank{acfg.rank}" if ddp else "activation_cache") if cache else None
        src = ActivationSource(net, tok, acfg, texts=texts, cache_dir=cache_dir)
        cfg = MfrConfig(sae=SaeConfig(d_sae=d_sae, k=k, tied=tied), n_saes=n_saes, penalty=mfr, reinit=mfr,
                        seed=seed)
        trainer = MfrTrainer(src.d_in, cfg, dcfg, device=device)
        trainer.load_checkpoint(out)
        trainer.fit(iter(src), steps, quiet=quiet, checkpoint_dir=out, desc="SAE")
        last = trainer.history[-1] if trainer.history else {}
        typer.echo(f"saved {len(trainer.saes)} SAE(s) under {out}; last reconstruction loss {last.get('recon')}")
