"""The exact MLP FVU as Hermite tails of the network's output covariance (poly.mehler_tails, poly.fvu_exact).

Oracles: tensor Gauss-Hermite quadrature of E[(phi(y_i) - h_i(u_i)) (phi(y_j) - h_j(u_j))] on every neuron pair
(no Mehler series; smooth activations, where the rule converges to rounding); the general route (Cov(f, p) and
Var(p) as separate Mehler sums of p's own directions); the unblocked sums; Monte Carlo with its standard error.
"""

from __future__ import annotations

import numpy as np
import pytest

import mlpinterp as mi
from mlpinterp.gaussian.hermite import hermite_he
from mlpinterp.poly import fvu_exact, mehler_tails
from mlpinterp.poly.approximant import RidgePolynomial


def _mlp(d, h, o, act, seed, duplicate=False, dead=False):
    rng = np.random.default_rng(seed)
    W1 = rng.standard_normal((h, d)) / np.sqrt(d)
    if duplicate:  # near-duplicate and anti-parallel neurons: |rho| close to 1, evaluated pair by pair
        W1[1] = W1[0] + 0.02 * rng.standard_normal(d) / np.sqrt(d)
        W1[2] = -1.3 * W1[3]
    if dead:  # a constant neuron (zero pre-activation variance)
        W1[4] = 0.0
    return mi.MLP(W1, 0.3 * rng.standard_normal(h), rng.standard_normal((o, h)) / np.sqrt(h),
                  0.1 * rng.standard_normal(o), activation=act)


def _gaussian(d, seed, rank=None):
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((d, rank or d))
    return mi.Gaussian(0.3 * rng.standard_normal(d), M @ M.T / d + (0.0 if rank else 0.1) * np.eye(d))


def _quadrature_fvu(net, p, g, nodes=160):
    """Pooled FVU by tensor Gauss-Hermite on each pair (u_i, u_j) of standardised pre-activations."""
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    WL = net.W1 @ g.factor
    m, s = net.W1 @ g.mean + net.b1, np.sqrt((WL**2).sum(1))
    R = np.clip(WL @ WL.T / np.outer(s, s), -1, 1)
    W = np.outer(w, w)
    h = net.d_hidden
    C, E = np.zeros((h, h)), np.zeros((h, h))
    for i in range(h):
        for j in range(i, h):
            u1 = x[:, None] + 0 * x[None, :]
            u2 = R[i, j] * x[:, None] + np.sqrt(1 - R[i, j] ** 2) * x[None, :]
            fi, fj = net.act.fn(m[i] + s[i] * u1), net.act.fn(m[j] + s[j] * u2)
            ri = fi - (hermite_he(p.degree, u1) * p.D[i]).sum(-1)
            rj = fj - (hermite_he(p.degree, u2) * p.D[j]).sum(-1)
            C[i, j] = C[j, i] = (W * fi * fj).sum() - (W * fi).sum() * (W * fj).sum()
            E[i, j] = E[j, i] = (W * ri * rj).sum()
    var = np.einsum("oi,ij,oj->o", net.W2, C, net.W2)
    mse = np.einsum("oi,ij,oj->o", net.W2, E, net.W2) + (net.b2 - p.b2) ** 2
    return mse.sum() / var.sum(), mse / var


@pytest.mark.parametrize(("act", "duplicate"), [("sigmoid", False), ("gelu_tanh", True)])
def test_exact_fvu_equals_pairwise_quadrature(act, duplicate):
    net, g = _mlp(5, 14, 2, act, seed=0, duplicate=duplicate), _gaussian(5, seed=1)
    for n in (1, 2, 3):
        p = mi.fit_polynomial(net, g, n)
        r = mi.fvu(net, p, g, method="exact")
        ref, ref_per = _quadrature_fvu(net, p, g)
        assert r.error_bound < 1e-10
        assert abs(r.fvu - ref) <= r.error_bound + 1e-13, (n, r.fvu, ref, r.error_bound)
        np.testing.assert_allclose(r.per_output, ref_per, rtol=1e-10)


def _general(net, p, g, chunk_size=None):
    """The same FVU through the general route (p's directions treated as any standard-normal directions)."""
    layout = fvu_exact.exact_layout(net, p, g)
    return fvu_exact.fvu_exact_mlp(net, p, g, fvu_exact.Layout(layout.unit, None), chunk_size=chunk_size)


