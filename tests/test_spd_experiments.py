"""``mlpinterp reproduce spd`` end to end on tiny step counts (targets pre-placed to keep it fast)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.paramspace import resolve_sites
from mlpinterp.studies.spd.report import render_markdown as render_report
from mlpinterp.studies.spd.run import reproduce, spd_target
from mlpinterp.studies.spd.settings import PRESETS, QUICK, SETTINGS, spd_config, target_fidelity
from mlpinterp.toys import RESID_PRESETS, TMS, build_resid_mlp, save_toy
from mlpinterp.toys.settings import target_config
from tests.cli_utils import flat

torch.set_num_threads(1)


def _info(setting="tms-5-2", seed=0):
    """Metadata making a pre-placed stand-in target pass as the one SPD would train (its recipe, checked on loading)."""
    return {"loss": 0.0, "config": target_config(setting, seed, True, target_fidelity(setting))}


def _args(out, *extra):
    return ["reproduce", "spd", "--setting", "tms-5-2", "--seeds", "2", "--out", str(out), "--quick", "--quiet",
            "--steps", "10", *extra]


@pytest.mark.slow
def test_cli_tms_quick_two_seeds_report_and_resume(tmp_path, tms52_target):
    for s in (0, 1):
        save_toy(tms52_target, tmp_path / f"seed{s}" / "target", _info(seed=s))
    res = CliRunner().invoke(app, _args(tmp_path))
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert len(m["mmcs"]) == len(m["ml2r"]) == 2 and all(0 <= v <= 1 for v in m["mmcs"])
    assert m["failed_seeds"] == sum(v < 0.99 for v in m["mmcs"])
    assert m["config"]["steps"] == 10 and m["quick"] and m["summary"]["mmcs"]["n"] == 2
    ps = m["paper_statistic"]
    assert ps["of_seeds"] == 2 and ps["mmcs"] == max(m["mmcs"]) and ps["n_features"] == 5
    md, page = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    # the SPD and APD papers' numbers beside ours; APD's measured ones only from an APD run (--apd-run), never constants
    assert "0.993 ± 0.002" in md and "0.893 ± 0.004" in md and "--apd-run" in md and "0.9983" not in md
    assert "Statistics: mean ± sample standard deviation (std, ddof = 1) over n = 2 seeds" in md
    assert "quick run: not a reproduction" in md and "(n = 2)" in md
    n_fig = md.count("![")
    assert n_fig == 6 and page.count('<img src="data:image/png;base64,') == n_fig
    assert re.search(r"Failed seeds \(MMCS < 0.99\): \*\*\d of 2\*\*", md)
    full = render_report({**m, "quick": False, "overrides": {}, "mmcs": [1.0, 1.0], "ml2r": [1.0, 1.0],
                          "per_seed": [{**p, "mmcs": 1.0, "ml2r": 1.0} for p in m["per_seed"]]})
    assert "Verdict: reproduced: 2 of 2 seeds" in full and "only 2 seeds run, too few to decide that goal" in full
    custom = render_report({**m, "quick": False, "overrides": {"lr": 0.1}, "mmcs": [1.0, 1.0], "ml2r": [1.0, 1.0],
                            "per_seed": [{**p, "mmcs": 1.0, "ml2r": 1.0} for p in m["per_seed"]]})
    assert "preset overridden: lr = 0.1; not a reproduction" in custom and "Verdict: custom run" in custom
    assert "Verdict: reproduced" not in custom
    assert m["method"] == "spd" and m["overrides"] == {"steps": 10}
    for f in ("losses.png", "components.png", "ci_per_feature.png", "decomposition.safetensors",
              "spd/checkpoint.safetensors"):
        assert (tmp_path / "seed0" / f).exists(), f
    again = CliRunner().invoke(app, _args(tmp_path))  # resumes from the finished checkpoints: same numbers
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "metrics.json").read_text())["mmcs"] == m["mmcs"]
    bad = CliRunner().invoke(app, _args(tmp_path, "--lr", "0.5"))
    assert bad.exit_code == 1 and "Error:" in bad.output and "run.json" in bad.output
    assert "lr: saved 0.01, requested 0.5" in bad.output, bad.output
    if not torch.cuda.is_available():
        nocuda = CliRunner().invoke(app, _args(tmp_path / "gpu", "--device", "cuda"))
        assert nocuda.exit_code == 1 and "CUDA is not available" in nocuda.output, nocuda.output


def test_cli_apd_run_side_by_side_checks_targets(tmp_path, tms52_target):
    """--apd-run puts APD's per-seed numbers beside ours, only on identical targets; other runs are refused."""
    import shutil

    spd_dir, apd_dir = tmp_path / "spd", tmp_path / "apd"
    for s in (0, 1):
        save_toy(tms52_target, spd_dir / f"seed{s}" / "target", _info(seed=s))
        (apd_dir / f"seed{s}").mkdir(parents=True)
        for f in ("target.safetensors", "target.json"):
            shutil.copy(spd_dir / f"seed{s}" / f, apd_dir / f"seed{s}" / f)
    per = [{"seed": 0, "mmcs": 0.998, "ml2r": 0.89, "max_cos": [0.998] * 5, "l2_ratio": [0.89] * 5},
           {"seed": 1, "mmcs": 0.95, "ml2r": 0.5, "max_cos": [0.95] * 5, "l2_ratio": [0.5] * 5}]
    metrics = {"method": "apd", "setting": "tms-5-2", "fidelity": "ours", "quick": False, "config": {"steps": 20000},
               "per_seed": per}
    (apd_dir / "metrics.json").write_text(json.dumps(metrics))
    res = CliRunner().invoke(app, _args(spd_dir, "--apd-run", str(apd_dir), "--no-compile"))
    assert res.exit_code == 0, res.output
    m = json.loads((spd_dir / "metrics.json").read_text())
    assert m["apd"]["mmcs"] == [0.998, 0.95] and m["apd"]["failed_seeds"] == 1 and m["apd"]["seeds"] == [0, 1]
    assert m["apd"]["paper_statistic"]["seed"] == 0 and m["config"]["compile"] is False
    md = (spd_dir / "report.md").read_text()
    assert "## SPD and APD on the same targets" in md and "| 1 of 2 |" in md and "| 0.9500 | 0.5000 |" in md
    other = TMS(5, 2)  # another network at seed 1: the comparison would not be like for like
    save_toy(other, apd_dir / "seed1" / "target", {"loss": 0.0})
    bad = CliRunner().invoke(app, _args(spd_dir, "--apd-run", str(apd_dir), "--no-compile"))
    assert bad.exit_code == 1 and "seed 1's target" in bad.output and "differs" in bad.output, bad.output
    (apd_dir / "metrics.json").write_text(json.dumps({**metrics, "setting": "tms-40-10"}))
    bad = CliRunner().invoke(app, _args(spd_dir, "--apd-run", str(apd_dir), "--no-compile"))
    assert bad.exit_code == 1 and "expected 'tms-5-2'" in bad.output, bad.output
    bad = CliRunner().invoke(app, _args(spd_dir, "--apd-run", str(tmp_path / "nowhere"), "--no-compile"))
    assert bad.exit_code == 1 and "does not exist" in bad.output, bad.output


