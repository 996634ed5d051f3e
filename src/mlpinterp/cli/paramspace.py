"""The option and the run helper only ``reproduce apd`` and ``reproduce spd`` (the parameter-space toys) share; the
options of every command are in :mod:`mlpinterp.cli.options`."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from mlpinterp.cli.options import Device, Lr, Out, Quick, Quiet, Steps, Threads  # noqa: F401 - re-exported

Seeds = Annotated[int, typer.Option("--seeds", min=1, help="Number of seeds (targets and decompositions).")]


class Fidelity(StrEnum):
    """How closely to follow the APD reference implementation (``mlpinterp.toys.settings.FIDELITIES``)."""

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
    from mlpinterp.cli.errors import expected_errors
    from mlpinterp.cli.options import set_threads

    set_threads(threads)
    overrides = {**({"steps": steps} if steps else {}), **({"lr": lr} if lr is not None else {}), **(config or {})}
    with expected_errors():  # the library's messages name the argument or file and the fix
        return reproduce(setting, seeds, out, quick=quick, quiet=quiet, overrides=overrides or None, device=device,
                         **extra)
