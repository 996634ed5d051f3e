"""Resumable APD/SPD checkpoints refuse malformed, mis-shaped, mis-typed or non-finite state with a ValueError naming
the file and the fix; a diverging run says so (step, lr) and never writes a non-finite checkpoint; the JSON beside a
safetensors file is read with ``read_json`` (non-UTF-8 names the file)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from mlpinterp.apd import APDConfig
from mlpinterp.apd import decompose as apd_decompose
from mlpinterp.cli.main import app
from mlpinterp.spd import SPDConfig
from mlpinterp.spd import decompose as spd_decompose
from mlpinterp.toys import TMS, as_linears, load_toy, save_toy, sparse_features, step_generator
from mlpinterp.toys.settings import target_config
from mlpinterp.utils.artifact import load_artifact, read_safetensors, save_artifact
from mlpinterp.utils.checkpoint import TrainingDiverged, check_loss_finite, save_training_state

from .artifact_utils import rewrite
from .cli_utils import flat

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

FIX = "delete the checkpoint"


def _model():
    torch.manual_seed(0)
    return TMS(5, 2)


def _spd_model():
    return as_linears(_model())


def _sample(step):
    return sparse_features(64, 5, 0.05, generator=step_generator(3, step))


def _apd_cfg(**kw):
    return APDConfig(**{**dict(C=5, steps=4, batch_size=64, log_every=1, checkpoint_every=2), **kw})


def _spd_cfg(**kw):
    return SPDConfig(**{**dict(targets=("linear1", "linear2"), C=4, steps=4, batch_size=64, log_every=1,
                               checkpoint_every=2, lr=1e-2), **kw})


@pytest.fixture(scope="module")
def apd_ckpt(tmp_path_factory):
    """A finished 4-step APD run directory (checkpoint at step 4)."""
    d = tmp_path_factory.mktemp("apd") / "run"
    apd_decompose(_model(), _sample, _apd_cfg(), out_dir=d, quiet=True)
    return d


def _copy(src, dst, meta=None, raw=None, tensors=None):
    shutil.copytree(src, dst)
    if meta is not None or tensors is not None:  # a wrong content with a valid hash (a faulty writer)
        rewrite(dst / "checkpoint.safetensors", meta, tensors=tensors)
    if raw is not None:
        (dst / "checkpoint.json").write_bytes(raw)
    return dst


def _without(d, key):
    return {k: v for k, v in d.items() if k != key}


@pytest.mark.parametrize("name,meta,raw,msg", [
    ("list", lambda m: [], None, r"checkpoint.json' holds a JSON list, expected a JSON object"),
    ("string", lambda m: "x", None, r"checkpoint.json' holds a JSON str, expected a JSON object"),
    ("nostep", lambda m: _without(m, "step"), None, r"checkpoint.json' lacks the field\(s\) \['step'\]"),
    ("nohistory", lambda m: _without(m, "history"), None, r"lacks the field\(s\) \['history'\]"),
    ("confignull", lambda m: {**m, "config": None}, None, r"has 'config' = None \(NoneType\), expected a JSON object"),
    ("stepstr", lambda m: {**m, "step": "abc"}, None, r"'step' = 'abc', expected an integer in \[0, 4\]"),
    ("stepbig", lambda m: {**m, "step": 99}, None, r"'step' = 99, expected an integer in \[0, 4\] \(the configured"),
    ("stepneg", lambda m: {**m, "step": -1}, None, r"'step' = -1"),
    ("stepbool", lambda m: {**m, "step": True}, None, r"'step' = True"),
    ("steplower", lambda m: {**m, "step": 2}, None, r"opt.0.step = 4.0, expected an integer in \[0, 2\]"),
    ("history", lambda m: {**m, "history": {"a": 1}}, None, r"'history' of type dict, expected a JSON list"),
    ("seconds", lambda m: {**m, "seconds": "soon"}, None, r"'seconds' = 'soon', expected a finite number"),
    ("utf8", None, b"\xff\xfe{}", r"checkpoint.json' is not valid JSON \('utf-8' codec can't decode"),
    ("json", None, b"{\"step\": ", r"checkpoint.json' is not valid JSON"),
])
def test_malformed_metadata_is_refused_naming_the_file(apd_ckpt, tmp_path, name, meta, raw, msg):
    d = _copy(apd_ckpt, tmp_path / name, meta=meta, raw=raw)
    with pytest.raises(ValueError, match=msg) as e:
        apd_decompose(_model(), _sample, _apd_cfg(), out_dir=d, quiet=True)
    assert str(d) in str(e.value) and FIX in str(e.value) and "another out directory" in str(e.value)


def _set(key, value):
    return lambda t: {**t, key: value}


@pytest.mark.parametrize("name,tensors,msg", [
    ("shape", _set("comp.A.W", torch.zeros(3)), r"tensor comp.A.W of shape \[3\] and dtype torch.float32, expected "
                                                r"shape \[5, 2, 2\]"),
    ("dtype", lambda t: {**t, "comp.A.W": t["comp.A.W"].to(torch.int64)},
     r"comp.A.W of shape \[5, 2, 2\] and dtype torch.int64, expected shape \[5, 2, 2\] and dtype torch.float32"),
    ("float64", lambda t: {**t, "comp.B.W": t["comp.B.W"].double()}, r"comp.B.W .* dtype torch.float64, expected"),
    ("missing", lambda t: _without(t, "comp.A.W"), r"does not match this Components \(missing tensors \['comp.A.W'\]\)"),
    ("extra", _set("comp.zzz", torch.zeros(1)), r"\(unexpected tensors \['comp.zzz'\]\)"),
    ("junk", _set("foo", torch.zeros(1)), r"unexpected tensors \['foo'\]"),
    ("optindex", _set("opt.7.exp_avg", torch.zeros(1)), r"unexpected tensors \['opt.7.exp_avg'\]"),
    ("optshape", _set("opt.0.exp_avg", torch.zeros(2)), r"optimiser state opt.0.exp_avg of shape \[2\]"),
    ("optmissing", lambda t: _without(t, "opt.1.exp_avg_sq"), r"optimiser state \['exp_avg', 'step'\] for parameter 1"),
    ("optstep", _set("opt.0.step", torch.tensor(9.0)), r"opt.0.step = 9.0, expected an integer in \[0, 4\]"),
    ("optbehind", lambda t: {k: torch.tensor(2.0) if k.endswith(".step") else v for k, v in t.items()},
     r"says step 4 but its optimiser state has made 2 step\(s\)"),
    ("nan", lambda t: {**t, "comp.A.W": t["comp.A.W"] * float("nan")}, r"holds NaN or inf in \['comp.A.W'\]"),
    ("inf", lambda t: {**t, "opt.0.exp_avg_sq": t["opt.0.exp_avg_sq"] + float("inf")},
     r"holds NaN or inf in \['opt.0.exp_avg_sq'\] \(the run that wrote it diverged"),
])
def test_mismatched_tensors_are_refused_not_cast(apd_ckpt, tmp_path, name, tensors, msg):
    d = _copy(apd_ckpt, tmp_path / name, tensors=tensors)
    with pytest.raises(ValueError, match=msg) as e:
        apd_decompose(_model(), _sample, _apd_cfg(), out_dir=d, quiet=True)
    assert "checkpoint.safetensors'" in str(e.value) and FIX in str(e.value)


def test_corrupt_checkpoint_names_it_with_the_fix(apd_ckpt, tmp_path):
    d = _copy(apd_ckpt, tmp_path / "c")
    (d / "checkpoint.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(ValueError, match=r"checkpoint '.*checkpoint.safetensors' is not a valid safetensors file.*"
                                         r"delete the checkpoint"):
        apd_decompose(_model(), _sample, _apd_cfg(), out_dir=d, quiet=True)


def test_valid_checkpoint_still_resumes(apd_ckpt, tmp_path):
    d = _copy(apd_ckpt, tmp_path / "ok")
    done = apd_decompose(_model(), _sample, _apd_cfg(), out_dir=d, quiet=True)
    assert [h["step"] for h in done.history] == [0, 1, 2, 3]


def test_spd_checkpoint_is_checked_too(tmp_path):
    d = tmp_path / "spd"
    spd_decompose(_spd_model(), _sample, _spd_cfg(), out_dir=d, quiet=True)
    t = load_artifact(d / "checkpoint.safetensors", kind="spd_checkpoint").tensors
    key = next(k for k in t if k.startswith("spd."))
    rewrite(d / "checkpoint.safetensors", tensors=lambda t: {**t, key: t[key].flatten()[:1].clone()})
    with pytest.raises(ValueError, match=rf"checkpoint '.*' has tensor {key} of shape \[1\].*delete the checkpoint"):
        spd_decompose(_spd_model(), _sample, _spd_cfg(), out_dir=d, quiet=True)
    rewrite(d / "checkpoint.safetensors", lambda m: {**m, "step": 5})
    with pytest.raises(ValueError, match=r"'step' = 5, expected an integer in \[0, 4\]"):
        spd_decompose(_spd_model(), _sample, _spd_cfg(), out_dir=d, quiet=True)


# --- divergence ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["apd", "spd"])
def test_huge_lr_diverges_with_step_and_writes_no_checkpoint(tmp_path, algo):
    run, cfg, make = (apd_decompose, _apd_cfg, _model) if algo == "apd" else (spd_decompose, _spd_cfg, _spd_model)
    # without checkpoints: step 1's forward pass overflows (NaN/inf importances or attributions)
    with pytest.raises(TrainingDiverged, match=rf"{algo.upper()} training diverged at step 1 \(.* contains? NaN or "
                                               r"inf; the parameters overflow.*\); lower the learning rate \(lr = "
                                               r"1e\+30") as e:
        run(make(), _sample, cfg(lr=1e30), quiet=True)
    assert isinstance(e.value, ValueError) and e.value.step == 1
    # checkpointing after every step: the state after step 0 is checked before it is written, and is refused
    with pytest.raises(TrainingDiverged, match=rf"{algo.upper()} training diverged at step 0 \(the parameters "
                                               r"overflow after the optimiser step"):
        run(make(), _sample, cfg(lr=1e30, checkpoint_every=1), out_dir=tmp_path, quiet=True)
    assert not (tmp_path / "checkpoint.safetensors").exists() and not (tmp_path / "checkpoint.json").exists()


@pytest.mark.parametrize("algo", ["apd", "spd"])
def test_overflow_on_the_last_step_is_not_returned(algo):
    run, cfg, make = (apd_decompose, _apd_cfg, _model) if algo == "apd" else (spd_decompose, _spd_cfg, _spd_model)
    with pytest.raises(TrainingDiverged, match=r"diverged at step 0 \(the parameters overflow"):
        run(make(), _sample, cfg(lr=1e30, steps=1), quiet=True)


@pytest.mark.parametrize("algo", ["apd", "spd"])
def test_nan_parameters_diverge_and_the_last_good_checkpoint_stays(tmp_path, algo):
    run, cfg, make = (apd_decompose, _apd_cfg, _model) if algo == "apd" else (spd_decompose, _spd_cfg, _spd_model)

    def poison(step, module, logs):  # a NaN update at the last step
        if step == 3:
            with torch.no_grad():
                next(module.parameters()).fill_(float("nan"))

    with pytest.raises(TrainingDiverged, match=r"diverged at step 3 \(parameters \[.*\] are NaN or inf after the "
                                               r"optimiser step\)"):
        run(make(), _sample, cfg(), out_dir=tmp_path, quiet=True, callback=poison)
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 2
    done = run(make(), _sample, cfg(), out_dir=tmp_path, quiet=True)  # resumes from the good step-2 state
    module = done.components if algo == "apd" else done.decomposition
    assert len(done.history) == 4 and all(bool(torch.isfinite(p).all()) for p in module.parameters())

    def poison_early(step, module, logs):  # NaN after step 0's update: step 1's forward pass trips over it
        if step == 0:
            with torch.no_grad():
                next(module.parameters()).fill_(float("nan"))

    with pytest.raises(TrainingDiverged, match=r"diverged at step 1 \(.*NaN or inf"):
        run(make(), _sample, cfg(), out_dir=tmp_path / "b", quiet=True, callback=poison_early)


def test_non_finite_loss_and_checkpoint_are_refused(tmp_path):
    check_loss_finite("APD", 3, 1.5, 0.1)
    with pytest.raises(TrainingDiverged, match=r"APD training diverged at step 3 \(loss nan\); lower the learning "
                                               r"rate \(lr = 0.1"):
        check_loss_finite("APD", 3, float("nan"), 0.1)
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(m.parameters())
    with torch.no_grad():
        m.weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"refusing to write checkpoint '.*ck.safetensors' at step 7: tensors "
                                         r"\['comp.weight'\] hold NaN or inf"):
        save_training_state(tmp_path / "ck.safetensors", m, opt, 7, {}, [], 0.0)
    assert not (tmp_path / "ck.safetensors").exists()


# a stand-in TMS 5-2 target that records the recipe of seed 0 (the run directory's targets are checked)
_TARGET_INFO = {"loss": 0.0, "config": target_config("tms-5-2", 0, True, "ours")}


def test_cli_divergence_is_one_line_without_traceback(tmp_path):
    save_toy(_model(), tmp_path / "seed0" / "target", _TARGET_INFO)
    res = CliRunner().invoke(app, ["reproduce", "apd", "--setting", "tms-5-2", "--quick", "--steps", "5", "--lr",
                                   "1e30", "--seeds", "1", "--quiet", "--out", str(tmp_path)])
    out = flat(res.output)
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "Error: APD training diverged at step 1" in out and "lower the learning rate" in out
    assert "Fix: rerun with a lower --lr" in out


def test_cli_malformed_checkpoint_is_one_line_without_traceback(tmp_path):
    save_toy(_model(), tmp_path / "seed0" / "target", _TARGET_INFO)
    ck = tmp_path / "seed0" / "apd" / "checkpoint.safetensors"
    save_artifact(ck, {"x": torch.zeros(1)}, kind="apd_checkpoint", meta=[])
    res = CliRunner().invoke(app, ["reproduce", "apd", "--setting", "tms-5-2", "--quick", "--steps", "5", "--seeds",
                                   "1", "--quiet", "--out", str(tmp_path)])
    out = flat(res.output)
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"Error: checkpoint metadata '{ck.with_suffix('.json')}' holds a JSON list" in out and FIX in out


# --- the JSON beside a safetensors file -------------------------------------------------------------------------------

def test_artifacts_name_a_non_utf8_json_and_use_neutral_wording(tmp_path):
    p = save_artifact(tmp_path / "target", {"x": torch.zeros(2)}, kind="toy_target", meta={"a": 1})
    p.with_suffix(".json").write_bytes(b"\xff{}")
    with pytest.raises(ValueError, match=r"file '.*target.json' is not valid JSON \('utf-8' codec"):
        load_artifact(p, kind="toy_target", what="file")
    with pytest.raises(ValueError, match=r"toy target '.*target.json' is not valid JSON"):
        load_toy(p)
    p.write_bytes(b"\x01" * 10)
    with pytest.raises(ValueError, match=r"^toy target '.*target.safetensors' is not a valid safetensors file") as e:
        load_toy(p)
    assert "checkpoint" not in str(e.value)
    with pytest.raises(ValueError, match=r"^file '.*target.safetensors' is not a valid safetensors file"):
        read_safetensors(p)
    with pytest.raises(FileNotFoundError, match=r"^file '.*nothing' does not exist"):
        read_safetensors(tmp_path / "nothing")
