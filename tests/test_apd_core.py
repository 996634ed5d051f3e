"""APD masks, losses, sparse forward and attributions against hand computations and independent oracles."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import entropy
from torch import nn

from mlpinterp.apd import (
    act_recon_loss,
    attributions,
    attributions_reference,
    batch_topk_mask,
    closed_form_applies,
    is_tied_relu_autoencoder,
    lp_minimality_loss,
    lp_simplicity_loss,
    schatten_pp,
    simplicity_loss,
    topk_mask,
)
from mlpinterp.paramspace import Components, faithfulness_loss, minimality_loss, resolve_sites, run_with_components
from mlpinterp.toys import (
    TMS,
    ResidMLPConfig,
    build_gated_trig,
    build_resid_mlp,
    gated_trig_inputs,
    sparse_features,
    step_generator,
)

torch.set_num_threads(1)
# torch's first forward-mode AD call scripts its jvp decompositions with the deprecated torch.jit.script
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


# ----------------------------------------------------------------------------------------------- masks
def test_topk_mask_hand_example():
    attr = torch.tensor([[0.1, 0.5, 0.3], [0.9, 0.2, 0.4]])
    expect = torch.tensor([[False, True, True], [True, False, True]])
    assert torch.equal(topk_mask(attr, 2), expect)
    assert torch.equal(topk_mask(attr, 1), torch.tensor([[False, True, False], [True, False, False]]))


def test_batch_topk_mask_hand_example():
    attr = torch.tensor([[0.1, 0.5, 0.3], [0.9, 0.2, 0.4], [0.05, 0.6, 0.7], [0.0, 0.01, 0.02]])
    # k = 1 per sample on average -> 4 largest of the 12 entries: 0.9, 0.7, 0.6, 0.5
    expect = torch.tensor([[0, 1, 0], [1, 0, 0], [0, 1, 1], [0, 0, 0]], dtype=torch.bool)
    assert torch.equal(batch_topk_mask(attr, 1.0), expect)
    # k = 0.75 -> floor(0.75 * 4) = 3 entries: 0.9, 0.7, 0.6
    expect = torch.tensor([[0, 0, 0], [1, 0, 0], [0, 1, 1], [0, 0, 0]], dtype=torch.bool)
    assert torch.equal(batch_topk_mask(attr, 0.75), expect)


@pytest.mark.parametrize("fn,k,msg", [(topk_mask, 4, r"\[1, C=3\]"), (topk_mask, 0, r"\[1, C=3\]"),
                                      (topk_mask, 1.5, "integer"), (batch_topk_mask, 3.5, r"\(0, C=3\]"),
                                      (batch_topk_mask, 0.1, "selects floor")])
def test_mask_bad_k(fn, k, msg):
    with pytest.raises(ValueError, match=msg):
        fn(torch.rand(4, 3), k)


def test_mask_bad_attributions():
    with pytest.raises(ValueError, match=r"\[batch, C\]"):
        topk_mask(torch.rand(3), 1)
    with pytest.raises(ValueError, match="NaN"):
        batch_topk_mask(torch.tensor([[float("nan"), 1.0]]), 1.0)
    with pytest.raises(TypeError):
        topk_mask(np.ones((2, 2)), 1)


# ---------------------------------------------------------------------------------------------- losses
def _two_by_two_components():
    model = nn.Sequential(nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    sites = resolve_sites(model, ["0"])
    comps = Components(sites, C=2, m=1)
    A, B = comps.factors("0")
    with torch.no_grad():
        A.copy_(torch.tensor([[[1.0], [0.0]], [[0.0], [1.0]]]))
        B.copy_(torch.tensor([[[1.0, 1.0]], [[2.0, 2.0]]]))
    return model, comps


def test_faithfulness_hand():
    model, comps = _two_by_two_components()
    # sum_c P_c = [[1, 1], [2, 2]]; W* - sum = [[0, 1], [1, 2]]; squares sum to 6 over N = 4 parameters
    loss = faithfulness_loss(comps, {"0": model[0].weight.detach()})
    assert loss.item() == pytest.approx(6 / 4)


@pytest.mark.parametrize("d_out,m,d_in", [(5, 1, 7), (6, 3, 4), (2, 4, 5), (8, 8, 8)])
@pytest.mark.parametrize("p", [0.5, 0.9, 1.0, 2.0])
def test_schatten_exact_matches_svd(d_out, m, d_in, p):
    g = torch.Generator().manual_seed(d_out * 100 + m * 10 + d_in)
    A = torch.randn(3, d_out, m, generator=g, dtype=torch.float64)
    B = torch.randn(3, m, d_in, generator=g, dtype=torch.float64)
    sv = torch.linalg.svdvals(A @ B)  # oracle: SVD of the full matrix
    r = min(d_out, m, d_in)
    expect = (sv[:, :r] ** p).sum(-1)
    got = schatten_pp(A, B, p, "exact")
    torch.testing.assert_close(got, expect, rtol=1e-7, atol=1e-6)


def test_schatten_exact_rank_deficient_and_gradient():
    # two identical rank-one terms: P has rank 1 with sigma = 2 |a| |b|
    a = torch.tensor([3.0, 4.0], dtype=torch.float64)
    b = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    A = torch.stack([a, a], dim=1)[None].requires_grad_(True)  # [1, 2, 2]
    B = torch.stack([b, b], dim=0)[None].requires_grad_(True)  # [1, 2, 3]
    val = schatten_pp(A, B, 1.0, "exact")
    assert val.item() == pytest.approx(2 * 5 * 1, abs=1e-6)
    val.sum().backward()
    assert torch.isfinite(A.grad).all() and torch.isfinite(B.grad).all()


def test_schatten_factor_hand():
    # m = 1: ||a||^2 ||b||^2 = 25 * 4 -> (100)^{p/2} = 10^p
    A = torch.tensor([[[3.0], [4.0]]])
    B = torch.tensor([[[0.0, 2.0, 0.0]]])
    for p in (0.5, 1.0, 2.0):
        assert schatten_pp(A, B, p, "factor").item() == pytest.approx(10.0**p, rel=1e-6)
        assert schatten_pp(A, B, p, "exact").item() == pytest.approx(10.0**p, rel=1e-6)
    # m = 2, non-orthogonal terms: the surrogate is (|a1||b1|)^p + (|a2||b2|)^p, not the Schatten norm
    A = torch.tensor([[[1.0, 1.0], [0.0, 0.0]]])  # a1 = a2 = e1
    B = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    assert schatten_pp(A, B, 1.0, "factor").item() == pytest.approx(2.0, rel=1e-6)
    # P = e1 (1, 1): rank one with sigma = sqrt(2)
    assert schatten_pp(A, B, 1.0, "exact").item() == pytest.approx(np.sqrt(2), rel=1e-6)


def test_schatten_bad_args():
    with pytest.raises(ValueError, match="p"):
        schatten_pp(torch.ones(1, 2, 1), torch.ones(1, 1, 2), 0.0)
    with pytest.raises(ValueError, match="chain"):
        schatten_pp(torch.ones(1, 2, 1), torch.ones(1, 2, 2), 1.0)
    with pytest.raises(ValueError, match="mode"):
        schatten_pp(torch.ones(1, 2, 1), torch.ones(1, 1, 2), 1.0, "svd")


def test_simplicity_hand():
    _, comps = _two_by_two_components()
    # component 0: e1 (1, 1), sigma = sqrt(2); component 1: e2 (2, 2), sigma = 2 sqrt(2); p = 1
    mask = torch.tensor([[True, False], [True, True]])
    expect = (2 * np.sqrt(2) + 2 * np.sqrt(2)) / (4 * 2)  # (s0 + s0 + s1) / (N * batch)
    assert simplicity_loss(comps, mask, 1.0).item() == pytest.approx(expect, rel=1e-6)


def test_minimality_mse_and_kl():
    out = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    tgt = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert minimality_loss(out, tgt, "mse").item() == pytest.approx((0 + 4 + 1 + 1) / 4)
    g = torch.Generator().manual_seed(0)
    lo, lt = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    pt, po = torch.softmax(lt, -1).numpy(), torch.softmax(lo, -1).numpy()
    expect = np.mean([entropy(pt[i], po[i]) for i in range(5)])  # scipy: KL(pt || po) in nats
    assert minimality_loss(lo, lt, "kl").item() == pytest.approx(expect, rel=1e-5)
    with pytest.raises(ValueError, match="same shape"):
        minimality_loss(out, tgt[:1])
    with pytest.raises(ValueError, match="'mse' or 'kl'"):
        minimality_loss(out, tgt, "l1")


def test_lp_and_act_recon_hand():
    attr = torch.tensor([[4.0, 0.0], [1.0, 9.0]])  # A_c = sqrt(attr) = [[2, 0], [1, 3]]
    assert lp_minimality_loss(attr, 1.0).item() == pytest.approx((2 + 0 + 1 + 3) / 2, rel=1e-6)
    _, comps = _two_by_two_components()
    s0, s1 = np.sqrt(2), 2 * np.sqrt(2)  # Schatten-1 of the two components
    expect = ((2 * s0 + 0 * s1) + (1 * s0 + 3 * s1)) / 2 / 4
    assert lp_simplicity_loss(comps, attr, 1.0, 1.0).item() == pytest.approx(expect, rel=1e-5)
    a = {"h": torch.tensor([1.0, 3.0])}
    t = {"h": torch.tensor([0.0, 0.0])}
    assert act_recon_loss(a, t).item() == pytest.approx(5.0)
    with pytest.raises(ValueError, match="same"):
        act_recon_loss(a, {"g": t["h"]})


# ------------------------------------------------------------------------------------ sites and forward
class Mixed(nn.Module):
    """A Linear site and a raw parameter used twice (tied), to exercise both code paths together."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.V = nn.Parameter(torch.randn(3, 3) / 2)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        return torch.relu(h @ self.V.T) @ self.V + h


