"""The one figure saver (mlpinterp.utils.figures)."""

import pytest

from mlpinterp.utils.figures import pyplot, save_figure


def test_save_figure_writes_a_png_and_closes(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0], label="line")
    ax.legend()
    n_open = len(plt.get_fignums())
    save_figure(fig, tmp_path / "a.png", dpi=50)
    data = (tmp_path / "a.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(plt.get_fignums()) == n_open - 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]  # no temporary file left


def test_save_figure_onto_a_folder_raises_and_closes(tmp_path):
    plt = pyplot()
    fig, _ = plt.subplots()
    n_open = len(plt.get_fignums())
    (tmp_path / "a.png").mkdir()
    with pytest.raises(OSError):
        save_figure(fig, tmp_path / "a.png")
    assert len(plt.get_fignums()) == n_open - 1
