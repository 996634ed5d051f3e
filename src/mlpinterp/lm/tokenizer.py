"""A GPT-2-style byte-level BPE tokenizer trained on documents with the ``tokenizers`` package.

Byte-level pre-tokenisation (GPT-2's regex, no prefix space), byte-level decoding, one special token
``<|endoftext|>`` (id 0: GPT-2's bos / eos / unk; nothing is added around a text, as for GPT-2), every one of the
256 bytes in the initial alphabet (any text encodes, no unknown token). Wrapped as a Hugging Face fast tokenizer,
so ``save_pretrained`` writes ``tokenizer.json`` + ``tokenizer_config.json`` and ``AutoTokenizer.from_pretrained``
reads them back. Training is deterministic: the same documents give the same vocabulary and merges.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from mlpinterp.utils.validation import check_int, check_texts

EOS = "<|endoftext|>"
"""GPT-2's end-of-text token, the tokenizer's only special token."""


def train_tokenizer(texts: Sequence[str], vocab_size: int, min_frequency: int = 2):
    """A ``transformers`` fast tokenizer with a byte-level BPE vocabulary of ``vocab_size`` learned on ``texts``.

    ``vocab_size`` counts the 256 byte tokens and ``<|endoftext|>``; a corpus with fewer distinct merges of
    ``min_frequency`` occurrences gives a smaller vocabulary (``len(tokenizer)`` says how many). Raises
    ``TypeError`` for ``texts`` that are not a list of ``str`` and ``ValueError`` for ``vocab_size < 257``, a
    ``min_frequency < 1`` or texts without any character.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = check_texts(texts)
    vocab_size = check_int(vocab_size, "vocab_size", minimum=257)
    min_frequency = check_int(min_frequency, "min_frequency", minimum=1)
    if not any(texts):
        raise ValueError("texts hold no characters to train a tokenizer on")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS)


def tokenizer_digest(tokenizer) -> str:
    """A fingerprint (16 hex characters) of a fast tokenizer's vocabulary, merges and settings
    (BLAKE2b of its ``tokenizer.json`` text): the same trained tokenizer gives the same digest."""
    return hashlib.blake2b(tokenizer.backend_tokenizer.to_str().encode(), digest_size=8).hexdigest()
