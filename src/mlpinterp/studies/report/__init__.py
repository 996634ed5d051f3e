"""The one report module of every study: statistics, verdicts, Markdown -> self-contained HTML."""

from mlpinterp.studies.report.render import *  # noqa: F401,F403

