"""SPD core: sigmoids, masks, causal-importance MLPs, every loss against a hand computation, the ground truth, bad
configurations. Independent oracles: explicit per-sample weight matrices built in loops, closed forms of U(g, 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn

from mlpinterp.paramspace import mmcs_ml2r, resolve_sites
from mlpinterp.spd import (
    CausalImportance,
    Decomposition,
    SPDConfig,
    decompose,
    importance_minimality_loss,
    layerwise_recon_loss,
    leaky_hard_sigmoid,
    resolve_reads,
    stochastic_mask,
    stochastic_recon_loss,
    upper_leaky_hard_sigmoid,
)
from mlpinterp.spd.losses import faithfulness_loss
from mlpinterp.spd.objective import spd_losses
from mlpinterp.toys import TMS, as_linears, sparse_features, step_generator, with_identity

torch.set_num_threads(1)


class Tiny(nn.Module):
    """y = lin2(relu(lin1(x))): two nn.Linear sites with biases."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.lin1 = nn.Linear(3, 4)
        self.lin2 = nn.Linear(4, 2)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, x):
        return self.lin2(torch.relu(self.lin1(x)))


def _dec(model, targets, C=3, d_gate=4, reads=None, seed=1):
    sites = resolve_sites(model, targets)
    return Decomposition(sites, C, d_gate, resolve_reads(model, sites, reads), torch.Generator().manual_seed(seed))


def _masks(dec, n, seed=2):
    g = torch.Generator().manual_seed(seed)
    return {s.name: torch.rand(n, dec.C, generator=g) for s in dec.sites}


# ------------------------------------------------------------------------------------------------ sigmoids
def test_leaky_hard_sigmoids_values_and_gradients_at_the_edges():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 1.0, 1.5], requires_grad=True)
    lo = leaky_hard_sigmoid(x)
    (g_lo,) = torch.autograd.grad(lo.sum(), x)
    torch.testing.assert_close(lo.detach(), torch.tensor([-0.02, -0.005, 0.0, 0.5, 1.0, 1.0]))
    torch.testing.assert_close(g_lo, torch.tensor([0.01, 0.01, 0.01, 1.0, 1.0, 0.0]))
    up = upper_leaky_hard_sigmoid(x)
    (g_up,) = torch.autograd.grad(up.sum(), x)
    torch.testing.assert_close(up.detach(), torch.tensor([0.0, 0.0, 0.0, 0.5, 1.0, 1.005]))
    torch.testing.assert_close(g_up, torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 0.01]))


# --------------------------------------------------------------------------------------------------- masks
def test_masks_are_uniform_on_g_to_one():
    g = torch.tensor([0.0, 0.3, 0.9]).repeat(20_000, 1)
    m = stochastic_mask(g, torch.Generator().manual_seed(1))
    for j, gj in enumerate((0.0, 0.3, 0.9)):
        col = m[:, j].double().numpy()
        assert col.min() >= gj and col.max() <= 1.0
        assert stats.kstest((col - gj) / (1 - gj), "uniform").pvalue > 1e-3
        se = (1 - gj) / math.sqrt(12 * len(col))
        assert abs(col.mean() - (1 + gj) / 2) < 5 * se
        w = 1 - gj  # variance of U(g, 1): w^2 / 12, SE of the sample variance w^2 sqrt(1/80 - 1/144) / sqrt(n)
        assert abs(col.var() - w**2 / 12) < 5 * w**2 * math.sqrt(1 / 80 - 1 / 144) / math.sqrt(len(col))


def test_mask_gradient_is_one_minus_r():
    g = torch.full((1000, 2), 0.4, requires_grad=True)
    gen_state = torch.Generator().manual_seed(5)
    m = stochastic_mask(g, gen_state)
    (dg,) = torch.autograd.grad(m.sum(), g)
    r = (m.detach() - 0.4) / 0.6
    torch.testing.assert_close(dg, 1 - r)


