"""CLI: ``mlpinterp reproduce transformer``: exact polynomial approximants of a transformer's FFN blocks.

    mlpinterp reproduce transformer --model minilm --layers all --degrees 1 2 3 --out DIR [--quick]
        [--text PATH] [--input-model gaussian --input-model data ...]
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from mlpinterp.cli.options import THREADS_DEFAULT, Out, Quiet, Threads, flag, many, set_threads
from mlpinterp.studies.transformer.settings import INPUT_MODELS

InputModel = StrEnum("InputModel", {m.replace("-", "_"): m for m in INPUT_MODELS})
"""Input models of ``reproduce transformer`` (:data:`~mlpinterp.studies.transformer.settings.INPUT_MODELS`)."""


class Covariance(StrEnum):
    """Covariance estimate of the Gaussian input model."""

    empirical = "empirical"
    ledoit_wolf = "ledoit-wolf"

_MULTI = {"allow_extra_args": True, "ignore_unknown_options": False}


def _ints(values: list[str], name: str) -> tuple[int, ...]:
    out = []
    for tok in values:
        for part in str(tok).split(","):
            if part:
                try:
                    out.append(int(part))
                except ValueError:
                    raise typer.BadParameter(f"{name} expects integers, got {part!r}") from None
    return tuple(out)


def continue_flags(old: dict) -> str:
    """The ``reproduce transformer`` flags that continue the run whose ``config.json`` is ``old``."""
    import shlex

    layers = "all" if old.get("layers") is None else ",".join(str(i) for i in old["layers"])
    flags = [f"--model {shlex.quote(str(old['model']))}", f"--layers {layers}", "--degrees " + " ".join(map(str, old["degrees"]))]
    flags += [f"--input-model {m}" for m in old["input_models"]]
    flags += ["--quick" if old.get("run") == "quick" else "--no-quick",
              f"--max-tokens {old['capture']['max_tokens']}", f"--ctx-len {old['capture']['ctx_len']}",
              f"--covariance {old['covariance']}", f"--mixture-components {old['mixture_components']}",
              f"--hybrid-steps {old['hybrid']['steps']}", f"--seed {old['seed']}"]
    return " ".join(flags)


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``reproduce transformer``."""
    from mlpinterp.studies.transformer.settings import TransformerExperiment

    default, quick_cfg = TransformerExperiment(), TransformerExperiment.quick()

    @reproduce_app.command("transformer", context_settings=_MULTI)
    def reproduce_transformer(
        ctx: typer.Context,
        model: str = typer.Option(default.model, help="'minilm' (the embedded all-MiniLM-L6-v2) or a Hugging Face "
                                                      "name / local path whose weights are already on disk."),
        layers: str | None = typer.Option(None, help="FFN blocks to analyse: 'all' or indices, e.g. '0,3,5' or '0,-1' "
                                          "(first and last).", show_default="all; with --quick: 0,-1"),
        degrees: list[str] = many([str(d) for d in default.degrees], "--degrees", metavar="DEGREE",
                                  help="Degrees: --degrees 1 2 3."),
        input_model: list[InputModel] = many(list(InputModel), "--input-model", metavar="MODEL",
                                             help="Input model(s), repeatable."),
        out: Out = Path("runs/transformer"),
        quick: bool = flag("--quick/--no-quick", default=False, help="Pipeline check in about 3 minutes on a 2-core "
                           f"CPU (blocks {','.join(map(str, quick_cfg.layers))} unless --layers, "
                           f"{quick_cfg.capture.max_tokens:,} tokens, K = {quick_cfg.mixture_components}, "
                           f"{quick_cfg.hybrid.steps} fine-tuning steps): no verdicts."),
        text: Path | None = typer.Option(None, help="Text file or directory of *.txt.",
                                         show_default="../shared/data/text"),
        max_tokens: int | None = typer.Option(None, min=1, help="Content tokens to read.", show_default=(
            f"{default.capture.max_tokens:,}; quick: {quick_cfg.capture.max_tokens:,}")),
        ctx_len: int | None = typer.Option(None, min=2, help="Tokens per sequence, special tokens included; at most "
                                           "the model's positions.", show_default=str(default.capture.ctx_len)),
        covariance: Covariance = typer.Option(Covariance(default.covariance), help="Gaussian input model's "
                                              "covariance."),
        mixture_components: int | None = typer.Option(None, min=1, help="K of the mixture.", show_default=(
            f"{default.mixture_components}; quick: {quick_cfg.mixture_components}")),
        hybrid_steps: int | None = typer.Option(None, min=1, help="Fine-tuning steps.", show_default=(
            f"{default.hybrid.steps}; quick: {quick_cfg.hybrid.steps}")),
        seed: int = typer.Option(default.seed, min=0, help="Seed (split, mixture, Monte Carlo, fine-tuning)."),
        quiet: Quiet = False,
        threads: Threads = THREADS_DEFAULT,
    ) -> None:
        """FFN blocks of a real transformer as exact polynomials: fit, held-out FVU, splice-in, eigen-features."""
        from dataclasses import replace

        from mlpinterp.cli.errors import expected_errors
        from mlpinterp.lm.text import read_texts
        from mlpinterp.models import RunConflictError
        from mlpinterp.studies.transformer.run import run_transformer
        from mlpinterp.utils.rundir import read_output

        set_threads(threads)
        degs = _ints(degrees + [a for a in ctx.args if a.lstrip("-").isdigit() or "," in a], "--degrees")
        extra = [a for a in ctx.args if not (a.lstrip("-").isdigit() or "," in a)]
        if extra:
            raise typer.BadParameter(f"unexpected arguments {extra}")
        kw: dict = {"model": model, "degrees": degs, "input_models": tuple(InputModel(m).value for m in input_model),
                    "covariance": Covariance(covariance).value, "seed": seed}
        if layers == "all":
            kw["layers"] = None
        elif layers:
            kw["layers"] = _ints([layers], "--layers")
        with expected_errors(fix="check the value named above; `mlpinterp reproduce transformer --help` lists them"):
            exp = TransformerExperiment.quick(**kw) if quick else TransformerExperiment(**kw)
            if max_tokens is not None:
                exp = replace(exp, capture=replace(exp.capture, max_tokens=max_tokens,
                                                   keep_fit=min(exp.capture.keep_fit, max_tokens)))
            if ctx_len is not None:
                exp = replace(exp, capture=replace(exp.capture, ctx_len=ctx_len))
            if mixture_components is not None:
                exp = replace(exp, mixture_components=mixture_components)
            if hybrid_steps is not None:
                exp = replace(exp, hybrid=replace(exp.hybrid, steps=hybrid_steps))
            texts = read_texts(text) if text is not None else None
            if quiet:
                import transformers

                transformers.utils.logging.disable_progress_bar()
            try:
                res = run_transformer(out, exp, quiet=quiet, texts=texts)
            except RunConflictError as e:
                import shlex

                old = read_output(out / "config.json", what="run configuration")
                e.fix = (f"continue that run with `mlpinterp reproduce transformer {continue_flags(old)} --out "
                         f"{shlex.quote(str(out))}` (and the same --text), or choose a new --out")
                raise
        typer.echo(f"wrote {out / 'report.md'} and {out / 'report.html'} ({res['seconds']:.0f} s)")
