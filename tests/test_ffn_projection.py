"""The ridge family (readout.py) and its exact least-squares projection on samples (projection.py).

Oracles: the closed form under one Gaussian (the projection on its samples converges to it at the sampling rate),
brute-force least squares on independently built features (numpy's hermeval, explicit loops), direct in-sample
sums, and two gloo processes against one.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermeval

import mlpinterp as mi
from mlpinterp.poly.projection import normal_equations, project_on_data, solve_projection
from mlpinterp.poly.readout import Readout, RidgeBasis
from tests.gloo import run_forked
from tests.helpers import random_network

D, H, O = 5, 7, 3


def _nets(rng):
    mlp = random_network("mlp", D, H, O, None, rng, scaled=False)
    return {"mlp": mlp, "glu": random_network("glu", D, H, O, None, rng, scaled=False)}


def _gaussian(rng, singular=False):
    Q = rng.standard_normal((D, D - 1 if singular else D))
    return mi.Gaussian(rng.standard_normal(D), Q @ Q.T / D + (0 if singular else 0.1) * np.eye(D))


@pytest.mark.parametrize("kind", ["mlp", "glu"])
@pytest.mark.parametrize("singular", [False, True])
def test_closed_form_roundtrip_through_the_family(kind, singular):
    rng = np.random.default_rng(1)
    net, g = _nets(rng)[kind], _gaussian(rng, singular)
    X = g.sample(500, rng)
    for n in (1, 2, 3):
        p = mi.fit_polynomial(net, g, n)
        basis = RidgeBasis.from_closed_form(p, g)
        ro = Readout.from_closed_form(p, basis)
        scale = np.abs(p(X)).max()
        np.testing.assert_allclose(ro(X), p(X), atol=1e-11 * scale)
        np.testing.assert_allclose(ro.to_polynomial()(X), p(X), atol=1e-11 * scale)
        B = ro.coefficients_matrix()
        assert B.shape == (basis.n_features(n), O)
        np.testing.assert_array_equal(Readout.from_coefficients(basis, B, n).coefficients_matrix(), B)
        # the expanded RidgePolynomial also has the right coefficient tensors (raw monomial coordinates)
        if n == 2:
            np.testing.assert_allclose(ro.to_polynomial().coefficients(2), p.coefficients(2), atol=1e-10 * scale)


def _brute_features(basis: RidgeBasis, X, n):
    """The ridge features built independently: explicit loops over neurons and numpy's HermiteE evaluation."""
    Xc = X - basis.center
    cols = [np.ones(len(X))] + [Xc @ basis.white[:, i] for i in range(basis.rank)]
    for t in range(2, n + 1):
        for j in range(basis.d_hidden):
            cols.append(hermeval(Xc @ basis.A[j], [0] * t + [1]))
        if basis.G is not None:
            for j in range(basis.d_hidden):
                cols.append((Xc @ basis.G[j]) * hermeval(Xc @ basis.A[j], [0] * (t - 1) + [1]))
    return np.stack(cols, 1)


@pytest.mark.parametrize("kind", ["mlp", "glu"])
def test_projection_equals_brute_force_least_squares(kind):
    rng = np.random.default_rng(2)
    net, g = _nets(rng)[kind], _gaussian(rng)
    basis = RidgeBasis.from_closed_form(mi.fit_polynomial(net, g, 3), g)
    X = g.sample(3000, rng) + 0.3 * rng.standard_t(3, size=(3000, D))  # not Gaussian
    proj = project_on_data(net, basis, X, [1, 2, 3], ridge=0.0, chunk=700)
    for n in (1, 2, 3):
        Phi = _brute_features(basis, X, n)
        np.testing.assert_allclose(basis.features(X, n), Phi, rtol=1e-10, atol=1e-10)
        B = np.linalg.lstsq(Phi, net(X), rcond=None)[0]
        ro, info = proj[n]
        np.testing.assert_allclose(ro(X), Phi @ B, rtol=1e-7, atol=1e-7 * np.abs(Phi @ B).max())
        resid = net(X) - Phi @ B
        fvu = (resid**2).sum() / ((net(X) - net(X).mean(0)) ** 2).sum()
        assert info["fvu"] == pytest.approx(fvu, rel=1e-7)
    # degree 1 is ordinary least squares of an affine map
    A1 = np.c_[np.ones(len(X)), X]
    ols = A1 @ np.linalg.lstsq(A1, net(X), rcond=None)[0]
    np.testing.assert_allclose(proj[1][0](X), ols, atol=1e-8 * np.abs(ols).max())
    # nested: the in-sample FVU never increases with the degree
    assert proj[1][1]["fvu"] >= proj[2][1]["fvu"] >= proj[3][1]["fvu"]


