"""The EDF / EDF+ file format (Kemp et al. 1992; EDF+: Kemp & Olivan 2003, edfplus.info): header check and writer.

:func:`read_edf_header` parses and checks the fixed 256-byte header and the per-signal headers before any sample
is read, so a file that is not EDF, a BDF file, an EDF+D (discontinuous) file or a truncated file is a clear
``ValueError`` naming the file and the field (readers tend to fail on those with an ``IndexError`` deep inside,
or to read a truncated file silently short). :func:`write_edf` writes 16-bit EDF (or EDF+C, with the mandatory
``EDF Annotations`` time-keeping signal) from physical signals, for tests and synthetic recordings.

Layout: header ``256 * (ns + 1)`` ASCII bytes; then ``n_records`` data records, each holding, signal after
signal, ``samples_per_record[i]`` little-endian int16 samples. Physical value
``p = pmin + (d - dmin) (pmax - pmin) / (dmax - dmin)``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mlpinterp.utils.io import atomic_write_bytes

ANNOTATIONS = "EDF Annotations"
"""Label of the EDF+ annotation signal (not a measurement: readers skip it)."""

_SIGNAL_FIELDS = (("label", 16), ("transducer", 80), ("physical_dimension", 8), ("physical_min", 8),
                  ("physical_max", 8), ("digital_min", 8), ("digital_max", 8), ("prefiltering", 80),
                  ("samples_per_record", 8), ("reserved", 32))


def _number(raw: bytes, field: str, where: str, cast=float):
    text = raw.decode("ascii", errors="replace").strip()
    try:
        return cast(text) if cast is float else int(float(text)) if "." in text else int(text)
    except ValueError:
        raise ValueError(f"{where}: malformed EDF header, field {field!r} = {text!r} is not a number") from None


def read_edf_header(path: str | os.PathLike) -> dict:
    """The checked header of an EDF / EDF+C file: ``labels``, ``samples_per_record``, ``record_seconds``,
    ``n_records``, ``physical_dimension`` (per signal), ``edf_plus`` (bool), ``header_bytes``.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file for: fewer than 256 bytes,
    a version field other than EDF's ``0`` (BDF files are named as such), a malformed number, a header-size field
    that disagrees with the number of signals, an EDF+D (discontinuous) recording, or fewer data bytes than the
    header announces (truncated file; the message gives both sizes).
    """
    path = Path(path)
    where = f"EDF file {str(path)!r}"
    if not path.is_file():
        raise FileNotFoundError(f"{where} does not exist")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(256)
        if len(head) < 256:
            raise ValueError(f"{where} is not an EDF file: it has {size} bytes, an EDF header alone has 256")
        if head[:8].strip() != b"0":
            kind = "a BDF (24-bit BioSemi) file, not EDF" if head[:8] == b"\xffBIOSEMI" else \
                f"not an EDF/EDF+ file (version field {head[:8]!r}, expected b'0       ')"
            raise ValueError(f"{where} is {kind}")
        header_bytes = _number(head[184:192], "header bytes", where, int)
        reserved = head[192:236].decode("ascii", errors="replace").strip()
        n_records = _number(head[236:244], "number of data records", where, int)
        record_seconds = _number(head[244:252], "duration of a data record", where)
        ns = _number(head[252:256], "number of signals", where, int)
        if ns < 1 or header_bytes != 256 * (ns + 1):
            raise ValueError(f"{where}: malformed EDF header, {ns} signal(s) need a {256 * (ns + 1)}-byte header, "
                             f"the header-bytes field says {header_bytes}")
        if reserved.startswith("EDF+D"):
            raise ValueError(f"{where} is an EDF+D (discontinuous) recording; only continuous EDF / EDF+C is read "
                             "(convert it, e.g. with EDFbrowser, to EDF+C)")
        rest = f.read(256 * ns)
    if len(rest) < 256 * ns:
        raise ValueError(f"{where} is truncated: it has {size} bytes, its header alone announces {header_bytes}")
    fields, offset = {}, 0
    for name, width in _SIGNAL_FIELDS:
        fields[name] = [rest[offset + i * width: offset + (i + 1) * width] for i in range(ns)]
        offset += width * ns
    spr = [_number(b, "samples per record", where, int) for b in fields["samples_per_record"]]
    record_bytes = 2 * sum(spr)
    data_bytes = size - header_bytes
    if record_bytes <= 0:
        raise ValueError(f"{where}: malformed EDF header, the signals hold no samples per record")
    if n_records < 0:  # -1: unknown (still recording); the whole records present are the recording
        n_records = data_bytes // record_bytes
    if n_records < 1 or data_bytes < n_records * record_bytes:
        raise ValueError(f"{where} is truncated: it has {size} bytes, its header announces {header_bytes} + "
                         f"{n_records} records x {record_bytes} bytes = {header_bytes + n_records * record_bytes}")
    if not record_seconds > 0:
        raise ValueError(f"{where}: malformed EDF header, data-record duration {record_seconds} s is not positive")
    return {"labels": [b.decode("ascii", errors="replace").strip() for b in fields["label"]],
            "physical_dimension": [b.decode("ascii", errors="replace").strip()
                                   for b in fields["physical_dimension"]],
            "samples_per_record": spr, "record_seconds": record_seconds, "n_records": n_records,
            "edf_plus": reserved.startswith("EDF+"), "header_bytes": header_bytes}


def _field(value, width: int) -> bytes:
    text = value if isinstance(value, str) else _fit_number(value, width)
    raw = text.encode("ascii")
    if len(raw) > width:
        raise ValueError(f"EDF header field {text!r} exceeds its {width} characters")
    return raw.ljust(width)


def _fit_number(v: float, width: int) -> str:
    """``v`` in at most ``width`` characters (EDF header numbers are ASCII)."""
    if float(v).is_integer() and len(str(int(v))) <= width:
        return str(int(v))
    for digits in range(width, 0, -1):
        text = f"{v:.{digits}g}"
        if len(text) <= width:
            return text
    raise ValueError(f"{v} cannot be written in {width} characters")


def write_edf(path: str | os.PathLike, signals: np.ndarray, sfreq: float, labels: list[str], *,
              unit: str = "uV", edf_plus: bool = False, record_seconds: float = 1.0) -> Path:
    """Write ``signals [n_channels, n_samples]`` (physical values in ``unit``) sampled at ``sfreq`` Hz as 16-bit EDF
    (EDF+C with an ``EDF Annotations`` time-keeping signal when ``edf_plus``), atomically.

    Each channel's physical range is its own min / max (widened to be non-empty); quantisation error is at most
    half a digital step, ``(pmax - pmin) / 65535 / 2``. ``n_samples`` must be a whole number of records of
    ``record_seconds`` (``sfreq * record_seconds`` samples each). Raises ``ValueError`` otherwise, for a non-finite
    signal or a label count that does not match.
    """
    x = np.asarray(signals, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or not np.isfinite(x).all():
        raise ValueError(f"signals must be a finite [n_channels, n_samples] array, got shape {list(x.shape)}")
    if len(labels) != x.shape[0]:
        raise ValueError(f"labels must name the {x.shape[0]} channels, got {len(labels)}")
    spr = sfreq * record_seconds
    if not float(spr).is_integer() or spr < 1 or x.shape[1] % int(spr):
        raise ValueError(f"n_samples {x.shape[1]} must be a whole number of records of sfreq * record_seconds = "
                         f"{spr} samples")
    spr, n_rec = int(spr), x.shape[1] // int(spr)
    pmin, pmax = x.min(axis=1), x.max(axis=1)
    flat = pmax - pmin < 1e-12
    pmin, pmax = np.where(flat, pmin - 1, pmin), np.where(flat, pmax + 1, pmax)
    pmin = np.array([float(_fit_number(v, 8)) for v in np.floor(pmin * 1e3) / 1e3])
    pmax = np.array([float(_fit_number(v, 8)) for v in np.ceil(pmax * 1e3) / 1e3])
    dmin, dmax = -32768, 32767
    digital = np.round((x - pmin[:, None]) / (pmax - pmin)[:, None] * (dmax - dmin) + dmin)
    digital = np.clip(digital, dmin, dmax).astype("<i2")
    chans = [dict(label=lab, dim=unit, pmin=a, pmax=b, spr=spr) for lab, a, b in zip(labels, pmin, pmax, strict=True)]
    ann_spr = 30 if edf_plus else 0
    if edf_plus:
        chans.append(dict(label=ANNOTATIONS, dim="", pmin=-1, pmax=1, spr=ann_spr))
    ns = len(chans)
    head = b"".join([_field("0", 8), _field("X X X X" if edf_plus else "synthetic", 80),
                     _field("Startdate 01-JAN-2000 X X X" if edf_plus else "mlpinterp", 80),
                     _field("01.01.00", 8), _field("00.00.00", 8), _field(256 * (ns + 1), 8),
                     _field("EDF+C" if edf_plus else "", 44), _field(n_rec, 8), _field(record_seconds, 8),
                     _field(ns, 4)])
    columns = {"label": (16, "label"), "transducer": (80, None), "dim": (8, "dim"), "pmin": (8, "pmin"),
               "pmax": (8, "pmax"), "dmin": (8, None), "dmax": (8, None), "prefilter": (80, None),
               "spr": (8, "spr"), "reserved": (32, None)}
    for name, (width, key) in columns.items():
        for c in chans:
            value = c[key] if key else {"dmin": dmin, "dmax": dmax}.get(name, "")
            head += _field(value, width)
    records = []
    for r in range(n_rec):
        records.append(digital[:, r * spr:(r + 1) * spr].tobytes())
        if edf_plus:
            tal = f"+{_fit_number(r * record_seconds, 16)}\x14\x14\x00".encode()
            records.append(tal.ljust(2 * ann_spr, b"\x00"))
    path = Path(path)
    atomic_write_bytes(path, head + b"".join(records))
    return path
