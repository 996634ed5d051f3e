"""The options several commands share, declared once as configuration fields: the same name, rule, default and help
everywhere.

A command's configuration dataclass composes the ones it takes (``class TrainCommand(CommandConfig, Out, Quiet,
Threads, Device)``); a command whose default differs redeclares the field with :func:`out_dir` or
:func:`seeds_field` (the help stays the shared docstring). :mod:`mlpinterp.cli.config_options` turns the fields into
options.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mlpinterp.cli.config_options import invalid, option
from mlpinterp.utils.validation import Int

THREADS_DEFAULT = 1
"""torch CPU threads of every command (one is fastest for these workloads on a shared CPU; bit-identical resumption
needs the same value)."""


def run_dir(value: Path, name: str) -> None:
    """Rule: a path that can be a run directory: not the current one (``""`` or ``.`` would write a run's files into
    it) and not an existing file (:func:`mlpinterp.utils.rundir.check_out_dir`)."""
    from mlpinterp.utils.rundir import check_out_dir

    if str(value).strip() in ("", "."):
        raise invalid(f"{name} must name a directory other than the current one (an empty path or '.' would write "
                      "the run's files into it)", f"pass {name} DIR, e.g. {name} runs/out")
    check_out_dir(value, name)


def existing_device(value: str, name: str) -> None:
    """Rule: a torch device that exists on this machine (:func:`mlpinterp.utils.validation.check_device`; torch is
    imported only for a device other than ``cpu``)."""
    if value == "cpu":
        return
    from mlpinterp.utils.validation import check_device

    try:
        check_device(value, name)
    except ValueError as e:
        raise invalid(str(e), f"pass {name} cpu, or a device this machine has (cuda needs a CUDA build of torch "
                               "and a GPU)") from None


def positive(value: float, name: str) -> None:
    """Rule: a number > 0 (NaN refused)."""
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def out_dir(default: str | None) -> Path:
    """The ``--out`` field of a run directory with ``default`` (``None``: required)."""
    if default is None:
        return option(check=run_dir, metavar="DIR")
    return option(Path(default), check=run_dir, metavar="DIR")


def seeds_field(default: int | None) -> int:
    """The ``--seeds`` field with ``default`` (``None``: the preset's)."""
    return option(default, check=Int(1))


@dataclass(frozen=True, kw_only=True)
class Out:
    """``--out DIR``: the run directory."""

    out: Path = out_dir("runs")
    """Output directory (a run directory: locked while in use; a rerun with the same settings resumes)."""


@dataclass(frozen=True, kw_only=True)
class Seeds:
    """``--seeds N``."""

    seeds: int = seeds_field(3)
    """Number of seeds (0..N-1), each a full run; error bands are mean ± std over them."""


@dataclass(frozen=True, kw_only=True)
class Quick:
    """``--quick``."""

    quick: bool = False
    """Reduced CPU preset (fewer steps, smaller data): a pipeline check in at most 3 minutes on a 2-core CPU, never
    a reproduction."""


@dataclass(frozen=True, kw_only=True)
class Threads:
    """``--threads N``."""

    threads: int = option(THREADS_DEFAULT, check=Int(1))
    """torch CPU threads (1 is fastest on a shared CPU; bit-identical resumption needs the same value)."""


@dataclass(frozen=True, kw_only=True)
class Device:
    """``--device``."""

    device: str = option("cpu", check=existing_device)
    """Where to train: cpu, cuda, cuda:1, ..."""


@dataclass(frozen=True, kw_only=True)
class Quiet:
    """``--quiet``."""

    quiet: bool = False
    """No progress bars."""


def set_threads(threads: int) -> None:
    """Apply ``--threads`` (torch intra-op CPU threads)."""
    import torch

    torch.set_num_threads(threads)
