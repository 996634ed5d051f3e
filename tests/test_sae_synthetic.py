"""Synthetic data generator vs theory: per-sample actives, group structure, successive-sampling probabilities."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from mlpinterp.sae.synthetic import SyntheticConfig, SyntheticData


def _exact_inclusion(weights: np.ndarray, k: int) -> np.ndarray:
    """P(feature j among the k drawn) for successive sampling without replacement, by enumerating every
    ordered k-sequence: P(a_1..a_k) = prod_t w_{a_t} / (W - sum_{s<t} w_{a_s})."""
    p = np.zeros(len(weights))
    for seq in itertools.permutations(range(len(weights)), k):
        prob, rest = 1.0, weights.sum()
        for a in seq:
            prob *= weights[a] / rest
            rest -= weights[a]
        for a in seq:
            p[a] += prob
    return p


def test_structure_of_every_sample():
    data = SyntheticData(SyntheticConfig(n_features=64, d=16, n_groups=5, k_active=4, seed=3))
    b = data.batch(0, 2000)
    assert b.x.shape == (2000, 16) and b.indices.shape == (2000, 4)
    # K distinct features per sample, all from the sample's group
    assert (b.indices.sort(1).values.diff(dim=1) > 0).all()
    assert (data.group_of[b.indices] == b.group[:, None]).all()
    assert ((b.coefs > 0) & (b.coefs < 1)).all()
    torch.testing.assert_close(b.x, torch.einsum("bk,bkd->bd", b.coefs.double(), data.features[b.indices].double()).float())
    torch.testing.assert_close(data.features.norm(dim=1), torch.ones(64))
    # 64 features in 5 groups: array_split sizes 13,13,13,13,12
    assert data.group_sizes.tolist() == [13, 13, 13, 13, 12]


def test_group_frequencies_and_coefficient_moments_match_theory():
    cfg = SyntheticConfig(n_features=48, d=8, n_groups=12, k_active=3, seed=1)
    data = SyntheticData(cfg)
    n = 24000
    b = data.batch(5, n)
    counts = torch.bincount(b.group, minlength=12).double().numpy()
    p = 1 / 12
    se = np.sqrt(n * p * (1 - p))  # binomial standard error of each group count
    assert np.all(np.abs(counts - n * p) < 5 * se)
    c = b.coefs.double().numpy().ravel()
    assert abs(c.mean() - 0.5) < 5 * np.sqrt(1 / 12 / c.size)  # U(0,1): mean 1/2, variance 1/12
    assert abs(c.var() - 1 / 12) < 5 * np.sqrt((1 / 80 - 1 / 144) / c.size)  # Var((U-1/2)^2) = 1/80 - 1/144


def test_within_group_inclusion_probabilities_match_successive_sampling():
    cfg = SyntheticConfig(n_features=10, d=4, n_groups=2, decay=0.6, k_active=2, seed=7)
    data = SyntheticData(cfg)
    n = 30000
    b = data.batch(0, n)
    in_group0 = b.group == 0
    n0 = int(in_group0.sum())
    hits = torch.bincount(b.indices[in_group0].reshape(-1), minlength=10)[:5].double().numpy()
    exact = _exact_inclusion(0.6 ** np.arange(5), 2)
    assert exact.sum() == pytest.approx(2.0)
    se = np.sqrt(exact * (1 - exact) / n0)
    np.testing.assert_array_less(np.abs(hits / n0 - exact), 5 * se)
    # the decay must matter: feature 0 is clearly more frequent than feature 4
    assert exact[0] - exact[4] > 10 * se.max()


def test_stream_is_deterministic_resumable_and_per_sample():
    data = SyntheticData(SyntheticConfig(n_features=24, d=8, n_groups=3, k_active=2, seed=0))
    a = list(data.stream(16, n_batches=4))
    b = list(SyntheticData(SyntheticConfig(n_features=24, d=8, n_groups=3, k_active=2, seed=0)).stream(16, 2, start=2))
    torch.testing.assert_close(a[2], b[0])
    torch.testing.assert_close(a[3], b[1])
    assert not torch.equal(a[0], a[1])
    other = SyntheticData(SyntheticConfig(n_features=24, d=8, n_groups=3, k_active=2, seed=1)).batch(0, 16)
    assert not torch.equal(other.x, a[0])
    # active sets vary within a batch (per-sample sampling, not one set per chunk)
    batch = data.batch(0, 64)
    assert len({tuple(sorted(r)) for r in batch.indices.tolist()}) > 20


def test_bad_config():
    with pytest.raises(ValueError, match="k_active must be <= the smallest group size 42"):
        SyntheticConfig(n_features=512, n_groups=12, k_active=43)
    with pytest.raises(ValueError, match=r"decay must be in \(0, 1\]"):
        SyntheticConfig(decay=1.5)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        SyntheticData(SyntheticConfig(n_features=24, d=4, n_groups=3, k_active=2)).batch(0, 0)
