"""Synthetic EEG recordings written as EDF, for pipeline checks when no real EEG (e.g. TUH) is at hand.

Each recording mixes ``n_sources`` sparse oscillatory sources into ``n_channels`` scalp channels: source ``s`` has a
fixed frequency (theta 4-8 Hz, alpha 8-13 Hz, beta 13-30 Hz) and is active in random bursts of 0.5-2 s;
channels = ``A @ sources`` with one random mixing matrix ``A [n_channels, n_sources]`` shared by all recordings
(a fixed montage), plus white noise, 60 Hz mains interference and a slow 0.1 Hz drift (both outside the 0.5-45 Hz
band the pipeline keeps). Amplitudes in microvolts. Deterministic given ``seed``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mlpinterp.data.edf import write_edf
from mlpinterp.utils.seeding import numpy_rng
from mlpinterp.utils.validation import check_int

TUH_LABELS = ("FP1", "FP2", "F3", "F4", "C3", "C4", "P3", "P4", "O1", "O2", "F7", "F8", "T3", "T4", "T5", "T6",
              "FZ", "CZ", "PZ")
"""The 19 channels of the 10-20 montage, named as in TUH EEG (``EEG FP1-REF``, ...)."""


def synthetic_eeg(n_channels: int = 19, seconds: int = 60, sfreq: int = 256, n_sources: int = 12,
                  seed: int = 0, recording: int = 0) -> np.ndarray:
    """One synthetic recording ``[n_channels, seconds * sfreq]`` in microvolts (see the module docstring)."""
    check_int(n_channels, "n_channels")
    check_int(n_sources, "n_sources")
    mix = numpy_rng(seed, 0).normal(0, 1, (n_channels, n_sources)) * 10  # fixed montage, uV
    rng = numpy_rng(seed, 1, recording)
    freqs = numpy_rng(seed, 2).uniform(4, 30, n_sources)
    n = int(seconds * sfreq)
    t = np.arange(n) / sfreq
    sources = np.zeros((n_sources, n))
    for s in range(n_sources):
        start = 0
        while start < n:
            start += int(rng.exponential(3.0) * sfreq)
            if start >= n:
                break
            length = int(rng.uniform(0.5, 2.0) * sfreq)
            seg = slice(start, min(start + length, n))
            sources[s, seg] = np.hanning(length)[: seg.stop - seg.start] * np.sin(2 * np.pi * freqs[s] * t[seg]
                                                                                  + rng.uniform(0, 2 * np.pi))
            start += length
    x = mix @ sources + rng.normal(0, 2.0, (n_channels, n))
    x += 15 * np.sin(2 * np.pi * 60 * t + rng.uniform(0, 2 * np.pi))  # mains
    x += 80 * np.sin(2 * np.pi * 0.1 * t + rng.uniform(0, 2 * np.pi))  # drift
    return x


def write_synthetic_recordings(directory: str | os.PathLike, n_recordings: int = 4, *, seconds: int = 60,
                               sfreq: int = 256, n_channels: int = 19, seed: int = 0,
                               edf_plus: bool = True) -> list[Path]:
    """Write ``n_recordings`` synthetic recordings as ``directory/rec_{i:03d}.edf`` (EDF+C by default) with TUH-style
    labels (``EEG FP1-REF``, ...); returns the paths."""
    check_int(n_recordings, "n_recordings")
    if n_channels > len(TUH_LABELS):
        labels = [f"EEG CH{i:02d}-REF" for i in range(n_channels)]
    else:
        labels = [f"EEG {name}-REF" for name in TUH_LABELS[:n_channels]]
    d = Path(directory)
    return [write_edf(d / f"rec_{i:03d}.edf", synthetic_eeg(n_channels, seconds, sfreq, seed=seed, recording=i),
                      sfreq, labels, edf_plus=edf_plus) for i in range(n_recordings)]
