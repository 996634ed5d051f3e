"""Validation at the public boundary: messages name the argument, the expected shape and what was received."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

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


def check_device(device, name: str = "device"):
    """``torch.device(device)`` after checking it exists on this machine: ``cpu`` (no index), ``cuda[:N]`` with CUDA
    available and ``N`` below the number of GPUs, or ``mps`` where available.

    Raises ``ValueError`` naming ``name``, what was given and what is available (e.g. ``"cuda"`` without CUDA)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{name} must be a torch device such as 'cpu' or 'cuda', got {device!r} ({e})") from e
    if dev.type == "cpu":
        if dev.index not in (None, 0):
            raise ValueError(f"{name} {device!r}: the CPU is one device, use 'cpu'")
    elif dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {device!r} requested but CUDA is not available on this machine; use 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name} {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                             f"'cuda:0' to 'cuda:{torch.cuda.device_count() - 1}'")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"{name} {device!r} requested but MPS is not available on this machine; use 'cpu'")
    else:
        raise ValueError(f"{name} must be 'cpu', 'cuda[:N]' or 'mps', got {device!r}")
    return dev


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
    """``v`` must be a finite real number (not a bool; numpy scalars accepted) in ``[lo, hi]`` (``(lo, hi]`` with
    ``lo_open``)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(v).__name__} {v!r}")
    try:
        finite = math.isfinite(v)
    except OverflowError:  # an int beyond the float range: float(v) below would raise it, naming nothing
        finite, v = False, "an int beyond the float range (|v| > 1.8e308)"
    if not finite or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        if lo is None and hi is None:
            rng = ""
        elif hi is None:
            rng = f" and {'>' if lo_open else '>='} {lo:g}"
        else:
            rng = f" in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ValueError(f"{name} must be finite{rng}, got {v}")
    return float(v)


def check_bool(v, name: str) -> bool:
    """``v`` must be a ``bool`` (numpy bools accepted; not a string or an int, which would be silently truthy)."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(v).__name__} {v!r}")
    return bool(v)


def nonfinite_names(named) -> list[str]:
    """Names of the floating-point tensors holding NaN or inf, from ``(name, tensor)`` pairs or a mapping (e.g.
    ``module.named_parameters()``, a state dict); integer and bool tensors are skipped. One reduction per tensor,
    read back once (a single device synchronisation)."""
    import torch

    items = list(named.items() if hasattr(named, "items") else named)
    flt = [(k, t) for k, t in items if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
    if not flt:
        return []
    dev = flt[0][1].device
    ok = torch.stack([torch.isfinite(t.detach()).all().to(dev) for _, t in flt]).tolist()
    return [k for (k, _), good in zip(flt, ok, strict=True) if not good]


def check_callable(v, name: str, what: str = "a callable"):
    """``v`` must be callable; raises ``TypeError`` naming ``name`` and ``what`` was expected."""
    if not callable(v):
        raise TypeError(f"{name} must be {what}, got {type(v).__name__}")
    return v


def check_instance(v, cls, name: str, what: str | None = None):
    """``v`` must be an instance of ``cls`` (a class or a tuple of classes); raises ``TypeError`` naming ``name``."""
    if not isinstance(v, cls):
        want = what or (" or ".join(c.__name__ for c in cls) if isinstance(cls, tuple) else cls.__name__)
        raise TypeError(f"{name} must be a {want}, got {type(v).__name__}")
    return v


def check_texts(texts, name: str = "texts") -> list[str]:
    """``texts`` must be a sequence of documents (``str``), not a single string; returns a list.

    A bare ``str`` is refused (iterating it would feed one character per document), as are non-string entries.
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{name} must be a list of documents (str), got a single {type(texts).__name__}; "
                        f"wrap it: [{name}]")
    try:
        out = list(texts)
    except TypeError:
        raise TypeError(f"{name} must be a list of documents (str), got {type(texts).__name__}") from None
    bad = [i for i, t in enumerate(out) if not isinstance(t, str)]
    if bad:
        raise TypeError(f"{name} must hold only str documents; entry {bad[0]} is {type(out[bad[0]]).__name__}")
    return out


def check_module(model, name: str = "model", *, loaded: bool = False):
    """``model`` must be a ``torch.nn.Module`` (``TypeError``); with ``loaded``, its parameters must not be on the
    meta device (``ValueError``: created without weights, e.g. under ``torch.device('meta')``)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{name} must be a torch.nn.Module (e.g. a transformers PreTrainedModel), got "
                        f"{type(model).__name__}")
    if loaded:
        meta = [n for n, p in model.named_parameters() if p.is_meta]
        if meta:
            raise ValueError(f"{name} ({type(model).__name__}) has {len(meta)} parameter(s) on the meta device "
                             f"(e.g. {meta[0]}): it was created without loading its weights (torch.device('meta'), "
                             "init_empty_weights(), device_map offloading); load the weights first")
    return model


