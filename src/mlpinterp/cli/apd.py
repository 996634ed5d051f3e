"""CLI commands for the apd part of mlpinterp."""

from __future__ import annotations

import typer


def register(app: typer.Typer, reproduce_app: typer.Typer) -> None:
    """Attach this module's commands to the top-level app and to reproduce."""
