"""Matrix-free mixture CG (poly/mixture/operator.py, pcg.py): singular and near-singular operators, honest convergence,
warm starts, float32 with float64 refinement.

Oracle: the normal equations written out densely in the orthonormal coordinates w = (c, b, A_ii, sqrt2 A_ij) of
the CG's inner product, with the Gram E_mix[phi phi^T] of phi = (1, u_i, u_i^2, sqrt2 u_i u_j) taken from the
Stein-recursion moment table (``moment_table``, independent of the operator's closed forms), and the right-hand
side G w_dense from the dense moment-table solve's coefficients (any solution gives the same G w).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import warnings

import numpy as np
import pytest
import torch

from mlpinterp import MLP, DensePolynomial, GaussianMixture
from mlpinterp.poly.mixture.coordinates import coordinates_of, tensors_in_u
from mlpinterp.poly.mixture.exact import fit_mixture
from mlpinterp.poly.mixture.moment_dense import _keys, moment_table
from mlpinterp.poly.mixture.operator import MixtureOperator, cached_operator, flatten_theta, precision_of, space_of
from mlpinterp.poly.mixture.pcg import IndefiniteOperatorError, pcg
from tests.helpers import random_network

torch.set_num_threads(1)


def _net(d, rng, d_hidden=10, d_out=2, act="gelu"):
    return random_network("mlp", d, d_hidden, d_out, act, rng)


def _mixture(d, ranks, rng, weights=None, jitter=0.0):
    """Components of the given ranks (0 = point mass) in R^d, optionally + jitter * I."""
    K = len(ranks)
    covs = []
    for r in ranks:
        L = rng.standard_normal((d, r)) * 0.7 / np.sqrt(max(r, 1))
        covs.append(L @ L.T + jitter * np.eye(d))
    w = np.full(K, 1.0 / K) if weights is None else np.asarray(weights)
    return GaussianMixture(w, rng.normal(0, 1.0, (K, d)), np.stack(covs))


def _basis(r):
    """(kind, index) of each orthonormal coordinate: ('c',), ('b', i), ('A', i, j) with i <= j."""
    return [("c",)] + [("b", i) for i in range(r)] + [("A", i, j) for i, j in itertools.combinations_with_replacement(range(r), 2)]


def _to_w(c, b, A):
    """(c [o], b [o, r], A [o, r, r]) -> orthonormal coordinates [F, o]."""
    r = b.shape[1]
    cols = [c] + [b[:, i] for i in range(r)]
    cols += [A[:, i, j] * (1.0 if i == j else np.sqrt(2.0)) for i, j in itertools.combinations_with_replacement(range(r), 2)]
    return np.stack(cols)


def _from_w(w, r):
    o = w.shape[1]
    c, b, A = w[0], w[1 : r + 1].T, np.zeros((o, r, r))
    for a, (i, j) in enumerate(itertools.combinations_with_replacement(range(r), 2)):
        v = w[r + 1 + a] / (1.0 if i == j else np.sqrt(2.0))
        A[:, i, j] = A[:, j, i] = v
    return c, b, A


def _gram_w(mix, weights=None):
    """E_mix[phi_a phi_b] for phi = (1, u_i, u_i^2, sqrt2 u_i u_j) from the Stein-recursion moment table (``weights
    [K]``: the components' weights in the sum instead of the mixture's, e.g. one-hot for one component's Gram)."""
    coords = coordinates_of(mix)
    r = coords.r
    rows, vals, keys, order = moment_table(coords.means, coords.covs, 4)
    mom = (mix.weights if weights is None else np.asarray(weights)) @ vals
    feats = [()] + [(i,) for i in range(r)] + list(itertools.combinations_with_replacement(range(r), 2))
    scale = np.array([1.0] * (r + 1) + [1.0 if i == j else np.sqrt(2.0) for i, j in feats[r + 1 :]])
    F = len(feats)
    G = np.empty((F, F))
    for a, fa in enumerate(feats):
        for b_, fb in enumerate(feats):
            idx = tuple(sorted(fa + fb))
            row = np.array([list(idx) + [r] * (4 - len(idx))])
            pos = order[np.searchsorted(keys, _keys(row, r), sorter=order)][0]
            G[a, b_] = mom[pos] * scale[a] * scale[b_]
    return G


def _precond_w(op, r):
    """Dense matrix of the CG preconditioner in the orthonormal coordinates (columns = P applied to unit vectors)."""
    basis = _basis(r)
    F = len(basis)
    E = np.eye(F)
    c, b, A = _from_w(E, r)  # F "outputs", one unit vector each
    t = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    z = op.precondition((t(c), t(b), t(A)))
    return _to_w(*(v.numpy() for v in z))


def _solution_w(p, mix):
    coords = coordinates_of(mix)
    return _to_w(*tensors_in_u(p, coords, 2))


def _anchored_oracle(mix, net, anchor=None):
    """Solution of the dense normal equations closest to ``anchor`` (w coordinates; default 0) in the metric P^+,
    with the Gram and right-hand side."""
    G = _gram_w(mix)
    h = G @ _solution_w(fit_mixture(net, mix, 2, method="dense"), mix)  # any solution gives the rhs
    w0 = np.zeros_like(h) if anchor is None else _solution_w(anchor, mix)
    coords = coordinates_of(mix)
    op = MixtureOperator(coords, mix.weights, "diagonal", "cpu", torch.float64)
    P = _precond_w(op, coords.r)
    P = 0.5 * (P + P.T)
    ev, V = np.linalg.eigh(P)
    assert ev.min() > -1e-12 * ev.max()  # the preconditioner is PSD
    Ph = (V * np.sqrt(np.clip(ev, 0, None))) @ V.T
    H = Ph @ G @ Ph
    wH, VH = np.linalg.eigh(H)
    keep = wH > 1e-11 * wH.max()
    Hp = (VH[:, keep] / wH[keep]) @ VH[:, keep].T
    return w0 + Ph @ Hp @ Ph @ (h - G @ w0), G, h


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


# ------------------------------------------------------------------ singular operators: minimum-norm solution
@pytest.mark.parametrize("ranks", [[0, 0], [1, 2, 1], [2, 3], [0, 3, 1]])
def test_rank_deficient_components_match_dense_solution(ranks):
    # Every component rank-deficient on the support (r = 4): quadratics vanishing on all supports exist, so the
    # Gram is singular. CG must (i) give the dense solve's predictions on every component's support and (ii) return
    # the documented solution of the dense normal equations, to 1e-8: closest to its anchor in the metric P^+
    # (init="zero": the minimum-norm solution; init="pooled": closest to the pooled-Gaussian quadratic).
    rng = np.random.default_rng(sum(ranks) * 10 + len(ranks))
    d = 4
    mix = _mixture(d, ranks, rng)
    net = _net(d, rng)
    from mlpinterp.poly.ridge import fit_ridge

    w_min, G, h = _anchored_oracle(mix, net)
    w_pool, *_ = _anchored_oracle(mix, net, fit_ridge(net, mix.pooled(), 2))
    gram_ev = np.linalg.eigvalsh(G)
    assert gram_ev[0] < 1e-10 * gram_ev[-1]  # really singular: the case the xfail was about
    assert _rel(w_min, w_pool) > 1e-4  # the anchor matters: the checks below can fail
    dense = fit_mixture(net, mix, 2, method="dense")
    for init, w_star in (("zero", w_min), ("pooled", w_pool)):
        # float64: the canonical answer (the default on a CPU with fast bfloat16 is canonical on the supports only)
        p = fit_mixture(net, mix, 2, method="cg", init=init, tol=1e-12, fvu_tol=0.0, dtype="float64")
        si = p.solver_info
        assert si["converged"] and si["canonical"] and si["operator_structure"] != "nonsingular" and si["init"] == init
        w = _solution_w(p, mix)
        assert _rel(w, w_star) < 1e-8, init
        assert np.linalg.norm(G @ w - h) <= 1e-10 * np.linalg.norm(h)  # an exact solution (independent residual)
        for k in range(mix.K):
            X = mix.components[k].sample(50, np.random.default_rng(k)) if ranks[k] else mix.means[k][None]
            assert _rel(p(X), dense(X)) < 1e-8


def test_point_masses_structure_is_detected():
    rng = np.random.default_rng(3)
    mix = _mixture(3, [0, 0], rng)  # two points: support rank 1, 1 - u^2 vanishes on both
    p = fit_mixture(_net(3, rng), mix, 2, method="cg")
    assert p.solver_info["operator_structure"] == "singular" and p.solver_info["null_directions_found"] >= 1


def test_full_rank_component_proves_nonsingular_and_matches_dense():
    rng = np.random.default_rng(4)
    mix = _mixture(4, [4, 1, 2], rng, jitter=0.0)
    net = _net(4, rng)
    p = fit_mixture(net, mix, 2, method="cg", tol=1e-12, fvu_tol=0.0)
    assert p.solver_info["operator_structure"] == "nonsingular" and p.solver_info["init"] == "pooled"
    dense = fit_mixture(net, mix, 2, method="dense")
    for k in range(3):
        assert _rel(p.coefficients(k), dense.coefficients(k)) < 1e-8


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_block_cg_with_dependent_and_zero_outputs_matches_dense(dtype):
    # Block CG shares directions between outputs. Outputs 1 and 2 are multiples of output 0 (their preconditioned
    # residuals are the same direction: the block is rank 1 and must drop the dependent ones), output 3 is a
    # constant (the pooled anchor is already exact: a zero residual adds no direction). Every output must still
    # be the dense solve's answer, on a non-singular and a singular operator.
    rng = np.random.default_rng(30)
    for ranks, jitter in (([6, 6, 6], 0.05), ([2, 3, 4], 0.0)):
        mix = _mixture(6, ranks, rng, jitter=jitter)
        base = _net(6, rng, d_out=1)
        W2 = np.concatenate([base.W2, base.W2, -3.0 * base.W2, np.zeros_like(base.W2)])
        net = MLP(base.W1, base.b1, W2, np.array([0.1, 0.2, 0.3, 0.7]), "gelu")
        p = fit_mixture(net, mix, 2, method="cg", tol=1e-11, fvu_tol=0.0, maxiter=2000, dtype=dtype)
        si = p.solver_info
        assert si["converged"] and max(si["per_output_relative_residual"]) <= 1e-11
        dense = fit_mixture(net, mix, 2, method="dense")
        X = mix.sample(300, np.random.default_rng(2))
        assert _rel(p(X), dense(X)) < 1e-8
        np.testing.assert_allclose(p(X)[:, 3], 0.7, atol=1e-10)
        if si["operator_structure"] == "nonsingular":
            for k in range(3):
                assert _rel(p.coefficients(k), dense.coefficients(k)) < 1e-7


def test_near_singular_gram_converges_honestly():
    # Rank-deficient components + 1e-9 I: non-singular but condition ~1e9 or worse. Whatever CG reports, a
    # "converged" must mean an independent true residual <= tol; its mixture error matches the dense solve's
    # (excess mean squared error (w - w_dense)^T G (w - w_dense) relative to the explained variance).
    rng = np.random.default_rng(5)
    mix = _mixture(4, [1, 2, 2], rng, jitter=1e-9)
    net = _net(4, rng)
    G = _gram_w(mix)
    ev = np.linalg.eigvalsh(G)
    assert ev[0] < 1e-7 * ev[-1]  # near-singular
    tol = 1e-9
    p = fit_mixture(net, mix, 2, method="cg", tol=tol, fvu_tol=0.0, maxiter=3000)
    si = p.solver_info
    assert si["converged"] and si["operator_structure"] == "nonsingular"
    w_dense = _solution_w(fit_mixture(net, mix, 2, method="dense"), mix)
    h = G @ w_dense
    w = _solution_w(p, mix)
    assert np.linalg.norm(G @ w - h, axis=0).max() <= 10 * tol * np.linalg.norm(h, axis=0).max()
    e = w - w_dense
    assert np.einsum("fo,fg,go->", e, G, e) < 1e-10 * np.einsum("fo,fg,go->", w_dense, G, w_dense)


# ------------------------------------------------------------------ no false convergence
def test_not_converged_warns_and_says_so():
    rng = np.random.default_rng(7)
    mix = _mixture(6, [6, 6, 6], rng, jitter=0.05)
    net = _net(6, rng)
    with pytest.warns(RuntimeWarning, match="did not converge in 2 iterations"):
        p = fit_mixture(net, mix, 2, method="cg", maxiter=2, tol=1e-12, fvu_tol=1e-3)
    si = p.solver_info
    assert not si["converged"] and si["stopped_by"] == "maxiter" and si["relative_residual"] > 1e-12


def test_fvu_stop_needs_the_true_residual():
    # A huge fvu_tol would stop at once on the estimate; the true residual (> residual_tol) must keep CG going.
    rng = np.random.default_rng(8)
    mix = _mixture(6, [6, 3, 6], rng, jitter=0.05)
    net = _net(6, rng)
    p = fit_mixture(net, mix, 2, method="cg", fvu_tol=1.0, residual_tol=1e-6, window=1, maxiter=500)
    si = p.solver_info
    assert si["converged"] and si["relative_residual"] <= 1e-6


def test_indefinite_operator_raises_a_clear_error():
    rng = np.random.default_rng(9)
    mix = _mixture(3, [3, 3], rng, jitter=0.1)
    coords = coordinates_of(mix)

    class Negated(MixtureOperator):
        def apply(self, theta, components=None):
            return tuple(-t for t in super().apply(theta, components))

    op = Negated(coords, mix.weights, "none", "cpu", torch.float64)
    g = torch.Generator().manual_seed(0)
    rhs = (torch.randn(2, generator=g, dtype=torch.float64), torch.randn(2, 3, generator=g, dtype=torch.float64),
           torch.eye(3, dtype=torch.float64).expand(2, 3, 3).clone())
    with pytest.raises(IndefiniteOperatorError, match=r"not positive semi-definite.*outputs \[0, 1\]"):
        pcg(precision_of(op), space_of(coords.r), flatten_theta(rhs), tol=1e-10, fvu_tol=0.0, residual_tol=1e-4,
            window=5, maxiter=50, progress=False)


def test_galerkin_start_is_the_best_start_in_the_span_and_reports_its_residual():
    # Oracle: the exact solution x* (float64 CG to 1e-12) and direct operator applications. The Galerkin start
    # anchor + D c minimises the energy-norm error <e, M e> over the span: no plain correction (c = e_o) and no
    # perturbed c does better; its reported residual is rhs - M x0 computed directly; and the warm fit records it.
    from mlpinterp.poly.mixture.operator import flat_dot
    from mlpinterp.poly.mixture.pcg import galerkin_start

    rng = np.random.default_rng(5)
    d = 5
    mix = _mixture(d, [5, 5, 5], rng, jitter=0.05)
    net1 = _net(d, rng)
    net2 = MLP(net1.W1 * 1.02 + 0.02 * rng.standard_normal(net1.W1.shape), net1.b1, net1.W2, net1.b2, "gelu")
    kw = dict(method="cg", tol=1e-12, fvu_tol=0.0, maxiter=2000)
    p1 = fit_mixture(net1, mix, 2, **kw)
    cold = fit_mixture(net2, mix, 2, **kw)
    coords = coordinates_of(mix)
    r = coords.r
    op = cached_operator(coords, "diagonal", torch.device("cpu"), torch.float64)
    xs = tuple(torch.as_tensor(t) for t in tensors_in_u(cold, coords, 2))
    xs = flatten_theta((xs[0], xs[1], 0.5 * (xs[2] + xs[2].transpose(1, 2))))
    rhs = op.apply_flat(xs)
    anchor = 0.9 * xs  # any anchor: the optimality is over anchor + span(D)
    D = p1._cg_state["correction"]
    MD = op.apply_flat(D)
    ra = rhs - op.apply_flat(anchor)
    x0, res0, C = galerkin_start(anchor, ra, D, MD, space_of(r))
    np.testing.assert_allclose(res0, rhs - op.apply_flat(x0), atol=1e-10 * float(flat_dot(rhs, rhs, r).sqrt().max()))

    def energy(x):
        e = x - xs
        return flat_dot(e, op.apply_flat(e), r)

    best = energy(x0)
    plain = energy(anchor + D)
    assert bool((best <= plain * (1 + 1e-10)).all())
    for _ in range(5):
        Cp = C + 1e-3 * torch.randn(C.shape, generator=torch.Generator().manual_seed(_), dtype=C.dtype)
        xp = anchor + Cp @ D
        assert bool((best <= energy(xp) * (1 + 1e-10)).all())
    warm = fit_mixture(net2, mix, 2, warm_start=p1, **kw)
    g = warm.solver_info["galerkin_start"]
    assert g["basis"] == 2 and 0 < g["initial_relative_residual"] < 1 and g["plain_warm_relative_residual"] > 0
    for k in range(3):
        assert _rel(warm.coefficients(k), cold.coefficients(k)) < 1e-8


# ------------------------------------------------------------------ warm start, float32 refinement
@pytest.mark.parametrize("ranks,jitter", [([5, 5, 5], 0.05), ([2, 3, 1], 0.0)])
@pytest.mark.parametrize("init", ["pooled", "zero"])
def test_warm_start_gives_the_cold_start_answer(ranks, jitter, init):
    # Two "checkpoints": the second network is a perturbation of the first. Warm-starting from the first's
    # result must give the cold-start answer of the second, also on a singular operator (the warm start is the new
    # anchor plus the old correction, see pcg), starting from a far smaller residual.
    rng = np.random.default_rng(11)
    d = 7  # block CG exhausts the Krylov space of d = 5 in about 10 steps, warm or cold
    mix = _mixture(d, ranks, rng, jitter=jitter)
    net1 = _net(d, rng)
    net2 = MLP(net1.W1 * 1.01 + 0.01 * rng.standard_normal(net1.W1.shape), net1.b1, net1.W2, net1.b2, "gelu")
    # the singular case in float64, whose answer is canonical (the default is that only where the operator is not
    # singular or bfloat16 is slow); the non-singular one at the default
    kw = dict(method="cg", tol=1e-12, fvu_tol=0.0, init=init, maxiter=2000, dtype="auto" if jitter else "float64")
    p1 = fit_mixture(net1, mix, 2, **kw)
    cold = fit_mixture(net2, mix, 2, **kw)
    warm = fit_mixture(net2, mix, 2, warm_start=p1, **kw)
    assert warm.solver_info["init"] == "warm" and warm.solver_info["converged"] and warm.solver_info["canonical"]
    for k in range(3):
        assert _rel(warm.coefficients(k), cold.coefficients(k)) < 1e-8
    assert warm.solver_info["iterations"] <= cold.solver_info["iterations"]
    assert warm.solver_info["residual_history"][0] < 0.1 * cold.solver_info["residual_history"][0]
    # a plain polynomial as the start (no solver state): the same answer on the supports; off them only when the
    # operator is non-singular, and the solver says which
    plain = fit_mixture(net2, mix, 2, warm_start=DensePolynomial(p1.tensors), **kw)
    X = mix.sample(200, np.random.default_rng(1))
    assert plain.solver_info["init"] == "warm (plain start)" and _rel(plain(X), cold(X)) < 1e-8
    assert plain.solver_info["canonical"] == (plain.solver_info["operator_structure"] == "nonsingular")


def test_float32_refinement_reaches_the_float64_answer():
    # float32 operator inside, float64 residuals outside: the refined answer meets the float64 tolerance
    # (true relative residual <= 1e-10, checked in float64), so its coefficients agree with float64 CG to
    # about cond * 1e-10; a single float32 CG cannot get below ~1e-6.
    rng = np.random.default_rng(12)
    d = 6
    mix = _mixture(d, [6, 4, 6], rng, jitter=0.05)
    net = _net(d, rng, d_out=3)
    p64 = fit_mixture(net, mix, 2, method="cg", tol=1e-12, fvu_tol=0.0)
    p32 = fit_mixture(net, mix, 2, method="cg", dtype=torch.float32, tol=1e-10, fvu_tol=0.0, maxiter=2000)
    si = p32.solver_info
    assert si["dtype"] == "float32" and si["converged"] and si["relative_residual"] <= 1e-10
    assert len(si["sweeps"]) >= 2  # it really refined
    for k in range(3):
        assert _rel(p32.coefficients(k), p64.coefficients(k)) < 1e-7


def test_operator_cache_reuses_setup():
    rng = np.random.default_rng(13)
    mix = _mixture(4, [4, 4], rng, jitter=0.1)
    coords = coordinates_of(mix)
    assert coordinates_of(mix) is coords
    a = cached_operator(coords, "diagonal", torch.device("cpu"), torch.float64)
    assert cached_operator(coords, "diagonal", torch.device("cpu"), torch.float64) is a
    assert cached_operator(coords, "diagonal", torch.device("cpu"), torch.float32) is not a
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_mixture(_net(4, rng), mix, 2, method="cg")


def test_outputs_that_converge_are_frozen_and_each_meets_the_rule():
    # Outputs are independent systems; one that meets the stopping rule on its own stops and the operator runs on
    # the others. Every output's excess FVU against the dense optimum (exact, from the Gram) must then be small
    # on its own, not only pooled.
    rng = np.random.default_rng(14)
    # block CG solves d = 6 (28 unknowns, 5 outputs) in 6 steps, before any output can freeze; with symmetric
    # directions (no antisymmetric rounding to resolve) d = 10 converges in 15 steps with no output frozen first
    d = 12
    mix = _mixture(d, [d, d - 2, d], rng, jitter=0.05)
    net = _net(d, rng, d_hidden=16, d_out=5)
    p = fit_mixture(net, mix, 2, method="cg", fvu_tol=1e-6, residual_tol=1e-4, tol=1e-14)
    si = p.solver_info
    h = si["active_outputs_history"]
    assert si["converged"] and h[0] == 5 and min(h) < 5 and all(b <= a for a, b in zip(h, h[1:], strict=False))
    assert max(si["per_output_relative_residual"]) <= 1e-4
    G = _gram_w(mix)
    w_dense = _solution_w(fit_mixture(net, mix, 2, method="dense"), mix)
    e = _solution_w(p, mix) - w_dense
    excess = np.einsum("fo,fg,go->o", e, G, e)
    var = np.einsum("fo,fg,go->o", w_dense, G, w_dense) - (G[0] @ w_dense) ** 2  # Var_mix(p*) per output
    assert np.all(excess < 1e-5 * var), excess / var


# ------------------------------------------------------------------ bfloat16 GEMMs, float32/float64 refinement
def _digits_problem(shrinkage):
    from mlpinterp.data import load_digits

    data = load_digits()
    X = np.asarray(data.X_train, dtype=np.float64)
    mix = GaussianMixture.from_labels(X, data.y_train, shrinkage=shrinkage)
    rng = np.random.default_rng(20)
    d = X.shape[1]
    net = MLP(rng.standard_normal((16, d)) / np.sqrt(d) * 3, rng.normal(0, 0.3, 16),
              rng.standard_normal((10, 16)) / 4, rng.normal(0, 0.1, 10), "relu")
    return net, mix


@pytest.fixture(scope="module")
def digits_lw():
    from mlpinterp.poly.mixture.cached_dense import fit_mixture_quadratic_cached

    net, mix = _digits_problem("ledoit-wolf")
    return net, mix, fit_mixture_quadratic_cached(net, mix)  # closed-form Gram (Isserlis), Cholesky


def test_bfloat16_refinement_reaches_the_dense_answer_on_digits(digits_lw):
    # Digits (d = 64), 10 Ledoit-Wolf classes (a non-singular operator), 10 outputs: bfloat16 GEMMs inside CG,
    # float32 residual updates and float64 confirmation outside. Oracle: the dense Cholesky solve of the
    # explicit Gram of the quadratic features (cached_dense, independent of the operator's matrix-free form).
    net, mix, dense = digits_lw
    p = fit_mixture(net, mix, 2, method="cg", dtype="bfloat16", tol=1e-10, fvu_tol=0.0, maxiter=3000)
    si = p.solver_info
    assert si["dtype"] == "bfloat16" and si["converged"] and si["relative_residual"] <= 1e-10
    assert si["operator_applications_by_dtype"]["bfloat16"] > 0 and si["sweeps"][0]["dtype"] == "bfloat16"
    for k in range(3):
        assert _rel(p.coefficients(k), dense.coefficients(k)) < 1e-6
    X = mix.sample(5000, np.random.default_rng(2))
    f = net(X)
    assert ((p(X) - dense(X)) ** 2).sum(1).mean() / ((f - f.mean(0)) ** 2).sum(1).mean() < 1e-10


def test_bfloat16_default_rule_meets_the_float64_targets_on_digits(digits_lw):
    # The rule used at MNIST scale (fvu_tol 1e-6, residual_tol 1e-4): the float64 residual of the answer, computed
    # here independently, is <= 1e-4 and the excess FVU against the dense optimum is <= 1e-6.
    net, mix, dense = digits_lw
    p = fit_mixture(net, mix, 2, method="cg", dtype=torch.bfloat16, fvu_tol=1e-6)
    si = p.solver_info
    assert si["converged"] and si["relative_residual"] <= 1e-4
    X = mix.sample(20000, np.random.default_rng(3))
    f = net(X)
    assert ((p(X) - dense(X)) ** 2).sum(1).mean() / ((f - f.mean(0)) ** 2).sum(1).mean() < 1e-6
    # the reported residual is rhs - M theta in float64 of the returned polynomial
    coords = coordinates_of(mix)
    op = cached_operator(coords, "diagonal", torch.device("cpu"), torch.float64)
    from mlpinterp.poly.mixture.coordinates import quadratic_in_u
    from mlpinterp.poly.ridge import fit_ridge

    t = lambda ts: tuple(torch.as_tensor(a, dtype=torch.float64) for a in ts)  # noqa: E731
    rhs = op.apply(None, components=[t(quadratic_in_u(fit_ridge(net, c, 2), coords)) for c in mix.components])
    res = [a - b for a, b in zip(rhs, op.apply(t(tensors_in_u(p, coords, 2))), strict=True)]
    from mlpinterp.poly.mixture.operator import theta_dot

    rel = float((torch.sqrt(theta_dot(res, res)) / torch.sqrt(theta_dot(rhs, rhs))).max())
    assert rel == pytest.approx(si["relative_residual"], rel=1e-3, abs=1e-12)


@pytest.mark.parametrize("ranks,jitter", [([2, 3, 1], 0.0), ([0, 3, 1], 0.0), ([5, 5, 5], 0.05)])
@pytest.mark.parametrize("init", ["pooled", "zero"])
def test_bfloat16_on_singular_operators_is_optimal_and_says_it_is_not_canonical(ranks, jitter, init):
    # Rank-deficient and point-mass components: the bfloat16 solve is the float64 solve's polynomial on the
    # components' supports (the same mixture error); off them bfloat16 rounding adds null-space components (measured
    # O(1) relative coefficient differences here), so solver_info says canonical False, and a float64 solve
    # warm-started from it does too. Non-singular: the same coefficients.
    rng = np.random.default_rng(21)
    d = 5
    mix = _mixture(d, ranks, rng, jitter=jitter)
    net = _net(d, rng)
    kw = dict(method="cg", tol=1e-9, fvu_tol=0.0, init=init, maxiter=3000)
    p64 = fit_mixture(net, mix, 2, **{**kw, "tol": 1e-12, "dtype": "float64"})
    p16 = fit_mixture(net, mix, 2, dtype="bfloat16", **kw)
    si = p16.solver_info
    assert si["converged"] and si["operator_structure"] == p64.solver_info["operator_structure"]
    X = mix.sample(500, np.random.default_rng(1))
    assert _rel(p16(X), p64(X)) < 1e-7
    if si["operator_structure"] == "nonsingular":
        assert si["canonical"]
        for k in range(3):
            assert _rel(p16.coefficients(k), p64.coefficients(k)) < 1e-6
    else:
        assert not si["canonical"] and "bfloat16 rounding" in si["extension_note"]
        assert p64.solver_info["canonical"]
        warm = fit_mixture(net, mix, 2, warm_start=p16, dtype="float64", **kw)
        assert warm.solver_info["init"] == "warm" and not warm.solver_info["canonical"]


def test_auto_dtype_picks_bfloat16_where_it_is_fast_and_says_what_the_answer_is(monkeypatch):
    import mlpinterp.poly.mixture.operator as ex

    rng = np.random.default_rng(25)
    full = _mixture(4, [4, 4], rng, jitter=0.1)
    singular = _mixture(4, [2, 1], rng)
    net = _net(4, rng)
    # fast bfloat16: bfloat16 (on a singular operator the canonical answer on the supports only,
    # test_mixture_default.py); none: float32 on a non-singular operator, float64 on a singular one (float32 sweeps
    # stall there and fall back, slower than float64 on MNIST)
    for fast, mix, want, canonical in [(True, full, "bfloat16", True), (False, full, "float32", True),
                                       (True, singular, "bfloat16", False), (False, singular, "float64", True)]:
        monkeypatch.setattr(ex, "cpu_has_fast_bfloat16", lambda fast=fast: fast)
        p = fit_mixture(net, mix, 2, method="cg", dtype="auto", device="cpu")
        assert p.solver_info["dtype"] == want and p.solver_info["dtype_requested"] == "auto"
        assert p.solver_info["converged"] and p.solver_info["canonical"] == canonical
        assert p.solver_info["answer"] == ("canonical" if canonical else "canonical on the support")
        assert p.solver_info["dtype_reason"].startswith("auto: ")
        default = fit_mixture(net, mix, 2, method="cg", device="cpu")  # the library default is "auto"
        assert default.solver_info["dtype_requested"] == "auto" and default.solver_info["dtype"] == want


def test_fast_bfloat16_is_read_from_the_instruction_sets_on_x86_and_timed_elsewhere(monkeypatch):
    import torch

    from mlpinterp.utils import hardware

    monkeypatch.setattr(hardware.platform, "machine", lambda: "x86_64")
    for avx, amx, want in [(True, False, True), (False, True, True), (False, False, False)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda avx=avx: avx, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx, raising=False)
        monkeypatch.setattr(hardware, "_FAST_BF16", {})
        assert hardware.bfloat16_instructions() is want and hardware.cpu_has_fast_bfloat16() is want
        assert hardware._FAST_BF16 == {}  # decided without timing: the same answer at any load
    monkeypatch.setattr(hardware.platform, "machine", lambda: "aarch64")
    assert hardware.bfloat16_instructions() is None
    fast = hardware.cpu_has_fast_bfloat16()
    assert hardware._FAST_BF16 == {torch.get_num_threads(): fast}  # timed once per thread count


@pytest.mark.parametrize("seed", [13, 19, 26, 41, 46, 50, 53])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64"])
def test_reduced_precision_on_singular_operators_converges_to_the_float64_polynomial(seed, dtype):
    # Rank-deficient components (ranks (2, 3, 1) and a point mass with (3, 1)) at a tight tol: before the float32 ->
    # float64 step, 22 of 240 such problems (these seeds among them, on an AMD EPYC with AVX512-BF16; another seed
    # on an Intel Xeon with AMX) ended unconverged with the true residual stuck at 1e-7 to 3e-3, however many float32
    # sweeps ran. Every one must now converge, to the float64 solve's polynomial on the supports.
    for ranks in ([2, 3, 1], [0, 3, 1]):
        for init in ("zero", "pooled"):
            rng = np.random.default_rng(seed)
            mix = _mixture(5, ranks, rng)
            net = _net(5, rng)
            kw = dict(method="cg", tol=1e-9, fvu_tol=0.0, init=init, maxiter=3000)
            p64 = fit_mixture(net, mix, 2, **{**kw, "tol": 1e-12, "dtype": "float64"})
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # "did not converge" fails the test
                p = fit_mixture(net, mix, 2, dtype=dtype, **kw)
            si = p.solver_info
            assert si["converged"] and si["relative_residual"] <= 1e-9, (ranks, init, si["sweeps"])
            X = mix.sample(500, np.random.default_rng(1))
            # relative residual <= 1e-9 bounds the error on the supports by the condition number of these near-
            # degenerate operators times 1e-9 (largest seen here: 2.9e-7, float32, seed 46)
            assert _rel(p(X), p64(X)) < 1e-6


@pytest.mark.parametrize("dtype,chain", [("float32", ["float64"]), ("bfloat16", ["float32", "float64"])])
def test_reduced_precision_falls_back_to_float64_when_its_sweeps_stall(monkeypatch, dtype, chain):
    # A one-step budget per float32 (and bfloat16) sweep makes them stall: the remaining sweeps must run one
    # precision up, each switch must be listed, and the answer must be the float64 one (from bfloat16, the float64
    # sweeps start from a residual recomputed in float64: the float32 updates in between are not exact).
    import mlpinterp.poly.mixture.pcg as pcg_mod

    monkeypatch.setitem(pcg_mod.SWEEP_MAXITER, "float32", 1)
    monkeypatch.setitem(pcg_mod.SWEEP_MAXITER, "bfloat16", 1)
    rng = np.random.default_rng(22)
    mix = _mixture(6, [6, 4, 6], rng, jitter=0.05)
    net = _net(6, rng, d_out=3)
    p64 = fit_mixture(net, mix, 2, method="cg", tol=1e-12, fvu_tol=0.0)
    p = fit_mixture(net, mix, 2, method="cg", dtype=dtype, tol=1e-10, fvu_tol=0.0, maxiter=2000)
    si = p.solver_info
    assert [f["to"] for f in si["fallback"]] == chain
    assert f"{dtype} sweep took the true relative residual" in si["fallback"][0]["reason"]
    assert si["sweeps"][0]["dtype"] == dtype and si["sweeps"][-1]["dtype"] == "float64"
    assert si["converged"] and si["relative_residual"] <= 1e-10
    for k in range(3):
        assert _rel(p.coefficients(k), p64.coefficients(k)) < 1e-7


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("r,blocks,min_r,group", [(10, 3, 0, 1), (530, 7, 512, 2), (64, 64, 0, 3), (20, 7, 512, 1)])
def test_block_lower_sandwiches_equal_the_float64_sum(monkeypatch, r, blocks, min_r, group, dtype):
    # H + H^T = sum_k 2 pi_k S_k A_j S_k from GEMMs that compute only the lower part of each block column (uneven
    # last block, one-column blocks, the production shape above LOWER_BLOCKS_MIN_R, one block below it), summed over
    # components inside one GEMM per group (groups of 1, 2 and 3 components): against the float64 sum, to the
    # dtype's rounding, with a zero weight among the components; H's prior content is kept.
    import mlpinterp.poly.mixture.operator as op_mod

    monkeypatch.setattr(op_mod, "LOWER_BLOCKS", blocks)
    monkeypatch.setattr(op_mod, "LOWER_BLOCKS_MIN_R", min_r)
    monkeypatch.setattr(op_mod, "SANDWICH_GROUP_BYTES", group * r * r * torch.finfo(dtype).bits // 8)
    rng = np.random.default_rng(3)
    o, K = 2, 4
    L = rng.standard_normal((K, r, r)) / np.sqrt(r)
    S = L @ L.transpose(0, 2, 1)
    A = rng.standard_normal((o, r, r))
    A = A + A.transpose(0, 2, 1)
    pi = [0.4, 0.0, 0.5, 0.1]
    want = sum(2 * p * S[k] @ A @ S[k] for k, p in enumerate(pi))
    work = torch.float64 if dtype == torch.float64 else torch.float32
    base = torch.tensor(rng.standard_normal((o, r, r)), dtype=work)
    factors = op_mod.sandwich_factors(torch.tensor(S), pi, dtype)
    assert [T.shape[1] // r for T in factors] == {1: [1, 1, 1], 2: [2, 1], 3: [3]}[group]  # the zero weight left out
    H = op_mod._add_sandwiches(base.clone(), torch.tensor(A).to(dtype), factors)
    got = (H + H.transpose(1, 2) - base - base.transpose(1, 2)).double().numpy()
    tol = {torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]  # bfloat16: ~2^-8 per rounding
    assert _rel(got, want) < tol


def test_a_float64_sweep_that_raises_the_residual_is_discarded(monkeypatch):
    # A sweep whose correction makes the true residual worse must be thrown away, not kept: its sign is flipped
    # here, so the solve must stop with the starting point, say so, and not report convergence.
    import mlpinterp.poly.mixture.pcg as pcg_mod

    inner = pcg_mod._inner_pcg

    def flipped(*args, **kwargs):
        d, *rest = inner(*args, **kwargs)
        return (-d, *rest)

    monkeypatch.setattr(pcg_mod, "_inner_pcg", flipped)
    rng = np.random.default_rng(22)
    mix = _mixture(6, [6, 4, 6], rng, jitter=0.05)
    net = _net(6, rng, d_out=3)
    with pytest.warns(RuntimeWarning, match="did not converge"):
        p = fit_mixture(net, mix, 2, method="cg", init="zero", tol=1e-10, fvu_tol=0.0, dtype="float64")
    si = p.solver_info
    assert not si["converged"] and [w["discarded"] for w in si["sweeps"]] == [True]
    assert np.allclose(p.coefficients(2), 0.0) and si["relative_residual"] == pytest.approx(1.0)


def test_bfloat16_falls_back_to_float32_when_its_sweeps_stall(monkeypatch):
    # A one-step budget per bfloat16 sweep makes the sweeps stall: the solver must switch to float32 sweeps, say
    # so, and still reach the float64 answer (never loop, never report a false convergence).
    import mlpinterp.poly.mixture.pcg as pcg_mod

    monkeypatch.setitem(pcg_mod.SWEEP_MAXITER, "bfloat16", 1)
    rng = np.random.default_rng(22)
    d = 6
    mix = _mixture(d, [6, 4, 6], rng, jitter=0.05)
    net = _net(d, rng, d_out=3)
    p64 = fit_mixture(net, mix, 2, method="cg", tol=1e-12, fvu_tol=0.0)
    p = fit_mixture(net, mix, 2, method="cg", dtype="bfloat16", tol=1e-10, fvu_tol=0.0, maxiter=2000)
    si = p.solver_info
    assert si["fallback"] and si["fallback"][0]["to"] == "float32"
    assert "bfloat16 sweep took the true relative residual" in si["fallback"][0]["reason"]
    assert [w["dtype"] for w in si["sweeps"]][-1] == "float32" and si["sweeps"][0]["dtype"] == "bfloat16"
    assert si["converged"] and si["relative_residual"] <= 1e-10
    for k in range(3):
        assert _rel(p.coefficients(k), p64.coefficients(k)) < 1e-7


def test_bfloat16_unconverged_is_reported_with_the_float64_residual():
    # Too few iterations: converged is False, with a RuntimeWarning, and the residual is the float64 one.
    rng = np.random.default_rng(23)
    mix = _mixture(6, [6, 4, 6], rng, jitter=0.05)
    net = _net(6, rng, d_out=3)
    with pytest.warns(RuntimeWarning, match="did not converge"):
        p = fit_mixture(net, mix, 2, method="cg", dtype="bfloat16", tol=1e-12, fvu_tol=0.0, maxiter=5)
    si = p.solver_info
    assert not si["converged"] and si["relative_residual"] > 1e-12 and si["iterations"] <= 5


@pytest.mark.parametrize("bad", ["float16", torch.float16, "bf16", 32, torch.int32])
def test_bad_dtype_is_refused_by_name(bad):
    rng = np.random.default_rng(24)
    mix = _mixture(3, [3, 3], rng, jitter=0.1)
    with pytest.raises(ValueError, match=r"dtype must be torch.float64, torch.float32 or torch.bfloat16 \(or 'float64'/'float32'/'bfloat16'/'auto'\), got"):
        fit_mixture(_net(3, rng), mix, 2, method="cg", dtype=bad)


def _rss():
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _glibc_settings_or_skip():
    import sys

    from mlpinterp.utils.malloc import fix_mmap_threshold

    if not sys.platform.startswith("linux") or not fix_mmap_threshold():
        pytest.skip("glibc mallopt not available (or MALLOC_MMAP_THRESHOLD_ set)")


def test_fixed_mmap_threshold_returns_freed_tensor_pages():
    """After the solver's mallopt a freed 24 MB array leaves no resident pages (glibc's heap kept them before)."""
    _glibc_settings_or_skip()
    a = np.ones(4_000_000)  # 32 MB, mmapped and freed: glibc would raise its threshold to it
    del a
    before = _rss()
    a = np.ones(3_000_000)  # 24 MB: from glibc's heap under a raised threshold (22.8 MB stayed resident, measured)
    pin = np.ones(1000)  # a small block above it keeps the heap's top from being trimmed
    del a
    assert _rss() - before < 4 * 2**20
    del pin


def test_trim_threshold_keeps_freed_scratch_until_released():
    """A freed 2 MB block (a bfloat16 GEMM's scratch at MNIST scale) stays in the heap for reuse, without page
    faults, under the trim threshold; ``release_free_memory`` (after each solve) returns it."""
    from mlpinterp.utils.malloc import TRIM_THRESHOLD, release_free_memory

    _glibc_settings_or_skip()
    assert TRIM_THRESHOLD >= 4 * 2**20
    release_free_memory()
    before = _rss()
    blocks = [np.ones(250_000) for _ in range(3)]  # 3 x 2 MB from the heap (below the 4 MB mmap threshold)
    del blocks
    kept = _rss() - before
    assert kept >= 4 * 2**20  # glibc's default trim threshold (128 kB) would have returned them
    release_free_memory()
    assert _rss() - before <= kept - 4 * 2**20


def _anon_huge_kb(text: str) -> int:
    return sum(int(line.split()[1]) for line in text.splitlines() if line.startswith("AnonHugePages:"))


@pytest.mark.slow
def test_cli_turns_on_huge_pages_before_torch_allocates_and_keeps_the_users_choice():
    """The ``mlpinterp`` command sets torch's THP_MEM_ALLOC_ENABLE before torch's first allocation, so a 32 MB tensor
    is backed by 2 MB pages where the kernel allows it (``madvise`` or ``always``); a user's own value is kept."""
    import subprocess
    import sys

    code = ("import mlpinterp.cli.main, os, torch; x = torch.ones(8 * 2**20); print(os.environ['THP_MEM_ALLOC_ENABLE']);"
            "print(open('/proc/self/smaps_rollup').read() if os.path.exists('/proc/self/smaps_rollup') else '')")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.splitlines()[0] == "1"
    mode = "/sys/kernel/mm/transparent_hugepage/enabled"
    if os.path.exists(mode) and "[never]" not in open(mode).read() and "AnonHugePages" in out:
        assert _anon_huge_kb(out) >= 2048, "no transparent huge page backs the 32 MB tensor"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**env, "THP_MEM_ALLOC_ENABLE": "0"}).stdout
    assert out.splitlines()[0] == "0"
    if os.path.exists(mode) and "[madvise]" in open(mode).read() and "AnonHugePages" in out:
        assert _anon_huge_kb(out) == 0  # without the variable torch does not ask for huge pages


# ------------------------------------------------------------------ memory: the same values, fewer copies
def test_operator_keeps_no_per_dtype_covariance_copies_and_its_views_are_the_old_values():
    # the float64 operator shares the coordinates' covariances; a float32 one keeps no [K, r, r] copy of S or of
    # Q = S + m m^T (both are built per application), and what it builds equals the tensors it used to keep
    rng = np.random.default_rng(21)
    mix = _mixture(6, [6, 4, 6], rng, jitter=0.05)
    coords = coordinates_of(mix)
    K, r = coords.covs.shape[:2]
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        op = MixtureOperator(coords, mix.weights, "diagonal", "cpu", dtype)
        wd = op.work_dtype
        big = [k for k, v in vars(op).items() if isinstance(v, torch.Tensor) and v.numel() >= K * r * r
               and v.dtype in (torch.float32, torch.float64) and k != "_S64"]
        assert big == [], big
        assert np.shares_memory(op._S64.numpy(), coords.covs)
        S_old = torch.as_tensor(coords.covs, dtype=wd)
        m = torch.as_tensor(coords.means, dtype=wd)
        assert torch.equal(op.S, S_old) and torch.equal(op.Q, S_old + m[:, :, None] * m[:, None, :])
        assert all(torch.equal(op._S_k(k), S_old[k]) for k in range(K))
        pi = torch.tensor(mix.weights, dtype=torch.float64).sqrt()
        T = torch.cat(op.T_gemm, 1)  # [r, K r], one group at this size
        want = (torch.as_tensor(coords.covs) * pi[:, None, None]).to(dtype)
        assert torch.equal(T, torch.cat(list(want), 1))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_flat_preconditioner_operator_and_in_place_helpers_give_the_same_bits(dtype):
    from mlpinterp.poly.mixture.operator import flat_dot, symmetrise_flat_, theta_dot, unflatten_theta

    rng = np.random.default_rng(22)
    mix = _mixture(7, [7, 3, 7], rng, jitter=0.05)
    coords = coordinates_of(mix)
    r = coords.r
    op = MixtureOperator(coords, mix.weights, "diagonal", "cpu", dtype)
    op64 = MixtureOperator(coords, mix.weights, "diagonal", "cpu", torch.float64)
    gen = torch.Generator().manual_seed(3)
    R = torch.randn(4, 1 + r + r * r, generator=gen, dtype=torch.float64)
    g0, g1, g2 = unflatten_theta(R, r)
    eye = torch.eye(r, dtype=torch.float64)
    A_pooled = 0.5 * (g2 - g0[:, None, None] * eye)
    A_diag = g2 * op64.Finv  # the preconditioners written out (module docstring): the oracle of each kind
    sol = torch.cat([g0[:, None], torch.diagonal(g2, dim1=1, dim2=2)], 1) @ op64.Binv
    A_diag.diagonal(dim1=1, dim2=2).copy_(sol[:, 1:])
    expected = {"none": (g0, g1, g2), "pooled": (g0 - torch.diagonal(A_pooled, dim1=1, dim2=2).sum(1), g1, A_pooled),
                "diagonal": (sol[:, 0], g1, A_diag)}
    for kind in ("diagonal", "pooled", "none"):
        op64.kind = kind
        assert torch.equal(op64.precondition_flat(R), flatten_theta(expected[kind]))
        assert torch.equal(op64.precondition_flat(R), flatten_theta(op64.precondition(unflatten_theta(R, r))))
        assert torch.equal(op64.precondition_flat(R[1:3]), flatten_theta(op64.precondition(unflatten_theta(R.index_select(
            0, torch.tensor([1, 2])), r))))
    # the flat application: the tuple application in op's working dtype, answered in R's dtype
    cast = tuple(t.to(op.work_dtype) for t in unflatten_theta(R, r))
    assert torch.equal(op.apply_flat(R), flatten_theta(tuple(t.to(R.dtype) for t in op.apply(cast))))
    # the flat inner product and symmetric part: those of the tuples, bit for bit
    x, y = unflatten_theta(R[:2].clone(), r), unflatten_theta(R[2:].clone(), r)
    assert torch.equal(flat_dot(R[:2], R[2:], r), theta_dot(x, y))
    ref = (x[0], x[1], 0.5 * (x[2] + x[2].transpose(1, 2)))
    got = unflatten_theta(symmetrise_flat_(R[:2].clone(), r), r)
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


@pytest.mark.parametrize("init", ["pooled", "zero"])
def test_warm_state_is_consistent_after_a_warm_start(init):
    # the solver keeps neither the anchor nor its residual through a warm-started solve (memory) and
    # rebuilds them for the state: M (x - anchor) must still be the stored m_correction, cold and warm
    from mlpinterp.poly.mixture.operator import unflatten_theta

    rng = np.random.default_rng(23)
    d = 6
    mix = _mixture(d, [6, 6, 6], rng, jitter=0.05)
    net1 = _net(d, rng, d_out=3)
    net2 = MLP(net1.W1 * 1.01, net1.b1, net1.W2, net1.b2, "gelu")
    kw = dict(method="cg", tol=1e-10, fvu_tol=0.0, init=init, maxiter=500)
    p1 = fit_mixture(net1, mix, 2, **kw)
    p2 = fit_mixture(net2, mix, 2, warm_start=p1, **kw)
    assert p2.solver_info["init"] == "warm" and "galerkin_start" in p2.solver_info
    op = cached_operator(coordinates_of(mix), "diagonal", torch.device("cpu"), torch.float64)
    for p in (p1, p2):
        st = p._cg_state
        m = op.apply_flat(st["correction"])
        r = coordinates_of(mix).r
        for a, b in zip(unflatten_theta(st["m_correction"], r), unflatten_theta(m, r), strict=True):
            assert float((a - b).norm()) <= 1e-9 * max(float(b.norm()), 1e-300)
    cold = fit_mixture(net2, mix, 2, **kw)
    for k in range(3):
        assert np.abs(p2.coefficients(k) - cold.coefficients(k)).max() <= 1e-6 * max(np.abs(cold.coefficients(k)).max(), 1)


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_factored_apply_matches_the_generic_operator(act):
    # the right-hand side and the anchor's M theta from the ridge factors (MixtureOperator.apply_factored) against the generic
    # per-component operator on the formed [o, r, r] tensors (operator._component_apply), on a rank-deficient
    # mixture with a zero-weight component
    from mlpinterp.poly.mixture.coordinates import factored_quadratic_in_u, quadratic_in_u
    from mlpinterp.poly.ridge import fit_ridge

    rng = np.random.default_rng(11)
    d = 7
    net = _net(d, rng, d_hidden=9, d_out=3, act=act)
    mix = _mixture(d, [3, 7, 0, 5], rng, weights=[0.3, 0.4, 0.0, 0.3], jitter=0.0)
    coords = coordinates_of(mix)
    op = cached_operator(coords, "diagonal", torch.device("cpu"), torch.float64)
    t = lambda ts: tuple(torch.as_tensor(a, dtype=torch.float64) for a in ts)  # noqa: E731
    ridges = [fit_ridge(net, c, 2) for c in mix.components]
    dense = op.apply(None, components=[t(quadratic_in_u(p, coords)) for p in ridges])
    fact = op.apply_factored([factored_quadratic_in_u(p, coords) for p in ridges])
    pooled = fit_ridge(net, mix.pooled(), 2)
    dense_a = op.apply(t(quadratic_in_u(pooled, coords)))
    fact_a = op.apply_factored(factored_quadratic_in_u(pooled, coords))
    for got, want in [*zip(fact, dense, strict=True), *zip(fact_a, dense_a, strict=True)]:
        assert got.shape == want.shape
        assert float((got - want).abs().max()) <= 1e-12 * float(want.abs().max())
    with pytest.raises(ValueError, match="one FactoredQuadratic or 4"):
        op.apply_factored([factored_quadratic_in_u(p, coords) for p in ridges[:2]])
    q = factored_quadratic_in_u(pooled, coords)
    with pytest.raises(ValueError, match=r"b \(3, 6\).*the operator expects c \[3\], b \[3, 7\]"):
        op.apply_factored(dataclasses.replace(q, b=q.b[:, :-1]))
    assert factored_quadratic_in_u(fit_ridge(net, mix.pooled(), 3), coords) is None  # degree 3: the generic path
    op32 = cached_operator(coords, "diagonal", torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="op must be the float64 mixture operator, got one working in torch.float32"):
        op32.apply_factored(q)


# ------------------------------------------------------------------ sweep control
def _one_sweep(op, rhs, frozen, *, reduction, maxiter):
    """One ``_inner_pcg`` sweep on ``M d = rhs`` (flat rows) from d = 0 with the stopping rules off except
    ``reduction``."""
    from mlpinterp.poly.mixture.pcg import _inner_pcg
    from mlpinterp.utils.progress import progress_bar

    space = space_of(op.r)
    rhs_norm = space.dot(rhs, rhs).sqrt()
    with progress_bar(total=maxiter, desc="sweep", quiet=True) as bar:
        d, stop, it, *_ = _inner_pcg(precision_of(op), space, rhs, rhs_norm, -rhs[:, 0] ** 2, [], frozen.clone(),
                                     torch.zeros_like(rhs_norm), tol=0.0, fvu_tol=0.0, residual_tol=0.0, window=10,
                                     maxiter=maxiter, reduction=reduction, bar=bar)
    return d, stop, it


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_sweep_with_a_frozen_output_ends_once_the_running_outputs_have_cut_their_residual(dtype):
    # Refinement: a reduced-precision sweep ends ("refine") as soon as every output that is still running has cut
    # its residual by the sweep's reduction factor; an output frozen by the outer loop takes no steps, so its
    # residual must not hold the sweep open. Oracle: the true residual rhs - M d of the sweep's correction,
    # recomputed with the float64 operator, per output, at the step where the sweep ended and one step earlier
    # (a second sweep run with maxiter one less: CG is deterministic, so it is the same iterate).
    from mlpinterp.poly.mixture.coordinates import quadratic_in_u
    from mlpinterp.poly.mixture.operator import flat_dot
    from mlpinterp.poly.ridge import fit_ridge

    rng = np.random.default_rng(31)
    d = 6
    mix = _mixture(d, [6, 4, 6], rng, jitter=0.05)
    net = _net(d, rng, d_out=3)
    coords = coordinates_of(mix)
    op64 = cached_operator(coords, "diagonal", torch.device("cpu"), torch.float64)
    op = cached_operator(coords, "diagonal", torch.device("cpu"), dtype)
    t = lambda ts: tuple(torch.as_tensor(a, dtype=torch.float64) for a in ts)  # noqa: E731
    rhs = flatten_theta(op64.apply(None, components=[t(quadratic_in_u(fit_ridge(net, c, 2), coords))
                                                     for c in mix.components]))
    r = coords.r
    frozen = torch.tensor([False, True, False])
    reduction = 1e-2

    def true_ratio(d):
        res = rhs - op64.apply_flat(d.to(torch.float64))
        return (flat_dot(res, res, r).sqrt() / flat_dot(rhs, rhs, r).sqrt()).numpy()

    dd, stop, it = _one_sweep(op, rhs.to(dtype), frozen, reduction=reduction, maxiter=500)
    assert stop == "refine" and it > 1
    ratio = true_ratio(dd)
    # the running outputs have cut their residual by the reduction (to the recurrence's drift from the true
    # residual: the operator's rounding times the growth of the sweep's correction, far below 10 % here)
    assert np.all(ratio[[0, 2]] <= 1.1 * reduction), ratio
    # the frozen output took no step
    assert float(dd[1].abs().max()) == 0.0 and ratio[1] == pytest.approx(1.0)
    # and not one step later than needed: one step earlier some running output was still above the reduction
    d_prev, stop_prev, it_prev = _one_sweep(op, rhs.to(dtype), frozen, reduction=reduction, maxiter=it - 1)
    assert stop_prev == "maxiter" and it_prev == it - 1
    assert np.max(true_ratio(d_prev)[[0, 2]]) > 0.9 * reduction


def _spd_problem(n=40, o=2, cond=1e3, seed=5):
    """A generic SPD system for the solver in its own terms: ``Precision``/``Space`` around a dense ``M [n, n]``
    with condition number ``cond``, right-hand sides ``[o, n]``, and a counter of applications per precision."""
    from mlpinterp.poly.mixture.pcg import Precision, Space

    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    M = (U * torch.logspace(0, np.log10(cond), n, dtype=torch.float64)) @ U.T
    calls = {}

    def precision(dtype, work):
        def matvec(X):
            calls[str(dtype)] = calls.get(str(dtype), 0) + 1
            return (X.to(torch.float64) @ M).to(X.dtype)
        return Precision(matvec=matvec, precondition=lambda R: R.clone(), dtype=dtype, work_dtype=work,
                         rounding=float(torch.finfo(work).eps))

    space = Space(dot=lambda X, Y: (X * Y).sum(1), gram=lambda X, Y: X @ Y.T, project_=lambda X: X)
    rhs = torch.randn(o, n, generator=g, dtype=torch.float64)
    return M, rhs, precision, space, calls


def test_a_sweep_continues_along_the_directions_carried_from_the_last_one():
    # Refinement sweeps keep the last block of search directions (reliable updates): a sweep started from the
    # previous sweep's residual with its carried block continues the same CG, so two sweeps of 6 steps give the
    # iterate of one uninterrupted sweep of 12 (float64, where the recurrence is the true residual to rounding).
    # Without the carried block the second sweep restarts CG, which gives another iterate (checked, so the
    # comparison can fail).
    from mlpinterp.poly.mixture.pcg import _inner_pcg
    from mlpinterp.utils.progress import progress_bar

    M, rhs, precision, space, _ = _spd_problem()
    op = precision(torch.float64, torch.float64)
    rn = space.dot(rhs, rhs).sqrt()

    def sweep(r0, steps, carry=None):
        with progress_bar(total=steps, desc="sweep", quiet=True) as bar:
            d, stop, it, _, _, _, carried = _inner_pcg(
                op, space, r0, rn, torch.zeros(2, dtype=torch.float64), [], torch.zeros(2, dtype=torch.bool),
                torch.zeros(2, dtype=torch.float64), tol=0.0, fvu_tol=0.0, residual_tol=0.0, window=10,
                maxiter=steps, reduction=0.0, bar=bar, carry=carry)
        assert stop == "maxiter" and it == steps
        return d, carried

    d12, _ = sweep(rhs, 12)
    d1, carried = sweep(rhs, 6)
    assert carried is not None and [t.shape for t in carried] == [(2, 40), (2, 40), (2, 2)]
    r1 = rhs - d1 @ M
    d2, _ = sweep(r1, 6, carried)
    d2_restart, _ = sweep(r1, 6)
    err = lambda d: float((d - d12).norm() / d12.norm())  # noqa: E731
    assert err(d1 + d2) < 1e-9
    assert err(d1 + d2_restart) > 1e-4


def test_the_converged_sweep_is_checked_in_float64_without_a_float32_update():
    # A reduced-precision sweep that meets the stopping rule on its recurrence goes straight to the float64
    # residual, which decides: the float32 update it would replace is not computed. Counted per precision on a
    # generic SPD system solved with bfloat16-labelled sweeps (float32 arithmetic), float32 updates and float64.
    M, rhs, precision, space, calls = _spd_problem(cond=1e2)
    x, info, res = pcg(precision(torch.float64, torch.float64), space, rhs, tol=1e-9, fvu_tol=0.0, residual_tol=1e-4,
                       window=10, maxiter=500, progress=False, inner=precision(torch.bfloat16, torch.float32),
                       fallback=precision(torch.float32, torch.float32))
    assert info["converged"] and info["sweeps"][-1]["stopped_by"] == "residual"
    assert float(((rhs - x @ M).norm(dim=1) / rhs.norm(dim=1)).max()) <= 1e-9
    # one float32 update per sweep except the converged one (the old rule: one per sweep, then float64 again)
    assert calls.get("torch.float32", 0) <= len(info["sweeps"]) - 1
    assert calls["torch.float64"] >= 1


def test_reuse_heap_keeps_freed_blocks_for_reuse_and_returns_them_on_exit():
    """Inside ``reuse_heap`` a freed 24 MB block stays in glibc's heap and the next one of that size reuses it
    (no page faults); on exit the fixed thresholds are back and the free pages are returned."""
    import resource

    from mlpinterp.utils.malloc import release_free_memory, reuse_heap

    _glibc_settings_or_skip()
    release_free_memory()
    before = _rss()
    with reuse_heap() as on:
        assert on
        a = np.ones(3_000_000)  # 24 MB: below the solve's mmap threshold, from the heap
        pin = np.ones(1000)  # keeps the heap's top above the freed block
        del a
        kept = _rss() - before
        assert kept >= 20 * 2**20
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        b = np.ones(3_000_000)  # the freed block again: its pages are still mapped
        assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults < 500  # 5,860 pages if faulted afresh
        del b
    assert _rss() - before < 4 * 2**20
    del pin
    test_fixed_mmap_threshold_returns_freed_tensor_pages()  # the fixed thresholds are in force again
