"""Exact approximants under Gaussian mixtures against independent oracles.

Oracles: (1) least squares on 10^6 mixture samples of explicit monomial features with HC0 (robust) standard
errors (``tests.oracles``, no mlpinterp closed forms); (2) the single-Gaussian Hermite approximant for K = 1;
(3) the dense monomial-Gram path, whose moments come from the Stein recursion rather than the closed-form
Isserlis operator of the CG path; (4) the same problem posed directly in support coordinates.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mlpinterp import MLP, Gaussian, GaussianMixture, fit_polynomial
from mlpinterp.poly.mixture.exact import fit_mixture
from mlpinterp.poly.mixture.moment_dense import MAX_DENSE_FEATURES, moment_table
from mlpinterp.poly.mixture.sgd import fit_sgd
from mlpinterp.poly.ridge import fit_ridge
from tests.helpers import random_network
from tests.oracles import monomial_features, ols_with_robust_se, prediction_z_scores

torch.set_num_threads(1)


def random_mixture(d: int, rng: np.random.Generator, weights=(0.5, 0.3, 0.2), ranks=None) -> GaussianMixture:
    K = len(weights)
    ranks = ranks or [d] * K
    covs = []
    for k in range(K):
        L = rng.standard_normal((d, ranks[k])) * rng.uniform(0.3, 1.0) / np.sqrt(d)
        covs.append(L @ L.T + (0.1 * np.eye(d) if ranks[k] == d else 0))
    return GaussianMixture(np.array(weights), rng.normal(0, 0.8, (K, d)), np.stack(covs))


def random_net(kind: str, d_in: int, rng: np.random.Generator, d_hidden: int = 8, d_out: int = 2):
    """``kind``: "glu" (silu) or an MLP activation name."""
    glu = kind == "glu"
    return random_network("glu" if glu else "mlp", d_in, d_hidden, d_out, "silu" if glu else kind, rng)


def rel_max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


# ------------------------------------------------------------------ Monte Carlo least squares (oracle 1)
N_MC = 1_000_000


KINDS = ("relu", "gelu", "glu")


@pytest.fixture(scope="module")
def mc_case():
    """K = 3 mixture with unequal weights, d = 4, three networks, 10^6 samples and the OLS oracle's fits.

    One sample set and one QR per degree serve the three networks (their 6 outputs are OLS'd jointly).
    """
    rng = np.random.default_rng(10)
    d = 4
    mix = random_mixture(d, rng)
    nets = {kind: random_net(kind, d, rng) for kind in KINDS}
    X = mix.sample(N_MC, np.random.default_rng(11))
    f = np.concatenate([nets[kind](X) for kind in KINDS], axis=1)  # [n, 6]
    F2 = monomial_features(X, 2, center=mix.mean)
    ols = {1: ols_with_robust_se(F2[:, : d + 1], f)[:2], 2: ols_with_robust_se(F2, f)[:2]}
    return mix, nets, ols


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("degree", [1, 2])
def test_matches_monte_carlo_least_squares(mc_case, kind, degree):
    # OLS on explicit monomials of 10^6 mixture samples estimates the population least-squares polynomial with
    # sampling error ~ n^-1/2; its HC0 sandwich covariance gives each prediction's standard error. 20 points x 2
    # outputs = 40 z-scores; |z| < 5 for all of them fails with probability < 40 * 5.7e-7 if the code is right.
    mix, nets, ols = mc_case
    net = nets[kind]
    o = 2 * KINDS.index(kind)
    beta, covs = ols[degree]
    beta, covs = beta[:, o : o + 2], covs[o : o + 2]
    X_eval = mix.sample(20, np.random.default_rng(7))
    F_eval = monomial_features(X_eval, degree, center=mix.mean)
    methods = ["auto"] if degree == 1 else ["cg", "dense"]
    for method in methods:
        p = fit_polynomial(net, mix, degree, method=method)
        z = prediction_z_scores(F_eval, beta, covs, p(X_eval))
        assert np.abs(z).max() < 5.0, (kind, degree, method, np.abs(z).max())
    if degree == 2:
        assert p.solver_info["relative_residual"] < 1e-8
        # power check: the same test rejects the pooled-Gaussian quadratic (a different, wrong optimum)
        z_wrong = prediction_z_scores(F_eval, beta, covs, fit_polynomial(net, mix.pooled(), 2)(X_eval))
        assert np.abs(z_wrong).max() > 10.0


def test_degree_three_dense_matches_monte_carlo():
    # Degree >= 3 under a mixture goes through the dense path; same oracle as above with 20 cubic features.
    rng = np.random.default_rng(20)
    d = 3
    mix = random_mixture(d, rng)
    net = random_net("relu", d, rng)
    X = mix.sample(N_MC // 2, np.random.default_rng(21))
    F = monomial_features(X, 3, center=mix.mean)
    beta, covs, _ = ols_with_robust_se(F, net(X))
    X_eval = mix.sample(20, np.random.default_rng(22))
    p = fit_polynomial(net, mix, 3)
    assert p.info["method"] == "exact-mixture-dense" and p.degree == 3
    z = prediction_z_scores(monomial_features(X_eval, 3, center=mix.mean), beta, covs, p(X_eval))
    assert np.abs(z).max() < 5.0


# ------------------------------------------------------------------ K = 1 (oracle 2)
@pytest.mark.parametrize("kind", ["relu", "glu"])
@pytest.mark.parametrize("method", ["cg", "dense"])
def test_single_component_equals_single_gaussian(kind, method):
    rng = np.random.default_rng(30)
    d = 5
    net = random_net(kind, d, rng, d_out=3)
    L = rng.standard_normal((d, d)) / np.sqrt(d)
    g = Gaussian(rng.normal(0, 1, d), L @ L.T + 0.1 * np.eye(d))
    mix = GaussianMixture(np.ones(1), g.mean[None], g.cov[None])
    p = fit_mixture(net, mix, 2, method=method, tol=1e-14, fvu_tol=0.0)
    ref = fit_ridge(net, g, 2)
    for k in range(3):
        assert rel_max_diff(p.coefficients(k), ref.coefficients(k)) < 1e-10


# ------------------------------------------------------------------ matrix-free vs dense (oracle 3)
@pytest.mark.parametrize("d", [10, 20, 30])
def test_matrix_free_agrees_with_dense(d):
    rng = np.random.default_rng(40 + d)
    mix = random_mixture(d, rng, weights=(0.45, 0.3, 0.15, 0.1))
    net = random_net("gelu" if d != 20 else "glu", d, rng, d_hidden=12, d_out=3)
    p_cg = fit_mixture(net, mix, 2, method="cg", tol=1e-13, fvu_tol=0.0, maxiter=2000)
    p_dense = fit_mixture(net, mix, 2, method="dense")
    for k in range(3):
        assert rel_max_diff(p_cg.coefficients(k), p_dense.coefficients(k)) < 1e-8, k
    X = mix.sample(1000, np.random.default_rng(1))
    assert rel_max_diff(p_cg(X), p_dense(X)) < 1e-8
    si = p_cg.solver_info
    assert si["method"] == "pcg" and si["relative_residual"] < 1e-12 and 0 < si["iterations"] < 2000


def test_fused_operator_equals_sum_of_component_operators():
    # The CG operator batches its passes over components; it must equal the documented per-component formula
    # summed with the mixture weights (the latter is checked against the dense Gram by the test above).
    from mlpinterp.poly.mixture.coordinates import SupportCoordinates
    from mlpinterp.poly.mixture.operator import MixtureOperator

    rng = np.random.default_rng(45)
    mix = random_mixture(7, rng, weights=(0.4, 0.3, 0.2, 0.1), ranks=[7, 3, 7, 7])
    op = MixtureOperator(SupportCoordinates.of(mix), mix.weights, "diagonal", "cpu", torch.float64)
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(3, 7, 7, generator=gen, dtype=torch.float64)
    theta = (torch.randn(3, generator=gen, dtype=torch.float64), torch.randn(3, 7, generator=gen, dtype=torch.float64),
             A + A.transpose(1, 2))
    for fused, ref in zip(op.apply(theta), op.apply(None, components=[theta] * 4), strict=True):
        assert float((fused - ref).abs().max()) < 1e-12 * float(ref.abs().max())


def test_moment_table_matches_isserlis_by_hand():
    # Hand derivation for N(m, S) in 2-D: E[u1^2 u2] = m2 (S11 + m1^2) + 2 m1 S12;
    # E[u1^4] = m1^4 + 6 m1^2 S11 + 3 S11^2; E[u1^2 u2^2] = (S11 + m1^2)(S22 + m2^2) + 2 S12^2 + 4 m1 m2 S12.
    m = np.array([[0.7, -0.4]])
    S = np.array([[[1.3, 0.5], [0.5, 0.8]]])
    rows, vals, *_ = moment_table(m, S, 4)
    table = {tuple(int(i) for i in row if i < 2): v for row, v in zip(rows, vals[0], strict=True)}
    m1, m2, s11, s12, s22 = 0.7, -0.4, 1.3, 0.5, 0.8
    assert table[(0, 0, 1)] == pytest.approx(m2 * (s11 + m1**2) + 2 * m1 * s12, rel=1e-14)
    assert table[(0, 0, 0, 0)] == pytest.approx(m1**4 + 6 * m1**2 * s11 + 3 * s11**2, rel=1e-14)
    assert table[(0, 0, 1, 1)] == pytest.approx((s11 + m1**2) * (s22 + m2**2) + 2 * s12**2 + 4 * m1 * m2 * s12,
                                                rel=1e-14)


# ------------------------------------------------------------------ singular mixtures (oracle 4)
def test_singular_mixture_solved_on_support():
    # All components live in the affine plane x0 + span(B) (r = 3 inside d = 5); one component is rank 1
    # inside it. The same least-squares problem posed in the plane's coordinates s (x = x0 + B s) with the
    # reduced network W1 B, b1 + W1 x0 is non-singular; its optimum must give the same predictions on samples.
    rng = np.random.default_rng(50)
    d, r = 5, 3
    B = np.linalg.qr(rng.standard_normal((d, r)))[0]
    x0 = rng.normal(0, 1, d)
    red = random_mixture(r, rng, ranks=[3, 1, 3])  # component 1 is singular within the plane
    mix = GaussianMixture(red.weights, x0 + red.means @ B.T, np.einsum("ia,kab,jb->kij", B, red.covs, B))
    net = random_net("relu", d, rng)
    red_net = MLP(net.W1 @ B, net.b1 + net.W1 @ x0, net.W2, net.b2, "relu")
    p = fit_mixture(net, mix, 2, method="cg", tol=1e-13, fvu_tol=0.0, maxiter=2000)
    p_red = fit_mixture(red_net, red, 2, method="dense")
    S = red.sample(500, np.random.default_rng(2))
    assert rel_max_diff(p(x0 + S @ B.T), p_red(S)) < 1e-8
    si = p.solver_info
    assert si["singular"] and si["support_rank"] == r and "support" in si["note"]
    # off the support, p is extended by orthogonal projection onto it
    off = x0 + S[:5] @ B.T + rng.standard_normal((5, d)) @ (np.eye(d) - B @ B.T)
    np.testing.assert_allclose(p(off), p(x0 + S[:5] @ B.T), rtol=1e-9, atol=1e-9)
    # and the dense path in the full coordinates agrees
    assert rel_max_diff(fit_mixture(net, mix, 2, method="dense")(x0 + S @ B.T), p_red(S)) < 1e-8


def test_singular_component_matches_monte_carlo_on_support():
    # Independent of the reduction above: sample the singular mixture, find its support from the samples (SVD),
    # and run OLS on monomials of the support coordinates.
    rng = np.random.default_rng(60)
    d, r = 4, 3
    B = np.linalg.qr(rng.standard_normal((d, r)))[0]
    red = random_mixture(r, rng, ranks=[3, 2, 3])
    mix = GaussianMixture(red.weights, red.means @ B.T, np.einsum("ia,kab,jb->kij", B, red.covs, B))
    net = random_net("gelu", d, rng)
    X = mix.sample(N_MC // 2, np.random.default_rng(61))
    basis = np.linalg.svd(X[:1000] - X[:1000].mean(0), full_matrices=False)[2][:r].T  # [d, r]
    F = monomial_features(X @ basis, 2)
    beta, covs, _ = ols_with_robust_se(F, net(X))
    X_eval = mix.sample(20, np.random.default_rng(62))
    z = prediction_z_scores(monomial_features(X_eval @ basis, 2), beta, covs, fit_polynomial(net, mix, 2)(X_eval))
    assert np.abs(z).max() < 5.0


# ------------------------------------------------------------------ precision, preconditioners, device
def test_float32_error_bounded():
    # float32 CG: the solver's attainable relative residual is ~ kappa * eps32 (eps32 = 1.2e-7); we bound the
    # excess mean squared error E_mix[(p32 - p64)^2] relative to Var_mix(f) by 1e-6 (measured ~1e-9 here).
    rng = np.random.default_rng(70)
    d = 12
    mix = random_mixture(d, rng)
    net = random_net("relu", d, rng, d_hidden=16, d_out=3)
    p64 = fit_mixture(net, mix, 2, tol=1e-12, fvu_tol=0.0)
    p32 = fit_mixture(net, mix, 2, dtype=torch.float32, tol=1e-6, fvu_tol=1e-9)
    assert p32.solver_info["dtype"] == "float32"
    X = mix.sample(100_000, np.random.default_rng(3))
    f = net(X)
    excess = ((p32(X) - p64(X)) ** 2).sum(1).mean() / ((f - f.mean(0)) ** 2).sum(1).mean()
    assert 0 < excess < 1e-6


@pytest.mark.parametrize(("pre", "init"), [("pooled", "pooled"), ("none", "pooled"), ("diagonal", "zero")])
def test_preconditioners_and_starts_reach_the_same_solution(pre, init):
    rng = np.random.default_rng(80)
    d = 8
    mix = random_mixture(d, rng)
    net = random_net("relu", d, rng)
    ref = fit_mixture(net, mix, 2, method="dense")
    # float64 throughout: the monotone explained variance below is a property of CG in exact arithmetic (the
    # library default "auto" may run bfloat16 sweeps, whose restarts are not monotone)
    p = fit_mixture(net, mix, 2, preconditioner=pre, init=init, tol=1e-13, fvu_tol=0.0, maxiter=3000, dtype="float64")
    assert rel_max_diff(p.coefficients(2), ref.coefficients(2)) < 1e-8
    assert p.solver_info["preconditioner"] == pre and p.solver_info["init"] == init
    # the tracked explained variance increases monotonically (CG decreases the energy-norm error every step)
    ev = np.array(p.solver_info["explained_variance_history"])
    assert np.all(np.diff(ev) >= -1e-12 * abs(ev[-1]))


def test_energy_stopping_rule_bounds_the_excess_fvu():
    # Stopping on the estimated excess FVU (CG's energy-norm error) must leave an actual excess FVU of the same
    # order: E[(p - p*)^2] / Var(f) computed by Monte Carlo against the dense optimum p*.
    rng = np.random.default_rng(90)
    d = 15
    mix = random_mixture(d, rng)
    net = random_net("relu", d, rng, d_hidden=20, d_out=3)
    ref = fit_mixture(net, mix, 2, method="dense")
    p = fit_mixture(net, mix, 2, tol=1e-14, fvu_tol=1e-6)
    assert p.solver_info["stopped_by"] == "fvu"
    X = mix.sample(50_000, np.random.default_rng(4))
    f = net(X)
    excess = ((p(X) - ref(X)) ** 2).sum(1).mean() / ((f - f.mean(0)) ** 2).sum(1).mean()
    assert excess < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    rng = np.random.default_rng(95)
    mix = random_mixture(10, rng)
    net = random_net("relu", 10, rng)
    p_cpu = fit_mixture(net, mix, 2, device="cpu", tol=1e-13, fvu_tol=0.0)
    p_gpu = fit_mixture(net, mix, 2, device="cuda", tol=1e-13, fvu_tol=0.0)
    assert p_gpu.solver_info["device"].startswith("cuda")
    assert rel_max_diff(p_gpu.coefficients(2), p_cpu.coefficients(2)) < 1e-9
    # float32 operator with float64 refinement, warm-started, on the GPU: the same answer
    p32 = fit_mixture(net, mix, 2, device="cuda", dtype=torch.float32, tol=1e-11, fvu_tol=0.0, warm_start=p_gpu)
    assert p32.solver_info["init"] == "warm" and p32.solver_info["converged"]
    assert rel_max_diff(p32.coefficients(2), p_cpu.coefficients(2)) < 1e-7


# ------------------------------------------------------------------ hybrid SGD (paper's baseline)
def test_sgd_hybrid_improves_on_its_init_and_not_on_the_exact_optimum():
    rng = np.random.default_rng(100)
    d = 4
    mix = random_mixture(d, rng)
    net = random_net("relu", d, rng)
    p = fit_sgd(net, mix, 2, steps=300, lr=1e-3, eval_every=100, n_eval=20_000, seed=1, progress=False)
    h = p.info["history"]
    assert [e["step"] for e in h] == [0, 100, 200, 300]
    assert all(b["wall_time_s"] >= a["wall_time_s"] for a, b in zip(h, h[1:], strict=False))
    assert h[-1]["fvu"] < 0.7 * h[0]["fvu"]
    # the exact optimum on the same held-out sample is at least as good (up to sampling noise)
    X_eval = mix.sample(20_000, np.random.default_rng(2))
    f = net(X_eval)
    exact = ((f - fit_polynomial(net, mix, 2)(X_eval)) ** 2).sum() / ((f - f.mean(0)) ** 2).sum()
    assert exact <= h[-1]["fvu"] + 1e-3
    # deterministic given the seed
    p2 = fit_sgd(net, mix, 2, steps=300, lr=1e-3, eval_every=100, n_eval=20_000, seed=1, progress=False)
    np.testing.assert_array_equal(p2.coefficients(2), p.coefficients(2))
    # the dispatcher routes method="sgd" here
    p3 = fit_polynomial(net, mix, 2, method="sgd", steps=5, progress=False, optimizer="adamw")
    assert p3.info["method"] == "sgd-hybrid" and p3.info["optimizer"] == "adamw"


def test_sgd_target_fvu_stops_early():
    rng = np.random.default_rng(101)
    mix = random_mixture(3, rng)
    net = random_net("relu", 3, rng)
    p = fit_sgd(net, mix, 2, steps=10_000, target_fvu=1.0, eval_every=10, progress=False)  # init already < 1
    assert p.info["time_to_target_s"] == 0.0 and p.info["steps"] == 0


# ------------------------------------------------------------------ bad input
def test_bad_mixtures_raise_clear_errors():
    rng = np.random.default_rng(110)
    covs = np.stack([np.eye(3)] * 3)
    with pytest.raises(ValueError, match="weights must sum to 1"):
        GaussianMixture(np.array([0.5, 0.3, 0.1]), rng.normal(size=(3, 3)), covs)
    with pytest.raises(ValueError, match=r"means must have shape \[K=3, d\]"):
        GaussianMixture(np.array([0.5, 0.3, 0.2]), rng.normal(size=(2, 3)), covs)
    with pytest.raises(ValueError, match=r"covs must have shape \[3, 3, 3\]"):
        GaussianMixture(np.array([0.5, 0.3, 0.2]), rng.normal(size=(3, 3)), covs[:2])
    bad = covs.copy()
    bad[1] = np.diag([1.0, -0.5, 1.0])
    with pytest.raises(ValueError, match=r"covs\[1\] must be positive semi-definite"):
        GaussianMixture(np.array([0.5, 0.3, 0.2]), rng.normal(size=(3, 3)), bad)


def test_bad_arguments_raise_clear_errors():
    rng = np.random.default_rng(120)
    mix = random_mixture(4, rng)
    net = random_net("relu", 4, rng)
    with pytest.raises(TypeError, match="mixture must be mlpinterp.GaussianMixture"):
        fit_mixture(net, mix.pooled(), 2)
    with pytest.raises(ValueError, match="mixture has dimension 4 but the network has d_in = 5"):
        fit_mixture(random_net("relu", 5, rng), mix, 2)
    with pytest.raises(ValueError, match="method must be one of"):
        fit_mixture(net, mix, 2, method="lu")
    with pytest.raises(ValueError, match="preconditioner must be one of"):
        fit_mixture(net, mix, 2, preconditioner="ilu")
    with pytest.raises(ValueError, match="solves degree 2 only"):
        fit_mixture(net, mix, 3, method="cg")
    with pytest.raises(ValueError, match="dtype must be"):
        fit_mixture(net, mix, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="tol must be a positive number"):
        fit_mixture(net, mix, 2, tol=0.0)
    with pytest.raises(ValueError, match="fvu_tol must be a non-negative number"):
        fit_mixture(net, mix, 2, fvu_tol=-1.0)
    with pytest.raises(ValueError, match="window must be a positive integer"):
        fit_mixture(net, mix, 2, window=0)
    with pytest.raises(ValueError, match="init must be 'pooled' or 'zero'"):
        fit_mixture(net, mix, 2, init="random")
    with pytest.raises(ValueError, match="residual_tol must be a positive number"):
        fit_mixture(net, mix, 2, residual_tol=0)
    with pytest.raises(TypeError, match="warm_start must be a DensePolynomial or RidgePolynomial"):
        fit_mixture(net, mix, 2, warm_start=np.zeros(3))
    with pytest.raises(ValueError, match="warm_start must be a polynomial of degree <= 2 with d_in = 4"):
        fit_mixture(net, mix, 2, warm_start=fit_polynomial(random_net("relu", 5, rng), Gaussian.standard(5), 2))
    with pytest.raises(ValueError, match="warm_start applies to method='cg' only"):
        fit_mixture(net, mix, 2, method="dense", warm_start=fit_polynomial(net, mix, 1))
    with pytest.raises(ValueError, match="maxiter must be a positive integer"):
        fit_mixture(net, mix, 2, maxiter=0)
    with pytest.raises(ValueError, match="degree must be 1 or 2"):
        fit_sgd(net, mix, 3)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        fit_sgd(net, mix, 2, optimizer="lbfgs")
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        fit_sgd(net, mix, 2, batch_size=0)


def test_too_large_degree_says_what_fits():
    # degree 3 at d = 40: C(43, 3) = 12341 features; the message must name the largest support dimension r with
    # C(r + 3, 3) <= MAX_DENSE_FEATURES, found here by brute force (r = 29 for the limit 5000: C(32, 3) = 4960).
    r_max = max(r for r in range(1, 200) if math.comb(r + 3, 3) <= MAX_DENSE_FEATURES)
    assert math.comb(43, 3) > MAX_DENSE_FEATURES  # the case below really is over the limit
    rng = np.random.default_rng(130)
    d = 40
    mix = GaussianMixture(np.array([0.6, 0.4]), rng.normal(size=(2, d)), np.stack([np.eye(d)] * 2))
    net = random_net("relu", d, rng)
    with pytest.raises(ValueError, match=rf"C\(r \+ 3, 3\) = 12341 .* r <= {r_max}\b"):
        fit_polynomial(net, mix, 3)
    with pytest.raises(ValueError, match="use method='cg'"):
        fit_mixture(random_net("relu", 120, rng), GaussianMixture(np.ones(1), np.zeros((1, 120)), np.eye(120)[None]),
                    2, method="dense")


@pytest.mark.parametrize("blocks", [None, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_fused_operator_in_place_equals_the_out_of_place_formula(dtype, blocks, monkeypatch):
    # _apply_fused builds half of g2 and adds its transpose, with the sandwiches S_k A S_k in block-lower parts
    # the values must be those of the out-of-place formula it replaced, to the rounding of the dtype
    # (the summation order changed), and exactly symmetric.
    import mlpinterp.poly.mixture.operator as op_mod
    from mlpinterp.poly.mixture.coordinates import SupportCoordinates
    from mlpinterp.poly.mixture.operator import MixtureOperator

    if blocks is not None:  # the block-lower sandwiches at r = 9: blocks of 3
        monkeypatch.setattr(op_mod, "LOWER_BLOCKS", blocks)
        monkeypatch.setattr(op_mod, "LOWER_BLOCKS_MIN_R", 0)
    rng = np.random.default_rng(46)
    mix = random_mixture(9, rng, weights=(0.4, 0.3, 0.0, 0.3), ranks=[9, 4, 9, 9])
    op = MixtureOperator(SupportCoordinates.of(mix), mix.weights, "diagonal", "cpu", dtype)
    wd = op.work_dtype
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(3, 9, 9, generator=gen, dtype=wd)
    c, b, A = torch.randn(3, generator=gen, dtype=wd), torch.randn(3, 9, generator=gen, dtype=wd), A + A.transpose(1, 2)
    g0, g1, g2 = op.apply((c, b, A))
    # the replaced code: a fresh product per component, 0.5 * (g2 + g2^T) out of place
    o, r = b.shape
    pi, m, S = op.pi_t, op.m, op.S
    AM = torch.matmul(A, m.T)
    e0 = c[:, None] + b @ m.T + torch.einsum("ork,kr->ok", AM, m) + A.reshape(o, r * r) @ S.reshape(-1, r * r).T
    ev = torch.einsum("okr,krs->oks", b[:, None, :] + 2 * AM.transpose(1, 2), S)
    pe0 = e0 * pi
    ref = (pe0 @ op.Q.reshape(-1, r * r)).reshape(o, r, r)
    W = torch.einsum("kr,oks->ors", m * pi[:, None], ev)
    ref += W
    ref += W.transpose(1, 2)
    A2 = A.reshape(o * r, r).to(dtype)
    S_gemm = op._S64.to(dtype)
    for k, pk in enumerate(op.pi):
        if pk == 0.0:
            continue
        Y = (A2 @ S_gemm[k]).reshape(o, r, r)
        if dtype == torch.bfloat16:
            ref.add_(torch.bmm(S_gemm[k].expand(o, r, r), Y), alpha=2.0 * pk)
        else:
            ref.baddbmm_(S[k].expand(o, r, r), Y, alpha=2.0 * pk)
    ref = 0.5 * (ref + ref.transpose(1, 2))
    tol = {torch.float64: 1e-13, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    assert float((g2 - ref).norm() / ref.norm()) < tol
    assert torch.equal(g2, g2.transpose(1, 2))
    assert torch.equal(g0, pe0.sum(1))


def test_progress_never_changes_which_mixture_solver_runs():
    """``progress=True`` only shows the solve: a degree-2 fit that takes the cached Cholesky route takes it with the
    bar too (it used to switch to CG), with bit-identical coefficients; CG options still select CG."""
    from mlpinterp.poly.fit import mixture_route

    rng = np.random.default_rng(41)
    d = 4
    mix = random_mixture(d, rng)
    net = random_net("gelu", d, rng)
    quiet = fit_polynomial(net, mix, 2)
    shown = fit_polynomial(net, mix, 2, progress=True)
    assert quiet.info["method"] == "exact-mixture-dense-cached"
    assert shown.info["method"] == quiet.info["method"]
    for a, b in zip(shown.tensors, quiet.tensors, strict=True):
        np.testing.assert_array_equal(a, b)
    assert fit_polynomial(net, mix, 2, tol=1e-12).info["method"] == "exact-mixture-cg"
    assert mixture_route(2, "auto", d, {"progress": True}) == "cached"
    assert mixture_route(2, "auto", d, {"progress": True, "maxiter": 10}) == "cg"
    assert mixture_route(3, "exact", d, {}) == "dense"
    assert mixture_route(1, "cg", d, {}) == "linear"
    with pytest.raises(ValueError, match="unknown method 'newton'"):
        mixture_route(2, "newton", d, {})
