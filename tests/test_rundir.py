"""Run directories (mlpinterp.utils.rundir): one writer, one configuration, wall time summed over sessions, derived
files keyed by their provenance; every study and command opens its --out through it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.utils.io import atomic_write_json
from mlpinterp.utils.rundir import RUN_FILE, RunConflictError, RunLockedError, open_run, read_run
from tests.cli_utils import flat

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _holder(out: Path, ready: Path) -> subprocess.Popen:
    """A second process that opens ``out`` and holds it until killed (its command line names the run)."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {SRC!r})
        from pathlib import Path
        from mlpinterp.utils.rundir import open_run
        with open_run({str(out)!r}, "train", {{"lr": 0.1}}):
            Path({str(ready)!r}).write_text("ready")
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, "holder-marker"])
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the holder process did not open the run directory")
        time.sleep(0.05)
    return proc


def test_a_second_writer_is_refused_at_once_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    proc = _holder(out, tmp_path / "ready")
    try:
        t0 = time.perf_counter()
        with pytest.raises(RunLockedError) as e:
            with open_run(out, "train", {"lr": 0.1}):
                pytest.fail("a second writer must not get the directory")
        assert time.perf_counter() - t0 < 2.0  # refused, not blocked
        assert f"process {proc.pid}" in str(e.value) and "holder-marker" in str(e.value)
        assert e.value.holder["pid"] == proc.pid and "another --out" in e.value.fix
        # the CLI: Error/Fix, exit 1, no traceback, the directory's files untouched
        before = sorted(p.name for p in out.iterdir())
        r = CliRunner().invoke(app, ["train", "--out", str(out), "--steps", "4", "--quiet"])
        text = flat(r.output)
        assert r.exit_code == 1 and f"is in use by process {proc.pid}" in text and "Fix: wait until" in text
        assert "Traceback" not in r.output and sorted(p.name for p in out.iterdir()) == before
    finally:
        proc.kill()
        proc.wait()
    with open_run(out, "train", {"lr": 0.1}) as rd:  # the lock died with its process
        assert rd.sessions == 1


def test_configuration_is_compared_on_every_resume(tmp_path):
    out = tmp_path / "run"
    with open_run(out, "reproduce mfr", {"k_values": (6, 12), "seeds": 3}):
        pass
    with open_run(out, "reproduce mfr", {"k_values": [6, 12], "seeds": 3}) as rd:  # a tuple is its JSON list
        assert rd.sessions == 2
    with pytest.raises(RunConflictError, match=r"k_values: saved \[6, 12\], requested \[6\]") as e:
        with open_run(out, "reproduce mfr", {"k_values": [6], "seeds": 3}):
            pass
    assert "pass another --out" in e.value.fix and "k_values=[6, 12]" in e.value.fix
    with pytest.raises(RunConflictError, match=r"seeds: saved 3, requested 1"):
        with open_run(out, "reproduce mfr", {"k_values": [6, 12], "seeds": 1}):
            pass
    with pytest.raises(RunConflictError, match="reproduce mfr"):  # another command's directory
        with open_run(out, "train", {"k_values": [6, 12], "seeds": 3}):
            pass
    with open_run(out, "reproduce mfr", {"k_values": [6, 12], "seeds": 5}, resumable=("seeds",)):
        pass
    assert read_run(out)["config"]["seeds"] == 5 and len(read_run(out)["sessions"]) == 3  # refusals add none


def test_wall_time_is_summed_over_sessions_and_said_so(tmp_path):
    out = tmp_path / "run"
    for _ in range(2):
        with open_run(out, "train", {}) as rd:
            time.sleep(0.3)
    with pytest.raises(RuntimeError):  # a failed session did work a resume reuses: it counts too
        with open_run(out, "train", {}) as rd:
            time.sleep(0.3)
            raise RuntimeError("interrupted")
    with open_run(out, "train", {}) as rd:
        sessions = read_run(out)["sessions"]
        assert [s["status"] for s in sessions] == ["finished", "finished", "failed"]
        assert rd.wall_seconds >= 0.9 and rd.wall_seconds == pytest.approx(sum(s["wall_s"] for s in sessions),
                                                                            abs=0.2)
        assert rd.time_statement().endswith("s, summed over 4 sessions of this run directory")


def test_derived_files_are_keyed_by_provenance(tmp_path):
    out = tmp_path / "run"
    with open_run(out, "reproduce polynomial", {}) as rd:
        assert not rd.is_current("seed0/approximants", {"step": 256})
        rd.record("seed0/approximants", {"step": 256})
    with open_run(out, "reproduce polynomial", {}) as rd:
        assert rd.is_current("seed0/approximants", {"step": 256})
        assert not rd.is_current("seed0/approximants", {"step": 128})
        rd.forget("seed0/approximants")
        assert not rd.is_current("seed0/approximants", {"step": 256})


