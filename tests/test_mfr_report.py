"""MFR report: n shown, no "± 0" for one seed, "—" instead of nan, verdicts against the baseline that
can say "worse than baseline", none from a quick run, and a one-k figure that does not stretch its x-axis."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.studies.mfr.analysis import verdicts as _verdicts
from mlpinterp.studies.mfr.figures import integer_k_axis as _integer_k_axis
from mlpinterp.studies.mfr.report import fmt_entry as _fmt

matplotlib.use("Agg")


def _runs(cond_fvus: dict[str, list[float]], k=6, cross=0.5):
    return [{"condition": c, "k": k, "seed": s, "fvu": [v, v], "mmcs_truth": [1 - v, 1 - v], "mmcs_cross": cross}
            for c, vs in cond_fvus.items() for s, v in enumerate(vs)]


def test_verdicts_say_worse_better_or_nothing():
    runs = _runs({"baseline": [0.10, 0.11, 0.12], "mfr": [0.12, 0.13, 0.14], "mfr_alpha0.1": [0.09, 0.10, 0.11]},
                 cross=0.999)
    v = {d["condition"]: d for d in _verdicts(runs, "fvu", "full")}
    assert v["mfr"]["verdict"] == "worse than baseline" and v["mfr"]["n"] == 3
    assert "held-out FVU +" in v["mfr"]["reason"] and "near copies of each other (cross-SAE MMCS 0.999)" in v["mfr"]["reason"]
    assert v["mfr_alpha0.1"]["verdict"] == "better than baseline"
    assert {d["verdict"] for d in _verdicts(runs, "fvu", "quick")} == {"quick run: not a reproduction"}
    one = _runs({"baseline": [0.10], "mfr": [0.2]})
    assert _verdicts(one, "fvu", "full")[0]["verdict"] == "one seed: no verdict"
    noisy = _runs({"baseline": [0.10, 0.11, 0.12], "mfr": [0.12, 0.10, 0.115]})
    assert _verdicts(noisy, "fvu", "full")[0]["verdict"] == "no clear difference"


def test_fmt_shows_n_and_no_plus_minus_for_one_seed():
    assert _fmt({"mean": 0.5, "se": 0.01, "n": 3}) == "0.5000 ± 0.0100 (n = 3)"
    assert _fmt({"mean": 0.5, "se": float("nan"), "n": 1}) == "0.5000 (n = 1)"
    assert _fmt({"mean": float("nan"), "se": float("nan"), "n": 0}) == "—"


def test_one_k_axis_is_not_stretched():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.errorbar([6], [0.5], yerr=[0.0])
    _integer_k_axis(ax, [6])
    assert ax.get_xlim() == (3.0, 9.0) and list(ax.get_xticks()) == [6]
    plt.close(fig)


def test_synthetic_report_is_honest_about_a_tiny_quick_run(tmp_path):
    res = CliRunner().invoke(app, ["reproduce", "mfr", "--setting", "synthetic", "--k", "6", "--seeds", "1",
                                   "--steps", "4", "--quick", "--quiet", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = (tmp_path / "report.md").read_text()
    assert "nan" not in report.lower()
    assert "(n = 1)" in report and "±" not in report.split("## Verdict")[0].split("per-seed values")[1]
    assert "quick run: not a reproduction" in report and "mean_relative_deviation" in report and "Re-initialisations in this run: 0 in" in report
    assert "## SAEBench core metrics" in report and "explained_variance" in report
    html = (tmp_path / "report.html").read_text()
    assert html.count("<img") == 1 and 'src="data:image/png;base64,' in html  # the figure, embedded
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["run_kind"] == "quick"
    core = m["runs"][0]["saebench_core"][0]
    assert set(core) == {"reconstruction_quality", "shrinkage", "sparsity", "misc_metrics", "token_stats"}
    assert core["reconstruction_quality"]["explained_variance"] == pytest.approx(1 - m["runs"][0]["fvu"][0], rel=1e-5)
    assert np.isfinite(m["saebench_core"]["baseline"]["6"]["misc_metrics.frac_alive"])


def test_fvu_improvement_pct_by_hand():
    from mlpinterp.studies.mfr.analysis import fvu_improvement_pct

    summary = {"baseline": {"6": {"fvu": {"mean": 0.20}}, "12": {"fvu": {"mean": 0.10}}},
               "mfr": {"6": {"fvu": {"mean": 0.15}}},  # k = 12 missing: left out
               "reinit": {"6": {"fvu": {"mean": 0.22}}, "12": {"fvu": {"mean": 0.10}}}}
    got = fvu_improvement_pct(summary, (6, 12))
    assert got.keys() == {"mfr", "reinit"}
    assert got["mfr"] == {"6": pytest.approx(25.0)}
    assert got["reinit"] == {"6": pytest.approx(-10.0), "12": pytest.approx(0.0)}


def test_pending_runs_write_each_result_and_skip_finished_runs(tmp_path):
    """The grid in order; a run's result is written to its result.json when the next run is asked for, a finished
    run is read back instead of yielded, and a caller that asks for the next run without a result is refused."""
    from types import SimpleNamespace

    from mlpinterp.studies.mfr.run import pending_runs

    exp = SimpleNamespace(k_values=(2, 4), seeds=1)
    conds = {"baseline": (False, False, 0.0), "mfr": (True, True, None)}
    results = []
    seen = []
    for k, seed, cond, spec, run_dir in pending_runs(tmp_path, exp, conds, results):
        seen.append((k, seed, cond))
        assert spec == conds[cond] and run_dir == tmp_path / "runs" / f"k{k}_seed{seed}_{cond}"
        results.append({"k": k, "condition": cond})
        if len(seen) == 3:
            break  # interrupted after the third run's result was appended but before it was written
    assert seen == [(2, 0, "baseline"), (2, 0, "mfr"), (4, 0, "baseline")]
    written = sorted(p.parent.name for p in tmp_path.glob("runs/*/result.json"))
    assert written == ["k2_seed0_baseline", "k2_seed0_mfr"]
    again = []
    rest = [(k, cond) for k, _, cond, _, _ in pending_runs(tmp_path, exp, conds, again) if not again.append(
        {"k": k, "condition": cond})]
    assert rest == [(4, "baseline"), (4, "mfr")]
    assert [r["condition"] for r in again] == ["baseline", "mfr", "baseline", "mfr"]
    assert json.loads((tmp_path / "runs" / "k4_seed0_mfr" / "result.json").read_text()) == {"k": 4, "condition": "mfr"}
    with pytest.raises(RuntimeError, match="append its result"):
        for _ in pending_runs(tmp_path / "other", exp, conds, []):
            pass