@pytest.mark.slow
def test_reproduce_resid_and_identity_tiny(tmp_path, tms52_target):
    biased = build_resid_mlp(RESID_PRESETS["resid-mlp-1"])
    save_toy(biased, tmp_path / "old" / "seed0" / "target", {"loss": 0.0, "config": target_config(
        "resid-mlp-1", 0, True, "ours")})
    try:  # a biased target of before 2026-12-04 is not the SPD reference's: refused, naming the field
        reproduce("resid-mlp-1", 1, tmp_path / "old", quick=True, quiet=True, overrides={"steps": 3}, n_eval=400)
        raise AssertionError("biased target accepted")
    except ValueError as e:
        assert "bias: saved True, requested False" in str(e) and "fidelity 'ours'" in str(e), str(e)
    for bad in ("exact", ""):  # an unknown target recipe is refused before anything is written
        try:
            reproduce("resid-mlp-1", 1, tmp_path / "bad", quick=True, quiet=True, fidelity=bad)
            raise AssertionError(f"fidelity {bad!r} accepted")
        except ValueError as e:
            assert "fidelity must be one of ('ours', 'reference')" in str(e), str(e)
        assert not (tmp_path / "bad").exists()
    out = reproduce("resid-mlp-1", 1, tmp_path / "old", quick=True, quiet=True, overrides={"steps": 3}, n_eval=400,
                    fidelity="ours")  # ... and decomposed as before when asked for
    assert out["target_fidelity"] == "ours"
    model = build_resid_mlp(replace(RESID_PRESETS["resid-mlp-1"], bias=False))
    assert model.layers[0].mlp_in.bias is None and model.layers[0].mlp_out.bias is None
    save_toy(model, tmp_path / "r" / "seed0" / "target", _info("resid-mlp-1"))
    out = reproduce("resid-mlp-1", 1, tmp_path / "r", quick=True, quiet=True, overrides={"steps": 3}, n_eval=400)
    assert out["target_fidelity"] == "reference"
    assert "no biases" in (tmp_path / "r" / "report.md").read_text()
    m = out["per_seed"][0]
    assert set(m["alive"]) == {"layers.0.mlp_in", "layers.0.mlp_out"}
    assert len(m["subcomponents_per_feature"]["layers.0.mlp_in"]) == 100
    assert m["scrubbed_mse"] >= 0 and m["anti_scrubbed_mse"] >= 0
    assert "scrubbed MSE" in (tmp_path / "r" / "report.md").read_text()
    save_toy(tms52_target, tmp_path / "i" / "seed0" / "target", _info())
    out = reproduce("tms-5-2-id", 1, tmp_path / "i", quick=True, quiet=True, overrides={"steps": 3}, n_eval=400)
    assert set(out["per_seed"][0]["alive"]) == {"linear1", "identity", "linear2"}


