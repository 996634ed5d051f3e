"""CLI: ``mlpinterp train-lm``: a small GPT-2-architecture causal LM with its own byte-level BPE tokenizer.

    mlpinterp train-lm --out DIR [--text-dir DIR] [--steps N] [--quiet] [every LmTrainConfig field as an option]

Writes a Hugging Face directory (``GPT2LMHeadModel.from_pretrained(DIR)``, ``AutoTokenizer.from_pretrained(DIR)``)
and ``DIR/metrics.json`` with the held-out perplexity; re-running resumes. ``reproduce mfr --setting lm --model DIR``
then runs the MFR paper's Table 2 protocol on it.
"""

from __future__ import annotations

from pathlib import Path

import typer

from mlpinterp.cli.config_options import config_options
from mlpinterp.lm.train_config import LmTrainConfig


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``train-lm`` to the top-level app."""

    @app.command("train-lm")
    @config_options(LmTrainConfig)
    def train_lm_command(
        cfg: LmTrainConfig,
        out: Path = typer.Option(Path("runs/lm"), help="Output directory: the Hugging Face model + tokenizer, "
                                 "metrics.json, checkpoint/ (resumable)."),
        text_dir: Path = typer.Option(None, help="Directory of *.txt documents (default: ../shared/data/text); files "
                                      "with 'test' in the name are held out for the perplexity."),
        quiet: bool = typer.Option(False, "--quiet/--no-quiet", help="No progress bar."),
        threads: int = typer.Option(1, min=1, help="torch CPU threads (1 is fastest on a shared CPU; resuming "
                                    "bit-identically needs the same value)."),
    ) -> None:
        """Train a GPT-2-architecture causal LM and its BPE tokenizer; report held-out perplexity."""
        from mlpinterp.cli.errors import expected_errors
        from mlpinterp.lm.train import train_lm

        with expected_errors(fix="see `mlpinterp train-lm --help`"):
            m = train_lm(cfg, out, text_dir=text_dir, quiet=quiet, threads=threads)
        h, t = m["held_out"], m["train"]
        typer.echo(f"saved {out} ({m['model']['parameters']:,} parameters, vocabulary {m['model']['vocab_size']}); "
                   f"held-out perplexity {h['perplexity']:.2f} (CE {h['ce']:.4f} nats/token on {h['tokens']:,} "
                   f"tokens of {', '.join(h['files'])}); {t['tokens_seen']:,} training tokens in {t['seconds']:.0f} s")
