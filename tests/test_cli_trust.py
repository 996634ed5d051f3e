"""The Trust cases of the CLI: each expected failure prints Error/Fix with exit status 1 and no traceback, checked
before any model is loaded; a diverged run writes nothing; derived files follow the step they came from."""

from __future__ import annotations

import errno
import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.utils.rundir import read_run
from tests.cli_utils import flat

runner = CliRunner()


def _fails(r, *needles: str) -> str:
    text = flat(r.output)
    assert r.exit_code == 1, text
    assert "Traceback" not in r.output and "Error: " in text and "Fix: " in text, text
    for n in needles:
        assert n in text, (n, text)
    return text


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: the failure must be found before."""
    import mlpinterp.lm.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("a model was loaded before the check"))


# ------------------------------------------------------------------------------------------ divergence, strict JSON


def _strict(text: str):
    def refuse(token):
        raise AssertionError(f"non-strict JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_diverging_training_exits_1_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, ["train", "--lr", "1e30", "--steps", "5", "--quiet", "--out", str(out)])
    _fails(r, "classifier training diverged at step", "lower --lr", "nothing was written")
    assert not out.exists()


def test_json_is_written_strictly(tmp_path):
    from mlpinterp.utils.io import atomic_write_json

    atomic_write_json(tmp_path / "m.json", {"se": float("nan"), "x": [1.0, float("inf"), np.float32("nan")],
                                            "a": np.array([np.nan, 2.0])})
    assert _strict((tmp_path / "m.json").read_text()) == {"se": None, "x": [1.0, None, None], "a": [None, 2.0]}


@pytest.mark.parametrize("optimizer", ["adam", "signum_schedulefree"])
def test_sae_training_stops_on_a_non_finite_loss_before_stepping(optimizer):
    import torch

    from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
    from mlpinterp.sae.topk import SaeConfig
    from mlpinterp.utils.checkpoint import TrainingDiverged

    trainer = MfrTrainer(8, MfrConfig(sae=SaeConfig(d_sae=16, k=2), n_saes=1, penalty=False, reinit=False,
                                      optimizer=optimizer))
    trainer.train_step(torch.randn(64, 8))
    sae = trainer.saes[0]
    with torch.no_grad():
        sae.b_dec.fill_(3e38)  # finite weights whose reconstruction error overflows (the decoder norm cannot help)
    before = [p.detach().clone() for p in sae.parameters()]
    with pytest.raises(TrainingDiverged, match="SAE training diverged at step 2"):
        trainer.train_step(torch.randn(64, 8))
    for (name, p), b in zip(sae.named_parameters(), before, strict=True):  # no step taken
        if name == "W_dec_param" and optimizer == "signum_schedulefree":  # renormalised before the forward
            torch.testing.assert_close(p, b / b.norm(dim=1, keepdim=True))
        else:
            assert torch.equal(p, b), name
    with torch.no_grad():
        sae.b_dec.fill_(float("nan"))
    with pytest.raises(TrainingDiverged, match="NaN or inf"):
        trainer.save_checkpoint(Path("/nonexistent/never-written"))


@pytest.mark.parametrize("argv", [
    ["reproduce", "polynomial", "--quick", "--dataset", "mnist"],
    ["reproduce", "polynomial", "--quick"],  # --data with the bundled digits: refused before the directory opens
    ["reproduce", "mfr", "--setting", "minilm", "--quick"],
    ["reproduce", "three-spaces", "--setting", "minilm", "--quick"],
    ["reproduce", "transformer", "--model", "minilm", "--quick"],
    ["train", "--dataset", "mnist"],
    ["train-lm"],
    ["sae", "train", "--model", "minilm"],
], ids=lambda a: " ".join(a[:3]))
def test_cli_failed_run_leaves_nothing_on_a_missing_data_path(tmp_path, argv):
    """A run that fails on its input before producing anything removes the fresh --out it created (before, the
    record and config.json it left refused the corrected command as another run), and leaves an existing
    directory as it found it, but for the lock file."""
    out = tmp_path / "new"
    _fails(runner.invoke(app, [*argv, "--quiet", "--data", str(tmp_path / "nonexistent"), "--out", str(out)]))
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    _fails(runner.invoke(app, [*argv, "--quiet", "--data", str(tmp_path / "nonexistent"), "--out", str(mine)]))
    assert {p.name for p in mine.iterdir()} <= {"notes.txt", ".mlpinterp.lock"}
    assert (mine / "notes.txt").read_text() == "kept"


# ------------------------------------------------------------------------------------------------- disk full


@pytest.mark.parametrize("how", ["safetensors", "enospc"])
def test_a_full_disk_is_an_error_with_a_fix(tmp_path, monkeypatch, how):
    import safetensors.torch

    def full(*a, **k):
        if how == "safetensors":
            from safetensors import SafetensorError

            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                                  "\"No space left on device\" })")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    r = runner.invoke(app, ["train", "--steps", "2", "--quiet", "--out", str(tmp_path / "run")])
    text = _fails(r, "No space left on device")
    assert "space" in text.split("Fix: ", 1)[1]  # the fix says to free space (or write elsewhere)


# ----------------------------------------------------------------------------------------------- model files


class _Payload:
    def __reduce__(self):
        import os

        return (os.system, (f"touch {_Payload.marker}",))


def _tiny_model_dir(path: Path, *, tokenizer: bool = True, pickle_weights: bool = False) -> Path:
    from tests.ffn_tiny import tiny_gpt2
    from tests.ffn_tiny import tokenizer as tiny_tokenizer

    model = tiny_gpt2()
    model.config.save_pretrained(path)
    if tokenizer:
        tiny_tokenizer().save_pretrained(path)
    if pickle_weights:
        (path / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload()))
    else:
        model.save_pretrained(path)
    return path


def test_a_pickled_model_is_refused_unread(tmp_path):
    _Payload.marker = tmp_path / "payload-ran"
    d = _tiny_model_dir(tmp_path / "evil", pickle_weights=True)
    r = runner.invoke(app, ["sae", "train", "--model", str(d), "--hook-point", "transformer.h.0.mlp", "--steps", "1",
                            "--out", str(tmp_path / "o"), "--quiet"])
    _fails(r, "weights only as a pickle (pytorch_model.bin)", "safetensors")
    assert not _Payload.marker.exists()


def test_a_model_directory_without_tokenizer_files(tmp_path):
    d = _tiny_model_dir(tmp_path / "m", tokenizer=False)
    r = runner.invoke(app, ["sae", "train", "--model", str(d), "--hook-point", "transformer.h.0.mlp", "--steps", "1",
                            "--out", str(tmp_path / "o"), "--quiet"])
    _fails(r, "no tokenizer files", "tokenizer.save_pretrained")


def test_sae_train_refuses_an_existing_file_as_out_before_loading(tmp_path, no_model_load):
    f = tmp_path / "file"
    f.write_text("x")
    r = runner.invoke(app, ["sae", "train", "--out", str(f), "--quiet"])
    _fails(r, "is an existing file")


def test_an_sae_recording_minilm_is_accepted_on_minilm():
    from mlpinterp.sae.io import check_provenance

    for recorded in ("minilm", "sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"):
        check_provenance("evaluating", recorded_model=recorded, recorded_hook="h", model_name="minilm",
                         hook_point="h")
    with pytest.raises(ValueError, match="trained on model 'minilm', not 'gpt2'"):
        check_provenance("evaluating", recorded_model="minilm", recorded_hook="h", model_name="gpt2", hook_point="h")


def test_sae_eval_checks_the_recorded_model_before_loading(tmp_path, no_model_load):
    from mlpinterp.sae.io import save_sae
    from mlpinterp.sae.topk import SaeConfig, TopKSae

    sae = TopKSae(8, SaeConfig(d_sae=16, k=2), model_name="minilm", hook_point="encoder.layer.3.output")
    save_sae(sae, tmp_path / "sae")
    r = runner.invoke(app, ["sae", "eval", str(tmp_path / "sae"), "--model", "gpt2"])
    _fails(r, "trained on model 'minilm', not 'gpt2'")


# --------------------------------------------------------------------------------------------------- arrays, data


@pytest.mark.parametrize("content", ["zero-bytes", "empty-array"])
def test_approx_refuses_an_empty_mean(tmp_path, content):
    np.savez(tmp_path / "w.npz", W1=np.ones((3, 2)), b1=np.zeros(3), W2=np.ones((1, 3)), b2=np.zeros(1))
    mean = tmp_path / "mean.npy"
    if content == "zero-bytes":
        mean.write_bytes(b"")
    else:
        np.save(mean, np.zeros(0))
    np.save(tmp_path / "cov.npy", np.eye(2))
    r = runner.invoke(app, ["approx", str(tmp_path / "w.npz"), "--activation", "relu", "--mean", str(mean), "--cov",
                            str(tmp_path / "cov.npy")])
    _fails(r, "--mean", "empty", "d_in = 2")


def test_a_gzip_bomb_named_as_an_idx_file_is_stopped_while_streaming(tmp_path):
    """A label file whose header declares 10,000 labels but which decompresses to 64 MB: refused after at most
    the expected size plus one 1 MiB piece, not decompressed whole."""
    import tracemalloc

    from mlpinterp.data.idx import MNIST_FILES, read_idx

    d = tmp_path / "mnist"
    d.mkdir()
    header = b"\0\0\x08\x01" + (10_000).to_bytes(4, "big")
    bomb = gzip.compress(header + bytes(64 << 20), compresslevel=1)
    assert len(bomb) < 1 << 20
    for spec in MNIST_FILES.values():
        (d / f"{spec.name}.gz").write_bytes(bomb)
    tracemalloc.start()
    with pytest.raises(ValueError, match="decompresses to more than the 10008 bytes"):
        read_idx(d / "t10k-labels-idx1-ubyte.gz", MNIST_FILES["test_labels"])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak
    r = runner.invoke(app, ["train", "--dataset", "mnist", "--data-path", str(d), "--steps", "2", "--quiet", "--out",
                            str(tmp_path / "run")])
    _fails(r, "decompresses to more than")


# ------------------------------------------------------------------------------- derived files follow their step


def test_resuming_to_fewer_steps_refits_the_final_approximants(tmp_path, monkeypatch):
    """A run to 32 steps, then the same --out asked for 16: the approximants, the attack and the features are those
    of a fresh 16-step run (they were those of step 32 with the step-16 network)."""
    import mlpinterp.studies.polynomial.figures as plots
    import mlpinterp.studies.polynomial.report as report
    import mlpinterp.studies.polynomial.run as repro
    from mlpinterp.data import load_digits
    from mlpinterp.data.pooling import average_pool
    from mlpinterp.poly.approximant import load_polynomial
    from mlpinterp.studies.polynomial.settings import PolynomialReproConfig

    small = average_pool(load_digits(), 4)
    monkeypatch.setattr(repro, "load_dataset", lambda name, path=None: small)
    monkeypatch.setattr(plots, "make_figures", lambda *a, **k: None)
    monkeypatch.setattr(report, "write_report", lambda *a, **k: None)
    kw = dict(dataset="digits", seeds=1, d_hidden=8, mc_samples=200, warmup_steps=16, covariance="empirical",
              mixture_cg_dtype="float64")
    out, fresh = tmp_path / "run", tmp_path / "fresh"
    repro.run_polynomial_repro(PolynomialReproConfig(**kw, steps=32), out, quiet=True)
    repro.run_polynomial_repro(PolynomialReproConfig(**kw, steps=16), out, quiet=True)
    repro.run_polynomial_repro(PolynomialReproConfig(**kw, steps=16), fresh, quiet=True)
    for name in ("linear_mixture", "quadratic_mixture"):
        a = load_polynomial(out / "seed0" / "approximants" / f"{name}.safetensors")
        b = load_polynomial(fresh / "seed0" / "approximants" / f"{name}.safetensors")
        np.testing.assert_allclose(a.coefficients(1), b.coefficients(1), rtol=1e-9, atol=1e-12)
    attack = json.loads((out / "seed0" / "attack.json").read_text())
    assert attack == json.loads((fresh / "seed0" / "attack.json").read_text()) and attack["step"] == 16
    with np.load(out / "seed0" / "features.npz") as z, np.load(fresh / "seed0" / "features.npz") as y:
        assert sorted(z.files) == sorted(y.files)
        for k in z.files:
            np.testing.assert_allclose(z[k], y[k], rtol=1e-9, atol=1e-12)
    assert len(read_run(out)["sessions"]) == 2


# ------------------------------------------------------------------------------------------------- one CLI


def test_version_and_the_spd_group():
    from mlpinterp import __version__

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"mlpinterp {__version__}"
    r = runner.invoke(app, ["spd", "--help"])
    assert r.exit_code == 0 and "train-target" in r.output


def test_help_shows_lists_and_flags_plainly():
    for argv in (["reproduce", "mfr"], ["reproduce", "transformer"], ["sae", "train"], ["reproduce", "polynomial"],
                 ["reproduce", "apd"], ["train"]):
        r = runner.invoke(app, [*argv, "--help"], terminal_width=200)
        assert r.exit_code == 0
        assert "<list[" not in r.output and "<bool>" not in r.output, (argv, r.output)
        assert "--quick" in r.output or argv[0] == "train" or argv[:2] == ["sae", "train"]
    assert "--smoke" not in runner.invoke(app, ["reproduce", "polynomial", "--help"]).output  # a hidden alias


def test_mfr_options_of_one_setting_are_refused_elsewhere(tmp_path):
    r = runner.invoke(app, ["reproduce", "mfr", "--data", str(tmp_path), "--out", str(tmp_path / "o")])
    _fails(r, "--data (applies to --setting minilm | lm | gpt2 | eeg) given with --setting synthetic")
    r = runner.invoke(app, ["reproduce", "mfr", "--setting", "minilm", "--model", "gpt2", "--out",
                            str(tmp_path / "o")])
    _fails(r, "--model (applies to --setting lm)")
    r = runner.invoke(app, ["reproduce", "mfr", "--setting", "nope"])
    assert r.exit_code == 2 and "'nope' is not one of" in flat(r.output)
    assert not (tmp_path / "o").exists()
