"""CLI options generated from configuration dataclasses: the one way every ``mlpinterp`` command is built.

Each field of a command's configuration dataclass is one option ``--field-name`` (or the positional argument it
declares): its help is the field's docstring (:func:`mlpinterp.utils.config_docs.field_docs`), its default the
field's default, its type the field's type, so ``--help`` and the code cannot drift apart and a new field is a new
option without further edits. Validation stays in the dataclass (its ``__post_init__``): a value it refuses is an
expected CLI failure (``Error: ... / Fix: ...``, exit 1); only a value that does not parse as the option's type is
Click's usage error (exit 2).

Usage::

    @config_options(cfg=PolynomialReproConfig, run=RunOptions)
    def reproduce_polynomial(cfg: PolynomialReproConfig, run: RunOptions) -> None: ...

    add_command(reproduce_app, "polynomial", reproduce_polynomial)

Field types: ``bool`` (a flag ``--x/--no-x``, no metavar), ``int``, ``float``, ``str``, ``Path``, ``Literal[...]`` and
``Enum`` (choices), ``X | None`` (an option whose absence is ``None``), ``tuple[X, ...]``/``list[X]`` (repeatable:
``--k 6 --k 12``, also ``--k 6,12``; with ``greedy`` also ``--k 6 12``). Per-field CLI metadata (:func:`option`, or
``dataclasses.field(metadata={"cli": {...}})`` in a module that must not import the CLI): ``flag`` (another option
name), ``aliases`` (hidden old spellings), ``metavar``, ``argument`` (positional), ``hidden``, ``show_default``,
``greedy``, ``only_for`` (settings the option applies to, checked by :class:`CommandConfig`), ``negatable=False`` (a
flag without ``--no-x``) and ``cli=False`` (a field the CLI does not set).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from mlpinterp.utils.config_docs import field_default, field_docs

CLI = "cli"
"""Key of a field's CLI metadata in ``dataclasses.field(metadata=...)``."""

CHECK = "check"
"""Key of a field's validation rule (a :mod:`mlpinterp.utils.validation` rule such as ``Int(1)``, or any callable
``rule(value, name)`` that raises) in ``dataclasses.field(metadata=...)``; run by :class:`CommandConfig`."""

_SCALARS = (bool, int, float, str, Path)
_GREEDY_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": False}


def option(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, check=None,
           **cli: Any) -> Any:
    """A dataclass field with CLI metadata ``cli`` (the keys of the module docstring) and a validation rule ``check``
    (named by the option in its message, run by :class:`CommandConfig`)."""
    unknown = set(cli) - {"flag", "aliases", "metavar", "argument", "hidden", "show_default", "greedy", "only_for",
                          "cli", "negatable"}
    if unknown:
        raise TypeError(f"option() got unknown CLI metadata {sorted(unknown)}")
    meta: dict[str, Any] = {CLI: cli}
    if check is not None:
        meta[CHECK] = check
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def cli_meta(f: dataclasses.Field) -> dict:
    """The CLI metadata of field ``f`` (``{}`` when it has none)."""
    return dict(f.metadata.get(CLI, {}))


def option_name(f: dataclasses.Field) -> str:
    """``--field-name`` of field ``f``, or the ``flag`` its metadata names (a positional one: ``FIELD_NAME``)."""
    meta = cli_meta(f)
    if meta.get("argument"):
        return meta.get("metavar") or f.name.upper()
    return meta.get("flag") or "--" + f.name.replace("_", "-")


