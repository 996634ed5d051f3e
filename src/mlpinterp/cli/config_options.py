"""CLI options generated from a configuration dataclass: one ``--field-name`` option per field, its help the field's
docstring and its default the field's default (:mod:`mlpinterp.utils.config_docs`), so ``--help`` and the code
cannot drift apart and a new field is a new option without further edits.

Usage::

    @app.command("train-lm")
    @config_options(LmTrainConfig)
    def train_lm(cfg: LmTrainConfig, out: Path = typer.Option(...)) -> None: ...

The command receives ``cfg``, built from the options; a field value the dataclass refuses (its ``__post_init__``
raises ``ValueError``/``TypeError``) is an expected CLI failure (``Error: ... / Fix: ...``, exit 1).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from typing import Annotated

import typer

from mlpinterp.cli.errors import fail
from mlpinterp.utils.config_docs import field_default, field_docs

_SCALARS = (bool, int, float, str)


def config_options(cls: type, *, param: str = "cfg"):
    """Decorator: the command's ``param`` argument is replaced by one option per field of dataclass ``cls``
    (``bool``, ``int``, ``float`` or ``str`` fields; ``bool`` ones as ``--x/--no-x``). Raises ``TypeError`` at
    decoration for a field of another type or a field without a default."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]

    def decorate(fn):
        sig = inspect.signature(fn)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for n, p in sig.parameters.items() if n != param]
        generated = []
        for name in fields:
            typ = hints[name]
            if typ not in _SCALARS:
                raise TypeError(f"{cls.__name__}.{name}: config_options supports {[t.__name__ for t in _SCALARS]} "
                                f"fields, got {typ}")
            flag = "--" + name.replace("_", "-")
            decls = (f"{flag}/--no-{flag[2:]}",) if typ is bool else (flag,)
            generated.append(inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=field_default(cls, name),
                annotation=Annotated[typ, typer.Option(*decls, help=docs.get(name, ""))]))
        clash = {p.name for p in own} & set(fields)
        if clash:
            raise TypeError(f"{fn.__name__} has parameters {sorted(clash)} that are also fields of {cls.__name__}")

        @functools.wraps(fn)
        def command(**kwargs):
            values = {n: kwargs.pop(n) for n in fields}
            try:
                cfg = cls(**values)
            except (TypeError, ValueError) as e:
                fail(str(e), f"see --help for the valid values of each {cls.__name__} field")
            return fn(**{param: cfg}, **kwargs)

        command.__signature__ = sig.replace(parameters=own + generated)
        return command

    return decorate
