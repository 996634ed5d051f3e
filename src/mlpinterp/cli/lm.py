"""CLI: ``mlpinterp train-lm``: a small GPT-2-architecture causal LM with its own byte-level BPE tokenizer.

    mlpinterp train-lm --out DIR [--data DIR] [--steps N] [--quiet] [every LmTrainConfig field as an option]

Writes a Hugging Face directory (``GPT2LMHeadModel.from_pretrained(DIR)``, ``AutoTokenizer.from_pretrained(DIR)``)
and ``DIR/metrics.json`` with the held-out perplexity; re-running resumes. ``reproduce mfr --setting lm --model DIR``
then runs the MFR paper's Table 2 protocol on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from mlpinterp.cli.config_options import CommandConfig, add_command, config_options, option
from mlpinterp.cli.options import Out, Quiet, Threads, out_dir
from mlpinterp.lm.train_config import LmTrainConfig


@dataclass(frozen=True, kw_only=True)
class LmRun(CommandConfig, Out, Quiet, Threads):
    """Where ``train-lm`` writes and reads (the model and its training are an
    :class:`~mlpinterp.lm.train_config.LmTrainConfig`)."""

    out: Path = out_dir("runs/lm")
    """Output directory: the Hugging Face model + tokenizer, metrics.json, checkpoint/ (a run directory: locked while
    in use; re-running resumes)."""
    data: Path | None = option(None, aliases=("--text-dir",), metavar="DIR", show_default="../shared/data/text")
    """Directory of *.txt documents; files with 'test' in the name are held out for the perplexity."""


@config_options(run=LmRun, cfg=LmTrainConfig)
def train_lm(run: LmRun, cfg: LmTrainConfig) -> None:
    """Train a GPT-2-architecture causal LM and its BPE tokenizer; report held-out perplexity."""
    from mlpinterp.cli.errors import expected_errors
    from mlpinterp.lm.train import train_lm as train

    with expected_errors():
        m = train(cfg, run.out, text_dir=run.data, quiet=run.quiet, threads=run.threads)
    h, t = m["held_out"], m["train"]
    typer.echo(f"saved {run.out} ({m['model']['parameters']:,} parameters, vocabulary {m['model']['vocab_size']}); "
               f"held-out perplexity {h['perplexity']:.2f} (CE {h['ce']:.4f} nats/token on {h['tokens']:,} "
               f"tokens of {', '.join(h['files'])}); {t['tokens_seen']:,} training tokens in {t['seconds']:.0f} s")


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``train-lm`` to the top-level app."""
    add_command(app, "train-lm", train_lm)
