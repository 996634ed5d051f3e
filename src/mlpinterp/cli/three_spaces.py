"""CLI: ``mlpinterp reproduce three-spaces`` (function, parameter and activation space on one MLP).

    mlpinterp reproduce three-spaces --setting resid-mlp-1|tms-5-2|minilm|lm --out DIR [--quick] [--seeds N]
        [--layer L] [--model PATH] [--text-dir DIR] [--threads T] [--quiet]
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from mlpinterp.cli.errors import expected_errors
from mlpinterp.cli.options import THREADS_DEFAULT, Out, Quick, Quiet, Threads, set_threads
from mlpinterp.cli.paramspace import Seeds


class Setting(StrEnum):
    """The MLP the study opens."""

    resid_mlp_1 = "resid-mlp-1"
    tms_5_2 = "tms-5-2"
    minilm = "minilm"
    lm = "lm"


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``reproduce three-spaces``."""

    @reproduce_app.command("three-spaces")
    def reproduce_three_spaces(
        setting: Setting = typer.Option(..., "--setting", help="resid-mlp-1 / tms-5-2: toys with ground truth; "
                                        "minilm: all-MiniLM-L6-v2's FFN block at --layer; lm: a causal LM's FFN "
                                        "block (--model DIR, or a small one trained by train-lm into OUT/lm)."),
        out: Out = ..., seeds: Seeds = 1, quick: Quick = False, quiet: Quiet = False, threads: Threads = THREADS_DEFAULT,
        layer: int | None = typer.Option(None, "--layer", min=0, help="FFN block of minilm / lm (0-based; default "
                                         "3 for minilm, 1 for lm).", show_default=False),
        model: Path | None = typer.Option(None, "--model", help="lm only: a causal LM's Hugging Face directory."),
        text_dir: Path | None = typer.Option(None, "--text-dir", help="minilm / lm: directory of *.txt files the "
                                             "block inputs (and a trained LM) come from.",
                                             show_default="the bundled corpora"),
    ) -> None:
        """Train or load the target, decompose its MLP in function, parameter and activation space, compare the
        direction sets (with ground truth for the toys) and write results.json, figures, report.md and
        report.html."""
        from mlpinterp.studies.three_spaces.run import reproduce

        set_threads(threads)
        with expected_errors(fix="see `mlpinterp reproduce three-spaces --help`"):
            result = reproduce(setting.value, out, quick=quick, seeds=seeds, layer=layer, model=model,
                               text_dir=text_dir, quiet=quiet)
        typer.echo(f"{result['seconds']:.0f} s wall, {result['cpu_seconds']:.0f} s CPU")
        typer.echo(f"report: {out / 'report.html'}")
