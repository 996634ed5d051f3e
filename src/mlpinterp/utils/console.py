"""The ``rich`` console of the CLIs: full-width tables when the output is a file or a pipe.

``rich`` lays tables out for 80 columns when stdout is not a terminal, which wraps every long cell (a claim, a
verdict) over several lines of a log file. :func:`console` keeps the terminal's width on a terminal and gives
tables their natural width otherwise (also when ``$COLUMNS`` is exported, as some shells and test runners do).
"""

from __future__ import annotations

NON_TERMINAL_WIDTH = 10_000
"""Width used when the output is not a terminal: tables take their natural width (they do not expand to it)."""


def console(*, stderr: bool = False):
    """A ``rich.console.Console`` on stdout (or ``stderr``), terminal width on a terminal, unwrapped otherwise."""
    from rich.console import Console

    con = Console(stderr=stderr)
    if not con.is_terminal:
        con = Console(stderr=stderr, width=NON_TERMINAL_WIDTH)
    return con
