"""The one hybrid fine-tune loop (poly.finetune) and its one config, with either data source.

Oracles: least squares solved by numpy (a linear model fine-tuned on arrays or on samples reaches it), the
validation FVU recomputed directly from the returned weights, and seeded reruns.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import mlpinterp as mi
from mlpinterp.poly.finetune import ArrayBatches, SampledBatches, Validation, finetune
from mlpinterp.poly.finetune_config import ADDED_FIELDS, FinetuneConfig
from mlpinterp.studies.transformer.settings import ADDED_FIELDS as TRANSFORMER_ADDED_FIELDS
from mlpinterp.studies.transformer.settings import TransformerExperiment
from mlpinterp.utils.config_diff import config_diff


def _problem(seed=0, n=4000, d=4, o=2):
    rng = np.random.default_rng(seed)
    A, c = rng.standard_normal((o, d)), rng.standard_normal(o)
    X = rng.standard_normal((n, d))
    Y = X @ A.T + c + 0.1 * rng.standard_normal((n, o))
    return X, Y


def _lstsq(X, Y):
    Z = np.hstack([X, np.ones((X.shape[0], 1))])
    W = np.linalg.lstsq(Z, Y, rcond=None)[0]
    return W[:-1].T, W[-1]


def _linear(d, o):
    torch.manual_seed(0)
    return nn.Linear(d, o).double()


@pytest.mark.parametrize("optimizer,lr", [("adamw", 0.05), ("sgd", 0.05)])
def test_fine_tune_on_arrays_reaches_least_squares(optimizer, lr):
    X, Y = _problem()
    A, c = _lstsq(X, Y)
    model = _linear(4, 2)
    cfg = FinetuneConfig(steps=1500, batch_size=256, lr=lr, warmup_steps=0, eval_every=500, optimizer=optimizer)
    run = finetune(model, ArrayBatches(torch.as_tensor(X), torch.as_tensor(Y), cfg.batch_size, cfg.seed), cfg)
    assert run.steps == 1500 and run.history == [] and run.best_step is None
    np.testing.assert_allclose(model.weight.detach().numpy(), A, atol=0.02)
    np.testing.assert_allclose(model.bias.detach().numpy(), c, atol=0.02)


def test_fine_tune_on_samples_reaches_the_population_optimum():
    """Fresh samples of a Gaussian, targets from a linear network: the fine-tune reaches the network's own weights."""
    rng = np.random.default_rng(1)
    d, o = 3, 2
    A, c = rng.standard_normal((o, d)), rng.standard_normal(o)

    def net(X):
        return X @ A.T + c

    g = mi.Gaussian(np.ones(d), np.eye(d))
    model = _linear(d, o)
    cfg = FinetuneConfig(steps=1500, batch_size=128, lr=0.05, warmup_steps=0, eval_every=300)
    Xv = g.sample(2000, np.random.default_rng(2))
    val = Validation(torch.as_tensor(Xv), torch.as_tensor(net(Xv)))
    run = finetune(model, SampledBatches(net, g, cfg.batch_size, cfg.seed, device="cpu", dtype=torch.float64), cfg,
                   validation=val)
    np.testing.assert_allclose(model.weight.detach().numpy(), A, atol=1e-2)
    np.testing.assert_allclose(model.bias.detach().numpy(), c, atol=1e-2)
    assert [h["step"] for h in run.history] == [0, 300, 600, 900, 1200, 1500]
    assert run.history[-1]["fvu"] < 1e-4 * run.history[0]["fvu"]


def test_best_step_is_kept_with_the_last_and_its_fvu_is_the_recorded_one():
    X, Y = _problem(3, n=600)
    A, c = _lstsq(X, Y)
    Xv = _problem(4, n=300)[0]
    Yv = Xv @ A.T + c
    model = nn.Linear(4, 2).double()
    with torch.no_grad():  # start at the least-squares optimum: a large step size can only degrade it
        model.weight.copy_(torch.as_tensor(A))
        model.bias.copy_(torch.as_tensor(c))
    cfg = FinetuneConfig(steps=30, batch_size=16, lr=0.5, warmup_steps=0, eval_every=10)
    val = Validation(torch.as_tensor(Xv), torch.as_tensor(Yv))
    run = finetune(model, ArrayBatches(torch.as_tensor(X), torch.as_tensor(Y), 16, 0), cfg, validation=val,
                   keep_best=True)
    fvus = {h["step"]: h["fvu"] for h in run.history}
    assert run.best_step == min(fvus, key=fvus.get) == 0 and fvus[30] > fvus[0]
    last = val.fvu(model)
    assert last == pytest.approx(fvus[30], rel=1e-12)
    model.load_state_dict(run.best_state)
    direct = float(((model(torch.as_tensor(Xv)).detach().numpy() - Yv) ** 2).sum() / ((Yv - Yv.mean(0)) ** 2).sum())
    assert direct == pytest.approx(fvus[0], rel=1e-9)


