"""Names, colours and lookups shared by the transformer study's figures and report."""

from __future__ import annotations

COLORS = {"gaussian": "C0", "mixture": "C1", "data": "C2", "hybrid": "C3"}
LABEL = {"gaussian": "Gaussian (exact)", "mixture": "Gaussian mixture", "data": "data projection (exact LS)",
         "hybrid": "hybrid (closed form + SGD)"}
GAUSS_TAIL = 0.0027
"""P(|Z| > 3) for Z ~ N(0, 1): the tail fraction of a Gaussian."""


def get(layer: dict, model: str, n: int, *keys):
    """``layer["models"][model][str(n)][keys[0]][keys[1]]...`` of one block's results, ``None`` where absent."""
    v = layer["models"].get(model, {}).get(str(n))
    for k in keys:
        if v is None:
            return None
        v = v.get(k)
    return v


def splice_value(layer: dict, model: str, n: int):
    """The splice-in value of (input model, degree): embedding cosine (encoders) or CE (causal LMs); ``None`` if not
    measured."""
    s = layer["splice"]["models"].get(model, {}).get(str(n))
    if s is None:
        return None
    return s["cos"] if layer["splice"]["kind"] == "embedding" else s["ce"]
