"""MMCS / ML2R, activation frequency, per-feature MSE and scrubbing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlpinterp.apd import activation_frequency, per_feature_mse, responsible_components, scrubbing, topk_mask
from mlpinterp.paramspace import Components, mmcs_ml2r, resolve_sites
from mlpinterp.toys import TMS, sparse_features, step_generator, tms_ground_truth

torch.set_num_threads(1)
# torch's first forward-mode AD call scripts its jvp decompositions with the deprecated torch.jit.script
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


@pytest.fixture()
def tms_gt(tms52_target):
    model = tms52_target.requires_grad_(False)
    A, B = tms_ground_truth(model)
    comps = Components.from_weights(resolve_sites(model, ["W"]), {"W": A @ B})
    return model, comps


def test_ground_truth_scores_one(tms_gt):
    model, comps = tms_gt
    mmcs, ml2r, mcs = mmcs_ml2r(model.W, comps.weights()["W"])
    assert mmcs == pytest.approx(1.0, abs=1e-6)
    assert ml2r == pytest.approx(1.0, abs=1e-6)
    assert list(mcs) == list(range(5))


def test_mmcs_ml2r_hand():
    W = np.eye(2)
    P = np.zeros((2, 2, 2))
    P[0, :, 0] = [1.0, 1.0]  # cos 1/sqrt2 with e1, norm sqrt2
    P[1, :, 0] = [0.0, 3.0]  # cos 0
    P[1, :, 1] = [0.0, 0.5]  # cos 1 with e2, norm 0.5
    mmcs, ml2r, mcs = mmcs_ml2r(W, P)
    assert mmcs == pytest.approx((1 / np.sqrt(2) + 1.0) / 2)
    assert ml2r == pytest.approx((np.sqrt(2) + 0.5) / 2)
    assert list(mcs) == [0, 1]
    with pytest.raises(ValueError, match="shape"):
        mmcs_ml2r(W, P[:, :1])
    with pytest.raises(ValueError, match="zero columns"):
        mmcs_ml2r(np.zeros((2, 2)), P)
    with pytest.raises(ValueError, match="non-finite"):
        mmcs_ml2r(W * np.nan, P)


def test_frequency_responsible_and_per_feature(tms_gt):
    model, comps = tms_gt
    batches = [sparse_features(256, 5, 0.2, generator=step_generator(0, i)) for i in range(2)]
    freq = activation_frequency(model, comps, batches, lambda a: topk_mask(a, 1))
    assert freq.shape == (5,) and freq.sum() == pytest.approx(1.0)
    assert list(responsible_components(model, comps, 5)) == list(range(5))
    # with one active feature and the ground-truth component selected, the sparse forward drops only the
    # interference of the other columns; its MSE must be below that of ablating everything (output ReLU(b))
    pf = per_feature_mse(model, comps, 5, value_range=(0.0, 1.0), n_per_feature=100)
    x = torch.eye(5) * 0.5
    ablate_all = float(((torch.relu(model.b).expand(5, 5) - model(x)) ** 2).mean())
    assert pf.shape == (5,) and pf.max() < ablate_all


def test_scrubbing_separates(tms_gt):
    model, comps = tms_gt
    x = sparse_features(400, 5, 0.1, generator=step_generator(1, 0))
    x = x[(x != 0).any(1)]
    res = scrubbing(model, comps, x, np.arange(5), lambda a: topk_mask(a, 1))
    s = res.summary()
    assert s["scrubbed_mse"] < s["anti_scrubbed_mse"] / 5
    assert res.scrubbed.shape == (x.shape[0],)


def test_unused_model_type():
    with pytest.raises(ValueError):
        resolve_sites(TMS(3, 2), ["b"])