#: Config attributes holding a model's maximum sequence length (learned or trained positions).
MAX_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_positions", "n_ctx")


def max_positions(model) -> int | None:
    """The longest sequence ``model`` takes, from its config (``max_position_embeddings``, ``n_positions``, ...),
    or None when the config names none (e.g. T5's relative positions)."""
    cfg = getattr(model, "config", None)
    text = getattr(cfg, "get_text_config", None)
    for c in (cfg, text() if callable(text) else None):
        for key in MAX_POSITION_KEYS:
            v = getattr(c, key, None) if c is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def vocab_size(model) -> int | None:
    """Rows of ``model``'s input embedding (``get_input_embeddings()``), or None if it has none."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        emb = get() if callable(get) else None
    except (NotImplementedError, AttributeError):
        emb = None
    n = getattr(emb, "num_embeddings", None)
    return int(n) if isinstance(n, int) else None


def check_token_ids(input_ids, name: str = "input_ids", model=None, attention_mask=None):
    """``input_ids`` must be an integer ``torch.Tensor [batch >= 1, seq >= 1]``; with ``model``, ids in
    ``[0, vocab)`` of its input embedding and ``seq`` within its maximum positions (:func:`max_positions`);
    ``attention_mask`` (optional) of the same shape holding only 0 and 1. Returns ``(input_ids, attention_mask)``.

    Raises ``TypeError`` (not an integer tensor) or ``ValueError`` (shape, range, positions, mask), naming the
    argument: a torch-internal ``IndexError`` from the embedding would not say which argument was wrong.
    """
    import torch

    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids [batch, seq], got {type(input_ids).__name__}")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {input_ids.dtype}")
    if input_ids.ndim != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"{name} must have shape [batch >= 1, seq >= 1], got {list(input_ids.shape)}")
    if model is not None:
        lo, hi = int(input_ids.min()), int(input_ids.max())
        vocab = vocab_size(model)
        if lo < 0 or (vocab is not None and hi >= vocab):
            raise ValueError(f"{name} holds token ids in [{lo}, {hi}], outside the {type(model).__name__}'s "
                             f"vocabulary [0, {vocab}): a tokenizer of another model?")
        n_pos = max_positions(model)
        if n_pos is not None and input_ids.shape[1] > n_pos:
            raise ValueError(f"{name} has sequences of {input_ids.shape[1]} tokens, more than the "
                             f"{type(model).__name__}'s {n_pos} positions (config); use a ctx_len <= {n_pos}")
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(f"attention_mask must be a torch.Tensor [batch, seq] or None, got "
                            f"{type(attention_mask).__name__}")
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask must have the shape of {name} {list(input_ids.shape)}, got "
                             f"{list(attention_mask.shape)}")
        if attention_mask.is_complex() or not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (token)")
    return input_ids, attention_mask


# ----------------------------------------------------------------------------- configuration fields
class Int:
    """Rule of :func:`check_fields`: an int (not a bool; numpy integers accepted) ``>= minimum`` (any int when
    ``minimum`` is None), or None with ``optional``. Messages as :func:`check_int`'s: ``TypeError`` "``name`` must
    be an int, got float 2.0", ``ValueError`` "``name`` must be >= 1, got 0" (``range_what`` words the latter
    instead, e.g. ``"positive (an int >= 1)"``). With ``what`` (e.g. ``"a positive int"``) every refusal is one
    ``ValueError`` "``name`` must be ``what``, got ``v!r``"."""

    def __init__(self, minimum: int | None = 1, *, what: str | None = None, range_what: str | None = None,
                 optional: bool = False):
        self.minimum, self.what, self.range_what, self.optional = minimum, what, range_what, optional

    def __call__(self, v, name: str):
        if v is None and self.optional:
            return
        not_int = isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer))
        if self.what is not None:
            if not_int or (self.minimum is not None and v < self.minimum):
                raise ValueError(f"{name} must be {self.what}, got {v!r}")
        elif self.range_what is not None and not not_int and self.minimum is not None and v < self.minimum:
            raise ValueError(f"{name} must be {self.range_what}, got {v}")
        else:
            check_int(v, name, minimum=self.minimum)


class Real:
    """Rule of :func:`check_fields`: a finite real number (not a bool) in ``[lo, hi]`` (``(lo, ...`` with
    ``lo_open``; ``..., hi)`` with ``hi_open``). Messages as :func:`check_real`'s (``TypeError`` "``name`` must be a
    real number, got str '1'", ``ValueError`` "``name`` must be finite and > 0, got -1.0"); ``range_what`` words
    the refusals of a finite value instead ("lr must be > 0, got -1.0") and a non-finite one reads "must be
    finite"; with ``what`` every refusal is one ``ValueError`` "``name`` must be ``what``, got ``v!r``"."""

    def __init__(self, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                 hi_open: bool = False, what: str | None = None, range_what: str | None = None):
        self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open
        self.what, self.range_what = what, range_what

    def _outside(self, v) -> bool:
        lo, hi = self.lo, self.hi
        return ((lo is not None and (v <= lo if self.lo_open else v < lo))
                or (hi is not None and (v >= hi if self.hi_open else v > hi)))

    def __call__(self, v, name: str):
        not_real = isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating))
        if self.what is not None:
            if not_real or not math.isfinite(v) or self._outside(v):
                raise ValueError(f"{name} must be {self.what}, got {v!r}")
            return
        if self.range_what is not None and not not_real:
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v}")
            if self._outside(v):
                raise ValueError(f"{name} must be {self.range_what}, got {v}")
            return
        check_real(v, name, self.lo, self.hi, lo_open=self.lo_open)
        if self.hi_open and v >= self.hi:
            raise ValueError(f"{name} must be < {self.hi:g}, got {v}")


