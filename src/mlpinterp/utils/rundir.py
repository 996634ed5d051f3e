"""Run directories: the one place every command that writes a resumable ``--out`` opens it.

A run directory is opened with :func:`open_run` (a context manager) and then holds, beside the command's own files,
``run.json``: a JSON artifact of kind ``"run_record"`` (:func:`mlpinterp.utils.artifact.save_json_artifact`: format
version, SHA-256 over its content) whose ``data`` is the record::

    {"format": 1, "command": "reproduce mfr", "config": {...},
     "sessions": [{"started": "...", "wall_s": 12.3, "pid": 4711, "argv": [...], "status": "finished"}, ...],
     "derived": {"seed0/approximants": {"step": 256}, ...},
     "outputs": {"metrics.json": "<sha256 of the file's bytes>", ...}}

and, while a process has it open, ``.mlpinterp.lock`` (an OS file lock taken with the ``filelock`` library) and
``.mlpinterp.lock.json`` (who holds it). The contract:

* **One writer.** Opening takes the lock without waiting: a second process opening the same directory gets
  :class:`RunLockedError` at once, naming the holder's pid and command line (the lock dies with its process, so a
  killed run never leaves the directory locked).
* **One configuration.** ``config`` is compared with the one stored in ``run.json`` by
  :func:`~mlpinterp.utils.config_diff.config_diff` on every resume; a difference in a field not listed in
  ``resumable`` raises :class:`RunConflictError` (and so does a directory written by another command). The stored
  configuration is then updated to the requested one (the resumable fields may change).
* **Wall time summed across sessions.** Each opening is a session; its wall time is added to ``run.json`` when it
  closes (failed sessions included: they did work that a resume reuses). :attr:`RunDir.wall_seconds` is the sum of
  the earlier sessions and the current one so far, and :meth:`RunDir.time_statement` says so in words, the same in
  every study.
* **A verified record.** ``run.json`` is verified on every read: a corrupt, truncated or hand-edited record is
  refused with :class:`~mlpinterp.utils.artifact.ArtifactError` (Error/Fix on the command line), one of a newer
  format by name. A plain-JSON record of an earlier mlpinterp (no envelope) is read as it is, unverifiable, and
  rewritten verified when that run resumes.
* **Verified JSON outputs.** A JSON file of the run that is read back to decide something (its configuration, a
  finished seed's or block's results, the metrics another study compares with) is written with
  :func:`write_output` and read with :func:`read_output`: the SHA-256 of its bytes is recorded in ``run.json`` and
  checked on reading, so a changed bit is refused instead of reused. The file itself stays plain JSON for users.
  A file without a recorded digest (written outside a run directory, or by an earlier mlpinterp) is read as it is.
* **Derived files keyed by provenance.** A file computed from something that can change between sessions (the
  final checkpoint's step, ...) is recorded with :meth:`RunDir.record` and reused only while
  :meth:`RunDir.is_current` finds the same provenance; otherwise the caller recomputes it.

Nothing here knows a study: the studies, ``train``, ``train-lm`` and ``sae train`` pass their command name and
configuration.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from mlpinterp.utils.config_diff import config_diff, describe_diff, saved_value
from mlpinterp.utils.io import atomic_write_json, loads_json

RUN_FILE = "run.json"
"""The run directory's own record (command, configuration, sessions, provenance of derived files)."""
LOCK_FILE = ".mlpinterp.lock"
"""The OS lock file (held while a process has the directory open)."""
HOLDER_FILE = ".mlpinterp.lock.json"
"""Who holds the lock: pid, command line, start time."""
FORMAT = 1
"""Version of the record inside ``run.json``; a newer one is refused by name."""
RECORD_KIND = "run_record"
"""The artifact kind of ``run.json``."""
RECORD_FIX = ("delete it to adopt the directory's files as a new run (run.json is written by mlpinterp alone: change a "
              "run's settings on the command line, not in the file)")