# ------------------------------------------------------------------------------------- causal importance
def test_causal_importance_mlp_matches_a_loop():
    ci = CausalImportance(3, 5, torch.Generator().manual_seed(0))
    with torch.no_grad():
        ci.b1.normal_()
        ci.b2.normal_()
    h = torch.randn(7, 3)
    out = ci(h)
    for b in range(7):
        for c in range(3):
            hid = [F.gelu(h[b, c] * ci.w1[c, k] + ci.b1[c, k]) for k in range(5)]
            want = sum(hid[k] * ci.w2[c, k] for k in range(5)) + ci.b2[c]
            torch.testing.assert_close(out[b, c], want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_compiled_causal_importance_matches_eager_values_and_gradients():
    """``compile=True`` (torch.compile of the hot path) against the eager formula: outputs and every gradient."""
    gen = torch.Generator().manual_seed(1)
    ci = CausalImportance(4, 6, gen)
    with torch.no_grad():
        ci.b1.normal_(generator=gen)
        ci.b2.normal_(generator=gen)
    h = torch.randn(64, 4, generator=gen, requires_grad=True)
    w = torch.randn(64, 4, generator=gen)
    grads = []
    for compile in (False, True):
        for t in (h, *ci.parameters()):
            t.grad = None
        out = ci(h, compile=compile)
        (out * w).sum().backward()
        grads.append([out.detach()] + [t.grad.clone() for t in (h, *ci.parameters())])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("zero_share", [0.0, 0.77, 1.0])
def test_zero_rows_evaluated_once_give_the_same_values_and_gradients(compile, zero_share):
    """The hot path evaluates the MLPs once for all all-zero rows of h (sparse toys' empty inputs): outputs and every
    gradient equal the plain formula :func:`_scalar_mlps` on every row (batch 1000 > the 512 rows where it starts)."""
    from mlpinterp.spd.importance import _scalar_mlps

    gen = torch.Generator().manual_seed(4)
    ci = CausalImportance(6, 5, gen)
    with torch.no_grad():
        ci.b1.normal_(generator=gen)
        ci.b2.normal_(generator=gen)
    h = torch.randn(1000, 6, generator=gen) * (torch.rand(1000, 1, generator=gen) >= zero_share)
    h.requires_grad_(True)
    w = torch.randn(1000, 6, generator=gen)
    grads = []
    for fast in (True, False):
        for t in (h, *ci.parameters()):
            t.grad = None
        out = ci(h, compile=compile) if fast else _scalar_mlps(h, ci.w1, ci.b1, ci.w2, ci.b2)
        (out * w).sum().backward()
        grads.append([out.detach()] + [t.grad.clone() for t in (h, *ci.parameters())])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_inner_acts_are_V_times_the_target_input_of_each_site():
    model = Tiny()
    dec = _dec(model, ["lin1", "lin2"])
    x = torch.randn(6, 3)
    out, acts = dec.target_forward(model, x)
    torch.testing.assert_close(out, model(x))
    torch.testing.assert_close(acts["lin1"], x)
    torch.testing.assert_close(acts["lin2"], torch.relu(model.lin1(x)))
    h = dec.inner_acts(acts)
    torch.testing.assert_close(h["lin2"], acts["lin2"] @ dec.V("lin2").T)


def test_paper_era_init_projects_the_target_on_random_unit_directions():
    """init="paper-era" (the reference's init_Vs_and_Us_ of June 2025): V_c, U_c / |U_c| unit vectors, and each
    subcomponent the Frobenius projection of W on the unit rank-one direction u_c v_c^T: P_c = <W, u v^T> u v^T."""
    model = nn.Sequential()
    model.add_module("wide", nn.Linear(40, 6))
    sites = resolve_sites(model, ["wide"])
    W = model.wide.weight.detach()
    dec = Decomposition(sites, 300, 4, {"wide": "wide"}, generator=torch.Generator().manual_seed(0),
                        init="paper-era", target_weights={"wide": W})
    U, V = dec.U("wide").detach().double(), dec.V("wide").detach().double()  # [6, C], [C, 40]
    torch.testing.assert_close(V.norm(dim=1), torch.ones(300, dtype=torch.float64))
    u = U / U.norm(dim=0, keepdim=True)
    for c in range(0, 300, 37):
        direction = torch.outer(u[:, c], V[c])  # unit Frobenius norm
        want = (W.double() * direction).sum() * direction
        torch.testing.assert_close(torch.outer(U[:, c], V[c]), want, rtol=1e-5, atol=1e-7)
        assert abs(float(((W.double() - want) * direction).sum())) < 1e-6  # the residual is orthogonal to it
    # directions uniform on the sphere: v_1^2 ~ Beta(1/2, (d - 1)/2), mean 1/d, variance 2(d - 1)/(d^2 (d + 2))
    se = math.sqrt(2 * 39 / (40**2 * 42) / 300)
    assert abs(float((V[:, 0] ** 2).mean()) - 1 / 40) < 5 * se
    assert stats.kstest(V[:, 0].numpy() ** 2, stats.beta(0.5, 39 / 2).cdf).pvalue > 1e-3
    with pytest.raises(ValueError, match="pass target_weights"):
        Decomposition(sites, 5, 4, {"wide": "wide"}, init="paper-era")
    with pytest.raises(ValueError, match="init must be"):
        Decomposition(sites, 50, 4, {"wide": "wide"}, init="xavier")


# ------------------------------------------------------------------------------------------------- tying
def _tied_dec(model, init="scaled", seed=1):
    sites = resolve_sites(model, model.target_names())
    W = {s.name: model.get_submodule(s.name).weight.detach() for s in sites}
    return Decomposition(sites, 4, 3, resolve_reads(model, sites), torch.Generator().manual_seed(seed), init=init,
                         tied={"linear2": "linear1"}, target_weights=W)


def test_tied_sites_share_subcomponents_transposed_with_their_own_masks(tms52_target):
    """linear2's subcomponents are linear1's transposed and own no parameters; the masked forward with a separate
    mask per site equals the per-sample weights built by hand; the gradient of the shared factors is the sum of an
    untied copy's gradients through both uses."""
    model = as_linears(with_identity(tms52_target))
    model.requires_grad_(False)
    dec = _tied_dec(model)
    torch.testing.assert_close(dec.U("linear2"), dec.V("linear1").T)
    torch.testing.assert_close(dec.V("linear2"), dec.U("linear1").T)
    assert not any("linear2" in k for k, _ in dec.components.named_parameters())
    assert {k for k in dec.importance} == {"linear1", "identity", "linear2"}  # each site its own importances
    x = sparse_features(6, 5, 0.5, generator=step_generator(0, 0))
    masks = _masks(dec, 6)
    target = model(x)
    got = stochastic_recon_loss(model, dec.components, x, masks, target)
    U1, V1 = dec.U("linear1").detach(), dec.V("linear1").detach()
    Ui, Vi = dec.U("identity").detach(), dec.V("identity").detach()
    ys = []
    for b in range(6):
        W1 = sum(masks["linear1"][b, c] * torch.outer(U1[:, c], V1[c]) for c in range(4))
        W2 = sum(masks["linear2"][b, c] * torch.outer(V1[c], U1[:, c]) for c in range(4))  # (U_c V_c^T)^T
        Ib = sum(masks["identity"][b, c] * torch.outer(Ui[:, c], Vi[c]) for c in range(4))
        ys.append(torch.relu(W2 @ (Ib @ (W1 @ x[b])) + model.linear2.bias))
    torch.testing.assert_close(got, ((torch.stack(ys) - target) ** 2).mean(), rtol=1e-5, atol=1e-7)
    # gradients: an untied decomposition holding the same values at both sites
    untied = Decomposition(dec.sites, 4, 3, dec.reads)
    with torch.no_grad():
        for s in dec.sites:
            for a, b in zip(untied.components.factors(s), dec.components.factors(s), strict=True):
                a.copy_(b)
    got.backward()
    stochastic_recon_loss(model, untied.components, x, masks, target).backward()
    A1, B1 = dec.components.factors("linear1")
    (uA1, uB1), (uA2, uB2) = untied.components.factors("linear1"), untied.components.factors("linear2")
    torch.testing.assert_close(A1.grad, uA1.grad + uB2.grad.transpose(1, 2))
    torch.testing.assert_close(B1.grad, uB1.grad + uA2.grad.transpose(1, 2))


def test_tied_paper_era_init_initialises_the_source_only(tms52_target):
    model = as_linears(tms52_target)
    dec = _tied_dec(model, init="paper-era")
    W = tms52_target.W.detach()
    U, V = dec.U("linear1").detach(), dec.V("linear1").detach()
    u = U / U.norm(dim=0, keepdim=True)
    torch.testing.assert_close(U.norm(dim=0), (u * (W @ V.T)).sum(0).abs())  # |U_c| = |u_c^T W v_c|
    torch.testing.assert_close(dec.components.weights()["linear2"], dec.components.weights()["linear1"].transpose(1, 2))


def test_bad_tying_raises_clear_errors(tms52_target):
    model = as_linears(tms52_target)
    sites = resolve_sites(model, ["linear1", "linear2"])
    reads = resolve_reads(model, sites)
    W = {s.name: model.get_submodule(s.name).weight.detach() for s in sites}
    with pytest.raises(ValueError, match="not 'linear1''s transposed"):
        Decomposition(sites, 3, 2, reads, tied={"linear2": "linear1"}, target_weights={**W, "linear2": W["linear2"] + 0.1})
    with pytest.raises(ValueError, match="are not sites"):
        Decomposition(sites, 3, 2, reads, tied={"linear2": "nope"})
    with pytest.raises(ValueError, match="not to itself or to another tied site"):
        Decomposition(sites, 3, 2, reads, tied={"linear2": "linear2"})
    with pytest.raises(ValueError, match="not to itself or to another tied site"):
        Decomposition(sites, 3, 2, reads, tied={"linear2": "linear1", "linear1": "linear2"})
    with pytest.raises(TypeError, match="tied must be a mapping"):
        Decomposition(sites, 3, 2, reads, tied=[("linear1", "linear2")])
    tiny = Tiny()
    tsites = resolve_sites(tiny, ["lin1", "lin2"])
    with pytest.raises(ValueError, match="only a weight and its transpose can share components"):
        Decomposition(tsites, 3, 2, resolve_reads(tiny, tsites), tied={"lin2": "lin1"})
    with pytest.raises(ValueError, match="tied: the target weight of 'linear2' is not 'linear1''s transposed"):
        other = as_linears(tms52_target)
        with torch.no_grad():
            other.linear2.weight.mul_(2)
        decompose(other, lambda s: torch.rand(8, 5), SPDConfig(targets=("linear1", "linear2"), steps=1, batch_size=8,
                                                                tied=(("linear1", "linear2"),)), quiet=True)
    with pytest.raises(ValueError, match="tied to one source only"):
        SPDConfig(targets=("a", "b", "c"), tied=(("a", "c"), ("b", "c")))


# ---------------------------------------------------------------------------------- losses vs hand
def _hand_tiny(model, dec, x, masks, only=None, delta=None):
    """Output with W_b = sum_c m[b, c] U_c V_c^T built explicitly per sample (sites outside ``only`` unmasked W);
    with ``delta`` (``{site: [batch]}``) plus the delta component ``r_b (W - sum_c U_c V_c^T)``."""
    ys = []
    for b in range(x.shape[0]):
        Ws = {}
        for name in ("lin1", "lin2"):
            W = getattr(model, name).weight
            if only is None or name in only:
                U, V = dec.U(name), dec.V(name)
                comps = [torch.outer(U[:, c], V[c]) for c in range(dec.C)]
                Ws[name] = sum(masks[name][b, c] * P for c, P in enumerate(comps))
                if delta is not None:
                    Ws[name] = Ws[name] + delta[name][b] * (W - sum(comps))
            else:
                Ws[name] = W
        h = torch.relu(Ws["lin1"] @ x[b] + model.lin1.bias)
        ys.append(Ws["lin2"] @ h + model.lin2.bias)
    return torch.stack(ys)


def test_stochastic_and_layerwise_recon_match_hand_computation():
    model = Tiny()
    dec = _dec(model, ["lin1", "lin2"])
    x = torch.randn(5, 3)
    masks = _masks(dec, 5)
    with torch.no_grad():
        target = model(x)
        full = stochastic_recon_loss(model, dec.components, x, masks, target)
        lay = layerwise_recon_loss(model, dec.components, x, masks, target)
        kl = stochastic_recon_loss(model, dec.components, x, masks, target, kind="kl")
        y = _hand_tiny(model, dec, x, masks)
        want = ((y - target) ** 2).mean()
        want_lay = sum(((_hand_tiny(model, dec, x, masks, only={n}) - target) ** 2).mean()
                       for n in ("lin1", "lin2")) / 2
        p, q = torch.softmax(target, -1), torch.softmax(y, -1)
        want_kl = (p * (p.log() - q.log())).sum(-1).mean()
    torch.testing.assert_close(full, want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(lay, want_lay, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(kl, want_kl, rtol=1e-5, atol=1e-7)
    assert float(full) > 1e-3 and float(lay) > 1e-3  # random masks on random subcomponents: far from the target


def test_delta_component_recon_matches_hand_computation_and_is_exact_at_full_masks():
    model = Tiny()
    dec = _dec(model, ["lin1", "lin2"])
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(3))
    masks = _masks(dec, 5)
    delta = {n: torch.rand(5, generator=torch.Generator().manual_seed(9 + i)) for i, n in enumerate(("lin1", "lin2"))}
    with torch.no_grad():
        target = model(x)
        full = stochastic_recon_loss(model, dec.components, x, masks, target, delta=delta)
        lay = layerwise_recon_loss(model, dec.components, x, masks, target, delta=delta)
        want = ((_hand_tiny(model, dec, x, masks, delta=delta) - target) ** 2).mean()
        want_lay = sum(((_hand_tiny(model, dec, x, masks, only={n}, delta=delta) - target) ** 2).mean()
                       for n in ("lin1", "lin2")) / 2
        without = stochastic_recon_loss(model, dec.components, x, masks, target)
        # every mask 1, the delta's too: sum_c U_c V_c^T + (W - sum_c U_c V_c^T) = W, the target, whatever U and V
        ones = {n: torch.ones(5, dec.C) for n in masks}
        exact = stochastic_recon_loss(model, dec.components, x, ones, target, delta={n: torch.ones(5) for n in masks})
        zero_r = stochastic_recon_loss(model, dec.components, x, masks, target,
                                       delta={n: torch.zeros(5) for n in masks})
    torch.testing.assert_close(full, want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(lay, want_lay, rtol=1e-5, atol=1e-7)
    assert float(abs(full - without)) > 1e-3 * float(without)  # the delta term is there (random U, V miss W)
    assert float(exact) < 1e-10 * float(without), float(exact)
    torch.testing.assert_close(zero_r, without, rtol=1e-5, atol=1e-7)  # r = 0: the plain masked model


def test_delta_component_at_a_tied_parameter_site_matches_hand_computation():
    tms = TMS(5, 2)
    dec = _dec(tms, ["W"], C=4)
    x = sparse_features(6, 5, 0.5, generator=step_generator(0, 0))
    masks = _masks(dec, 6)
    r = torch.rand(6, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        target = tms(x)
        got = stochastic_recon_loss(tms, dec.components, x, masks, target, delta={"W": r})
        ys = []
        for b in range(6):
            comps = [torch.outer(dec.U("W")[:, c], dec.V("W")[c]) for c in range(4)]
            Wb = sum(masks["W"][b, c] * P for c, P in enumerate(comps)) + r[b] * (tms.W - sum(comps))
            ys.append(torch.relu(Wb.T @ (Wb @ x[b]) + tms.b))
        want = ((torch.stack(ys) - target) ** 2).mean()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_delta_masks_are_drawn_uniform_after_the_subcomponent_masks():
    """``draw_masks``: the subcomponent masks as before (the same generator stream), then one ``r ~ U(0, 1)`` per
    sample and site; a Kolmogorov-Smirnov test against U(0, 1) and the stream order checked by hand."""
    from mlpinterp.spd.masks import draw_masks

    g = {"a": torch.rand(4000, 3, generator=torch.Generator().manual_seed(0)), "b": torch.rand(4000, 2)}
    masks, delta = draw_masks(g, True, torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(1)
    want = {k: v + (1 - v) * torch.rand(v.shape, generator=gen) for k, v in g.items()}
    want_r = {k: torch.rand(v.shape[:-1], generator=gen) for k, v in g.items()}
    for k in g:
        torch.testing.assert_close(masks[k], want[k])
        torch.testing.assert_close(delta[k], want_r[k])
        assert delta[k].shape == (4000,)
        assert stats.kstest(delta[k].numpy(), "uniform").pvalue > 1e-3
    plain, none = draw_masks(g, False, torch.Generator().manual_seed(1))
    assert none is None and all(torch.equal(plain[k], masks[k]) for k in g)


def test_base_mapping_and_delta_errors_name_the_argument():
    from mlpinterp.paramspace.forward import run_with_components

    model = Tiny()
    dec = _dec(model, ["lin1", "lin2"])
    x = torch.randn(5, 3)
    masks = _masks(dec, 5)
    target = model(x).detach()
    with pytest.raises(ValueError, match=r"delta\['lin1'\] must have shape \[batch=5\], got \[5, 3\]"):
        stochastic_recon_loss(model, dec.components, x, masks, target, delta={"lin1": torch.rand(5, 3),
                                                                             "lin2": torch.rand(5)})
    with pytest.raises(ValueError, match="delta must have one entry per site"):
        layerwise_recon_loss(model, dec.components, x, masks, target, delta={"lin1": torch.rand(5)})
    with pytest.raises(ValueError, match="base names unknown sites"):
        run_with_components(model, dec.components, x, masks, base={"nope": torch.rand(5)})
    with pytest.raises(ValueError, match=r"base\['lin2'\] contains NaN"):
        run_with_components(model, dec.components, x, masks, base={"lin2": torch.full((5,), float("nan"))})
    with pytest.raises(TypeError, match="base must be a bool or a mapping"):
        run_with_components(model, dec.components, x, masks, base=1.0)



@pytest.mark.parametrize("with_delta", [False, True])
def test_masks_of_another_dtype_are_refused_naming_masks(with_delta):
    """float64 masks on float32 subcomponents are refused naming ``masks`` (before: torch's "expected m1 and m2 to
    have the same dtype"; with a float64 delta, the error named run_with_components' ``base``)."""
    model = Tiny()
    dec = _dec(model, ["lin1", "lin2"])
    x = torch.randn(5, 3)
    masks = {k: v.double() for k, v in _masks(dec, 5).items()}
    delta = {k: torch.rand(5, dtype=torch.float64) for k in masks} if with_delta else None
    for loss in (stochastic_recon_loss, layerwise_recon_loss):
        with pytest.raises(ValueError, match=r"masks\['lin1'\] must have the subcomponents' dtype torch.float32, "
                                             r"got torch.float64"):
            loss(model, dec.components, x, masks, model(x).detach(), delta=delta)


@pytest.mark.parametrize("site", ["lin1", "lin2"])
def test_base_mapping_of_another_dtype_is_refused_naming_it(site):
    """A per-sample base factor of another dtype than the weight it scales is refused naming ``base[site]`` (before:
    torch's "expected m1 and m2 to have the same dtype" from inside the patched forward at lin1, and at the last
    site lin2 a float64 output without a word)."""
    from mlpinterp.paramspace.forward import run_with_components

    model = Tiny()
    dec = _dec(model, ["lin1", "lin2"])
    x = torch.randn(5, 3)
    with pytest.raises(ValueError, match=rf"base\['{site}'\] must have the dtype of the target's weight "
                                         r"torch.float32, got torch.float64"):
        run_with_components(model, dec.components, x, _masks(dec, 5), base={site: torch.rand(5, dtype=torch.float64)})

@pytest.mark.parametrize("bad, msg", [
    (torch.ones(5, dtype=torch.long), r"delta\['lin1'\] must be a floating-point tensor, got torch.int64"),
    (torch.tensor([0.5, float("nan"), 0.5, 0.5, 0.5]), r"delta\['lin1'\] contains NaN or inf"),
    (torch.rand(5, dtype=torch.float64), r"delta\['lin1'\] must have the masks' dtype torch.float32, got "
                                         r"torch.float64"),
])
def test_bad_delta_values_are_named_as_delta(bad, msg):
    """A delta the reconstruction losses cannot use is refused naming ``delta`` (not ``base``/``coef``, the
    ``run_with_components`` arguments it becomes, nor a raw torch dtype error)."""
    model = Tiny()
    dec = _dec(model, ["lin1", "lin2"])
    x = torch.randn(5, 3)
    masks = _masks(dec, 5)
    target = model(x).detach()
    for loss in (stochastic_recon_loss, layerwise_recon_loss):
        with pytest.raises(ValueError, match=msg):
            loss(model, dec.components, x, masks, target, delta={"lin1": bad, "lin2": torch.rand(5)})


@pytest.mark.parametrize("layerwise_masks", ["shared", "fresh"])
def test_spd_losses_draw_the_layerwise_masks_as_configured(layerwise_masks):
    """"shared": the layerwise loss reuses the full loss's masks; "fresh" (the reference's): a second draw from the
    same generator, after the first."""
    model = Tiny()
    dec = _dec(model, ["lin1", "lin2"])
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(5))
    cfg = SPDConfig(targets=("lin1", "lin2"), C=dec.C, d_gate=4, layerwise_masks=layerwise_masks)
    W = {n: getattr(model, n).weight.detach() for n in ("lin1", "lin2")}
    _, logs = spd_losses(model, dec, x, cfg, W, torch.Generator().manual_seed(7))
    with torch.no_grad():
        target = model(x)
        h = torch.relu(model.lin1(x))
        gen = torch.Generator().manual_seed(7)
        g = {n: leaky_hard_sigmoid(dec.importance[n](a @ dec.V(n).T))
             for n, a in (("lin1", x), ("lin2", h))}
        first = {n: g[n] + (1 - g[n]) * torch.rand(g[n].shape, generator=gen) for n in g}
        second = {n: g[n] + (1 - g[n]) * torch.rand(g[n].shape, generator=gen) for n in g}
        lay_masks = second if layerwise_masks == "fresh" else first
        want_rec = ((_hand_tiny(model, dec, x, first) - target) ** 2).mean()
        want_lay = sum(((_hand_tiny(model, dec, x, lay_masks, only={n}) - target) ** 2).mean()
                       for n in ("lin1", "lin2")) / 2
        other = sum(((_hand_tiny(model, dec, x, second if lay_masks is first else first, only={n}) - target) ** 2)
                    .mean() for n in ("lin1", "lin2")) / 2
    assert logs["stochastic_recon"] == pytest.approx(float(want_rec), rel=1e-5)
    assert logs["layerwise_recon"] == pytest.approx(float(want_lay), rel=1e-5)
    assert abs(float(other) - float(want_lay)) > 1e-3 * float(want_lay)  # the two draws are distinguishable


def test_faithfulness_and_importance_minimality_match_hand_computation():
    model = Tiny()
    dec = _dec(model, ["lin1", "lin2"])
    W = {"lin1": model.lin1.weight.detach(), "lin2": model.lin2.weight.detach()}
    want = sum(((W[n] - dec.U(n) @ dec.V(n)) ** 2).sum() for n in W) / (12 + 8)
    torch.testing.assert_close(faithfulness_loss(dec.components, W), want)
    g = {"a": torch.tensor([[0.5, 0.0, 2.0], [1.0, 0.25, 0.0]]), "b": torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.0, 1.0]])}
    p = 0.7
    hand = (0.5**p + 2.0**p + 1.0 + 0.25**p + 0.1**p + 0.2**p + 0.3**p + 1.0) / 2
    torch.testing.assert_close(importance_minimality_loss(g, p, eps=0.0), torch.tensor(hand))


def test_tied_parameter_site_masks_both_uses_and_identity_site():
    tms = TMS(5, 2)
    model = with_identity(tms)
    dec = _dec(model, ["W", "identity"], C=4)
    x = sparse_features(6, 5, 0.5, generator=step_generator(0, 0))
    masks = _masks(dec, 6)
    with torch.no_grad():
        target = model(x)
        got = stochastic_recon_loss(model, dec.components, x, masks, target)
        ys = []
        for b in range(6):
            Wb = sum(masks["W"][b, c] * torch.outer(dec.U("W")[:, c], dec.V("W")[c]) for c in range(4))
            Ib = sum(masks["identity"][b, c] * torch.outer(dec.U("identity")[:, c], dec.V("identity")[c])
                     for c in range(4))
            ys.append(torch.relu(Wb.T @ (Ib @ (Wb @ x[b])) + model.b))
        want = ((torch.stack(ys) - target) ** 2).mean()
        torch.testing.assert_close(torch.relu(model.W.T @ model.W @ x.T + model.b[:, None]).T, target)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    _, acts = dec.target_forward(model, x)
    torch.testing.assert_close(acts["W"], x)  # the tied W reads the model input (its first use)


# ------------------------------------------------------------------------------------------ ground truth
@pytest.mark.parametrize("tied", [False, True])
def test_ground_truth_decomposition_has_zero_reconstruction_and_mmcs_ml2r_one(tms52_target, tied):
    """TMS as linear1 (W) + linear2 (W^T): subcomponent c of linear1 is W[:, c] e_c^T (important iff x_c != 0), of
    linear2 e_c W[:, c]^T (importance 1 on every input): with tied sites, linear1's transposed."""
    model = as_linears(with_identity(tms52_target))
    model.requires_grad_(False)
    dec = _dec(model, model.target_names(), C=5, d_gate=4)
    if tied:
        dec = Decomposition(dec.sites, 5, 4, dec.reads, tied={"linear2": "linear1"})
    W = tms52_target.W.detach()
    with torch.no_grad():
        gt = {"linear1": (W.T[:, :, None], torch.eye(5)[:, None, :]),
              "linear2": (torch.eye(5)[:, :, None], W.T[:, None, :]),
              "identity": (torch.eye(5, 2)[:, :, None], torch.eye(5, 2)[:, None, :])}  # I = e_1 e_1^T + e_2 e_2^T
        for site, (U, V) in gt.items():
            A, B = dec.components.factors(site)
            if tied and site == "linear2":  # shared with linear1, set above: already the ground truth
                torch.testing.assert_close(A, U)
                torch.testing.assert_close(B, V)
            else:
                A.copy_(U)
                B.copy_(V)
            ci = dec.importance[site]
            ci.w1.zero_(), ci.b1.zero_(), ci.w2.zero_(), ci.b2.zero_()
        dec.importance["linear1"].w1[:, 0] = 100.0  # gamma_c(h) = gelu(100 h): >= 10 for h >= 0.1, 0 at h = 0
        dec.importance["linear1"].w2[:, 0] = 1.0
        dec.importance["linear2"].b2.fill_(1.0)  # importance exactly 1 (also through the upper-leaky sigmoid)
        dec.importance["identity"].b2[:2] = 1.0
    x = sparse_features(512, 5, 0.2, (0.1, 1.0), generator=step_generator(1, 0))
    with torch.no_grad():
        target, acts = dec.target_forward(model, x)
        torch.testing.assert_close(target, tms52_target(x))
        g_lo, g_up = dec.causal_importance(acts)
        torch.testing.assert_close(g_lo["linear1"], (x != 0).float())
        gen = torch.Generator().manual_seed(3)
        masks = {k: stochastic_mask(g, gen) for k, g in g_lo.items()}
        assert float(stochastic_recon_loss(model, dec.components, x, masks, target)) < 1e-12
        assert float(layerwise_recon_loss(model, dec.components, x, masks, target)) < 1e-12
        weights = {s: model.get_submodule(s).weight for s in gt}
        assert float(faithfulness_loss(dec.components, weights)) < 1e-12
        # linear1: 1 + 0.01 (gelu(100 x_c) - 1) per active feature (raw output > 1); linear2: 5 x 1; identity: 2 x 1
        want = torch.where(x != 0, 1 + 0.01 * (F.gelu(100 * x) - 1), 0.0).sum(1).mean() + 5 + 2
        torch.testing.assert_close(importance_minimality_loss(g_up, 1.0, eps=0.0), want)
    mmcs, ml2r, mcs = mmcs_ml2r(W, dec.components.weights()["linear1"])
    assert mmcs == pytest.approx(1.0, abs=1e-6) and ml2r == pytest.approx(1.0, abs=1e-6)
    assert mcs.tolist() == [0, 1, 2, 3, 4]
    # a wrong decomposition is not scored 1: swap two subcomponents' directions
    P = dec.components.weights()["linear1"].clone()
    P[0] = P[1].clone()
    assert mmcs_ml2r(W, P)[0] < 0.999


# ------------------------------------------------------------------------------------------ bad configs
@pytest.mark.parametrize("kw, exc, msg", [
    (dict(C=0), ValueError, "C must be >= 1"),
    (dict(C=2.5), TypeError, "C must be an int"),
    (dict(pnorm=0.0), ValueError, "pnorm"),
    (dict(pnorm=-1.0), ValueError, "pnorm"),
    (dict(d_gate=0), ValueError, "d_gate must be >= 1"),
    (dict(lr=0.0), ValueError, "lr must be finite and > 0"),
    (dict(lr_schedule="linear"), ValueError, "lr_schedule must be"),
    (dict(output_loss="l1"), ValueError, "output_loss must be"),
    (dict(dtype="float16"), ValueError, "dtype must be one of"),
    (dict(targets="W"), TypeError, "targets must be a non-empty tuple"),
    (dict(importance_minimality_coeff=-1.0), ValueError, "importance_minimality_coeff"),
    (dict(reads=(("W",),)), TypeError, "reads must be a tuple of"),
    (dict(tied=("linear1", "linear2")), TypeError, "tied must be a tuple of"),
    (dict(init="xavier"), ValueError, "init must be one of"),
    (dict(layerwise_masks="new"), ValueError, "layerwise_masks must be one of"),
])
def test_bad_configs_raise_clear_errors(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        SPDConfig(**kw)


def test_unknown_site_and_mismatched_shapes_raise():
    model = Tiny()
    sample = lambda s: torch.randn(8, 3)
    with pytest.raises(ValueError, match="targets: 'nope' must name an nn.Linear"):
        decompose(model, sample, SPDConfig(targets=("nope",), steps=1, batch_size=8), quiet=True)
    with pytest.raises(ValueError, match="does not fit the model"):
        decompose(model, lambda s: torch.randn(8, 5), SPDConfig(targets=("lin1",), steps=1, batch_size=8), quiet=True)
    tms = TMS(5, 2)
    with pytest.raises(ValueError, match="reads: \\['nope'\\] are not parameter sites"):
        _dec(tms, ["W"], reads={"nope": ""})
    with pytest.raises(ValueError, match="is not a module of the model"):
        _dec(tms, ["W"], reads={"W": "missing"})
    idm = with_identity(tms)
    dec = _dec(idm, ["W"], reads={"W": "identity"})  # identity's input has d_hidden = 2 features, W reads 5
    with pytest.raises(ValueError, match="d_in = 5"):
        dec.causal_importance(dec.target_forward(idm, torch.rand(4, 5))[1])
    dec = _dec(model, ["lin1", "lin2"])
    with pytest.raises(ValueError, match="masks\\['lin1'\\] must have shape \\[batch=4, C=3\\]"):
        stochastic_recon_loss(model, dec.components, torch.randn(4, 3),
                              {"lin1": torch.ones(4, 2), "lin2": torch.ones(4, 3)}, torch.zeros(4, 2))
    with pytest.raises(ValueError, match="masks must have one entry per site"):
        layerwise_recon_loss(model, dec.components, torch.randn(4, 3), {"lin1": torch.ones(4, 3)}, torch.zeros(4, 2))
    with pytest.raises(ValueError, match="p \\(importance-minimality exponent\\)"):
        importance_minimality_loss({"a": torch.ones(2, 3)}, 0.0)
    with pytest.raises(ValueError, match="C \\(number of components\\)"):
        _dec(model, ["lin1"], C=0)


# ------------------------------------------------------------------------------------------------ metrics
def test_scrub_keep_masks_with_subcomponent_sets():
    from mlpinterp.paramspace import scrub_keep_masks

    active = np.array([[1, 0, 0], [0, 1, 1], [0, 0, 0]], bool)
    responsible = [np.array([0, 1]), np.array([2]), np.array([3, 4])]
    ks, ka = scrub_keep_masks(active, responsible, 10, np.random.default_rng(0))
    resp = [{0, 1}, {2, 3, 4}, set()]
    for b in range(3):
        zs, za = set(np.flatnonzero(ks[b].numpy() == 0)), set(np.flatnonzero(ka[b].numpy() == 0))
        assert len(zs) == 5 and not zs & resp[b]  # scrubbed: half ablated, none responsible
        assert len(za) == 5 and resp[b] <= za  # anti-scrubbed: every responsible one ablated


def test_alive_and_per_feature_counts_on_hand_importances():
    from mlpinterp.spd import alive_subcomponents, responsible_sets, subcomponents_per_feature

    ci = {"a": torch.tensor([[0.9, 0.05, 0.0], [0.2, 0.1, 0.0], [0.0, 0.5, 0.11]])}
    assert alive_subcomponents(ci)["a"].tolist() == [True, True, True]
    assert alive_subcomponents(ci, 0.3)["a"].tolist() == [True, True, False]
    assert subcomponents_per_feature(ci)["a"].tolist() == [1, 1, 2]
    assert [s.tolist() for s in responsible_sets(ci["a"])] == [[0], [0], [1, 2]]


def test_target_pattern_errors_on_hand_importances():
    from mlpinterp.spd.metrics import coactivity, dense_ci_error, identity_ci_error

    # identity: the best assignment (row 0 -> column 0, row 1 -> column 1); 0.2 off it, 0.85 on it below 0.9
    assert identity_ci_error(torch.tensor([[0.95, 0.0, 0.2], [0.0, 0.85, 0.0]])) == 2
    assert identity_ci_error(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])) == 0  # a permuted identity
    # the assignment maximises the sum (0.8 + 0.95), not row by row (greedy: 0.9 + 0.0, which would give 3)
    assert identity_ci_error(torch.tensor([[0.9, 0.8], [0.95, 0.0]])) == 2
    assert identity_ci_error(torch.tensor([[0.95, 0.0, 0.2], [0.0, 0.85, 0.0]]), tolerance=0.25) == 0
    with pytest.raises(ValueError, match="C >= n_features"):
        identity_ci_error(torch.ones(2, 1))
    g = torch.tensor([[1.0, 0.5, 0.0, 0.2], [1.0, 0.95, 0.0, 0.0], [0.95, 0.3, 0.05, 0.0]])
    # columns by mass: 0 (2.95), 1 (1.75), 3 (0.2), 2 (0.05); the first two have an entry >= 0.9
    assert dense_ci_error(g, 2) == 1  # column 3's 0.2
    assert dense_ci_error(g, 3) == 1  # column 3 has no strong entry; column 2 nothing above 0.1
    assert dense_ci_error(g, 1) == 4  # column 1's three entries and column 3's one
    with pytest.raises(ValueError, match="C >= k"):
        dense_ci_error(g, 5)
    c = coactivity(g)
    assert c["used"] == 3 and c["always"] == 2 and c["fraction"] == pytest.approx(7 / 9)
    assert math.isnan(coactivity(torch.zeros(2, 3))["fraction"])
