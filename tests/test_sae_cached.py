"""Training from activations on disk: the file format and its checks, the batches, the CLI and the Python function
round trip (train on a file, load the SAE, evaluate it by plain code)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from mlpinterp.cli.main import app
from mlpinterp.sae.cached import read_activations, shuffled_batches, write_activations
from mlpinterp.sae.io import load_sae
from mlpinterp.sae.topk import TopKSae
from mlpinterp.sae.train import train_on_activations

runner = CliRunner()


def _acts(n: int, d_in: int = 8, seed: int = 0) -> torch.Tensor:
    """Sparse combinations of 24 fixed directions (seeded), so a small SAE can learn them."""
    g = torch.Generator().manual_seed(seed)
    dirs = torch.nn.functional.normalize(torch.randn(24, d_in, generator=torch.Generator().manual_seed(99)), dim=1)
    z = torch.rand(n, 24, generator=g) * (torch.rand(n, 24, generator=g) < 0.1)
    return z @ dirs + 0.5


def _plain_fvu(sae: TopKSae, x: torch.Tensor) -> float:
    with torch.no_grad():
        x_hat = sae(x).sae_out.double()
    xd = x.double()
    return float((xd - x_hat).pow(2).sum() / (xd - xd.mean(0)).pow(2).sum())


def test_shuffled_batches_use_every_row_once_per_pass():
    x = torch.arange(10.0).reshape(10, 1)
    it = shuffled_batches(x, 4, seed=1)
    first = torch.cat([next(it) for _ in range(5)])  # 20 rows = two passes
    assert sorted(first[:8, 0].tolist() + first[8:10, 0].tolist()) == list(range(10))
    assert sorted(first[:, 0].tolist()) == sorted(list(range(10)) * 2)
    again = shuffled_batches(x, 4, seed=1)
    assert torch.equal(torch.cat([next(again) for _ in range(5)]), first)


def test_cli_round_trip_train_load_evaluate(tmp_path):
    path = write_activations(tmp_path / "acts.safetensors", _acts(3000), _acts(800, seed=1),
                             model_name="toy", hook_point="layer.0")
    out = tmp_path / "sae"
    res = runner.invoke(app, ["sae", "train", "--activations", str(path), "--d-sae", "32", "--k", "4",
                              "--tokens", "6000", "--batch-size", "500", "--seed", "3", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    sae = load_sae(out / "sae_0")
    assert (sae.d_in, sae.cfg.d_sae, sae.cfg.k, sae.hook_point, sae.model_name) == (8, 32, 4, "layer.0", "toy")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 12 and metrics["tokens"] == 6000 and metrics["n_test"] == 800
    fvu = _plain_fvu(sae, read_activations(path).test)
    ev = metrics["saebench_core"][0]["reconstruction_quality"]["explained_variance"]
    assert ev == pytest.approx(1 - fvu, abs=1e-6)
    untrained = TopKSae(8, sae.cfg, generator=torch.Generator().manual_seed(3))
    assert fvu < 0.5 * _plain_fvu(untrained, read_activations(path).test)
    # the Python function gives the same SAE (same defaults, same seed, same batches)
    sae2, m2 = train_on_activations(path, tmp_path / "sae2", d_sae=32, k=4, tokens=6000, batch_size=500, seed=3)
    for name, t in sae.state_dict().items():
        torch.testing.assert_close(sae2.state_dict()[name], t, rtol=0, atol=0)
    assert m2["saebench_core"] == metrics["saebench_core"]


def test_function_without_test_tensor_and_resume(tmp_path):
    path = write_activations(tmp_path / "a.safetensors", _acts(1000))
    sae, metrics = train_on_activations(path, tmp_path / "o", d_sae=16, k=2, tokens=1000, batch_size=250)
    assert metrics["saebench_core"] is None and metrics["steps"] == 4 and sae.hook_point is None
    _, more = train_on_activations(path, tmp_path / "o", d_sae=16, k=2, tokens=2000, batch_size=250)
    assert more["steps"] == 8
    whole, _ = train_on_activations(path, tmp_path / "w", d_sae=16, k=2, tokens=2000, batch_size=250)
    resumed = load_sae(tmp_path / "o" / "sae_0")
    for name, t in whole.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], t, rtol=0, atol=0)


@pytest.mark.parametrize(("tensors", "match"), [
    ({"acts": torch.zeros(10, 4)}, "has no 'train' tensor"),
    ({"train": torch.zeros(10, 4, 2)}, "must have rank 2"),
    ({"train": torch.tensor([[0.0, float("nan")], [1.0, 2.0], [3.0, 4.0]])}, "1 non-finite value"),
    ({"train": torch.zeros(10, 4), "test": torch.zeros(5, 3)}, "'test' has width 3"),
    ({"train": torch.zeros(10, 4, dtype=torch.int64)}, "must be floating point"),
])
def test_bad_files_are_refused_with_error_and_fix(tmp_path, tensors, match):
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match=match):
        read_activations(path)
    res = runner.invoke(app, ["sae", "train", "--activations", str(path), "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    assert "Error:" in res.output and match in res.output and "Fix:" in res.output
    assert "Traceback" not in res.output


def test_missing_and_corrupt_files(tmp_path):
    res = runner.invoke(app, ["sae", "train", "--activations", str(tmp_path / "none.safetensors")])
    assert res.exit_code == 1 and "does not exist" in res.output
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    res = runner.invoke(app, ["sae", "train", "--activations", str(junk)])
    assert res.exit_code == 1 and "not a valid safetensors file" in res.output and "Traceback" not in res.output


def test_model_options_with_activations_are_refused_not_ignored(tmp_path):
    path = write_activations(tmp_path / "acts.safetensors", _acts(300), None)
    runner = CliRunner()
    res = runner.invoke(app, ["sae", "train", "--activations", str(path), "--d-sae", "16", "--k", "2", "--mfr",
                              "--n-saes", "2", "--hook-point", "h", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    out = " ".join(res.output.split())
    assert "--hook-point, --n-saes, --mfr given with --activations" in out and "Fix: drop those options" in out
    assert not (tmp_path / "o").exists()


def test_k_above_d_sae_is_an_expected_failure_naming_both(tmp_path):
    path = write_activations(tmp_path / "acts.safetensors", _acts(300), None)
    res = CliRunner().invoke(app, ["sae", "train", "--activations", str(path), "--d-sae", "8", "--k", "9",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and "Error: --k 9 must be <= --d-sae 8" in " ".join(res.output.split())
    assert not (tmp_path / "o").exists()
