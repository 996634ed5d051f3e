"""Bad input to the transformer-FFN and LM-plumbing APIs, the way a careless or unlucky user gives it.

Every case is a regression test for a defect found by attacking the API: each must raise a ``TypeError`` /
``ValueError`` naming the argument and what was expected (the CLI: ``Error: ... / Fix: ...``, exit 1, no traceback),
or give the correct number, checked against an independent computation (brute-force least squares, the block's own
forward, an uninterrupted run). Tiny local models only (tests/ffn_tiny.py).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import mlpinterp as mi
from mlpinterp.lm.capture import Moments, capture_ffn_inputs
from mlpinterp.lm.capture_config import CaptureConfig
from mlpinterp.lm.features import output_directions, sae_alignment, unembedding_tokens
from mlpinterp.lm.gaussianity import gaussianity
from mlpinterp.lm.input_models import fit_gaussian, fit_mixture
from mlpinterp.poly.finetune_config import FinetuneConfig
from mlpinterp.poly.projection import NormalEquations, normal_equations, project_on_data, solve_projection
from mlpinterp.poly.readout import Readout, RidgeBasis
from mlpinterp.poly.readout_finetune import finetune
from mlpinterp.poly.spectral import quadratic_forms

from .artifact_utils import rewrite

transformers = pytest.importorskip("transformers")
from tests.ffn_tiny import TEXTS, tiny_bert, tiny_gpt2, tokenizer  # noqa: E402
from tests.helpers import as_earlier_run_record, write_earlier_run_record  # noqa: E402

D, H, O = 5, 7, 3
CFG = CaptureConfig(ctx_len=16, seq_batch=8, max_tokens=600, keep_fit=600, passage_chunks=2)
BERT_IN = {"encoder.layer.0": "encoder.layer.0.intermediate.dense"}


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def nets():
    rng = np.random.default_rng(0)
    W1 = rng.standard_normal((H, D))
    W1[2] = 0.0  # a dead neuron: its pre-activation is the constant b1[2]
    mlp = mi.MLP(W1, rng.standard_normal(H), rng.standard_normal((O, H)), rng.standard_normal(O), activation="gelu")
    glu = mi.GLU(rng.standard_normal((H, D)), rng.standard_normal(H), rng.standard_normal((H, D)),
                 rng.standard_normal(H), rng.standard_normal((O, H)), rng.standard_normal(O), activation="silu")
    X = rng.standard_normal((400, D))
    g = mi.Gaussian.from_data(X)
    p = mi.fit_polynomial(mlp, g, 3)
    return {"mlp": mlp, "glu": glu, "X": X, "g": g, "p": p, "basis": RidgeBasis.from_closed_form(p, g)}


@pytest.fixture(scope="module")
def bert():
    return tiny_bert()


@pytest.fixture(scope="module")
def gpt2():
    return tiny_gpt2()


def _ids(n=4, ctx=16):
    from mlpinterp.lm.text import token_chunks

    return token_chunks(tokenizer(), TEXTS, ctx)[:n]


# ------------------------------------------------------------------------------------------------ import


def test_from_hf_complex_weights_are_not_called_quantised():
    from mlpinterp.hf.blocks import ffn_site

    model = tiny_gpt2()
    model.transformer.h[0].mlp.c_fc.to(torch.complex64)
    with pytest.raises(ValueError, match=r"c_fc \(.*Conv1D\) has complex weights"):  # was "is a quantised layer"
        ffn_site(model, "h.0.mlp")
    with pytest.raises(ValueError, match="mlpinterp.from_module"):
        ffn_site(model, "")


# ------------------------------------------------------------------------------------------------ capture


@pytest.mark.parametrize("texts, err, match", [
    (TEXTS[0], TypeError, "got a single str"),  # before: iterated one character per document, "no document"
    ([1, 2], TypeError, "entry 0 is int"),
    ([None], TypeError, "entry 0 is NoneType"),
])
def test_capture_texts_must_be_a_list_of_str(bert, texts, err, match):
    with pytest.raises(err, match=match):
        capture_ffn_inputs(bert, tokenizer(), BERT_IN, CFG, texts, quiet=True)


@pytest.mark.parametrize("ctx_len", [1, 2])
def test_capture_ctx_len_must_leave_room_beside_special_tokens(bert, ctx_len):
    # before: "the text holds no document of at least ctx_len=1 tokens" (the real cause swallowed)
    with pytest.raises(ValueError, match="must exceed the 2 special tokens"):
        capture_ffn_inputs(bert, tokenizer(), BERT_IN, CaptureConfig(ctx_len=ctx_len), TEXTS, quiet=True)


def test_capture_ctx_len_beyond_the_models_positions(bert, gpt2):
    cfg = CaptureConfig(ctx_len=100, passage_chunks=1)  # both tiny models have 64 positions
    with pytest.raises(ValueError, match="ctx_len=100 exceeds the BertModel's 64 positions"):  # was a RuntimeError
        capture_ffn_inputs(bert, tokenizer(), BERT_IN, cfg, TEXTS, quiet=True)
    with pytest.raises(ValueError, match="ctx_len=100 exceeds the GPT2LMHeadModel's 64 positions"):  # was IndexError
        capture_ffn_inputs(gpt2, tokenizer(), {"h0": "transformer.h.0.mlp.c_fc"}, cfg, TEXTS, quiet=True)


def test_capture_in_train_mode_is_the_eval_capture_and_restores_the_mode():
    ref = capture_ffn_inputs(tiny_bert(), tokenizer(), BERT_IN, CFG, TEXTS, quiet=True).blocks["encoder.layer.0"]
    model = tiny_bert().train()  # dropout on: before, every capture differed (and from the eval one)
    got = capture_ffn_inputs(model, tokenizer(), BERT_IN, CFG, TEXTS, quiet=True).blocks["encoder.layer.0"]
    assert torch.equal(got.fit, ref.fit) and torch.equal(got.heldout, ref.heldout)
    assert model.training and model.encoder.layer[0].attention.self.dropout.training


@pytest.mark.parametrize("module", ["encoder.layer.0.attention", "encoder.layer.0", "encoder.layer.0.output.LayerNorm"])
def test_capture_input_module_must_be_an_ffn_projection(bert, module):
    # before: captured the attention's / the layer's input silently (same width, wrong tensor)
    with pytest.raises(ValueError, match=r"not the first projection of an FFN block.*encoder\.layer\.0\.intermediate"):
        capture_ffn_inputs(bert, tokenizer(), {"x": module}, CFG, TEXTS, quiet=True)


def test_capture_input_that_is_not_one_vector_per_token(bert):
    # the pooler's input is [batch, d]: before, masked with [batch, seq] it gave a silently wrong 1-D "capture"
    with pytest.raises(ValueError, match="not one vector per token"):
        capture_ffn_inputs(bert, tokenizer(), {"x": "pooler.dense"}, CFG, TEXTS, quiet=True)


def test_capture_opt_flattened_ffn_input_equals_the_blocks_input():
    """OPT flattens tokens before its FFN ([batch * seq, d]); before the fix the capture raised IndexError."""
    from mlpinterp.hf.blocks import ffn_paths, ffn_site

    torch.manual_seed(0)
    opt = transformers.OPTForCausalLM(transformers.OPTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, ffn_dim=24, vocab_size=tokenizer().vocab_size,
        max_position_embeddings=64, word_embed_proj_dim=16, pad_token_id=0, bos_token_id=101,
        eos_token_id=102)).eval()
    path = ffn_paths(opt)[1]
    site = ffn_site(opt, path)
    cap = capture_ffn_inputs(opt, tokenizer(), {path: site.input_module}, CFG, TEXTS, quiet=True)
    seen = []
    h = opt.get_submodule(site.input_module).register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    with torch.no_grad():
        opt(input_ids=cap.heldout_ids)
    h.remove()
    special = torch.tensor(tokenizer().all_special_ids)
    want = seen[0].reshape(*cap.heldout_ids.shape, -1)[~torch.isin(cap.heldout_ids, special)]
    torch.testing.assert_close(cap.blocks[path].heldout, want.float(), rtol=0, atol=0)


def test_capture_input_module_never_called():
    model = tiny_bert()
    model.unused = torch.nn.Linear(16, 24)  # a projection the forward pass never calls
    with pytest.raises(ValueError, match=r"\['unused'\] were not called in the forward pass"):
        capture_ffn_inputs(model, tokenizer(), {"x": "unused"}, CFG, TEXTS, quiet=True)


def test_capture_tokenizer_of_another_model():
    torch.manual_seed(0)
    small = transformers.BertModel(transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                                                           num_attention_heads=2, intermediate_size=24,
                                                           max_position_embeddings=64)).eval()
    with pytest.raises(ValueError, match="beyond the BertModel's vocabulary of 100"):  # was IndexError
        capture_ffn_inputs(small, tokenizer(), BERT_IN, CFG, TEXTS, quiet=True)


def test_capture_nan_activations_and_meta_model():
    model = tiny_bert()
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[:5000] = float("nan")
    with pytest.raises(ValueError, match=r"input of FFN block 'encoder.layer.0'.*non-finite"):  # was NaN moments
        capture_ffn_inputs(model, tokenizer(), BERT_IN, CFG, TEXTS, quiet=True)
    with torch.device("meta"):
        meta = transformers.BertModel(model.config)
    with pytest.raises(ValueError, match="meta device"):  # was "Tensor.item() cannot be called on meta tensors"
        capture_ffn_inputs(meta, tokenizer(), BERT_IN, CFG, TEXTS, quiet=True)


@pytest.mark.parametrize("kw, match", [
    (dict(model="bert"), "model must be a torch.nn.Module"),
    (dict(tokenizer=None), "tokenizer must be a Hugging Face tokenizer"),
    (dict(input_modules=["encoder.layer.0.intermediate.dense"]), "input_modules must be a dict"),
    (dict(input_modules={"a": None}), r"input_modules\['a'\] must be a module path"),
    (dict(cfg={"ctx_len": 16}), "cfg must be a CaptureConfig"),
])
def test_capture_argument_types(bert, kw, match):
    args = dict(model=bert, tokenizer=tokenizer(), input_modules=BERT_IN, cfg=CFG)
    args.update(kw)
    with pytest.raises(TypeError, match=match):
        capture_ffn_inputs(args["model"], args["tokenizer"], args["input_modules"], args["cfg"], TEXTS, quiet=True)


def test_capture_too_few_tokens_for_a_covariance(bert):
    with pytest.raises(ValueError, match=r"fit tokens captured, but a covariance .* needs at least d \+ 1 = 17"):
        capture_ffn_inputs(bert, tokenizer(), BERT_IN, CaptureConfig(ctx_len=16, max_tokens=1, passage_chunks=2),
                           TEXTS, quiet=True)


def test_capture_config_exclude_special_must_be_a_bool():
    with pytest.raises(TypeError, match="exclude_special must be True or False"):  # "no" was silently truthy
        CaptureConfig(exclude_special="no")


def test_moments_validate_their_sums():
    m = Moments.zeros(D)
    for X, match in [(np.zeros((3, D + 1)), r"X must have shape \[\*, 5\]"), (np.zeros(D), r"got \[5\]"),
                     (np.full((3, D), np.nan), "non-finite")]:
        with pytest.raises(ValueError, match=match):  # before: broadcast error, silent 1-D sums, NaN sums
            m.add(X)
    with pytest.raises(ValueError, match="d must be >= 1"):
        Moments.zeros(0)
    with pytest.raises(ValueError, match="at least 1 fit token"):  # was a NaN mean
        _ = Moments.zeros(D).mean
    with pytest.raises(ValueError, match=r"s2 must have shape \[5, 5\]"):
        Moments(10, np.zeros(D), np.zeros((D, D + 1)))
    with pytest.raises(ValueError, match="n must be >= 0"):
        Moments(-1, np.zeros(D), np.zeros((D, D)))
    X = np.random.default_rng(0).standard_normal((20, D))
    a, b = Moments.zeros(D), Moments.zeros(D)
    a.add(X)
    b.add(torch.tensor(X, requires_grad=True))  # a torch batch was a TypeError from numpy
    np.testing.assert_array_equal(a.s2, b.s2)
    np.testing.assert_allclose(a.cov(), np.cov(X, rowvar=False), rtol=1e-12)


# ------------------------------------------------------------------------------------------------ input models


def test_fit_gaussian_bad_input(nets):
    X = nets["X"]
    m = Moments.zeros(D)
    m.add(X)
    with pytest.raises(TypeError, match="moments must be a Moments"):
        fit_gaussian(X, "empirical", X)
    with pytest.raises(ValueError, match="at least 2 rows"):  # scikit-learn silently returns shrinkage 0 for 1 row
        fit_gaussian(m, "ledoit-wolf", X[:1])
    with pytest.raises(ValueError, match=r"X_sample must have shape \[\*, 5\]"):  # another width was accepted
        fit_gaussian(m, "ledoit-wolf", X[:, :3])
    with pytest.raises(ValueError, match="X_sample contains"):
        fit_gaussian(m, "ledoit-wolf", np.full((10, D), np.nan))
    g = fit_gaussian(m, "empirical", None)  # the sample is not needed for the empirical covariance
    np.testing.assert_allclose(g.cov, np.cov(X, rowvar=False), rtol=1e-12)


def test_fit_mixture_bad_input(nets):
    X = nets["X"]
    with pytest.raises(TypeError, match="real-valued"):  # the imaginary part was dropped silently
        fit_mixture(X.astype(complex), 2, 100)
    with pytest.raises(ValueError, match="X contains 5 non-finite"):
        fit_mixture(np.where(np.arange(X.size).reshape(X.shape) < 5, np.nan, X), 2, 100)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        fit_mixture(X, 2, 100, seed=-1)
    with pytest.raises(TypeError, match="seed must be an int"):
        fit_mixture(X, 2, 100, seed=1.5)
    with pytest.raises(ValueError, match="needs at least 8 rows"):
        fit_mixture(X, 8, 4)


# ------------------------------------------------------------------------------------------------ ridge family


def test_ridge_basis_bad_input(nets):
    p, g = nets["p"], nets["g"]
    with pytest.raises(ValueError, match="gaussian has dimension 6, but p has d_in=5"):
        RidgeBasis.from_closed_form(p, mi.Gaussian.standard(D + 1))
    with pytest.raises(TypeError, match="p must be a RidgePolynomial"):
        RidgeBasis.from_closed_form(nets["mlp"], g)
    with pytest.raises(TypeError, match="gaussian must be a Gaussian"):
        RidgeBasis.from_closed_form(p, nets["X"])
    with pytest.raises(ValueError, match=r"white must have shape \[5, \*\]"):
        RidgeBasis(np.zeros(D), np.zeros((H, D)), None, np.zeros((D + 1, 2)))
    with pytest.raises(ValueError, match="center contains"):
        RidgeBasis(np.full(D, np.nan), p.A, None, nets["basis"].white)
    b = nets["basis"]
    for X, match in [(np.zeros((3, D + 1)), r"X must have shape \[\*, 5\]"), (np.zeros(D), r"got \[5\]"),
                     (np.full((3, D), np.nan), "X contains")]:
        with pytest.raises(ValueError, match=match):  # before: broadcast error, IndexError, "z contains"
            b.features(X, 2)
    with pytest.raises(ValueError, match="degree must be >= 0"):  # degree -1 gave the constant feature only
        b.features(nets["X"], -1)


def test_ridge_basis_of_a_degenerate_gaussian_whitens_its_support(nets):
    rng = np.random.default_rng(3)
    L = rng.standard_normal((D, 2))
    g = mi.Gaussian(np.ones(D), L @ L.T)  # rank 2
    basis = RidgeBasis.from_closed_form(mi.fit_polynomial(nets["mlp"], g, 2), g)
    assert basis.rank == g.rank == 2
    np.testing.assert_allclose(basis.white.T @ (L @ L.T) @ basis.white, np.eye(2), atol=1e-10)
    X = g.sample(300, rng)  # on the support, the data projection is brute-force least squares on the features
    ro, info = project_on_data(nets["mlp"], basis, X, [2])[2]
    Phi, Y = basis.features(X, 2), nets["mlp"](X)
    B = np.linalg.lstsq(Phi, Y, rcond=None)[0]
    fvu = ((Phi @ B - Y) ** 2).sum() / ((Y - Y.mean(0)) ** 2).sum()
    assert info["fvu"] == pytest.approx(fvu, rel=1e-5, abs=1e-9)


def test_readout_bad_input(nets):
    b, p = nets["basis"], nets["p"]
    ro = Readout.from_closed_form(p, b)
    g = nets["g"]
    glu_basis = RidgeBasis.from_closed_form(mi.fit_polynomial(nets["glu"], g, 3), g)
    with pytest.raises(ValueError, match="S must be given for a gated basis"):  # was a matmul error
        Readout(glu_basis, ro.b, ro.L, ro.R, ro.S)
    with pytest.raises(ValueError, match=r"R must have shape \[\*, 3, 7\]"):
        Readout(b, ro.b, ro.L, ro.R[:, :, :3], None)
    with pytest.raises(ValueError, match=r"L must have shape \[d_out, basis.rank\] = \[2, 5\]"):
        Readout(b, ro.b[:2], ro.L, ro.R, None)
    with pytest.raises(ValueError, match="p's directions .* are not basis's"):
        Readout.from_closed_form(p, glu_basis)
    L = np.random.default_rng(1).standard_normal((D, 3))
    gd = mi.Gaussian(np.zeros(D), L @ L.T)
    with pytest.raises(ValueError, match="p's directions"):  # a basis of another Gaussian was silently mixed in
        Readout.from_closed_form(p, RidgeBasis.from_closed_form(mi.fit_polynomial(nets["mlp"], gd, 3), gd))
    with pytest.raises(ValueError, match="B must have shape"):
        Readout.from_coefficients(b, np.zeros(b.n_features(2)), 2)
    with pytest.raises(TypeError, match="degree must be an int"):
        Readout.from_coefficients(b, np.zeros((b.n_features(2), O)), 2.0)
    with pytest.raises(ValueError, match="B contains"):
        Readout.from_coefficients(b, np.full((b.n_features(2), O), np.nan), 2)
    x = nets["X"][:3]
    np.testing.assert_allclose(ro(x[0]), ro(x)[0], rtol=1e-14)  # a single input was an IndexError
    np.testing.assert_allclose(ro(x), p(x), rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------------------------ projection


def test_projection_bad_input(nets):
    net, b, X = nets["mlp"], nets["basis"], nets["X"]
    with pytest.raises(TypeError, match="real-valued"):  # complex X lost its imaginary part silently
        project_on_data(net, b, X.astype(complex), [1])
    with pytest.raises(TypeError, match="degrees must be a list"):
        project_on_data(net, b, X, 2)
    with pytest.raises(ValueError, match="at least one degree"):  # was an IndexError
        project_on_data(net, b, X, [])
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        project_on_data(net, b, X, [1], chunk=0)
    wide = mi.MLP(np.ones((H + 3, D)), np.zeros(H + 3), np.ones((O, H + 3)), np.zeros(O), "relu")
    with pytest.raises(ValueError, match="is not the ridge family of network"):  # another block's basis was accepted
        normal_equations(wide, b, X, 2)
    neq = normal_equations(net, b, X, 2)
    with pytest.raises(ValueError, match="degree must be <= 2"):  # leading(3) relabelled degree-2 sums as degree 3
        neq.leading(3, b)
    other = RidgeBasis.from_closed_form(mi.fit_polynomial(nets["glu"], nets["g"], 2), nets["g"])
    with pytest.raises(ValueError, match="were not built for this basis"):
        solve_projection(neq, other)
    with pytest.raises(TypeError, match="neq must be a NormalEquations"):
        solve_projection(neq.M, b)
    bad = NormalEquations(2, np.full_like(neq.M, np.nan), neq.C, neq.yy, neq.y1, neq.n)
    with pytest.raises(ValueError, match="M contains"):
        solve_projection(bad, b)


def test_projection_accepts_any_real_tensor_and_equals_float64(nets):
    net, b, X = nets["mlp"], nets["basis"], nets["X"]
    Xh = torch.tensor(X, dtype=torch.bfloat16)  # was "Got unsupported ScalarType BFloat16"
    want = project_on_data(net, b, Xh.double().numpy(), [2])[2][1]["fvu"]
    assert project_on_data(net, b, Xh, [2])[2][1]["fvu"] == want
    Xg = torch.tensor(X, requires_grad=True)  # was "Can't call numpy() on Tensor that requires grad"
    assert project_on_data(net, b, Xg, [2])[2][1]["fvu"] == project_on_data(net, b, X, [2])[2][1]["fvu"]


def test_projection_undefined_fvu_is_an_error_not_a_number(nets):
    b, X = nets["basis"], nets["X"]
    const = mi.MLP(nets["mlp"].W1, nets["mlp"].b1, np.zeros((O, H)), np.ones(O), "gelu")
    with pytest.raises(ValueError, match="no variance"):  # was ZeroDivisionError
        project_on_data(const, b, X, [1])
    with pytest.raises(ValueError, match="no variance"):  # identical inputs: was a negative FVU (-0.9)
        project_on_data(nets["mlp"], b, np.ones((100, D)), [1])


def test_dead_neuron_and_constant_input_dimension(nets):
    """A dead neuron and a constant input dimension make constant features: with the default ridge the projection
    equals brute-force minimum-norm least squares; with ridge=0 the error says what is constant."""
    net, X = nets["mlp"], nets["X"].copy()
    X[:, 1] = 3.0
    g = mi.Gaussian.from_data(X)  # singular: the whitening drops the constant dimension
    basis = RidgeBasis.from_closed_form(mi.fit_polynomial(net, g, 2), g)
    assert basis.rank == D - 1
    info = project_on_data(net, basis, X, [2])[2][1]
    Phi, Y = basis.features(X, 2), net(X)
    B = np.linalg.lstsq(Phi, Y, rcond=None)[0]
    assert info["fvu"] == pytest.approx(((Phi @ B - Y) ** 2).sum() / ((Y - Y.mean(0)) ** 2).sum(), rel=1e-5)
    with pytest.raises(ValueError, match=r"ridge=0: 1 of the \d+ features are constant on the samples \(dead neurons"):
        project_on_data(net, basis, X, [2], ridge=0.0)


# ------------------------------------------------------------------------------------------------ hybrid


def test_finetune_bad_input(nets):
    net, X = nets["mlp"], nets["X"]
    ro = Readout.from_closed_form(mi.fit_polynomial(net, nets["g"], 2),
                                  RidgeBasis.from_closed_form(mi.fit_polynomial(net, nets["g"], 2), nets["g"]))
    cfg = FinetuneConfig(steps=2, batch_size=32)
    for X_val in (X[:1], np.ones((10, D))):
        with pytest.raises(ValueError, match="X_val must hold >= 2 inputs on which"):  # was ZeroDivisionError
            finetune(net, ro, X, cfg, X_val=X_val)
    with pytest.raises(ValueError, match="X_fit contains"):  # the message named "X"
        finetune(net, ro, np.full((10, D), np.nan), cfg)
    with pytest.raises(TypeError, match="X_fit must be real-valued"):
        finetune(net, ro, X.astype(complex), cfg)
    with pytest.raises(TypeError, match="start must be a Readout"):
        finetune(net, nets["p"], X, cfg)
    other = mi.MLP(np.ones((H, D)), np.zeros(H), np.ones((O + 1, H)), np.zeros(O + 1), "relu")
    with pytest.raises(ValueError, match="start maps d_in=5 -> d_out=3"):  # was a torch size-mismatch error
        finetune(other, ro, X, cfg)
    with pytest.raises(TypeError, match="cfg must be a FinetuneConfig"):
        finetune(net, ro, X, {"steps": 2})
    a = finetune(net, ro, torch.tensor(X, dtype=torch.float32, requires_grad=True), cfg)  # torch was refused
    b = finetune(net, ro, X.astype(np.float32), cfg)
    np.testing.assert_array_equal(a.readout.R, b.readout.R)


# ------------------------------------------------------------------------------------------------ diagnostics, features


def test_gaussianity_bad_input(nets):
    X, net = nets["X"], nets["mlp"]
    with pytest.raises(ValueError, match="X contains"):  # was LinAlgError "SVD did not converge"
        gaussianity(np.full((20, D), np.nan))
    with pytest.raises(ValueError, match="does not vary"):  # was NaN kurtoses in the report
        gaussianity(np.ones((20, D)), net.W1, net.b1)
    with pytest.raises(ValueError, match="none of the 7 neurons"):  # was IndexError
        gaussianity(X, np.zeros((H, D)), np.zeros(H))
    with pytest.raises(ValueError, match="max_neurons must be >= 1"):
        gaussianity(X, net.W1, net.b1, max_neurons=0)
    with pytest.raises(TypeError, match="real-valued"):
        gaussianity(X.astype(complex))
    # a constant input dimension: its principal direction is left out, no kurtosis of float rounding noise
    Xc = np.c_[X, np.full(len(X), 2.0)]
    r = gaussianity(Xc, np.c_[net.W1, np.zeros(H)], net.b1)
    assert len(r["pc_excess_kurtosis"]) == D and np.all(np.isfinite(r["pc_excess_kurtosis"]))
    assert r["neurons_checked"] == H - 1  # the dead neuron is excluded
    assert np.isfinite([r[k] for k in r if k.startswith("neuron_") and k != "neurons_checked"]).all()


def test_features_bad_input(nets):
    with pytest.raises(ValueError, match="does not vary"):  # was NaN variance fractions
        output_directions(np.ones((20, O)), 2)
    with pytest.raises(ValueError, match="Y contains"):  # was LinAlgError
        output_directions(np.full((20, O), np.nan), 2)

    class Tok:
        def decode(self, ids):
            return str(ids)

    with pytest.raises(ValueError, match="W_U contains"):  # NaN logits gave arbitrary "top tokens"
        unembedding_tokens(np.eye(O)[:, :1], np.full((10, O), np.nan), Tok())
    with pytest.raises(ValueError, match="n_tokens must be >= 1"):
        unembedding_tokens(np.eye(O)[:, :1], np.ones((4, O)), Tok(), n_tokens=0)
    with pytest.raises(ValueError, match="are zero"):  # a zero vector had max cosine 0 against every decoder
        sae_alignment(np.zeros((O, 1)), np.eye(O))
    with pytest.raises(ValueError, match="decoder contains"):  # NaN in the report
        sae_alignment(np.eye(O), np.full((4, O), np.nan))
    with pytest.raises(ValueError, match="n_random must be >= 1"):  # was IndexError
        sae_alignment(np.eye(O), np.eye(O), n_random=0)
    with pytest.raises(ValueError, match=r"decoder \[d_sae >= 1, d\]"):
        sae_alignment(np.eye(O), np.zeros((0, O)))
    dec = torch.eye(O, requires_grad=True)  # an SAE's decoder parameter: was a RuntimeError
    assert sae_alignment(np.eye(O), dec) == sae_alignment(np.eye(O), np.eye(O))
    for p in (None, nets["mlp"]):
        with pytest.raises(TypeError, match="p must be a polynomial approximant"):  # IndexError / a misleading name
            quadratic_forms(p, np.eye(O))


# ------------------------------------------------------------------------------------------------ lm plumbing


def test_hook_activations_bad_token_ids(bert):
    from mlpinterp.lm.hooks import hook_activations, resolve_hook_point

    ids = _ids()
    hp = "encoder.layer.0.output"
    for bad, err, match in [
        (ids.float(), TypeError, "integer token ids"),  # was a RuntimeError from the embedding
        (ids[0], ValueError, r"shape \[batch >= 1, seq >= 1\]"),
        (ids.tolist(), TypeError, "must be a torch.Tensor"),
        (ids + 10**6, ValueError, "outside the BertModel's vocabulary"),  # was IndexError
        (_ids(2, 100), ValueError, "more than the BertModel's 64 positions"),  # was RuntimeError
    ]:
        with pytest.raises(err, match=match):
            hook_activations(bert, hp, bad)
    with pytest.raises(ValueError, match="attention_mask must have the shape"):  # a wrong mask was used silently
        hook_activations(bert, hp, ids, torch.ones(2, 3))
    with pytest.raises(ValueError, match="only 0 .* and 1"):
        hook_activations(bert, hp, ids, torch.full_like(ids, 2))
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        resolve_hook_point("bert", hp)
    model = tiny_bert().train()
    a, b = hook_activations(model, "encoder.layer.1.output", ids), hook_activations(model, "encoder.layer.1.output", ids)
    assert torch.equal(a, b) and torch.equal(a, hook_activations(bert, "encoder.layer.1.output", ids))
    assert model.training


def test_splice_bad_replacements(bert):
    from mlpinterp.lm.hooks import splice, track_positions

    ids = _ids()

    def run(fn, **kw):
        with splice(bert, "encoder.layer.0.output.dense", fn, **kw), torch.no_grad():
            return bert(input_ids=ids).last_hidden_state

    with pytest.raises(ValueError, match="holds .* non-finite"):  # NaN spread silently to every output
        run(lambda h: h * float("nan"))
    with pytest.raises(ValueError, match="real floating-point tensor, got dtype torch.int64"):
        run(lambda h: h.long())
    with pytest.raises(ValueError, match="real floating-point tensor, got dtype torch.complex64"):
        run(lambda h: h.to(torch.complex64))
    with pytest.raises(ValueError, match="keep\\(\\) must give a boolean mask tensor"):  # was a RuntimeError
        run(lambda h: h, keep=lambda: torch.ones(ids.shape))
    with pytest.raises(TypeError, match="keep must be a callable"):  # failed only inside the forward pass
        run(lambda h: h, keep=torch.ones(ids.shape, dtype=torch.bool))
    with pytest.raises(TypeError, match="fn must be a callable"):
        run(None)
    for bad in ("abc", [None, 1]):
        with pytest.raises(TypeError, match="token_ids must"):
            track_positions(bert, bad).__enter__()


def test_downstream_comparison_in_train_mode_and_bad_input(bert, gpt2):
    from mlpinterp.lm.recovery import Replacement, downstream_comparison

    ids = _ids()
    for model, hp in ((tiny_gpt2().train(), "transformer.h.0.mlp"), (tiny_bert().train(), "encoder.layer.0.output.dense")):
        r = downstream_comparison(model, {"same": Replacement(hp, lambda h: h)}, ids)
        if r["kind"] == "lm":  # dropout made an identity splice differ from the clean model (10.3415 vs 10.3513)
            assert r["same"]["ce"] == r["clean"]["ce"]
        else:  # and gave cosine 0.973 for the identity
            assert r["same"]["cos"] == pytest.approx(1.0, abs=1e-6) and r["same"]["mse"] == 0.0
        assert model.training
    rep = {"z": Replacement("transformer.h.0.mlp", torch.zeros_like)}
    with pytest.raises(TypeError, match="replacements must be a dict name -> Replacement"):
        downstream_comparison(gpt2, {"z": torch.zeros_like}, ids)
    with pytest.raises(ValueError, match="no next-token target"):  # was ZeroDivisionError
        downstream_comparison(gpt2, rep, ids[:, :1])
    with pytest.raises(ValueError, match="no next-token target"):
        downstream_comparison(gpt2, rep, ids, torch.zeros_like(ids))
    with pytest.raises(ValueError, match=r"shape \[batch >= 1"):  # empty ids: was ZeroDivisionError
        downstream_comparison(gpt2, rep, ids[:0])
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        downstream_comparison(gpt2, rep, ids, batch_size=0)
    with pytest.raises(ValueError, match="hold no non-padding token"):  # was cosine 0.0 silently
        downstream_comparison(bert, {"z": Replacement("encoder.layer.0.output.dense", torch.zeros_like)}, ids,
                              torch.zeros_like(ids))


def test_recovery_wrong_model_kind_and_nan():
    from mlpinterp.lm.recovery import embedding_recovered, lm_loss_recovered, recovered

    ids = _ids(2)
    with pytest.raises(ValueError, match="returns no next-token logits"):  # was AttributeError
        lm_loss_recovered(tiny_bert(), "encoder.layer.0.output.dense", torch.zeros_like, ids)
    with pytest.raises(ValueError, match="returns no last_hidden_state"):  # was AttributeError
        embedding_recovered(tiny_gpt2(), "transformer.h.0.mlp", torch.zeros_like, ids)
    with pytest.raises(ValueError, match="value must be finite"):  # a NaN loss became a NaN fraction
        recovered(float("nan"), 1.0, 2.0)
    assert recovered(1.5, 1.0, 2.0) == 0.5


def test_text_and_model_loading_bad_input():
    from mlpinterp.lm.models import load_model
    from mlpinterp.lm.text import read_texts, token_chunks

    tok = tokenizer()
    with pytest.raises(TypeError, match="got a single str"):  # a string was read one character per document
        token_chunks(tok, "hello world " * 50, 8)
    with pytest.raises(TypeError, match="ctx_len must be an int"):
        token_chunks(tok, TEXTS, 2.5)
    with pytest.raises(ValueError, match="max_chunks must be >= 1"):  # max_chunks=0 returned one chunk
        token_chunks(tok, TEXTS, 8, max_chunks=0)
    with pytest.raises(TypeError, match="paths must be a file or directory path"):
        read_texts(5)
    with pytest.raises(TypeError, match="model name must be a string"):  # was AttributeError
        load_model(None)
    with pytest.raises(ValueError, match="model name must be non-empty"):
        load_model(" ")


# ------------------------------------------------------------------------------------------------ CLI and resume


def _exp(model, **kw):
    from mlpinterp.studies.transformer.settings import TransformerExperiment

    base = dict(model=model, degrees=(1, 2), input_models=("gaussian", "data"),
                capture=CaptureConfig(ctx_len=16, seq_batch=8, max_tokens=900, keep_fit=900, passage_chunks=2),
                splice_sequences=2, n_output_dirs=2, n_eigen=2, run="quick")
    base.update(kw)
    return TransformerExperiment(**base)


def run_transformer(out, exp, *, texts, quiet=True):
    """The experiment without its report (figures take most of a tiny run's time; results.json is written first)."""
    from mlpinterp.studies.transformer import report as transformer_report
    from mlpinterp.studies.transformer import run as transformer

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformer_report, "write_transformer_report", lambda out, results: None)
        return transformer.run_transformer(out, exp, quiet=quiet, texts=texts)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A tiny GPT-2 saved locally and one finished run on it."""
    root = tmp_path_factory.mktemp("resume")
    model = root / "gpt2"
    tiny_gpt2().save_pretrained(model)
    tokenizer().save_pretrained(model)
    run_transformer(root / "ref", _exp(str(model)), texts=TEXTS)
    return root, str(model)


def _strip(o):
    """Results without wall times."""
    if isinstance(o, dict):
        return {k: _strip(v) for k, v in o.items()
                if k not in ("timing_s", "cpu_s", "seconds", "sessions", "tokens_per_s")}
    if isinstance(o, list):
        return [_strip(v) for v in o]
    return o


def _copy(finished, name):
    root, _ = finished
    out = root / name
    shutil.copytree(root / "ref", out)
    return out


def test_resume_after_interruptions_equals_the_uninterrupted_run(finished):
    """Killed mid-block 1 (its json not written: writes are atomic) or between the capture's tensors and its
    metadata: the resumed results equal the uninterrupted run's."""
    root, model = finished
    ref = _strip(json.loads((root / "ref" / "results.json").read_text()))
    out = _copy(finished, "mid_block")
    for f in ("layers/1.json", "layers/1_features.npz", "results.json"):
        (out / f).unlink()
    assert _strip(run_transformer(out, _exp(model), quiet=True, texts=TEXTS)) == ref
    out = _copy(finished, "mid_capture")  # before: KeyError 'blocks' from the tensors without their metadata
    shutil.rmtree(out / "layers")
    (out / "capture.json").unlink()
    assert _strip(run_transformer(out, _exp(model), quiet=True, texts=TEXTS)) == ref


