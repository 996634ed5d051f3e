"""``mlpinterp train``: extending a finished run, refusing conflicting settings, help defaults that are the values
used, and expected failures as one message with the fix (no traceback)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.models import checkpoint_steps
from mlpinterp.studies.polynomial.run import DATASET_DEFAULTS
from tests.cli_utils import flat

SMALL = ["--d-hidden", "16", "--warmup-steps", "1000", "--quiet"]


def _train(out, *extra):
    return CliRunner().invoke(app, ["train", "--out", str(out), *SMALL, *extra])


def test_train_extends_a_finished_run_and_says_what_it_did(tmp_path):
    out = tmp_path / "D"
    r = _train(out, "--steps", "64")
    assert r.exit_code == 0, r.output
    text = flat(r.output)
    assert "note: --warmup-steps 1000 > --steps 64" in text and "trained to step 64" in text
    r = _train(out, "--steps", "128")  # the 64-step run used warm-up 1000 as given: extending needs no new flag
    assert r.exit_code == 0, r.output
    assert "resumed at step 64, trained to step 128" in flat(r.output)
    meta = json.loads((out / "step_0000128.json").read_text())
    assert meta["config"]["warmup_steps"] == 1000 and meta["config"]["steps"] == 128
    assert sorted(int(p.stem[5:]) for p in out.glob("step_*.json")) == checkpoint_steps(128)
    r = _train(out, "--steps", "96")
    assert r.exit_code == 0 and "already trained: nothing to do" in flat(r.output)


def test_train_conflicts_and_corrupt_files_print_the_fix_not_a_traceback(tmp_path):
    out = tmp_path / "D"
    assert _train(out, "--steps", "32").exit_code == 0
    r = _train(out, "--steps", "64", "--lr", "1e-3", "--seed", "2")
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit)
    text = flat(r.output)
    assert f"Error: --out {str(out)!r} holds" in text and "lr: saved 0.005, requested 0.001" in text and "seed: saved 0, requested 2" in text
    assert "Fix: to continue the run in" in text and "rerun with --lr 0.005 --seed 0" in text
    assert "pass another --out" in text and "Traceback" not in r.output

    (out / "step_0000032.json").write_text("{cut")
    r = _train(out, "--steps", "64")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "step_0000032.json' is not valid JSON" in flat(r.output) and "delete it" in flat(r.output)

    f = tmp_path / "file"
    f.write_text("x")
    r = _train(f)
    assert r.exit_code == 1 and "is an existing file, expected a directory" in flat(r.output)
    assert "Traceback" not in r.output
    r = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "m"), "--dataset", "mnist", "--data",
                                 str(tmp_path / "nowhere"), "--quiet"])
    assert r.exit_code == 1 and "missing IDX file" in flat(r.output) and "Fix: pass --data DIR" in flat(r.output)


def test_traceback_env_var_reraises(tmp_path, monkeypatch):
    out = tmp_path / "D"
    assert _train(out, "--steps", "16").exit_code == 0
    (out / "step_0000016.json").write_text("{cut")
    monkeypatch.setenv("MLPINTERP_TRACEBACK", "1")
    r = _train(out, "--steps", "24")
    assert r.exit_code == 1 and isinstance(r.exception, ValueError) and "not valid JSON" in str(r.exception)


@pytest.mark.parametrize("command", [["train"], ["reproduce", "polynomial"]])
def test_help_defaults_are_the_values_used(command):
    """Help shows DATASET_DEFAULTS (the values the commands resolve to), not a hand-typed number."""
    text = flat(CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"}).output)
    lr = {d["lr"] for d in DATASET_DEFAULTS.values()}
    assert len(lr) == 1 and f"[default: ({next(iter(lr)):g})]" in text
    assert "digits 256" in text and "mnist 512" in text  # d_hidden per dataset
    assert "2e-3" not in text and "0.002" not in text  # the old, wrong help default


def test_train_without_options_uses_the_defaults_its_help_shows(tmp_path):
    r = _train(tmp_path / "D", "--steps", "16")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "D" / "step_0000016.json").read_text())["config"]
    assert cfg["lr"] == DATASET_DEFAULTS["digits"]["lr"]


def test_cli_import_stays_light():
    """--help is generated from the configs without importing torch (0.5 s instead of several seconds)."""
    import subprocess
    import sys

    code = "import sys, mlpinterp.cli.main; print(sorted(m for m in ('torch', 'sklearn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("device", ["banana", "cpu:3"])
def test_train_unknown_device_is_refused_before_anything_is_written(tmp_path, device):
    r = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "run"), "--steps", "5", "--device", device])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit) and "Traceback" not in r.output
    assert "Error: --device" in flat(r.output) and "Fix: pass --device cpu" in flat(r.output)
    assert not (tmp_path / "run").exists()


def test_train_classifier_checks_the_device_before_creating_the_run(tmp_path):
    from mlpinterp.data import load_dataset
    from mlpinterp.models import ClassifierConfig, train_classifier

    data = load_dataset("digits")
    cfg = ClassifierConfig(d_in=data.d_in, n_classes=data.n_classes, d_hidden=4, steps=2, warmup_steps=1)
    with pytest.raises(ValueError, match="device must be"):
        train_classifier(cfg, data, tmp_path / "run", device="banana")
    assert not (tmp_path / "run").exists()


def test_a_run_of_another_command_names_that_command_in_the_fix(tmp_path):
    out = tmp_path / "D"
    assert _train(out, "--steps", "16").exit_code == 0
    r = CliRunner().invoke(app, ["reproduce", "polynomial", "--quick", "--quiet", "--out", str(out)])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    text = flat(r.output)
    assert "Fix: " in text and "holds a run of `mlpinterp train`: continue it with that command" in text
    assert "settings without a CLI option" not in text
