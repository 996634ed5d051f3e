"""``fidelity="reference"``: APD on TMS the reference implementation's way (init, rank, schedule, target recipe)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from mlpinterp.apd import APDConfig, lr_at
from mlpinterp.cli.main import app
from mlpinterp.paramspace import Components, reference_init_std, reference_rank, resolve_sites
from mlpinterp.studies.apd.run import reproduce
from mlpinterp.studies.apd.settings import apd_config, reference_overrides
from mlpinterp.studies.spd.run import spd_target
from mlpinterp.toys import TMS, TMSConfig, save_toy, train_tms
from mlpinterp.toys.settings import DEFAULT_FIDELITY, default_fidelity, get_target, target_config

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def test_reference_init_std_matches_torch_xavier_on_4d():
    # oracle: torch's own xavier_normal_ on the reference's 4-D tensor [instances, C, d, m]
    t = torch.empty(3, 50, 40, 11)
    torch.manual_seed(0)
    torch.nn.init.xavier_normal_(t)
    assert reference_init_std(50, 40, 11, 3) == pytest.approx(float(t.std()), rel=0.01)
    assert reference_init_std(50, 40, 11, 3) == pytest.approx(math.sqrt(2 / (53 * 40 * 11)))


def test_reference_init_summed_weight_std():
    # TMS 40-10: W [10, 40], C = 50, m = 11, 3 instances. By hand: std_A = sqrt(2 / (53 * 10 * 11)) = 0.018522,
    # std_B = sqrt(2 / (53 * 40 * 11)) = 0.0092609, summed entry std = sqrt(C m) std_A std_B = 0.0040227.
    expected = 0.0040227
    sites = resolve_sites(TMS(40, 10), ("W",))
    W = torch.cat([Components(sites, 50, 11, init="reference", generator=torch.Generator().manual_seed(s))
                   .summed()["W"].detach().flatten() for s in range(5)])  # 2000 entries: relative SE of the std ≈ 1.6 %
    assert float(W.std()) == pytest.approx(expected, rel=0.06)
    # the default ("scaled") initialisation starts at nn.Linear scale, ~50x larger
    default = Components(sites, 50, 11, generator=torch.Generator().manual_seed(0)).summed()["W"].detach()
    assert float(default.std()) > 20 * expected


def test_reference_rank_and_overrides():
    assert reference_rank(10, 40) == 11 and reference_rank(2, 5) == 3
    for quick in (False, True):
        cfg = apd_config("tms-40-10", quick, 0, "reference")
        assert (cfg.m, cfg.init, cfg.weight_decay, cfg.lr_schedule) == (11, "reference", 0.0, "quarter_cosine")
        assert cfg.attribution_source == "target"
    assert apd_config("tms-5-2", False, 0, "reference").m == 3
    assert apd_config("tms-40-10", False, 0, "ours").m is None  # "ours" is unchanged
    # an explicit override still wins over the fidelity
    assert apd_config("tms-40-10", True, 0, "reference", m=4).m == 4


def test_default_fidelity_is_the_better_measured_one():
    # TMS 40-10 runs the reference's way by default (measured better, docs/measurements.md "APD"), the rest ours
    assert DEFAULT_FIDELITY == {"tms-40-10": "reference"}
    assert default_fidelity("tms-40-10") == "reference"
    for name in ("tms-5-2", "resid-mlp-1", "resid-mlp-2", "gated-trig"):
        assert default_fidelity(name) == "ours"
        assert apd_config(name, False, 0) == apd_config(name, False, 0, "ours")
    assert apd_config("tms-40-10", False, 0) == apd_config("tms-40-10", False, 0, "reference")
    assert apd_config("tms-40-10", False, 0) != apd_config("tms-40-10", False, 0, "ours")


def test_spd_targets_keep_our_recipe_for_tms_40_10(tmp_path):
    # SPD's TMS targets are trained at a constant lr (the SPD reference's recipe) whatever APD's default is
    # stand-ins for the preset's targets (5 steps), carrying the recipes of the two fidelities
    cfg = dict(n_features=40, d_hidden=10, steps=5, batch_size=32, n_instances=1)
    model, info = train_tms(TMSConfig(**cfg), quiet=True)
    save_toy(model, tmp_path / "ours" / "target", {**info, "config": target_config("tms-40-10", 0, True, "ours")})
    spd_target("tms-40-10-id", 0, tmp_path / "ours" / "target.safetensors", True, True)  # loads
    with pytest.raises(ValueError, match="fidelity 'reference': lr_schedule: saved 'constant', requested 'linear'"):
        get_target("tms-40-10", 0, tmp_path / "ours" / "target.safetensors", True, True)  # APD's default refuses it
    model, info = train_tms(TMSConfig(lr_schedule="linear", **cfg), quiet=True)
    save_toy(model, tmp_path / "ref" / "target", {**info, "config": target_config("tms-40-10", 0, True, "reference")})
    with pytest.raises(ValueError, match="fidelity 'ours': lr_schedule: saved 'linear', requested 'constant'"):
        spd_target("tms-40-10", 0, tmp_path / "ref" / "target.safetensors", True, True)


def test_quarter_cosine_schedule_by_hand():
    cfg = APDConfig(C=50, topk=1.0, steps=20_000, lr=1e-3, warmup_frac=0.05, lr_schedule="quarter_cosine")
    assert lr_at(0, cfg) == pytest.approx(1e-6)        # warm-up: lr (0 + 1) / 1000
    assert lr_at(999, cfg) == pytest.approx(1e-3)      # end of the 1000-step warm-up
    assert lr_at(1000, cfg) == pytest.approx(1e-3)     # cos(0)
    # t = 9500 of T' - 1 = 18999: cos(pi/4 + pi/2 * 0.5/18999) ≈ 0.7071068 (1 - 4.134e-5) = 0.7070776
    assert lr_at(10_500, cfg) == pytest.approx(0.7070776e-3, rel=1e-6)
    assert lr_at(19_999, cfg) == pytest.approx(0.0, abs=1e-15)  # cos(pi/2) at T - 1


def test_tms_linear_decay_recipe():
    base = dict(n_features=5, d_hidden=2, batch_size=64, n_instances=1)
    one_c = train_tms(TMSConfig(steps=1, **base), quiet=True)[0]
    one_l = train_tms(TMSConfig(steps=1, lr_schedule="linear", **base), quiet=True)[0]
    assert torch.equal(one_c.W, one_l.W)  # factor 1 - 0/1 = 1 at the first step
    three_c = train_tms(TMSConfig(steps=3, **base), quiet=True)[0]
    three_l = train_tms(TMSConfig(steps=3, lr_schedule="linear", **base), quiet=True)[0]
    assert not torch.allclose(three_c.W, three_l.W)  # steps 2, 3 at 2/3 and 1/3 of lr


def test_cli_reference_roundtrip_and_target_mismatch(tmp_path):
    cfg = TMSConfig(n_features=40, d_hidden=10, steps=100, batch_size=256, n_instances=1, lr_schedule="linear")
    model, info = train_tms(cfg, quiet=True)
    # a stand-in for the preset's target (trained shorter), carrying the reference recipe
    save_toy(model, tmp_path / "seed0" / "target", {**info, "config": target_config("tms-40-10", 0, True, "reference")})
    # no --fidelity: TMS 40-10's default is the reference's way
    args = ["reproduce", "apd", "--setting", "tms-40-10", "--seeds", "1", "--quick", "--quiet", "--steps", "20"]
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["fidelity"] == "reference"
    assert {k: metrics["config"][k] for k in ("m", "init", "lr_schedule", "weight_decay", "steps")} == \
        {"m": 11, "init": "reference", "lr_schedule": "quarter_cosine", "weight_decay": 0.0, "steps": 20}
    assert "Fidelity: reference" in (tmp_path / "report.md").read_text()
    # a target trained with our (constant-lr) recipe is refused under fidelity=reference
    other = tmp_path / "other"
    model, info = train_tms(TMSConfig(n_features=40, d_hidden=10, steps=10, batch_size=64, n_instances=1), quiet=True)
    save_toy(model, other / "seed0" / "target", {**info, "config": target_config("tms-40-10", 0, True, "ours")})
    res = CliRunner().invoke(app, [*args, "--fidelity", "reference", "--out", str(other)])
    assert res.exit_code == 1 and "lr_schedule: saved 'constant'" in res.output and "Error" in res.output
    # ... and accepted with --fidelity ours
    res = CliRunner().invoke(app, [*args, "--fidelity", "ours", "--out", str(other)])
    assert res.exit_code == 0, res.output
    metrics = json.loads((other / "metrics.json").read_text())
    assert metrics["fidelity"] == "ours" and metrics["config"]["m"] is None and metrics["config"]["init"] != "reference"


def test_train_target_cli_fidelity(tmp_path):
    res = CliRunner().invoke(app, ["apd", "train-target", "--setting", "gated-trig", "--out", str(tmp_path / "t"),
                                   "--fidelity", "reference", "--quiet"])
    assert res.exit_code == 1 and "defined for" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "t.safetensors").exists()


def test_bad_fidelity_values(tmp_path):
    res = CliRunner().invoke(app, ["reproduce", "apd", "--setting", "tms-5-2", "--out", str(tmp_path),
                                   "--fidelity", "exact"])
    assert res.exit_code == 2 and "fidelity" in res.output.lower()
    with pytest.raises(ValueError, match="fidelity must be one of"):
        reproduce("tms-5-2", 1, tmp_path, fidelity="exact")
    with pytest.raises(ValueError, match="fidelity must be one of"):
        apd_config("tms-5-2", True, 0, "Reference")
    with pytest.raises(ValueError, match="defined for the TMS and residual-MLP targets only"):
        reproduce("gated-trig", 1, tmp_path, fidelity="reference")
    with pytest.raises(ValueError, match="defined for"):
        reference_overrides("gated-trig")
    with pytest.raises(ValueError, match="fidelity must be one of"):
        get_target("tms-5-2", 0, tmp_path / "t.safetensors", True, True, fidelity="paper")
    with pytest.raises(ValueError, match="init must be one of"):
        APDConfig(init="xavier").validate()
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        APDConfig(lr_schedule="cos").validate()
    with pytest.raises(TypeError, match="init_instances must be an int"):
        APDConfig(init_instances=2.5).validate()
    with pytest.raises(ValueError, match="lr_schedule must be 'constant' or 'linear'"):
        TMSConfig(lr_schedule="cosine")
    sites = resolve_sites(TMS(5, 2), ("W",))
    with pytest.raises(ValueError, match="init must be one of"):
        Components(sites, 5, init="ref")
    with pytest.raises(ValueError, match="instances must be a positive int"):
        Components(sites, 5, init="reference", instances=0)
    with pytest.raises(ValueError, match="d_in must be a positive int"):
        reference_rank(10, 0)
