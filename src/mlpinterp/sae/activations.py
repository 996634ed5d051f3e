"""Activations of any torch module at a hook point, fed by real text, shuffled and optionally cached.

Hook points are module paths (:mod:`mlpinterp.lm.hooks`); positions holding special tokens ([CLS], [SEP],
padding) are dropped by default; text is chunked by :func:`mlpinterp.lm.text.token_chunks`. Activations go
through a shuffle buffer (``buffer_size`` activations: fill, permute, emit half) so consecutive batches mix many
documents. With ``cache_dir``, the first pass writes ``shard_XXXXX.safetensors`` files (+ ``manifest.json``
last) and later passes read them instead of running the model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from mlpinterp.lm.hooks import hook_activations, resolve_hook_point
from mlpinterp.lm.text import read_texts, token_chunks
from mlpinterp.utils.artifact import load_artifact, load_json_artifact, save_artifact, save_json_artifact
from mlpinterp.utils.seeding import torch_generator
from mlpinterp.utils.validation import Bool, Int, check_fields


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
        check_fields(self, {("ctx_len", "seq_batch", "batch_size", "buffer_size"): Int(1),
                            "max_chunks": Int(1, what="a positive int or None", optional=True),
                            "exclude_special": Bool(), "seed": Int(0)})


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
        g = torch_generator(self.cfg.seed, "chunk-order", epoch)
        order = torch.randperm(self.chunks.shape[0], generator=g)
        for s in range(0, len(order), self.cfg.seq_batch):
            ids = self.chunks[order[s:s + self.cfg.seq_batch]]
            acts = hook_activations(self.model, self.cfg.hook_point, ids, torch.ones_like(ids))
            keep = ~self._special_mask(ids) if self.cfg.exclude_special else torch.ones_like(ids, dtype=torch.bool)
            yield acts[keep.to(acts.device)].float().cpu()

    def _cached_stream(self, epoch: int) -> Iterator[Tensor]:
        manifest = self.cache_dir / "manifest.json" if self.cache_dir else None
        if manifest is not None and manifest.exists():
            fix = f"delete the cache directory {str(self.cache_dir)!r}: the next pass over the model rebuilds it"
            meta = load_json_artifact(manifest, kind="activation_cache", fix=fix).meta
            if meta.get("cfg", {}).get("hook_point") != self.cfg.hook_point:
                raise ValueError(f"cache {str(self.cache_dir)!r} holds hook point {meta['cfg'].get('hook_point')!r}, "
                                 f"not {self.cfg.hook_point!r}")
            g = torch_generator(self.cfg.seed, "chunk-order", epoch)
            for i in torch.randperm(int(meta["n_shards"]), generator=g).tolist():
                shard = load_artifact(self.cache_dir / f"shard_{i:05d}.safetensors", kind="activation_shard",
                                      provenance={"hook_point": self.cfg.hook_point}, fix=fix)
                yield shard.tensors["acts"].float()
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
                self._save_shard(n_shards, pending)
                n_shards, total, pending, n_pending = n_shards + 1, total + n_pending, [], 0
        if pending:
            self._save_shard(n_shards, pending)
            n_shards, total = n_shards + 1, total + n_pending
        save_json_artifact(self.cache_dir / "manifest.json", {"n_shards": n_shards, "n_activations": total,
                                                              "cfg": asdict(self.cfg), "dtype": "float16"},
                           kind="activation_cache", provenance={"hook_point": self.cfg.hook_point})

    def _save_shard(self, i: int, pending: list[Tensor]) -> None:
        """Write shard ``i`` of the cache: the activations of ``pending`` as float16 ``[n, d_in]``."""
        save_artifact(self.cache_dir / f"shard_{i:05d}.safetensors", {"acts": torch.cat(pending).half()},
                      kind="activation_shard", provenance={"hook_point": self.cfg.hook_point, "shard": i})

    def __iter__(self) -> Iterator[Tensor]:
        """Endless stream of shuffled ``[batch_size, d_in]`` batches (passes over the corpus repeat, each in a
        new chunk order). Raises ``ValueError`` if a pass yields no activation at all."""
        cfg = self.cfg
        g = torch_generator(cfg.seed, "shuffle")
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
