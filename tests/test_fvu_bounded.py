"""FVU in bounded memory (poly.metrics, poly.fvu_exact, utils.memory).

Oracles: the FVU of stored samples (``fvu_from_outputs`` on the same draws, concatenated) for the streamed Monte
Carlo estimate; the unblocked sums (one block of all rows) for the blocked exact FVU; for the memory refusal, the
allocation routes replaced by functions that fail the test if they are reached.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mlpinterp as mi
from mlpinterp.poly import fvu_exact
from mlpinterp.poly.metrics import fvu_from_outputs
from mlpinterp.utils import memory


def _mlp(d=5, h=23, o=3, act="gelu", seed=0):
    rng = np.random.default_rng(seed)
    return mi.MLP(rng.standard_normal((h, d)) / np.sqrt(d), 0.3 * rng.standard_normal(h),
                  rng.standard_normal((o, h)) / np.sqrt(h), 0.1 * rng.standard_normal(o), activation=act)


def _glu(d=5, h=17, o=3, seed=1):
    rng = np.random.default_rng(seed)
    return mi.GLU(rng.standard_normal((h, d)) / np.sqrt(d), 0.2 * rng.standard_normal(h),
                  rng.standard_normal((h, d)) / np.sqrt(d), 0.2 * rng.standard_normal(h),
                  rng.standard_normal((o, h)) / np.sqrt(h), np.zeros(o), activation="silu")


def _gaussian(d=5, seed=2):
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((d, d))
    return mi.Gaussian(rng.standard_normal(d), M @ M.T / d + 0.1 * np.eye(d))


@pytest.mark.parametrize("make", [_mlp, _glu])
def test_streamed_monte_carlo_equals_the_stored_samples(make):
    net, g = make(), _gaussian()
    p = mi.fit_polynomial(net, g, 1)
    n, chunk = 5000, 700  # 8 chunks, the last one short
    got = mi.fvu(net, p, g, method="monte-carlo", n_samples=n, seed=3, chunk_size=chunk)
    rng = np.random.default_rng(3)
    X = np.concatenate([g.sample(min(chunk, n - s), rng) for s in range(0, n, chunk)])
    ref = fvu_from_outputs(net(X), p(X))
    assert got.method == "monte-carlo" and got.n_samples == n
    np.testing.assert_allclose(got.fvu, ref.fvu, rtol=1e-10)
    np.testing.assert_allclose(got.per_output, ref.per_output, rtol=1e-10)
    np.testing.assert_allclose(got.per_output_stderr, ref.per_output_stderr, rtol=1e-8)
    # the pooled error uses deviations about the first chunk's mean: a second-order difference
    np.testing.assert_allclose(got.stderr, ref.stderr, rtol=2e-2)


def test_streamed_monte_carlo_one_chunk_is_the_stored_estimate_exactly():
    net, g = _glu(), _gaussian()
    p = mi.fit_polynomial(net, g, 2)
    got = mi.fvu(net, p, g, method="monte-carlo", n_samples=3000, seed=5, chunk_size=3000)
    X = g.sample(3000, np.random.default_rng(5))
    ref = fvu_from_outputs(net(X), p(X))
    np.testing.assert_allclose([got.fvu, got.stderr], [ref.fvu, ref.stderr], rtol=1e-9)


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_exact_mlp_fvu_blocked_equals_unblocked(degree):
    net, g = _mlp(h=29), _gaussian()
    p = mi.fit_polynomial(net, g, degree)
    out = {}
    for chunk in (29, 4, 7):
        fvu_exact._NETWORK_CACHE.clear()  # the network-only sums are cached per network: recompute them
        out[chunk] = mi.fvu(net, p, g, method="exact", chunk_size=chunk)
    for chunk in (4, 7):
        # to 1e-12 in FVU units (a fraction); the blocks differ only in the order of additions and in the Mehler
        # truncation order chosen per block, both far inside the reported error bound
        assert abs(out[chunk].fvu - out[29].fvu) <= 1e-12
        np.testing.assert_allclose(out[chunk].per_output, out[29].per_output, rtol=0, atol=1e-12)
        assert out[29].error_bound < 1e-8
    mc = mi.fvu(net, p, g, method="monte-carlo", n_samples=200_000, seed=0)
    assert abs(out[4].fvu - mc.fvu) <= 5 * mc.stderr  # and the value itself against sampling


def test_memory_refusal_comes_before_the_exact_products(monkeypatch):
    net, g = _mlp(), _gaussian()
    p = mi.fit_polynomial(net, g, 2)
    fvu_exact._NETWORK_CACHE.clear()

    def reached(*a, **k):
        raise AssertionError("the bivariate block was computed before the memory check")

    import mlpinterp.gaussian.bivariate as bivariate

    monkeypatch.setattr(bivariate, "gauss_product_ev", reached)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1000)
    with pytest.raises(memory.InsufficientMemoryError, match=r"needs about .* only 1.0 kB .*chunk_size"):
        mi.fvu(net, p, g, method="exact")


def test_memory_refusal_comes_before_sampling(monkeypatch):
    net, g = _glu(), _gaussian()
    p = mi.fit_polynomial(net, g, 2)

    def reached(*a, **k):
        raise AssertionError("samples were drawn before the memory check")

    monkeypatch.setattr(mi.Gaussian, "sample", reached)
    monkeypatch.setattr(memory, "available_bytes", lambda: 10_000)
    with pytest.raises(MemoryError, match="Monte Carlo FVU chunk needs about"):
        mi.fvu(net, p, g, n_samples=1000, chunk_size=500)


def test_chunk_rows_follows_the_budget_and_refuses_below_the_minimum(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**9)
    assert memory.chunk_rows(1000.0, "x", "y", budget=10**6) == 1000
    assert memory.chunk_rows(1000.0, "x", "y", budget=10**6, maximum=10) == 10
    with pytest.raises(memory.InsufficientMemoryError, match="x needs about 1.0 GB.*y$"):
        memory.chunk_rows(1e9, "x", "y", budget=10)
    memory.require(0.5 * memory.USABLE_FRACTION * 1e9, "fits", "")


def test_exact_fvu_with_a_bound_above_its_value_falls_back_to_monte_carlo():
    net = _mlp(d=4, h=32, o=2)
    g = mi.Gaussian(np.zeros(4), 1e-16 * np.eye(4))  # the bivariate integrals lose their digits here
    p = mi.fit_polynomial(net, g, 2)
    fvu_exact._NETWORK_CACHE.clear()
    with pytest.warns(RuntimeWarning, match="error bound .* larger than itself.*Monte Carlo"):
        r = mi.fvu(net, p, g, n_samples=20_000)
    assert r.method == "monte-carlo"
    mc = mi.fvu(net, p, g, method="monte-carlo", n_samples=20_000)
    assert r.fvu == mc.fvu
    with pytest.warns(RuntimeWarning, match="larger than itself"):
        assert mi.fvu(net, p, g, method="exact").method == "exact"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a well-scaled Gaussian: exact, no warning
        assert mi.fvu(net, p := mi.fit_polynomial(net, _gaussian(4), 2), _gaussian(4)).method == "exact"
