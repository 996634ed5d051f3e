"""``cli.config_options``: every command built one way, one option per configuration-dataclass field, help from the
field docstring, the dataclass's own validation as an expected CLI failure (exit 1), Click's usage errors exit 2."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
import typer
from typer.testing import CliRunner

from mlpinterp.cli.config_options import CommandConfig, add_command, cli_fields, config_options, option, option_name
from mlpinterp.utils.config_docs import field_docs
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


@dataclass(frozen=True, kw_only=True)
class Shared:
    """Options several commands share."""

    verbose: bool = False
    """Talk."""


@dataclass(frozen=True, kw_only=True)
class Rich(CommandConfig, Shared):
    """Every kind of field."""

    source: Path = option(argument=True)
    """The input file."""
    setting: Literal["a", "b"] = "a"
    """Which setting."""
    sizes: tuple[int, ...] = option((1, 2), greedy=True, metavar="SIZE")
    """Sizes: --sizes 1 2 3."""
    tags: tuple[str, ...] = ()
    """Tags, repeatable."""
    limit: int | None = option(None, check=lambda v, name: None if v >= 0 else (_ for _ in ()).throw(
        ValueError(f"{name} must be >= 0, got {v}")), show_default="none")
    """At most this many."""
    data: Path | None = option(None, aliases=("--data-dir",), metavar="DIR", only_for=("b",))
    """Setting b: where the data is."""
    once: bool = option(False, negatable=False)
    """Run once."""
    internal: dict = option(default_factory=dict, cli=False)
    """Not an option."""


@dataclass(frozen=True)
class Unsupported:
    sizes: dict = dataclasses.field(default_factory=dict)
    """Not a CLI type."""


def _app():
    app = typer.Typer(rich_markup_mode=None)
    seen = {}

    @config_options(cfg=Demo, more=Shared)
    def make(cfg: Demo, more: Shared) -> None:
        seen["cfg"], seen["verbose"] = cfg, more.verbose

    @config_options(Rich)
    def rich(cfg: Rich) -> None:
        seen["rich"] = cfg

    add_command(app, "make", make)
    add_command(app, "rich", rich)
    return app, seen


def test_every_field_is_an_option_with_its_docstring_and_default():
    app, seen = _app()
    help_text = cli_utils.flat(runner.invoke(app, ["make", "--help"], env={"COLUMNS": "300"}).output)
    for flag, doc in (("--n-items", "How many items to make."), ("--scale", "Scale of every item."),
                      ("--name", "What the items are called."), ("--shuffle", "Shuffle the items.")):
        assert flag in help_text and doc in help_text
    assert "--no-shuffle" in help_text and "--verbose" in help_text and "<bool>" not in help_text
    assert runner.invoke(app, ["make"]).exit_code == 0 and seen["cfg"] == Demo() and not seen["verbose"]
    res = runner.invoke(app, ["make", "--n-items", "7", "--scale", "2.5", "--name", "cup", "--shuffle", "--verbose"])
    assert res.exit_code == 0 and seen["cfg"] == Demo(7, 2.5, "cup", True) and seen["verbose"]


def test_argument_choice_optional_sequence_alias_and_flag_fields(tmp_path):
    app, seen = _app()
    res = runner.invoke(app, ["rich", "in.txt"])
    assert res.exit_code == 0, res.output
    assert seen["rich"] == Rich(source=Path("in.txt")) and seen["rich"].sizes == (1, 2) and seen["rich"].limit is None
    res = runner.invoke(app, ["rich", "in.txt", "--setting", "b", "--sizes", "3", "4,5", "--sizes", "6", "--tags",
                              "x", "--tags", "y", "--limit", "0", "--data-dir", str(tmp_path), "--once", "--verbose"])
    assert res.exit_code == 0, res.output
    got = seen["rich"]
    # repeated options first, then the values that followed an option without one of its own (greedy)
    assert got.setting == "b" and got.sizes == (3, 6, 4, 5) and got.tags == ("x", "y") and got.limit == 0
    assert got.data == tmp_path and got.once and got.verbose and got.internal == {}
    help_text = cli_utils.flat(runner.invoke(app, ["rich", "--help"], env={"COLUMNS": "300"}).output)
    assert "--setting <a|b>" in help_text and "--sizes SIZE ..." in help_text and "--data DIR" in help_text
    assert "--data-dir" not in help_text and "--internal" not in help_text and "--no-once" not in help_text
    assert "[default: (none)]" in help_text and "The input file." in help_text


def test_a_value_the_dataclass_refuses_is_an_expected_failure_and_a_bad_parse_a_usage_error():
    app, _ = _app()
    res = runner.invoke(app, ["make", "--n-items", "0"])
    assert res.exit_code == 1 and "Error: n_items must be >= 1, got 0" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["rich", "in", "--limit", "-1"])  # a declared rule names the option
    assert res.exit_code == 1 and "Error: --limit must be >= 0, got -1" in res.output
    res = runner.invoke(app, ["rich", "in", "--data", "d"])  # an option of another setting
    assert res.exit_code == 1 and "--data (applies to --setting b) given with --setting a" in res.output
    assert "Fix: drop those options" in res.output
    for argv in (["make", "--n-items", "x"], ["rich", "in", "--setting", "c"], ["rich", "in", "--sizes", "x"],
                 ["rich", "in", "--nope"], ["rich"]):  # not an int, not a choice, unknown option, missing argument
        assert runner.invoke(app, argv).exit_code == 2, argv


def test_unsupported_fields_and_parameters_that_are_not_configurations_are_refused_at_decoration():
    with pytest.raises(TypeError, match="Unsupported.sizes: config_options supports"):
        config_options(Unsupported)(lambda cfg: None)

    def extra(cfg: Demo, scale: float = 1.0) -> None: ...

    with pytest.raises(TypeError, match=r"parameters \['scale'\] that are not configuration classes"):
        config_options(Demo)(extra)

    @dataclass(frozen=True)
    class Clash:
        name: str = "x"
        """Clashes with Demo.name."""

    with pytest.raises(TypeError, match=r"fields \['name'\] of Clash are also fields"):
        config_options(cfg=Demo, other=Clash)(lambda cfg, other: None)
    with pytest.raises(TypeError, match="not built by config_options"):
        add_command(typer.Typer(), "x", lambda: None)


# ------------------------------------------------------------------------------------------- the mlpinterp CLI
def _commands():
    """``(command path, click command, its callback)`` of every command registered in the mlpinterp app."""
    from mlpinterp.cli.main import app

    root = typer.main.get_command(app)
    ctx = typer.Context(root)
    out = []

    def walk(group, path):
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if hasattr(cmd, "list_commands"):
                walk(cmd, [*path, name])
            else:
                out.append((" ".join([*path, name]), cmd, cmd.callback))

    walk(root, [])
    return out


def test_every_registered_command_is_built_from_configuration_fields():
    """Every option and argument of every command comes from a field of a configuration dataclass, and its help is
    that field's docstring (a hidden old spelling aside)."""
    commands = _commands()
    names = {c for c, _, _ in commands}
    assert names == {"approx", "train", "train-lm", "reproduce polynomial", "reproduce transformer",
                     "reproduce apd", "reproduce spd", "reproduce mfr", "reproduce three-spaces", "sae train",
                     "sae eval", "apd train-target", "spd train-target"}, names
    for name, cmd, callback in commands:
        built = getattr(callback, "__cli_params__", None)
        assert built is not None, f"{name} is not built by config_options"
        for param in cmd.params:
            assert param.name in built, f"{name}: {param.opts} does not come from a configuration field"
            cls, field_name = built[param.name]
            f = next(f for f in dataclasses.fields(cls) if f.name == field_name)
            assert f in cli_fields(cls)
            doc = field_docs(cls).get(field_name)
            assert doc, f"{name}: {cls.__name__}.{field_name} has no docstring"
            if getattr(param, "hidden", False):
                assert param.help == f"Old spelling of {option_name(f)}."
            elif param.param_type_name == "option":
                assert param.help == doc, (name, param.opts)
                assert option_name(f) in param.opts
            else:  # a positional argument: typer keeps its help beside the click parameter
                assert f.metadata["cli"].get("argument")


