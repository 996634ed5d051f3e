"""Every study's report comes from its Jinja2 template: it renders on a small results dict, states its statistics
convention, shows no "± 0" and says n = 1 for one seed, embeds every figure it references in report.html (the
bytes of the PNG, parsed back with the standard library's HTML parser), and carries the table CSS that keeps words
whole. The templates ship as package data."""

from __future__ import annotations

import base64
import re
import tomllib
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from mlpinterp.studies import report as rep
from mlpinterp.studies.paramspace.statistics import paper_statistic

STUDIES = ("polynomial", "transformer", "apd", "spd", "mfr")
ZERO_SPREAD = re.compile(r"±\s*0(?![.\d]*[1-9])")
"""A "± 0", "± 0.000" or "± 0.0e+00": a spread shown as zero (never allowed; "± 0.01" is fine)."""


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.src: dict[str, str] = {}
        self.styles: list[str] = []
        self._style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.src[a["alt"]] = a["src"]
        self._style = tag == "style"

    def handle_data(self, data):
        if self._style:
            self.styles.append(data)


def _png(path: Path, seed: int) -> None:
    """A small distinct PNG at ``path`` (oracle for the embedded bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.imshow(np.random.default_rng(seed).random((4, 4)))
    fig.savefig(path, dpi=20)
    plt.close(fig)


def _write(out: Path, markdown: str, title: str) -> tuple[str, str]:
    """Make a PNG for every figure the Markdown references, write the report, return (md, html)."""
    refs = re.findall(r"!\[([^\]]*)\]\(([^)]+)\)", markdown)
    assert refs, "a study report references its figures"
    for i, (_, path) in enumerate(refs):
        _png(out / path, i)
    md_path, html_path = rep.write_report(out, markdown, title)
    md, page = md_path.read_text(), html_path.read_text()
    parsed = _Images()
    parsed.feed(page)
    for alt, path in refs:
        head, data = parsed.src[alt.replace("\\", "")].split(",", 1)
        assert head == "data:image/png;base64", alt
        assert base64.b64decode(data) == (out / path).read_bytes(), f"{path} not embedded byte for byte"
    css = "".join(parsed.styles)
    assert "word-break: normal" in css and "overflow-wrap: normal" in css and "overflow-x: auto" in css
    assert "anywhere" not in css and "break-all" not in css
    return md, page


def _check_stats(md: str, n: int, spread: str) -> None:
    assert rep.convention(spread, n) in md, "the report states its statistics convention"
    if n == 1:  # (with n >= 2 a spread of exactly 0 is a measurement, shown as such)
        assert not ZERO_SPREAD.search(md), ZERO_SPREAD.search(md)
        assert "n = 1" in md


# ------------------------------------------------------------------------------------------------- results dicts


def _polynomial(seeds: int, smoke: bool) -> dict:
    from types import SimpleNamespace

    from mlpinterp.studies.polynomial.report import summarise

    def approx(i, s):
        lin = [0.004, 0.03][i] + 0.001 * s
        return {name: {"fvu_mixture": {"fvu": f}, "fvu_test": {"fvu": f}, "kl_test": {"nats": f},
                       "kl_mixture": {"nats": f}, "test_accuracy": 0.95, "top1_agreement_test": 0.97}
                for name, f in (("linear_mixture", lin), ("quadratic_mixture", 0.004 + 0.001 * s),
                                ("linear_gaussian", lin), ("quadratic_gaussian", 0.005))}

    per_seed = []
    for s in range(seeds):
        curve = list(np.linspace(0.98, 0.1, 11) + 0.01 * s)
        att = {m: {"network": curve, "linear_mixture": curve, "quadratic_mixture": curve}
               for m in ("svd", "svd-raw", "random", "pca")}
        att["k"] = list(range(11))
        per_seed.append({"curves": [{"step": st, "network": {"test_accuracy": 0.98}, "approximants": approx(i, s)}
                                    for i, st in enumerate((16, 32))], "attack": att})
    data = SimpleNamespace(name="digits", X_train=np.zeros((1347, 64)), X_test=np.zeros((450, 64)), d_in=64,
                           n_classes=10)
    cfg = dict(smoke=smoke, arch="mlp", d_hidden=32, activation="relu", lr=5e-3, warmup_steps=64, steps=32,
               mc_samples=100, covariance="ledoit-wolf")
    return {**summarise(per_seed, cfg, data), "wall_seconds": 12.3456}


def _tms_seed(seed: int, mmcs: float) -> dict:
    cos = [mmcs, mmcs, mmcs, mmcs, mmcs]
    return {"seed": seed, "mmcs": mmcs, "ml2r": 0.9, "max_cos": cos, "l2_ratio": [0.9] * 5, "seconds": 3.0,
            "topk_output_mse": 1e-3, "dead_components": 0}


def _apd(seeds: int) -> dict:
    from mlpinterp.studies.apd.settings import PAPER

    per = [_tms_seed(s, 0.995 + 0.001 * s) for s in range(seeds)]
    return {"method": "apd", "setting": "tms-5-2", "quick": False, "overrides": {}, "seeds": seeds,
            "fidelity": "ours", "config": {"steps": 20_000}, "paper": PAPER["tms-5-2"], "per_seed": per,
            "threads": 1, "load_average": [20.81396484375, 1.5, 0.25], "device": "cpu",
            "failed_seeds": 0, "paper_statistic": paper_statistic(per)}


def _spd(seeds: int) -> dict:
    per = [{**_tms_seed(s, 0.9995), "ml2r": 1.0, "mmcs_alive": 0.9995, "ml2r_alive": 1.0, "distinct_matches": 5,
            "mmcs_linear2": 0.999, "alive": {"linear1": 5, "linear2": 5}, "ci_masked_mse": 1e-4,
            "stochastic_masked_mse": 2e-4} for s in range(seeds)]
    return {"method": "spd", "setting": "tms-5-2", "quick": False, "recipe": "paper", "target_fidelity": "ours",
            "overrides": {}, "seeds": seeds, "config": {"C": 20, "init": "paper-era", "tied": [["linear1", "linear2"]]},
            "per_seed": per, "device": "cpu", "threads": 1, "load_average": [0.123456, 0.5, 0.5],
            "mmcs": [m["mmcs"] for m in per], "ml2r": [m["ml2r"] for m in per], "failed_seeds": 0,
            "paper_statistic": paper_statistic(per)}


def _mfr(seeds: int) -> dict:
    from mlpinterp.studies.mfr.analysis import summarise, verdicts

    runs = [{"k": 6, "seed": s, "condition": c, "fvu": [0.1 + 0.01 * s + d, 0.1], "mmcs_truth": [0.9, 0.9],
             "mmcs_cross": 0.5, "correlation": {"r": 0.6}, "n_reinits": 0, "max_inactivity": 0.2,
             "shared_false": {"count": 0, "fraction": 0.0, "rate_in_cluster": None, "rate_outside": 0.01}}
            for s in range(seeds) for c, d in (("baseline", 0.0), ("mfr", 0.02))]
    return {"setting": "synthetic", "experiment": {"inactivity_threshold": 0.5}, "run_kind": "full", "runs": runs,
            "summary": summarise(runs, ["mmcs_truth", "fvu", "mmcs_cross", "correlation", "n_reinits"]),
            "verdicts": verdicts(runs, "mmcs_truth", "full"), "saebench_core": {}, "seconds": 5.0}


def _transformer() -> dict:
    entry = {"under_model": {"fvu": 0.01, "fvu_se": 0.001}, "heldout": {"fvu": 0.02, "fvu_se": 0.002, "cosine": 0.99}}
    layer = {"layer": 0, "path": "encoder.layer.0", "family": "mlp", "recommended": "gaussian",
             "models": {"gaussian": {"1": entry, "2": entry}, "data": {"1": entry, "2": entry}},
             "splice": {"kind": "embedding", "n_sequences": 8, "zero": {"cos": 0.5}, "mean": {"cos": 0.8},
                        "models": {"gaussian": {"2": {"cos": 0.97, "recovered_vs_zero": 0.9, "recovered_vs_mean": 0.8}}}},
             "diagnostics": {"neuron_tail_fraction": 0.01, "neuron_excess_kurtosis_median": 1.0,
                             "neuron_w1_median": 0.1, "neuron_bimodality_fraction": 0.0, "outlier_dims": [1],
                             "outlier_variance_fraction": 0.2, "pc_excess_kurtosis": [1.0, 2.0]},
             "timing_s": {"block": 1.0}, "cpu_s": {"block": 1.5}}
    return {"model": "minilm", "n_blocks": 6, "seconds": 10.0,
            "capture": {"n_fit_tokens": 1000, "n_heldout_tokens": 500, "tokens_per_s": 2000.0},
            "config": {"run": "full", "degrees": [1, 2], "input_models": ["gaussian", "data"]}, "layers": [layer]}


def _markdown(study: str, seeds: int) -> str:
    """The Markdown of ``study`` rendered from its template on a small results dict."""
    if study == "polynomial":
        from mlpinterp.studies.polynomial.report import render_markdown

        return render_markdown(_polynomial(seeds, smoke=False))
    if study == "apd":
        from mlpinterp.studies.apd.report import render_markdown

        return render_markdown(_apd(seeds))
    if study == "spd":
        from mlpinterp.studies.spd.report import render_markdown

        return render_markdown(_spd(seeds))
    if study == "mfr":
        from mlpinterp.studies.mfr.report import render_markdown

        return render_markdown(_mfr(seeds))
    from mlpinterp.studies.transformer.report import build_markdown

    figs = [(f"figures/{n}.png", n) for n in ("fvu_vs_layer", "splice", "model_vs_data", "diagnostics")]
    return build_markdown(_transformer(), figs)


# ---------------------------------------------------------------------------------------------------------- tests


# the transformer study has one run (its n counts held-out tokens); the others 1 and 3 seeds
@pytest.mark.parametrize("study, seeds", [("transformer", 1)] + [(s, n) for s in STUDIES[:1] + STUDIES[2:] for n in (1, 3)])
def test_each_study_report_renders_from_its_template_with_figures_embedded(tmp_path, study, seeds):
    md, page = _write(tmp_path, _markdown(study, seeds), f"{study} report")
    if study == "transformer":  # one run: its spread is the standard error over held-out tokens, stated as such
        assert "Statistics: one run (one seed); FVU is given ± one standard error over the n = 500" in md
        assert not ZERO_SPREAD.search(md)
    else:
        _check_stats(md, seeds, "se" if study == "mfr" else "std")
    assert "{{" not in md and "{%" not in md  # every template expression filled
    assert "<table>" in page


def test_transformer_states_its_token_standard_errors():
    md = _markdown("transformer", 1)
    assert "one standard error over the n = 500 held-out tokens (s.e.)" in md


def test_numbers_come_from_the_run_and_load_averages_are_rounded():
    md = _markdown("apd", 1)
    assert "20.81 / 1.50 / 0.25" in md and "20.81396484375" not in md
    assert "0.998 (spread < 0.0005)" in md  # the paper's cited ± 0.000, not a "± 0"
    spd = _markdown("spd", 2)
    assert "0.12 / 0.50 / 0.50" in spd and "0.9983" not in spd  # no measured APD constant in the SPD report
    assert "--apd-run" in spd


def test_polynomial_smoke_report_draws_no_verdict():
    from mlpinterp.studies.polynomial.report import render_markdown

    md = render_markdown(_polynomial(3, smoke=True))
    claims = md.split("## Claims")[1].split("## Final")[0]
    assert "**Smoke run**" in md and "reproduced" not in claims.replace("not a reproduction", "")
    assert "`--quick`" in md and "--smoke" not in md  # the option as the CLI shows it
    one = render_markdown(_polynomial(1, smoke=True))
    assert "one seed" in one and "several seeds" not in one and "3 seeds" in md


def test_templates_ship_as_package_data():
    for study in STUDIES:
        assert resources.files(f"mlpinterp.studies.{study}").joinpath("report.md.j2").is_file(), study
    cfg = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "*.md.j2" in cfg["tool"]["setuptools"]["package-data"]["*"]
    assert any(d.startswith("jinja2") for d in cfg["project"]["dependencies"])


def test_render_template_refuses_undefined_names_and_missing_templates():
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        rep.render_template("mlpinterp.studies.apd", "report.md.j2", {})
    with pytest.raises(FileNotFoundError, match="report template 'nope.md.j2' of package 'mlpinterp.studies.apd'"):
        rep.render_template("mlpinterp.studies.apd", "nope.md.j2", {})
    with pytest.raises(TypeError, match="context must be a dict"):
        rep.render_template("mlpinterp.studies.apd", "report.md.j2", [])


def test_convention_and_cited_spreads():
    assert rep.convention("std", 3) == ("Statistics: mean ± sample standard deviation (std, ddof = 1) over n = 3 "
                                        "seeds; a cell with another n says so.")
    assert "standard error of the mean (s.e.) over n = 5 tokens" in rep.convention("se", 5, over="tokens")
    one = rep.convention("std", 1)
    assert "n = 1" in one and "±" not in one
    for bad, err in ((("var", 3), ValueError), (("std", 0), ValueError), (("std", 2.0), TypeError)):
        with pytest.raises(err):
            rep.convention(*bad)
    assert rep.paper_pm(0.998, 0.0) == "0.998 (spread < 0.0005)"
    assert rep.paper_pm(0.998, 0.0004) == "0.998 (spread < 0.0005)"  # rounds to 0.000 at three decimals
    assert rep.paper_pm(1.01, 0.007) == "1.010 ± 0.007" and rep.paper_pm(0.5, None) == "0.500"
    assert rep.fmt_load_average(None) == rep.DASH and rep.fmt_load_average([1, 2.345, 3]) == "1.00 / 2.35 / 3.00"


def test_numbers_stay_whole_in_html():
    """A number in scientific notation or a "mean ± spread" is one nowrap span (no line break after "e-"), escaped
    like any text; alt texts and other text are left as they are."""
    page = rep.render_html("| a |\n|---|\n| 7.758e-08 ± 4.5e-09 and <b> 1e-5, 0.25 |\n", ".", "t")
    assert '<td><span class="nw">7.758e-08 ± 4.5e-09</span> and &lt;b&gt; <span class="nw">1e-5</span>, 0.25</td>' \
        in page
    assert ".nw { white-space: nowrap; }" in page
