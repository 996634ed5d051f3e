"""``mlpinterp approx``: weights files in, approximant + FVU out; bad files give clear errors."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from mlpinterp import MLP, Gaussian, fit_polynomial, load_polynomial
from mlpinterp.cli.main import app
from tests.cli_utils import flat


def _weights(tmp_path, rng):
    W1, b1 = rng.standard_normal((6, 3)), rng.normal(0, 0.3, 6)
    W2, b2 = rng.standard_normal((2, 6)), np.zeros(2)
    path = tmp_path / "w.npz"
    np.savez(path, W1=W1, b1=b1, W2=W2, b2=b2)
    return path, MLP(W1, b1, W2, b2, "gelu")


def test_approx_writes_the_same_approximant_as_the_api(tmp_path):
    rng = np.random.default_rng(0)
    path, net = _weights(tmp_path, rng)
    L = rng.standard_normal((3, 3))
    mean, cov = rng.standard_normal(3), L @ L.T
    np.save(tmp_path / "mean.npy", mean)
    np.save(tmp_path / "cov.npy", cov)
    r = CliRunner().invoke(app, ["approx", str(path), "--degree", "2", "--activation", "gelu", "--mean",
                                 str(tmp_path / "mean.npy"), "--cov", str(tmp_path / "cov.npy"), "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    assert "FVU =" in flat(r.output) and "exact" in flat(r.output)
    q = load_polynomial(tmp_path / "p.safetensors")
    p = fit_polynomial(net, Gaussian(mean, cov), 2)
    X = rng.standard_normal((10, 3))
    np.testing.assert_allclose(q(X), p(X), rtol=1e-12)


def test_approx_bad_inputs(tmp_path):
    rng = np.random.default_rng(1)
    path, _ = _weights(tmp_path, rng)
    runner = CliRunner()
    r = runner.invoke(app, ["approx", str(tmp_path / "missing.npz"), "--activation", "relu"])
    assert r.exit_code != 0 and "does not exist" in flat(r.output)
    r = runner.invoke(app, ["approx", str(path)])
    assert r.exit_code != 0 and "--activation" in flat(r.output)
    r = runner.invoke(app, ["approx", str(path), "--activation", "nope"])
    assert r.exit_code != 0 and "activation" in flat(r.output).lower()
    r = runner.invoke(app, ["approx", str(path), "--activation", "relu", "--degree", "-1"])
    assert r.exit_code != 0 and "degree" in flat(r.output)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    r = runner.invoke(app, ["approx", str(bad), "--activation", "relu"])
    assert r.exit_code != 0 and "not a valid .npz" in flat(r.output)
    other = tmp_path / "other.npz"
    np.savez(other, A=np.ones(3))
    r = runner.invoke(app, ["approx", str(other), "--activation", "relu"])
    assert r.exit_code != 0 and "expected W1" in flat(r.output)
    trunc = tmp_path / "t.safetensors"
    trunc.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    r = runner.invoke(app, ["approx", str(trunc), "--activation", "relu"])
    assert r.exit_code != 0 and "safetensors" in flat(r.output)


def test_approx_missing_dataset_files_is_a_message_with_the_fix(tmp_path):
    rng = np.random.default_rng(2)
    W1, W2 = rng.standard_normal((6, 784)), rng.standard_normal((10, 6))
    np.savez(tmp_path / "w.npz", W1=W1, b1=np.zeros(6), W2=W2, b2=np.zeros(10))
    r = CliRunner().invoke(app, ["approx", str(tmp_path / "w.npz"), "--activation", "relu", "--distribution",
                                 "mixture", "--dataset", "mnist", "--data", str(tmp_path / "nowhere")])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit)
    assert "missing IDX file" in flat(r.output) and "Fix: pass --data DIR" in flat(r.output)


def test_approx_out_never_overwrites_the_weights_it_reads(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    npz, _ = _weights(tmp_path, rng)
    path = tmp_path / "w.safetensors"
    with np.load(npz) as z:
        save_file({k: z[k] for k in z.files}, str(path))
    sidecar = tmp_path / "w.json"
    sidecar.write_text("{}")
    before = path.read_bytes()
    runner = CliRunner()
    for out in (path, tmp_path / "w"):  # w -> w.safetensors + w.json: the .json clashes with the weights' sidecar
        r = runner.invoke(app, ["approx", str(path), "--activation", "relu", "--out", str(out)])
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
        assert "would overwrite the network" in flat(r.output) and "Fix:" in flat(r.output)
    assert path.read_bytes() == before and sidecar.read_text() == "{}"
    r = runner.invoke(app, ["approx", str(path), "--activation", "relu", "--out", str(tmp_path / "p")])
    assert r.exit_code == 0 and (tmp_path / "p.safetensors").exists()


def test_approx_refuses_mean_cov_together_with_a_dataset_law(tmp_path):
    rng = np.random.default_rng(4)
    path, _ = _weights(tmp_path, rng)
    np.save(tmp_path / "mean.npy", np.zeros(3))
    np.save(tmp_path / "cov.npy", np.eye(3))
    r = CliRunner().invoke(app, ["approx", str(path), "--activation", "relu", "--mean", str(tmp_path / "mean.npy"),
                                 "--cov", str(tmp_path / "cov.npy"), "--distribution", "mixture", "--dataset", "digits"])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert "--distribution mixture --dataset digits would be ignored" in flat(r.output)


def test_approx_help_shows_the_shapes_of_mean_and_cov():
    r = CliRunner().invoke(app, ["approx", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert "mean [d_in]" in flat(r.output) and "covariance [d_in, d_in]" in flat(r.output)


def test_approx_mean_of_the_wrong_length_is_named_against_the_network(tmp_path):
    rng = np.random.default_rng(5)
    path, _ = _weights(tmp_path, rng)  # d_in = 3
    np.save(tmp_path / "mean.npy", np.zeros(5))
    np.save(tmp_path / "cov.npy", np.eye(3))
    r = CliRunner().invoke(app, ["approx", str(path), "--activation", "relu", "--mean", str(tmp_path / "mean.npy"),
                                 "--cov", str(tmp_path / "cov.npy")])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "mean must have shape [3] (the network's d_in = 3), got [5]" in flat(r.output)


def test_approx_fvu_method_monte_carlo_agrees_with_the_exact_fvu(tmp_path):
    """``--fvu-method monte-carlo`` (the CLI way to the sampled estimate the memory refusal of the exact FVU
    suggests) agrees with the closed form within 5 standard errors; ``exact`` where none exists is an Error/Fix."""
    import re

    rng = np.random.default_rng(3)
    W1, b1 = rng.standard_normal((6, 3)), rng.normal(0, 0.3, 6)
    np.savez(tmp_path / "relu.npz", W1=W1, b1=b1, W2=rng.standard_normal((2, 6)), b2=np.zeros(2))
    base = ["approx", str(tmp_path / "relu.npz"), "--activation", "relu", "--degree", "1"]
    exact = CliRunner().invoke(app, [*base, "--fvu-method", "exact"])
    mc = CliRunner().invoke(app, [*base, "--fvu-method", "monte-carlo", "--samples", "40000"])
    assert exact.exit_code == 0 and mc.exit_code == 0, (exact.output, mc.output)
    f_exact = float(re.search(r"FVU = ([0-9.]+) \(exact", flat(exact.output)).group(1))
    m = re.search(r"FVU = ([0-9.]+) ± ([0-9.e+-]+) \(Monte Carlo, 40000 samples\)", flat(mc.output))
    assert m is not None, mc.output
    assert abs(float(m.group(1)) - f_exact) < 5 * float(m.group(2))
    np.savez(tmp_path / "glu.npz", W=rng.standard_normal((4, 3)), V=rng.standard_normal((4, 3)))
    r = CliRunner().invoke(app, ["approx", str(tmp_path / "glu.npz"), "--activation", "relu", "--fvu-method", "exact"])
    assert r.exit_code == 1 and "Error: exact FVU needs an MLP" in flat(r.output) and "Traceback" not in r.output
