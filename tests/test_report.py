"""The shared report module: HTML parsed back (every figure embedded, emphasis, escaping), honest statistics,
verdicts, and (when Debian's ``chromium`` is installed) a real headless-browser screenshot of a report."""

from __future__ import annotations

import base64
import shutil
import statistics
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from mlpinterp.studies.report import (
    DASH,
    figure,
    md_cell,
    md_table,
    mean_se,
    mean_std,
    render_html,
    summary,
    verdict,
    write_report,
)


class _Collect(HTMLParser):
    """Every start tag with its attributes, and the text inside each tag name (oracle: the stdlib parser)."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: dict[str, list[str]] = {}
        self.rows: list[list[str]] = []
        self._open: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._open.append(tag)
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        while self._open and self._open.pop() != tag:
            pass

    def handle_data(self, data):
        for t in self._open:
            self.text.setdefault(t, []).append(data)
        if self._cell is not None:
            self._cell.append(data)


def _parse(page: str) -> _Collect:
    p = _Collect()
    p.feed(page)
    p.close()
    return p


def _png(path: Path, rgb: tuple[float, float, float], size=(2.0, 1.0), dpi=100) -> bytes:
    """A real PNG (matplotlib) filled with one colour; returns its bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=size, dpi=dpi)
    fig.patch.set_facecolor(rgb)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, facecolor=rgb)
    plt.close(fig)
    return path.read_bytes()


FIGS = [
    ("figures/fvu_vs_step.png", "FVU over training (paper Fig. 2)", (1.0, 0.0, 0.0)),
    ("figures/sub dir/kl.png", "KL [nats] (paper Fig. 3)", (0.0, 0.0, 1.0)),
    ("attack_grid.png", "Attacked images (Fig. 4), true / predicted", (0.0, 0.6, 0.0)),
]


def _report_text():
    table = md_table(["claim", "ours", "verdict"],
                     [["a | b", mean_std([0.1, 0.2, 0.3], ".3f"), verdict(False, "0.6 at k = 4 > 0.5")],
                      ["multi\nline", mean_std([0.5], ".3f"), verdict(True, "", run="smoke")]])
    lines = ["# Report title", "",
             "Reproduction of *Converting MLPs into Polynomials in Closed Form*, with `fit_polynomial` and **exact** fits.",
             "", "<script>alert(1)</script>", "", table, ""]
    for path, alt, _ in FIGS:
        lines += [f"### {alt}", "", figure(path, alt), ""]
    return "\n".join(lines)


@pytest.fixture
def report_dir(tmp_path):
    data = {path: _png(tmp_path / path, rgb) for path, _, rgb in FIGS}
    return tmp_path, data


def test_every_figure_is_embedded_with_its_own_bytes(report_dir):
    out, data = report_dir
    md_path, html_path = write_report(out, _report_text(), title="t <1>")
    assert md_path == out / "report.md" and html_path == out / "report.html"
    p = _parse(html_path.read_text())
    imgs = [a for t, a in p.tags if t == "img"]
    assert len(imgs) == len(FIGS)
    for (path, alt, _), img in zip(FIGS, imgs, strict=True):
        assert img["alt"] == alt
        prefix = "data:image/png;base64,"
        assert img["src"].startswith(prefix)
        assert base64.b64decode(img["src"][len(prefix):], validate=True) == data[path]
    # the Markdown keeps relative links that a Markdown viewer resolves against out/
    md = md_path.read_text()
    for path, _, _ in FIGS:
        assert path in md


def test_emphasis_code_tables_and_escaping_render(report_dir):
    out, _ = report_dir
    page = render_html(_report_text(), out, title="t <1>")
    p = _parse(page)
    assert "".join(p.text["em"]) == "Converting MLPs into Polynomials in Closed Form"
    assert "".join(p.text["code"]) == "fit_polynomial"
    assert "".join(p.text["strong"]) == "exact"
    assert "*" not in "".join(p.text["p"]) and "`" not in "".join(p.text["p"])
    assert "".join(p.text["title"]) == "t <1>"
    assert not any(t == "script" for t, _ in p.tags)  # raw HTML in the Markdown is shown as text
    header, *rows = p.rows
    assert header == ["claim", "ours", "verdict"]
    assert rows[0] == ["a | b", "0.200 ± 0.100 (n = 3)", "not reproduced: 0.6 at k = 4 > 0.5"]
    assert rows[1] == ["multi line", "0.500 (n = 1)", "smoke run: not a reproduction"]


def test_missing_or_empty_figure_raises_and_writes_nothing(tmp_path):
    text = "# r\n\n" + figure("figures/missing (1).png", "gone (paper Fig. 2)") + "\n"
    with pytest.raises(FileNotFoundError, match=r"missing \(1\)\.png"):
        write_report(tmp_path, text, "r")
    assert not (tmp_path / "report.md").exists() and not (tmp_path / "report.html").exists()
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="empty.png"):
        render_html("![x](empty.png)", tmp_path, "r")
    with pytest.raises(ValueError, match="not a local file"):
        render_html("![x](https://example.org/x.png)", tmp_path, "r")
    (tmp_path / "x.bmp").write_bytes(b"BM")
    with pytest.raises(ValueError, match="unknown image type"):
        render_html("![x](x.bmp)", tmp_path, "r")


