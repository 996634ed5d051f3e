"""Markdown -> self-contained HTML for every study's report, and the Jinja2 templates the reports come from.

Every study keeps its report as a template beside its code (``report.md.j2``) and fills it with the numbers its run
measured (:func:`render_template`); :func:`write_report` writes ``report.md`` (figures linked relative to the
output directory, so it renders on GitHub or in an editor) and ``report.html`` (the same document rendered by
``markdown-it-py`` with tables, every figure embedded as base64 data: one file that opens anywhere).

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
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from mlpinterp.studies.report import stats
from mlpinterp.studies.report.stats import DASH
from mlpinterp.utils.io import atomic_write_bytes

_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
         ".svg": "image/svg+xml", ".webp": "image/webp"}

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; max-width: 1150px; margin: 2em auto;
       padding: 0 1em; line-height: 1.45; color: #1b1b1b; }
table { border-collapse: collapse; margin: 1em 0; font-size: 14px; display: block; max-width: 100%;
        overflow-x: auto; }
th, td { border: 1px solid #c8c8c8; padding: 4px 8px; vertical-align: top; word-break: normal;
         overflow-wrap: normal; hyphens: none; }
th { background: #f2f2f2; text-align: left; font-size: 13px; }
code { background: #f4f4f4; padding: 0 3px; border-radius: 3px; font-size: 90%; }
pre code { display: block; padding: 0.6em; overflow-x: auto; }
img { max-width: 100%; height: auto; }
.nw { white-space: nowrap; }
"""
"""Tables wrap only between words (never "blo ck") and scroll sideways when wider than the page; ``.nw`` keeps a
number in scientific notation or a "mean ± spread" on one line (no break after the "e-" of "4.5e-09")."""


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


_NUMBER = r"[-−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?%?"
_WHOLE = re.compile(rf"{_NUMBER}(?:\s*±\s*{_NUMBER})?")


def _keep_numbers_whole(tok) -> None:
    """Turn a text token holding numbers in scientific notation or ``mean ± spread`` into escaped HTML with each such
    number in a ``<span class="nw">`` (CSS: no line break inside)."""
    if tok.type != "text" or ("±" not in tok.content and "e-" not in tok.content and "e+" not in tok.content):
        return
    parts, last = [], 0
    for m in _WHOLE.finditer(tok.content):
        if "±" in m.group() or "e" in m.group():
            parts += [html.escape(tok.content[last:m.start()]), f'<span class="nw">{html.escape(m.group())}</span>']
            last = m.end()
    if parts:
        tok.type, tok.content = "html_inline", "".join(parts) + html.escape(tok.content[last:])


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
    for block in tokens:
        if block.type == "inline":
            for tok in block.children or ():
                _keep_numbers_whole(tok)
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


# -------------------------------------------------------------------------------------------------- templates


def _environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FunctionLoader(_load_template), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.globals.update(md_table=md_table, figure=figure, mean_std=stats.mean_std, mean_se=stats.mean_se,
                       fmt=stats.fmt_value, convention=stats.convention, load_average=stats.fmt_load_average,
                       paper_pm=stats.paper_pm)
    env.filters.update(fmt=stats.fmt_value, cell=md_cell)
    return env


def _load_template(name: str) -> str:
    """Text of ``"<package>:<file>"``, a template file installed with ``package`` (package data)."""
    from importlib import resources

    package, sep, file = name.partition(":")
    if not sep or not package or not file:
        raise ValueError(f"template name must be '<package>:<file>', got {name!r}")
    try:
        return resources.files(package).joinpath(file).read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError) as e:
        raise FileNotFoundError(f"report template {file!r} of package {package!r} not found ({e}); a study's "
                                "template is installed with it as package data (pyproject.toml)") from e


def render_template(package: str, file: str, context: dict) -> str:
    """The Markdown of the Jinja2 template ``file`` shipped with ``package`` (e.g. ``"mlpinterp.studies.apd"``,
    ``"report.md.j2"``), filled with ``context``.

    The template sees ``context`` and these helpers: :func:`md_table`, :func:`figure`, ``mean_std``, ``mean_se``,
    ``fmt`` (also a filter), ``convention`` (the statistics sentence each report states), ``load_average`` and
    ``paper_pm``; ``cell`` is :func:`md_cell` as a filter. An undefined name raises ``jinja2.UndefinedError`` (no
    silent blank in a report); a missing template ``FileNotFoundError``.
    """
    if not isinstance(context, dict):
        raise TypeError(f"context must be a dict, got {type(context).__name__}")
    text = _environment().get_template(f"{package}:{file}").render(**context)
    while "\n\n\n" in text:  # blank lines left by template blocks: one is enough in Markdown
        text = text.replace("\n\n\n", "\n\n")
    return text
