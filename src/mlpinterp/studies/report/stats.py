"""Honest statistics and verdicts for every study's report.

* :func:`summary` / :func:`mean_std` / :func:`mean_se`: ``"0.998 ± 0.001 (n = 3)"``, ``"0.998 (n = 1)"`` for one
  value (never ``± 0``), ``"—"`` when nothing is defined; :func:`convention` is the sentence each report states;
* :func:`verdict`: ``reproduced`` / ``not reproduced`` / ``worse than baseline`` / ``not measured``, each with a
  one-line reason, and no verdict at all from a smoke or quick run (``"smoke run: not a reproduction"``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

DASH = "—"
"""Shown for a statistic that is undefined (no value, or a spread of a single value)."""

RUN_KINDS = ("full", "quick", "smoke", "custom")
"""``full``: a configuration meant to reproduce; ``quick`` / ``smoke``: shortened runs that check the pipeline;
``custom``: a paper preset with fields overridden (``--steps``, ``--lr``, ...), so not the paper's configuration."""


def run_kind(quick: bool, overrides: dict | None = None) -> str:
    """The :data:`RUN_KINDS` entry of a ``reproduce`` run: ``quick``, else ``custom`` with any preset field
    overridden, else ``full``."""
    return "quick" if quick else ("custom" if overrides else "full")


def run_kind_note(kind: str, overrides: dict | None = None) -> str:
    """Title suffix saying why a run is not a reproduction (empty for a ``full`` run), naming the overrides."""
    what = ", ".join(f"{k} = {v}" for k, v in sorted((overrides or {}).items()))
    if kind == "full":
        return ""
    if kind == "custom":
        return f" (preset overridden: {what}; not a reproduction)"
    return f" ({kind} preset{f', {what}' if what else ''}: not a reproduction)"

# ----------------------------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Summary:
    """Mean and spread of repeated measurements (seeds); ``std``/``se`` are ``None`` unless ``n >= 2``.

    ``n`` counts the finite values only (``None`` and NaN entries, e.g. a metric not computed for one seed, are
    left out); ``mean`` is ``None`` when ``n == 0``.
    """

    mean: float | None
    """Arithmetic mean of the finite values."""
    std: float | None
    """Sample standard deviation (ddof = 1)."""
    n: int
    """Number of finite values."""

    @property
    def se(self) -> float | None:
        """Standard error of the mean, ``std / sqrt(n)``."""
        return None if self.std is None else self.std / math.sqrt(self.n)

    def to_dict(self) -> dict:
        """``{"mean", "std", "se", "n"}`` for JSON (``None`` where undefined, never a made-up 0)."""
        return {"mean": self.mean, "std": self.std, "se": self.se, "n": self.n}

    def format(self, fmt: str = ".4g", *, spread: str = "std", scale: float = 1.0, unit: str = "",
               n: int | None = None) -> str:
        """``"m ± s (n = N)"`` with ``format(value, fmt)``; ``"m (n = 1)"``; ``"—"`` when ``n == 0``.

        ``spread``: ``"std"`` (sample standard deviation) or ``"se"`` (standard error, labelled ``s.e.``);
        ``scale`` multiplies mean and spread (e.g. 100 for percentages, with ``unit="%"``). ``n``: the count a
        table's header already states; when ``self.n`` equals it the ``(n = ...)`` suffix is left out
        (``"m ± s"``, or ``"m"`` for one value), otherwise it is kept.
        """
        if spread not in ("std", "se"):
            raise ValueError(f"spread must be 'std' or 'se', got {spread!r}")
        if self.mean is None:
            return DASH
        m = f"{format(self.mean * scale, fmt)}{unit}"
        s = self.std if spread == "std" else self.se
        label = "s.e., " if spread == "se" else ""
        suffix = "" if n == self.n and not label else f" ({label}n = {self.n})"
        if s is None:
            return m + ("" if n == self.n else f" (n = {self.n})")
        return f"{m} ± {format(s * scale, fmt)}{unit}{suffix}"

    def __str__(self) -> str:
        return self.format()


def _finite(values) -> list[float]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"values must be a sequence of numbers, got {type(values).__name__}")
    try:
        items = list(values)
    except TypeError as e:
        raise TypeError(f"values must be a sequence of numbers, got {type(values).__name__}") from e
    out = []
    for v in items:
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise TypeError(f"values must hold numbers or None, got {type(v).__name__} {v!r}")
        f = float(v)
        if math.isfinite(f):
            out.append(f)
    return out


def summary(values: Iterable) -> Summary:
    """Mean and sample standard deviation of the finite entries of ``values`` (``None``/NaN/inf are left out).

    Raises ``TypeError`` for a non-numeric entry.
    """
    x = _finite(values)
    n = len(x)
    if n == 0:
        return Summary(None, None, 0)
    mean = math.fsum(x) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in x) / (n - 1)) if n >= 2 else None
    return Summary(mean, std, n)


def mean_std(values: Iterable, fmt: str = ".4g", *, scale: float = 1.0, unit: str = "") -> str:
    """``"0.998 ± 0.001 (n = 3)"`` (sample std), ``"0.998 (n = 1)"``, or ``"—"``; see :meth:`Summary.format`."""
    return summary(values).format(fmt, spread="std", scale=scale, unit=unit)


