"""The one report module of every study: honest statistics and verdicts (:mod:`.stats`), Markdown templates
rendered to ``report.md`` and a self-contained ``report.html`` (:mod:`.render`)."""

from mlpinterp.studies.report.render import figure, md_cell, md_table, render_html, render_template, write_report
from mlpinterp.studies.report.stats import (
    DASH,
    RUN_KINDS,
    VERDICTS,
    Summary,
    Verdict,
    convention,
    fmt_load_average,
    fmt_value,
    mean_se,
    mean_std,
    paper_pm,
    run_kind,
    run_kind_note,
    summary,
    verdict,
)

__all__ = ["DASH", "RUN_KINDS", "VERDICTS", "Summary", "Verdict", "convention", "figure", "fmt_load_average",
           "fmt_value", "md_cell", "md_table", "mean_se", "mean_std", "paper_pm", "render_html", "render_template",
           "run_kind", "run_kind_note", "summary", "verdict", "write_report"]
