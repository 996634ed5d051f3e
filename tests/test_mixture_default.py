"""The library default of the exact mixture quadratic on singular operators (``fit_polynomial(net, mixture, 2,
method="cg")``, ``dtype="auto"``, on a CPU with fast bfloat16 GEMMs): the canonical answer on every component's
support, another solution of the normal equations off them, and ``solver_info`` says so.

Oracles: the float64 solve at ``tol`` 1e-12 (the canonical answer; ``test_mixture_cg.py`` checks it against the
dense normal equations), and the dense Gram ``G = E_mix[phi phi^T]`` of the orthonormal features ``phi(u) = (1, u_i,
u_i^2, sqrt2 u_i u_j)`` of the CG's inner product from the Stein-recursion moment table, with the right-hand side
``h = G w`` of the dense moment-table solve (independent of the operator's closed forms).

Tolerance (derived, not tuned). Write ``w`` for a solution's coordinates, ``e = ||G w - h||`` for its residual
(per output) and ``lambda_+`` for the smallest positive eigenvalue of G. For two solutions, ``dw = w - w'``:
``E_mix[(p - p')^2] = dw^T G dw <= ||G dw||^2 / lambda_+ <= (e + e')^2 / lambda_+``. Component k (weight pi_k) has
``G_k = E_k[phi phi^T]`` with ``pi_k G_k <= G``, so ``dw^T G_k dw <= (e + e')^2 / (pi_k lambda_+)``; and a point x
on component k's support has ``phi(x)`` in ``range(G_k)``, so by Cauchy-Schwarz in the ``G_k`` metric
``|p(x) - p'(x)| <= sqrt(dw^T G_k dw) sqrt(phi(x)^T G_k^+ phi(x))``. With the default's residual bounded by its
``relative_residual`` (checked here against ``G``), this bounds the prediction difference at every sample of every
component. Off the supports nothing bounds it: bfloat16 rounding adds a polynomial vanishing on every support, whose
size is reported (``record_property``), not asserted.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from mlpinterp import GaussianMixture
from mlpinterp.poly.fit import fit_polynomial
from mlpinterp.poly.mixture.coordinates import coordinates_of
from mlpinterp.poly.mixture.exact import fit_mixture
from tests.test_mixture_cg import _gram_w, _mixture, _net, _solution_w

torch.set_num_threads(1)


def _zero_coordinate_mixture(rng):
    """MNIST-like classes in R^6: each class varies on its own coordinates only and is exactly 0 on the others
    (constant pixels); coordinate 5 is 0 in every class (off the mixture's support), coordinate 0 in two of three."""
    d, lit = 6, [[1, 2, 3], [0, 2, 4], [1, 3, 4]]
    means, covs = np.zeros((3, d)), np.zeros((3, d, d))
    for k, idx in enumerate(lit):
        L = rng.standard_normal((len(idx), len(idx))) * 0.6
        means[k, idx] = rng.normal(0.5, 0.5, len(idx))
        covs[k][np.ix_(idx, idx)] = L @ L.T + 0.05 * np.eye(len(idx))
    return GaussianMixture(np.array([0.3, 0.3, 0.4]), means, covs)


def _phi(X, coords):
    """Orthonormal features ``[n, F]`` in the order of ``test_mixture_cg._basis``."""
    U = (X - coords.mean) @ coords.P
    r = U.shape[1]
    quad = [U[:, i] * U[:, j] * (1.0 if i == j else np.sqrt(2.0))
            for i, j in itertools.combinations_with_replacement(range(r), 2)]
    return np.column_stack([np.ones(len(X)), U, *quad])


def _pinv(G, rtol=1e-11):
    w, V = np.linalg.eigh(0.5 * (G + G.T))
    keep = w > rtol * w[-1]
    return (V[:, keep] / w[keep]) @ V[:, keep].T, float(w[keep].min())


CASES = {"ranks (2, 3, 1)": lambda rng: _mixture(5, [2, 3, 1], rng),
         "point mass + ranks (3, 1)": lambda rng: _mixture(5, [0, 3, 1], rng),
         "shared and per-class zero coordinates": _zero_coordinate_mixture}


@pytest.mark.parametrize("case", list(CASES))
def test_default_on_singular_operators_is_the_canonical_answer_on_every_support(case, monkeypatch, record_property):
    import mlpinterp.poly.mixture.operator as ex

    monkeypatch.setattr(ex, "cpu_has_fast_bfloat16", lambda: True)  # the rule of a CPU with fast bfloat16 GEMMs
    rng = np.random.default_rng(7)
    mix = CASES[case](rng)
    net = _net(mix.d, rng)
    coords = coordinates_of(mix)
    G = _gram_w(mix)
    h = G @ _solution_w(fit_mixture(net, mix, 2, method="dense"), mix)
    Gplus, lam_plus = _pinv(G)
    assert lam_plus < 1e6 * np.linalg.eigvalsh(G)[-1] and np.linalg.eigvalsh(G)[0] < 1e-10 * lam_plus  # singular

    p64 = fit_mixture(net, mix, 2, method="cg", dtype="float64", tol=1e-12, fvu_tol=0.0)  # the canonical answer
    assert p64.solver_info["converged"] and p64.solver_info["canonical"] and p64.solver_info["answer"] == "canonical"
    for kw in ({}, {"tol": 1e-9, "fvu_tol": 0.0}):  # the library's stopping rule, and a tight one
        p = fit_polynomial(net, mix, 2, method="cg", **kw)
        si = p.solver_info
        assert si["dtype_requested"] == "auto" and si["dtype"] == "bfloat16"
        assert si["operator_structure"] != "nonsingular" and "canonical answer on the components' supports" in si[
            "dtype_reason"]
        assert si["converged"] and not si["canonical"] and si["answer"] == "canonical on the support"
        assert "dtype='float64' for the canonical one" in si["extension_note"]
        # the residuals in the independent Gram: the solver's claims hold
        res = {}
        for name, q in (("default", p), ("float64", p64)):
            w = _solution_w(q, mix)
            res[name] = np.linalg.norm(G @ w - h, axis=0)
        hn = np.linalg.norm(h, axis=0)
        assert np.all(res["default"] <= 1.01 * si["relative_residual"] * hn + 1e-13 * hn)
        assert np.all(res["float64"] <= 1e-11 * hn)
        bound2 = (si["relative_residual"] * hn * 1.01 + res["float64"]) ** 2 / lam_plus  # [o]: >= E_mix[dp^2]
        for k in range(mix.K):
            Gk_plus, _ = _pinv(_gram_w(mix, np.eye(mix.K)[k]))
            X = mix.components[k].sample(200, np.random.default_rng(k))
            Phi = _phi(X, coords)
            tol_x = np.sqrt(bound2[None, :] / mix.weights[k] * np.einsum("nf,fg,ng->n", Phi, Gk_plus, Phi)[:, None])
            assert np.all(np.abs(p(X) - p64(X)) <= tol_x + 1e-12), (case, kw, k)
        off = np.random.default_rng(9).standard_normal((200, mix.d)) * 2.0  # off every component's support
        gap = float(np.abs(p(off) - p64(off)).max() / np.abs(p64(off)).max())
        record_property(f"off_support_relative_difference{'_tight' if kw else ''}", gap)
        assert np.isfinite(gap)