def test_refused_openings_and_failed_first_sessions_leave_no_record(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="existing file"):
        with open_run(f, "train", {}):
            pass
    with pytest.raises(ValueError, match="empty path"):
        with open_run("  ", "train", {}):
            pass
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="bad input"):  # nothing written: the corrected command starts afresh
        with open_run(out, "train", {"lr": -1}):
            raise ValueError("bad input")
    assert not (out / RUN_FILE).exists()
    with open_run(out, "train", {"lr": 1}) as rd:
        assert rd.sessions == 1
    (out / RUN_FILE).write_text('{"format": 99, "sessions": []}')
    with pytest.raises(ValueError, match="format 99, newer than"):
        with open_run(out, "train", {"lr": 1}):
            pass


def test_a_failed_first_session_removes_the_fresh_directory_it_created_and_nothing_else(tmp_path):
    from mlpinterp.utils.rundir import write_output

    out = tmp_path / "fresh"
    with pytest.raises(FileNotFoundError):  # the configuration written, then the data missing: nothing produced
        with open_run(out, "train", {"lr": 0.005}, check=lambda p: (p / "setup.json").write_text("{}")) as rd:
            write_output(rd.path / "config.json", {"lr": 0.005})
            (rd.path / "seed0" / "eval").mkdir(parents=True)
            raise FileNotFoundError("no data")
    assert not out.exists()
    with open_run(out, "train", {"lr": 0.01}) as rd:  # the corrected command with another setting runs
        assert rd.sessions == 1
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    with pytest.raises(FileNotFoundError):
        with open_run(existing, "train", {"lr": 0.005}) as rd:
            write_output(rd.path / "config.json", {"lr": 0.005})
            raise FileNotFoundError("no data")
    assert {p.name for p in existing.iterdir()} == {"notes.txt", ".mlpinterp.lock"}
    worked = tmp_path / "worked"
    with pytest.raises(RuntimeError):  # a checkpoint written: the failed session's work is kept for the resume
        with open_run(worked, "train", {"lr": 0.005}) as rd:
            write_output(rd.path / "config.json", {"lr": 0.005})
            (rd.path / "step_0000016.safetensors").write_bytes(b"x")
            raise RuntimeError("killed")
    assert (worked / "step_0000016.safetensors").exists() and (worked / "config.json").exists()
    assert read_run(worked)["sessions"][-1]["status"] == "failed"


# ------------------------------------------------------------------------- every study compares its configuration


def _foreign_record(out: Path, command: str) -> None:
    out.mkdir(parents=True)
    atomic_write_json(out / RUN_FILE, {"format": 1, "command": command, "config": {"planted": 1}, "sessions": [],
                                       "derived": {}})


@pytest.mark.parametrize("argv", [
    ["train", "--steps", "4"],
    ["reproduce", "polynomial", "--quick", "--seeds", "1"],
    ["reproduce", "mfr", "--k", "6", "--seeds", "1", "--quick", "--steps", "4"],
    ["reproduce", "apd", "--setting", "tms-5-2", "--seeds", "1", "--quick", "--steps", "4"],
    ["reproduce", "spd", "--setting", "tms-5-2", "--seeds", "1", "--quick", "--steps", "4"],
    ["train-lm", "--steps", "2"],
    ["sae", "train", "--steps", "2"],
], ids=lambda a: " ".join(a[:2]))
def test_every_command_refuses_another_configuration_before_working(tmp_path, argv, monkeypatch):
    import mlpinterp.lm.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model must not be loaded"))
    command = " ".join(argv[:2]) if argv[0] in ("reproduce", "sae") else argv[0]
    out = tmp_path / "run"
    _foreign_record(out, command)
    before = (out / RUN_FILE).read_bytes()
    r = CliRunner().invoke(app, [*argv, "--quiet", "--out", str(out)])
    text = flat(r.output)
    assert r.exit_code == 1 and "holds run.json of another run (" in text and "planted: saved 1, requested absent" \
        in text, text
    assert f"Error: --out {str(out)!r} holds" in text, text  # the flag the user typed, not an internal name
    assert "Fix: to continue" in text and "pass another --out" in text and "Traceback" not in r.output
    assert (out / RUN_FILE).read_bytes() == before
    assert {p.name for p in out.iterdir()} <= {RUN_FILE, ".mlpinterp.lock"}  # nothing else written


def test_reproduce_mfr_refuses_other_k_or_seeds_and_sums_its_time(tmp_path):
    """A rerun with other --k / --seeds into one --out was accepted and wrote a report of a subset of the runs saying
    "Total time: 0 s"; now it is refused, and the report states the wall time summed over the sessions."""
    out = tmp_path / "mfr"
    base = ["reproduce", "mfr", "--k", "6", "--seeds", "1", "--quick", "--steps", "4", "--quiet", "--no-extra-alpha",
            "--out", str(out)]
    assert CliRunner().invoke(app, base).exit_code == 0
    first = json.loads((out / "metrics.json").read_text())
    for k, seeds, diff in (("12", "1", "k_values: saved [6], requested [12]"), ("6", "2", "seeds: saved 1, requested 2"),
                           ("6,12", "1", "k_values: saved [6], requested [6, 12]")):
        argv = [*base]
        argv[argv.index("--k") + 1], argv[argv.index("--seeds") + 1] = k, seeds
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 1 and diff in flat(r.output) and "Traceback" not in r.output
    assert json.loads((out / "metrics.json").read_text()) == first  # nothing rewritten
    again = CliRunner().invoke(app, base)
    assert again.exit_code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["sessions"] == 2 and metrics["seconds"] >= first["seconds"] > 0
    assert "summed over 2 sessions of this run directory" in (out / "report.md").read_text()


