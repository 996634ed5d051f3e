"""End-to-end smoke test of the main job on real data (scikit-learn digits), via the CLI."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from tests.cli_utils import flat


def test_reproduce_polynomial_smoke_on_digits(tmp_path):
    out = tmp_path / "run"
    args = ["reproduce", "polynomial", "--dataset", "digits", "--seeds", "2", "--out", str(out), "--smoke", "--quiet"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    res = json.loads((out / "results.json").read_text())
    fin = res["final"]
    for name in ("linear_mixture", "quadratic_mixture", "linear_gaussian", "quadratic_gaussian"):
        for key in ("fvu_mixture", "fvu_test"):
            m = fin[name][key]["mean"]
            assert np.isfinite(m) and 0.0 <= m <= 1.0, (name, key, m)
        assert 0.0 <= fin[name]["test_accuracy"]["mean"] <= 1.0
        assert fin[name]["kl_test"]["mean"] >= 0.0
    # quadratic <= linear under the distribution each was fitted on (exact optimum; MC noise allowance)
    for i in range(len(res["steps"])):
        lin = res["curves"]["linear_mixture"]["fvu_mixture"]["mean"][i]
        quad = res["curves"]["quadratic_mixture"]["fvu_mixture"]["mean"][i]
        assert quad <= lin + 1e-3, (i, quad, lin)
    # approximant accuracy stays within the range spanned by chance and the network (plus slack)
    net_acc = fin["network"]["test_accuracy"]["mean"]
    assert fin["quadratic_mixture"]["test_accuracy"]["mean"] <= net_acc + 0.1
    for f in ("report.md", "report.html", "curves.csv", "attack.csv", "figures/fvu_vs_step.png",
              "figures/svd_attack.png", "figures/features.png", "figures/attack_grid.png", "figures/kl_vs_step.png"):
        assert (out / f).exists(), f
    assert "| claim |" in (out / "report.md").read_text()
    assert "data:image/png;base64" in (out / "report.html").read_text()
    # resuming is a no-op that reproduces the same numbers
    before = (out / "seed0" / "eval").stat().st_mtime_ns
    r2 = CliRunner().invoke(app, args)
    assert r2.exit_code == 0, r2.output
    res2 = json.loads((out / "results.json").read_text())
    assert res2["final"] == res["final"]
    assert (out / "seed0" / "eval").stat().st_mtime_ns == before


def test_reproduce_polynomial_rejects_bad_options(tmp_path):
    r = CliRunner().invoke(app, ["reproduce", "polynomial", "--seeds", "0", "--out", str(tmp_path)])
    assert r.exit_code != 0 and "seeds" in flat(r.output)
    r = CliRunner().invoke(app, ["reproduce", "polynomial", "--dataset", "cifar", "--out", str(tmp_path)])
    assert r.exit_code != 0


def test_reproduce_polynomial_final_only_quadratic_policy(tmp_path):
    """The MNIST-scale policy (mixture quadratic at the final checkpoint only) yields gaps, not crashes."""
    out = tmp_path / "run"
    args = ["reproduce", "polynomial", "--seeds", "1", "--out", str(out), "--smoke", "--steps", "32", "--quiet",
            "--quadratic-mixture-steps", "final"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    res = json.loads((out / "results.json").read_text())
    quad = res["curves"]["quadratic_mixture"]["fvu_mixture"]["mean"]
    assert quad[:-1] == [None] * (len(quad) - 1) and quad[-1] is not None
    assert all(v is not None for v in res["curves"]["quadratic_gaussian"]["fvu_mixture"]["mean"])