class RunConflictError(ValueError):
    """``out_dir`` holds a run of another configuration (or of another command).

    Attributes: ``out_dir``; ``diff``: ``{field: (saved value, requested value)}``; ``problem``: what conflicts,
    naming the directory by ``option`` (the option or argument that passed it, as :func:`open_run`'s); ``fix``: one
    line saying how to continue that run or start a new one (the message is ``"problem; fix"``). Every run
    directory of the project refuses another run's settings with it; ``fix`` replaces the default line where the
    caller knows a better one.
    """

    def __init__(self, out_dir: str | os.PathLike, found: str, diff: dict[str, tuple], fix: str | None = None,
                 option: str = "--out"):
        self.out_dir, self.diff = Path(out_dir), dict(diff)
        what = "; ".join(describe_diff(self.diff))
        saved = ", ".join(f"{k}={saved_value(a)!r}" for k, (a, _) in self.diff.items())
        self.fix = fix or (f"to extend that run pass its settings ({saved}); to start a new run choose another "
                           f"output directory or delete {str(self.out_dir)!r}")
        self.problem = f"{option} {str(self.out_dir)!r} holds {found} of another run ({what})"
        super().__init__(f"{self.problem}; {self.fix}")


class RunLockedError(ValueError):
    """Another process has the run directory open (a ``ValueError``). ``holder``: its pid, command line and start
    time as recorded when it took the lock (``{}`` when it had not recorded them yet); ``fix``: what to do."""

    def __init__(self, out_dir: Path, holder: dict):
        self.out_dir, self.holder = out_dir, holder
        who = (f"process {holder.get('pid')} ({' '.join(holder.get('argv') or []) or 'command line unknown'}, "
               f"started {holder.get('started', '?')})") if holder else "another process"
        self.fix = (f"wait until process {holder.get('pid', '?')} has finished (a second writer would mix two runs' "
                    f"files), or pass another --out")
        super().__init__(f"run directory {str(out_dir)!r} is in use by {who}")