# ------------------------------------------------------------------------- a verified record and verified outputs
def test_run_record_is_a_verified_artifact_and_a_hand_edit_is_refused(tmp_path):
    from mlpinterp.utils.artifact import ArtifactError

    out = tmp_path / "run"
    with open_run(out, "train", {"lr": 1, "steps": 4}):
        pass
    doc = json.loads((out / RUN_FILE).read_text())
    assert doc["kind"] == "run_record" and doc["data"]["config"] == {"lr": 1, "steps": 4} and len(doc["sha256"]) == 64
    doc["data"]["config"]["lr"] = 2  # a hand edit: the record now claims another run
    (out / RUN_FILE).write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=r"run record .*run.json' does not match its recorded SHA-256.*delete it"):
        with open_run(out, "train", {"lr": 2, "steps": 4}):
            pass
    with pytest.raises(ArtifactError, match="does not match its recorded SHA-256"):
        read_run(out)
    (out / RUN_FILE).write_text(json.dumps({**doc, "mlpinterp_format": 7}))
    with pytest.raises(ArtifactError, match=r"written by a newer mlpinterp \(format 7 > 1\)"):
        read_run(out)


def test_plain_record_of_an_earlier_version_resumes_and_is_rewritten_verified(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    atomic_write_json(out / RUN_FILE, {"format": 1, "command": "train", "config": {"lr": 1}, "sessions": [
        {"started": "x", "wall_s": 5.0, "pid": 1, "argv": [], "status": "finished"}], "derived": {"a": {"step": 2}}})
    with open_run(out, "train", {"lr": 1}) as rd:
        assert rd.sessions == 2 and rd.is_current("a", {"step": 2}) and rd.wall_seconds >= 5.0
    doc = json.loads((out / RUN_FILE).read_text())
    assert doc["kind"] == "run_record" and len(doc["data"]["sessions"]) == 2
    with pytest.raises(RunConflictError, match=r"lr: saved 1, requested 3"):
        with open_run(out, "train", {"lr": 3}):
            pass


def test_outputs_read_back_are_verified_against_the_record(tmp_path):
    """write_output records the SHA-256 of the file in run.json; read_output refuses a file that changed."""
    from mlpinterp.utils.artifact import ArtifactError
    from mlpinterp.utils.rundir import read_output, write_output

    out = tmp_path / "run"
    with open_run(out, "train", {"lr": 1}):
        write_output(out / "seed0" / "result.json", {"fvu": 0.25, "step": 64})
        assert read_output(out / "seed0" / "result.json") == {"fvu": 0.25, "step": 64}  # while open
    digest = hashlib.sha256((out / "seed0" / "result.json").read_bytes()).hexdigest()
    assert read_run(out)["outputs"]["seed0/result.json"] == digest
    assert read_output(out / "seed0" / "result.json") == {"fvu": 0.25, "step": 64}  # closed: from run.json
    f = out / "seed0" / "result.json"
    f.write_text(f.read_text().replace("0.25", "0.35"))  # still valid JSON, another number
    with pytest.raises(ArtifactError, match=r"result.json' does not match the SHA-256 that run.json records"):
        read_output(f)
    f.write_text(f.read_text()[:-3])  # truncated: said as such (the digest is checked once the file parses)
    with pytest.raises(ArtifactError, match="result.json' is not valid JSON"):
        read_output(f)
    f.write_text(f.read_text() + "}\n\n")  # parses again, with other bytes
    with pytest.raises(ArtifactError, match="does not match the SHA-256"):
        read_output(f)
    plain = tmp_path / "loose.json"  # outside any run directory: read as it is
    write_output(plain, {"a": 1})
    assert read_output(plain) == {"a": 1}
    with open_run(out, "train", {"lr": 1}):  # rewriting an output records its new digest
        write_output(f, {"fvu": 0.5})
    assert read_output(f) == {"fvu": 0.5}


def test_cli_refuses_a_corrupt_run_record_with_error_and_fix(tmp_path):
    out = tmp_path / "run"
    with open_run(out, "train", {"planted": 1}):
        pass
    raw = bytearray((out / RUN_FILE).read_bytes())
    raw[raw.index(b'"planted": 1') + len(b'"planted": ')] ^= 0x02  # 1 -> 3: valid JSON, another configuration
    (out / RUN_FILE).write_bytes(bytes(raw))
    r = CliRunner().invoke(app, ["train", "--steps", "4", "--quiet", "--out", str(out)])
    text = flat(r.output)
    assert r.exit_code == 1 and "Error: run record" in text and "does not match its recorded SHA-256" in text, text
    assert "Fix: delete it" in text and "Traceback" not in r.output
