"""reproduce three-spaces: ground truth of the toys, coordinates under a known rotation, the report, the CLI."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mlpinterp.networks import MLP
from mlpinterp.studies.three_spaces.activation_space import activation_space
from mlpinterp.studies.three_spaces.block import toy_block, transformer_block
from mlpinterp.studies.three_spaces.directions import match
from mlpinterp.studies.three_spaces.function_space import function_space
from mlpinterp.studies.three_spaces.parameter_space import parameter_space
from mlpinterp.toys.data import sparse_features
from mlpinterp.toys.resid_mlp import ResidMLPConfig, build_resid_mlp
from mlpinterp.toys.tms import TMS, as_linears


def _sample(n_features, p, lo):
    return lambda b, g: sparse_features(b, n_features, p, (lo, 1.0), generator=g)


def test_toy_ground_truth_is_the_embedding_and_the_feature_columns():
    toy = build_resid_mlp(ResidMLPConfig(n_features=7, d_embed=12, d_mlp=4, steps=1, batch_size=2))
    blk = toy_block("resid-mlp-1", toy, toy, _sample(7, 0.3, -1.0), 0, 50, 20)
    np.testing.assert_array_equal(blk.truth, toy.W_E.double().numpy())  # rows of W_E: the embedded features
    x = sparse_features(5, 7, 0.5, (-1.0, 1.0), generator=torch.Generator().manual_seed(1))
    r = x.double() @ toy.W_E.double()
    np.testing.assert_allclose(blk.network(r.numpy()), toy.layers[0](r.float()).double().detach().numpy(), atol=1e-5)
    # the SPD readout of the model's output is W_U applied to the block's output
    y = toy(x).double().detach()
    np.testing.assert_allclose(blk.spd_readout(y, x).numpy(), blk.network(r.numpy()) @ blk.readout, atol=1e-4)

    tms = TMS(5, 2)
    lin = as_linears(tms)
    blk = toy_block("tms-5-2", tms, lin, _sample(5, 0.2, 0.0), 0, 50, 20)
    np.testing.assert_array_equal(blk.truth, tms.W.detach().double().numpy().T)  # row i = column W[:, i]
    h = blk.X_test
    np.testing.assert_allclose(blk.network(h), lin(blk.spd_test).double().detach().numpy(), atol=1e-5)
    assert blk.spd_input_site == "linear2"  # the site whose input is h


def _rotated_blocks(seed=0):
    """A block whose outputs are ReLUs of 3 sparse features along known directions T in R^6, and the same block
    with inputs rotated by a known orthogonal Q (x' = Q x, W1' = W1 Q^T: the same function)."""
    rng = np.random.default_rng(seed)
    d, n = 6, 3
    T = np.linalg.qr(rng.standard_normal((d, n)))[0].T  # [3, 6] orthonormal features
    Q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    g = torch.Generator().manual_seed(seed)
    Z = sparse_features(3000, n, 0.3, (0.0, 1.0), generator=g).double().numpy()
    X = Z @ T
    net = MLP(T * 2.0, -0.2 * np.ones(n), np.eye(n), np.zeros(n), "relu")
    net_r = MLP(T @ Q.T * 2.0, -0.2 * np.ones(n), np.eye(n), np.zeros(n), "relu")
    return (transformer_block(net, X[:2500], X[2500:], 3, 0), transformer_block(net_r, X[:2500] @ Q.T, X[2500:] @ Q.T,
                                                                                  3, 0), T, Q)


def _same_directions(A, B, atol):
    """Every row of A equals some row of B up to sign (and vice versa when the counts agree)."""
    assert A.shape == B.shape
    m = match(A, B)
    np.testing.assert_allclose(m.max_cos, 1.0, atol=atol)


def test_function_space_directions_rotate_with_the_inputs():
    blk, blk_r, T, Q = _rotated_blocks()
    fs, fs_r = function_space(blk), function_space(blk_r)
    assert fs["chosen"] == fs_r["chosen"]
    for kind in ("quadratic", "linear"):
        _same_directions(fs["directions"][kind] @ Q.T, fs_r["directions"][kind], 1e-6)
    # and the quadratic eigen-features of this block are its feature directions, in the rotated coordinates
    assert match(T @ Q.T, fs_r["directions"]["quadratic"]).mmcs > 0.999
    assert match(T, fs_r["directions"]["quadratic"]).mmcs < 0.9


def test_sae_and_spd_directions_are_read_in_the_rotated_coordinates():
    _, blk_r, T, Q = _rotated_blocks()
    # Adam: this 300-step problem is about coordinates, not the default recipe's speed on it
    acts = activation_space(blk_r, d_sae=3, k=1, steps=300, batch_size=128, seed=0, optimizer="adam")
    W = acts["directions"]["sae"]
    assert match(T @ Q.T, W).mmcs > 0.9, match(T @ Q.T, W).max_cos
    assert match(T, W).mmcs < 0.9
    from mlpinterp.spd.train import SPDConfig

    cfg = SPDConfig(targets=("0", "2"), C=6, steps=300, batch_size=128, lr=1e-2, lr_schedule="constant",
                    importance_minimality_coeff=1e-4, pnorm=2.0, log_every=100)
    ps = parameter_space(blk_r, cfg)
    dec = ps["decomposition"]
    # the input site's subcomponents sum to the rotated weight W1' = W1 Q^T: their V_c are in the rotated inputs
    S = (dec.U("0") @ dec.V("0")).detach().double().numpy()
    W1r = blk_r.network.W1
    assert np.linalg.norm(S - W1r) < 0.2 * np.linalg.norm(W1r)
    assert np.linalg.norm(S @ Q - W1r) > 0.5 * np.linalg.norm(W1r)


def _tiny(monkeypatch, setting="tms-5-2"):
    from mlpinterp.studies.three_spaces import settings

    small = replace(settings.PRESETS[setting]["quick"], n_fit=600, n_test=300, sae_steps=30, sae_batch=64,
                    spd=dict(steps=20, batch_size=64, log_every=10, compile=False))
    monkeypatch.setitem(settings.PRESETS[setting], "quick", small)


def _place_target(tms52_target, out, seed=0):
    from mlpinterp.studies.spd.settings import target_fidelity
    from mlpinterp.toys.io import save_toy
    from mlpinterp.toys.settings import target_config

    save_toy(tms52_target, out / "targets" / f"seed_{seed}",
             {"loss": 0.0, "config": target_config("tms-5-2", seed, True, target_fidelity("tms-5-2"))})


def test_cli_tiny_end_to_end_run_writes_results_figures_and_report(tmp_path, tms52_target, monkeypatch):
    from typer.testing import CliRunner

    from mlpinterp.cli.main import app

    _tiny(monkeypatch)
    _place_target(tms52_target, tmp_path)
    res = CliRunner().invoke(app, ["reproduce", "three-spaces", "--setting", "tms-5-2", "--out", str(tmp_path),
                                   "--quick", "--quiet"])
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "results.json").read_text())
    s = r["per_seed"][0]
    assert r["preset"] == "quick" and r["seeds"] == 1 and r["cpu_seconds"] > 0
    assert set(s["truth"]) == {"quadratic", "linear", "spd", "sae"} == set(s["pairwise"])
    for m, t in s["truth"].items():
        assert 0 <= t["mmcs"] <= 1 and 0 <= t["recovered"] <= 5 and t["count"] == s["counts"][m]
        assert t["random"]["n_draws"] == 20 and t["random"]["count"] == t["count"]
    # TMS: each output's quadratic form is rank one along its own feature column, so the eigen-features are the truth
    assert s["truth"]["quadratic"]["mmcs"] > 0.999 and s["truth"]["quadratic"]["recovered"] == 5
    md, page = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert "smoke run" in md and "Nothing yet" in md
    # every figure is referenced in report.md and embedded in report.html
    assert sorted(re.findall(r"!\[[^\]]*\]\(figures/([^)]+)\)", md)) == sorted(r["figures"]) and len(r["figures"]) == 4
    assert page.count('<img src="data:image/png;base64,') == len(r["figures"])
    for f in r["figures"]:
        assert (tmp_path / "figures" / f).stat().st_size > 1000


def test_cli_refuses_options_of_other_settings(tmp_path):
    from typer.testing import CliRunner

    from mlpinterp.cli.main import app

    res = CliRunner().invoke(app, ["reproduce", "three-spaces", "--setting", "tms-5-2", "--out", str(tmp_path),
                                   "--layer", "2"])
    assert res.exit_code == 1 and "Error:" in res.output and "layer applies to the transformer settings" in res.output
    res = CliRunner().invoke(app, ["reproduce", "three-spaces", "--setting", "minilm", "--out", str(tmp_path),
                                   "--model", str(tmp_path)])
    assert res.exit_code == 1 and "model applies to the lm setting only" in res.output


def test_a_missing_text_directory_is_refused_before_any_model_is_loaded(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mlpinterp.cli.main import app
    from mlpinterp.studies.three_spaces import run

    def no_model(*a, **k):
        raise AssertionError("a model was loaded or trained before the text directory was checked")

    monkeypatch.setattr(run, "_lm_model", no_model)
    for setting in ("minilm", "lm"):
        out = tmp_path / setting
        res = CliRunner().invoke(app, ["reproduce", "three-spaces", "--setting", setting, "--out", str(out),
                                       "--data", str(tmp_path / "nope")])
        assert res.exit_code == 1 and "Traceback" not in res.output and "--data" in res.output
        assert "does not exist" in res.output and not out.exists()


def test_full_report_states_findings_and_no_smoke_warning():
    from mlpinterp.studies.three_spaces.report import pairwise_table, truth_table

    def entry(mmcs, rec, rm):
        return {"mmcs": mmcs, "mmcs_se": 0.02, "recovered": rec, "distinct": rec, "count": 10, "max_cos": [0.0] * 10,
                "random": {"mmcs": rm, "mmcs_se": 0.01, "recovered": 0.0}}

    per = [{"truth": {"quadratic": entry(0.95, 9, 0.2), "sae": entry(0.5, 2, 0.2)},
            "pairwise": {"quadratic": {"sae": {"mmcs": 0.9, "count_a": 10, "count_b": 10,
                                               "random": {"mmcs": 0.3, "mmcs_se": 0.01}}},
                         "sae": {"quadratic": {"mmcs": 0.305, "count_a": 10, "count_b": 10,
                                               "random": {"mmcs": 0.3, "mmcs_se": 0.01}}}}}]
    table, lines = truth_table(per)
    # one seed: the MMCS with its s.e. over the true features
    assert "quadratic eigen-features recover 9 of 10 true features" in lines[0] and "| 0.950 ± 0.020 |" in table
    _, verdicts = pairwise_table(per)
    assert verdicts == {"above": ["quadratic → sae (0.900 vs 0.300)"], "below": [],
                        "within": ["sae → quadratic (0.305 vs 0.300)"]}
    per[0]["pairwise"]["sae"]["quadratic"]["mmcs"] = 0.1
    table, verdicts = pairwise_table(per)
    assert verdicts["below"] == ["sae → quadratic (0.100 vs 0.300)"] and verdicts["within"] == []
    assert "| no (below) |" in table


def test_seed_results_are_cached_per_seed_and_recomputed_for_another_budget(tmp_path, monkeypatch):
    from mlpinterp.studies.three_spaces import run, settings

    calls = []

    def fake(setting, seed, pre, out, quick, quiet):
        calls.append((setting, seed, pre.sae_steps))
        return {"seed": seed, "x": float("nan"), "steps": pre.sae_steps}

    monkeypatch.setattr(run, "_toy_seed", fake)
    first = run.seed_result("tms-5-2", 1, tmp_path, quick=True)
    again = run.seed_result("tms-5-2", 1, tmp_path, quick=True)
    assert calls == [("tms-5-2", 1, settings.PRESETS["tms-5-2"]["quick"].sae_steps)]
    assert first == again == {"seed": 1, "x": None, "steps": calls[0][2]}  # as read back: nan is null
    assert (tmp_path / "seeds" / "seed_1.json").is_file()
    _tiny(monkeypatch)  # another budget: the cached seed is not reused
    assert run.seed_result("tms-5-2", 1, tmp_path, quick=True)["steps"] == 30 and len(calls) == 2
    run.seed_result("tms-5-2", 0, tmp_path, quick=True)  # another seed: its own file
    assert len(calls) == 3
    with pytest.raises(ValueError, match="setting must be one of"):
        run.seed_result("minilm", 0, tmp_path)


def test_spd_per_feature_counts_on_hand_built_importances(monkeypatch):
    from mlpinterp.spd import metrics
    from mlpinterp.studies.three_spaces import run

    # features 0 and 1 each with one subcomponent of their own, feature 2 with two, feature 3 with none
    ci = torch.tensor([[0.9, 0.0, 0.0, 0.05, 0, 0], [0, 1.0, 0, 0, 0, 0], [0, 0.5, 0.2, 0, 0, 0], [0.0] * 6])

    class Blk:
        spd_model, spd_input_site = None, "layers.0.mlp_in"

    seen = {}

    def fake(model, dec, n_features, value):
        seen.update(n=n_features, value=value)
        return {"layers.0.mlp_in": ci, "layers.0.mlp_out": torch.ones(4, 6)}

    monkeypatch.setattr(metrics, "one_hot_importances", fake)
    r = run._spd_per_feature(Blk(), None, 4)
    assert seen == {"n": 4, "value": 0.75}
    assert r["features_with_one_subcomponent"] == 2 and r["distinct_owners"] == 2 and r["site"] == "layers.0.mlp_in"
    # identity pattern: feature 0 ok (0.9 >= 0.9), feature 1 ok, feature 2: assigned 0.2 < 0.9 and 0.5 > 0.1 off
    # the assignment, feature 3: its assigned entry 0 < 0.9
    assert r["identity_ci_error"] == 3


def test_compare_reads_every_set_on_the_inputs_support():
    from types import SimpleNamespace

    from mlpinterp.studies.three_spaces import run

    rng = np.random.default_rng(0)
    X = np.zeros((400, 4))
    X[:, :2] = rng.standard_normal((400, 2))  # inputs on span(e1, e2) of R^4
    blk = SimpleNamespace(X_test=X, network=SimpleNamespace(d_in=4), truth=np.eye(4)[:2])
    # each direction reads one true feature plus an off-support part of the same size: |cos| 1/sqrt2 unprojected
    sets = {"a": np.array([[1.0, 0, 1, 0], [0, 1.0, 0, -1]]), "b": np.array([[1.0, 1.0, 0, 3.0]])}
    assert match(blk.truth, sets["a"]).mmcs == pytest.approx(1 / np.sqrt(2), abs=1e-12)
    r = run._compare(blk, sets, 0)
    assert r["support_dim"] == 2 and r["counts"] == {"a": 2, "b": 1}
    np.testing.assert_allclose(r["share_on_support"]["a"]["mean"], 0.5, atol=1e-12)
    np.testing.assert_allclose(r["share_on_support"]["b"]["mean"], 2 / 11, atol=1e-12)
    assert r["truth"]["a"]["mmcs"] == pytest.approx(1.0, abs=1e-12) and r["truth"]["a"]["recovered"] == 2
    assert r["truth"]["b"]["mmcs"] == pytest.approx(1 / np.sqrt(2), abs=1e-12)  # (1, 1) in the plane
    assert r["pairwise"]["a"]["b"]["mmcs"] == pytest.approx(1 / np.sqrt(2), abs=1e-12)
    # the baseline draws on the plane: one random unit vector there has E|cos| = 2/pi to e1 (2/pi, not R^4's 1/2)
    rb = r["truth"]["b"]["random"]
    assert abs(rb["mmcs"] - 2 / np.pi) < 4 * rb["mmcs_se"] and rb["mmcs"] > 0.55


def test_recovery_summary_names_who_recovers_what_and_the_disagreements():
    from mlpinterp.studies.three_spaces.report import recovery_summary

    def entry(cos):
        return {"recovered": int((np.asarray(cos) >= 0.9).sum()), "max_cos": cos}

    # 4 features; the SAE recovers all 4 on both seeds, SPD features 0-1 on seed 0 and 0-2 on seed 1
    per = [{"truth": {"spd": entry([0.95, 0.91, 0.5, 0.2]), "sae": entry([0.99] * 4)}},
           {"truth": {"spd": entry([0.95, 0.91, 0.92, 0.2]), "sae": entry([0.99] * 4)}}]
    lines = recovery_summary(per)
    assert lines[0] == ("Recover the planted features (at least 90% of the 4 true features at |cos| ≥ 0.9, mean over "
                        "n = 2 seeds): SAE decoder directions (4.0).")
    assert lines[1] == "Do not: SPD read directions V_c (2.5)."
    assert lines[2].endswith("spd not sae 0.0, sae not spd 1.5.")


def _fake_results(n_seeds: int) -> dict:
    """A toy run's results.json with every field the report reads; counts differ across seeds when n_seeds > 1."""
    methods = ("quadratic", "linear", "spd", "sae")

    def seed(i):
        truth = {m: {"count": 18 + i % 2, "distinct": 17, "recovered": 18 - (i == 2), "mmcs": 0.8 + 0.01 * i,
                     "mmcs_se": 0.02, "max_cos": [0.95] * 20,
                     "random": {"mmcs": 0.3, "mmcs_se": 0.01, "recovered": 0.0}} for m in methods}
        pair = {a: {b: {"mmcs": 0.5, "mmcs_se": 0.01, "count_a": 18, "count_b": 18,
                        "random": {"mmcs": 0.3, "mmcs_se": 0.01}} for b in methods if b != a} for a in methods}
        return {"seed": i, "truth": truth, "pairwise": pair, "support_dim": 20,
                "share_on_support": {m: {"mean": 1.0} for m in methods},
                "block": {"input": "the residual stream", "d_in": 20, "d_hidden": 10, "d_out": 20},
                "function": {"fvu": 0.071, "chosen": "data", "candidates": {"gaussian": {"fvu": 0.5},
                                                                             "data": {"fvu": 0.071}}},
                "parameter": {"fvu": 0.034 + 0.001 * i, "ci_l0": {"mlp_in": 1.0}, "alive": {"mlp_in": 98},
                              "C": 100, "steps": 10, "batch_size": 8},
                "activation": {"fvu": 0.05, "l0": 1.5, "d_sae": 40, "k": 3, "fvu_input": 0.04, "alive": 38}}

    return {"setting": "resid-mlp-1", "preset": "full", "seeds": n_seeds, "per_seed": [seed(i) for i in range(n_seeds)],
            "seconds": 1.0, "cpu_seconds": 1.0, "threads": 1, "load_average": [0.1, 0.1, 0.1], "context": None}