def test_presets_resolve_on_their_targets_and_quick_is_smaller():
    assert set(PRESETS) == set(QUICK) == set(SETTINGS)
    for name in SETTINGS:
        cfg, quick = spd_config(name, False, 0), spd_config(name, True, 0)
        assert quick.steps < cfg.steps and quick.batch_size <= cfg.batch_size
        if name.startswith("tms"):
            from mlpinterp.toys import as_linears, with_identity

            n, h = (5, 2) if "5-2" in name else (40, 10)
            toy = TMS(n, h)
            model = as_linears(with_identity(toy) if name.endswith("-id") else toy)
        else:
            model = build_resid_mlp(RESID_PRESETS[name])
        assert [s.name for s in resolve_sites(model, cfg.targets)] == list(cfg.targets)
        assert set(cfg.targets) == set(model.target_names())


def test_identity_setting_reuses_the_base_target(tmp_path, tms52_target):
    save_toy(tms52_target, tmp_path / "target", _info())
    toy, model, _ = spd_target("tms-5-2-id", 0, tmp_path / "target.safetensors", True, True)
    x = torch.rand(7, 5)
    torch.testing.assert_close(model(x), tms52_target(x))
    assert toy.identity is not None


def test_cli_importance_minimality_coeff_overrides_beta(tmp_path, monkeypatch):
    """``--importance-minimality-coeff`` reaches the configuration as an override (a custom run); bad values are
    refused before anything is written."""
    import mlpinterp.studies.spd.run as spd_exp

    seen = {}
    monkeypatch.setattr(spd_exp, "reproduce", lambda *a, **kw: seen.update(kw) or {})
    res = CliRunner().invoke(app, _args(tmp_path, "--importance-minimality-coeff", "1e-6"))
    assert res.exit_code == 0, res.output
    assert seen["overrides"] == {"steps": 10, "compile": True, "importance_minimality_coeff": 1e-6}
    assert spd_config("resid-mlp-1", False, 0, **{"importance_minimality_coeff": 1e-6}).importance_minimality_coeff \
        == 1e-6
    monkeypatch.undo()
    for bad, msg in (("-1", "--importance-minimality-coeff must be finite and >= 0, got -1.0"),
                     ("inf", "--importance-minimality-coeff must be finite")):
        res = CliRunner().invoke(app, _args(tmp_path / "bad", "--importance-minimality-coeff", bad))
        assert res.exit_code == 1 and msg in res.output and "Traceback" not in res.output, res.output
        assert not (tmp_path / "bad").exists()


