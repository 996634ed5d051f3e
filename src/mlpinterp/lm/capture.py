"""The real inputs of a transformer's FFN blocks, captured from text in one forward pass per batch.

For each FFN block (an :class:`~mlpinterp.hf.blocks.FFNSite`) the tensor read is the one the block receives:
the first argument of its ``input_module`` (for post-LN BERT the attention output after its LayerNorm; for pre-LN
GPT-2 / Llama the output of the block's LayerNorm). One forward pass feeds every requested block; it stops right
after the deepest one.

Text (the bundled corpora by default) is tokenised with the model's tokenizer and cut into ``ctx_len``-token
sequences (:func:`mlpinterp.lm.text.token_chunks`). Consecutive sequences of one file are grouped into
*passages* of ``passage_chunks`` sequences; the fit / held-out split is by passage (seeded), so no held-out token
shares a passage with a fit token. Special tokens are excluded by default.

Moments are accumulated as float64 sums (:class:`Moments`) over every fit token, so a capture split across
``torchrun`` processes (each reads sequences ``rank, rank + world, ...``) all-reduces to exactly the moments of a
single-process capture. Up to ``keep_fit`` fit activations per block are kept (a seeded uniform subsample) for
the sample-based fits; every held-out activation is kept.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from mlpinterp.lm.capture_config import CaptureConfig
from mlpinterp.lm.hooks import resolve_hook_point
from mlpinterp.lm.text import content_length, read_texts, token_chunks
from mlpinterp.utils.modes import eval_mode
from mlpinterp.utils.validation import (
    check_instance,
    check_int,
    check_module,
    check_shape,
    check_texts,
    max_positions,
    to_numpy,
    vocab_size,
)


@dataclass
class Moments:
    """Float64 sums of the fit activations of one block: ``n``, ``s1 = sum x [d]``, ``s2 = sum x x^T [d, d]``.

    Sums (not means) so that captures on several processes combine exactly (:meth:`all_reduce`).
    Raises ``TypeError``/``ValueError`` for a negative or non-int ``n``, non-finite sums or shapes other than
    ``s1 [d >= 1]``, ``s2 [d, d]``.
    """

    n: int
    s1: np.ndarray
    s2: np.ndarray

    def __post_init__(self) -> None:
        self.n = check_int(self.n, "n", minimum=0)
        self.s1 = to_numpy(self.s1, "s1")
        if self.s1.ndim != 1 or self.s1.shape[0] < 1:
            raise ValueError(f"s1 must have shape [d >= 1], got {list(self.s1.shape)}")
        d = self.s1.shape[0]
        self.s2 = check_shape(to_numpy(self.s2, "s2"), "s2", (d, d))

    @classmethod
    def zeros(cls, d: int) -> Moments:
        """Empty sums of dimension ``d >= 1``."""
        d = check_int(d, "d", minimum=1)
        return cls(0, np.zeros(d), np.zeros((d, d)))

    def add(self, X) -> None:
        """Accumulate a batch ``X [m, d]`` (numpy or torch, any real dtype; summed in float64).

        Raises ``TypeError``/``ValueError`` naming ``X`` for a non-numeric, non-finite or mis-shaped batch.
        """
        X = check_shape(to_numpy(X, "X"), "X", (None, self.s1.shape[0]))
        self.n += X.shape[0]
        self.s1 += X.sum(0)
        self.s2 += X.T @ X

    def all_reduce(self) -> Moments:
        """Sum over the processes of the default ``torch.distributed`` group (no-op when not initialised)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            buf = torch.from_numpy(np.concatenate([[float(self.n)], self.s1, self.s2.ravel()]))
            dist.all_reduce(buf)
            b = buf.numpy()
            d = self.s1.shape[0]
            self.n, self.s1, self.s2 = int(round(b[0])), b[1:1 + d].copy(), b[1 + d:].reshape(d, d).copy()
        return self

    @property
    def mean(self) -> np.ndarray:
        """``[d]`` (raises ``ValueError`` when no token was added)."""
        if self.n < 1:
            raise ValueError("the mean of the FFN inputs needs at least 1 fit token, got 0")
        return self.s1 / self.n

    def cov(self) -> np.ndarray:
        """Unbiased covariance ``[d, d]`` (raises ``ValueError`` for fewer than ``d + 1`` tokens)."""
        d = self.s1.shape[0]
        if self.n < d + 1:
            raise ValueError(f"a covariance of a {d}-dimensional FFN input needs at least d + 1 = {d + 1} fit tokens, "
                             f"got {self.n}; give more text (or a larger max_tokens)")
        m = self.mean
        C = (self.s2 - self.n * np.outer(m, m)) / (self.n - 1)
        return 0.5 * (C + C.T)


