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

The user gets the library's precise message (it names the file or the argument) and the fix. Set
``MLPINTERP_TRACEBACK=1`` to get the traceback anyway (for a bug report).
"""

from __future__ import annotations

import contextvars
import errno
import functools
import os
import pickle
from collections.abc import Callable, Iterator
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
        fail(_message(e), fix_for(e, fix))


def guarded(command: Callable, name: str) -> Callable:
    """``command`` (a Typer command function) with its expected failures printed as ``Error:``/``Fix:`` and exit
    status 1 (the fix defaults to the command's ``--help``). Every command of the CLI is registered through it."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        token = _COMMAND_FIX.set(f"see `mlpinterp {name} --help`")
        try:
            with expected_errors():
                return command(*args, **kwargs)
        finally:
            _COMMAND_FIX.reset(token)

    return run
