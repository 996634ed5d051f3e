"""``mlpinterp reproduce apd`` end to end on tiny step counts (targets pre-placed to keep it fast)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.studies.apd.run import reproduce
from mlpinterp.studies.apd.settings import PRESETS, apd_config
from mlpinterp.toys import RESID_PRESETS, TMSConfig, build_resid_mlp, save_toy, train_tms
from mlpinterp.toys.settings import setting_spec, target_config

torch.set_num_threads(1)
# torch's first forward-mode AD call scripts its jvp decompositions with the deprecated torch.jit.script
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def test_cli_tms_quick(tmp_path):
    model, info = train_tms(TMSConfig(steps=500, batch_size=512, n_instances=2), quiet=True)
    # a stand-in for the preset's target (trained shorter to keep the test fast): it carries the preset's recipe
    save_toy(model, tmp_path / "seed0" / "target", {**info, "config": target_config("tms-5-2", 0, True)})
    res = CliRunner().invoke(app, ["reproduce", "apd", "--setting", "tms-5-2", "--seeds", "1", "--out",
                                   str(tmp_path), "--quick", "--quiet", "--steps", "40"])
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["config"]["steps"] == 40 and metrics["quick"]
    assert 0.0 <= metrics["summary"]["mmcs"][0] <= 1.0
    report = (tmp_path / "report.md").read_text()
    # the paper's Table 1 as cited: a spread that rounds to 0.000 is written as such, never "± 0"
    assert "0.998 (spread < 0.0005)" in report and "0.893 ± 0.004" in report and "± 0.000" not in report
    ps = metrics["paper_statistic"]  # one seed here: the paper's way is that seed, ± over the 5 features
    assert ps["n_features"] == 5 and ps["mmcs"] == pytest.approx(metrics["summary"]["mmcs"][0])
    assert "computed the paper's way" in report and metrics["failed_seeds"] in (0, 1)
    for f in ("losses.png", "components.png", "components.safetensors", "apd/checkpoint.safetensors"):
        assert (tmp_path / "seed0" / f).exists(), f
    # rerunning resumes from the finished checkpoint and reproduces the metrics exactly
    res2 = CliRunner().invoke(app, ["reproduce", "apd", "--setting", "tms-5-2", "--seeds", "1", "--out",
                                    str(tmp_path), "--quick", "--quiet", "--steps", "40"])
    assert res2.exit_code == 0, res2.output
    again = json.loads((tmp_path / "metrics.json").read_text())
    assert again["summary"]["mmcs"] == metrics["summary"]["mmcs"]
    # a different learning rate in the same directory is refused (the run directory holds another configuration)
    res3 = CliRunner().invoke(app, ["reproduce", "apd", "--setting", "tms-5-2", "--seeds", "1", "--out",
                                    str(tmp_path), "--quick", "--quiet", "--steps", "40", "--lr", "0.01"])
    assert res3.exit_code == 1, res3.output
    assert "Error:" in res3.output and "lr: saved " in res3.output and "run.json" in res3.output, res3.output
    # report.html embeds every figure the Markdown references
    md, page = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert md.count("![") == page.count('<img src="data:image/png;base64,') == 2
    assert "quick run: not a reproduction" in md and "± 0 " not in md


def test_reproduce_resid_and_gated_tiny(tmp_path):
    model = build_resid_mlp(RESID_PRESETS["resid-mlp-1"])
    save_toy(model, tmp_path / "r" / "seed0" / "target", {"loss": 0.0, "config": target_config("resid-mlp-1", 0, True)})
    out = reproduce("resid-mlp-1", 1, tmp_path / "r", quick=True, quiet=True, overrides={"steps": 3}, n_eval=400)
    s = out["summary"]
    assert {"scrubbed_mse", "anti_scrubbed_mse", "per_feature_mse_top1_mean", "dead_components"} <= set(s)
    assert (tmp_path / "r" / "seed0" / "scrubbing_hist.png").exists()
    out = reproduce("gated-trig", 1, tmp_path / "g", quick=True, quiet=True,
                    overrides={"steps": 5, "batch_size": 256}, n_eval=400)
    assert 0.0 <= out["summary"]["gt_param_mmcs"][0] <= 1.0
    assert (tmp_path / "g" / "seed0" / "functions.png").exists()


def test_presets_and_errors():
    assert PRESETS["tms-5-2"].topk == 0.211 and PRESETS["tms-40-10"].C == 50
    assert PRESETS["resid-mlp-1"].C == 130 and PRESETS["resid-mlp-2"].C == 200
    assert apd_config("tms-5-2", True, 3).seed == 3
    for s in PRESETS:
        apd_config(s, False, 0).validate()
        apd_config(s, True, 0).validate()
    with pytest.raises(ValueError, match="setting"):
        setting_spec("tms-3-1")
    with pytest.raises(ValueError, match="setting"):
        reproduce("tms-3-1", 1, "/tmp/nowhere")
    with pytest.raises(ValueError, match="seeds"):
        reproduce("tms-5-2", 0, "/tmp/nowhere")
