"""Toy targets: data distribution, forwards against numpy formulas, ground truths, training, save/load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlpinterp.toys import (
    TMS,
    ResidMLPConfig,
    TMSConfig,
    build_gated_trig,
    build_resid_mlp,
    gated_trig_ground_truth,
    gated_trig_inputs,
    load_toy,
    neuron_contributions,
    resid_labels,
    save_toy,
    sparse_features,
    step_generator,
    tms_ground_truth,
    train_resid_mlp,
    train_tms,
    trig_functions,
)
from mlpinterp.toys.gated_trig import X_RANGE

torch.set_num_threads(1)


def test_sparse_features_probability_and_range():
    n, f, p = 20_000, 10, 0.05
    x = sparse_features(n, f, p, (-1.0, 1.0), generator=step_generator(0, 0))
    active = (x != 0).float().mean().item()
    se = np.sqrt(p * (1 - p) / (n * f))  # binomial standard error of the active fraction
    assert abs(active - p) < 5 * se
    assert x.min() >= -1.0 and x.max() <= 1.0
    vals = x[x != 0]
    # U[-1, 1] has mean 0 and variance 1/3; check the mean within 5 standard errors
    assert abs(vals.mean().item()) < 5 * np.sqrt(1 / 3 / vals.numel())
    assert torch.equal(x, sparse_features(n, f, p, (-1.0, 1.0), generator=step_generator(0, 0)))
    assert not torch.equal(x, sparse_features(n, f, p, (-1.0, 1.0), generator=step_generator(0, 1)))


@pytest.mark.parametrize("kw", [dict(n=0), dict(feature_probability=0.0), dict(feature_probability=1.5),
                                dict(value_range=(1.0, 1.0))])
def test_sparse_features_bad_args(kw):
    args = dict(n=4, n_features=3, feature_probability=0.5)
    args.update(kw)
    with pytest.raises(ValueError):
        sparse_features(**args)


def test_tms_forward_matches_numpy_and_ground_truth_sums():
    torch.manual_seed(0)
    m = TMS(5, 2)
    with torch.no_grad():
        m.b.normal_()
    x = torch.rand(7, 5)
    W, b = m.W.detach().double().numpy(), m.b.detach().double().numpy()
    expect = np.maximum(x.double().numpy() @ W.T @ W + b, 0.0)
    np.testing.assert_allclose(m(x).detach().double().numpy(), expect, atol=1e-6)
    A, B = tms_ground_truth(m)
    Z = A @ B  # [5, 2, 5]
    torch.testing.assert_close(Z.sum(0), m.W.detach())
    for c in range(5):
        assert torch.linalg.matrix_rank(Z[c]) == 1
        assert torch.count_nonzero(Z[c][:, [j for j in range(5) if j != c]]) == 0


def test_train_tms_improves_and_picks_best_instance():
    cfg = TMSConfig(n_features=5, d_hidden=2, steps=300, batch_size=256, n_instances=3, seed=1)
    model, info = train_tms(cfg, quiet=True)
    assert info["instance"] == int(np.argmin(info["instance_losses"]))
    x = sparse_features(5000, 5, 0.05, generator=step_generator(9, 0))
    untrained = TMS(5, 2)
    with torch.no_grad():
        trained_loss = ((model(x) - x) ** 2).mean()
        base_loss = ((untrained(x) - x) ** 2).mean()
    assert trained_loss < base_loss


def test_resid_mlp_forward_and_labels():
    cfg = ResidMLPConfig(n_features=12, d_embed=40, d_mlp=6, n_layers=2)
    m = build_resid_mlp(cfg)
    torch.testing.assert_close(m.W_E.norm(dim=1), torch.ones(12))
    x = sparse_features(9, 12, 0.3, (-1.0, 1.0), generator=step_generator(0, 0))
    r = x.double() @ m.W_E.double()
    for layer in m.layers:
        h = torch.relu(r @ layer.mlp_in.weight.double().T + layer.mlp_in.bias.double())
        r = r + h @ layer.mlp_out.weight.double().T + layer.mlp_out.bias.double()
    torch.testing.assert_close(m(x).double(), r @ m.W_E.double().T, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(resid_labels(torch.tensor([-0.5, 0.0, 0.5])), torch.tensor([-0.5, 0.0, 1.0]))
    nc = neuron_contributions(m)
    assert nc.shape == (12, 12)
    # hand formula for feature 3, layer 0
    l0 = m.layers[0]
    expect = (m.W_E[3] @ l0.mlp_out.weight) * (l0.mlp_in.weight @ m.W_E[3])
    torch.testing.assert_close(nc[3, :6], expect.detach())


def test_train_resid_mlp_lowers_loss():
    cfg = ResidMLPConfig(n_features=20, d_embed=64, d_mlp=10, steps=300, batch_size=256, lr=1e-2)
    x = sparse_features(4000, 20, 0.01, (-1.0, 1.0), generator=step_generator(5, 0))
    with torch.no_grad():
        base = float(((build_resid_mlp(cfg)(x) - resid_labels(x)) ** 2).mean())
    _, info = train_resid_mlp(cfg, quiet=True)
    assert info["loss"] < base


def test_gated_trig_matches_piecewise_interpolant():
    model, info = build_gated_trig(n_functions=4, neurons_per_function=10, n_layers=2, seed=3)
    coeffs = np.array(info["coefficients"])
    inp = gated_trig_inputs(500, 4, p=0.5, generator=step_generator(0, 0))
    x = inp[:, 0].double().numpy()
    knots = np.linspace(*X_RANGE, 10)
    interp = np.stack([np.interp(x, knots, trig_functions(knots, coeffs)[:, i]) for i in range(4)], axis=1)
    expect = (interp * inp[:, 1:].double().numpy()).sum(1)
    np.testing.assert_allclose(model(inp)[:, 0].detach().double().numpy(), expect, atol=1e-4)
    # piecewise-linear interpolation error: h^2/8 max|F''| <= h^2/8 (|a| b^2 + |d| e^2) <= h^2/4 per function,
    # so at most 4 * h^2/4 when all four control bits are on
    h = knots[1] - knots[0]
    true = (trig_functions(x, coeffs) * inp[:, 1:].double().numpy()).sum(1)
    assert np.abs(expect - true).max() <= 4 * h**2 / 4 + 1e-9


def test_gated_trig_ground_truth_partitions_weights():
    model, info = build_gated_trig(seed=0)
    gt = gated_trig_ground_truth(model)
    owner = np.array(info["owner"])
    for name, comps in gt.items():
        layer = int(name.split(".")[1])
        torch.testing.assert_close(comps.sum(0), model.get_submodule(name).weight.detach())
        for i in range(4):
            own = torch.from_numpy(owner[layer] == i)
            w = comps[i]
            other = w[~own] if name.endswith("mlp_in") else w[:, ~own]
            assert torch.count_nonzero(other) == 0


def test_save_load_round_trip_and_errors(tmp_path):
    models = [TMS(5, 2), build_resid_mlp(ResidMLPConfig(n_features=8, d_embed=16, d_mlp=4)), build_gated_trig()[0]]
    for i, m in enumerate(models):
        path = save_toy(m, tmp_path / f"m{i}", {"note": i})
        loaded, meta = load_toy(path)
        assert meta["info"]["note"] == i
        x = torch.rand(3, 5 if i != 1 else 8)
        torch.testing.assert_close(loaded(x), m(x))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a valid safetensors"):
        load_toy(bad)
    from mlpinterp.utils.artifact import save_artifact

    save_artifact(tmp_path / "odd", {"W": torch.zeros(2, 2)}, kind="toy_target", meta={"kind": "mystery", "arch": {}})
    with pytest.raises(ValueError, match="unknown toy kind"):
        load_toy(tmp_path / "odd.safetensors")
    with pytest.raises(TypeError, match="model must be"):
        save_toy(torch.nn.Linear(2, 2), tmp_path / "lin")
