"""``reproduce transformer`` end to end on tiny random models saved locally (encoder and causal LM)."""

from __future__ import annotations

import json
from dataclasses import replace
from html.parser import HTMLParser

import pytest

pytest.importorskip("transformers")
from typer.testing import CliRunner  # noqa: E402

from mlpinterp.cli.main import app  # noqa: E402
from mlpinterp.lm.capture_config import CaptureConfig
from mlpinterp.poly.finetune_config import FinetuneConfig  # noqa: E402
from mlpinterp.studies.transformer.run import run_transformer  # noqa: E402
from mlpinterp.studies.transformer.settings import TransformerExperiment  # noqa: E402
from tests.ffn_tiny import TEXTS, tiny_bert, tiny_gpt2, tiny_llama, tokenizer  # noqa: E402
from tests.helpers import as_earlier_run_record  # noqa: E402


def _saved(tmp_path, family):
    d = tmp_path / family
    {"bert": tiny_bert, "gpt2": tiny_gpt2, "llama": tiny_llama}[family]().save_pretrained(d)
    tokenizer().save_pretrained(d)
    return str(d)


def _exp(model, **kw):
    base = dict(model=model, degrees=(1, 2), capture=CaptureConfig(ctx_len=16, seq_batch=8, max_tokens=1500,
                                                                     keep_fit=1500, passage_chunks=2),
                mixture_components=2, mixture_fit_samples=500,
                hybrid=FinetuneConfig(steps=5, batch_size=64, eval_every=5), splice_sequences=4, n_output_dirs=2,
                n_eigen=3, run="quick")
    base.update(kw)
    return TransformerExperiment(**base)


class _Imgs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.srcs.append(dict(attrs)["src"])


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_reproduce_transformer_end_to_end(tmp_path, family):
    model = _saved(tmp_path, family)
    out = tmp_path / "run"
    res = run_transformer(out, _exp(model), quiet=True, texts=TEXTS)
    assert len(res["layers"]) == 2 and res["n_blocks"] == 2
    for lay in res["layers"]:
        assert set(lay["models"]) == {"gaussian", "mixture", "data", "hybrid"}
        for m, per in lay["models"].items():
            for n, e in per.items():
                assert 0 <= e["heldout"]["fvu"] < 10 and -1 <= e["heldout"]["cosine"] <= 1, (m, n)
        # degree 1 of the data projection is the OLS baseline: no input model beats it at degree 1 in-sample
        assert lay["models"]["data"]["1"]["under_model"]["fvu"] <= lay["models"]["hybrid"]["1"]["under_model"]["fvu"] + 1e-9
        sp = lay["splice"]
        assert sp["kind"] == ("embedding" if family == "bert" else "lm")
        assert all(e["under_model"]["method"].startswith("exact") for m in ("gaussian", "mixture")
                   for e in lay["models"][m].values())
        assert lay["features"]["eigenvalues"] and lay["recommended"] in lay["models"]
        if family != "bert":
            assert len(lay["features"]["output_direction_tokens"]) == 2
    text = (out / "report.md").read_text()
    assert "quick run" in text and "reproduced" not in text.replace("not a reproduction", "")
    parser = _Imgs()
    parser.feed((out / "report.html").read_text())
    assert len(parser.srcs) == text.count("![") >= 5
    assert all(s.startswith("data:image/png;base64,") for s in parser.srcs)
    # resumable: a second run reuses the capture and the finished blocks
    stamp = (out / "layers" / "0.json").stat().st_mtime_ns
    again = run_transformer(out, _exp(model), quiet=True, texts=TEXTS)
    assert (out / "layers" / "0.json").stat().st_mtime_ns == stamp
    assert again["layers"][0]["models"] == res["layers"][0]["models"]
    with pytest.raises(ValueError, match="another configuration"):
        run_transformer(out, _exp(model, degrees=(1,)), quiet=True, texts=TEXTS)