def check_out_dir(out: str | os.PathLike, option: str = "--out") -> Path:
    """``Path(out)`` after checking that it can be a run directory: a path (``str``/``os.PathLike``), not empty
    text and not an existing file. Raises ``TypeError`` / ``ValueError`` naming ``option``; nothing is created."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"{option} must be a directory path (str or os.PathLike), got {type(out).__name__}")
    problem = None
    if str(out).strip() == "":
        problem = f"{option} must name a directory, got an empty path (it would write into the current directory)"
    elif Path(out).exists() and not Path(out).is_dir():
        problem = f"{option} {str(out)!r} is an existing file, expected a directory (new, or a run to resume)"
    if problem:
        err = ValueError(problem)
        err.fix = f"pass another {option} (a new directory, or the run directory to resume)"
        raise err
    return Path(out)


def wall_time_statement(seconds: float | None, sessions: int | None) -> str:
    """``"wall time 123 s, summed over 2 sessions of this run directory"``: the one wording every study's report uses
    for :attr:`RunDir.wall_seconds` (``sessions`` ``None``: a run written before sessions were counted)."""
    if seconds is None:
        return "wall time not recorded"
    if sessions is None:
        return f"wall time {seconds:.0f} s (sessions not recorded)"
    return f"wall time {seconds:.0f} s, summed over {sessions} session{'s' if sessions != 1 else ''} of this run " \
           "directory"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _read_record(path: Path) -> dict | None:
    """The record in ``path/run.json`` (verified when it is a run-record artifact; a plain-JSON record of an earlier
    mlpinterp as it is), ``None`` without one. Raises :class:`~mlpinterp.utils.artifact.ArtifactError` (a
    ``ValueError``) naming the file, what is wrong and the fix."""
    from mlpinterp.utils.artifact import ENVELOPE, ArtifactError, load_json_artifact

    f = path / RUN_FILE
    if not f.is_file():
        return None
    try:
        doc = loads_json(f.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise ArtifactError(f, f"is not valid JSON ({e})", RECORD_FIX, "run record") from e
    if isinstance(doc, dict) and {*ENVELOPE, "data"} & set(doc):  # any envelope key: the whole file must verify
        rec = load_json_artifact(f, kind=RECORD_KIND, what="run record", fix=RECORD_FIX).meta
    else:
        rec = doc  # written before run records were hashed: read as it is (nothing to verify it against)
    if not isinstance(rec, dict) or not isinstance(rec.get("sessions", []), list):
        raise ArtifactError(f, "is not a JSON object with a 'sessions' list", RECORD_FIX, "run record")
    fmt = rec.get("format", FORMAT)
    if not isinstance(fmt, int) or fmt > FORMAT:
        raise ArtifactError(f, f"has format {fmt!r}, newer than this mlpinterp reads ({FORMAT})",
                            "upgrade mlpinterp or pass another --out", "run record")
    return rec


def read_run(out: str | os.PathLike) -> dict | None:
    """The ``run.json`` record of ``out`` (``None`` when there is none); ``ValueError`` if it is corrupt."""
    return _read_record(Path(out))


_OPEN: dict[Path, RunDir] = {}
"""The run directories this process has open (resolved path -> :class:`RunDir`), for :func:`write_output`."""


class RunDir:
    """An open run directory (see the module docstring); made by :func:`open_run`."""

    def __init__(self, path: Path, record: dict, started: str):
        self.path = path
        self._record = record
        self._started = started
        self._t0 = time.perf_counter()
        self._previous = sum(float(s.get("wall_s", 0.0)) for s in record["sessions"])
        self._closed = False

    @property
    def command(self) -> str:
        return self._record["command"]

    @property
    def config(self) -> dict:
        return self._record["config"]

    @property
    def sessions(self) -> int:
        """Number of sessions of this run directory, the current one included."""
        return len(self._record["sessions"]) + 1

    @property
    def wall_seconds(self) -> float:
        """Wall time of every session of this run directory (s), the current one so far included."""
        return self._previous + (time.perf_counter() - self._t0)

    def time_statement(self) -> str:
        """:func:`wall_time_statement` of this run directory now."""
        return wall_time_statement(self.wall_seconds, self.sessions)

    def is_current(self, name: str, provenance: Mapping) -> bool:
        """Whether the derived file(s) ``name`` (a path relative to the run directory) were recorded with this
        ``provenance`` (e.g. ``{"step": 256}``); ``False`` when never recorded or recorded with another one."""
        return name in self._record["derived"] and not config_diff(self._record["derived"][name], dict(provenance))

    def record(self, name: str, provenance: Mapping) -> None:
        """Record that the derived file(s) ``name`` were computed from ``provenance`` (written to ``run.json``
        at once, after the files themselves)."""
        self._record["derived"][name] = json.loads(json.dumps(dict(provenance)))
        self._save()

    def forget(self, name: str) -> None:
        """Drop the provenance of ``name`` (call before overwriting its files, so an interruption leaves them
        unrecorded and recomputed on resume)."""
        if self._record["derived"].pop(name, None) is not None:
            self._save()

    def _save(self, session: dict | None = None) -> None:
        from mlpinterp.utils.artifact import save_json_artifact

        rec = dict(self._record)
        if session is not None:
            rec["sessions"] = [*rec["sessions"], session]
            self._record = rec
        save_json_artifact(self.path / RUN_FILE, rec, kind=RECORD_KIND)

    def _set_output(self, name: str, digest: str | None) -> None:
        outputs = self._record.setdefault("outputs", {})
        if digest is None and outputs.pop(name, None) is None:
            return
        if digest is not None:
            outputs[name] = digest
        self._save()

    def _close(self, status: str, argv: list[str]) -> None:
        self._save({"started": self._started, "wall_s": time.perf_counter() - self._t0, "pid": os.getpid(),
                    "argv": argv, "status": status})


def _holder(path: Path) -> dict:
    try:
        h = json.loads((path / HOLDER_FILE).read_text())
        return h if isinstance(h, dict) else {}
    except (OSError, ValueError):
        return {}


@contextmanager
def open_run(out: str | os.PathLike, command: str, config: Mapping[str, Any], *, resumable=(),
             implicit: Mapping | None = None, check: Callable[[Path], None] | None = None,
             option: str = "--out") -> Iterator[RunDir]:
    """Open the run directory ``out`` for ``command`` (e.g. ``"reproduce mfr"``) with ``config`` (JSON-ready).

    Creates the directory, takes its lock without waiting, compares ``config`` with the stored one (fields in
    ``resumable`` may differ; ``implicit`` as in :func:`~mlpinterp.utils.config_diff.config_diff`), calls
    ``check(path)`` (a study's own check of files written before ``run.json`` existed; it raises to refuse), then
    stores the configuration and yields a :class:`RunDir`. A refused opening writes nothing but the lock files; so
    does a first session that the study refuses with :class:`RunConflictError` (files of another run already there).
    A first session that fails before producing anything (no file but the record, files written by ``check`` and
    verified JSON outputs such as the configuration, :func:`write_output`) leaves no trace that would block the
    corrected command: the files it wrote are removed, and so is ``out`` itself when this call created it (a
    directory that existed before, or holds a run, is never removed). On leaving, the session's wall time is added to
    ``run.json`` and the lock released.

    Raises
    ------
    ValueError
        ``out`` is empty text or an existing file (:func:`check_out_dir`), or ``run.json`` is corrupt or newer.
    RunLockedError
        Another process has ``out`` open (names it).
    RunConflictError
        ``out`` holds a run of another command or of another configuration.
    """
    path = check_out_dir(out, option)
    config = json.loads(json.dumps(dict(config), default=str))  # tuples -> lists, paths -> str: as stored
    fresh = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    remove_dir = False
    lock = FileLock(path / LOCK_FILE, timeout=0)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise RunLockedError(path, _holder(path)) from None
    argv = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv else []
    try:
        started = _now()
        atomic_write_json(path / HOLDER_FILE, {"pid": os.getpid(), "argv": argv, "started": started})
        rec = _read_record(path)
        new = rec is None
        before = _files(path) if new else set()
        if new:
            rec = {"format": FORMAT, "command": command, "config": config, "sessions": [], "derived": {},
                   "outputs": {}}
        else:
            if rec.get("command") != command:
                raise RunConflictError(path, f"a `{rec.get('command')}` run", {"command": (rec.get("command"), command)},
                                       fix=f"pass another {option} (a run directory holds one command's run)",
                                       option=option)
            diff = config_diff(rec.get("config") or {}, config, ignore=tuple(resumable), implicit=implicit)
            if diff:
                saved = ", ".join(f"{k}={saved_value(a)!r}" for k, (a, _) in diff.items())
                raise RunConflictError(path, RUN_FILE, diff, fix=f"to continue that run pass its settings ({saved}); "
                                       f"to start a new run pass another {option} (or delete {str(path)!r})",
                                       option=option)
            rec = {**rec, "format": FORMAT, "config": config, "derived": dict(rec.get("derived") or {}),
                   "outputs": dict(rec.get("outputs") or {})}
        if check is not None:
            check(path)
        rd = RunDir(path, rec, started)
        rd._save()  # at once: a run killed in its first session is still recognised
        setup = _files(path) - before if new else set()  # the record, the lock files, what ``check`` wrote
        _OPEN[path.resolve()] = rd
        status = "failed"
        try:
            yield rd
            status = "finished"
        except BaseException as e:
            if new:
                made = _files(path) - before - setup
                nothing_made = made <= set(rd._record.get("outputs") or {})  # only verified JSON: nothing computed
                if nothing_made or isinstance(e, RunConflictError):
                    # failed before producing anything (bad input), or refused by the study's own check of older
                    # files: leave nothing that would block the corrected command
                    written = (made | setup) - {LOCK_FILE, HOLDER_FILE} if nothing_made else {RUN_FILE}
                    for rel in written:
                        (path / rel).unlink(missing_ok=True)
                    rd._closed = True
                    remove_dir = fresh and nothing_made
            raise
        finally:
            if not rd._closed:
                rd._close(status, argv)
    finally:
        _OPEN.pop(path.resolve(), None)
        try:
            (path / HOLDER_FILE).unlink(missing_ok=True)
            if remove_dir:  # still locked: no other process can have started writing into it
                (path / LOCK_FILE).unlink(missing_ok=True)
                _remove_empty_tree(path)
        finally:
            lock.release()


def _files(path: Path) -> set[str]:
    """The files under ``path`` (recursively), as POSIX paths relative to it."""
    return {p.relative_to(path).as_posix() for p in path.rglob("*") if not p.is_dir()}


def _remove_empty_tree(path: Path) -> None:
    """Remove ``path`` and the empty directories under it; a directory holding a file stays (nothing is raised)."""
    for d in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        path.rmdir()
    except OSError:
        pass


def _owner(path: Path) -> tuple[Path | None, dict | None, RunDir | None]:
    """The run directory holding ``path`` (the nearest ancestor open in this process or with a ``run.json``), its
    record and its open :class:`RunDir` (``None`` when not open here); ``(None, None, None)`` outside any."""
    for d in path.resolve().parents:
        if d in _OPEN:
            return d, _OPEN[d]._record, _OPEN[d]
        if (d / RUN_FILE).is_file():
            return d, _read_record(d), None
    return None, None, None


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def write_output(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as strict JSON to ``path`` atomically (:func:`~mlpinterp.utils.io.atomic_write_json`) and, when
    ``path`` lies in a run directory this process has open, record the SHA-256 of its bytes in ``run.json`` for
    :func:`read_output` (the old digest is dropped before the write, so an interruption leaves the file unrecorded,
    never recorded with another file's digest). Raises :class:`~mlpinterp.utils.io.WriteError` when the write
    fails."""
    path = Path(path)
    root, _, rd = _owner(path)
    name = path.resolve().relative_to(root).as_posix() if rd is not None else None
    if rd is not None:
        rd._set_output(name, None)
    atomic_write_json(path, obj)
    if rd is not None:
        rd._set_output(name, _sha256(path.read_bytes()))
    return path


def read_output(path: str | os.PathLike, *, what: str = "file", expect: type | None = dict,
                fix: str = "delete it to recompute it") -> Any:
    """The JSON content of ``path``, verified against the SHA-256 its run directory's ``run.json`` records for it
    (:func:`write_output`); a file without a recorded digest is read as it is (:func:`~mlpinterp.utils.io.read_json`).

    Raises ``FileNotFoundError`` if it is missing and :class:`~mlpinterp.utils.artifact.ArtifactError` (a
    ``ValueError``) naming the file and ``fix`` when it is not valid JSON, not of type ``expect`` (``None``: any), or
    its bytes do not match the recorded digest."""
    from mlpinterp.utils.artifact import ArtifactError

    path = Path(path)
    fix = fix or "delete it to recompute it"
    data = path.read_bytes()
    try:  # unparseable or of the wrong type: said as such, before the digest
        obj = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(path, f"is not valid JSON ({e})", fix, what) from e
    if expect is not None and not isinstance(obj, expect):
        raise ArtifactError(path, f"holds a JSON {type(obj).__name__}, expected a JSON "
                                  f"{'object' if expect is dict else expect.__name__}", fix, what)
    root, rec, _ = _owner(path)
    digest = (rec or {}).get("outputs", {}).get(path.resolve().relative_to(root).as_posix()) if root else None
    if digest is not None and _sha256(data) != digest:
        raise ArtifactError(path, f"does not match the SHA-256 that {RUN_FILE} records for it: the file is corrupt, "
                                  "truncated or was changed after the run wrote it", fix, what)
    return obj