def test_help_text_is_the_field_docstring():
    from mlpinterp.cli.mfr import MfrCommand
    from mlpinterp.cli.options import Threads
    from mlpinterp.cli.sae import SaeTrainCommand
    from mlpinterp.cli.spd import SpdRepro
    from mlpinterp.lm.train_config import LmTrainConfig
    from mlpinterp.studies.polynomial.settings import PolynomialReproConfig

    cases = [(["reproduce", "polynomial"], PolynomialReproConfig, "covariance"),
             (["reproduce", "polynomial"], PolynomialReproConfig, "smoke"),
             (["train-lm"], LmTrainConfig, "vocab_size"), (["sae", "train"], SaeTrainCommand, "normalize_activations"),
             (["reproduce", "spd"], SpdRepro, "compile"), (["reproduce", "mfr"], MfrCommand, "data"),
             (["reproduce", "apd"], Threads, "threads")]
    from mlpinterp.cli.main import app

    for argv, cls, field_name in cases:
        text = cli_utils.flat(runner.invoke(app, [*argv, "--help"], env={"COLUMNS": "250"}).output)
        doc = field_docs(cls)[field_name]
        assert " ".join(doc.split()) in text, (argv, field_name)
    assert field_docs(PolynomialReproConfig)["smoke"].startswith("Tiny configuration")
    quick = cli_utils.flat(runner.invoke(app, ["reproduce", "polynomial", "--help"], env={"COLUMNS": "250"}).output)
    assert "--quick / --no-quick Tiny configuration" in quick and "--smoke" not in quick


