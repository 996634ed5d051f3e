"""Capture of FFN-block inputs: the captured tensor is the block's input, moments are exact sums, the split is by
passage, 2 gloo processes give the moments of one, and bad input is a clear error."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from mlpinterp.lm.capture import Moments, capture_ffn_inputs, split_passages  # noqa: E402
from mlpinterp.lm.capture_config import CaptureConfig  # noqa: E402
from mlpinterp.lm.hooks import hook_activations  # noqa: E402
from tests.ffn_tiny import TEXTS, tiny_bert, tiny_gpt2, tokenizer  # noqa: E402
from tests.gloo import run_forked  # noqa: E402

CFG = CaptureConfig(ctx_len=16, seq_batch=4, max_tokens=600, passage_chunks=2, heldout_fraction=0.25)


def _content(ids):
    special = torch.tensor(sorted(set(tokenizer().all_special_ids)))
    return ~torch.isin(ids, special)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_captured_tensor_is_the_blocks_input(family):
    # the input of intermediate.dense / c_fc equals the output of the sub-layer that feeds it (another hook)
    model = tiny_bert() if family == "bert" else tiny_gpt2()
    if family == "bert":
        inputs = {f"encoder.layer.{i}": f"encoder.layer.{i}.intermediate.dense" for i in range(2)}
        feeders = {f"encoder.layer.{i}": f"encoder.layer.{i}.attention.output" for i in range(2)}
    else:
        inputs = {f"transformer.h.{i}.mlp": f"transformer.h.{i}.mlp.c_fc" for i in range(2)}
        feeders = {f"transformer.h.{i}.mlp": f"transformer.h.{i}.ln_2" for i in range(2)}
    cap = capture_ffn_inputs(model, tokenizer(), inputs, CFG, TEXTS, quiet=True)
    mask = _content(cap.heldout_ids)
    for path, feeder in feeders.items():
        want = hook_activations(model, feeder, cap.heldout_ids, torch.ones_like(cap.heldout_ids))[mask]
        torch.testing.assert_close(cap.blocks[path].heldout, want.float(), rtol=1e-5, atol=1e-6)
        fit_all = hook_activations(model, feeder, cap.fit_ids, torch.ones_like(cap.fit_ids))[_content(cap.fit_ids)]
        m = cap.blocks[path].moments
        assert m.n == fit_all.shape[0] == cap.n_fit_tokens
        np.testing.assert_allclose(m.mean, fit_all.double().mean(0).numpy(), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(m.cov(), np.cov(fit_all.double().numpy(), rowvar=False), rtol=1e-8, atol=1e-9)
    assert cap.n_heldout_tokens == int(mask.sum()) and cap.tokens_per_s > 0


def test_split_is_by_passage_and_seeded():
    file_of = np.repeat([0, 1, 2], [7, 5, 6])
    cfg = CaptureConfig(passage_chunks=3, heldout_fraction=0.3, seed=4)
    fit, held = split_passages(18, file_of, cfg)
    assert sorted(np.concatenate([fit, held]).tolist()) == list(range(18))
    # passages: runs of <= 3 consecutive chunks inside one file; each lies wholly on one side
    passages = [[0, 1, 2], [3, 4, 5], [6], [7, 8, 9], [10, 11], [12, 13, 14], [15, 16, 17]]
    for p in passages:
        assert set(p) <= set(held.tolist()) or set(p) <= set(fit.tolist())
    assert (fit.tolist(), held.tolist()) == tuple(x.tolist() for x in split_passages(18, file_of, cfg))
    other = split_passages(18, file_of, CaptureConfig(passage_chunks=3, heldout_fraction=0.3, seed=5))
    assert other[1].tolist() != held.tolist()


def test_special_tokens_excluded_or_kept():
    model = tiny_bert()
    kept = capture_ffn_inputs(model, tokenizer(), {"l0": "encoder.layer.0.intermediate.dense"},
                              CaptureConfig(**{**CFG.__dict__, "exclude_special": False}), TEXTS, quiet=True)
    dropped = capture_ffn_inputs(model, tokenizer(), {"l0": "encoder.layer.0.intermediate.dense"}, CFG, TEXTS,
                                 quiet=True)
    assert kept.n_heldout_tokens == kept.heldout_ids.numel()
    assert dropped.n_heldout_tokens == int(_content(dropped.heldout_ids).sum()) < dropped.heldout_ids.numel()


def test_bad_input_is_a_clear_error():
    model = tiny_bert()
    with pytest.raises(ValueError, match="no document of at least ctx_len"):
        capture_ffn_inputs(model, tokenizer(), {"l0": "encoder.layer.0.intermediate.dense"}, CFG, ["too short"],
                           quiet=True)
    with pytest.raises(ValueError, match="is not a submodule"):
        capture_ffn_inputs(model, tokenizer(), {"l0": "encoder.layer.9.intermediate.dense"}, CFG, TEXTS, quiet=True)
    with pytest.raises(ValueError, match="at least 2"):
        capture_ffn_inputs(model, tokenizer(), {"l0": "encoder.layer.0.intermediate.dense"},
                           CaptureConfig(ctx_len=16, passage_chunks=1000), TEXTS[:1], quiet=True)
    with pytest.raises(ValueError, match="needs at least d \\+ 1"):
        Moments.zeros(8).cov()
    with pytest.raises(ValueError, match="heldout_fraction"):
        CaptureConfig(heldout_fraction=1.0)
    with pytest.raises(ValueError, match="must name at least one"):
        capture_ffn_inputs(model, tokenizer(), {}, CFG, TEXTS, quiet=True)


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        cap = capture_ffn_inputs(tiny_bert(), tokenizer(), {"l1": "encoder.layer.1.intermediate.dense"}, CFG, TEXTS,
                                 quiet=True)
        m = cap.blocks["l1"].moments
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump({"n": m.n, "s1": m.s1.tolist(), "s2": m.s2.tolist(), "local": cap.info["local_tokens"]}, f)
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_give_the_moments_of_one(tmp_path):
    tokenizer()  # load before forking
    single = capture_ffn_inputs(tiny_bert(), tokenizer(), {"l1": "encoder.layer.1.intermediate.dense"}, CFG, TEXTS,
                                quiet=True).blocks["l1"].moments
    run_forked(_worker, (2, str(tmp_path / "init"), str(tmp_path)), what="the 2-process gloo capture")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert sum(r["local"] for r in ranks) >= single.n  # each process read its share (fit + held-out)
    for r in ranks:
        assert r["n"] == single.n
        np.testing.assert_allclose(r["s1"], single.s1, rtol=1e-10, atol=1e-9)
        np.testing.assert_allclose(r["s2"], single.s2, rtol=1e-10, atol=1e-9)
