"""``mlpinterp train-lm`` on a tiny configuration (seconds): determinism, bit-identical resumption, a standard
Hugging Face directory, perplexity against a hand-computed cross-entropy, and bad input."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from typer.testing import CliRunner

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from mlpinterp.cli.main import app  # noqa: E402
from mlpinterp.lm import train as lm_train  # noqa: E402
from mlpinterp.lm.train import lr_at, train_lm  # noqa: E402
from mlpinterp.lm.train_config import LmTrainConfig  # noqa: E402
from mlpinterp.models import RunConflictError  # noqa: E402
from mlpinterp.utils.artifact import load_artifact  # noqa: E402
from mlpinterp.utils.config_docs import field_docs  # noqa: E402
from tests import cli_utils  # noqa: E402

from .artifact_utils import rewrite  # noqa: E402

runner = CliRunner()

TINY = dict(vocab_size=300, n_layer=1, d_model=16, n_head=2, n_positions=16, steps=6, batch_size=4, warmup_steps=2,
            eval_every=3, eval_progress_chunks=2, eval_chunks=8, checkpoint_every=2)


@pytest.fixture()
def text_dir(tmp_path):
    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog while the cat sat on the mat and a bird sang".split()
    d = tmp_path / "text"
    d.mkdir()
    (d / "a.txt").write_text(" ".join(rng.choice(words) for _ in range(2000)))
    (d / "b.txt").write_text(". ".join(" ".join(rng.choice(words) for _ in range(9)) for _ in range(150)))
    (d / "held_test.txt").write_text(" ".join(rng.choice(words) for _ in range(600)))
    return d


def _weights(out):
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


def test_deterministic_and_loads_as_a_standard_hugging_face_directory(tmp_path, text_dir):
    cfg = LmTrainConfig(**TINY)
    m1 = train_lm(cfg, tmp_path / "a", text_dir=text_dir, quiet=True)
    train_lm(cfg, tmp_path / "b", text_dir=text_dir, quiet=True)
    w1, w2 = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    # another seed is another model
    m3 = train_lm(LmTrainConfig(**{**TINY, "seed": 1}), tmp_path / "c", text_dir=text_dir, quiet=True)
    assert m3["held_out"]["ce"] != m1["held_out"]["ce"]

    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "a")
    assert model.config.n_layer == 1 and model.config.n_embd == 16 and model.config.n_positions == 16
    for cls in (transformers.AutoTokenizer, transformers.PreTrainedTokenizerFast):
        tok = cls.from_pretrained(tmp_path / "a")
        text = "the quick fox, 42 élan!"
        assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: any text round-trips
        assert len(tok) == m1["model"]["vocab_size"] <= 300 and tok.eos_token == "<|endoftext|>"
    from mlpinterp.lm.models import load_model
    from mlpinterp.lm.recovery import is_causal_lm

    net, _ = load_model(str(tmp_path / "a"))
    assert is_causal_lm(net) and not net.training
    assert m1["train"]["files"] == ["a.txt", "b.txt"] and m1["held_out"]["files"] == ["held_test.txt"]
    assert m1["train"]["tokens_seen"] == 6 * 4 * 16
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["held_out"] == m1["held_out"]


def test_perplexity_is_exp_of_a_hand_computed_mean_cross_entropy(tmp_path, text_dir):
    m = train_lm(LmTrainConfig(**TINY), tmp_path / "a", text_dir=text_dir, quiet=True)
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "a").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "a")
    ids = tok((text_dir / "held_test.txt").read_text())["input_ids"]
    chunks = [ids[s:s + 16] for s in range(0, len(ids) - 15, 16)][:8]  # n_positions tokens, eval_chunks of them
    assert len(chunks) == m["held_out"]["chunks"] == 8
    nll, count = 0.0, 0
    with torch.no_grad():
        for c in chunks:
            logits = model(input_ids=torch.tensor([c])).logits[0].double()
            for t in range(len(c) - 1):  # position t predicts token t + 1
                row = logits[t]
                nll += float(torch.log(torch.exp(row - row.max()).sum()) + row.max() - row[c[t + 1]])
                count += 1
    assert count == m["held_out"]["tokens"] == 8 * 15
    assert m["held_out"]["ce"] == pytest.approx(nll / count, rel=1e-6)
    assert m["held_out"]["perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-6)


def _interrupt_after(n: int, cfg, out, text_dir, monkeypatch):
    """Run ``train_lm(cfg, out)`` and stop it by a KeyboardInterrupt before its step ``n + 1``; ``_step`` stays
    patched to count calls (``calls``, cleared by the caller as needed). Returns ``(the real _step, calls)``."""
    real_step, calls = lm_train._step, []

    def counted(*args):
        if len(calls) == n:
            raise KeyboardInterrupt
        calls.append(1)
        return real_step(*args)

    monkeypatch.setattr(lm_train, "_step", counted)
    with pytest.raises(KeyboardInterrupt):
        train_lm(cfg, out, text_dir=text_dir, quiet=True)
    return real_step, calls


def test_resume_after_interruption_is_bit_identical(tmp_path, text_dir, monkeypatch):
    cfg = LmTrainConfig(**{**TINY, "dropout": 0.1})  # dropout: the torch RNG state must be restored too
    ref = train_lm(cfg, tmp_path / "ref", text_dir=text_dir, quiet=True)
    real_step, _ = _interrupt_after(5, cfg, tmp_path / "run", text_dir, monkeypatch)
    meta = load_artifact(tmp_path / "run" / "checkpoint" / "train_state", kind="lm_checkpoint").meta
    assert meta["step"] == 4 and not (tmp_path / "run" / "metrics.json").exists()
    monkeypatch.setattr(lm_train, "_step", real_step)
    res = train_lm(cfg, tmp_path / "run", text_dir=text_dir, quiet=True)
    w_ref, w = _weights(tmp_path / "ref"), _weights(tmp_path / "run")
    assert all(torch.equal(w_ref[k], w[k]) for k in w_ref)
    assert res["history"]["loss"] == ref["history"]["loss"] and res["held_out"]["ce"] == ref["held_out"]["ce"]
    # a finished run returns its metrics without training again
    monkeypatch.setattr(lm_train, "_step", lambda *a: pytest.fail("a finished run must not train"))
    assert train_lm(cfg, tmp_path / "run", text_dir=text_dir, quiet=True)["held_out"] == res["held_out"]


def test_checkpoint_of_an_earlier_version_resumes_with_the_behaviour_of_that_time(tmp_path, text_dir, monkeypatch):
    """A checkpoint written before a field of ADDED_FIELDS existed (its key absent) resumes when the request keeps
    the value recorded there, and is refused naming the field otherwise. LmTrainConfig has gained no field since its
    first version, so grad_clip poses as one added later (0.5 before it existed, not the default)."""
    from mlpinterp.lm.train_config import ADDED_FIELDS

    monkeypatch.setitem(ADDED_FIELDS, "grad_clip", 0.5)
    cfg = LmTrainConfig(**{**TINY, "grad_clip": 0.5})
    _, calls = _interrupt_after(4, cfg, tmp_path / "run", text_dir, monkeypatch)
    rewrite(tmp_path / "run" / "checkpoint" / "train_state.safetensors",  # as an earlier version wrote it
            lambda m: {**m, "config": {k: v for k, v in m["config"].items() if k != "grad_clip"}})
    (tmp_path / "run" / "run.json").unlink()  # an earlier version kept no run record
    with pytest.raises(RunConflictError, match=r"grad_clip: saved absent \(written before the field existed: 0.5\), "
                                               r"requested 1.0"):
        train_lm(LmTrainConfig(**TINY), tmp_path / "run", text_dir=text_dir, quiet=True)
    calls.clear()
    res = train_lm(cfg, tmp_path / "run", text_dir=text_dir, quiet=True)
    assert len(calls) == 2 and len(res["history"]["loss"]) == 6  # steps 5 and 6 trained on top of the checkpoint


def test_learning_rate_schedule_by_hand():
    cfg = LmTrainConfig(steps=11, warmup_steps=2, lr=1e-3, min_lr_fraction=0.1)
    assert lr_at(cfg, 0) == pytest.approx(5e-4) and lr_at(cfg, 1) == pytest.approx(1e-3)
    assert lr_at(cfg, 2) == pytest.approx(1e-3)  # cosine starts at the peak
    assert lr_at(cfg, 10) == pytest.approx(1e-4)  # ... and ends at min_lr_fraction * lr on the last step
    # half way (step 6 of the 8 decay intervals 2..10): floor + (lr - floor) (1 + cos(pi / 2)) / 2
    assert lr_at(cfg, 6) == pytest.approx(1e-4 + 9e-4 * 0.5)


@pytest.mark.parametrize(("kw", "match"), [
    ({"n_head": 3}, "n_head must divide d_model"),
    ({"vocab_size": 200}, "vocab_size must be >= 257"),
    ({"n_positions": 1}, "n_positions must be >= 2"),
    ({"lr": 0.0}, "lr must be finite and > 0"),
    ({"dropout": 1.0}, "dropout must be < 1"),
    ({"steps": 0}, "steps must be >= 1"),
])
def test_bad_config_is_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        LmTrainConfig(**kw)
    with pytest.raises(TypeError, match="steps must be an int"):
        LmTrainConfig(steps=2.0)


def test_bad_input_errors(tmp_path, text_dir):
    with pytest.raises(TypeError, match="cfg must be a LmTrainConfig"):
        train_lm({"steps": 1}, tmp_path / "x", text_dir=text_dir)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        train_lm(LmTrainConfig(**TINY), tmp_path / "x", text_dir=tmp_path / "missing")
    with pytest.raises(ValueError, match="batch_size 1000 exceeds the .* training chunks"):
        train_lm(LmTrainConfig(**{**TINY, "batch_size": 1000}), tmp_path / "x", text_dir=text_dir, quiet=True)
    short = tmp_path / "short"
    short.mkdir()
    (short / "a.txt").write_text((text_dir / "a.txt").read_text())
    (short / "tiny_test.txt").write_text("the fox")
    with pytest.raises(ValueError, match=r"held-out documents \['tiny_test.txt'\].*fewer than ctx_len=16"):
        train_lm(LmTrainConfig(**TINY), tmp_path / "y", text_dir=short, quiet=True)
    train_lm(LmTrainConfig(**TINY), tmp_path / "run", text_dir=text_dir, quiet=True)
    with pytest.raises(RunConflictError, match=r"lr: saved 0.001, requested 0.002") as e:
        train_lm(LmTrainConfig(**{**TINY, "lr": 2e-3}), tmp_path / "run", text_dir=text_dir, quiet=True)
    assert "another --out" in e.value.fix
    (text_dir / "a.txt").write_text("another corpus " * 500)
    with pytest.raises(RunConflictError, match="train_digest"):
        train_lm(LmTrainConfig(**TINY), tmp_path / "run", text_dir=text_dir, quiet=True)
    (tmp_path / "run" / "checkpoint" / "train_state.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        train_lm(LmTrainConfig(**TINY), tmp_path / "run", text_dir=text_dir, quiet=True)


def test_cli_train_lm_options_come_from_the_config(tmp_path, text_dir):
    res = runner.invoke(app, ["train-lm", "--help"], env={"COLUMNS": "400"})
    assert res.exit_code == 0
    text = cli_utils.flat(res.output)
    for name, doc in field_docs(LmTrainConfig).items():
        assert "--" + name.replace("_", "-") in text and doc[:40] in text
    args = ["train-lm", "--out", str(tmp_path / "cli"), "--text-dir", str(text_dir), "--quiet"]
    for k, v in TINY.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "held-out perplexity" in res.output
    assert json.loads((tmp_path / "cli" / "metrics.json").read_text())["config"]["d_model"] == 16


@pytest.mark.parametrize(("args", "match"), [
    (["--n-head", "3"], "Error: --n-head must divide d_model"),
    (["--text-dir", "/nonexistent/dir"], "Error: text directory '/nonexistent/dir' is not a directory"),
])
def test_cli_train_lm_expected_failures(tmp_path, args, match):
    res = runner.invoke(app, ["train-lm", "--out", str(tmp_path / "o"), "--quiet", *args])
    assert res.exit_code == 1 and match in cli_utils.flat(res.output) and "Traceback" not in res.output
