"""Builders shared by the tests: one random MLP / GLU of given sizes."""

from __future__ import annotations

import numpy as np

from mlpinterp.networks import GLU, MLP


def random_network(kind: str, d_in: int, d_hidden: int, d_out: int, act: str | None, rng: np.random.Generator, *,
                   scaled: bool = True) -> MLP | GLU:
    """A random ``MLP`` (``kind="mlp"``) or ``GLU`` (``kind="glu"``), weights ``[out, in]`` drawn from ``rng`` in the
    order ``W1, b1, (V, c,) W2, b2``; ``act`` None gives gelu (MLP) / silu (GLU).

    ``scaled``: hidden biases ``N(0, 0.5^2)``, ``W2 / sqrt(d_hidden)``, output bias ``N(0, 0.1^2)`` (outputs of
    order one at any width); ``scaled=False``: every entry ``N(0, 1)``."""
    if kind not in ("mlp", "glu"):
        raise ValueError(f"kind must be 'mlp' or 'glu', got {kind!r}")
    act = act or ("gelu" if kind == "mlp" else "silu")

    def bias(n, scale):
        return rng.normal(0, scale, n) if scaled else rng.standard_normal(n)

    W1, b1 = rng.standard_normal((d_hidden, d_in)), bias(d_hidden, 0.5)
    if kind == "glu":
        V, c = rng.standard_normal((d_hidden, d_in)), bias(d_hidden, 0.5)
    W2 = rng.standard_normal((d_out, d_hidden)) / (np.sqrt(d_hidden) if scaled else 1.0)
    b2 = bias(d_out, 0.1)
    return MLP(W1, b1, W2, b2, act) if kind == "mlp" else GLU(W1, b1, V, c, W2, b2, act)


def as_earlier_run_record(out) -> dict:
    """Rewrite ``out/run.json`` as an earlier mlpinterp wrote it (plain JSON, no digests of the run's outputs), so a
    test may then edit the run's files the way that version left them; returns the record (edit and pass it to
    :func:`write_earlier_run_record` to change it)."""
    from mlpinterp.utils.rundir import read_run

    record = {k: v for k, v in read_run(out).items() if k != "outputs"}
    write_earlier_run_record(out, record)
    return record


def write_earlier_run_record(out, record: dict) -> None:
    """Write ``record`` to ``out/run.json`` in the plain-JSON form of an earlier mlpinterp."""
    import json
    from pathlib import Path

    (Path(out) / "run.json").write_text(json.dumps(record, indent=2))