@dataclass
class BlockCapture:
    """What was read at one FFN block."""

    fit: Tensor
    """Kept fit activations ``[n_kept, d_in]`` (float32, a uniform subsample of at most ``keep_fit``)."""

    heldout: Tensor
    """All held-out activations ``[n_heldout, d_in]`` (float32)."""

    moments: Moments
    """Sums over every fit token (float64)."""


@dataclass
class Capture:
    """FFN inputs of several blocks of one model, and the token sequences they came from."""

    blocks: dict[str, BlockCapture]
    """FFN path -> what was read there."""

    fit_ids: Tensor
    """Fit sequences ``[n_fit_seq, ctx_len]`` (this process's share)."""

    heldout_ids: Tensor
    """Held-out sequences ``[n_heldout_seq, ctx_len]`` (this process's share), for splice-in evaluation."""

    n_fit_tokens: int
    """Fit tokens seen (all processes)."""

    n_heldout_tokens: int
    """Held-out tokens (this process)."""

    seconds: float
    """Wall time of the forward passes."""

    info: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """Content tokens captured per second of forward passes (this process)."""
        n = self.info.get("local_tokens", self.n_fit_tokens + self.n_heldout_tokens)
        return n / self.seconds if self.seconds > 0 else float("nan")


class _Stop(Exception):
    pass


def split_passages(n_chunks: int, file_of_chunk: np.ndarray, cfg: CaptureConfig) -> tuple[np.ndarray, np.ndarray]:
    """Seeded passage split: indices of fit chunks and held-out chunks (each in a seeded passage order).

    Passages are runs of ``passage_chunks`` consecutive chunks of one file. The number of chunks used is capped so
    that about ``max_tokens`` content tokens are read. Raises ``ValueError`` when there are fewer than 2 passages.
    """
    starts = [0] + [i for i in range(1, n_chunks) if file_of_chunk[i] != file_of_chunk[i - 1]]
    passages: list[np.ndarray] = []
    for s, e in zip(starts, starts[1:] + [n_chunks], strict=True):
        for p in range(s, e, cfg.passage_chunks):
            passages.append(np.arange(p, min(p + cfg.passage_chunks, e)))
    if len(passages) < 2:
        raise ValueError(f"the text yields {len(passages)} passage(s) of {cfg.passage_chunks} sequences of "
                         f"{cfg.ctx_len} tokens; a fit / held-out split needs at least 2: give more text or lower "
                         "passage_chunks / ctx_len")
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(len(passages))
    n_held = min(max(1, int(round(cfg.heldout_fraction * len(passages)))), len(passages) - 1)
    held = [passages[i] for i in order[:n_held]]
    fit = [passages[i] for i in order[n_held:]]
    return np.concatenate(fit), np.concatenate(held)


def _ffn_input_modules(model) -> list[str]:
    """The input module (first projection) of every FFN block of ``model``, for messages."""
    from mlpinterp.hf.blocks import ffn_paths
    from mlpinterp.hf.layouts import match_layout

    out = []
    for p in ffn_paths(model):
        try:
            layout = match_layout(model.get_submodule(p))
        except AttributeError:  # an expert of a fused-experts module: its input is that module's
            out.append(p.rpartition(".")[0])
            continue
        out.append(f"{p}.{layout.projections[0]}")
    return out


def _input_module(model: nn.Module, path, module_path) -> nn.Module:
    """The module at ``module_path``, which must be a projection (``nn.Linear`` / ``Conv1D``: a 2-D weight): the
    first projection of an FFN block receives exactly the block's input."""
    if not isinstance(path, str) or not path:
        raise TypeError(f"input_modules keys must be non-empty FFN paths (str), got {path!r}")
    if not isinstance(module_path, str) or not module_path:
        raise TypeError(f"input_modules[{path!r}] must be a module path (str) such as FFNSite.input_module, got "
                        f"{module_path!r}")
    mod = resolve_hook_point(model, module_path)
    w = getattr(mod, "weight", None)
    if not (isinstance(w, Tensor) and w.ndim == 2 and w.is_floating_point()) or isinstance(mod, nn.Embedding):
        found = _ffn_input_modules(model)
        shown = ", ".join(found[:4]) + (f", ... ({len(found)} blocks)" if len(found) > 4 else "") if found else "none found"
        raise ValueError(f"input_modules[{path!r}] = {module_path!r} is a {type(mod).__name__}, not the first "
                         "projection of an FFN block (an nn.Linear / Conv1D whose input is the block's input; pass "
                         f"FFNSite.input_module); FFN input modules of this {type(model).__name__}: {shown}")
    return mod


