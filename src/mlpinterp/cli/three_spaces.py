"""CLI: ``mlpinterp reproduce three-spaces`` (function, parameter and activation space on one MLP).

    mlpinterp reproduce three-spaces --setting resid-mlp-1|tms-5-2|minilm|lm --out DIR [--quick] [--seeds N]
        [--layer L] [--model PATH] [--data DIR] [--threads T] [--quiet]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import typer

from mlpinterp.cli.config_options import CommandConfig, add_command, config_options, option
from mlpinterp.cli.errors import expected_errors
from mlpinterp.cli.options import Out, Quick, Quiet, Seeds, Threads, out_dir, seeds_field, set_threads
from mlpinterp.utils.validation import Int


@dataclass(frozen=True, kw_only=True)
class ThreeSpacesCommand(CommandConfig, Out, Seeds, Quick, Quiet, Threads):
    """Inputs of ``reproduce three-spaces``."""

    setting: Literal["resid-mlp-1", "tms-5-2", "minilm", "lm"] = option()
    """resid-mlp-1 / tms-5-2: toys with ground truth; minilm: all-MiniLM-L6-v2's FFN block at --layer; lm: a causal
    LM's FFN block (--model DIR, or a small one trained by train-lm into OUT/lm)."""
    out: Path = out_dir(None)
    seeds: int = seeds_field(1)
    """Number of seeds (0..N-1), each a full run; the report and figures give the mean ± s.e. (standard error)
    over them, and no spread across seeds for one."""
    quick: bool = False
    """Reduced preset (fewer steps, smaller data): a pipeline check, never a reproduction, sized for a few minutes
    on a quiet 2-core CPU (resid-mlp-1 the longest; measured times in docs/measurements.md, "Three spaces")."""
    layer: int | None = option(None, check=Int(0), show_default="3 for minilm, 1 for lm")
    """minilm / lm: the FFN block (0-based)."""
    model: Path | None = option(None, metavar="DIR")
    """lm only: a causal LM's Hugging Face directory."""
    data: Path | None = option(None, aliases=("--text-dir",), only_for=("minilm", "lm"), metavar="DIR",
                               show_default="the bundled corpora")
    """minilm / lm: directory of *.txt documents the block inputs (and a trained LM) come from."""


@config_options(ThreeSpacesCommand)
def reproduce_three_spaces(cfg: ThreeSpacesCommand) -> None:
    """Train or load the target, decompose its MLP in function, parameter and activation space, compare the
    direction sets (with ground truth for the toys) and write results.json, figures, report.md and report.html."""
    from mlpinterp.studies.three_spaces.run import reproduce

    set_threads(cfg.threads)
    with expected_errors():
        result = reproduce(cfg.setting, cfg.out, quick=cfg.quick, seeds=cfg.seeds, layer=cfg.layer, model=cfg.model,
                           text_dir=cfg.data, quiet=cfg.quiet)
    typer.echo(f"{result['seconds']:.0f} s wall, {result['cpu_seconds']:.0f} s CPU")
    typer.echo(f"report: {cfg.out / 'report.html'}")


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``reproduce three-spaces``."""
    add_command(reproduce_app, "three-spaces", reproduce_three_spaces)
