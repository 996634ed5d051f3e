"""The one test of "does this model predict the next token" (lm.recovery.is_causal_lm), on tiny models built here."""

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from mlpinterp.lm.recovery import downstream_comparison, is_causal_lm  # noqa: E402


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16,
                                                                vocab_size=50))


def _bert_config(**kw):
    return transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, vocab_size=50, max_position_embeddings=16, **kw)


def test_causal_lms_are_causal():
    assert is_causal_lm(_gpt2())
    assert is_causal_lm(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=50)))
    assert is_causal_lm(transformers.BertLMHeadModel(_bert_config(is_decoder=True)))  # BERT as a decoder


def test_encoders_and_masked_lms_are_not():
    assert not is_causal_lm(transformers.BertModel(_bert_config()))  # no head: sentence embeddings
    assert not is_causal_lm(_gpt2().transformer)  # the GPT-2 body without its head
    # an LM head whose logits fill in masked tokens, not next tokens
    assert not is_causal_lm(transformers.BertForMaskedLM(_bert_config()))


def test_plain_modules():
    class WithHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = nn.Linear(4, 10)

    assert is_causal_lm(WithHead())
    assert not is_causal_lm(nn.Linear(4, 4))


def test_downstream_comparison_branches_on_it():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 8))
    assert downstream_comparison(_gpt2(), {}, ids)["kind"] == "lm"
    assert downstream_comparison(transformers.BertModel(_bert_config()), {}, ids)["kind"] == "embedding"
