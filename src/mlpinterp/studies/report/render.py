"""The one report module of every ``reproduce`` command: Markdown -> self-contained HTML, honest statistics.

Every ``reproduce`` command (polynomial, transformer, APD, SPD, MFR) builds its report as Markdown text and
calls :func:`write_report`, which writes ``report.md`` (figures linked relative to the output directory, so it
renders on GitHub or in an editor) and ``report.html`` (the same document rendered by ``markdown-it-py`` with
tables, every figure embedded as base64 data: one file that opens anywhere).

The helpers make the honest presentation the easy one:

* :func:`summary` / :func:`mean_std` / :func:`mean_se`: ``"0.998 ± 0.001 (n = 3)"``, ``"0.998 (n = 1)"`` for
  one value (never ``± 0``), ``"—"`` when nothing is defined;
* :func:`md_table` / :func:`md_cell`: Markdown tables whose cells cannot break the table (``|`` and newlines
  escaped);
* :func:`verdict`: ``reproduced`` / ``not reproduced`` / ``worse than baseline`` / ``not measured``, each with a
  one-line reason, and no verdict at all from a smoke or quick run (``"smoke run: not a reproduction"``).

Example::

    from mlpinterp.studies.report import figure, md_table, mean_std, verdict, write_report

    v = verdict(acc < 0.5, f"{100 * acc:.1f}% at k = 4 (paper: < 50%)", run="full")
    text = "\\n".join([
        "# My run", "",
        md_table(["claim", "ours", "verdict"], [["acc < 50% at k = 4", mean_std(accs, ".3f"), v]]), "",
        figure("figures/attack.png", "SVD attack (paper Fig. 5)"),
    ])
    md_path, html_path = write_report(out_dir, text, title="My run")
"""

from __future__ import annotations

import base64
import html
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from mlpinterp.utils.io import atomic_write_bytes

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

_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
         ".svg": "image/svg+xml", ".webp": "image/webp"}

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; max-width: 1150px; margin: 2em auto;
       padding: 0 1em; line-height: 1.45; color: #1b1b1b; }
