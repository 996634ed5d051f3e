"""Expected CLI failures: a short message on stderr saying what went wrong and how to fix it.

Exit-code policy (one rule for every command):

- **exit 1**, ``Error: ...`` and ``Fix: ...`` on stderr, never a traceback: every expected failure about input
  values or file contents: a configuration value the command's configuration dataclass refuses (``--seeds 0``,
  ``--lr nan``, an option of another ``--setting``), a missing, corrupt, truncated or malicious file, an empty
  array, a file of the wrong size or shape, an existing file where ``--out`` must be a directory (or the
  reverse), a resume conflict, a full disk;
- **exit 2**, Click's usage message: only Click's own usage errors: an unknown option, a value that does not
  parse as the option's type (``--seeds x``, a choice not offered), a missing required option or argument;
- **exit 0**: success (``--help`` and ``--version`` included).

The user gets the library's precise message (it names the file or the argument) and the fix, with the names of the
command's configuration fields spelled as the flags the user typed (:func:`in_flags`: ``seeds must be >= 1`` from
the library reads ``--seeds must be >= 1``; the Python API keeps the argument names). Set ``MLPINTERP_TRACEBACK=1``
to get the traceback anyway (for a bug report).
"""

from __future__ import annotations

import contextvars
import errno
import functools
import os
import pickle
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import NoReturn

import typer

TRACEBACK_ENV = "MLPINTERP_TRACEBACK"
"""Environment variable: when set to a non-empty value other than ``0``, expected errors re-raise."""


def fail(message: str, fix: str | None = None) -> NoReturn:
    """Print ``Error: message`` (and ``Fix: fix``) to stderr and exit with status 1."""
    typer.echo(f"Error: {message}", err=True)
    if fix:
        typer.echo(f"Fix: {fix}", err=True)
    raise typer.Exit(1)


def want_traceback() -> bool:
    """Whether ``MLPINTERP_TRACEBACK`` asks for the traceback of an expected failure (a bug report)."""
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


_COMMAND_FIX: contextvars.ContextVar[str | None] = contextvars.ContextVar("command_fix", default=None)
"""The fix of the command running now (its ``--help``), for an expected failure that brings none."""

_COMMAND_FLAGS: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("command_flags",
                                                                                          default=None)
"""The running command's Python names of its configuration fields -> their flags (``{"seeds": "--seeds"}``)."""

_LEAD = r"(?=[=:]| ['\"(]| -?\d| (?:must|applies|is|are|has|holds|exceeds|needs|cannot|given|got|should|was|does)\b)"
"""What follows a field name that starts a message about it (``seeds must``, ``layer applies``, ``lr=0.1``,
``batch_size 64 exceeds``), so a message that merely starts with the same word (``text files not found``) is left
as it is."""


def in_flags(text: str, flags: Mapping[str, str] | None = None) -> tuple[str, list[str]]:
    """``text`` with the command's field names (``flags``: Python name -> flag; default: the running command's)
    spelled as its flags, and the flags it now names. A name is translated where it is the subject of the message
    (``seeds must be >= 1`` -> ``--seeds must be >= 1``), quoted (``'layer'`` or `` `layer` `` -> ``--layer``; not
    an item of a listed tuple or list, which is a value: ``('data', 'hybrid')``) or a keyword or bound (``dataset='digits'``
    -> ``--dataset 'digits'``, ``ctx_len <= 64`` -> ``--ctx-len <= 64``); other words are left alone."""
    flags = (_COMMAND_FLAGS.get() or {}) if flags is None else flags
    if not flags or not text:
        return text, []
    names = "|".join(re.escape(n) for n in sorted(flags, key=len, reverse=True))
    used: list[str] = []

    def flag(name: str) -> str:
        if flags[name] not in used:
            used.append(flags[name])
        return flags[name]

    text = re.sub(rf"^({names}){_LEAD}(=?)", lambda m: flag(m[1]) + (" " if m[2] else ""), text)
    text = re.sub(rf"(?<![(\[,])(?<!, )(['`])({names})\1(?![,)\]])", lambda m: flag(m[2]), text)  # not in a list
    text = re.sub(rf"(?<=[\s(,])({names})(=(?=\S)| [<>]=? )", lambda m: flag(m[1]) + (" " if m[2] == "=" else m[2]),
                  text)
    return text, used


