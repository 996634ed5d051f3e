"""Artifacts (mlpinterp.utils.artifact): every type refuses truncation and random single-bit flips (0 silent loads),
the SAE cfg.json "k" flip, a newer format (named), another kind, another provenance; a full disk is a WriteError (an
OSError the CLI prints as Error/Fix) that leaves nothing under the final names. The hash is checked against a hand
computation of its definition."""

from __future__ import annotations

import errno
import hashlib
import json
import math

import numpy as np
import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import mlpinterp as mi
from mlpinterp.cli.main import app
from mlpinterp.models import load_classifier
from mlpinterp.sae.io import load_sae, save_sae
from mlpinterp.sae.topk import SaeConfig, TopKSae
from mlpinterp.toys import load_toy
from mlpinterp.utils import artifact as artifact_mod
from mlpinterp.utils import io as io_mod
from mlpinterp.utils.artifact import (
    FORMAT,
    ArtifactError,
    artifact_kind,
    artifact_sha256,
    load_artifact,
    load_json_artifact,
    save_artifact,
    save_artifacts,
    save_json_artifact,
)
from mlpinterp.utils.io import WriteError

from .artifact_cases import cases, run_mutations
from .cli_utils import flat

torch.set_num_threads(1)

FLIPS_PER_FILE = 40  # 80 single-bit flips per artifact type, half in each file


# ----------------------------------------------------------------------------- corruption of every type
@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_no_silent_load_under_bit_flips_and_truncation(tmp_path, case):
    """Each flip or truncation is refused with ArtifactError, or loads bit-identical values from a JSON file whose
    parsed content is unchanged (whitespace, an exponent's case): the only acceptable silent load."""
    trials = run_mutations(case, tmp_path, FLIPS_PER_FILE, seed=0)
    assert len(trials) == 2 * (FLIPS_PER_FILE + 6)
    changed = [t for t in trials if t.outcome == "changed"]
    assert not changed, [(t.file, t.op) for t in changed]
    for t in trials:
        if t.outcome == "refused":
            assert isinstance(t.error, ArtifactError), (t.file, t.op, repr(t.error))
        else:  # loaded: only a JSON whose canonical content is the original's
            assert t.outcome == "identical" and t.canonical_same, (t.file, t.op)  # canonical_same: JSON files only
    assert sum(t.outcome == "refused" for t in trials if t.op.startswith("flip")) >= 2 * FLIPS_PER_FILE - 2