def test_counts_are_integers_for_one_seed_and_mean_se_for_several():
    from mlpinterp.studies.three_spaces.report import count_cell, count_mean

    assert count_cell([18]) == "18" and count_cell([98.0]) == "98" and count_mean([18.0]) == "18"
    # 17, 18, 18: mean 17.67, sample std sqrt(1/3) = 0.577, s.e. 0.577 / sqrt(3) = 0.333
    assert count_cell([17, 18, 18]) == "17.7 ± 0.3" and count_mean([17, 18, 18]) == "17.7"


def test_report_wording_states_n_and_the_spread_for_one_and_three_seeds(tmp_path):
    from mlpinterp.studies.three_spaces.report import write

    write(tmp_path / "one", _fake_results(1))
    md = (tmp_path / "one" / "report.md").read_text()
    flat = " ".join(md.split())
    assert "n = 1 seed (seed 0, full preset), so there is no spread across seeds" in flat
    assert "The ± beside an MMCS is its standard error over the reference set's directions" in flat
    assert "where a count is shown" not in flat and "values are mean ± s.e. over seeds" not in flat
    # counts print as integers, never "18.0"; the MMCS keeps its s.e. over the true features
    assert "| quadratic eigen-features | 18 | 0.800 ± 0.020 |" in md and "| 18 | 0.00 | 17 |" in md
    assert "MMCS to truth (± s.e. over the true features)" in md
    assert "recover 18 of 20 true features" in md and "18.0" not in md and "98.0" not in md
    assert "alive mlp_in: 98" in md and "alive 38" in md

    write(tmp_path / "three", _fake_results(3))
    md = (tmp_path / "three" / "report.md").read_text()
    flat = " ".join(md.split())
    assert ("n = 3 seeds (full preset). A value written m ± s is the mean over the 3 seeds ± its standard error "
            "(s.e. = sample standard deviation over seeds / √3)") in flat
    assert "no spread across seeds" not in flat and "MMCS to truth (± s.e. over seeds)" in md
    # counts 18, 19, 18 -> 18.3 ± 0.3; recovered 18, 18, 17 -> 17.7 ± 0.3 (hand: s.e. = sqrt(1/3) / sqrt(3))
    assert "| quadratic eigen-features | 18.3 ± 0.3 | 0.810 ± 0.006 |" in md and "| 17.7 ± 0.3 |" in md
    assert "recover 17.7 of 20" in md


