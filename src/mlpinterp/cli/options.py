"""The options every command shares, declared once: the same flag, bounds, default and help everywhere.

A command declares ``out: Out``, ``seeds: Seeds = 3``, ``quick: Quick = False``, ``threads: Threads = 1``,
``device: Device = "cpu"``, ``quiet: Quiet = False`` (``Annotated`` types), and gets options of one spelling across the
CLI. :func:`only_for` refuses an option that applies to other settings than the one chosen; :func:`flag` and
:func:`many` give Typer options whose ``--help`` shows a flag as a flag and a list as ``VALUE ...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mlpinterp.cli.errors import fail

THREADS_DEFAULT = 1
"""torch CPU threads of every command (one is fastest for these workloads on a shared CPU; bit-identical resumption
needs the same value)."""


def flag(*decls: str, help: str, default: bool | None = None, hidden: bool = False) -> Any:  # noqa: A002
    """A boolean ``typer.Option`` shown as a flag (no ``<bool>`` metavar in ``--help``). With ``default`` it is the
    parameter's default (``tied: bool = flag("--tied/--no-tied", default=False, help=...)``); without, the option
    of an ``Annotated`` type."""
    if default is None:
        return typer.Option(*decls, help=help, metavar="", hidden=hidden)
    return typer.Option(default, *decls, help=help, metavar="", hidden=hidden)


def many(default: list, *decls: str, help: str, metavar: str = "VALUE", **kw) -> Any:  # noqa: A002
    """A repeatable ``typer.Option`` with ``default`` (``--k 6 --k 12``; commands may also accept ``--k 6 12``) shown
    as ``VALUE ...`` in ``--help``."""
    return typer.Option(default, *decls, help=help, metavar=f"{metavar} ...", **kw)


def _non_empty(value: Path | None) -> Path | None:
    if value is not None and str(value).strip() in ("", "."):
        raise typer.BadParameter("must name a directory other than the current one (an empty path or '.' would "
                                 "write the run's files into it)")
    return value


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:  # also NaN
        raise typer.BadParameter(f"must be > 0, got {value}")
    return value


def _device(value: str | None) -> str | None:
    """``--device``: a torch device that exists on this machine (:func:`mlpinterp.utils.validation.check_device`), else
    an ``Error:``/``Fix:`` exit before any work."""
    from mlpinterp.utils.validation import check_device

    if value is not None:
        try:
            check_device(value, "--device")
        except ValueError as e:
            fail(str(e), "pass --device cpu, or a device this machine has (cuda needs a CUDA build of torch and a GPU)")
    return value


Out = Annotated[Path, typer.Option("--out", callback=_non_empty, metavar="DIR",
                                   help="Output directory (a run directory: locked while in use; a rerun with the "
                                        "same settings resumes).")]
Seeds = Annotated[int, typer.Option("--seeds", min=1, help="Number of seeds.")]
Quick = Annotated[bool, flag("--quick/--no-quick", help="Reduced CPU preset (fewer steps, smaller data): a pipeline "
                                                         "check in at most 3 minutes on a 2-core CPU, never a "
                                                         "reproduction.")]
Quiet = Annotated[bool, flag("--quiet/--no-quiet", help="No progress bars.")]
Device = Annotated[str, typer.Option("--device", callback=_device, help="Where to train: cpu, cuda, cuda:1, ...")]
Threads = Annotated[int, typer.Option("--threads", min=1, help="torch CPU threads (1 is fastest on a shared CPU; "
                                                                 "bit-identical resumption needs the same value).")]
Steps = Annotated[int | None, typer.Option("--steps", min=1, help="Override the preset's number of steps.",
                                           show_default="the preset's")]
Lr = Annotated[float | None, typer.Option("--lr", callback=_positive, help="Override the preset's peak learning rate "
                                                                         "(> 0).", show_default="the preset's")]


def set_threads(threads: int) -> None:
    """Apply ``--threads`` (torch intra-op CPU threads)."""
    import torch

    torch.set_num_threads(threads)


def only_for(setting: str, given: dict[str, tuple[object, tuple[str, ...]]]) -> None:
    """Refuse options set for another setting: ``given`` maps each option (``"--data"``) to ``(value, settings it
    applies to)``; an option whose value is not ``None`` while ``setting`` is not among them is an
    ``Error:``/``Fix:`` exit."""
    wrong = [(opt, where) for opt, (value, where) in given.items() if value is not None and setting not in where]
    if wrong:
        opts = ", ".join(f"{opt} (applies to --setting {' | '.join(where)})" for opt, where in wrong)
        fail(f"{opts} given with --setting {setting}", "drop those options or choose the setting they apply to")