class Bool:
    """Rule of :func:`check_fields`: ``True`` or ``False`` (numpy bools accepted): ``TypeError`` "``name`` must be
    ``what``, got ``type v!r``" (a string or an int would be silently truthy)."""

    def __init__(self, what: str = "a bool"):
        self.what = what

    def __call__(self, v, name: str):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name} must be {self.what}, got {type(v).__name__} {v!r}")


class OneOf:
    """Rule of :func:`check_fields`: one of ``choices`` (a tuple or list, printed as given): ``ValueError``
    "``name`` must be one of ('a', 'b', 'c'), got 'd'"; with ``either`` (two choices) "must be 'a' or 'b'"."""

    def __init__(self, choices, *, either: bool = False):
        if either and len(choices) != 2:
            raise ValueError(f"either=True needs two choices, got {choices!r}")
        self.choices, self.either = choices, either

    def __call__(self, v, name: str):
        try:
            ok = v in self.choices
        except TypeError:  # an unhashable value
            ok = False
        if not ok:
            want = f"{self.choices[0]!r} or {self.choices[1]!r}" if self.either else f"one of {self.choices}"
            raise ValueError(f"{name} must be {want}, got {v!r}")


def check_fields(obj, rules: Mapping) -> None:
    """Check the fields of a configuration ``obj`` against declared ``rules``: ``{field or tuple of fields: rule}``
    with the rules :class:`Int`, :class:`Real`, :class:`Bool`, :class:`OneOf` (or any callable ``rule(value,
    name)`` that raises). The one mechanism every configuration dataclass's ``__post_init__`` uses for its
    per-field checks, in the order declared; checks across fields follow it in the ``__post_init__``. Each
    message names the field and what was expected."""
    for names, rule in rules.items():
        for name in (names,) if isinstance(names, str) else names:
            rule(getattr(obj, name), name)


def replace_fields(cfg, cls: type, what: str, /, **kw):
    """``dataclasses.replace(cfg, **kw)`` for a ``cfg`` of dataclass ``cls`` (``TypeError`` naming ``what``, e.g.
    ``"an SPDConfig"``, otherwise) that rejects field names ``cls`` does not have with a ``ValueError``."""
    if not isinstance(cfg, cls):
        raise TypeError(f"cfg must be {what}, got {type(cfg).__name__}")
    unknown = set(kw) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}")
    return dataclasses.replace(cfg, **kw)