def cli_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of dataclass ``cls`` the CLI sets (those without ``cli=False``), in ``--help`` order: the ones
    ``cls`` declares itself first, then those of its bases, nearest base first, each class's in declaration order
    (a command's own options before the shared ones)."""
    order: dict[str, tuple[int, int]] = {}
    for depth, base in enumerate(cls.__mro__):
        for i, name in enumerate(base.__dict__.get("__annotations__", {})):
            order.setdefault(name, (depth, i))
    fs = [f for f in dataclasses.fields(cls) if cli_meta(f).get("cli", True)]
    return sorted(fs, key=lambda f: order.get(f.name, (len(cls.__mro__), 0)))


def _unwrap(hint) -> tuple[Any, bool]:
    """``(type, optional)`` of a field's type hint (``X | None`` -> ``(X, True)``)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def _sequence_item(typ) -> Any | None:
    """The item type of ``tuple[X, ...]`` / ``list[X]``, else ``None``."""
    origin = typing.get_origin(typ)
    if origin is list:
        return typing.get_args(typ)[0]
    if origin is tuple:
        args = typing.get_args(typ)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
    return None


def _is_choice(typ) -> bool:
    return typing.get_origin(typ) is Literal or (isinstance(typ, type) and issubclass(typ, enum.Enum))


def _parse_item(text: str, item, flag: str):
    """One item of a repeatable option, parsed as ``item`` (a usage error, exit 2, when it does not parse)."""
    try:
        if typing.get_origin(item) is Literal:
            if text not in typing.get_args(item):
                raise ValueError(f"one of {', '.join(map(str, typing.get_args(item)))}")
            return text
        if isinstance(item, type) and issubclass(item, enum.Enum):
            return item(text)
        return item(text)
    except ValueError as e:
        want = str(e) if typing.get_origin(item) is Literal else getattr(item, "__name__", str(item))
        raise typer.BadParameter(f"{text!r} is not a valid {want}", param_hint=f"'{flag}'") from None


def _parse_items(tokens, item, flag: str) -> list:
    """``["6", "12,18"]`` -> ``[6, 12, 18]`` (commas separate items too)."""
    return [_parse_item(part, item, flag) for tok in tokens for part in str(tok).split(",") if part != ""]


@dataclasses.dataclass(frozen=True)
class _Param:
    """One generated command parameter: the field it sets (``alias_of``: a hidden old spelling of it)."""

    cls: type
    field: dataclasses.Field
    item: Any = None
    alias_of: str | None = None


def _typer_params(cls: type, show_defaults: dict) -> tuple[list[inspect.Parameter], dict[str, _Param]]:
    """The typer parameters of ``cls``'s CLI fields, and what each sets."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls, include_extras=False)
    params, sets = [], {}
    for f in cli_fields(cls):
        meta = cli_meta(f)
        typ, optional = _unwrap(hints[f.name])
        item = _sequence_item(typ)
        if item is None and not (typ in _SCALARS or _is_choice(typ)):
            raise TypeError(f"{cls.__name__}.{f.name}: config_options supports bool, int, float, str, Path, Literal, "
                            f"Enum, X | None and tuple[X, ...] fields, got {hints[f.name]}")
        try:
            default = field_default(cls, f.name)
        except KeyError:
            default = ...
        flag = option_name(f)
        kw: dict[str, Any] = {"help": docs.get(f.name, ""), "hidden": bool(meta.get("hidden"))}
        if "show_default" in meta or f.name in show_defaults:
            kw["show_default"] = show_defaults.get(f.name, meta.get("show_default"))
        if meta.get("metavar") is not None:
            kw["metavar"] = meta["metavar"]
        if item is not None:
            annotation = list[str] | None if optional else list[str]
            default = None if default is None else ([str(getattr(v, "value", v)) for v in default]
                                                    if default is not ... else ...)
            kw["metavar"] = f"{meta.get('metavar', 'VALUE')} ..."
            if "show_default" not in kw and default not in (None, ...):
                kw["show_default"] = " ".join(default)
        elif typ is bool:
            annotation = bool | None if optional else bool
            kw["metavar"] = ""
        else:
            annotation = typ | None if optional or default is None else typ
        if meta.get("argument"):
            kw.pop("hidden")
            info = typer.Argument(**kw)
        else:
            decls = (f"{flag}/--no-{flag[2:]}",) if typ is bool and meta.get("negatable", True) else (flag,)
            info = typer.Option(*decls, **kw)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=Annotated[annotation, info]))
        sets[f.name] = _Param(cls, f, item)
        for i, alias in enumerate(meta.get("aliases", ())):
            name = f"{f.name}__alias{i}"
            alias_kw = {"help": f"Old spelling of {flag}.", "hidden": True}
            if typ is bool:
                alias_kw["metavar"] = ""
            params.append(inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None,
                annotation=Annotated[(list[str] if item is not None else typ) | None, typer.Option(alias, **alias_kw)]))
            sets[name] = _Param(cls, f, item, alias_of=f.name)
    return params, sets


