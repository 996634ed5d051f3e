"""Guards of ``reproduce apd`` / ``reproduce spd`` that keep wrong or mislabelled numbers out: one method per
``--out``, ``--apd-run`` checked before training, devices checked before training, overridden presets get no verdict."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.studies import report as rep
from mlpinterp.studies.apd.report import render_markdown as apd_report
from mlpinterp.studies.paramspace.rundir import check_out_dir, method_of, recipe_overrides
from mlpinterp.studies.spd.compare import read_apd_run
from mlpinterp.utils.validation import check_device

_PER = [{"seed": 0, "mmcs": 0.998, "ml2r": 0.89, "max_cos": [0.998] * 5, "l2_ratio": [0.89] * 5}]
_APD = {"method": "apd", "setting": "tms-5-2", "fidelity": "ours", "quick": False, "config": {"topk": 0.211},
        "per_seed": _PER}


def _write(d, metrics):
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.json").write_text(json.dumps(metrics))
    return d


def test_method_of_new_and_old_metrics():
    assert method_of({"method": "spd"}) == "spd" and method_of({"method": "apd"}) == "apd"
    assert method_of({"config": {"topk": 1.0, "C": 5}}) == "apd"  # written before "method" existed
    assert method_of({"config": {"d_gate": 16, "C": 20}}) == "spd"
    assert method_of({"config": {"d_gate": 16, "topk": 1.0}}) is None  # ambiguous: neither
    assert method_of({"method": "mfr", "config": {"topk": 1.0}}) is None
    assert method_of({"ce": 3.2}) is None


def test_check_out_dir_one_method_per_directory(tmp_path):
    apd_dir = _write(tmp_path / "apd", _APD)
    assert check_out_dir(apd_dir, "apd") == apd_dir
    with pytest.raises(ValueError, match=r"holds a `reproduce apd` run .*not a `reproduce spd` run"):
        check_out_dir(apd_dir, "spd")
    spd_dir = _write(tmp_path / "spd", {"method": "spd", "config": {"d_gate": 16}})
    with pytest.raises(ValueError, match="holds a `reproduce spd` run"):
        check_out_dir(spd_dir, "apd")
    other = _write(tmp_path / "lm", {"ce": 3.2})
    with pytest.raises(ValueError, match="results of another command"):
        check_out_dir(other, "spd")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is an existing file, expected a directory"):
        check_out_dir(tmp_path / "file", "apd")
    with pytest.raises(ValueError, match="empty path"):
        check_out_dir("", "apd")
    assert check_out_dir(tmp_path / "new", "spd") == tmp_path / "new"  # a new directory is fine


def test_read_apd_run_refuses_what_is_not_a_matching_apd_run(tmp_path):
    good = _write(tmp_path / "good", _APD)
    assert read_apd_run(good, "tms-5-2")["per_seed"] == _PER
    cases = {
        "spd": ({**_APD, "method": "spd", "config": {"d_gate": 16}}, "it is an SPD run"),
        "noconfig": ({k: v for k, v in _APD.items() if k not in ("method", "config")}, "not written by `reproduce apd`"),
        "ref": ({**_APD, "fidelity": "reference"}, "--fidelity 'reference'"),
        "noseed": ({**_APD, "per_seed": [{k: v for k, v in _PER[0].items() if k != "seed"}]}, r"per_seed\[0\] has no 'seed'"),
        "intrec": ({**_APD, "per_seed": [1]}, r"per_seed\[0\] must be a JSON object"),
        "nullmmcs": ({**_APD, "per_seed": [{**_PER[0], "mmcs": None}]}, r"per_seed\[0\]\['mmcs'\] is invalid"),
        "nanml2r": ({**_APD, "per_seed": [{**_PER[0], "ml2r": float("nan")}]}, r"\['ml2r'\] is invalid"),
        "nullcos": ({**_APD, "per_seed": [{**_PER[0], "max_cos": None}]}, r"\['max_cos'\] is invalid"),
        "strratio": ({**_APD, "per_seed": [{**_PER[0], "l2_ratio": "abc"}]}, r"\['l2_ratio'\] is invalid"),
        "nullconfig": ({**_APD, "config": None}, "'config' must be a JSON object"),
    }
    for name, (metrics, msg) in cases.items():
        with pytest.raises(ValueError, match=msg):
            read_apd_run(_write(tmp_path / name, metrics), "tms-5-2")
    with pytest.raises(ValueError, match="this SPD run's own --out"):
        read_apd_run(good, "tms-5-2", out=good)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(ValueError, match="not valid JSON.*rerunning `reproduce apd`"):
        read_apd_run(tmp_path / "bad", "tms-5-2")


def test_check_device():
    assert check_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="the CPU is one device"):
        check_device("cpu:1")
    with pytest.raises(ValueError, match="must be 'cpu', 'cuda\\[:N\\]' or 'mps'"):
        check_device("meta")
    with pytest.raises(ValueError, match="must be a torch device"):
        check_device("nonsense")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="MPS is not available"):
            check_device("mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            check_device("cuda:0")
    else:
        with pytest.raises(ValueError, match="CUDA device"):
            check_device(f"cuda:{torch.cuda.device_count()}")


@pytest.mark.parametrize("method", ["apd", "spd"])
def test_cli_refuses_before_training(tmp_path, method):
    """Bad --device, --lr, --out and a foreign run directory are refused before the target is trained."""
    base = ["reproduce", method, "--setting", "tms-5-2", "--seeds", "1", "--quick", "--quiet", "--steps", "2"]
    for extra, code, msg in ((["--device", "mps"], 1, "MPS is not available"),
                             (["--device", "cpu:1"], 1, "the CPU is one device"),
                             (["--lr", "0"], 1, "--lr must be > 0"), (["--lr", "nan"], 1, "--lr must be > 0")):
        if extra[-1] == "mps" and torch.backends.mps.is_available():
            continue
        out = tmp_path / f"o{len(extra)}{extra[-1].replace(':', '')}"
        res = CliRunner().invoke(app, [*base, "--out", str(out), *extra])
        assert res.exit_code == code and msg in res.output and "Traceback" not in res.output, res.output
        assert not (out / "seed0").exists()  # nothing trained
    res = CliRunner().invoke(app, [*base, "--out", ""])
    assert res.exit_code == 1 and "current one" in res.output and "Traceback" not in res.output, res.output
    other = _write(tmp_path / "other", {"method": "spd" if method == "apd" else "apd"})
    res = CliRunner().invoke(app, [*base, "--out", str(other)])
    assert res.exit_code == 1 and "writing there would replace them" in res.output, res.output
    assert not (other / "seed0").exists()


def test_overridden_preset_gets_no_verdict():
    assert rep.run_kind(False) == "full" and rep.run_kind(True, {"steps": 5}) == "quick"
    assert rep.run_kind(False, {"steps": 5}) == "custom"
    assert rep.run_kind_note("full") == ""
    assert rep.run_kind_note("custom", {"steps": 5, "lr": 0.1}) == " (preset overridden: lr = 0.1, steps = 5; not a reproduction)"
    assert str(rep.verdict(False, "x", run="custom")).startswith("custom run: not a reproduction")
    per = [{**_PER[0], "seconds": 1.0}]
    ps = {"seed": 0, "of_seeds": 1, "mmcs": 0.998, "mmcs_std_over_features": 0.0, "ml2r": 0.89,
          "ml2r_std_over_features": 0.0, "n_features": 5}
    apd = {"setting": "tms-5-2", "quick": False, "overrides": {"steps": 5}, "fidelity": "ours", "paper":
           {"mmcs": (0.998, 0.0), "ml2r": (0.893, 0.004)}, "per_seed": per, "threads": 1, "summary": {},
           "config": {}, "failed_seeds": 0, "paper_statistic": ps}
    md = apd_report(apd)
    assert "preset overridden: steps = 5; not a reproduction" in md and "Verdict: custom run: not a reproduction" in md
    assert "Verdict: reproduced" not in md
    assert "Verdict: reproduced" in apd_report({**apd, "overrides": {}})  # the same numbers at the preset
    # the SPD report: tests/test_spd_experiments.py::test_cli_tms_quick_two_seeds_report_and_resume


def test_recipe_overrides_ignore_execution_fields_and_preset_values():
    from mlpinterp.studies.spd.settings import spd_config

    preset = spd_config("tms-5-2", False, 0)
    assert recipe_overrides(preset, {"compile": False, "log_every": 7, "steps": preset.steps}) == {}
    assert recipe_overrides(preset, {"steps": 5, "lr": preset.lr}) == {"steps": 5}
    assert recipe_overrides(preset, None) == {}


@pytest.mark.parametrize("quick", ["no", 1, None])
def test_quick_must_be_a_bool(tmp_path, quick):
    """``quick`` is refused unless a bool: a string such as "no" used to be truthy, so the quick preset (and a
    --quick target recipe) was run and recorded as ``"quick": "no"`` without a word."""
    from mlpinterp.studies.apd import run as apd
    from mlpinterp.studies.apd import settings as apd_settings
    from mlpinterp.studies.spd import run as spd
    from mlpinterp.studies.spd import settings as spd_settings
    from mlpinterp.toys import settings as toy_settings

    for call in (lambda: spd_settings.spd_config("tms-5-2", quick, 0), lambda: apd_settings.apd_config("tms-5-2", quick, 0),
                 lambda: toy_settings.target_config("resid-mlp-1", 0, quick, "reference"),
                 lambda: toy_settings.check_target("tms-5-2", 0, tmp_path / "t", quick),
                 lambda: spd.reproduce("tms-5-2", 1, tmp_path / "s", quick=quick),
                 lambda: apd.reproduce("tms-5-2", 1, tmp_path / "a", quick=quick)):
        with pytest.raises(TypeError, match=rf"quick must be True or False, got {type(quick).__name__} {quick!r}"):
            call()
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize("seeds, error, message", [("3", TypeError, "seeds must be an int, got str '3'"),
                                                   (True, TypeError, "seeds must be an int, got bool True"),
                                                   (1.5, TypeError, "seeds must be an int, got float 1.5"),
                                                   (0, ValueError, "seeds must be >= 1, got 0")])
def test_apd_reproduce_seeds_must_be_an_int(tmp_path, seeds, error, message):
    """``reproduce apd``'s seeds, as SPD's: before, "3" raised a bare "'<' not supported", 1.5 a range() error after
    the checks, and True ran one seed."""
    from mlpinterp.studies.apd.run import reproduce

    with pytest.raises(error, match=message):
        reproduce("tms-5-2", seeds, tmp_path / "a", quick=True, quiet=True, overrides={"steps": 1})
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("method", ["apd", "spd"])
@pytest.mark.parametrize("n_eval, error", [(0, ValueError), (2.5, TypeError)])
def test_reproduce_n_eval_checked_before_training(tmp_path, method, n_eval, error):
    """``n_eval`` is refused, naming it, before a target is trained (before: SPD trained and decomposed the first
    seed, then failed with "n must be >= 1"; APD's TMS evaluation ignored it)."""
    from mlpinterp.studies.apd import run as apd
    from mlpinterp.studies.spd import run as spd

    reproduce = apd.reproduce if method == "apd" else spd.reproduce
    with pytest.raises(error, match=r"n_eval must be"):
        reproduce("tms-5-2", 1, tmp_path / "r", quick=True, quiet=True, overrides={"steps": 1}, n_eval=n_eval)
    assert not (tmp_path / "r").exists()


def test_path_arguments_of_another_type_are_named(tmp_path):
    """``out`` and ``apd_run`` that are not paths are refused naming them (before: pathlib's "expected str, bytes or
    os.PathLike object, not int", naming neither)."""
    from mlpinterp.studies.apd import run as apd
    from mlpinterp.studies.spd import run as spd

    for bad in (5, None):
        with pytest.raises(TypeError, match=rf"out must be a directory path \(str or os.PathLike\), got "
                                            rf"{type(bad).__name__}"):
            check_out_dir(bad, "spd")
        for reproduce in (apd.reproduce, spd.reproduce):
            with pytest.raises(TypeError, match="out must be a directory path"):
                reproduce("tms-5-2", 1, bad, quick=True, quiet=True)
        with pytest.raises(TypeError, match=rf"apd_run must be a path of a `reproduce apd` run directory \(str or "
                                            rf"os.PathLike\), got {type(bad).__name__}"):
            read_apd_run(bad, "tms-5-2", tmp_path / "s")
    with pytest.raises(TypeError, match="apd_run must be a path"):
        spd.reproduce("tms-5-2", 1, tmp_path / "s", quick=True, quiet=True, apd_run=5)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("name", [["tms-5-2"], {}, None, "bogus"])
def test_setting_names_that_are_not_known_strings_are_named(tmp_path, name):
    """A setting that is not one of the names (a list, a dict, None) is the usual "setting must be one of" ValueError
    (before: "unhashable type: 'list'", or an AttributeError from removesuffix/startswith), and SPD's target_fidelity
    no longer answers "reference" for an unknown name."""
    from mlpinterp.studies.apd import settings as apd_settings
    from mlpinterp.studies.spd import run as spd
    from mlpinterp.studies.spd import settings as spd_settings
    from mlpinterp.toys import settings as toy_settings

    for call in (lambda: spd_settings.spd_config(name, True, 0), lambda: apd_settings.apd_config(name, True, 0),
                 lambda: toy_settings.setting_spec(name), lambda: toy_settings.target_config(name, 0, True),
                 lambda: toy_settings.check_target(name, 0, tmp_path / "t", True),
                 lambda: toy_settings.get_target(name, 0, tmp_path / "t", True, True),
                 lambda: spd.spd_target(name, 0, tmp_path / "t", True, True), lambda: spd_settings.target_fidelity(name)):
        with pytest.raises(ValueError, match=r"setting must be one of \("):
            call()
    with pytest.raises(ValueError, match="fidelity='reference' is defined for"):
        apd_settings.reference_overrides(name)
    assert not any(tmp_path.iterdir())