@pytest.mark.parametrize(("act", "rank", "duplicate", "dead"), [
    ("relu", None, True, True), ("silu", 3, False, True), ("tanh", None, True, False), ("gelu", None, False, False),
])
def test_own_route_equals_general_route(act, rank, duplicate, dead):
    net, g = _mlp(6, 40, 3, act, seed=2, duplicate=duplicate, dead=dead), _gaussian(6, seed=3, rank=rank)
    for n in (0, 1, 2, 3):
        p = mi.fit_polynomial(net, g, n)
        layout = fvu_exact.exact_layout(net, p, g)
        assert layout.eps is not None and layout.eps.max() <= fvu_exact.ALIGN_TOL  # the own-approximant route
        own = fvu_exact.fvu_exact_mlp(net, p, g, layout)
        gen = _general(net, p, g)
        assert abs(own[0] - gen[0]) <= own[2] + gen[2] + 1e-13, (n, own, gen)
        np.testing.assert_allclose(own[1], gen[1], rtol=1e-9, atol=1e-12)


def test_a_perturbed_approximant_is_covered_by_the_bound_or_takes_the_general_route():
    net, g = _mlp(6, 30, 3, "gelu", seed=4), _gaussian(6, seed=5)
    p = mi.fit_polynomial(net, g, 2)
    rng = np.random.default_rng(6)
    tiny = RidgePolynomial(center=p.center, A=p.A * (1 + 1e-14 * rng.standard_normal(p.A.shape)),
                           D=p.D * (1 + 1e-13), W2=p.W2, b2=p.b2)
    layout = fvu_exact.exact_layout(net, tiny, g)
    assert layout.eps is not None  # still the own route, with the perturbation in the bound
    own = fvu_exact.fvu_exact_mlp(net, tiny, g, layout)
    gen = _general(net, tiny, g)
    assert own[2] > fvu_exact.fvu_exact_mlp(net, p, g, fvu_exact.exact_layout(net, p, g))[2]
    assert abs(own[0] - gen[0]) <= own[2] + gen[2]
    # other coefficients (not the network's own approximant): the general route, value from it
    scaled = RidgePolynomial(center=p.center, A=p.A, D=p.D * 1.1, W2=p.W2 * 0.9, b2=p.b2)
    r = mi.fvu(net, scaled, g, method="exact")
    ref = _general(net, scaled, g)
    assert r.fvu == pytest.approx(ref[0], rel=1e-12)
    mc = mi.fvu(net, scaled, g, method="monte-carlo", n_samples=200_000, seed=1)
    assert abs(r.fvu - mc.fvu) <= 5 * mc.stderr


def test_tiles_blocks_and_degrees_beyond_the_cached_ones_agree(monkeypatch):
    net, g = _mlp(6, 37, 3, "relu", seed=7, duplicate=True, dead=True), _gaussian(6, seed=8)
    ps = {n: mi.fit_polynomial(net, g, n) for n in (1, 2, 3, 4)}
    fvu_exact._NETWORK_CACHE.clear()
    one = {n: mi.fvu(net, ps[n], g, method="exact", chunk_size=37) for n in (1, 2, 3, 4)}  # 2 cached, 3, 4 later
    monkeypatch.setattr(mehler_tails, "TILE", 5)  # several tiles per row block, a short last one
    for chunk in (4, 9):
        fvu_exact._NETWORK_CACHE.clear()
        for n in (4, 1):
            r = mi.fvu(net, ps[n], g, method="exact", chunk_size=chunk)
            assert abs(r.fvu - one[n].fvu) <= 1e-12
            np.testing.assert_allclose(r.per_output, one[n].per_output, rtol=0, atol=1e-12)
    mc = mi.fvu(net, ps[2], g, method="monte-carlo", n_samples=200_000, seed=0)
    assert abs(one[2].fvu - mc.fvu) <= 5 * mc.stderr


@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_tail_sums_are_the_unblocked_matrix_sums(act):
    """The blocked, symmetric, tiled sums equal sum_ij W2_oi T_ij W2_oj of the full matrices built directly
    (near-duplicate neurons included: the pairs evaluated one by one)."""
    from mlpinterp.gaussian.bivariate import gauss_product_ev

    net, g = _mlp(4, 23, 2, act, seed=9, duplicate=True), _gaussian(4, seed=10)
    WL = net.W1 @ g.factor
    m, s = net.W1 @ g.mean + net.b1, np.sqrt((WL**2).sum(1))
    law = mehler_tails.NeuronLaws(net.act, m, s)
    sums, bound = mehler_tails.tail_sums(law, WL, net.W2, 2, rows=6)
    R = np.clip(WL @ WL.T / np.outer(s, s), -1, 1)
    e2 = gauss_product_ev(net.act, m[:, None], s[:, None], m[None, :], s[None, :], R)
    C = e2 - np.outer(law.a[:, 0], law.a[:, 0])
    T1 = C - np.outer(law.a[:, 1], law.a[:, 1]) * R
    T2 = T1 - np.outer(law.a[:, 2], law.a[:, 2]) * R**2
    ref = np.array([np.einsum("oi,ij,oj->o", net.W2, T, net.W2) for T in (C, T1, T2)])
    np.testing.assert_allclose(sums, ref, rtol=0, atol=1e-9 * np.abs(ref).max())
    assert 0 < bound < 1e-9 * np.abs(ref).max()