def test_shared_options_have_one_name_everywhere():
    """--out, --seeds, --quick, --threads, --device and --quiet: the same spelling wherever a command takes them,
    and no command spells a sibling of them (--seed counts which seed, not how many)."""
    seen: dict[str, set[str]] = {}
    for name, cmd, _ in _commands():
        for p in cmd.params:
            for opt in p.opts:
                seen.setdefault(opt, set()).add(name)
    for opt in ("--out", "--quick", "--threads", "--quiet"):
        assert opt in seen
    assert not {"--smoke", "--text", "--text-dir", "--data-path", "--output", "--n-threads"} & {
        o for name, cmd, _ in _commands() for p in cmd.params if not getattr(p, "hidden", False) for o in p.opts}
    assert "--seeds" in {o for _, cmd, _ in _commands() if cmd.name == "apd" for p in cmd.params for o in p.opts}


def test_version_and_no_usage_error_raised_by_command_code():
    from mlpinterp import __version__
    from mlpinterp.cli.main import app

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"mlpinterp {__version__}"
    import mlpinterp.cli as cli_pkg

    for path in Path(cli_pkg.__file__).parent.glob("*.py"):
        if path.name == "config_options.py":  # the one place: an item of a repeatable option that does not parse
            continue
        assert "BadParameter(" not in path.read_text(), f"{path.name} raises a usage error for a bad value (exit 2)"


def test_option_metadata_is_checked():
    with pytest.raises(TypeError, match="unknown CLI metadata"):
        option(1, flags="--x")
    assert inspect.signature(option).parameters["check"].default is None