def test_run_directory_of_an_earlier_version_resumes_with_the_behaviour_of_that_time(tmp_path, monkeypatch):
    """A config.json written before ``saes`` and the fine-tune's ``optimizer`` / ``momentum`` existed (their keys
    absent) resumes, reusing the capture and the finished
    block, when the request asks for no SAE alignment (the behaviour of that time), and is refused naming the field
    when it asks for one."""
    import mlpinterp.studies.transformer.report as report
    from mlpinterp.models import RunConflictError
    from mlpinterp.studies.transformer.settings import ADDED_FIELDS

    monkeypatch.setattr(report, "write_transformer_report", lambda *a, **k: None)  # figures: seconds, not tested here
    model, out = _saved(tmp_path, "bert"), tmp_path / "run"
    exp = _exp(model, layers=(1,), input_models=("gaussian", "data"))
    first = run_transformer(out, exp, quiet=True, texts=TEXTS)
    as_earlier_run_record(out)  # an earlier version recorded no digest of config.json
    saved = json.loads((out / "config.json").read_text())
    popped = {}
    for k in ADDED_FIELDS:  # as an earlier version wrote it ("hybrid.optimizer": a field of the nested config)
        outer, _, inner = k.partition(".")
        popped[k] = saved[outer].pop(inner) if inner else saved.pop(k)
    assert popped == {"saes": [], "hybrid.optimizer": "adamw", "hybrid.momentum": 0.9}
    (out / "config.json").write_text(json.dumps(saved))
    with pytest.raises(RunConflictError, match=r"saes: saved absent \(written before the field existed: \(\)\), "
                                               r"requested \[\[1, 'sae'\]\]"):
        run_transformer(out, replace(exp, saes=((1, "sae"),)), quiet=True, texts=TEXTS)
    stamps = [(out / f).stat().st_mtime_ns for f in ("capture.safetensors", "layers/1.json")]
    again = run_transformer(out, exp, quiet=True, texts=TEXTS)
    assert [(out / f).stat().st_mtime_ns for f in ("capture.safetensors", "layers/1.json")] == stamps
    assert again["layers"] == first["layers"]


def test_bad_configuration_and_cli_errors(tmp_path):
    with pytest.raises(ValueError, match="input_models"):
        TransformerExperiment(input_models=("gaussian", "kde"))
    with pytest.raises(ValueError, match="degrees"):
        TransformerExperiment(degrees=(0, 2))
    model = _saved(tmp_path, "bert")
    with pytest.raises(ValueError, match="out of range"):
        run_transformer(tmp_path / "r", _exp(model, layers=(5,)), quiet=True, texts=TEXTS)
    runner = CliRunner()
    r = runner.invoke(app, ["reproduce", "transformer", "--model", str(tmp_path / "missing"), "--out",
                            str(tmp_path / "c"), "--quiet"])
    assert r.exit_code == 1 and "does not exist" in r.output and "Traceback" not in r.output
    txt = tmp_path / "t.txt"
    txt.write_text("too short")
    r = runner.invoke(app, ["reproduce", "transformer", "--model", model, "--text", str(txt), "--out",
                            str(tmp_path / "d"), "--quiet"])
    assert r.exit_code == 1 and "--ctx-len" in r.output and "Traceback" not in r.output
    json.dumps(r.output)


def test_sae_alignment_needs_an_sae_on_the_blocks_input(tmp_path):
    from mlpinterp.sae.io import save_sae
    from mlpinterp.sae.topk import SaeConfig, TopKSae

    model = _saved(tmp_path, "bert")
    good = save_sae(TopKSae(16, SaeConfig(d_sae=32, k=4), hook_point="encoder.layer.1.attention.output"), tmp_path / "sae")
    res = run_transformer(tmp_path / "r", _exp(model, layers=(1,), input_models=("gaussian", "data"),
                                               saes=((1, str(good)),)), quiet=True, texts=TEXTS)
    a = res["layers"][0]["features"]["sae"]
    assert len(a["max_cos"]) == 3 and 0 < a["random_mean"] < 1 and a["hook_point"] == "encoder.layer.1.attention.output"
    assert "SAE decoder" in (tmp_path / "r" / "report.md").read_text()
    wrong = save_sae(TopKSae(16, SaeConfig(d_sae=32, k=4), hook_point="encoder.layer.1.output"), tmp_path / "sae2")
    with pytest.raises(ValueError, match="is not the input of FFN block"):
        run_transformer(tmp_path / "r2", _exp(model, layers=(1,), input_models=("data",), saes=((1, str(wrong)),)),
                        quiet=True, texts=TEXTS)
    narrow = save_sae(TopKSae(8, SaeConfig(d_sae=32, k=4)), tmp_path / "sae3")
    with pytest.raises(ValueError, match="d_in = 8"):
        run_transformer(tmp_path / "r3", _exp(model, layers=(1,), input_models=("data",), saes=((1, str(narrow)),)),
                        quiet=True, texts=TEXTS)
    with pytest.raises(ValueError, match="not analysed"):
        run_transformer(tmp_path / "r4", _exp(model, layers=(1,), saes=((0, str(good)),)), quiet=True, texts=TEXTS)
