"""What ``reproduce apd`` and ``reproduce spd`` (the parameter-space toys) and their ``train-target`` commands share:
the configuration fields of a toy reproduction and of a toy target, and the run helper."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mlpinterp.cli.config_options import CommandConfig, invalid, option
from mlpinterp.cli.options import Device, Out, Quick, Quiet, Seeds, Threads, positive, seeds_field
from mlpinterp.utils.validation import Int

Fidelity = Literal["ours", "reference"]
"""How closely to follow the APD reference implementation (``mlpinterp.toys.settings.FIDELITIES``)."""


@dataclass(frozen=True, kw_only=True)
class ToyRepro(CommandConfig, Out, Seeds, Quick, Device, Quiet, Threads):
    """Options of a parameter-space toy reproduction (``reproduce apd``, ``reproduce spd``)."""

    seeds: int = seeds_field(3)
    """Number of seeds (targets and decompositions)."""
    steps: int | None = option(None, check=Int(1), show_default="the preset's")
    """Override the preset's number of steps."""
    lr: float | None = option(None, check=positive, show_default="the preset's")
    """Override the preset's peak learning rate (> 0)."""

    def overrides(self) -> dict:
        """The configuration fields the options replace in the preset."""
        return {**({"steps": self.steps} if self.steps is not None else {}),
                **({"lr": self.lr} if self.lr is not None else {})}


@dataclass(frozen=True, kw_only=True)
class ToyTarget(CommandConfig, Quick, Quiet):
    """Options of ``apd train-target`` / ``spd train-target``: one toy target saved to one file."""

    seed: int = option(0, check=Int(0, what="a non-negative int"))
    """Seed of the target (>= 0)."""
    out: Path = option(metavar="FILE")
    """Path of the .safetensors file (the suffix is appended unless present; a .json is written beside)."""

    def validate(self) -> None:
        if self.out.is_dir():
            raise invalid(f"--out {str(self.out)!r} is an existing directory; expected the path of a .safetensors "
                          "file", f"pass a file path, e.g. --out {str(self.out / 'target.safetensors')!r}")


def run(reproduce, setting: str, cmd: ToyRepro, config: dict | None = None, **extra) -> dict:
    """Call ``reproduce(setting, seeds, out, ...)`` with the overrides of ``cmd`` (``--steps``, ``--lr``), the
    configuration fields in ``config`` and ``extra`` keyword arguments, expected failures as ``Error:``/``Fix:``."""
    from mlpinterp.cli.errors import expected_errors
    from mlpinterp.cli.options import set_threads

    set_threads(cmd.threads)
    overrides = {**cmd.overrides(), **(config or {})}
    with expected_errors():  # the library's messages name the argument or file and the fix
        return reproduce(setting, cmd.seeds, cmd.out, quick=cmd.quick, quiet=cmd.quiet, overrides=overrides or None,
                         device=cmd.device, **extra)