def _as_token_major(x: Tensor, ids: Tensor, path: str, module_path: str) -> Tensor:
    """``x`` as ``[batch, seq, d]`` aligned with ``ids [batch, seq]`` (OPT flattens to ``[batch * seq, d]``)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError(f"the input of {module_path!r} (FFN block {path!r}) is not a floating-point tensor "
                         f"({getattr(x, 'dtype', type(x).__name__)})")
    if x.ndim >= 2 and tuple(x.shape[:-1]) == tuple(ids.shape):
        return x
    if x.ndim == 2 and x.shape[0] == ids.numel():
        return x.reshape(*ids.shape, x.shape[-1])
    raise ValueError(f"the input of {module_path!r} (FFN block {path!r}) has shape {list(x.shape)}, not one vector "
                     f"per token of the batch {list(ids.shape)} ([batch, seq, d] or [batch * seq, d]): it is not "
                     "an FFN block's input (a pooler or a head?)")


def _content_mask(ids: Tensor, special: Tensor, exclude_special: bool) -> Tensor:
    return ~torch.isin(ids, special) if exclude_special else torch.ones_like(ids, dtype=torch.bool)


@torch.no_grad()
def capture_ffn_inputs(model: nn.Module, tokenizer, input_modules: dict[str, str], cfg: CaptureConfig = CaptureConfig(),
                       texts: Sequence[str] | None = None, *, quiet: bool = False) -> Capture:
    """Read the inputs of the FFN blocks ``input_modules`` (FFN path -> input-module path) from real text.

    Parameters
    ----------
    model : a Hugging Face model (called as ``model(input_ids=..., attention_mask=...)``); it runs in eval mode
        (dropout off) for the capture, whatever mode it is in (:func:`mlpinterp.utils.modes.eval_mode`).
    tokenizer : its tokenizer.
    input_modules : e.g. ``{"encoder.layer.3": "encoder.layer.3.intermediate.dense"}``
        (:attr:`~mlpinterp.hf.blocks.FFNSite.input_module` of each block).
    cfg : :class:`CaptureConfig`.
    texts : documents (default: the bundled corpora, :func:`mlpinterp.lm.text.read_texts`).
    quiet : no progress bar.

    Under ``torch.distributed`` each process reads every ``world``-th fit and held-out sequence; the moments are
    all-reduced, the kept activations and held-out sequences stay local.

    Raises
    ------
    TypeError : ``model`` not a ``torch.nn.Module``, ``input_modules`` not a dict of module paths, ``cfg`` not a
        :class:`CaptureConfig`, ``texts`` not a list of ``str``, a tokenizer that is not callable.
    ValueError : an unknown module path or one that is not an FFN block's first projection (an attention module, a
        whole layer: the message lists the model's FFN input modules), meta-device weights, ``ctx_len`` beyond the
        model's positions or not above the tokenizer's special tokens, token ids outside the model's vocabulary
        (another model's tokenizer), text too short for a split, a block that was not called or whose input is not
        ``[batch, seq, d]``, NaN/inf activations.
    """
    import torch.distributed as dist

    from mlpinterp.utils.progress import progress_bar

    check_module(model, loaded=True)
    check_instance(cfg, CaptureConfig, "cfg")
    if not isinstance(input_modules, dict):
        raise TypeError(f"input_modules must be a dict FFN path -> input-module path (FFNSite.input_module), got "
                        f"{type(input_modules).__name__}")
    if not input_modules:
        raise ValueError("input_modules must name at least one FFN block")
    modules = {path: _input_module(model, path, mod) for path, mod in input_modules.items()}
    n_pos = max_positions(model)
    if n_pos is not None and cfg.ctx_len > n_pos:
        raise ValueError(f"ctx_len={cfg.ctx_len} exceeds the {type(model).__name__}'s {n_pos} positions (config); "
                         f"use ctx_len <= {n_pos}")
    content_length(tokenizer, cfg.ctx_len)  # ctx_len must leave room for content beside the special tokens
    if not isinstance(getattr(tokenizer, "all_special_ids", None), (list, tuple)):
        raise TypeError(f"tokenizer must be a Hugging Face tokenizer (with all_special_ids), got "
                        f"{type(tokenizer).__name__}")
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    texts = check_texts(texts) if texts is not None else read_texts()
    per_file = []
    for text in texts:
        try:
            per_file.append(token_chunks(tokenizer, [text], cfg.ctx_len))
        except ValueError:  # a document shorter than one sequence
            continue
    if not per_file:
        raise ValueError(f"the text holds no document of at least ctx_len={cfg.ctx_len} tokens")
    chunks = torch.cat(per_file)
    vocab = vocab_size(model)
    if vocab is not None and int(chunks.max()) >= vocab:
        raise ValueError(f"the tokenizer ({type(tokenizer).__name__}) gives token ids up to {int(chunks.max())}, "
                         f"beyond the {type(model).__name__}'s vocabulary of {vocab}: pass the model's own tokenizer")
    file_of = np.concatenate([np.full(c.shape[0], i) for i, c in enumerate(per_file)])
    fit_idx, held_idx = split_passages(chunks.shape[0], file_of, cfg)
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=chunks.dtype)
    content = float(_content_mask(chunks[:64], special, cfg.exclude_special).sum()) / min(64, chunks.shape[0])
    n_seq = max(2, int(np.ceil(cfg.max_tokens / max(content, 1.0))))
    n_held_seq = max(1, int(round(cfg.heldout_fraction * n_seq)))
    fit_idx, held_idx = fit_idx[: max(1, n_seq - n_held_seq)], held_idx[:n_held_seq]
    fit_ids, held_ids = chunks[fit_idx[rank::world]], chunks[held_idx[rank::world]]
    if fit_ids.shape[0] == 0 or held_ids.shape[0] == 0:
        raise ValueError(f"process {rank} of {world} gets no fit or no held-out sequence; give more text")

    store: dict[str, Tensor] = {}
    stop_after: list[str] = []  # the block read last, learnt in the first forward pass (later passes stop there)

    def make_hook(path: str):
        def pre_hook(_mod, args, kwargs):
            x = args[0] if args else next(iter(kwargs.values()))
            store[path] = x.detach()
            if stop_after and path == stop_after[0] and len(store) == len(modules):
                raise _Stop

        return pre_hook

    handles = [m.register_forward_pre_hook(make_hook(p), with_kwargs=True) for p, m in modules.items()]
    rng = np.random.default_rng(cfg.seed + 1 + rank)
    device = next(model.parameters()).device
    d_of: dict[str, int] = {}
    moments: dict[str, Moments] = {}
    kept: dict[str, list[Tensor]] = {p: [] for p in modules}
    held: dict[str, list[Tensor]] = {p: [] for p in modules}
    n_local = 0
    t0 = time.perf_counter()
    try:
        total = fit_ids.shape[0] + held_ids.shape[0]
        with progress_bar(total=total, desc="capture FFN inputs (sequences)", quiet=quiet) as bar:
            for split, ids_all in (("fit", fit_ids), ("heldout", held_ids)):
                n_fit_total = fit_ids.shape[0] * content
                keep_p = min(1.0, cfg.keep_fit / max(n_fit_total, 1.0))
                for s in range(0, ids_all.shape[0], cfg.seq_batch):
                    ids = ids_all[s:s + cfg.seq_batch]
                    store.clear()
                    try:
                        with eval_mode(model):
                            model(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device))
                    except _Stop:
                        pass
                    missing = [p for p in modules if p not in store]
                    if missing:
                        raise ValueError(f"FFN input module(s) {[input_modules[p] for p in missing]} were not called in "
                                         "the forward pass")
                    if not stop_after:
                        stop_after.append(list(store)[-1])
                    mask = _content_mask(ids, special, cfg.exclude_special)
                    n_local += int(mask.sum())
                    sel = rng.random(int(mask.sum())) < keep_p if split == "fit" else None
                    for p, x in store.items():
                        x = _as_token_major(x, ids, p, input_modules[p])
                        a = x[mask.to(x.device)].to("cpu", torch.float64)
                        if not bool(torch.isfinite(a).all()):
                            raise ValueError(
                                f"the input of FFN block {p!r} ({input_modules[p]}) holds {int((~torch.isfinite(a)).sum())}"
                                f" non-finite value(s) (NaN or inf) in a batch of {x.dtype} activations: NaN weights, or a "
                                "float16 model overflowing (load it in float32 or bfloat16)")
                        if p not in moments:
                            d_of[p] = a.shape[-1]
                            moments[p] = Moments.zeros(a.shape[-1])
                        if split == "fit":
                            moments[p].add(a.numpy())
                            kept[p].append(a[torch.from_numpy(sel)].float())
                        else:
                            held[p].append(a.float())
                    bar.advance(ids.shape[0])
    finally:
        for h in handles:
            h.remove()
    seconds = time.perf_counter() - t0
    blocks = {}
    for p in modules:
        m = moments[p].all_reduce()
        if m.n < m.s1.shape[0] + 1:
            raise ValueError(f"FFN block {p!r}: {m.n} fit tokens captured, but a covariance of its {m.s1.shape[0]}-"
                             f"dimensional input needs at least d + 1 = {m.s1.shape[0] + 1}; raise max_tokens (now "
                             f"{cfg.max_tokens}) or give more text")
        blocks[p] = BlockCapture(fit=torch.cat(kept[p])[: cfg.keep_fit], heldout=torch.cat(held[p]), moments=m)
    first = next(iter(blocks.values()))
    return Capture(blocks=blocks, fit_ids=fit_ids, heldout_ids=held_ids, n_fit_tokens=first.moments.n,
                   n_heldout_tokens=first.heldout.shape[0], seconds=seconds,
                   info={"local_tokens": n_local, "rank": rank, "world": world, "n_files": len(per_file),
                         "content_per_seq": content})