def test_deterministic_given_the_seed_and_seed_matters():
    X, Y = _problem(4)
    weights = []
    for seed in (0, 0, 1):
        model = _linear(4, 2)
        cfg = FinetuneConfig(steps=50, batch_size=32, lr=0.01, seed=seed)
        finetune(model, ArrayBatches(torch.as_tensor(X), torch.as_tensor(Y), 32, seed), cfg)
        weights.append(model.weight.detach().numpy().copy())
    np.testing.assert_array_equal(weights[0], weights[1])
    assert not np.array_equal(weights[0], weights[2])


def test_stopping_rules():
    X, Y = _problem(5)
    val = Validation(torch.as_tensor(X[:500]), torch.as_tensor(Y[:500]))
    batches = ArrayBatches(torch.as_tensor(X), torch.as_tensor(Y), 64, 0)
    run = finetune(_linear(4, 2), batches, FinetuneConfig(steps=100), validation=val, target_fvu=10.0)
    assert run.steps == 0 and run.time_to_target == 0.0  # the start is already there: no step
    run = finetune(_linear(4, 2), batches, FinetuneConfig(steps=10**6, eval_every=10), validation=val,
                   time_limit=0.05)
    assert 0 < run.steps < 10**6 and run.history[-1]["step"] == run.steps and run.seconds >= 0.05
    with pytest.raises(ValueError, match="need a validation set"):
        finetune(_linear(4, 2), batches, FinetuneConfig(steps=1), target_fvu=0.1)
    with pytest.raises(TypeError, match="cfg must be a FinetuneConfig"):
        finetune(_linear(4, 2), batches, {"steps": 1})


def test_divergence_is_an_error_naming_the_step_and_lr():
    X, Y = _problem(6)
    batches = ArrayBatches(torch.as_tensor(X), torch.as_tensor(1e300 * Y), 64, 0)
    with pytest.raises(ValueError, match=r"readout fine-tuning diverged at step 1 .*lower lr \(got 0.001\)"):
        finetune(_linear(4, 2), batches, FinetuneConfig(steps=5), what="readout fine-tuning")


def test_config_checks_each_field():
    with pytest.raises(ValueError, match="optimizer must be one of"):
        FinetuneConfig(optimizer="lbfgs")
    with pytest.raises(ValueError, match="momentum"):
        FinetuneConfig(momentum=1.0)
    with pytest.raises(ValueError, match="steps"):
        FinetuneConfig(steps=0)


def test_transformer_run_written_before_the_optimizer_fields_resumes_and_other_requests_are_refused():
    """A config.json whose hybrid lacks the fields added with the merged loop compares as schedule-free AdamW."""
    from dataclasses import asdict, replace

    now = asdict(TransformerExperiment())
    old = {**now, "hybrid": {k: v for k, v in now["hybrid"].items() if k not in ADDED_FIELDS}}
    assert config_diff(old, now, implicit=TRANSFORMER_ADDED_FIELDS) == {}
    assert set(config_diff(old, now)) == {"hybrid"}  # without the implicit values it would be refused
    sgd = asdict(replace(TransformerExperiment(), hybrid=FinetuneConfig(optimizer="sgd")))
    assert set(config_diff(old, sgd, implicit=TRANSFORMER_ADDED_FIELDS)) == {"hybrid"}
    steps = asdict(replace(TransformerExperiment(), hybrid=FinetuneConfig(steps=7)))
    assert set(config_diff(old, steps, implicit=TRANSFORMER_ADDED_FIELDS)) == {"hybrid"}
