"""Parameter-space run directories: one method per ``--out``, recorded in its ``metrics.json``.

``reproduce apd`` and ``reproduce spd`` write the same top-level files (``metrics.json``, ``report.md``,
``report.html``), so a directory shared by the two methods would lose one method's results to the other, and an
``--apd-run`` pointing at an SPD run would put SPD's numbers in the APD column. ``metrics.json`` therefore records
``"method"``; runs written before it are recognised by their configuration (APD's has ``topk``, SPD's ``d_gate``).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

from mlpinterp.utils.rundir import read_output
from mlpinterp.utils.validation import check_instance

METHODS = ("apd", "spd")

#: A configuration field only each method's configuration has (for metrics.json files written before "method").
_MARKER = {"apd": "topk", "spd": "d_gate"}


def method_of(metrics: dict) -> str | None:
    """``"apd"`` or ``"spd"``: the method whose ``reproduce`` wrote ``metrics`` (a ``metrics.json`` content), from
    its ``"method"`` field or, for older runs, its configuration; ``None`` when it is neither."""
    method = metrics.get("method")
    if method in METHODS:
        return method
    cfg = metrics.get("config")
    if method is None and isinstance(cfg, dict):
        found = [m for m, key in _MARKER.items() if key in cfg]
        if len(found) == 1:
            return found[0]
    return None


def check_out_dir(out: str | Path, method: str) -> Path:
    """``Path(out)`` after checking that it can hold a ``reproduce {method}`` run: not empty text, not an existing
    file, and not a directory whose ``metrics.json`` was written by anything but ``reproduce {method}``.

    Raises
    ------
    ValueError
        Naming ``out`` and what it holds (the fix: another ``--out``).
    TypeError
        If ``out`` is not a path (``str`` or ``os.PathLike``).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    check_instance(out, (str, os.PathLike), "out", "directory path (str or os.PathLike)")
    if str(out).strip() == "":
        raise ValueError("out must name a directory, got an empty path (it would write into the current directory)")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out {str(out)!r} is an existing file, expected a directory (new or from `reproduce "
                         f"{method}`); use another --out")
    metrics = out / "metrics.json"
    if metrics.is_file():
        found = method_of(read_output(metrics, what="metrics"))
        if found != method:
            what = f"a `reproduce {found}` run" if found else "results of another command"
            raise ValueError(f"out {str(out)!r} holds {what} (its metrics.json), not a `reproduce {method}` run; "
                             f"writing there would replace them: use another --out")
    return out


#: Configuration fields that change how a run executes or logs, not the method's recipe (a run with them changed is
#: still the paper's preset).
EXECUTION_FIELDS = ("compile", "log_every", "checkpoint_every")


def recipe_overrides(preset, overrides: dict | None) -> dict:
    """The entries of ``overrides`` that change the recipe of ``preset`` (a config dataclass): those whose value
    differs from the preset's, other than :data:`EXECUTION_FIELDS`. A run with any is not the paper's preset."""
    base = asdict(preset)
    return {k: v for k, v in (overrides or {}).items() if k not in EXECUTION_FIELDS and base.get(k) != v}
