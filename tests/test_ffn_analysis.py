"""Hybrid fine-tuning, eigen-features, Gaussianity diagnostics and splicing an FFN approximant into a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mlpinterp as mi
from mlpinterp.lm.features import eigen_features, output_directions, sae_alignment, unembedding_tokens
from mlpinterp.lm.gaussianity import gaussianity
from mlpinterp.poly.finetune_config import FinetuneConfig
from mlpinterp.poly.projection import project_on_data
from mlpinterp.poly.readout import Readout, RidgeBasis
from mlpinterp.poly.readout_finetune import ReadoutModule, finetune
from mlpinterp.poly.spectral import quadratic_forms
from tests.helpers import random_network

D, H, O = 6, 9, 4


def _setup(kind="mlp", seed=0):
    rng = np.random.default_rng(seed)
    net = random_network(kind, D, H, O, None, rng, scaled=False)
    # bimodal, heavy-tailed inputs: far from the moment-matched Gaussian
    X = np.concatenate([rng.standard_normal((3000, D)) + 2, rng.standard_t(3, size=(3000, D)) - 1])
    rng.shuffle(X)
    g = mi.Gaussian.from_data(X)
    return net, g, X


@pytest.mark.parametrize("kind", ["mlp", "glu"])
def test_readout_module_matches_the_readout(kind):
    net, g, X = _setup(kind)
    p = mi.fit_polynomial(net, g, 3)
    ro = Readout.from_closed_form(p, RidgeBasis.from_closed_form(p, g))
    mod = ReadoutModule(ro, dtype=torch.float64)
    np.testing.assert_allclose(mod(torch.tensor(X[:200])).detach().numpy(), ro(X[:200]), rtol=1e-10, atol=1e-10)
    back = mod.to_readout(ro.basis)
    np.testing.assert_allclose(back(X[:200]), ro(X[:200]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["mlp", "glu"])
def test_hybrid_improves_on_the_closed_form_and_is_seeded(kind):
    net, g, X = _setup(kind)
    p = mi.fit_polynomial(net, g, 2)
    start = Readout.from_closed_form(p, RidgeBasis.from_closed_form(p, g))
    cfg = FinetuneConfig(steps=150, batch_size=256, lr=3e-3, warmup_steps=10, eval_every=50)
    r1 = finetune(net, start, X[:5000], cfg, X_val=X[5000:])
    r2 = finetune(net, start, X[:5000], cfg, X_val=X[5000:])
    h = [e["fvu_val"] for e in r1.history]
    assert all(np.isfinite(h))
    if kind == "mlp":  # fine-tuning on the real law beats the Gaussian closed form on held-back data
        assert h[-1] < 0.7 * h[0], h
    np.testing.assert_array_equal(r1.readout.coefficients_matrix(), r2.readout.coefficients_matrix())
    assert not np.array_equal(r1.readout.basis.A, start.basis.A)  # directions move too
    with pytest.raises(ValueError, match="lr"):
        FinetuneConfig(lr=0)
    with pytest.raises(ValueError, match="X_fit must have shape"):
        finetune(net, start, X[:, :3], cfg)


def test_data_projection_beats_gaussian_closed_form_on_non_gaussian_data():
    net, g, X = _setup()
    fit, held = X[:5000], X[5000:]
    Y = net(held)
    fvu = lambda P: ((Y - P) ** 2).sum() / ((Y - Y.mean(0)) ** 2).sum()  # noqa: E731
    basis = RidgeBasis.from_closed_form(mi.fit_polynomial(net, g, 3), g)
    proj = project_on_data(net, basis, fit, [1, 2, 3])
    for n in (1, 2, 3):
        assert fvu(proj[n][0](held)) < fvu(mi.fit_polynomial(net, g, n)(held))


@pytest.mark.parametrize("kind", ["mlp", "glu"])
def test_quadratic_forms_match_the_coefficient_tensor(kind):
    net, g, X = _setup(kind)
    p = mi.fit_polynomial(net, g, 3)
    U = np.linalg.qr(np.random.default_rng(1).standard_normal((O, 2)))[0]
    want = np.einsum("om,ode->mde", U, p.coefficients(2))
    np.testing.assert_allclose(quadratic_forms(p, U), want, atol=1e-11 * np.abs(want).max())
    np.testing.assert_allclose(quadratic_forms(p.to_dense(), U), want, atol=1e-11 * np.abs(want).max())
    ef = eigen_features(p, U, n_top=3)
    w = ef["eigenvalues"]
    assert np.all(np.abs(w[:, :-1]) >= np.abs(w[:, 1:]))
    for m in range(2):  # Q v = lambda v
        for i in range(3):
            v = ef["eigenvectors"][m, :, i]
            np.testing.assert_allclose(want[m] @ v, w[m, i] * v, atol=1e-9 * np.abs(want).max())
    with pytest.raises(ValueError, match="degree >= 2"):
        quadratic_forms(mi.fit_polynomial(net, g, 1), U)
    with pytest.raises(ValueError, match="U must have shape"):
        quadratic_forms(p, np.zeros((O + 1, 2)))


def test_output_directions_are_principal_directions():
    rng = np.random.default_rng(2)
    Y = rng.standard_normal((5000, 3)) * np.array([5.0, 1.0, 0.2]) @ np.linalg.qr(rng.standard_normal((3, 3)))[0]
    U, frac = output_directions(Y, 2)
    w, V = np.linalg.eigh(np.cov(Y, rowvar=False))
    assert abs(abs(U[:, 0] @ V[:, -1]) - 1) < 1e-10 and frac[0] == pytest.approx(w[-1] / w.sum())


def test_sae_alignment_and_unembedding_tokens():
    rng = np.random.default_rng(3)
    V = np.linalg.qr(rng.standard_normal((32, 2)))[0]
    dec = np.concatenate([V.T * 3.0, rng.standard_normal((50, 32))])  # decoder holds both vectors (scaled)
    a = sae_alignment(V, dec)
    np.testing.assert_allclose(a["max_cos"], 1.0, atol=1e-12)
    assert a["fraction_above_random_p95"] == 1.0 and a["random_mean"] < 0.9
    b = sae_alignment(V, rng.standard_normal((50, 32)))
    assert max(b["max_cos"]) < 0.9

    class Tok:
        def decode(self, ids):
            return f"t{ids[0]}"

    W_U = rng.standard_normal((20, 32))
    top = unembedding_tokens(W_U[[7]].T / np.linalg.norm(W_U[7]), W_U, Tok(), n_tokens=3)
    assert top[0]["positive"][0] == "t7"
    assert top[0]["negative"][0] == f"t{int(np.argmin(W_U @ W_U[7]))}"


def test_gaussianity_diagnostics_against_known_laws():
    rng = np.random.default_rng(4)
    n = 40_000
    Xg = rng.standard_normal((n, 8))
    W = rng.standard_normal((64, 8))
    d = gaussianity(Xg, W, np.zeros(64))
    # Gaussian: excess kurtosis 0 (SE sqrt(24/n)), tail fraction 0.0027 (binomial SE over n tokens)
    assert np.all(np.abs(d["pc_excess_kurtosis"]) < 5 * np.sqrt(24 / n))
    assert abs(d["neuron_tail_fraction"] - 0.0027) < 5 * np.sqrt(0.0027 / n)
    assert d["neuron_bimodality_fraction"] == 0.0 and d["outlier_dims"] == []
    Xt = rng.standard_t(4, size=(n, 8))
    Xt[:, 3] *= 30  # one outlier dimension
    t = gaussianity(Xt, W, np.zeros(64))
    assert t["neuron_excess_kurtosis_median"] > 1.0 and t["neuron_tail_fraction"] > 2 * 0.0027
    assert t["outlier_dims"] == [3] and t["outlier_variance_fraction"] > 0.9
    with pytest.raises(ValueError, match="W must be"):
        gaussianity(Xg, W[:, :5])


def test_splicing_the_exact_block_back_recovers_the_clean_output():
    transformers = pytest.importorskip("transformers")
    from mlpinterp.lm.recovery import Replacement, downstream_comparison, recovered
    from tests.ffn_tiny import tiny_bert, tiny_gpt2, tokenizer

    tok = tokenizer()
    ids = tok(["a short sentence about cats and dogs"] * 2, return_tensors="pt")["input_ids"]
    for model, inp, outp, w1, w2 in [
        (tiny_bert(dtype=torch.float64), "encoder.layer.1.intermediate.dense", "encoder.layer.1.output.dense",
         "encoder.layer.1.intermediate.dense", "encoder.layer.1.output.dense"),
        (tiny_gpt2(dtype=torch.float64), "transformer.h.1.mlp.c_fc", "transformer.h.1.mlp.c_proj", None, None),
    ]:
        if w1 is not None:
            l1, l2 = model.get_submodule(w1), model.get_submodule(w2)
            net = mi.MLP(l1.weight, l1.bias, l2.weight, l2.bias, activation="gelu")
        else:
            mlp = model.get_submodule("transformer.h.1.mlp")
            net = mi.MLP(mlp.c_fc.weight.T, mlp.c_fc.bias, mlp.c_proj.weight.T, mlp.c_proj.bias, activation="gelu_tanh")
        exact = net.to_module()

        def fn(x, exact=exact):
            return exact(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)

        reps = {"exact": Replacement(outp, fn, input_of=inp),
                "zero": Replacement(outp, torch.zeros_like)}
        r = downstream_comparison(model, reps, ids)
        if r["kind"] == "embedding":
            assert r["exact"]["cos"] == pytest.approx(1.0, abs=1e-12) and r["exact"]["mse"] < 1e-24
            assert recovered(r["zero"]["cos"], 1.0, r["zero"]["cos"]) == 0.0
        else:
            assert r["exact"]["ce"] == pytest.approx(r["clean"]["ce"], abs=1e-10)
            assert recovered(r["exact"]["ce"], r["clean"]["ce"], r["zero"]["ce"]) == pytest.approx(1.0, abs=1e-9)
            assert recovered(r["zero"]["ce"], r["clean"]["ce"], r["zero"]["ce"]) == 0.0
    del transformers


def test_input_models_against_scikit_learn_and_known_laws():
    from sklearn.covariance import LedoitWolf

    from mlpinterp.lm.capture import Moments
    from mlpinterp.lm.input_models import fit_gaussian, fit_mixture

    rng = np.random.default_rng(5)
    X = rng.standard_normal((4000, 6)) @ rng.standard_normal((6, 6)) + 3.0
    m = Moments.zeros(6)
    for s in range(0, 4000, 1000):
        m.add(X[s:s + 1000])
    g = fit_gaussian(m, "empirical", X)
    np.testing.assert_allclose(g.cov, np.cov(X, rowvar=False), rtol=1e-10)
    np.testing.assert_allclose(g.mean, X.mean(0), rtol=1e-12)
    lw = fit_gaussian(m, "ledoit-wolf", X)
    # scikit-learn shrinks the biased (ddof = 0) covariance: equal up to n / (n - 1)
    np.testing.assert_allclose(lw.cov, LedoitWolf().fit(X).covariance_, rtol=2 / 4000, atol=1e-12)
    with pytest.raises(ValueError, match="covariance must be"):
        fit_gaussian(m, "oas", X)
    Y = np.concatenate([rng.standard_normal((1500, 3)) - 4, rng.standard_normal((500, 3)) + 4])
    mix, info = fit_mixture(Y, 2, 2000, seed=0)
    order = np.argsort(mix.means[:, 0])
    np.testing.assert_allclose(mix.means[order], [[-4] * 3, [4] * 3], atol=0.15)
    np.testing.assert_allclose(mix.weights[order], [0.75, 0.25], atol=0.03)
    assert info["converged"]
    with pytest.raises(ValueError, match="needs at least 3 rows"):
        fit_mixture(Y[:2], 3, 10)