def _sae(tmp_path, layout="sparsify"):
    sae = TopKSae(6, SaeConfig(d_sae=10, k=4), generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    save_sae(sae, tmp_path, layout=layout)
    return sae


@pytest.mark.parametrize("layout", ["sparsify", "saelens"])
def test_sae_cfg_k_flip_is_refused(tmp_path, layout):
    """One bit turns "k": 4 into "k": 6 (0x34 -> 0x36): a valid cfg.json that computes something else."""
    _sae(tmp_path, layout)
    cfg = tmp_path / "cfg.json"
    raw = cfg.read_bytes()
    top = b'\n  "k": 4'  # the top-level key (SAELens files also hold activation_fn_kwargs.k)
    assert raw.count(top) == 1
    cfg.write_bytes(raw.replace(top, top[:-1] + bytes([top[-1] ^ 0x02])))
    assert json.loads(cfg.read_text())["k"] == 6
    with pytest.raises(ArtifactError, match=r"does not match its recorded SHA-256 .*tensors and cfg.json"):
        load_sae(tmp_path)


def test_sae_written_before_the_header_needs_verify_hash_false(tmp_path):
    sae = _sae(tmp_path)
    w = tmp_path / "sae.safetensors"
    save_file(load_file(w), w)  # the weights without our header, as earlier versions wrote them
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    (tmp_path / "cfg.json").write_text(json.dumps({**cfg, "mlpinterp_format": 2, "weights_sha256": "0" * 64}))
    with pytest.raises(ArtifactError, match=r"no artifact header .*\(cfg.json mlpinterp_format 2: an earlier "
                                            r"mlpinterp wrote it\).*load_sae\(path, verify_hash=False\)"):
        load_sae(tmp_path)
    x = torch.randn(5, 6)
    torch.testing.assert_close(load_sae(tmp_path, verify_hash=False)(x).sae_out, sae(x).sae_out)


# ----------------------------------------------------------------------------- format, kind, provenance
def _resign(path, *, fmt=None, kind=None):
    """Rewrite the header of artifact ``path`` with another format / kind and the hash that goes with it."""
    with safe_open(path, "pt") as f:
        md = dict(f.metadata())
    tensors = load_file(path)
    meta = json.loads(path.with_suffix(".json").read_text())
    fmt = int(md["mlpinterp_format"]) if fmt is None else fmt
    kind = md["kind"] if kind is None else kind
    md.update(mlpinterp_format=str(fmt), kind=kind,
              sha256=artifact_sha256(tensors, kind=kind, meta=meta, provenance=json.loads(md["provenance"]),
                                     format=fmt))
    save_file(tensors, path, metadata=md)


def _ridge(tmp_path, provenance=None):
    rng = np.random.default_rng(0)
    net = mi.MLP(rng.normal(size=(4, 3)), rng.normal(size=4), rng.normal(size=(2, 4)), rng.normal(size=2), "relu")
    p = mi.fit_polynomial(net, mi.Gaussian.standard(3), 2)
    return p, p.save(tmp_path / "p", provenance=provenance)


def test_a_newer_format_is_refused_by_name(tmp_path):
    _, path = _ridge(tmp_path)
    mi.load_polynomial(path)
    _resign(path, fmt=99)
    with pytest.raises(ArtifactError, match=rf"written by a newer mlpinterp \(format 99 > {FORMAT}\); upgrade"):
        mi.load_polynomial(path)
    j = save_json_artifact(tmp_path / "a.json", {"x": 1}, kind="run_config")
    doc = json.loads(j.read_text())
    doc["mlpinterp_format"] = 99
    doc["sha256"] = hashlib.sha256(json.dumps({k: v for k, v in doc.items() if k != "sha256"}, sort_keys=True,
                                              separators=(",", ":")).encode()).hexdigest()
    j.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=r"format 99 > 1\); upgrade"):
        load_json_artifact(j, kind="run_config")


def test_an_unknown_format_and_a_missing_envelope_are_refused(tmp_path):
    _, path = _ridge(tmp_path)
    _resign(path, fmt=0)
    with pytest.raises(ArtifactError, match=r"unknown mlpinterp_format '0'"):
        mi.load_polynomial(path)
    save_file(load_file(path), path)  # no header: another program's file, or an earlier mlpinterp
    with pytest.raises(ArtifactError, match=r"no complete mlpinterp envelope .*cannot be verified"):
        mi.load_polynomial(path)


def test_the_wrong_kind_is_refused_by_name(tmp_path):
    _, path = _ridge(tmp_path)
    with pytest.raises(ArtifactError, match=r"is a 'ridge_polynomial' artifact, not a 'toy_target' one"):
        load_toy(path)
    with pytest.raises(ArtifactError, match=r"'ridge_polynomial' artifact, not a 'classifier_checkpoint' one"):
        load_classifier(path)
    assert artifact_kind(path) == "ridge_polynomial" and artifact_kind(tmp_path / "nothing") is None


def test_provenance_mismatch_is_refused(tmp_path):
    p, path = _ridge(tmp_path, provenance={"step": 256, "network": "abc"})
    q = mi.load_polynomial(path, provenance={"step": 256})
    np.testing.assert_array_equal(q(np.ones((2, 3))), p(np.ones((2, 3))))
    with pytest.raises(ArtifactError, match=r"computed from something else \(step: 256, expected 128\)"):
        mi.load_polynomial(path, provenance={"step": 128})
    with pytest.raises(ArtifactError, match=r"distribution: not recorded, expected 'mixture'"):
        mi.load_polynomial(path, provenance={"distribution": "mixture"})


