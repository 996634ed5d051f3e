"""A saved toy target is reused only when it was made with the recipe asked for (setting, seed, quick, fidelity):
``get_target``, ``spd_target``, ``reproduce`` and ``mlpinterp apd train-target`` (tiny or stand-in targets only)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.studies.apd.run import reproduce
from mlpinterp.studies.spd.run import reproduce as spd_reproduce
from mlpinterp.studies.spd.run import spd_target
from mlpinterp.toys import (
    RESID_PRESETS,
    ResidMLPConfig,
    TMSConfig,
    build_resid_mlp,
    load_toy,
    save_toy,
    train_resid_mlp,
    train_tms,
)
from mlpinterp.toys.settings import check_target, get_target, target_config
from mlpinterp.utils.config_diff import ABSENT, config_diff, config_differences

from .artifact_utils import rewrite

torch.set_num_threads(1)


def _tiny_tms(seed: int = 0):
    return train_tms(TMSConfig(steps=5, batch_size=32, n_instances=1, seed=seed), quiet=True)[0]


def _stand_in(path, model, setting, seed, quick=False, fidelity=None, loss=0.125):
    """Save ``model`` as the target ``get_target`` would make for these arguments (its recipe stamped on it)."""
    save_toy(model, path, {"loss": loss, "config": target_config(setting, seed, quick, fidelity)})
    return path.with_name(path.name + ".safetensors")


def test_quick_resid_target_refused_under_a_paper_run(tmp_path):
    # the adversarial case: a resid-mlp-1 --quick target (2000 steps at batch 1024) left in a paper run's directory
    path = _stand_in(tmp_path / "seed0" / "target", build_resid_mlp(RESID_PRESETS["resid-mlp-1"]), "resid-mlp-1", 0,
                     quick=True)
    with pytest.raises(ValueError) as e:
        get_target("resid-mlp-1", 0, path, False, True)
    msg = str(e.value)
    assert str(path) in msg and "paper preset" in msg
    assert "steps: saved 2000, requested 10000" in msg and "batch_size: saved 1024, requested 2048" in msg
    assert "(it is the target of setting 'resid-mlp-1', seed 0, --quick, fidelity 'ours')" in msg and "another out directory" in msg
    with pytest.raises(ValueError, match="steps: saved 2000, requested 10000"):  # before any training
        reproduce("resid-mlp-1", 1, tmp_path, quick=False, quiet=True)
    assert not (tmp_path / "seed0" / "apd").exists()
    model, info = get_target("resid-mlp-1", 0, path, True, True)  # the --quick run reuses it
    assert info["loss"] == 0.125 and torch.equal(model.W_E, load_toy(path)[0].W_E)


def test_trained_tiny_resid_target_refused_field_by_field(tmp_path):
    cfg = ResidMLPConfig(n_features=5, d_embed=8, d_mlp=3, steps=5, batch_size=32)
    model, info = train_resid_mlp(cfg, quiet=True)
    save_toy(model, tmp_path / "t", info)  # its real stored configuration
    with pytest.raises(ValueError, match="n_features: saved 5, requested 100; d_embed: saved 8, requested 1000; "
                                         "d_mlp: saved 3, requested 50; steps: saved 5, requested 2000"):
        get_target("resid-mlp-1", 0, tmp_path / "t.safetensors", True, True)


def test_other_seed_refused(tmp_path):
    path = _stand_in(tmp_path / "target", _tiny_tms(1), "tms-5-2", 1)
    with pytest.raises(ValueError) as e:
        get_target("tms-5-2", 0, path, False, True)
    msg = str(e.value)
    assert "seed: saved 1, requested 0 (it is the target of setting 'tms-5-2', seed 1, fidelity 'ours');" in msg
    assert "steps" not in msg  # only the field that differs
    with pytest.raises(ValueError, match="seed: saved 1, requested 0"):  # SPD gets the same protection
        spd_target("tms-5-2-id", 0, path, True, True)
    get_target("tms-5-2", 1, path, False, True)  # its own seed loads it


def test_other_setting_refused(tmp_path):
    path = _stand_in(tmp_path / "t40", train_tms(TMSConfig(n_features=40, d_hidden=10, steps=5, batch_size=32,
                                                             n_instances=1), quiet=True)[0], "tms-40-10", 0,
                     fidelity="ours")
    with pytest.raises(ValueError, match="n_features: saved 40, requested 5; d_hidden: saved 10, requested 2") as e:
        get_target("tms-5-2", 0, path, True, True, "ours")
    assert "it is the target of setting 'tms-40-10', seed 0, fidelity 'ours'" in str(e.value)
    # another kind of network altogether
    rpath = _stand_in(tmp_path / "r", build_resid_mlp(RESID_PRESETS["resid-mlp-2"]), "resid-mlp-2", 0)
    with pytest.raises(ValueError, match="holds a 'resid_mlp' network, but setting 'tms-5-2'.* needs a 'tms' target"):
        get_target("tms-5-2", 0, rpath, True, True)
    with pytest.raises(ValueError, match="d_mlp: saved 25, requested 50; n_layers: saved 2, requested 1"):
        spd_target("resid-mlp-1", 0, rpath, False, True)
    out = _copy_to_seed_dir(rpath, tmp_path / "spd")
    with pytest.raises(ValueError, match=r"d_mlp: saved 25, requested 50"):  # SPD's reproduce: before any training
        spd_reproduce("resid-mlp-1", 1, out, quick=False, quiet=True)
    assert not (tmp_path / "spd" / "seed0" / "spd").exists()


def _copy_to_seed_dir(path, out):
    import shutil

    (out / "seed0").mkdir(parents=True)
    for suffix in (".safetensors", ".json"):
        shutil.copy(path.with_suffix(suffix), out / "seed0" / f"target{suffix}")
    return out


def test_matching_target_reused_and_identity_inserted(tmp_path):
    model = _tiny_tms(0)
    path = _stand_in(tmp_path / "target", model, "tms-5-2", 0)
    stamp = (path.stat().st_mtime_ns, path.with_suffix(".json").stat().st_mtime_ns)
    for quick in (False, True):  # TMS targets have one recipe for both presets
        loaded, info = get_target("tms-5-2", 0, path, quick, True)
        assert info["loss"] == 0.125 and torch.equal(loaded.W, model.W) and torch.equal(loaded.b, model.b)
    assert check_target("tms-5-2", 0, path, False) is True and check_target("tms-5-2", 0, tmp_path / "no", False) is False
    toy, lin, _ = spd_target("tms-5-2-id", 0, path, True, True)
    assert toy.identity is not None and torch.equal(toy.W, model.W)
    x = torch.rand(6, 5)
    torch.testing.assert_close(lin(x), model(x))
    assert (path.stat().st_mtime_ns, path.with_suffix(".json").stat().st_mtime_ns) == stamp  # nothing rewritten


def test_older_target_files_still_load(tmp_path):
    # as the real run directories hold them: TMS configs before lr_schedule existed (constant lr then), gated-trig
    # targets recording only seed and neurons_per_function
    model = _tiny_tms(0)
    cfg = target_config("tms-5-2", 0, False, "ours")
    del cfg["lr_schedule"]
    save_toy(model, tmp_path / "old", {"loss": 0.1, "config": cfg})
    get_target("tms-5-2", 0, tmp_path / "old.safetensors", False, True)
    with pytest.raises(ValueError, match=r"lr_schedule: saved absent \(written before the field existed: 'constant'\), "
                                         r"requested 'linear' \(it is the target of setting 'tms-5-2', seed 0, "
                                         r"fidelity 'ours'\)"):
        get_target("tms-5-2", 0, tmp_path / "old.safetensors", False, True, "reference")
    g, info = get_target("gated-trig", 3, tmp_path / "g", False, True)
    assert info["config"] == {"n_functions": 4, "neurons_per_function": 10, "n_layers": 2, "seed": 3}
    rewrite(tmp_path / "g.safetensors",
            lambda m: {**m, "info": {k: v for k, v in m["info"].items() if k != "config"}})
    again, _ = get_target("gated-trig", 3, tmp_path / "g", False, True)
    assert all(torch.equal(a, b) for a, b in zip(g.state_dict().values(), again.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match="seed: saved 3, requested 4"):
        get_target("gated-trig", 4, tmp_path / "g", False, True)
    # a target that records no configuration cannot be checked: refused, not trusted
    save_toy(model, tmp_path / "bare", {"loss": 0.0})
    with pytest.raises(ValueError, match="records no training configuration"):
        get_target("tms-5-2", 0, tmp_path / "bare.safetensors", False, True)


def test_bad_paths_and_seeds(tmp_path):
    with pytest.raises(ValueError, match="is an existing directory; expected the path of a target .safetensors"):
        get_target("gated-trig", 0, tmp_path, False, True)
    with pytest.raises(ValueError, match="seed must be >= 0, got -5"):
        get_target("tms-5-2", -5, tmp_path / "t", False, True)
    with pytest.raises(ValueError, match="setting must be one of"):
        get_target("tms-3-1", 0, tmp_path / "t", False, True)
    # a path without the suffix is the same target on every call (saved once, then reused)
    get_target("gated-trig", 0, tmp_path / "g", False, True)
    assert (tmp_path / "g.safetensors").is_file() and check_target("gated-trig", 0, tmp_path / "g", False)


def test_config_differences():
    assert config_differences({"a": 1, "b": 2.0}, {"a": 1, "b": 2}) == []
    assert config_differences({"a": 1, "c": "x"}, {"a": 2, "b": 3}) == [
        "a: saved 1, requested 2", "b: saved absent, requested 3", "c: saved 'x', requested absent"]
    with pytest.raises(TypeError, match="saved must be a mapping"):
        config_differences([1], {})
    # a configuration read back from JSON holds lists where the dataclass holds tuples: equal
    assert config_differences({"tied": [["a", "b"]]}, {"tied": (("a", "b"),)}) == []
    assert config_differences({"tied": [["a", "c"]]}, {"tied": (("a", "b"),)}) == [
        "tied: saved [['a', 'c']], requested (('a', 'b'),)"]
    assert config_diff({"steps": 1, "lr": 1.0}, {"steps": 2, "lr": 2.0}, ignore={"steps"}) == {"lr": (1.0, 2.0)}
    assert config_diff({}, {"x": None}) == {"x": (ABSENT, None)}  # absent is not None


def test_config_diff_implicit_fields_of_earlier_versions():
    # a field added after the saved configuration was written compares as the behaviour before it existed
    old = {"lr": 1.0}
    assert config_diff(old, {"lr": 1.0, "masks": "shared"}, implicit={"masks": "shared"}) == {}
    assert config_diff(old, {"lr": 1.0, "tied": ()}, implicit={"tied": []}) == {}  # JSON lists = tuples
    diff = config_differences(old, {"lr": 1.0, "masks": "fresh"}, implicit={"masks": "shared"})
    assert diff == ["masks: saved absent (written before the field existed: 'shared'), requested 'fresh'"]
    # a saved value always wins over the implicit one; fields with no implicit value stay absent
    assert config_diff({"masks": "fresh"}, {"masks": "shared"}, implicit={"masks": "shared"}) == {
        "masks": ("fresh", "shared")}
    assert config_differences(old, {"lr": 1.0, "new": 2}, implicit={"masks": "shared"}) == [
        "new: saved absent, requested 2"]
    # the request lacking a field is not filled in
    assert list(config_diff({"masks": "shared"}, {}, implicit={"masks": "shared"})) == ["masks"]
    with pytest.raises(TypeError, match="implicit must be a mapping"):
        config_diff({}, {}, implicit=[("a", 1)])


# ----------------------------------------------------------------------------------------------------- CLI
def _train(*args):
    return CliRunner().invoke(app, ["apd", "train-target", "--quiet", *args])


def test_cli_train_target_suffix_seeds_and_reuse(tmp_path):
    for seed in (1, 2):  # dotted names: the suffix is appended, never replaced, so the two seeds do not collide
        res = _train("--setting", "gated-trig", "--seed", str(seed), "--out", str(tmp_path / f"tg.seed{seed}"))
        assert res.exit_code == 0, res.output
        assert res.output.strip() == f"saved {tmp_path / f'tg.seed{seed}.safetensors'}"  # no "held-out loss nan"
    assert not (tmp_path / "tg.safetensors").exists()
    assert load_toy(tmp_path / "tg.seed1.safetensors")[1]["info"]["seed"] == 1
    assert load_toy(tmp_path / "tg.seed2.safetensors")[1]["info"]["seed"] == 2
    res = _train("--setting", "gated-trig", "--seed", "1", "--out", str(tmp_path / "tg.seed1.safetensors"))
    assert res.exit_code == 0 and res.output.startswith("exists, reused "), res.output
    res = _train("--setting", "gated-trig", "--seed", "2", "--out", str(tmp_path / "tg.seed1"))
    assert res.exit_code == 1 and "Error:" in res.output and "seed: saved 1, requested 2" in res.output
    assert "Traceback" not in res.output and "saved " + str(tmp_path) not in res.output
    # a TMS target at --out: reused (its loss printed) when it matches, refused when it is another setting's
    path = _stand_in(tmp_path / "tms", _tiny_tms(0), "tms-5-2", 0)
    res = _train("--setting", "tms-5-2", "--out", str(path))
    assert res.exit_code == 0 and res.output.strip() == f"exists, reused {path} (held-out loss 0.125)", res.output
    res = _train("--setting", "tms-40-10", "--out", str(path))
    assert res.exit_code == 1 and "n_features: saved 5, requested 40" in res.output, res.output
    # a --quick resid target under a paper-recipe train-target
    rpath = _stand_in(tmp_path / "r1", build_resid_mlp(RESID_PRESETS["resid-mlp-1"]), "resid-mlp-1", 0, quick=True)
    res = _train("--setting", "resid-mlp-1", "--out", str(rpath))
    assert res.exit_code == 1 and "steps: saved 2000, requested 10000" in res.output, res.output
    res = _train("--setting", "resid-mlp-1", "--out", str(rpath), "--quick")
    assert res.exit_code == 0 and "exists, reused" in res.output, res.output


def test_cli_train_target_directory_and_negative_seed(tmp_path):
    (tmp_path / "d").mkdir()
    res = _train("--setting", "gated-trig", "--out", str(tmp_path / "d"))
    assert res.exit_code == 1 and "is an existing directory" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "d.safetensors").exists() and not any((tmp_path / "d").iterdir())
    for setting in ("tms-5-2", "gated-trig"):  # the same rule for every setting, before any training
        res = _train("--setting", setting, "--seed", "-5", "--out", str(tmp_path / "neg"))
        assert res.exit_code == 1 and "--seed must be a non-negative int, got -5" in res.output, res.output
    assert not list(tmp_path.glob("neg*"))


def test_reference_resid_targets_have_no_biases_and_the_reference_recipe(tmp_path):
    """fidelity="reference" residual-MLP targets: the APD/SPD reference's recipe (no biases, 1k steps at batch 2048,
    lr 3e-3 with cos(pi/2 t/(T-1)); 10k steps for resid-MLP-3, shortened by --quick); a bias-free target saves and
    loads as one (its forward reproduced), and a biased target of an earlier version is told apart by its missing
    ``bias`` field (implicitly True)."""
    import math
    from dataclasses import replace

    from mlpinterp.toys.resid_mlp import _target_lr

    ref = target_config("resid-mlp-1", 0, False, "reference")
    assert {k: ref[k] for k in ("bias", "steps", "batch_size", "lr", "lr_schedule", "weight_decay", "d_mlp")} == {
        "bias": False, "steps": 1000, "batch_size": 2048, "lr": 3e-3, "lr_schedule": "quarter_cosine",
        "weight_decay": 0.01, "d_mlp": 50}
    assert target_config("resid-mlp-1", 0, True, "reference") == ref  # already below the quick budget
    assert target_config("resid-mlp-3", 0, False, "reference")["steps"] == 10_000
    assert target_config("resid-mlp-3", 0, True, "reference")["steps"] == 2000
    cfg = ResidMLPConfig(**ref)
    assert _target_lr(cfg, 0) == 3e-3 and _target_lr(cfg, 999) == pytest.approx(0.0, abs=1e-15)
    assert _target_lr(cfg, 333) == pytest.approx(3e-3 * math.cos(math.pi / 6))
    assert _target_lr(replace(cfg, lr_schedule="cosine"), 500) == pytest.approx(1.5e-3)  # the half period
    tiny = replace(cfg, n_features=6, d_embed=12, d_mlp=4, steps=3, batch_size=16)
    model, info = train_resid_mlp(tiny, quiet=True)
    assert all(blk.mlp_in.bias is None and blk.mlp_out.bias is None for blk in model.layers)
    save_toy(model, tmp_path / "t", info)
    meta = json.loads((tmp_path / "t.json").read_text())
    assert meta["arch"]["bias"] is False
    loaded, _ = load_toy(tmp_path / "t.safetensors")
    x = torch.rand(5, 6)
    torch.testing.assert_close(loaded(x), model(x))
    rewrite(tmp_path / "t.safetensors", {**meta, "arch": {**meta["arch"], "bias": True}})  # only False is written
    with pytest.raises(ValueError, match="'bias' is recorded only as false"):
        load_toy(tmp_path / "t.safetensors")
    biased = build_resid_mlp(RESID_PRESETS["resid-mlp-1"])
    old = {k: v for k, v in target_config("resid-mlp-1", 0, True, "ours").items() if k not in ("bias", "lr_schedule")}
    save_toy(biased, tmp_path / "old", {"loss": 0.0, "config": old})  # written before the two fields existed
    assert check_target("resid-mlp-1", 0, tmp_path / "old", True, "ours")
    with pytest.raises(ValueError, match=r"bias: saved absent \(written before the field existed: True\), "
                                         r"requested False"):
        check_target("resid-mlp-1", 0, tmp_path / "old", True, "reference")
    for bad, exc, msg in ((dict(bias=1), TypeError, "bias must be a bool"),
                          (dict(lr_schedule="linear"), ValueError, "lr_schedule must be one of")):
        with pytest.raises(exc, match=msg):
            ResidMLPConfig(**bad)
    with pytest.raises(ValueError, match="fidelity='reference' is defined for the TMS and residual-MLP targets"):
        target_config("gated-trig", 0, False, "reference")


def test_biased_tensors_under_a_bias_free_arch_name_the_recorded_flag(tmp_path):
    """A target whose tensors contradict its recorded 'bias': false is refused with the architecture as recorded
    (before: the message showed it without the flag, so 'Unexpected key(s) ... bias' had no visible cause)."""
    cfg = ResidMLPConfig(n_features=5, d_embed=8, d_mlp=3)
    path = save_toy(build_resid_mlp(cfg), tmp_path / "t")
    meta = json.loads(path.with_suffix(".json").read_text())
    meta["arch"]["bias"] = False  # written so (a faulty writer): the tensors still have the biases
    rewrite(path, meta)
    with pytest.raises(ValueError, match=r"(?s)do not match the resid_mlp architecture \{.*'bias': False.*Unexpected key"):
        load_toy(path)


@pytest.mark.parametrize("ignore", ["steps", b"steps", {"steps": 1}, 5, ["steps", 3]])
def test_config_diff_ignore_must_be_field_names(ignore):
    """``ignore`` is a collection of field names: a bare str used to ignore its letters (so "steps" ignored nothing,
    silently), an int raised "'int' object is not iterable"."""
    with pytest.raises(TypeError, match="ignore must be a collection of field names"):
        config_diff({"steps": 1}, {"steps": 2}, ignore=ignore)
    assert config_diff({"steps": 1, "lr": 1}, {"steps": 2, "lr": 2}, ignore=(k for k in ["steps"])) == {"lr": (1, 2)}
