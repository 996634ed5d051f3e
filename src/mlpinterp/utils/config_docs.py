"""Field documentation of configuration dataclasses, so that ``--help`` texts are generated, never copied.

Configuration dataclasses document every field with a string literal right under it (sparsify style)::

    @dataclass
    class Config:
        lr: float = 5e-3
        \"\"\"Peak learning rate of schedule-free AdamW.\"\"\"

:func:`field_docs` reads those strings from the class's source (they are not kept at run time) and
:func:`field_default` gives a field's default, so a CLI option can say ``help=field_docs(Config)["lr"]`` with
``default=field_default(Config, "lr")`` and cannot drift from the code that uses them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of a dataclass (fields without a docstring are left out; inherited ones merged).

    Docstrings are cleaned (``inspect.cleandoc``), joined into one line and stripped of reST literals (````x````
    -> ``x``) so they read as ``--help`` text. Raises ``TypeError`` unless ``cls`` is a
    dataclass and ``OSError`` when its source is not available.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"cls must be a dataclass type, got {cls!r}")
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if base is object or not dataclasses.is_dataclass(base):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        body = tree.body[0].body  # the ClassDef
        for stmt, nxt in zip(body, body[1:], strict=False):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = _plain(" ".join(inspect.cleandoc(nxt.value.value).split()))
    return docs


def _plain(text: str) -> str:
    """Docstring markup as plain help text: ``x`` and :role:`x` become x."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def field_default(cls: type, name: str):
    """Default value of dataclass field ``name`` (calling its ``default_factory``); raises ``KeyError`` if absent."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise KeyError(f"field {name!r} of {cls.__name__} has no default")
    raise KeyError(f"{cls.__name__} has no field {name!r}")
