"""Options and the run helper shared by ``reproduce apd`` and ``reproduce spd`` (the parameter-space toys).

Each option is an ``Annotated`` type, so both commands declare ``seeds: Seeds = 3`` and get the same flag, bounds
and help text.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:  # also NaN
        raise typer.BadParameter(f"must be > 0, got {value}")
    return value


def _non_empty(value: Path) -> Path:
    if str(value).strip() in ("", "."):
        raise typer.BadParameter("must name a directory other than the current one (an empty path or '.' would "
                                 "write metrics.json, report.* and seed*/ into it)")
    return value


Seeds = Annotated[int, typer.Option("--seeds", min=1, help="Number of seeds (targets and decompositions).")]
Out = Annotated[Path, typer.Option("--out", callback=_non_empty,
                                   help="Output directory (resumable: a rerun continues).")]
Quick = Annotated[bool, typer.Option("--quick/--no-quick", help="Reduced CPU preset (fewer steps, smaller batches): "
                                                                 "a pipeline check, never a reproduction.")]
Device = Annotated[str, typer.Option("--device", help="Where to train: cpu, cuda, cuda:1, ...")]
Quiet = Annotated[bool, typer.Option("--quiet/--no-quiet", help="No progress bars.")]
Steps = Annotated[int | None, typer.Option("--steps", min=1, help="Override the preset's number of steps.")]
Lr = Annotated[float | None, typer.Option("--lr", callback=_positive,
                                          help="Override the preset's peak learning rate (> 0).")]
Threads = Annotated[int, typer.Option("--threads", min=1, help="torch CPU threads.")]


class Fidelity(StrEnum):
    """How closely to follow the APD reference implementation (``mlpinterp.experiments.apd.FIDELITIES``)."""

    ours = "ours"
    reference = "reference"


FidelityOpt = Annotated[Fidelity | None, typer.Option(
    "--fidelity", help="ours: our presets; reference: the APD reference implementation's way, for TMS (inner rank "
                       "min(d_in, d_hidden) + 1, small 4-D Xavier init, no weight decay, cos(π/2 t/(T-1)) after "
                       "warm-up, target trained at lr 5e-3 with linear decay) and for the residual-MLP targets (MLPs "
                       "without biases, 1k steps at batch 2048, lr 3e-3, cos(π/2 t/(T-1)); 10k steps for 3 layers). "
                       "Default: the better one measured, reference for tms-40-10, ours elsewhere (docs/guides/apd.md).",
    show_default=False)]


def run(reproduce, setting: str, seeds: int, out: Path, quick: bool, quiet: bool, steps: int | None,
        lr: float | None, threads: int, device: str, config: dict | None = None, **extra) -> dict:
    """Call ``reproduce(setting, seeds, out, ...)`` with the overrides (``steps``, ``lr`` and the configuration
    fields in ``config``) and ``extra`` keyword arguments, expected failures as ``Error:``/``Fix:``."""
    import torch

    from mlpinterp.cli.errors import expected_errors

    torch.set_num_threads(threads)
    overrides = {**({"steps": steps} if steps else {}), **({"lr": lr} if lr is not None else {}), **(config or {})}
    with expected_errors():  # the library's messages name the argument or file and the fix
        return reproduce(setting, seeds, out, quick=quick, quiet=quiet, overrides=overrides or None, device=device,
                         **extra)
