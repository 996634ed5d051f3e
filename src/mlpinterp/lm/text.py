"""Real text for language-model activations: corpora on disk and token chunks with the model's special tokens.

Used by every consumer of model activations (SAE training in :mod:`mlpinterp.sae`, FFN-block inputs in
:mod:`mlpinterp.lm.capture`). Text is tokenised with the model's own tokenizer and cut into chunks of ``ctx_len``
tokens including the tokenizer's special-token template (``[CLS] ... [SEP]`` for BERT, nothing for GPT-2).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from mlpinterp.utils.validation import check_int, check_texts

DEFAULT_TEXT_DIR = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "text"
"""``<repo>/../shared/data/text`` (the project's bundled corpora)."""


def read_texts(paths: Sequence[str | os.PathLike] | str | os.PathLike | None = None) -> list[str]:
    """Read text files (a directory means all its ``*.txt``, sorted); default: the bundled corpora.

    Raises ``FileNotFoundError`` for missing files, ``ValueError`` for a directory without ``*.txt`` files and
    ``TypeError`` for ``paths`` that are not a path or a list of paths.
    """
    if paths is None:
        paths = DEFAULT_TEXT_DIR
    if not isinstance(paths, (str, os.PathLike)) and (isinstance(paths, bytes) or not hasattr(paths, "__iter__")):
        raise TypeError(f"paths must be a file or directory path or a list of paths, got {type(paths).__name__}")
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


def split_files(text_dir: str | os.PathLike | None = None) -> tuple[list[Path], list[Path]]:
    """``(train files, held-out files)`` of a directory of ``*.txt`` documents (default: the bundled corpora).

    The held-out documents are the files with ``test`` in their name (wikitext-2 test among the bundled corpora),
    or the last file when none has; the others train (all of them when the directory holds one file). Every
    consumer of the corpora (SAE training and evaluation, the causal LM of :mod:`mlpinterp.lm.train`) splits here,
    so a model is never evaluated on documents it, or the tokenizer, was trained on.

    Raises ``FileNotFoundError`` if ``text_dir`` is not a directory and ``ValueError`` if it holds no ``*.txt``.
    """
    d = Path(text_dir) if text_dir is not None else DEFAULT_TEXT_DIR
    if not d.is_dir():
        raise FileNotFoundError(f"text directory {str(d)!r} is not a directory")
    files = sorted(d.glob("*.txt"))
    if not files:
        raise ValueError(f"text directory {str(d)!r} holds no *.txt files")
    held = [f for f in files if "test" in f.name] or files[-1:]
    train = [f for f in files if f not in held] or files
    return train, held


def special_template(tokenizer) -> tuple[list[int], list[int]]:
    """(prefix, suffix) token ids the tokenizer adds around a text, e.g. ``([CLS], [SEP])`` or ``([], [])``."""
    with_sp = list(tokenizer("a")["input_ids"])
    without = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for i in range(len(with_sp) - len(without) + 1):
        if with_sp[i:i + len(without)] == without:
            return with_sp[:i], with_sp[i + len(without):]
    return [], []


def content_length(tokenizer, ctx_len: int) -> int:
    """Content tokens per ``ctx_len``-token chunk: ``ctx_len`` minus the special template's tokens (>= 1).

    Raises ``TypeError`` for a non-int ``ctx_len`` or a tokenizer that is not callable, ``ValueError`` when
    ``ctx_len`` leaves no room for content (``ctx_len <= 2`` for BERT's ``[CLS] ... [SEP]``).
    """
    ctx_len = check_int(ctx_len, "ctx_len", minimum=1)
    if not callable(tokenizer):
        raise TypeError(f"tokenizer must be a Hugging Face tokenizer (callable), got {type(tokenizer).__name__}")
    prefix, suffix = special_template(tokenizer)
    body = ctx_len - len(prefix) - len(suffix)
    if body < 1:
        raise ValueError(f"ctx_len must exceed the {len(prefix) + len(suffix)} special tokens the tokenizer adds "
                         f"to every sequence, got {ctx_len}")
    return body


def token_chunks(tokenizer, texts: Sequence[str], ctx_len: int, max_chunks: int | None = None) -> Tensor:
    """Tokenise ``texts`` (a list of documents) and cut them into ``[n_chunks, ctx_len]`` int64 chunks with the
    special template; at most ``max_chunks`` (>= 1) chunks if given.

    Raises ``TypeError`` for ``texts`` that are not a list of ``str`` (a bare string included) or non-int
    ``ctx_len`` / ``max_chunks``, ``ValueError`` if ``ctx_len`` leaves no room for content tokens
    (:func:`content_length`) or the texts are too short.
    """
    texts = check_texts(texts)
    if max_chunks is not None:
        max_chunks = check_int(max_chunks, "max_chunks", minimum=1)
    body = content_length(tokenizer, ctx_len)
    prefix, suffix = special_template(tokenizer)
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


def texts_digest(texts: Sequence[str]) -> str:
    """A fingerprint of a list of documents (16 hex characters, BLAKE2b of their UTF-8 bytes with lengths): the
    same corpus in the same order gives the same digest. Raises ``TypeError`` for anything but a list of ``str``."""
    import hashlib

    h = hashlib.blake2b(digest_size=8)
    for t in check_texts(texts):
        b = t.encode("utf-8", errors="surrogatepass")
        h.update(f"{len(b)};".encode())
        h.update(b)
    return h.hexdigest()
