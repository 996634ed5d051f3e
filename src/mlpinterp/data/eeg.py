"""EEG recordings (EDF / EDF+) -> band-passed, resampled, vectorised SAE inputs (MFR paper, sec. 4.3: TUH EEG).

Pipeline of :func:`load_eeg` for every ``*.edf`` under a directory (recursively, sorted; the TUH EEG corpus is a
tree of ``.edf`` files):

1. :func:`read_edf`: header checked by :func:`mlpinterp.data.edf.read_edf_header` (not EDF, BDF, EDF+D or
   truncated: a clear error), samples read by MNE-Python (``mne.io.read_raw_edf``), the selected channels in
   microvolts. ``channels=None`` selects the channels every recording has, in the first recording's order.
2. :func:`resample`: polyphase resampling (``scipy.signal.resample_poly``, its Kaiser-windowed anti-aliasing FIR)
   to the common rate ``sfreq`` (default 128 Hz).
3. :func:`bandpass`: the paper's zero-phase Butterworth band-pass, 0.5-45 Hz of order 5, applied forward and
   backward (``scipy.signal.sosfiltfilt``: zero phase, squared magnitude response).

   The band-pass runs *after* resampling, at the common rate, so every recording gets the same digital filter
   whatever its native rate (TUH mixes 250, 256, 400 and 512 Hz). It also matters for the mains: at 128 Hz the
   filter attenuates 60 Hz by 142 dB, at a native 256 Hz the same order-5 design gives only 34 dB (28 dB at
   512 Hz; ``scipy.signal.sosfreqz``).
4. :func:`vectorise`: non-overlapping windows of ``window`` samples of all ``C`` channels, flattened channel-major
   into vectors of ``d_in = C * window`` (entry ``c * window + w`` is channel ``c`` at sample ``w`` of the window);
   ``window = 1`` gives one ``C``-dim channel vector per time step. Default 32 samples = 0.25 s at 128 Hz.

Held-out data: with two or more recordings, every ``held_out_every``-th recording (sorted paths; whole recordings,
so no patient segment is in both); with one recording, its last ``1 / held_out_every`` in time.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from mlpinterp.data.edf import ANNOTATIONS, read_edf_header
from mlpinterp.utils.validation import Int, check_fields, check_int, check_real


@dataclass(frozen=True)
class EegConfig:
    """Preprocessing and vectorisation of EEG recordings (defaults: the MFR paper's filter)."""

    channels: tuple[str, ...] | None = None
    """Channel labels to keep, as in the EDF header (e.g. TUH's 'EEG FP1-REF'); None: those common to all files."""
    sfreq: float = 128.0
    """Common sampling rate (Hz) every recording is resampled to before filtering."""
    low_hz: float = 0.5
    """Lower edge of the band-pass (Hz)."""
    high_hz: float = 45.0
    """Upper edge of the band-pass (Hz); must be below sfreq / 2."""
    filter_order: int = 5
    """Butterworth order of the band-pass design (applied forward and backward)."""
    window: int = 32
    """Samples per vector at sfreq (1: one channel vector per time step)."""
    held_out_every: int = 10
    """Every this-many-th recording is held out (one recording: its last 1/held_out_every in time)."""

    def __post_init__(self) -> None:
        check_real(self.sfreq, "sfreq", lo=0, lo_open=True)
        check_real(self.low_hz, "low_hz", lo=0, lo_open=True)
        check_real(self.high_hz, "high_hz", lo=self.low_hz, lo_open=True)
        if self.high_hz >= self.sfreq / 2:
            raise ValueError(f"high_hz must be below the Nyquist frequency sfreq / 2 = {self.sfreq / 2:g} Hz, "
                             f"got {self.high_hz:g}")
        check_fields(self, {("filter_order", "window"): Int(1), "held_out_every": Int(2)})
        if self.channels is not None and (isinstance(self.channels, str) or not self.channels
                                          or not all(isinstance(c, str) for c in self.channels)):
            raise TypeError(f"channels must be None or a non-empty tuple of channel labels, got {self.channels!r}")

    def to_dict(self) -> dict:
        """JSON-serialisable dict of all fields."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Recording:
    """One EEG recording: ``data [n_channels, n_samples]`` in microvolts at ``sfreq`` Hz, channel ``labels``."""

    data: np.ndarray
    """Samples, microvolts, ``[n_channels, n_samples]`` float64."""
    sfreq: float
    """Sampling rate (Hz)."""
    labels: tuple[str, ...]
    """Channel labels in row order."""
    path: str
    """Source file."""


def _mne():
    try:
        import mne
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("reading EDF needs MNE-Python: pip install 'mlpinterp[eeg]'") from e
    return mne


def edf_channels(path: str | os.PathLike) -> list[str]:
    """Measurement channel labels of an EDF / EDF+ file (its annotation signal left out), from its checked header."""
    return [lab for lab in read_edf_header(path)["labels"] if lab != ANNOTATIONS]


def read_edf(path: str | os.PathLike, channels: tuple[str, ...] | list[str] | None = None) -> Recording:
    """Read an EDF / EDF+C file: the ``channels`` (default: all measurement channels) in microvolts.

    Channels of different sampling rates in one file are brought to the highest by MNE. Raises
    ``FileNotFoundError`` / ``ValueError`` from :func:`mlpinterp.data.edf.read_edf_header` (not EDF, BDF, EDF+D,
    truncated) and ``ValueError`` naming the missing channel(s) and the file's channels.
    """
    header = read_edf_header(path)
    have = [lab for lab in header["labels"] if lab != ANNOTATIONS]
    want = list(have if channels is None else channels)
    missing = [c for c in want if c not in have]
    if missing:
        raise ValueError(f"EDF file {str(path)!r} has no channel(s) {missing}; it has {have}")
    raw = _mne().io.read_raw_edf(path, preload=True, verbose="error")
    data = raw.get_data(picks=want) * 1e6  # volts -> microvolts
    return Recording(data=data, sfreq=float(raw.info["sfreq"]), labels=tuple(want), path=str(path))


def resample(x: np.ndarray, sfreq_in: float, sfreq_out: float) -> np.ndarray:
    """``x [..., n]`` at ``sfreq_in`` resampled to ``sfreq_out`` along the last axis (``resample_poly``, up/down
    ratio within 1e-6 of the requested one). Raises ``ValueError`` for non-positive rates."""
    from scipy.signal import resample_poly

    check_real(sfreq_in, "sfreq_in", lo=0, lo_open=True)
    check_real(sfreq_out, "sfreq_out", lo=0, lo_open=True)
    ratio = Fraction(sfreq_out / sfreq_in).limit_denominator(10_000)
    if abs(float(ratio) - sfreq_out / sfreq_in) > 1e-6 * sfreq_out / sfreq_in:
        raise ValueError(f"cannot resample {sfreq_in:g} Hz to {sfreq_out:g} Hz with a rational ratio of small terms")
    if ratio == 1:
        return np.asarray(x, dtype=np.float64)
    return resample_poly(np.asarray(x, dtype=np.float64), ratio.numerator, ratio.denominator, axis=-1)


def bandpass(x: np.ndarray, sfreq: float, low_hz: float = 0.5, high_hz: float = 45.0, order: int = 5) -> np.ndarray:
    """Zero-phase Butterworth band-pass of ``x [..., n]`` along the last axis (``scipy.signal.butter(order,
    [low_hz, high_hz], 'bandpass', output='sos')`` applied by ``sosfiltfilt``: magnitude response ``|H(f)|^2``).

    Raises ``ValueError`` unless ``0 < low_hz < high_hz < sfreq / 2``, or when ``x`` is too short for the filter's
    edge padding (``sosfiltfilt`` needs more than ``3 * (2 * len(sos) + 1)`` samples).
    """
    from scipy.signal import butter, sosfiltfilt

    check_real(sfreq, "sfreq", lo=0, lo_open=True)
    if not 0 < low_hz < high_hz < sfreq / 2:
        raise ValueError(f"band-pass edges must satisfy 0 < low_hz < high_hz < sfreq / 2 = {sfreq / 2:g}, got "
                         f"{low_hz:g}, {high_hz:g}")
    sos = butter(check_int(order, "order"), [low_hz, high_hz], btype="bandpass", fs=sfreq, output="sos")
    pad = 3 * (2 * len(sos) + 1)
    if np.shape(x)[-1] <= pad:
        raise ValueError(f"the signal has {np.shape(x)[-1]} samples; the zero-phase filter needs more than {pad}")
    return sosfiltfilt(sos, np.asarray(x, dtype=np.float64), axis=-1)


def preprocess(rec: Recording, cfg: EegConfig) -> np.ndarray:
    """``rec`` resampled to ``cfg.sfreq`` and band-passed there: ``[n_channels, n_samples at cfg.sfreq]`` (uV)."""
    return bandpass(resample(rec.data, rec.sfreq, cfg.sfreq), cfg.sfreq, cfg.low_hz, cfg.high_hz, cfg.filter_order)


def vectorise(x: np.ndarray, window: int) -> np.ndarray:
    """``x [C, T]`` -> ``[T // window, C * window]``: non-overlapping windows, flattened channel-major (entry
    ``c * window + w`` = channel ``c``, sample ``w``); trailing samples that do not fill a window are dropped."""
    window = check_int(window, "window")
    c, t = x.shape
    n = t // window
    return x[:, :n * window].reshape(c, n, window).transpose(1, 0, 2).reshape(n, c * window)


def edf_files(directory: str | os.PathLike) -> list[Path]:
    """Every ``*.edf`` / ``*.EDF`` under ``directory`` (recursively), sorted. Raises ``FileNotFoundError`` if it is
    not a directory and ``ValueError`` if it holds no EDF file."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"EEG data directory {str(d)!r} is not a directory")
    files = sorted(p for p in d.rglob("*") if p.suffix.lower() == ".edf" and p.is_file())
    if not files:
        raise ValueError(f"EEG data directory {str(d)!r} holds no .edf file")
    return files


def load_eeg(directory: str | os.PathLike, cfg: EegConfig = EegConfig()) -> dict:
    """Read, preprocess and vectorise every EDF recording under ``directory``.

    Returns ``{"train": float32 [N, d_in], "held_out": float32 [M, d_in], "channels": [...], "files": [...],
    "held_out_files": [...], "seconds": {"read", "preprocess"}, "samples": total samples at cfg.sfreq}``.
    Raises the errors of :func:`edf_files` and :func:`read_edf`, and ``ValueError`` when no channel is common to
    all recordings or a recording is shorter than one window.
    """
    import time

    files = edf_files(directory)
    channels = cfg.channels
    if channels is None:
        per_file = [edf_channels(f) for f in files]
        common = set.intersection(*(set(c) for c in per_file))
        channels = tuple(c for c in per_file[0] if c in common)
        if not channels:
            raise ValueError(f"the {len(files)} recordings under {str(directory)!r} share no channel label; pass "
                             "channels explicitly")
    held_idx = set(range(cfg.held_out_every - 1, len(files), cfg.held_out_every)) if len(files) > 1 else set()
    if len(files) > 1 and not held_idx:
        held_idx = {len(files) - 1}
    _mne()  # imported before the clock starts
    train, held, t_read, t_pre, samples = [], [], 0.0, 0.0, 0
    for i, f in enumerate(files):
        t0 = time.perf_counter()
        rec = read_edf(f, channels)
        t1 = time.perf_counter()
        x = preprocess(rec, cfg)
        v = vectorise(x, cfg.window)
        t_read, t_pre = t_read + t1 - t0, t_pre + time.perf_counter() - t1
        samples += x.shape[1]
        if v.shape[0] == 0:
            raise ValueError(f"recording {str(f)!r} is shorter than one window of {cfg.window} samples at "
                             f"{cfg.sfreq:g} Hz")
        if len(files) == 1:
            cut = v.shape[0] - max(v.shape[0] // cfg.held_out_every, 1)
            train.append(v[:cut])
            held.append(v[cut:])
        else:
            (held if i in held_idx else train).append(v)
    return {"train": np.concatenate(train).astype(np.float32), "held_out": np.concatenate(held).astype(np.float32),
            "channels": list(channels), "files": [str(f) for f in files],
            "held_out_files": [str(files[i]) for i in sorted(held_idx)], "samples": samples,
            "seconds": {"read": t_read, "preprocess": t_pre}}
