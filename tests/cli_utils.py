"""Helpers for CLI tests."""

import re


def flat(output: str) -> str:
    """Rich wraps error boxes: drop box-drawing characters and collapse whitespace."""
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", output).split())
