"""The one seeding scheme (mlpinterp.utils.seeding): SeedSequence child streams per (seed, *keys)."""

import numpy as np
import pytest
import torch

from mlpinterp.utils.seeding import child_seed, numpy_rng, seed_sequence, torch_generator


def test_numpy_rng_is_numpys_list_form():
    # the oracle: numpy's own SeedSequence over the same list
    assert np.array_equal(numpy_rng(3, 5).random(8), np.random.default_rng([3, 5]).random(8))
    assert np.array_equal(numpy_rng(7).integers(0, 100, 8), np.random.default_rng(7).integers(0, 100, 8))


def test_streams_are_pure_and_distinct():
    a = torch.rand(6, generator=torch_generator(0, "step", 4))
    assert torch.equal(a, torch.rand(6, generator=torch_generator(0, "step", 4)))
    others = [torch_generator(1, "step", 4), torch_generator(0, "step", 5), torch_generator(0, "held-out"),
              torch_generator(0, "step", -4), torch_generator(0, 4)]
    assert len({child_seed(0, "step", 4), *(g.initial_seed() for g in others)}) == 6
    assert all(not torch.equal(a, torch.rand(6, generator=g)) for g in others)
    assert 0 <= child_seed(-5, "x", -1) < 2**63


def test_strings_never_equal_small_ints():
    assert seed_sequence(0, "a").entropy != seed_sequence(0, ord("a")).entropy
    assert seed_sequence(0, -1).entropy == seed_sequence(0, "-1").entropy  # a negative int is its decimal string


def test_nearby_seeds_are_uncorrelated():
    # streams of consecutive seeds: sample correlation of 20,000 normals within 5 s.e. (1 / sqrt(n)) of 0
    n = 20_000
    x = [numpy_rng(s, "batch").standard_normal(n) for s in range(4)]
    for i in range(3):
        assert abs(np.corrcoef(x[i], x[i + 1])[0, 1]) < 5 / np.sqrt(n)


@pytest.mark.parametrize("bad", [1.5, True, None, b"x"])
def test_bad_keys_raise(bad):
    with pytest.raises(TypeError, match="must be an int or a str"):
        child_seed(0, bad)
    with pytest.raises(TypeError, match="seed must be"):
        child_seed("0")
