"""Tests for mlpinterp.models: classifier forward, schedule-free training, checkpoints, resumption."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import schedulefree
import torch
from scipy.special import logsumexp, ndtr

import mlpinterp.models.train as train_mod
from mlpinterp.data import Dataset, load_digits
from mlpinterp.models import (
    Classifier,
    ClassifierConfig,
    RunConflictError,
    checkpoint_steps,
    find_checkpoints,
    load_classifier,
    train_classifier,
)

from .artifact_utils import rewrite

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_digits()


def small_cfg(**over) -> ClassifierConfig:
    kw = dict(d_in=64, n_classes=10, d_hidden=32, steps=200, warmup_steps=50, lr=5e-3, seed=0)
    kw.update(over)
    return ClassifierConfig(**kw)


def state(path: Path) -> dict[str, torch.Tensor]:
    model, _ = load_classifier(path)
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# --------------------------------------------------------------------------- checkpoint_steps


def _brute_force_steps(max_steps: int) -> list[int]:
    cand = {2**k for k in range(4, 40)} | {3 * 2 ** (k - 1) for k in range(4, 40)}
    return sorted({s for s in cand if s <= max_steps} | {max_steps})


@pytest.mark.parametrize("max_steps", [1, 15, 16, 17, 24, 25, 200, 1000, 1024, 1536, 4097, 10_000])
def test_checkpoint_steps_matches_brute_force(max_steps):
    assert checkpoint_steps(max_steps) == _brute_force_steps(max_steps)


def test_checkpoint_steps_examples_and_errors():
    assert checkpoint_steps(200) == [16, 24, 32, 48, 64, 96, 128, 192, 200]
    assert checkpoint_steps(10) == [10]
    for bad in (0, -5, 2.5, True, "100"):
        with pytest.raises(ValueError, match="max_steps"):
            checkpoint_steps(bad)


# --------------------------------------------------------------------------- config and forward


def test_config_validation():
    with pytest.raises(ValueError, match="arch must be one of"):
        small_cfg(arch="cnn")
    with pytest.raises(ValueError, match="activation must be one of"):
        small_cfg(activation="swish")
    with pytest.raises(ValueError, match="d_hidden must be a positive int"):
        small_cfg(d_hidden=0)
    with pytest.raises(ValueError, match="lr must be"):
        small_cfg(lr=-1.0)
    with pytest.raises(ValueError, match="lr must be"):
        small_cfg(lr=float("nan"))
    with pytest.raises(ValueError, match="warmup_steps"):
        small_cfg(warmup_steps=-1)
    with pytest.raises(ValueError, match="unknown key"):
        ClassifierConfig.from_dict({**small_cfg().to_dict(), "dropout": 0.1})
    assert ClassifierConfig.from_dict(small_cfg().to_dict()) == small_cfg()


NP_ACT = {
    "relu": lambda z: np.maximum(z, 0.0),
    "gelu": lambda z: z * ndtr(z),  # exact GELU: x Phi(x)
    "silu": lambda z: z / (1.0 + np.exp(-z)),
    "tanh": np.tanh,
    "identity": lambda z: z,
}


@pytest.mark.parametrize("arch", ["mlp", "glu"])
@pytest.mark.parametrize("activation", list(NP_ACT))
def test_forward_matches_numpy_formula(arch, activation):
    cfg = small_cfg(arch=arch, activation=activation, d_hidden=16)
    model = Classifier(cfg).double()
    x = np.random.default_rng(1).normal(size=(9, 64))
    p = {k: v.detach().numpy() for k, v in model.named_parameters()}
    act = NP_ACT[activation]
    if arch == "mlp":  # W2 act(W1 x + b1) + b2
        h = act(x @ p["hidden.weight"].T + p["hidden.bias"])
    else:  # W2 (act(W x + b) * (V x + c)) + b2
        h = act(x @ p["gate.weight"].T + p["gate.bias"]) * (x @ p["value.weight"].T + p["value.bias"])
    want = h @ p["out.weight"].T + p["out.bias"]
    got = model(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"x must have shape \[batch, 64\]"):
        model(torch.zeros(3, 65, dtype=torch.float64))


def test_init_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = Classifier(small_cfg()), Classifier(small_cfg()), Classifier(small_cfg(seed=1))
    assert torch.equal(torch.get_rng_state(), before)
    assert_bit_identical(a.state_dict(), b.state_dict())
    assert not torch.equal(a.hidden.weight, c.hidden.weight)


@pytest.mark.parametrize("arch", ["mlp", "glu"])
@pytest.mark.parametrize("activation", list(NP_ACT))
def test_to_network(arch, activation):
    networks = pytest.importorskip("mlpinterp.networks")
    model = Classifier(small_cfg(arch=arch, activation=activation, d_hidden=16))
    net = model.to_network()
    assert isinstance(net, networks.MLP if arch == "mlp" else networks.GLU)
    assert net.activation == activation
    if arch == "mlp":
        np.testing.assert_array_equal(np.asarray(net.W1), model.hidden.weight.detach().double().numpy())
        np.testing.assert_array_equal(np.asarray(net.b2), model.out.bias.detach().double().numpy())
    else:
        np.testing.assert_array_equal(np.asarray(net.V), model.value.weight.detach().double().numpy())
        np.testing.assert_array_equal(np.asarray(net.W2), model.out.weight.detach().double().numpy())
    # The network container's own float64 forward pass agrees with the torch model.
    x = np.random.default_rng(2).uniform(0, 1, size=(7, 64))
    want = model.double()(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(np.asarray(net(x)), want, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def reference_run(digits, tmp_path_factory) -> Path:
    """One uninterrupted 200-step run, shared by the tests below."""
    out = tmp_path_factory.mktemp("ref")
    train_classifier(small_cfg(), digits, out, progress=False)
    return out


def test_training_writes_all_checkpoints_with_metadata(digits, reference_run):
    found = find_checkpoints(reference_run)
    assert [s for s, _ in found] == checkpoint_steps(200)
    assert sorted(p.name for p in reference_run.glob("optim_*.safetensors")) == ["optim_0000200.safetensors"]
    model, meta = load_classifier(found[-1][1], config=small_cfg())
    assert meta["step"] == 200 and meta["seed"] == 0 and meta["dataset"] == "digits"
    assert meta["config"] == small_cfg().to_dict() and meta["wall_time_s"] > 0
    # Recompute the metrics independently in float64 numpy: accuracy and mean CE in nats.
    for split in ("train", "test"):
        X, y = getattr(digits, f"X_{split}").astype(np.float64), getattr(digits, f"y_{split}")
        p = {k: v.double().numpy() for k, v in model.state_dict().items()}
        logits = np.maximum(X @ p["hidden.weight"].T + p["hidden.bias"], 0) @ p["out.weight"].T + p["out.bias"]
        acc = float(np.mean(logits.argmax(1) == y))
        ce = float(np.mean(logsumexp(logits, axis=1) - logits[np.arange(len(y)), y]))
        assert meta[f"{split}_accuracy"] == pytest.approx(acc, abs=1.5 / len(y))  # float32 ties: <= 1 example
        assert meta[f"{split}_loss"] == pytest.approx(ce, rel=1e-5)
    # Learning happened: chance is 0.1 with SE sqrt(0.09/450) = 0.014; 0.8 is > 40 SE above it.
    assert meta["test_accuracy"] > 0.8
    first = json.loads(found[0][1].with_suffix(".json").read_text())
    assert meta["test_loss"] < first["test_loss"] < math.log(10) + 0.5


def test_checkpoint_holds_schedule_free_average_of_an_independent_loop(digits, reference_run):
    """Oracle: a plain schedule-free loop, written here from the documented batch order."""
    cfg = small_cfg()
    model = Classifier(cfg)
    opt = schedulefree.AdamWScheduleFree(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps
    )
    opt.train()
    X, y = torch.tensor(digits.X_train), torch.tensor(digits.y_train)
    per_epoch = digits.n_train // cfg.batch_size
    for t in range(cfg.steps):
        epoch, j = divmod(t, per_epoch)
        perm = np.random.default_rng([cfg.seed, epoch]).permutation(digits.n_train)
        idx = torch.from_numpy(perm[j * cfg.batch_size : (j + 1) * cfg.batch_size])
        loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    opt.eval()  # x, the averaged iterate
    # Bit-identical: checkpoints in between must not perturb the trajectory.
    assert_bit_identical(state(find_checkpoints(reference_run)[-1][1]), model.state_dict())


def test_same_seed_same_weights_other_seed_differs(digits, tmp_path, reference_run):
    train_classifier(small_cfg(steps=64), digits, tmp_path / "a", progress=False)
    assert_bit_identical(
        state(tmp_path / "a" / "step_0000064.safetensors"), state(reference_run / "step_0000064.safetensors")
    )
    train_classifier(small_cfg(steps=16, seed=1), digits, tmp_path / "b", progress=False)
    a, b = (
        state(reference_run / "step_0000016.safetensors"),
        state(tmp_path / "b" / "step_0000016.safetensors"),
    )
    assert not torch.equal(a["hidden.weight"], b["hidden.weight"])


def test_resume_after_crash_is_bit_identical(digits, tmp_path, reference_run, monkeypatch):
    real = train_mod._checkpoint
    calls = []

    def crashing(*args, **kw):
        if len(calls) == 5:
            raise KeyboardInterrupt("simulated crash")
        calls.append(args[5])
        return real(*args, **kw)

    monkeypatch.setattr(train_mod, "_checkpoint", crashing)
    with pytest.raises(KeyboardInterrupt):
        train_classifier(small_cfg(), digits, tmp_path, progress=False)
    assert [s for s, _ in find_checkpoints(tmp_path)] == [16, 24, 32, 48, 64]

    resumed = []

    def counting(*args, **kw):
        resumed.append(args[5])
        return real(*args, **kw)

    monkeypatch.setattr(train_mod, "_checkpoint", counting)
    paths = train_classifier(small_cfg(), digits, tmp_path, progress=False)
    assert resumed == [96, 128, 192, 200]  # finished work is skipped
    assert [p.name for p in paths] == [f"step_{s:07d}.safetensors" for s in checkpoint_steps(200)]
    for _, p in find_checkpoints(reference_run):
        assert_bit_identical(state(tmp_path / p.name), state(p))
    meta = json.loads((tmp_path / "step_0000200.json").read_text())
    assert meta["wall_time_s"] > json.loads((tmp_path / "step_0000064.json").read_text())["wall_time_s"]
    # A finished run returns at once without training.
    resumed.clear()
    train_classifier(small_cfg(), digits, tmp_path, progress=False)
    assert resumed == []


def test_extending_steps_is_bit_identical(digits, tmp_path, reference_run):
    # 100 is not a checkpoint step of the 200-step run: the extra evaluation must not perturb training.
    train_classifier(small_cfg(steps=100), digits, tmp_path, progress=False)
    train_classifier(small_cfg(steps=200), digits, tmp_path, progress=False)
    assert_bit_identical(
        state(tmp_path / "step_0000200.safetensors"), state(reference_run / "step_0000200.safetensors")
    )


def test_out_dir_of_another_run_is_refused(digits, reference_run):
    with pytest.raises(RunConflictError, match=r"another run \(lr: saved 0.005, requested 0.001\)") as info:
        train_classifier(small_cfg(lr=1e-3), digits, reference_run, progress=False)
    assert info.value.diff == {"lr": (5e-3, 1e-3)}
    assert "lr=0.005" in info.value.fix and isinstance(info.value, ValueError)
    with pytest.raises(RunConflictError) as info:
        train_classifier(small_cfg(lr=1e-3, seed=3), digits, reference_run, progress=False)
    assert info.value.diff == {"lr": (5e-3, 1e-3), "seed": (0, 3)}


def test_checkpoints_of_an_earlier_version_resume_with_the_behaviour_of_that_time(digits, tmp_path, monkeypatch):
    """A checkpoint written before a field of ADDED_FIELDS existed (its key absent) resumes and loads with the value
    recorded there, and is refused naming the field when the request differs. ClassifierConfig has gained no field
    since its first version, so weight_decay poses as one added later (0.05 before it existed, not the default)."""
    from mlpinterp.models.config import ADDED_FIELDS

    monkeypatch.setitem(ADDED_FIELDS, "weight_decay", 0.05)
    old = small_cfg(steps=24, weight_decay=0.05)
    train_classifier(old, digits, tmp_path, progress=False)
    for path in tmp_path.glob("step_*.safetensors"):  # as an earlier version wrote them
        rewrite(path, lambda m: {**m, "config": {k: v for k, v in m["config"].items() if k != "weight_decay"}})
    (tmp_path / "run.json").unlink()  # an earlier version kept no run record
    stamp = (tmp_path / "step_0000024.safetensors").stat().st_mtime_ns
    with pytest.raises(RunConflictError, match=r"weight_decay: saved absent \(written before the field existed: "
                                               r"0.05\), requested 0.1") as info:
        train_classifier(small_cfg(steps=32), digits, tmp_path, progress=False)
    assert "weight_decay=0.05" in info.value.fix  # the value to pass, not the absent marker
    load_classifier(tmp_path / "step_0000024.safetensors", config=old)  # its config read with weight_decay 0.05
    train_classifier(old, digits, tmp_path, progress=False)  # finished: nothing trained
    assert (tmp_path / "step_0000024.safetensors").stat().st_mtime_ns == stamp
    new, real, written = small_cfg(steps=32, weight_decay=0.05), train_mod._checkpoint, []
    monkeypatch.setattr(train_mod, "_checkpoint", lambda *a, **k: written.append(a[5]) or real(*a, **k))
    train_classifier(new, digits, tmp_path, progress=False)
    assert written == [32]  # extended from step 24, not retrained
    monkeypatch.setattr(train_mod, "_checkpoint", real)
    train_classifier(new, digits, tmp_path / "direct", progress=False)
    assert_bit_identical(state(tmp_path / "step_0000032.safetensors"),
                         state(tmp_path / "direct" / "step_0000032.safetensors"))


def test_warmup_beyond_steps_is_kept_so_a_short_run_extends_bit_identically(digits, tmp_path):
    """warmup_steps > steps is used as given (never clamped to steps): 100 steps then 200 == 200 directly."""
    train_classifier(small_cfg(steps=100, warmup_steps=300), digits, tmp_path / "short", progress=False)
    meta = json.loads((tmp_path / "short" / "step_0000100.json").read_text())
    assert meta["config"]["warmup_steps"] == 300
    train_classifier(small_cfg(steps=200, warmup_steps=300), digits, tmp_path / "short", progress=False)
    train_classifier(small_cfg(steps=200, warmup_steps=300), digits, tmp_path / "direct", progress=False)
    assert_bit_identical(state(tmp_path / "short" / "step_0000200.safetensors"),
                         state(tmp_path / "direct" / "step_0000200.safetensors"))


def test_corrupt_resume_files_name_the_file_and_the_fix(digits, tmp_path):
    train_classifier(small_cfg(steps=32), digits, tmp_path, progress=False)
    (tmp_path / "step_0000032.json").write_text("{truncated")
    with pytest.raises(ValueError, match=r"step_0000032.json.*not valid JSON.*delete it"):
        train_classifier(small_cfg(steps=64), digits, tmp_path, progress=False)
    (tmp_path / "step_0000032.json").unlink()
    (tmp_path / "step_0000032.safetensors").unlink()
    train_classifier(small_cfg(steps=24), digits, tmp_path / "b", progress=False)
    optim = tmp_path / "b" / "optim_0000024.safetensors"
    optim.write_bytes(optim.read_bytes()[:40])
    with pytest.raises(ValueError, match=r"optim_0000024.safetensors.*delete it"):
        train_classifier(small_cfg(steps=64), digits, tmp_path / "b", progress=False)


def test_train_input_validation(digits, tmp_path):
    with pytest.raises(ValueError, match="does not match data"):
        train_classifier(small_cfg(d_in=65), digits, tmp_path, progress=False)
    with pytest.raises(ValueError, match="batch_size 4096 exceeds"):
        train_classifier(small_cfg(batch_size=4096), digits, tmp_path, progress=False)
    with pytest.raises(TypeError, match="cfg must be a ClassifierConfig"):
        train_classifier(small_cfg().to_dict(), digits, tmp_path, progress=False)
    with pytest.raises(TypeError, match="data must be"):
        train_classifier(small_cfg(), (digits.X_train, digits.y_train), tmp_path, progress=False)


def test_glu_trains_and_round_trips(digits, tmp_path):
    cfg = small_cfg(arch="glu", activation="identity", steps=48)
    paths = train_classifier(cfg, digits, tmp_path, progress=False)
    model, meta = load_classifier(paths[-1])
    assert model.cfg == cfg
    # Learning happened: chance is 0.1 with binomial SE sqrt(0.09 / 450) = 0.014 on the 450 test images; 48 steps
    # reach 0.85-0.88 (seeds 0-2, measured), so 0.6 is > 35 SE above chance and still leaves a wide margin.
    assert meta["test_accuracy"] > 0.6
    x = torch.tensor(digits.X_test[:5])
    # bilinear layer: W2 ((W x + b) * (V x + c)) + b2
    h = model.gate(x) * model.value(x)
    torch.testing.assert_close(model(x), model.out(h))


# --------------------------------------------------------------------------- load_classifier errors


def test_load_classifier_errors(tmp_path, reference_run):
    src = reference_run / "step_0000016.safetensors"
    dst = tmp_path / "step_0000016.safetensors"
    raw = src.read_bytes()
    meta = json.loads(src.with_suffix(".json").read_text())

    dst.with_suffix(".json").write_text(json.dumps(meta))
    dst.write_bytes(raw[: len(raw) // 2])  # truncated
    with pytest.raises(ValueError, match="not a valid safetensors"):
        load_classifier(dst)
    dst.write_bytes(b"\xff" * 8 + raw[8:])  # header length corrupted
    with pytest.raises(ValueError, match="not a valid safetensors"):
        load_classifier(dst)

    dst.write_bytes(raw)
    assert load_classifier(dst)[1]["step"] == 16
    assert load_classifier(dst.with_suffix(""))[1]["step"] == 16
    with pytest.raises(ValueError, match="config mismatch"):
        load_classifier(dst, config=small_cfg(d_hidden=33))
    bad = dict(meta, config=dict(meta["config"], d_hidden=33))
    dst.with_suffix(".json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="does not match its recorded SHA-256"):  # an edit is refused as such
        load_classifier(dst)
    rewrite(dst, bad)  # a file with that content and a valid hash: the content checks still hold
    with pytest.raises(ValueError, match="do not match its config"):
        load_classifier(dst)
    rewrite(dst, dict(meta, config=dict(meta["config"], arch="rnn")))
    with pytest.raises(ValueError, match="arch must be one of"):
        load_classifier(dst)
    rewrite(dst, {"step": 16})
    with pytest.raises(ValueError, match="no 'config'"):
        load_classifier(dst)
    dst.with_suffix(".json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_classifier(dst)
    dst.with_suffix(".json").unlink()
    with pytest.raises(FileNotFoundError, match="metadata"):
        load_classifier(dst)
    with pytest.raises(FileNotFoundError):
        load_classifier(tmp_path / "step_9999999.safetensors")
