"""Entry point of the ``mlpinterp`` command.

Sub-commands live one concept per module (``polynomial.py``, ``apd.py``, ``sae.py``, ``lm.py``); each exposes
``register(app, reproduce_app)``.
"""

from __future__ import annotations

from mlpinterp.utils.malloc import enable_transparent_huge_pages

enable_transparent_huge_pages()  # before torch's first allocation (mlpinterp.utils.malloc)

import typer  # noqa: E402

from mlpinterp.cli import apd as _apd  # noqa: E402
from mlpinterp.cli import approx as _approx  # noqa: E402
from mlpinterp.cli import lm as _lm  # noqa: E402
from mlpinterp.cli import mfr as _mfr  # noqa: E402
from mlpinterp.cli import polynomial as _polynomial  # noqa: E402
from mlpinterp.cli import sae as _sae  # noqa: E402
from mlpinterp.cli import spd as _spd  # noqa: E402
from mlpinterp.cli import three_spaces as _three_spaces  # noqa: E402
from mlpinterp.cli import transformer as _transformer  # noqa: E402
from mlpinterp.cli.errors import guarded  # noqa: E402

app = typer.Typer(
    name="mlpinterp",
    rich_markup_mode=None,  # help texts are field docstrings, printed as written ("[d_in]" is not markup)
    help="Decompose trained feedforward networks: polynomial approximants, APD, SPD, and MFR sparse autoencoders.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
reproduce_app = typer.Typer(rich_markup_mode=None, help="Reproduce a paper end to end (train, decompose, figures, report).", no_args_is_help=True)
app.add_typer(reproduce_app, name="reproduce")



def _version(value: bool) -> None:
    if value:
        from mlpinterp import __version__

        typer.echo(f"mlpinterp {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, metavar="",
                                       help="Print the version and exit.")) -> None:
    """Decompose trained feedforward networks: polynomial approximants, APD, SPD, and MFR sparse autoencoders."""


for _module in (_approx, _polynomial, _apd, _spd, _mfr, _sae, _transformer, _lm, _three_spaces):
    _module.register(app, reproduce_app)


def _guard_all(typer_app: typer.Typer, prefix: str = "") -> None:
    """Register every command through :func:`mlpinterp.cli.errors.guarded` (expected failures as Error/Fix)."""
    for info in typer_app.registered_commands:
        name = f"{prefix}{info.name or info.callback.__name__.replace('_', '-')}"
        info.callback = guarded(info.callback, name)
    for group in typer_app.registered_groups:
        _guard_all(group.typer_instance, f"{prefix}{group.name} ")


_guard_all(app)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