@pytest.mark.parametrize("kind", ["mlp", "glu"])
def test_projection_on_gaussian_samples_converges_to_the_closed_form(kind):
    # under one Gaussian the closed form is the population optimum of the family, so the sample projection's
    # distance to it shrinks like 1 / sqrt(m): check the rate across sample sizes and the level at the largest
    rng = np.random.default_rng(3)
    net, g = _nets(rng)[kind], _gaussian(rng)
    p = mi.fit_polynomial(net, g, 2)
    basis = RidgeBasis.from_closed_form(p, g)
    Xe = g.sample(20_000, np.random.default_rng(99))
    ref = p(Xe)
    errs = []
    for m in (4_000, 64_000):
        ro, _ = project_on_data(net, basis, g.sample(m, rng), [2])[2]
        errs.append(np.sqrt(((ro(Xe) - ref) ** 2).mean() / ref.var(0).sum()))
    assert errs[1] < errs[0] / 2.5  # 16x the samples: 4x smaller in expectation
    assert errs[1] < 0.05


def test_in_sample_fvu_and_ridge():
    rng = np.random.default_rng(4)
    net, g = _nets(rng)["mlp"], _gaussian(rng)
    basis = RidgeBasis.from_closed_form(mi.fit_polynomial(net, g, 2), g)
    X = g.sample(2000, rng)
    neq = normal_equations(net, basis, X, 2)
    ro0, info0 = solve_projection(neq, basis, ridge=0.0)
    ro1, info1 = solve_projection(neq, basis, ridge=1e-1)
    assert info1["lam"] > 0 and info1["fvu"] > info0["fvu"]  # a ridge trades in-sample fit for stability
    Y, P = net(X), ro1(X)
    assert info1["fvu"] == pytest.approx(((Y - P) ** 2).sum() / ((Y - Y.mean(0)) ** 2).sum(), rel=1e-8)


def test_bad_input():
    rng = np.random.default_rng(5)
    net, g = _nets(rng)["mlp"], _gaussian(rng)
    basis = RidgeBasis.from_closed_form(mi.fit_polynomial(net, g, 3), g)
    with pytest.raises(ValueError, match="only 10 samples"):
        project_on_data(net, basis, g.sample(10, rng), [3])
    with pytest.raises(ValueError, match=r"X must have shape \[m, d_in=5\]"):
        normal_equations(net, basis, np.zeros((50, 4)), 2)
    with pytest.raises(ValueError, match="degree"):
        normal_equations(net, basis, g.sample(50, rng), 0)
    with pytest.raises(ValueError, match="B must have shape"):
        Readout.from_coefficients(basis, np.zeros((3, O)), 2)
    with pytest.raises(ValueError, match="ridge"):
        solve_projection(normal_equations(net, basis, g.sample(500, rng), 1), basis, ridge=-1.0)


def _worker(rank: int, world: int, init_file: str, out_dir: str, X, net, basis) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        ro, info = project_on_data(net, basis, X[rank::world], [2])[2]
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump({"B": ro.coefficients_matrix().tolist(), "fvu": info["fvu"], "n": info["n"]}, f)
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_project_like_one(tmp_path):
    rng = np.random.default_rng(6)
    net, g = _nets(rng)["glu"], _gaussian(rng)
    basis = RidgeBasis.from_closed_form(mi.fit_polynomial(net, g, 2), g)
    X = g.sample(3000, rng)
    ro, info = project_on_data(net, basis, X, [2])[2]
    run_forked(_worker, (2, str(tmp_path / "init"), str(tmp_path), X, net, basis), what="the 2-process gloo projection")
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got["n"] == 3000
        np.testing.assert_allclose(got["B"], ro.coefficients_matrix(), rtol=1e-8, atol=1e-10)
        assert got["fvu"] == pytest.approx(info["fvu"], rel=1e-9)


def test_validation_ridge_guards_against_overfitting():
    # few samples per feature: the smallest ridge overfits; the validation choice is never worse on held-back data
    rng = np.random.default_rng(7)
    net, g = _nets(rng)["glu"], _gaussian(rng)
    basis = RidgeBasis.from_closed_form(mi.fit_polynomial(net, g, 3), g)
    n_feat = basis.n_features(3)
    X = g.sample(3 * n_feat, rng) + 0.5 * rng.standard_t(2, size=(3 * n_feat, D))
    Xv = g.sample(4000, rng) + 0.5 * rng.standard_t(2, size=(4000, D))
    auto = project_on_data(net, basis, X, [2, 3], ridge="validation", X_val=Xv)
    for d in (2, 3):
        info = auto[d][1]
        assert info["fvu_val"] == min(e["fvu_val"] for e in info["ridge_path"])
        tiny = next(e for e in info["ridge_path"] if e["ridge"] == min(e["ridge"] for e in info["ridge_path"]))
        Y = net(Xv)
        direct = ((auto[d][0](Xv) - Y) ** 2).sum() / ((Y - Y.mean(0)) ** 2).sum()
        assert direct == pytest.approx(info["fvu_val"], rel=1e-9) and info["fvu_val"] <= tiny["fvu_val"]
    with pytest.raises(ValueError, match="needs X_val"):
        project_on_data(net, basis, X, [2], ridge="validation")
    with pytest.raises(ValueError, match="'validation'"):
        project_on_data(net, basis, X, [2], ridge="auto")
