"""One progress bar for every long loop: ``rich.progress`` on stderr, off with ``quiet`` (the ``--quiet`` flags).

Usage::

    with progress_bar(total=cfg.steps, initial=start, desc="SPD", quiet=quiet) as bar:
        for step in range(start, cfg.steps):
            ...
            bar.advance()
            bar.postfix(loss=0.12, L0=3.1)   # shown after the bar, formatted with 3 significant digits
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class _Bar:
    """Handle of one bar: :meth:`advance` by a number of steps, :meth:`postfix` to show the latest metrics."""

    def __init__(self, progress, task):
        self._progress, self._task = progress, task

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def postfix(self, **values) -> None:
        if self._progress is not None:
            text = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
            self._progress.update(self._task, postfix=text)


@contextmanager
def progress_bar(total: int, *, initial: int = 0, desc: str = "", quiet: bool = False) -> Iterator[_Bar]:
    """A transient ``rich`` bar (steps done / total, rate, time left, a postfix), or a no-op with ``quiet``."""
    if quiet:
        yield _Bar(None, None)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from mlpinterp.utils.console import console

    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            TextColumn("{task.fields[postfix]}"))
    with Progress(*cols, console=console(stderr=True), transient=True) as prog:
        task = prog.add_task(desc, total=total, completed=initial, postfix="")
        yield _Bar(prog, task)