def test_cli_messages_speak_cli(tmp_path):
    """An option combination the library refuses in its own words (``penalty=True``) is named by the options."""
    from mlpinterp.cli.main import app

    res = runner.invoke(app, ["sae", "train", "--mfr", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and "Error: --mfr needs --n-saes >= 2" in res.output and "=True" not in res.output
    assert not (tmp_path / "o").exists()


def test_choices_are_the_studies_own_lists():
    """A setting offered as a choice is exactly the study's list of settings (one source of names)."""
    import typing

    from mlpinterp.cli import apd, approx, paramspace, polynomial, spd, three_spaces, transformer
    from mlpinterp.models.config import ACTIVATION_NAMES, ARCHS
    from mlpinterp.studies.apd.settings import SETTINGS as APD
    from mlpinterp.studies.polynomial.settings import DATASET_DEFAULTS, PolynomialReproConfig
    from mlpinterp.studies.spd.settings import RECIPES
    from mlpinterp.studies.spd.settings import SETTINGS as SPD
    from mlpinterp.studies.three_spaces.settings import SETTINGS as THREE
    from mlpinterp.studies.transformer.settings import INPUT_MODELS
    from mlpinterp.toys.settings import FIDELITIES

    def choices(cls, name):
        hint = typing.get_type_hints(cls)[name]
        for _ in range(3):  # X | None, tuple[X, ...]
            args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
            if typing.get_origin(hint) is typing.Literal:
                return typing.get_args(hint)
            hint = args[0]
        raise AssertionError(hint)

    assert choices(apd.ApdRepro, "setting") == choices(apd.ApdTarget, "setting") == APD
    assert choices(spd.SpdRepro, "setting") == choices(spd.SpdTarget, "setting") == SPD
    assert choices(three_spaces.ThreeSpacesCommand, "setting") == THREE
    assert choices(transformer.TransformerCommand, "input_model") == INPUT_MODELS
    assert set(choices(spd.SpdRepro, "recipe")) == set(RECIPES)
    assert choices(apd.ApdRepro, "fidelity") == typing.get_args(paramspace.Fidelity) == FIDELITIES
    datasets = tuple(DATASET_DEFAULTS)
    assert choices(polynomial.TrainCommand, "dataset") == choices(PolynomialReproConfig, "dataset") == datasets
    assert typing.get_args(approx.Dataset) == datasets
    assert choices(polynomial.TrainCommand, "arch") == choices(PolynomialReproConfig, "arch") == ARCHS
    assert choices(polynomial.TrainCommand, "activation") == choices(PolynomialReproConfig, "activation") == \
        ACTIVATION_NAMES


# ------------------------------------------------------------------------ library names -> the flags on the CLI


def test_in_flags_spells_the_field_names_a_message_is_about_as_flags():
    from mlpinterp.cli.errors import in_flags

    flags = {"seeds": "--seeds", "text": "--text", "out": "--out", "text_dir": "--data", "dataset": "--dataset",
             "lr": "--lr"}
    assert in_flags("seeds must be >= 1, got 0", flags) == ("--seeds must be >= 1, got 0", ["--seeds"])
    assert in_flags("text_dir applies to minilm", flags) == ("--data applies to minilm", ["--data"])
    assert in_flags("option 'seeds' and `lr` clash", flags)[0] == "option --seeds and --lr clash"
    assert in_flags("text is not used with dataset='digits'", flags)[0] == "--text is not used with --dataset 'digits'"
    assert in_flags("pass its settings (lr=0.01, seeds=3)", flags)[0] == "pass its settings (--lr 0.01, --seeds 3)"
    assert in_flags("lr=9 is too large; use lr <= 1", flags)[0] == "--lr 9 is too large; use --lr <= 1"
    assert in_flags("seeds 9 exceed the 4 models", flags)[0] == "--seeds 9 exceed the 4 models"
    # another word, a longer name, a word in prose, part of a name, listed values: left alone
    for same in ("text files not found: ['a']", "out_dir 'x' holds run.json", "seedsless must be", "the seeds are 3",
                 "a-lr=3", "one of ('text', 'seeds'), got ['lr']"):
        assert in_flags(same, flags) == (same, []), same
    assert in_flags("seeds must be >= 1", {}) == ("seeds must be >= 1", [])


def test_a_fix_given_by_the_caller_or_the_error_wins_over_the_generic_flag_fix(capsys):
    import pytest
    import typer

    from mlpinterp.cli import errors

    def printed(e, fix=None):
        token, token_fix = errors._COMMAND_FLAGS.set({"seeds": "--seeds"}), errors._COMMAND_FIX.set("see --help")
        try:
            with pytest.raises(typer.Exit):
                errors.report(e, fix)
        finally:
            errors._COMMAND_FLAGS.reset(token)
            errors._COMMAND_FIX.reset(token_fix)
        return capsys.readouterr().err

    assert "Fix: change or drop --seeds (see --help)" in printed(ValueError("seeds must be >= 1"))
    assert "Fix: pass three seeds" in printed(ValueError("seeds must be >= 1"), "pass three seeds")
    own = ValueError("seeds must be >= 1")
    own.fix = "use seeds=3"
    out = printed(own, "pass three seeds")
    assert "Error: --seeds must be >= 1" in out and "Fix: use --seeds 3" in out


@pytest.mark.parametrize("argv, error, fix", [
    (["reproduce", "polynomial", "--quick", "--seeds", "0"], "Error: --seeds must be >= 1, got 0",
     "Fix: change or drop --seeds (see `mlpinterp reproduce polynomial --help`)"),
    (["reproduce", "polynomial", "--quick", "--steps", "3"], "Error: --steps must be >= 16", "drop --steps"),
    (["reproduce", "polynomial", "--quick", "--data", "X"],
     "Error: --data is not used with --dataset 'digits' (bundled with scikit-learn), got 'X'",
     "Fix: leave --data unset, or choose --dataset 'mnist' or 'fashion-mnist'"),
    (["train", "--data", "X"], "Error: --data is not used with --dataset 'digits'", "Fix: leave --data unset"),
    (["train", "--lr", "-1"], "Error: --lr must be", "Fix: change or drop --lr (see `mlpinterp train --help`)"),
    (["reproduce", "three-spaces", "--setting", "tms-5-2", "--layer", "2"], "Error: --layer applies to the "
     "transformer settings", "Fix: change or drop --layer (see `mlpinterp reproduce three-spaces --help`)"),
    (["reproduce", "three-spaces", "--setting", "minilm", "--seeds", "0"], "Error: --seeds must be >= 1", "--help"),
], ids=lambda a: " ".join(a[:3]) if isinstance(a, list) else None)
def test_cli_errors_name_the_flag_the_user_typed(tmp_path, argv, error, fix):
    """A value the library refuses naming its Python argument (``seeds``, ``data_path``, ``layer``) is reported
    with the option the user typed (``--seeds``, ``--data``, ``--layer``), and its Fix names it and ``--help``."""
    from mlpinterp.cli.main import app

    out = tmp_path / "run"
    res = runner.invoke(app, [*argv, "--quiet", "--out", str(out)])
    text = cli_utils.flat(res.output)
    assert res.exit_code == 1 and "Traceback" not in res.output, text
    assert error in text and fix in text, text
    assert not out.exists()


def test_the_python_api_keeps_naming_its_arguments():
    from mlpinterp.data import load_dataset
    from mlpinterp.studies.polynomial.settings import PolynomialReproConfig

    with pytest.raises(ValueError, match="^seeds must be >= 1"):
        PolynomialReproConfig(seeds=0)
    with pytest.raises(ValueError, match="^data_path is not used with dataset='digits'"):
        PolynomialReproConfig(data_path="X")
    with pytest.raises(ValueError, match="^path is not used with name='digits'"):
        load_dataset("digits", "X")
