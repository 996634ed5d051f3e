"""CLI: ``mlpinterp reproduce spd`` (Stochastic Parameter Decomposition, Bushnaq, Braun, Sharkey 2025).

    mlpinterp reproduce spd --setting tms-5-2 --seeds 10 --out DIR [--quick/--no-quick] [--device cuda]
        [--steps N] [--lr LR] [--threads T] [--quiet]
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer


class Setting(StrEnum):
    """SPD toy settings (SPD paper Sec. 3; the "-id" ones have an identity layer inserted)."""

    tms_5_2 = "tms-5-2"
    tms_40_10 = "tms-40-10"
    tms_5_2_id = "tms-5-2-id"
    tms_40_10_id = "tms-40-10-id"
    resid_mlp_1 = "resid-mlp-1"
    resid_mlp_2 = "resid-mlp-2"
    resid_mlp_3 = "resid-mlp-3"


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach ``reproduce spd``."""

    @reproduce_app.command("spd")
    def reproduce_spd(
        setting: Setting = typer.Option(..., "--setting", help="Toy setting to reproduce."),
        seeds: int = typer.Option(3, "--seeds", min=1, help="Number of seeds (targets and decompositions)."),
        out: Path = typer.Option(..., "--out", help="Output directory (resumable: a rerun continues)."),
        quick: bool = typer.Option(False, "--quick/--no-quick",
                                   help="Reduced CPU preset (fewer steps, smaller batches): a pipeline check, "
                                        "never a reproduction."),
        device: str = typer.Option("cpu", "--device", help="Where to train: cpu, cuda, cuda:1, ..."),
        quiet: bool = typer.Option(False, "--quiet/--no-quiet", help="No progress bars."),
        steps: int | None = typer.Option(None, "--steps", min=1, help="Override the preset's number of SPD steps."),
        lr: float | None = typer.Option(None, "--lr", min=0.0, help="Override the preset's peak learning rate."),
        threads: int = typer.Option(1, "--threads", min=1, help="torch CPU threads."),
    ) -> None:
        """Train the target if needed, decompose it with SPD, write figures, metrics.json, report.md and
        report.html (the paper's numbers and our APD numbers beside ours)."""
        import torch

        from mlpinterp.cli.errors import expected_errors
        from mlpinterp.experiments.spd import reproduce

        torch.set_num_threads(threads)
        overrides = {**({"steps": steps} if steps else {}), **({"lr": lr} if lr is not None else {})}
        with expected_errors("use another --out for a different configuration, or --device cpu without CUDA"):
            result = reproduce(setting.value, seeds, out, quick=quick, quiet=quiet, overrides=overrides or None,
                               device=device)
        if "mmcs" in result:
            typer.echo(f"MMCS per seed: {', '.join(f'{v:.4f}' for v in result['mmcs'])}")
            typer.echo(f"ML2R per seed: {', '.join(f'{v:.4f}' for v in result['ml2r'])}")
            typer.echo(f"failed seeds (MMCS < 0.99): {result['failed_seeds']} of {seeds}")
        typer.echo(f"report: {out / 'report.html'}")