def test_seeds_and_quick_help_name_the_spread_and_a_measured_budget():
    from mlpinterp.cli.three_spaces import ThreeSpacesCommand
    from mlpinterp.utils.config_docs import field_docs

    docs = field_docs(ThreeSpacesCommand)
    assert "mean ± s.e." in docs["seeds"] and "std" not in docs["seeds"]
    assert "quiet 2-core CPU" in docs["quick"] and "at most" not in docs["quick"]
    assert "docs/measurements.md" in docs["quick"]  # the measured times live in the log, not in the help


def _drawn(monkeypatch, plot, per, *args):
    """Draw ``plot`` and return its Axes (the figure is kept open instead of saved)."""
    from mlpinterp.studies.three_spaces import figures as figs

    kept = []
    monkeypatch.setattr(figs, "_save", lambda fig, path: kept.append(fig) or path.name)
    plot(per, Path("not_written.png"), *args)
    fig = kept[0]
    fig.canvas.draw()
    return fig.axes[0]


def test_one_seed_figures_draw_no_error_bars_across_seeds(monkeypatch):
    from matplotlib.container import BarContainer, ErrorbarContainer

    from mlpinterp.studies.three_spaces import figures as figs

    for n in (1, 3):
        per = _fake_results(n)["per_seed"]
        for plot, args in ((figs.plot_truth_mmcs, ()), (figs.plot_recovered, (20,)), (figs.plot_pairwise_mmcs, ())):
            ax = _drawn(monkeypatch, plot, per, *args)
            bars = [c for c in ax.containers if isinstance(c, BarContainer)]
            errs = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
            title = ax.get_title()
            assert len(bars) == 2
            if n == 1:
                assert errs == [] and all(b.errorbar is None for b in bars), plot.__name__
                assert "seed 0 only, n = 1: no spread across seeds" in title and "±" not in title
            else:
                assert len(errs) == 2 and "mean ± s.e. over n = 3 seeds" in title
            # the legend sits right of the axes, over no bar
            leg = ax.get_legend()
            assert leg.get_window_extent().x0 >= ax.get_window_extent().x1
        ax = _drawn(monkeypatch, figs.plot_heatmap, per)
        assert ("seed 0 only, n = 1" if n == 1 else "mean over n = 3 seeds") in ax.get_title()


def test_faithfulness_figure_is_dots_on_a_log_axis_with_the_values_written(monkeypatch):
    from matplotlib.container import ErrorbarContainer

    from mlpinterp.studies.three_spaces import figures as figs

    ax = _drawn(monkeypatch, figs.plot_faithfulness, _fake_results(1)["per_seed"])
    assert ax.get_yscale() == "log" and len(ax.patches) == 0 and ax.get_legend() is None  # no bars, nothing covering
    assert not any(isinstance(c, ErrorbarContainer) for c in ax.containers)
    assert sorted(t.get_text() for t in ax.texts) == ["0.034", "0.05", "0.071"]
    lo, hi = ax.get_ylim()
    assert lo < 0.034 and hi > 0.071 and "n = 1" in ax.get_title()
    ax = _drawn(monkeypatch, figs.plot_faithfulness, _fake_results(3)["per_seed"])
    # SPD FVU 0.034, 0.035, 0.036: mean 0.035, sample std 0.001, s.e. 0.001 / sqrt(3) = 0.00058
    assert "0.035 ± 0.00058" in [t.get_text() for t in ax.texts]
    assert sum(isinstance(c, ErrorbarContainer) for c in ax.containers) == 1 and len(ax.patches) == 0
