"""EEG pipeline: EDF/EDF+ files written here from synthetic signals, read back by MNE, resampled, band-passed
(0.5-45 Hz, order 5, zero phase) and vectorised; bad files are clear errors; ``reproduce mfr --setting eeg`` runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("mne")

from mlpinterp.cli.main import app  # noqa: E402
from mlpinterp.data.edf import read_edf_header, write_edf  # noqa: E402
from mlpinterp.data.eeg import (  # noqa: E402
    EegConfig,
    bandpass,
    load_eeg,
    preprocess,
    read_edf,
    resample,
    vectorise,
)
from mlpinterp.data.eeg_synthetic import write_synthetic_recordings  # noqa: E402
from tests import cli_utils  # noqa: E402

runner = CliRunner()
FS = 256


def _amplitude(y: np.ndarray, f: float, fs: float) -> float:
    """Amplitude of the ``f`` Hz component of ``y`` over its middle half (edges excluded), by projection."""
    n = y.shape[-1]
    mid = slice(n // 4, 3 * n // 4)
    t = np.arange(n)[mid] / fs
    return float(2 * np.abs(np.mean(y[mid] * np.exp(-2j * np.pi * f * t))))


@pytest.fixture()
def test_signals(tmp_path):
    t = np.arange(FS * 60) / FS
    x = np.stack([50 * np.sin(2 * np.pi * 10 * t),  # passes
                  20 * np.sin(2 * np.pi * 60 * t + 0.3),  # mains: removed
                  100 * np.sin(2 * np.pi * 0.1 * t) + 30 * np.sin(2 * np.pi * 10 * t + 1.0)])  # drift + alpha
    return x, ["EEG A-REF", "EEG B-REF", "EEG C-REF"]


@pytest.mark.parametrize("edf_plus", [False, True])
def test_filter_passes_10hz_removes_mains_and_drift(tmp_path, test_signals, edf_plus):
    x, labels = test_signals
    path = write_edf(tmp_path / "rec.edf", x, FS, labels, edf_plus=edf_plus)
    rec = read_edf(path)
    assert rec.labels == tuple(labels) and rec.sfreq == FS
    step = (x.max(1) - x.min(1)) / 65535  # one digital step per channel (uV)
    assert np.all(np.abs(rec.data - x).max(1) <= step * 0.5 + 1e-3)  # MNE reads back what was written
    y = preprocess(rec, EegConfig())
    fs = EegConfig().sfreq
    assert y.shape == (3, 60 * 128)
    assert _amplitude(y[0], 10, fs) == pytest.approx(50, rel=0.01)
    assert 20 * np.log10(_amplitude(y[1], 60, fs) / 20) <= -40
    assert _amplitude(y[2], 10, fs) == pytest.approx(30, rel=0.01)
    assert 20 * np.log10(_amplitude(y[2], 0.1, fs) / 100) <= -40
    resid = y[2] - 30 * np.sin(2 * np.pi * 10 * np.arange(y.shape[1]) / fs + 1.0)
    mid = slice(y.shape[1] // 4, 3 * y.shape[1] // 4)
    assert np.sqrt(np.mean(resid[mid] ** 2)) < 0.01 * 100  # drift gone: < 1 % of its amplitude remains


def test_bandpass_gain_matches_the_designed_response():
    """Gains of the zero-phase filter at 10 and 60 Hz equal |H(f)|^2 of the Butterworth design (sosfreqz), at the
    common 128 Hz and at a native 256 Hz, where order 5 attenuates 60 Hz by only about 34 dB: why the pipeline
    resamples before it filters."""
    from scipy.signal import butter, sosfreqz

    for fs, f in ((128.0, 10.0), (256.0, 10.0), (256.0, 60.0)):
        t = np.arange(int(fs * 120)) / fs
        y = bandpass(np.sin(2 * np.pi * f * t), fs)
        _, h = sosfreqz(butter(5, [0.5, 45], btype="bandpass", fs=fs, output="sos"), worN=[f], fs=fs)
        assert _amplitude(y, f, fs) == pytest.approx(abs(h[0]) ** 2, rel=1e-3, abs=1e-7)
    t = np.arange(256 * 120) / 256
    assert -36 < 20 * np.log10(_amplitude(bandpass(np.sin(2 * np.pi * 60 * t), 256), 60, 256)) < -32


def test_resample_keeps_a_10hz_amplitude_from_250hz():
    t = np.arange(250 * 30) / 250
    y = resample(np.sin(2 * np.pi * 10 * t)[None], 250, 128)
    assert y.shape == (1, 128 * 30)
    assert _amplitude(y[0], 10, 128) == pytest.approx(1.0, rel=1e-3)


def test_vectorise_windows_channel_major_by_hand():
    x = np.arange(14.0).reshape(2, 7)
    np.testing.assert_array_equal(vectorise(x, 3), [[0, 1, 2, 7, 8, 9], [3, 4, 5, 10, 11, 12]])
    np.testing.assert_array_equal(vectorise(x, 1), x[:, :7].T)


def test_truncated_non_edf_bdf_and_discontinuous_files_are_clear_errors(tmp_path, test_signals):
    x, labels = test_signals
    good = write_edf(tmp_path / "good.edf", x, FS, labels)
    raw = good.read_bytes()
    cut = tmp_path / "cut.edf"
    cut.write_bytes(raw[:-1000])
    with pytest.raises(ValueError, match=r"cut.edf' is truncated: it has \d+ bytes, its header announces"):
        read_edf(cut)
    (tmp_path / "head.edf").write_bytes(raw[:300])
    with pytest.raises(ValueError, match="is truncated"):
        read_edf_header(tmp_path / "head.edf")
    (tmp_path / "notes.edf").write_text("these are my notes, not a recording\n" * 20)
    with pytest.raises(ValueError, match="is not an EDF/EDF\\+ file"):
        read_edf(tmp_path / "notes.edf")
    (tmp_path / "empty.edf").write_bytes(b"")
    with pytest.raises(ValueError, match="has 0 bytes, an EDF header alone has 256"):
        read_edf(tmp_path / "empty.edf")
    (tmp_path / "x.bdf.edf").write_bytes(b"\xffBIOSEMI" + raw[8:])
    with pytest.raises(ValueError, match="BDF"):
        read_edf(tmp_path / "x.bdf.edf")
    (tmp_path / "d.edf").write_bytes(raw[:192] + b"EDF+D".ljust(44) + raw[236:])
    with pytest.raises(ValueError, match="EDF\\+D \\(discontinuous\\)"):
        read_edf(tmp_path / "d.edf")
    (tmp_path / "n.edf").write_bytes(raw[:236] + b"many    " + raw[244:])
    with pytest.raises(ValueError, match="'number of data records' = 'many' is not a number"):
        read_edf(tmp_path / "n.edf")
    with pytest.raises(ValueError, match=r"has no channel\(s\) \['EEG Z-REF'\]; it has \['EEG A-REF'"):
        read_edf(good, ["EEG Z-REF"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_edf(tmp_path / "missing.edf")


def test_load_eeg_splits_by_recording_and_selects_common_channels(tmp_path):
    files = write_synthetic_recordings(tmp_path / "d", 3, seconds=8, n_channels=4)
    cfg = EegConfig(window=16, held_out_every=3)
    data = load_eeg(tmp_path / "d", cfg)
    assert data["channels"] == ["EEG FP1-REF", "EEG FP2-REF", "EEG F3-REF", "EEG F4-REF"]
    assert data["held_out_files"] == [str(files[2])]
    per_rec = 8 * 128 // 16
    assert data["train"].shape == (2 * per_rec, 4 * 16) and data["held_out"].shape == (per_rec, 64)
    # the vectors are the preprocessed recordings, windowed
    want = vectorise(preprocess(read_edf(files[2]), cfg), 16)
    np.testing.assert_allclose(data["held_out"], want, rtol=1e-6, atol=1e-4)
    one = load_eeg(tmp_path / "d", EegConfig(window=16, channels=("EEG F3-REF",)))  # 3 files < 10: last held out
    assert one["channels"] == ["EEG F3-REF"] and one["held_out"].shape == (per_rec, 16)
    single = tmp_path / "single"
    single.mkdir()
    (single / "a.edf").write_bytes(files[0].read_bytes())
    s = load_eeg(single, cfg)  # one recording: its last third in time is held out
    assert s["held_out"].shape[0] == per_rec // 3 and s["train"].shape[0] == per_rec - per_rec // 3
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .edf file"):
        load_eeg(tmp_path / "empty", cfg)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_eeg(tmp_path / "nope", cfg)


@pytest.mark.parametrize(("kw", "match"), [
    ({"high_hz": 64.0}, "high_hz must be below the Nyquist frequency"),
    ({"low_hz": 50.0}, "high_hz must be finite"),
    ({"window": 0}, "window must be >= 1"),
    ({"filter_order": 0}, "filter_order must be >= 1"),
])
def test_bad_eeg_config(kw, match):
    with pytest.raises(ValueError, match=match):
        EegConfig(**kw)


def test_reproduce_mfr_eeg_end_to_end(tmp_path):
    write_synthetic_recordings(tmp_path / "d", 3, seconds=20, n_channels=4)
    res = runner.invoke(app, ["reproduce", "mfr", "--setting", "eeg", "--data", str(tmp_path / "d"), "--quick",
                              "--k", "4", "--seeds", "1", "--steps", "3", "--no-extra-alpha", "--window", "8",
                              "--quiet", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["setting"] == "eeg" and m["run_kind"] == "quick" and m["data"]["d_in"] == 32
    assert m["data"]["train_vectors"] == 2 * 20 * 128 // 8 and m["throughput"]["pipeline_vectors_per_second"] > 0
    assert {r["condition"] for r in m["runs"]} == {"baseline", "mfr"}
    assert all(0 <= v <= 1.5 for r in m["runs"] for v in r["fvu"])
    report = (tmp_path / "o" / "report.md").read_text()
    assert "TUH EEG" in report and "6.67" in report and "vectors/s" in report
    assert "quick run: not a reproduction" in report and "better than baseline" not in report
    assert (tmp_path / "o" / "eeg_summary.png").exists()


@pytest.mark.parametrize(("setup", "args", "match"), [
    (None, [], "Error: --setting eeg needs --data DIR"),
    ("truncated", ["--data", "{d}"], "is truncated"),
    ("empty", ["--data", "{d}"], "holds no .edf file"),
])
def test_reproduce_mfr_eeg_expected_failures(tmp_path, setup, args, match):
    d = tmp_path / "d"
    if setup is not None:
        d.mkdir()
    if setup == "truncated":
        write_synthetic_recordings(d, 1, seconds=4, n_channels=2)
        p = d / "rec_000.edf"
        p.write_bytes(p.read_bytes()[:-10])
    res = runner.invoke(app, ["reproduce", "mfr", "--setting", "eeg", "--quick", "--k", "4", "--quiet",
                              "--out", str(tmp_path / "o"), *[a.format(d=d) for a in args]])
    assert res.exit_code == 1 and match in cli_utils.flat(res.output) and "Traceback" not in res.output