# ----------------------------------------------------------------------------- the hash and strict JSON
def test_sha256_follows_its_definition():
    """Written out by hand: canonical JSON of the envelope and metadata, then per tensor (name order) the canonical
    JSON of [name, dtype, shape] and its little-endian bytes."""
    t = {"b": torch.tensor([1.0, 2.0]), "a": torch.tensor([[3]], dtype=torch.int32)}
    h = hashlib.sha256()
    h.update(b'{"kind":"k","meta":{"x":[1,2.5]},"mlpinterp_format":1,"provenance":{"step":3}}\n')
    h.update(b'["a","int32",[1,1]]\n' + (3).to_bytes(4, "little"))
    h.update(b'["b","float32",[2]]\n' + np.array([1.0, 2.0], dtype="<f4").tobytes())
    assert artifact_sha256(t, kind="k", meta={"x": [1, 2.5]}, provenance={"step": 3}) == h.hexdigest()
    assert artifact_sha256(t, kind="k", meta={"x": [1, 2.5]}, provenance={"step": 4}) != h.hexdigest()


def test_non_finite_metadata_is_refused_by_place_and_nothing_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"meta\['history'\]\[1\]\['loss'\] is nan, which JSON cannot hold"):
        save_artifact(tmp_path / "a", {"x": torch.zeros(1)}, kind="k", meta={"history": [{}, {"loss": math.nan}]})
    with pytest.raises(ValueError, match=r"provenance\['lr'\] is inf"):
        save_artifact(tmp_path / "a", {"x": torch.zeros(1)}, kind="k", provenance={"lr": math.inf})
    assert list(tmp_path.iterdir()) == []


def test_nan_tokens_and_duplicate_keys_are_not_json(tmp_path):
    path = save_artifact(tmp_path / "a", {"x": torch.zeros(1)}, kind="k", meta={"v": 1.0})
    path.with_suffix(".json").write_text('{"v": NaN}')
    with pytest.raises(ArtifactError, match=r"a.json' is not valid JSON \(the token NaN is not JSON"):
        load_artifact(path, kind="k")
    path.with_suffix(".json").write_text('{"v": 1.0, "v": 1.0}')
    with pytest.raises(ArtifactError, match=r"duplicate keys \['v'\]"):
        load_artifact(path, kind="k")


def test_json_artifact_flips(tmp_path):
    path = save_json_artifact(tmp_path / "m.json", {"n_shards": 3, "cfg": {"hook_point": "h", "lr": 1e-05}},
                              kind="activation_cache", provenance={"hook_point": "h"})
    raw = path.read_bytes()
    ref = load_json_artifact(path, kind="activation_cache", provenance={"hook_point": "h"}).meta
    rng = np.random.default_rng(0)
    silent = 0
    for _ in range(80):
        pos, bit = int(rng.integers(len(raw))), int(rng.integers(8))
        data = bytearray(raw)
        data[pos] ^= 1 << bit
        path.write_bytes(bytes(data))
        try:
            got = load_json_artifact(path, kind="activation_cache").meta
        except ArtifactError:
            continue
        silent += 1  # only a flip that keeps the parsed content (an exponent's case)
        assert got == ref and json.loads(bytes(data)) == json.loads(raw), (pos, bit)
    assert silent <= 2


# ----------------------------------------------------------------------------- write failures
def _disk_full_safetensors(*args, **kwargs):
    raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                          "\"No space left on device\" })")


def test_disk_full_in_the_tensor_writer_is_a_write_error(tmp_path, monkeypatch):
    p, path = _ridge(tmp_path)
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    monkeypatch.setattr("safetensors.torch.save_file", _disk_full_safetensors)
    with pytest.raises(WriteError, match=r"could not write '.*p.safetensors' \(SafetensorError: .*No space left") as e:
        p.to_dense().save(tmp_path / "p")
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOSPC and "free disk space" in e.value.fix
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before  # the old artifact intact, no temp file
    with pytest.raises(WriteError):
        p.save(tmp_path / "new")
    assert not list(tmp_path.glob("new*")) and not list(tmp_path.glob(".*"))