def test_current_reference_recipe_presets_cli_and_report(tmp_path, tms52_target):
    """``--recipe current``: the reference's config values reach the run (delta component, no faithfulness loss,
    warm-up, fresh layerwise masks, its steps and cosine annealing), metrics.json and the report say so, a paper-recipe
    checkpoint is not resumed as a current one, and resid-MLP-2 (not implemented that way) is refused."""
    from mlpinterp.studies.spd.settings import CURRENT

    cur = spd_config("tms-5-2", False, 0, "current")
    assert (cur.delta_component, cur.faithfulness_coeff, cur.faithfulness_warmup_steps, cur.layerwise_masks,
            cur.steps, cur.lr_schedule, cur.init, cur.C, cur.importance_minimality_coeff) == (
        True, 0.0, 200, "fresh", 10_000, "cosine-annealing", "scaled", 20, 3e-3)
    assert spd_config("resid-mlp-1", False, 0, "current").steps == 20_000
    assert spd_config("tms-40-10-id", False, 0, "current").steps == 20_000
    assert spd_config("tms-5-2", True, 0, "current").steps == QUICK["tms-5-2"]["steps"]  # the quick budget wins
    assert set(CURRENT) == set(SETTINGS) - {"resid-mlp-2"}
    try:
        spd_config("resid-mlp-2", False, 0, "current")
        raise AssertionError("resid-mlp-2 current accepted")
    except ValueError as e:
        assert "PGD" in str(e) and "use recipe 'paper'" in str(e)
    try:
        spd_config("tms-5-2", False, 0, "newest")
        raise AssertionError("unknown recipe accepted")
    except ValueError as e:
        assert "recipe must be one of ('paper', 'current')" in str(e)
    for s in (0, 1):
        save_toy(tms52_target, tmp_path / f"seed{s}" / "target", _info(seed=s))
    res = CliRunner().invoke(app, _args(tmp_path, "--recipe", "current", "--seeds", "1"))
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["recipe"] == "current" and m["config"]["delta_component"] and m["config"]["faithfulness_coeff"] == 0
    h = json.loads((tmp_path / "seed0" / "history.json").read_text())
    assert h[0]["faithfulness_warmup_last"] < h[0]["faithfulness_warmup_first"]
    md = (tmp_path / "report.md").read_text()
    assert "current reference recipe" in md and "200-step faithfulness warm-up" in md and "not the paper's" in md
    other = tmp_path / "paper"
    save_toy(tms52_target, other / "seed0" / "target", _info(seed=0))
    assert CliRunner().invoke(app, _args(other, "--seeds", "1", "--recipe", "paper")).exit_code == 0
    assert json.loads((other / "metrics.json").read_text())["recipe"] == "paper"
    bad = CliRunner().invoke(app, _args(other, "--seeds", "1"))  # the default is current: refused, naming both
    assert bad.exit_code == 1 and "holds a `--recipe paper` run" in bad.output, bad.output
    assert "pass --recipe paper to resume it" in " ".join(bad.output.split()), bad.output
    (other / "metrics.json").unlink()  # an interrupted run has no metrics.json: its checkpoint refuses
    bad = CliRunner().invoke(app, _args(other, "--seeds", "1", "--recipe", "current"))
    assert bad.exit_code == 1 and "delta_component: saved False, requested True" in bad.output, bad.output
    r2 = CliRunner().invoke(app, ["reproduce", "spd", "--setting", "resid-mlp-2", "--out", str(tmp_path / "r2"),
                                  "--recipe", "current", "--quick", "--quiet"])
    assert r2.exit_code == 1 and "not available for resid-mlp-2" in r2.output and "Traceback" not in r2.output
    assert not (tmp_path / "r2").exists()


def test_default_recipe_is_current_where_implemented(tmp_path, tms52_target):
    """Without --recipe, reproduce spd runs the current reference recipe (measured better across seeds), except on
    resid-MLP-2 where only the paper's is implemented; the help says so."""
    from mlpinterp.studies.spd.settings import default_recipe

    assert {s: default_recipe(s) for s in SETTINGS} == {**{s: "current" for s in SETTINGS}, "resid-mlp-2": "paper"}
    with pytest.raises(ValueError, match="setting must be one of"):
        default_recipe("tms-9-9")
    save_toy(tms52_target, tmp_path / "seed0" / "target", _info(seed=0))
    res = CliRunner().invoke(app, _args(tmp_path, "--seeds", "1"))
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["recipe"] == "current" and m["config"]["lower_sigmoid"] == "clamped"
    assert m["config"]["tied_updates"] == "separate" and m["config"]["delta_component"]
    assert "two parameters over one storage" in (tmp_path / "report.md").read_text()
    help_text = flat(CliRunner().invoke(app, ["reproduce", "spd", "--help"], env={"COLUMNS": "300"}).output)
    assert "Default: current (paper for resid-mlp-2, where current is not implemented)" in help_text, help_text


def test_resid_goal_on_hand_metrics():
    """The residual-MLP verdict: W_in one distinct monosemantic subcomponent per feature, W_out d_mlp ± 20 % used as
    one group (co-activity ≥ 0.25: the paper's Fig. 8 has 0.51), anti-scrubbed ≥ 3x scrubbed. Metrics shaped like
    our runs: the reference's bias-free target passes, the biased target's per-feature-ish W_out does not."""
    from mlpinterp.studies.spd.goals import resid_goal

    def m(used, frac, w_in=100, anti=2e-3):
        return {"features_with_one_subcomponent": {"l.mlp_in": w_in}, "features_one_distinct": {"l.mlp_in": w_in},
                "features_monosemantic": w_in, "mlp_out_one_hot": {"l.mlp_out": {"used": used, "always": 0,
                                                                                   "fraction": frac}},
                "d_mlp": 50, "scrubbed_mse": 1.2e-5, "anti_scrubbed_mse": anti}

    assert resid_goal(m(53, 0.44), 100)  # bias-free target, quick preset
    assert resid_goal(m(50, 0.51), 100)  # the paper's Fig. 8, read off the figure
    assert not resid_goal(m(86, 0.32), 100)  # biased target: too many used
    assert not resid_goal(m(50, 0.02), 100)  # one per feature
    assert not resid_goal(m(53, 0.44, w_in=96), 100)
    assert not resid_goal(m(53, 0.44, anti=3e-5), 100)