def test_images_inside_tables_and_links_are_embedded_too(report_dir):
    out, data = report_dir
    text = md_table(["a", "b"], [[figure(FIGS[0][0], "in a table"), "[![linked](attack_grid.png)](attack_grid.png)"]])
    imgs = [a for t, a in _parse(render_html(text, out, "r")).tags if t == "img"]
    assert [base64.b64decode(i["src"].split(",", 1)[1]) for i in imgs] == [data[FIGS[0][0]], data["attack_grid.png"]]


def test_md_cell_and_table_escaping():
    assert md_cell("a|b") == "a\\|b"
    assert md_cell("a\\|b") == "a\\|b"  # already escaped: not doubled
    assert md_cell(None) == DASH and md_cell(float("nan")) == DASH
    with pytest.raises(ValueError, match="row 0 has 1 cells, expected 2"):
        md_table(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match="align"):
        md_table(["a"], [], align=["x"])


def test_summary_matches_statistics_module():
    rng = np.random.default_rng(0)
    x = list(rng.normal(size=5))
    s = summary(x + [None, float("nan")])
    assert s.n == 5
    assert s.mean == pytest.approx(statistics.fmean(x), rel=1e-14)
    assert s.std == pytest.approx(statistics.stdev(x), rel=1e-14)
    assert s.se == pytest.approx(statistics.stdev(x) / np.sqrt(5), rel=1e-14)
    assert mean_std([0.998, 0.997, 0.999], ".3f") == "0.998 ± 0.001 (n = 3)"
    assert mean_se([1.0, 3.0], ".2f") == "2.00 ± 1.00 (s.e., n = 2)"
    assert mean_std([0.9981], ".3f") == "0.998 (n = 1)"  # one value: no spread, never "± 0"
    assert mean_std([], ".3f") == DASH and mean_std([None, float("nan")]) == DASH
    assert mean_std([0.5, 0.7], ".1f", scale=100, unit="%") == "60.0% ± 14.1% (n = 2)"
    assert summary([0.5]).to_dict() == {"mean": 0.5, "std": None, "se": None, "n": 1}
    # n stated in a table header: the suffix is dropped only when the count matches it
    assert summary([1.0, 3.0]).format(".1f", n=2) == "2.0 ± 1.4"
    assert summary([1.0, None]).format(".1f", n=2) == "1.0 (n = 1)"
    assert summary([1.0]).format(".1f", n=1) == "1.0"
    with pytest.raises(TypeError, match="values"):
        summary("abc")
    with pytest.raises(TypeError, match="numbers or None"):
        summary([1.0, "x"])


def test_verdicts_refuse_smoke_runs_and_need_reasons():
    assert str(verdict(True, "96% > 95%")) == "reproduced: 96% > 95%"
    v = verdict(False, "accuracy 14.6% at k = 10, chance 10%", run="smoke")
    assert v.status == "smoke run: not a reproduction" and not v.is_verdict
    assert verdict(True, "", run="quick").status == "quick run: not a reproduction"
    assert verdict(np.bool_(False), "FVU 0.2 > baseline 0.1", failed="worse than baseline").status == "worse than baseline"
    assert verdict(None, "training stopped at step 512 < 4096").status == "not measured"
    with pytest.raises(ValueError, match="reason"):
        verdict(False, "")
    with pytest.raises(ValueError, match="one line"):
        verdict(False, "a\nb")
    with pytest.raises(ValueError, match="run"):
        verdict(True, "", run="paper")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian package 'chromium' not installed")
def test_headless_chromium_displays_every_embedded_figure(tmp_path):
    """A real browser renders the report file alone (figures moved away): each figure's colour is on screen."""
    out = tmp_path / "out"
    sizes = {}
    for path, _, rgb in FIGS:
        _png(out / path, rgb, size=(2.0, 1.0), dpi=100)  # 200 x 100 px
        sizes[rgb] = 200 * 100
    _, html_path = write_report(out, _report_text(), title="browser check")
    alone = tmp_path / "alone.html"  # no figure files next to it: only embedded data can show them
    alone.write_bytes(html_path.read_bytes())
    shot = tmp_path / "shot.png"
    profile = tempfile.mkdtemp(dir=tmp_path)
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--no-first-run", "--disable-sync", "--disable-component-update", f"--user-data-dir={profile}",
                    "--hide-scrollbars", "--force-device-scale-factor=1", f"--screenshot={shot}",
                    "--window-size=1200,2000", alone.as_uri()],
                   check=True, timeout=120, capture_output=True)
    import matplotlib.image as mpimg

    img = (mpimg.imread(shot)[..., :3] * 255).round().astype(int)
    for rgb, n_px in sizes.items():
        want = np.round(np.array(rgb) * 255).astype(int)
        hits = int((np.abs(img - want).sum(-1) <= 6).sum())
        assert hits >= 0.9 * n_px, f"colour {rgb}: {hits} of {n_px} pixels on screen"