def test_disk_full_in_the_json_writer_leaves_nothing(tmp_path, monkeypatch):
    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(io_mod.os, "fsync", no_space)
    with pytest.raises(WriteError, match=r"could not write '.*a.json' \(OSError: \[Errno 28\]") as e:
        save_artifact(tmp_path / "a", {"x": torch.zeros(3)}, kind="k", meta={"v": 1})
    assert e.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []  # neither file, no temporary file


def test_save_artifacts_writes_a_group_together_or_nothing(tmp_path, monkeypatch):
    """Two artifacts and a plain JSON document in one call: each artifact loads verified, the document is strict
    indented JSON; a NaN in the document, or a full disk in the last file, leaves no file at all."""
    from mlpinterp.utils.artifact import Artifact

    a = Artifact({"x": torch.arange(3.0)}, {"v": 1}, {"step": 2}, "k_one", tmp_path / "g" / "a")
    b = Artifact({"y": torch.ones(2, 2)}, {"w": [1, 2]}, None, "k_two", tmp_path / "g" / "b",
                 meta_path=tmp_path / "g" / "b_cfg.json")
    paths = save_artifacts([a, b], {tmp_path / "g" / "doc.json": {"z": (1, 2)}})
    assert paths == [tmp_path / "g" / "a.safetensors", tmp_path / "g" / "b.safetensors"]
    assert torch.equal(load_artifact(paths[0], kind="k_one", provenance={"step": 2}).tensors["x"], torch.arange(3.0))
    assert load_artifact(paths[1], kind="k_two", meta_path=tmp_path / "g" / "b_cfg.json").meta == {"w": [1, 2]}
    assert (tmp_path / "g" / "doc.json").read_text() == '{\n  "z": [\n    1,\n    2\n  ]\n}\n'
    with pytest.raises(ValueError, match=r"doc.json\['z'\] is nan"):
        save_artifacts([a], {tmp_path / "h" / "doc.json": {"z": math.nan}})
    assert not (tmp_path / "h").exists()
    calls = []

    def full_on_third(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(io_mod.os, "fsync", full_on_third)
    with pytest.raises(WriteError):
        save_artifacts([a, b], {tmp_path / "i" / "doc.json": {}})
    assert len(calls) == 3 and list((tmp_path / "i").iterdir()) == []  # failed at the last file: none renamed


def test_cli_prints_a_full_disk_as_error_and_fix(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "w.npz", W1=rng.normal(size=(4, 3)), b1=rng.normal(size=4), W2=rng.normal(size=(2, 4)),
             b2=rng.normal(size=2))
    monkeypatch.setattr("safetensors.torch.save_file", _disk_full_safetensors)
    res = CliRunner().invoke(app, ["approx", str(tmp_path / "w.npz"), "--activation", "relu", "--degree", "1",
                                   "--out", str(tmp_path / "p")])
    out = flat(res.output)
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "Error: could not write" in out and "No space left on device" in out and "Fix: free disk space" in out
    assert not list(tmp_path.glob("p*"))


def test_an_unwritable_directory_is_a_write_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(WriteError, match="could not write"):
        save_artifact(tmp_path / "file" / "a", {"x": torch.zeros(1)}, kind="k")


def test_provenance_and_kind_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="kind must be a non-empty name"):
        save_artifact(tmp_path / "a", {}, kind="a b")
    with pytest.raises(TypeError, match="provenance must be a dict"):
        save_artifact(tmp_path / "a", {}, kind="k", provenance=[1])
    with pytest.raises(TypeError, match="tensors must map names"):
        save_artifact(tmp_path / "a", {"x": np.zeros(2)}, kind="k")
    assert artifact_mod.tensors_path(tmp_path / "fit.deg2").name == "fit.deg2.safetensors"
