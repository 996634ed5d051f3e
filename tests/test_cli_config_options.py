"""``cli.config_options``: one CLI option per dataclass field, help from the field docstring, the dataclass's own
validation as an expected CLI failure."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import typer
from typer.testing import CliRunner

from mlpinterp.cli.config_options import config_options
from tests import cli_utils

runner = CliRunner()


@dataclass(frozen=True)
class Demo:
    """A configuration."""

    n_items: int = 3
    """How many items to make."""
    scale: float = 0.5
    """Scale of every item."""
    name: str = "box"
    """What the items are called."""
    shuffle: bool = False
    """Shuffle the items."""

    def __post_init__(self) -> None:
        if self.n_items < 1:
            raise ValueError(f"n_items must be >= 1, got {self.n_items}")


@dataclass(frozen=True)
class Unsupported:
    sizes: tuple[int, ...] = (1, 2)
    """Not a scalar."""


def _app():
    app = typer.Typer()
    seen = {}

    @app.command()
    @config_options(Demo)
    def make(cfg: Demo, verbose: bool = typer.Option(False, help="Talk.")) -> None:
        seen["cfg"], seen["verbose"] = cfg, verbose

    return app, seen


def test_every_field_is_an_option_with_its_docstring_and_default():
    app, seen = _app()
    help_text = cli_utils.flat(runner.invoke(app, ["--help"], env={"COLUMNS": "300"}).output)
    for flag, doc in (("--n-items", "How many items to make."), ("--scale", "Scale of every item."),
                      ("--name", "What the items are called."), ("--shuffle", "Shuffle the items.")):
        assert flag in help_text and doc in help_text
    assert "--no-shuffle" in help_text and "--verbose" in help_text
    assert runner.invoke(app, []).exit_code == 0 and seen["cfg"] == Demo() and not seen["verbose"]
    res = runner.invoke(app, ["--n-items", "7", "--scale", "2.5", "--name", "cup", "--shuffle", "--verbose"])
    assert res.exit_code == 0 and seen["cfg"] == Demo(7, 2.5, "cup", True) and seen["verbose"]


def test_a_value_the_dataclass_refuses_is_an_expected_failure():
    app, _ = _app()
    res = runner.invoke(app, ["--n-items", "0"])
    assert res.exit_code == 1 and "Error: n_items must be >= 1, got 0" in res.output and "Traceback" not in res.output
    assert runner.invoke(app, ["--n-items", "x"]).exit_code == 2  # not an int: typer's usage error


def test_unsupported_fields_and_clashing_parameters_are_refused_at_decoration():
    with pytest.raises(TypeError, match="Unsupported.sizes: config_options supports"):
        config_options(Unsupported)(lambda cfg: None)

    def clash(cfg: Demo, scale: float = 1.0) -> None: ...

    with pytest.raises(TypeError, match=r"parameters \['scale'\] that are also fields of Demo"):
        config_options(Demo)(clash)