def _frozen(m):
    return m.requires_grad_(False)


def test_resolve_sites_errors():
    m = Mixed()
    with pytest.raises(ValueError, match="'nope' must name"):
        resolve_sites(m, ["nope"])
    with pytest.raises(ValueError, match="1-D parameter"):
        resolve_sites(m, ["lin.bias"])
    with pytest.raises(ValueError, match="duplicates"):
        resolve_sites(m, ["V", "V"])
    with pytest.raises(ValueError, match="twice"):
        resolve_sites(m, ["lin", "lin.weight"])
    with pytest.raises(TypeError):
        resolve_sites(m, "lin")
    with pytest.raises(ValueError, match="C"):
        Components(resolve_sites(m, ["lin"]), C=0)
    with pytest.raises(ValueError, match="inner rank"):
        Components(resolve_sites(m, ["lin"]), C=2, m=0)


def test_masked_forward_equals_per_sample_weights():
    torch.manual_seed(0)
    m = _frozen(Mixed())
    comps = Components(resolve_sites(m, ["lin", "V"]), C=5, m=2)
    x = torch.randn(6, 4)
    mask = (torch.rand(6, 5) < 0.5).float()
    got = run_with_components(m, comps, x, mask)
    W = comps.weights()
    for b in range(6):  # oracle: a fresh copy of the model with the per-sample summed weights loaded
        ref = Mixed()
        sd = dict(m.state_dict())
        sd["lin.weight"] = (mask[b][:, None, None] * W["lin"]).sum(0)
        sd["V"] = (mask[b][:, None, None] * W["V"]).sum(0)
        ref.load_state_dict(sd)
        torch.testing.assert_close(got[b], ref(x[b : b + 1])[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="coef"):
        run_with_components(m, comps, x, torch.ones(6, 4))


def test_components_summing_to_target_reproduce_it():
    m = _frozen(Mixed())
    sites = resolve_sites(m, ["lin", "V"])
    g = torch.Generator().manual_seed(0)
    # random split of each weight into 3 parts of rank <= 3: the two last are random, the first the rest
    weights = {}
    for s in sites:
        W = dict(m.named_parameters())["lin.weight" if s.name == "lin" else "V"].detach()
        r = torch.randn(2, s.d_out, s.d_in, generator=g)
        weights[s.name] = torch.cat([(W - r.sum(0))[None], r])
    comps = Components.from_weights(sites, weights)
    for s in sites:
        torch.testing.assert_close(comps.summed()[s.name], weights[s.name].sum(0), atol=1e-5, rtol=1e-5)
    x = torch.randn(5, 4)
    torch.testing.assert_close(run_with_components(m, comps, x), m(x), atol=1e-5, rtol=1e-5)
    assert faithfulness_loss(comps, {s.name: weights[s.name].sum(0) for s in sites}).item() < 1e-10


# -------------------------------------------------------------------------------------------- attributions
def _models():
    torch.manual_seed(0)
    tms = _frozen(TMS(5, 2))
    with torch.no_grad():
        tms.b.fill_(-0.1)
    resid = _frozen(build_resid_mlp(ResidMLPConfig(n_features=10, d_embed=24, d_mlp=6, n_layers=2)))
    gated, _ = build_gated_trig(n_functions=3, neurons_per_function=4, n_layers=2)
    return [
        (tms, ["W"], sparse_features(40, 5, 0.6, generator=step_generator(0, 0))),
        (resid, resid.target_names(), sparse_features(40, 10, 0.3, (-1, 1), generator=step_generator(0, 1))),
        (_frozen(Mixed()), ["lin", "V"], torch.randn(40, 4)),
        (_frozen(gated), gated.target_names(), gated_trig_inputs(40, 3, p=0.5, generator=step_generator(0, 2))),
        (resid, ["layers.1.mlp_in", "layers.0.mlp_out"], sparse_features(40, 10, 0.3, (-1, 1),
                                                                         generator=step_generator(0, 3))),
    ]


@pytest.mark.parametrize("source", ["target", "apd"])
def test_batched_attributions_equal_reference(source):
    for model, targets, x in _models():
        comps = Components(resolve_sites(model, targets), C=7, m=2, generator=torch.Generator().manual_seed(1))
        ref = attributions_reference(model, comps, x, source)
        scale = ref.abs().max()
        assert scale > 0
        methods = ["forward", "closed"] if closed_form_applies(model, comps) else ["forward"]
        for method in methods:
            fast = attributions(model, comps, x, source, method=method)
            assert fast.shape == (x.shape[0], 7)
            torch.testing.assert_close(fast, ref, atol=1e-5 * scale, rtol=1e-5)
        chunked = attributions(model, comps, x, source, chunk_size=3, method="forward")
        torch.testing.assert_close(chunked, ref, atol=1e-5 * scale, rtol=1e-5)


def test_closed_form_only_for_residual_mlps_and_tms():
    tms, _, _ = _models()[0]
    assert is_tied_relu_autoencoder(tms, Components(resolve_sites(tms, ["W"]), C=2))
    model, targets, x = _models()[2]
    comps = Components(resolve_sites(model, targets), C=2)
    assert not closed_form_applies(model, comps)
    with pytest.raises(ValueError, match="residual-MLP"):
        attributions(model, comps, x, method="closed")
    with pytest.raises(ValueError, match="method"):
        attributions(model, comps, x, method="magic")


def test_attributions_match_finite_differences():
    """Oracle independent of the APD forward: central differences of f(theta* + h P_c) in float64."""
    # (the gated model is excluded: its constant neurons sit exactly on the ReLU kink when a bit is off, where
    # central differences give |slope|/2 and autograd the convention ReLU'(0) = 0)
    for model, targets, x in _models()[:3]:
        model = model.double()
        x = x.double()
        sites = resolve_sites(model, targets)
        comps = Components(sites, C=4, m=2, generator=torch.Generator().manual_seed(2)).double()
        got = attributions(model, comps, x, "target")
        P = comps.weights()
        params = dict(model.named_parameters())
        h = 1e-6
        for c in range(4):
            outs = []
            for sign in (1, -1):
                sd = {}
                for s in sites:
                    key = f"{s.name}.weight" if s.kind == "linear" else s.name
                    sd[key] = params[key].detach() + sign * h * P[s.name][c].detach()
                outs.append(torch.func.functional_call(model, sd, (x,)))
            d = (outs[0] - outs[1]) / (2 * h)
            expect = (d**2).reshape(d.shape[0], -1).sum(1)
            torch.testing.assert_close(got[:, c], expect, rtol=1e-5, atol=1e-8)
        model.float()


def test_attributions_are_differentiable_and_bad_source():
    for model, targets, x in _models()[:2]:  # TMS and resid-MLP: both have a closed form
        for method, source in (("forward", "target"), ("closed", "target"), ("closed", "apd")):
            comps = Components(resolve_sites(model, targets), C=3, m=1)
            attributions(model, comps, x, source, method=method).sum().backward()
            grads = [p.grad for p in comps.parameters()]
            assert all(g is not None and torch.isfinite(g).all() for g in grads)
            assert any(g.abs().sum() > 0 for g in grads)
    with pytest.raises(ValueError, match="source"):
        attributions(model, comps, x, "model")


def test_from_weights_shape_and_rank_errors():
    m = _frozen(Mixed())
    sites = resolve_sites(m, ["lin", "V"])
    good = {"lin": torch.zeros(2, 3, 4), "V": torch.zeros(2, 3, 3)}
    with pytest.raises(ValueError, match=r"weights\['lin'\] must have shape \[C >= 1, 3, 4\]"):
        Components.from_weights(sites, {**good, "lin": torch.zeros(2, 4, 3)})
    with pytest.raises(ValueError, match="lacks site 'V'"):
        Components.from_weights(sites, {"lin": good["lin"]})
    with pytest.raises(ValueError, match="same number of components"):
        Components.from_weights(sites, {**good, "V": torch.zeros(3, 3, 3)})
    with pytest.raises(ValueError, match="needs rank 3 > m=1"):
        Components.from_weights(sites, {**good, "V": torch.randn(2, 3, 3)}, m=1)


def test_closed_form_gradients_equal_forward_mode_gradients():
    """The Lp variant differentiates attributions: the closed forms must give the autograd-of-jvp gradients."""
    for model, targets, x in _models()[:2]:
        grads = {}
        for method in ("forward", "closed"):
            comps = Components(resolve_sites(model, targets), C=3, m=2, generator=torch.Generator().manual_seed(4))
            attributions(model, comps, x, "apd", method=method).add(1e-2).log().sum().backward()
            grads[method] = torch.cat([p.grad.flatten() for p in comps.parameters()])
        torch.testing.assert_close(grads["closed"], grads["forward"], rtol=1e-4, atol=1e-6 * grads["forward"].abs().max())
