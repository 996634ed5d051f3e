"""CLI: ``mlpinterp reproduce transformer``: exact polynomial approximants of a transformer's FFN blocks.

    mlpinterp reproduce transformer --model minilm --layers all --degrees 1 2 3 --out DIR [--quick]
        [--data PATH] [--input-model gaussian --input-model data ...]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import typer

from mlpinterp.cli.config_options import CommandConfig, add_command, config_options, invalid, option
from mlpinterp.cli.options import Out, Quick, Quiet, Threads, out_dir, set_threads
from mlpinterp.studies.transformer.settings import INPUT_MODELS, TransformerExperiment
from mlpinterp.utils.validation import Int

_DEFAULT, _QUICK = TransformerExperiment(), TransformerExperiment.quick()


@dataclass(frozen=True, kw_only=True)
class TransformerCommand(CommandConfig, Out, Quick, Quiet, Threads):
    """Inputs of ``reproduce transformer``: a :class:`~mlpinterp.studies.transformer.settings.TransformerExperiment`
    (:meth:`experiment`) and where its text comes from."""

    model: str = _DEFAULT.model
    """'minilm' (the embedded all-MiniLM-L6-v2) or a Hugging Face name / local path whose weights are already on
    disk."""
    layers: str | None = option(None, show_default=f"all; --quick: {','.join(map(str, _QUICK.layers))}")
    """FFN blocks to analyse: 'all' or indices, e.g. '0,3,5' or '0,-1' (first and last)."""
    degrees: tuple[int, ...] = option(_DEFAULT.degrees, greedy=True, metavar="DEGREE")
    """Polynomial degrees: --degrees 1 2 3."""
    input_model: tuple[Literal["gaussian", "mixture", "data", "hybrid"], ...] = option(INPUT_MODELS, metavar="MODEL")
    """Input model(s) to fit, repeatable: --input-model gaussian --input-model data."""
    out: Path = out_dir("runs/transformer")
    data: Path | None = option(None, aliases=("--text",), metavar="PATH", show_default="../shared/data/text")
    """Text file or directory of *.txt documents the FFN inputs are read from."""
    max_tokens: int | None = option(None, check=Int(1), show_default=f"{_DEFAULT.capture.max_tokens:,}; --quick: "
                                                                     f"{_QUICK.capture.max_tokens:,}")
    """Content tokens to read."""
    ctx_len: int | None = option(None, check=Int(2), show_default=str(_DEFAULT.capture.ctx_len))
    """Tokens per sequence, special tokens included; at most the model's positions."""
    covariance: Literal["empirical", "ledoit-wolf"] = _DEFAULT.covariance
    """Covariance estimate of the Gaussian input model."""
    mixture_components: int | None = option(None, check=Int(1), show_default=f"{_DEFAULT.mixture_components}; "
                                                                             f"--quick: {_QUICK.mixture_components}")
    """K of the Gaussian mixture input model."""
    hybrid_steps: int | None = option(None, check=Int(1), show_default=f"{_DEFAULT.hybrid.steps}; --quick: "
                                                                       f"{_QUICK.hybrid.steps}")
    """Fine-tuning steps of the hybrid input model."""
    seed: int = option(_DEFAULT.seed, check=Int(0))
    """Seed (split, mixture, Monte Carlo, fine-tuning)."""

    def experiment(self) -> TransformerExperiment:
        """The study configuration (its own validation refuses invalid values)."""
        kw: dict = {"model": self.model, "degrees": self.degrees, "input_models": self.input_model,
                    "covariance": self.covariance, "seed": self.seed}
        if self.layers == "all":
            kw["layers"] = None
        elif self.layers:
            try:
                kw["layers"] = tuple(int(p) for p in self.layers.split(",") if p.strip())
            except ValueError:
                raise invalid(f"--layers must be 'all' or comma-separated block indices, got {self.layers!r}",
                              "pass e.g. --layers all, --layers 0,3,5 or --layers 0,-1") from None
        exp = TransformerExperiment.quick(**kw) if self.quick else TransformerExperiment(**kw)
        if self.max_tokens is not None:
            exp = replace(exp, capture=replace(exp.capture, max_tokens=self.max_tokens,
                                               keep_fit=min(exp.capture.keep_fit, self.max_tokens)))
        if self.ctx_len is not None:
            exp = replace(exp, capture=replace(exp.capture, ctx_len=self.ctx_len))
        if self.mixture_components is not None:
            exp = replace(exp, mixture_components=self.mixture_components)
        if self.hybrid_steps is not None:
            exp = replace(exp, hybrid=replace(exp.hybrid, steps=self.hybrid_steps))
        return exp

    def validate(self) -> None:
        self.experiment()


def continue_flags(old: dict) -> str:
    """The ``reproduce transformer`` flags that continue the run whose ``config.json`` is ``old``."""
    import shlex

    layers = "all" if old.get("layers") is None else ",".join(str(i) for i in old["layers"])
    flags = [f"--model {shlex.quote(str(old['model']))}", f"--layers {layers}",
             "--degrees " + " ".join(map(str, old["degrees"]))]
    flags += [f"--input-model {m}" for m in old["input_models"]]
    flags += ["--quick" if old.get("run") == "quick" else "--no-quick",
              f"--max-tokens {old['capture']['max_tokens']}", f"--ctx-len {old['capture']['ctx_len']}",
              f"--covariance {old['covariance']}", f"--mixture-components {old['mixture_components']}",
              f"--hybrid-steps {old['hybrid']['steps']}", f"--seed {old['seed']}"]
    return " ".join(flags)


@config_options(TransformerCommand)
def reproduce_transformer(cfg: TransformerCommand) -> None:
    """FFN blocks of a real transformer as exact polynomials: fit, held-out FVU, splice-in, eigen-features."""
    from mlpinterp.cli.errors import expected_errors
    from mlpinterp.lm.text import read_texts
    from mlpinterp.models import RunConflictError
    from mlpinterp.studies.transformer.run import run_transformer
    from mlpinterp.utils.rundir import read_output

    set_threads(cfg.threads)
    with expected_errors(fix="check the value named above; `mlpinterp reproduce transformer --help` lists them"):
        exp = cfg.experiment()
        texts = read_texts(cfg.data) if cfg.data is not None else None
        if cfg.quiet:
            import transformers

            transformers.utils.logging.disable_progress_bar()
        try:
            res = run_transformer(cfg.out, exp, quiet=cfg.quiet, texts=texts)
        except RunConflictError as e:
            import shlex

            old = read_output(cfg.out / "config.json", what="run configuration")
            e.fix = (f"continue that run with `mlpinterp reproduce transformer {continue_flags(old)} --out "
                     f"{shlex.quote(str(cfg.out))}` (and the same --data), or choose a new --out")
            raise
    typer.echo(f"wrote {cfg.out / 'report.md'} and {cfg.out / 'report.html'} ({res['seconds']:.0f} s)")


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``reproduce transformer``."""
    add_command(reproduce_app, "transformer", reproduce_transformer)
