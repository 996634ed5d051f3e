"""More Hugging Face families through ``from_hf`` / ``ffn_site``: BLOOM, DistilBERT, Phi-2, Falcon, GPT-BigCode, and
the experts of transformers-5 mixture-of-experts layers (Mixtral, Qwen-MoE), each against the module's own forward.

Oracles: the block's own forward on random float64 inputs (BLOOM's with a zero residual), and for the experts the
whole mixture-of-experts layer's own forward, rebuilt from the imported experts, the layer's own router and (Qwen)
its shared expert. Tiny random configs (d_model 16), float64, built locally.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import mlpinterp as mi  # noqa: E402

D = 16
T = transformers


def _randomise(model):
    torch.manual_seed(0)
    model = model.double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn_like(p))
    return model


# family -> (model builder, path, block path, own forward on x, model_type, convention, gated)
PLAIN = {
    "bloom": (lambda: T.BloomModel(T.BloomConfig(hidden_size=D, n_layer=2, n_head=2, vocab_size=50)),
              "h.1.mlp", "h.1.mlp", lambda b, x: b(x, torch.zeros_like(x)), "bloom", "bloom"),
    "distilbert": (lambda: T.DistilBertModel(T.DistilBertConfig(dim=D, hidden_dim=24, n_layers=2, n_heads=2,
                                                                vocab_size=50)),
                   "transformer.layer.1.ffn", "transformer.layer.1.ffn", lambda b, x: b(x), "distilbert",
                   "distilbert"),
    "phi": (lambda: T.PhiModel(T.PhiConfig(hidden_size=D, intermediate_size=24, num_hidden_layers=2,
                                           num_attention_heads=2, vocab_size=50)),
            "layers.1.mlp", "layers.1.mlp", lambda b, x: b(x), "phi", "opt"),
    "falcon": (lambda: T.FalconModel(T.FalconConfig(hidden_size=D, num_hidden_layers=2, num_attention_heads=2,
                                                    vocab_size=50)),
               "h.1.mlp", "h.1.mlp", lambda b, x: b(x), "falcon", "gpt_neox"),
    "gpt_bigcode": (lambda: T.GPTBigCodeModel(T.GPTBigCodeConfig(n_embd=D, n_layer=2, n_head=2, vocab_size=50,
                                                                 bos_token_id=1, eos_token_id=2)),
                    "h.1.mlp", "h.1.mlp", lambda b, x: b(x), "gpt_bigcode", "gpt2"),
}


@pytest.mark.parametrize("family", list(PLAIN))
def test_family_equals_its_own_forward_with_its_own_label(family):
    build, path, block_path, own, model_type, convention = PLAIN[family]
    model = _randomise(build())
    block = model.get_submodule(block_path)
    x = torch.randn(11, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = own(block, x).numpy()
    site = mi.ffn_site(model, path)
    got = site.network(x.numpy())
    tol = 1e-9 if family == "bloom" else 1e-12  # BLOOM's GELU writes sqrt(2/pi) with 8 digits
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()
    assert (site.family, site.convention) == (model_type, convention)
    first = {"bloom": "dense_h_to_4h", "distilbert": "lin1", "phi": "fc1", "falcon": "dense_h_to_4h",
             "gpt_bigcode": "c_fc"}[family]
    assert site.input_module == f"{block_path}.{first}"
    assert path in mi.ffn_paths(model)


def _moe(kind):
    if kind == "mixtral":
        cfg = T.MixtralConfig(hidden_size=D, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, vocab_size=50, num_local_experts=4, num_experts_per_tok=2)
        return _randomise(T.MixtralModel(cfg))
    cfg = T.Qwen2MoeConfig(hidden_size=D, intermediate_size=24, moe_intermediate_size=12,
                           shared_expert_intermediate_size=20, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, vocab_size=50, num_experts=4, num_experts_per_tok=2)
    return _randomise(T.Qwen2MoeModel(cfg))


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_experts_with_the_router_outside_rebuild_the_moe_layer(kind):
    model = _moe(kind)
    moe = model.layers[1].mlp
    if hasattr(model.config, "_experts_implementation"):
        model.config._experts_implementation = "eager"  # float64 reference (the grouped kernels refuse it)
    x = torch.randn(2, 7, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = moe(x)
        ref = (ref[0] if isinstance(ref, tuple) else ref).reshape(-1, D).numpy()
        _, weights, index = moe.gate(x.reshape(-1, D))  # the layer's own router: top-k weights and experts
    E = moe.experts.gate_up_proj.shape[0]
    paths = [p for p in mi.ffn_paths(model) if p.startswith("layers.1.mlp.experts.")]
    assert paths == [f"layers.1.mlp.experts.{e}" for e in range(E)]
    xs = x.reshape(-1, D).numpy()
    out = np.zeros_like(xs)
    for e in range(E):
        site = mi.ffn_site(model, f"layers.1.mlp.experts.{e}")
        assert isinstance(site.network, mi.GLU) and site.output_module is None
        assert site.input_module == "layers.1.mlp.experts" and site.family == kind
        w = (weights.numpy() * (index.numpy() == e)).sum(1)
        out += w[:, None] * site.network(xs)
    if kind == "qwen2_moe":
        shared = mi.ffn_site(model, "layers.1.mlp.shared_expert")
        assert shared.convention == "llama"
        gate = torch.sigmoid(moe.shared_expert_gate(x.reshape(-1, D))).detach().numpy()
        out += gate * shared.network(xs)
    assert np.abs(out - ref).max() <= 1e-12 * np.abs(ref).max()


def test_moe_layer_and_bad_expert_paths_say_what_they_are():
    model = _moe("mixtral")
    with pytest.raises(ValueError, match=r"mixture-of-experts layer: each expert is a block.*experts\.0"):
        mi.ffn_site(model, "layers.1.mlp")
    with pytest.raises(ValueError, match=r"expert index 9 out of range; .* holds 4 experts"):
        mi.ffn_site(model, "layers.1.mlp.experts.9")


def test_bert_attention_path_is_named_as_attention_not_as_part_of_the_ffn():
    model = T.BertModel(T.BertConfig(hidden_size=D, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
                                     vocab_size=50))
    with pytest.raises(ValueError, match=r"is the attention module \(BertAttention\) of the layer 'encoder.layer.1', "
                                         r"not part of its FFN .*attention excluded") as e:
        mi.ffn_site(model, "encoder.layer.1.attention")
    assert "is part of the FFN block" not in str(e.value)
