"""Comparison of a saved configuration with the one requested now: the one rule for run directories, checkpoints
and saved targets (``"field: saved S, requested R"``), with the behaviour of fields added after a configuration
was written (:class:`Implicit`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class _Absent:
    """The value of a configuration field that one side lacks (printed ``absent``)."""

    def __repr__(self) -> str:
        return "absent"


ABSENT = _Absent()


def _json_form(v):
    """Tuples and lists compare equal (a configuration read back from JSON holds lists)."""
    return [_json_form(x) for x in v] if isinstance(v, (tuple, list)) else v


class Implicit:
    """A saved configuration's value of a field it lacks because it was written before the field existed (see
    :func:`config_diff`'s ``implicit``); printed ``absent (written before the field existed: V)``."""

    def __init__(self, value):
        self.value = value

    def __repr__(self) -> str:
        return f"absent (written before the field existed: {self.value!r})"


def saved_value(v):
    """The value a saved side of a :func:`config_diff` entry stands for: an :class:`Implicit`'s value, else ``v``."""
    return v.value if isinstance(v, Implicit) else v


def config_diff(saved: Mapping, requested: Mapping, ignore=(), implicit: Mapping | None = None) -> dict[str, tuple]:
    """``{field: (saved value, requested value)}`` for every field of either mapping, except those in ``ignore``,
    whose values differ, in the order of ``requested`` then the fields only ``saved`` has; a field one side lacks
    has :data:`ABSENT` there. Values compare with ``==`` after tuples become lists (so ``5`` equals ``5.0`` and a
    tuple equals the list a JSON round trip made of it).

    ``implicit``: for fields added to a configuration class after ``saved`` may have been written, the value that
    reproduces what the code did before the field existed (not necessarily today's default). A field that
    ``saved`` lacks is compared as that value (shown as :class:`Implicit` when it differs), so a run written by an
    earlier version resumes when nothing it computed would change, and is refused when the request asks for other
    behaviour. A dotted name ``"outer.inner"`` does the same for a field of a nested configuration (a mapping
    on both sides): ``outer`` differs only when its fields differ after ``inner`` is filled in.

    The one comparison of a stored configuration with the one asked for now: run directories, checkpoints, saved
    targets. Raises ``TypeError`` if ``saved``, ``requested`` or ``implicit`` is not a mapping, or ``ignore`` is not
    a collection of field names (a bare str would ignore its letters)."""
    earlier = {} if implicit is None else implicit
    for arg, name in ((saved, "saved"), (requested, "requested"), (earlier, "implicit")):
        if not isinstance(arg, Mapping):
            raise TypeError(f"{name} must be a mapping of configuration fields, got {type(arg).__name__}")
    skip = set(ignore) if isinstance(ignore, Iterable) and not isinstance(ignore, (str, bytes, Mapping)) else None
    if skip is None or not all(isinstance(k, str) for k in skip):
        raise TypeError(f"ignore must be a collection of field names (str), e.g. ('log_every',), got {ignore!r}")
    out = {}
    for key in [*requested, *(k for k in saved if k not in requested)]:
        a, b = saved.get(key, ABSENT), requested.get(key, ABSENT)
        if a is ABSENT and key in earlier:
            a = Implicit(earlier[key])
        nested = {k[len(key) + 1:]: v for k, v in earlier.items() if k.startswith(f"{key}.")}
        if nested and isinstance(a, Mapping) and isinstance(b, Mapping):
            same = not config_diff(a, b, implicit=nested)
        else:
            same = not (a is ABSENT or b is ABSENT or _json_form(saved_value(a)) != _json_form(b))
        if key not in skip and not same:
            out[key] = (a, b)
    return out


def describe_diff(diff: Mapping[str, tuple]) -> list[str]:
    """``["field: saved S, requested R", ...]`` for a :func:`config_diff` result."""
    return [f"{k}: saved {a!r}, requested {b!r}" for k, (a, b) in diff.items()]


def config_differences(saved: Mapping, requested: Mapping, ignore=(), implicit: Mapping | None = None) -> list[str]:
    """:func:`config_diff` as ``"field: saved S, requested R"`` lines (``absent`` for a field one side lacks);
    ``[]`` when the configurations are equal."""
    return describe_diff(config_diff(saved, requested, ignore, implicit))