def mean_se(values: Iterable, fmt: str = ".4g", *, scale: float = 1.0, unit: str = "") -> str:
    """``"0.998 ± 0.001 (s.e., n = 3)"`` (standard error of the mean), ``"0.998 (n = 1)"``, or ``"—"``."""
    return summary(values).format(fmt, spread="se", scale=scale, unit=unit)


def fmt_value(v, fmt: str = ".4g", *, scale: float = 1.0, unit: str = "") -> str:
    """One number formatted, or ``"—"`` for ``None``/NaN/inf (never ``nan`` in a report)."""
    if v is None:
        return DASH
    f = float(v)
    return f"{format(f * scale, fmt)}{unit}" if math.isfinite(f) else DASH


# ------------------------------------------------------------------------------------------------- verdicts


VERDICTS = ("reproduced", "not reproduced", "worse than baseline", "not measured")
"""Verdicts of a full run; a smoke or quick run gets ``"<kind> run: not a reproduction"`` instead."""


@dataclass(frozen=True)
class Verdict:
    """A claim's verdict and the one-line reason behind it; ``str()`` gives ``"status: reason"``."""

    status: str
    """One of :data:`VERDICTS`, or ``"smoke run: not a reproduction"`` / ``"quick run: not a reproduction"``."""
    reason: str
    """One line: the measured number against the paper's / the baseline's."""

    @property
    def is_verdict(self) -> bool:
        """False for smoke/quick runs and unmeasured claims: nothing may be concluded from them."""
        return self.status in ("reproduced", "not reproduced", "worse than baseline")

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}" if self.reason else self.status


def verdict(passed: bool | None, reason: str, *, run: str = "full", failed: str = "not reproduced") -> Verdict:
    """The verdict of one claim, refusing to conclude anything from a smoke or quick run.

    Parameters
    ----------
    passed
        ``True`` if our measurement supports the claim, ``False`` if not, ``None`` if it was not measured.
    reason
        One line (no newline) saying why: our number beside the paper's or the baseline's. Required (non-empty)
        unless ``passed`` is ``True``.
    run
        One of :data:`RUN_KINDS`; ``"smoke"``/``"quick"``/``"custom"`` give ``"<run> run: not a reproduction"``
        whatever ``passed`` is, with no reason (nothing is concluded, so there is nothing to justify).
    failed
        Status when ``passed`` is ``False``: ``"not reproduced"`` or ``"worse than baseline"``.

    Raises ``ValueError`` for an unknown ``run``/``failed``, a multi-line reason, or a missing reason.
    """
    if run not in RUN_KINDS:
        raise ValueError(f"run must be one of {list(RUN_KINDS)}, got {run!r}")
    if failed not in ("not reproduced", "worse than baseline"):
        raise ValueError(f"failed must be 'not reproduced' or 'worse than baseline', got {failed!r}")
    if passed is not None and not isinstance(passed, bool):
        passed = bool(passed)  # numpy bools
    if not isinstance(reason, str) or "\n" in reason:
        raise ValueError(f"reason must be one line of text, got {reason!r}")
    reason = reason.strip()
    if run != "full":
        return Verdict(f"{run} run: not a reproduction", "")
    if passed is None:
        if not reason:
            raise ValueError("a 'not measured' verdict needs a reason (why it was not measured)")
        return Verdict("not measured", reason)
    if not passed and not reason:
        raise ValueError(f"a {failed!r} verdict needs a one-line reason")
    return Verdict("reproduced" if passed else failed, reason)


# ------------------------------------------------------------------------------------------ stated conventions


def convention(spread: str, n: int, over: str = "seeds") -> str:
    """The one sentence every report states about its numbers: ``"Statistics: mean ± sample standard deviation
    (std, ddof = 1) over n = 3 seeds."``; for ``n == 1`` that no spread is shown (``"n = 1"``, never ``± 0``).

    ``spread``: ``"std"`` or ``"se"`` (standard error of the mean); ``over``: what ``n`` counts. Raises
    ``ValueError`` for another ``spread`` or ``n < 1``; ``TypeError`` for a non-int ``n``.
    """
    if spread not in ("std", "se"):
        raise ValueError(f"spread must be 'std' or 'se', got {spread!r}")
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n == 1:
        return (f"Statistics: n = 1 ({over.rstrip('s')}): each value is that single run's; no spread can be estimated, "
                "so none is shown.")
    what = "sample standard deviation (std, ddof = 1)" if spread == "std" else "standard error of the mean (s.e.)"
    return f"Statistics: mean ± {what} over n = {n} {over}; a cell with another n says so."


def fmt_load_average(values) -> str:
    """``"1.23 / 0.98 / 0.75"`` for the 1/5/15-minute load averages (two decimals), ``"—"`` when not recorded."""
    if not values:
        return DASH
    return " / ".join(fmt_value(v, ".2f") for v in values)


def paper_pm(mean: float, spread: float | None, fmt: str = ".3f") -> str:
    """A paper's ``mean ± spread`` as cited; a spread that rounds to zero at ``fmt`` is written ``"(spread < 0.0005)"``
    (half the last digit), never ``± 0``; ``None``: the mean alone."""
    m = format(mean, fmt)
    if spread is None:
        return m
    s = format(spread, fmt)
    if float(s) == 0.0:
        digits = int(fmt.strip(".f")) if fmt.strip(".f").isdigit() else 3
        return f"{m} (spread < {0.5 * 10 ** -digits:.{digits + 1}f})"
    return f"{m} ± {s}"