def test_resume_refuses_other_weights_text_or_unverifiable_dirs(finished, tmp_path):
    root, model = finished
    other = tmp_path / "gpt2"  # the same model path later holding other weights: the capture was reused silently
    shutil.copytree(model, other)
    out = _copy(finished, "other_weights")
    cfg = json.loads((out / "config.json").read_text())
    cfg["model"] = str(other)
    (out / "config.json").write_text(json.dumps(cfg))
    record = as_earlier_run_record(out)  # the run directory's record names the same path
    record["config"]["model"] = str(other)
    write_earlier_run_record(out, record)
    tiny_gpt2(seed=1).save_pretrained(other)
    with pytest.raises(ValueError, match="made from another model"):
        run_transformer(out, _exp(str(other)), quiet=True, texts=TEXTS)
    with pytest.raises(ValueError, match="made from another text"):  # other texts: the capture was reused silently
        run_transformer(_copy(finished, "other_text"), _exp(model), quiet=True, texts=[t.upper() for t in TEXTS])
    out = _copy(finished, "legacy")
    (out / "inputs.json").unlink()
    with pytest.raises(ValueError, match="cannot be checked"):
        run_transformer(out, _exp(model), quiet=True, texts=TEXTS)


@pytest.mark.parametrize("damage, match", [
    ("truncate", "not a valid safetensors file.*to capture again"),
    ("drop_block", r"holds no activations of the block\(s\) \['transformer.h.1.mlp'\]"),
    ("layer_json", "finished block .*1.json' is not valid JSON"),
    ("config_list", "holds a JSON list, expected a JSON object"),
])
def test_resume_with_damaged_files_names_the_file(finished, damage, match):
    root, model = finished
    out = _copy(finished, f"damaged_{damage}")
    if damage != "layer_json":
        shutil.rmtree(out / "layers")
    if damage == "truncate":
        data = (out / "capture.safetensors").read_bytes()
        (out / "capture.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "drop_block":
        rewrite(out / "capture.safetensors", lambda m: {**m, "blocks": m["blocks"][:1]})
    elif damage == "layer_json":
        (out / "layers" / "1.json").write_text('{"trunc')
    else:
        (out / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=match):  # before: ValueError without the fix, KeyError, JSONDecodeError,
        run_transformer(out, _exp(model), quiet=True, texts=TEXTS)  # AttributeError


@pytest.mark.parametrize("args, match", [
    (["--layers", "0,0"], "distinct block indices"),  # was a traceback (zip strict)
    (["--layers", "0,-9"], "out of range"),  # negative indices count from the last block
    (["--degrees", "2", "2"], "distinct integers"),  # duplicated rows in every table of the report
    (["--input-model", "data", "--input-model", "data"], "each once"),
    (["--ctx-len", "100"], "--ctx-len 100 exceeds the GPT2LMHeadModel's 64 positions .*use --ctx-len <= 64"),  # was a RuntimeError traceback
    (["--ctx-len", "16", "--max-tokens", "5"], "needs at least d \\+ 1"),
])
def test_cli_bad_values_are_errors_with_a_fix(finished, tmp_path, args, match):
    from typer.testing import CliRunner

    from mlpinterp.cli.main import app

    _, model = finished
    txt = tmp_path / "t.txt"
    txt.write_text("\n".join(TEXTS))
    r = CliRunner().invoke(app, ["reproduce", "transformer", "--model", model, "--text", str(txt), "--quiet",
                                 "--quick", "--out", str(tmp_path / "o")] + args)
    assert r.exit_code == 1, r.output
    assert "Error:" in r.output and "Fix:" in r.output and "Traceback" not in r.output
    assert pytest.importorskip("re").search(match, r.output), r.output


def test_cli_failed_run_leaves_nothing_and_conflict_fix_continues_the_run(finished, tmp_path):
    """A command that fails on a bad model path or layer writes no config.json (the corrected command runs), and a
    resume conflict's Fix is a command line that does continue the old run."""
    import shlex

    from typer.testing import CliRunner

    from mlpinterp.cli.main import app

    _, model = finished
    txt = tmp_path / "t.txt"
    txt.write_text("\n".join(TEXTS))
    out = tmp_path / "o"
    base = ["reproduce", "transformer", "--text", str(txt), "--quiet", "--quick", "--out", str(out), "--ctx-len",
            "16", "--input-model", "data", "--degrees", "1"]
    runner = CliRunner()
    r = runner.invoke(app, base + ["--model", str(tmp_path / "no" / "such")])
    assert r.exit_code == 1 and "does not exist" in r.output and "Traceback" not in r.output, r.output
    r = runner.invoke(app, base + ["--model", model, "--layers", "7"])
    assert r.exit_code == 1 and "out of range" in r.output, r.output
    assert not (out / "config.json").exists()
    r = runner.invoke(app, base + ["--model", model, "--layers", "-1"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, base[:-1] + ["2", "--model", model])  # other degrees: refused with the flags to continue
    assert r.exit_code == 1 and "another configuration" in r.output, r.output
    fix = r.output.split("Fix:", 1)[1]
    cmd = shlex.split(fix.split("`")[1])[1:] + ["--text", str(txt), "--quiet"]
    again = runner.invoke(app, cmd)
    assert again.exit_code == 0, again.output  # the printed command resumes the finished run
