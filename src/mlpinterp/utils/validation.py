"""Validation at the public boundary: messages name the argument, the expected shape and what was received."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def to_numpy(x, name: str, dtype=np.float64) -> np.ndarray:
    """Convert a numpy array, torch tensor or nested sequence to a finite ``dtype`` array.

    Raises ``TypeError`` if ``x`` is not array-like and ``ValueError`` if it holds NaN or inf.
    """
    if type(x).__module__.startswith("torch"):  # avoid importing torch for numpy inputs
        import torch

        if isinstance(x, torch.Tensor):
            if x.is_complex():
                raise TypeError(f"{name} must be real-valued, got a complex tensor ({x.dtype})")
            x = x.detach().cpu().to(torch.float64 if dtype == np.float64 else torch.float32).numpy()
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{name} must be an array (numpy or torch), got {type(x).__name__}")
    try:
        raw = np.asarray(x)
    except OverflowError as e:
        raise ValueError(f"{name} holds a value beyond the float64 range ({e})") from e
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a numeric array, got {type(x).__name__} ({e})") from e
    if raw.dtype.kind == "c":
        raise TypeError(f"{name} must be real-valued, got a complex array ({raw.dtype})")
    if raw.dtype.kind not in "biuf" and not (raw.dtype.kind == "O" and raw.size == 0):
        if raw.dtype.kind == "O":
            try:
                raw = np.asarray(x, dtype=np.float64)
            except OverflowError as e:
                raise ValueError(f"{name} holds a value beyond the float64 range ({e})") from e
            except (TypeError, ValueError) as e:
                raise TypeError(f"{name} must be a numeric array, got {type(x).__name__} ({e})") from e
        else:
            raise TypeError(f"{name} must be a numeric (bool/int/float) array, got dtype {raw.dtype}")
    try:
        arr = np.asarray(raw, dtype=dtype)
    except OverflowError as e:
        raise ValueError(f"{name} holds a value beyond the float64 range ({e})") from e
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a numeric array, got {type(x).__name__} ({e})") from e
    if not np.all(np.isfinite(arr)):
        n_bad = int(np.size(arr) - np.isfinite(arr).sum())
        raise ValueError(f"{name} contains {n_bad} non-finite value(s) (NaN or inf)")
    return arr


def frozen(arr: np.ndarray) -> np.ndarray:
    """A private read-only copy of ``arr`` (so that in-place edits by the caller cannot make caches stale)."""
    out = np.array(arr, copy=True)
    out.setflags(write=False)
    return out


def check_shape(arr: np.ndarray, name: str, shape: Sequence[int | None]) -> np.ndarray:
    """Check ``arr.shape`` against ``shape`` where ``None`` matches any size; raise ``ValueError``."""
    if arr.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, arr.shape, strict=False)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(arr.shape)}")
    return arr


def as_inputs(X, d_in: int) -> tuple[np.ndarray, bool]:
    """Validate inputs ``X [n, d_in]`` (or a single ``[d_in]``) for a model; returns ``(X [n, d_in], was_single)``.

    Raises ``TypeError``/``ValueError`` naming ``X`` for non-numeric, non-finite or mis-shaped input.
    """
    X = to_numpy(X, "X")
    single = X.ndim == 1
    if single:
        X = X[None]
    if X.ndim != 2 or X.shape[1] != d_in:
        raise ValueError(f"X must have shape [n, d_in={d_in}], got {list(X.shape)}")
    return X, single


def check_batch_tensor(x, name: str, model=None):
    """``x`` must be a finite floating-point ``torch.Tensor`` ``[batch >= 1, ...]``; with ``model`` also one that
    ``model`` accepts (tried on the first row under ``torch.no_grad()``). Returns ``x``.

    Raises ``TypeError`` (not a floating-point tensor) or ``ValueError`` (no batch dimension, NaN/inf, rejected by
    ``model``), each naming ``name``.
    """
    import torch

    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [batch, ...], got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.ndim < 2 or x.shape[0] < 1:
        raise ValueError(f"{name} must have shape [batch >= 1, ...] (a batch dimension first), got {list(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains {int((~torch.isfinite(x)).sum())} non-finite value(s) (NaN or inf)")
    if model is not None:
        try:
            with torch.no_grad():
                model(x[:1])
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            raise ValueError(f"{name} of shape {list(x.shape)} and dtype {x.dtype} does not fit the model ({e})") from e
    return x


def check_int(v, name: str, minimum: int | None = 1, what: str | None = None) -> int:
    """``v`` must be an int (not a bool, not a float; numpy integers accepted) ``>= minimum``; returns ``int(v)``.

    Raises ``TypeError``/``ValueError`` naming it ("n must be an int, got float 2.0", "n must be >= 1, got 0");
    ``what`` words the requirement in both messages instead, e.g. ``"a non-negative int"``.
    """
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be {what or 'an int'}, got {type(v).__name__} {v!r}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be {what or f'>= {minimum}'}, got {v}")
    return int(v)


def check_real(v, name: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float:
    """``v`` must be a finite real number (not a bool) in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__} {v!r}")
    if not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        if lo is None and hi is None:
            rng = ""
        elif hi is None:
            rng = f" and {'>' if lo_open else '>='} {lo:g}"
        else:
            rng = f" in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ValueError(f"{name} must be finite{rng}, got {v}")
    return float(v)