_DISK_FULL_FIX = "free space on that disk, or pass an --out on another one; a rerun resumes from the last file written"


def fix_for(e: BaseException, fix: str | None) -> str | None:
    """The fix line for ``e``: its own ``fix`` attribute, a full disk's, ``fix``, or the running command's."""
    own = getattr(e, "fix", None)
    if own:
        return own
    if (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or \
            (_is_safetensors_error(e) and "space" in str(e).lower()):
        return _DISK_FULL_FIX
    return fix or _COMMAND_FIX.get()


def report(e: BaseException, fix: str | None = None) -> NoReturn:
    """:func:`fail` with ``e``'s message and fix (:func:`fix_for`), the running command's field names spelled as
    its flags (:func:`in_flags`); a message that names a flag, where neither ``e`` nor the caller brings a fix, gets
    one naming the flag (and the command's ``--help``) instead of the bare ``--help`` line."""
    message, used = in_flags(_message(e))
    if used and fix is None and not getattr(e, "fix", None):
        helps = _COMMAND_FIX.get()
        fix = f"change or drop {' / '.join(used)}" + (f" ({helps})" if helps else "")
    fix = fix_for(e, fix)
    fail(message, in_flags(fix)[0] if fix else None)


def _message(e: BaseException) -> str:
    msg = str(e) or type(e).__name__
    if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in msg:
        msg = f"{msg}: {e.filename!s}"
    if _is_safetensors_error(e) and "space" in msg.lower():
        msg = f"writing a safetensors file failed: {msg} (the disk is full)"
    return msg


def _is_safetensors_error(e: BaseException) -> bool:
    return type(e).__name__ == "SafetensorError"


def _is_expected(e: BaseException) -> bool:
    """Expected failures: bad values and paths (``ValueError``, ``OSError``, including a full disk; an empty file's
    ``EOFError``, which click would print as a bare "Aborted."), a safetensors write or read error (not an ``OSError``), an
    artifact error of :mod:`mlpinterp.utils.artifact` (any exception carrying a ``fix``), and a pickle refused by
    ``torch.load(weights_only=True)``."""
    return (isinstance(e, (ValueError, OSError, EOFError, pickle.UnpicklingError))
            or _is_safetensors_error(e) or hasattr(e, "fix"))


@contextmanager
def expected_errors(fix: str | None = None) -> Iterator[None]:
    """Turn an expected failure raised inside the block (:func:`_is_expected`) into :func:`fail` with ``fix``.

    An exception carrying its own ``fix`` attribute (e.g. ``mlpinterp.models.RunConflictError``) uses that instead;
    a full disk (``ENOSPC``) says to free space.
    """
    try:
        yield
    except (typer.Exit, typer.BadParameter):  # a value that does not parse as its option's type: Click's usage error
        raise
    except Exception as e:
        if not _is_expected(e) or want_traceback():
            raise
        report(e, fix)


def guarded(command: Callable, name: str) -> Callable:
    """``command`` (a Typer command function) with its expected failures printed as ``Error:``/``Fix:`` and exit
    status 1 (the fix defaults to the command's ``--help``; the field names of a command built by
    :func:`mlpinterp.cli.config_options.config_options`, its ``__cli_flags__``, are spelled as their flags). Every
    command of the CLI is registered through it."""
    flags = dict(getattr(command, "__cli_flags__", {}))

    @functools.wraps(command)
    def run(*args, **kwargs):
        token = _COMMAND_FIX.set(f"see `mlpinterp {name} --help`")
        token_flags = _COMMAND_FLAGS.set(flags)
        try:
            with expected_errors():
                return command(*args, **kwargs)
        finally:
            _COMMAND_FLAGS.reset(token_flags)
            _COMMAND_FIX.reset(token)

    return run