def config_options(cls: type | None = None, *, param: str = "cfg", show_defaults: dict | None = None,
                   **classes: type):
    """Decorator: the command's dataclass parameters (``param`` for ``cls``; or one per keyword, ``run=RunOptions``)
    are replaced by one option per CLI field of each class (:func:`cli_fields`), and the command receives the
    instances built from them. ``show_defaults`` overrides the default shown in ``--help`` per field name (e.g. a
    default that depends on another option).

    Raises ``TypeError`` at decoration for an unsupported field type, a field name two classes share, or a
    command parameter that is not one of the classes."""
    if cls is not None:
        classes = {param: cls, **classes}
    if not classes:
        raise TypeError("config_options needs at least one configuration dataclass")
    for name, c in classes.items():
        if not (isinstance(c, type) and dataclasses.is_dataclass(c)):
            raise TypeError(f"config_options: {name}={c!r} is not a dataclass")

    def decorate(fn):
        sig = inspect.signature(fn)
        extra = [n for n in sig.parameters if n not in classes]
        if extra:
            raise TypeError(f"{fn.__name__} has parameters {extra} that are not configuration classes; every "
                            "option of a command comes from a configuration field")
        params: list[inspect.Parameter] = []
        sets: dict[str, _Param] = {}
        for c in classes.values():
            p, s = _typer_params(c, show_defaults or {})
            clash = set(s) & set(sets)
            if clash:
                raise TypeError(f"{fn.__name__}: fields {sorted(clash)} of {c.__name__} are also fields of another "
                                "configuration class of the command")
            params += p
            sets.update(s)
        greedy = [n for n, s in sets.items() if s.alias_of is None and cli_meta(s.field).get("greedy")]
        if len(greedy) > 1:
            raise TypeError(f"{fn.__name__}: at most one greedy option, got {greedy}")
        if greedy:
            params.insert(0, inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))

        @functools.wraps(fn)
        def command(**kwargs):
            ctx = kwargs.pop("ctx", None)
            values: dict[type, dict[str, Any]] = {c: {} for c in classes.values()}
            for name, s in sets.items():
                if s.alias_of is None:
                    values[s.cls][s.field.name] = kwargs.pop(name)
            for name, s in sets.items():  # a hidden old spelling counts when the option itself is left at its default
                given = kwargs.pop(name, None)
                if s.alias_of is not None and given not in (None, []):
                    values[s.cls][s.field.name] = given
            if greedy:
                s = sets[greedy[0]]
                more = list(ctx.args) if ctx is not None else []
                if more:
                    values[s.cls][s.field.name] = [*(values[s.cls][s.field.name] or []), *more]
            for vals in values.values():
                for name, v in vals.items():
                    s = sets[name]
                    if s.item is not None and v is not None:
                        vals[name] = tuple(_parse_items(v, s.item, option_name(s.field)))
            built = {}
            for pname, c in classes.items():
                built[pname] = build_config(c, values[c])
            return fn(**built)

        command.__signature__ = sig.replace(parameters=params)
        command.__cli_params__ = {n: (s.cls, s.field.name) for n, s in sets.items()}
        command.__cli_flags__ = cli_flags(s.field for s in sets.values() if s.alias_of is None)
        command.__cli_context_settings__ = _GREEDY_SETTINGS if greedy else None
        return command

    return decorate


def cli_flags(fields) -> dict[str, str]:
    """Python name -> flag of each field in ``fields``: its own name and the Python spelling of each old option
    name (``--text-dir`` -> ``text_dir``), for :func:`mlpinterp.cli.errors.in_flags` (a library message names the
    argument; the command line names the flag)."""
    out: dict[str, str] = {}
    for f in fields:
        meta = cli_meta(f)
        if meta.get("argument"):
            continue
        for name in (f.name, *(a.lstrip("-").replace("-", "_") for a in meta.get("aliases", ()))):
            out.setdefault(name, option_name(f))
    return out


def build_config(cls: type, values: dict):
    """``cls(**values)``; a value the dataclass refuses (``ValueError``/``TypeError`` from its validation) is an
    expected CLI failure: ``Error: <its message, field names as flags>``, ``Fix: <its fix, or one naming the flag,
    or the command's --help>``, exit 1 (:func:`mlpinterp.cli.errors.report`)."""
    from mlpinterp.cli.errors import report, want_traceback

    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        if want_traceback():
            raise
        report(e)


def add_command(typer_app: typer.Typer, name: str, fn) -> None:
    """Register ``fn`` (built by :func:`config_options`) as command ``name`` of ``typer_app`` (with the context
    settings a greedy option needs)."""
    if not hasattr(fn, "__cli_params__"):
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} is not built by config_options")
    settings = fn.__cli_context_settings__
    typer_app.command(name, **({"context_settings": settings} if settings else {}))(fn)


def invalid(message: str, fix: str | None = None) -> ValueError:
    """A ``ValueError`` carrying a ``fix`` (printed as ``Fix:``), for a configuration's ``__post_init__``."""
    err = ValueError(message)
    if fix:
        err.fix = fix
    return err


@dataclasses.dataclass(frozen=True, kw_only=True)
class CommandConfig:
    """Base of the CLI's command configurations: on construction each field's declared rule (``check``) runs with
    the option's name in its message (``--seeds must be >= 1, got 0``), then the ``only_for`` metadata is checked
    against the ``setting`` field, then :meth:`validate` (checks across fields). Raises ``ValueError``/``TypeError``."""

    def __post_init__(self) -> None:
        fs = dataclasses.fields(self)
        for f in fs:
            rule, value = f.metadata.get(CHECK), getattr(self, f.name)
            if rule is not None and value is not None:
                rule(value, option_name(f))
        setting = getattr(self, "setting", None)
        setting = getattr(setting, "value", setting)
        wrong = [(option_name(f), cli_meta(f)["only_for"]) for f in fs if cli_meta(f).get("only_for")
                 and getattr(self, f.name) not in (None, False, ()) and setting not in cli_meta(f)["only_for"]]
        if wrong:
            opts = ", ".join(f"{opt} (applies to --setting {' | '.join(where)})" for opt, where in wrong)
            raise invalid(f"{opts} given with --setting {setting}",
                          "drop those options or choose the setting they apply to")
        self.validate()

    def validate(self) -> None:
        """Checks across fields; raise ``ValueError`` (:func:`invalid` for one with a fix)."""