table { border-collapse: collapse; margin: 1em 0; font-size: 14px; max-width: 100%; }
th, td { border: 1px solid #c8c8c8; padding: 4px 8px; vertical-align: top; }
th { background: #f2f2f2; text-align: left; font-size: 13px; overflow-wrap: anywhere; }
code { background: #f4f4f4; padding: 0 3px; border-radius: 3px; font-size: 90%; }
pre code { display: block; padding: 0.6em; overflow-x: auto; }
img { max-width: 100%; height: auto; }
"""


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


# --------------------------------------------------------------------------------------------------- Markdown


def md_cell(value) -> str:
    """Text for one Markdown table cell: ``|`` escaped, newlines become spaces; ``None``/NaN become ``"—"``."""
    if value is None:
        return DASH
    if isinstance(value, float) and not math.isfinite(value):
        return DASH
    text = str(value).replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return text.replace("\\|", "|").replace("|", "\\|")


def md_table(headers: Sequence, rows: Iterable[Sequence], align: Sequence[str] | None = None) -> str:
    """A GitHub-flavoured Markdown table with every cell passed through :func:`md_cell`.

    ``align``: one of ``"l"``, ``"r"``, ``"c"`` per column (default: all left). Raises ``ValueError`` when a row
    has a different number of cells than ``headers``.
    """
    headers = list(headers)
    if not headers:
        raise ValueError("md_table needs at least one header")
    align = list(align) if align is not None else ["l"] * len(headers)
    if len(align) != len(headers) or any(a not in ("l", "r", "c") for a in align):
        raise ValueError(f"align must give 'l', 'r' or 'c' for each of the {len(headers)} columns, got {align!r}")
    rule = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(md_cell(h) for h in headers) + " |",
             "|" + "|".join(rule[a] for a in align) + "|"]
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != len(headers):
            raise ValueError(f"row {i} has {len(row)} cells, expected {len(headers)} (headers {headers})")
        lines.append("| " + " | ".join(md_cell(c) for c in row) + " |")
    return "\n".join(lines)


def figure(path: str | os.PathLike, alt: str) -> str:
    """``![alt](path)`` with ``]`` / ``[`` escaped in ``alt`` and the path in ``<...>`` when it has spaces."""
    alt = str(alt).replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]").replace("\n", " ")
    p = Path(path).as_posix()
    if any(c in p for c in " ()<>"):
        p = "<" + p.replace("<", "%3C").replace(">", "%3E") + ">"
    return f"![{alt}]({p})"


def _markdown_parser():
    from markdown_it import MarkdownIt

    # commonmark + GFM tables; raw HTML in the text is shown as text, never interpreted
    return MarkdownIt("commonmark", {"html": False, "typographer": False}).enable("table")


def _embed(src: str, base_dir: Path) -> str:
    """``data:`` URI of the local image ``src`` (relative to ``base_dir``); raises ``FileNotFoundError``."""
    if src.startswith("data:"):
        return src
    parts = urlsplit(src)
    if parts.scheme not in ("", "file") or parts.netloc:
        raise ValueError(f"figure {src!r} is not a local file: a self-contained report embeds local figures only")
    rel = Path(unquote(parts.path))
    path = rel if rel.is_absolute() else base_dir / rel
    mime = _MIME.get(path.suffix.lower())
    if mime is None:
        raise ValueError(f"figure {str(path)!r} has unknown image type {path.suffix!r}; expected one of {sorted(_MIME)}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FileNotFoundError(f"figure {str(path)!r} referenced by the report cannot be read ({e.strerror or e})") from e
    if not data:
        raise FileNotFoundError(f"figure {str(path)!r} referenced by the report is empty")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def render_html(markdown_text: str, base_dir: str | os.PathLike, title: str) -> str:
    """The Markdown rendered as one self-contained HTML page, every image embedded as base64 data.

    Images (``![alt](path)``) are resolved relative to ``base_dir``. Raises ``FileNotFoundError`` naming the path
    of a missing, unreadable or empty figure and ``ValueError`` for a remote image or an unknown image type.
    """
    if not isinstance(markdown_text, str):
        raise TypeError(f"markdown_text must be a str, got {type(markdown_text).__name__}")
    base_dir = Path(base_dir)
    md = _markdown_parser()
    tokens = md.parse(markdown_text)
    stack = list(tokens)
    while stack:
        tok = stack.pop()
        if tok.children:
            stack.extend(tok.children)
        if tok.type == "image":
            tok.attrSet("src", _embed(str(tok.attrGet("src") or ""), base_dir))
    body = md.renderer.render(tokens, md.options, {})
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(str(title))}</title><style>{_CSS}</style></head>\n<body>\n{body}</body></html>\n")


def write_report(out_dir: str | os.PathLike, markdown_text: str, title: str, *,
                 name: str = "report") -> tuple[Path, Path]:
    """Write ``out_dir/<name>.md`` and the self-contained ``out_dir/<name>.html`` atomically.

    Figures are referenced in the Markdown relative to ``out_dir`` (e.g. ``figures/fvu.png``). The HTML is rendered
    (and so every figure checked) before either file is written: a missing figure raises ``FileNotFoundError``
    and leaves no half-written report. Returns ``(md_path, html_path)``.
    """
    out_dir = Path(out_dir)
    page = render_html(markdown_text, out_dir, title)
    text = markdown_text if markdown_text.endswith("\n") else markdown_text + "\n"
    md_path, html_path = out_dir / f"{name}.md", out_dir / f"{name}.html"
    atomic_write_bytes(md_path, text.encode("utf-8"))
    atomic_write_bytes(html_path, page.encode("utf-8"))
    return md_path, html_path
