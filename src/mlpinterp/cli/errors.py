"""Expected CLI failures: a short message on stderr saying what went wrong and how to fix it, exit status 1.

Bad paths, corrupt or truncated files and resume conflicts are expected failures: the user gets the library's
precise message (it names the file or the argument) and the fix, never a Python traceback. Set
``MLPINTERP_TRACEBACK=1`` to get the traceback anyway (for a bug report).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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


def _want_traceback() -> bool:
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


@contextmanager
def expected_errors(fix: str | None = None) -> Iterator[None]:
    """Turn ``ValueError``/``OSError`` raised inside the block into :func:`fail` with ``fix``.

    An exception carrying its own ``fix`` attribute (e.g. ``mlpinterp.models.RunConflictError``) uses that instead.
    """
    try:
        yield
    except (ValueError, OSError) as e:
        if _want_traceback():
            raise
        msg = str(e) or type(e).__name__
        if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in msg:
            msg = f"{msg}: {e.filename!s}"
        fail(msg, getattr(e, "fix", None) or fix)
