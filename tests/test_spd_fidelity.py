"""SPD fidelity to its two forms: the lower hard sigmoid (the paper's leaky form, the current reference's clamped form
with an upward-only gradient leak) and tied factors (one parameter with summed gradients, or the reference's two
parameters over one storage), each against hand values or an independent untied oracle."""

from __future__ import annotations

import pytest
import torch

from mlpinterp.paramspace import resolve_sites
from mlpinterp.spd import SPDConfig, stochastic_recon_loss
from mlpinterp.spd.decomposition import Decomposition, resolve_reads
from mlpinterp.spd.sigmoids import LOWER_SIGMOIDS, clamped_hard_sigmoid, leaky_hard_sigmoid
from mlpinterp.spd.tying import SeparatelyTiedComponents
from mlpinterp.studies.spd.settings import PRESETS, spd_config
from mlpinterp.toys import as_linears, sparse_features, step_generator, with_identity

torch.set_num_threads(1)

# the edges: x < 0, 0, inside, 1, x > 1
X = [-2.0, 0.0, 0.5, 1.0, 1.5]


def _value_and_grad(fn, upstream: float):
    x = torch.tensor(X, dtype=torch.float64, requires_grad=True)
    y = fn(x)
    (g,) = torch.autograd.grad(y, x, grad_outputs=torch.full_like(y, upstream))
    return y.detach().tolist(), g.tolist()


@pytest.mark.parametrize("upstream", [1.0, -3.0])
def test_paper_lower_sigmoid_leaks_value_and_gradient_both_ways(upstream):
    """sigma_H,lower of the SPD paper: 0.01 x below and at 0 (value), slope 0.01 whatever the upstream sign."""
    y, g = _value_and_grad(leaky_hard_sigmoid, upstream)
    assert y == pytest.approx([-0.02, 0.0, 0.5, 1.0, 1.0], abs=1e-15)
    assert g == pytest.approx([0.01 * upstream, 0.01 * upstream, upstream, upstream, 0.0], abs=1e-15)


def test_clamped_lower_sigmoid_clamps_the_value_and_leaks_only_an_upward_gradient():
    """The current reference's LowerLeakyHardSigmoidFunction: value clamp(x, 0, 1); for x <= 0 a gradient G < 0
    (descent raises the value) passes as 0.01 G, a G >= 0 is stopped; G on (0, 1]; 0 above 1."""
    y, g_up = _value_and_grad(clamped_hard_sigmoid, -3.0)  # descent wants a larger value
    assert y == [0.0, 0.0, 0.5, 1.0, 1.0]
    assert g_up == pytest.approx([-0.03, -0.03, -3.0, -3.0, 0.0], abs=1e-15)
    _, g_down = _value_and_grad(clamped_hard_sigmoid, 2.0)  # descent wants a smaller value: nothing below 0
    assert g_down == [0.0, 0.0, 2.0, 2.0, 0.0]
    # mixed signs in one tensor, elementwise; a zero upstream gradient gives zero
    x = torch.tensor([-1.0, -1.0, -1.0, 0.25], requires_grad=True)
    (g,) = torch.autograd.grad(clamped_hard_sigmoid(x), x, grad_outputs=torch.tensor([-1.0, 1.0, 0.0, 5.0]))
    assert g.tolist() == pytest.approx([-0.01, 0.0, 0.0, 5.0], abs=1e-9)
    assert set(LOWER_SIGMOIDS) == {"leaky", "clamped"}


def _dec(model, tied_updates, lower_sigmoid="leaky", C=4, seed=0):
    sites = resolve_sites(model, model.target_names())
    W = {s.name: model.get_submodule(s.name).weight.detach() for s in sites}
    return Decomposition(sites, C, 3, resolve_reads(model, sites), torch.Generator().manual_seed(seed),
                         tied={"linear2": "linear1"}, target_weights=W, tied_updates=tied_updates,
                         lower_sigmoid=lower_sigmoid)


def test_decomposition_uses_the_configured_lower_sigmoid(tms52_target):
    model = as_linears(tms52_target)
    x = sparse_features(64, 5, 0.5, generator=step_generator(0, 0))
    acts = _dec(model, "summed").target_forward(model, x)[1]
    for name, fn in LOWER_SIGMOIDS.items():
        dec = _dec(model, "summed", name)
        with torch.no_grad():
            dec.importance["linear1"].b2.fill_(-0.3)  # raw importances below 0 for many samples
            raw = dec.importance["linear1"](dec.inner_acts(acts)["linear1"])
            g_low, g_up = dec.causal_importance(acts)
        assert bool((raw < 0).any())
        torch.testing.assert_close(g_low["linear1"], fn(raw), rtol=0, atol=0)
        assert bool((g_low["linear1"] >= 0).all()) == (name == "clamped")


def test_separately_tied_factors_are_views_of_the_source_through_dtype_changes_and_state_dicts(tms52_target):
    model = as_linears(tms52_target)
    dec = _dec(model, "separate")
    comps = dec.components
    assert isinstance(comps, SeparatelyTiedComponents)
    names = {k for k, _ in dec.named_parameters()}
    assert {"components.tied_A.linear2", "components.tied_B.linear2"} <= names  # two optimiser parameters

    def tied_ok():
        (A1, B1), (A2, B2) = comps.factors("linear1"), comps.factors("linear2")
        assert A2 is comps.tied_A["linear2"] and B2 is comps.tied_B["linear2"]
        assert A2.untyped_storage().data_ptr() == B1.untyped_storage().data_ptr()
        assert B2.untyped_storage().data_ptr() == A1.untyped_storage().data_ptr()
        assert torch.equal(A2, B1.transpose(1, 2)) and torch.equal(B2, A1.transpose(1, 2))

    tied_ok()
    dec.to(torch.float64)  # converts each parameter on its own: re-tied
    tied_ok()
    with torch.no_grad():
        comps.factors("linear1")[1].mul_(2.0)  # a write to the source is seen by the tied site
    tied_ok()
    sd = dec.state_dict()
    assert set(sd) == set(_dec(model, "summed").state_dict())  # the same tensors as the summed form
    fresh = _dec(model, "separate", seed=7).double()
    fresh.load_state_dict(sd)  # strict: the views are not missing, they come with their source
    for k, v in sd.items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert torch.equal(fresh.V("linear2"), dec.V("linear2"))


def _untied_copy(dec):
    untied = Decomposition(dec.sites, dec.C, 3, dec.reads)
    with torch.no_grad():
        for s in dec.sites:
            for a, b in zip(untied.components.factors(s), dec.components.factors(s), strict=True):
                a.copy_(b)
    return untied


def test_separate_tying_gives_each_use_its_own_gradient_and_adam_update(tms52_target):
    """Oracle: an untied decomposition holding the same values. With "separate", the source's factors get linear1's
    gradient only and the tied views linear2's only; one Adam step then moves the shared values by both first-step
    updates, lr g1 / (|g1| + eps) + lr g2 / (|g2| + eps) (hand formula); "summed" moves them by one update of g1 + g2."""
    model = as_linears(with_identity(tms52_target))
    model.requires_grad_(False)
    x = sparse_features(16, 5, 0.5, generator=step_generator(0, 0))
    masks = {s: torch.rand(16, 4, generator=torch.Generator().manual_seed(2)) for s in ("linear1", "identity",
                                                                                         "linear2")}
    target = model(x)
    lr, eps = 1e-2, 1e-8
    moved = {}
    for mode in ("separate", "summed"):
        dec = _dec(model, mode)
        untied = _untied_copy(dec)
        stochastic_recon_loss(model, untied.components, x, masks, target).backward()
        (uA1, uB1), (uA2, uB2) = untied.components.factors("linear1"), untied.components.factors("linear2")
        B1_before = dec.components.factors("linear1")[1].detach().clone()
        stochastic_recon_loss(model, dec.components, x, masks, target).backward()
        A1, B1 = dec.components.factors("linear1")
        g1, g2 = uB1.grad, uA2.grad.transpose(1, 2)  # the two uses' gradients of B[linear1] = A[linear2]^T
        if mode == "separate":
            torch.testing.assert_close(A1.grad, uA1.grad, rtol=0, atol=0)
            torch.testing.assert_close(B1.grad, g1, rtol=0, atol=0)
            torch.testing.assert_close(dec.components.factors("linear2")[0].grad, uA2.grad, rtol=0, atol=0)
            torch.testing.assert_close(dec.components.factors("linear2")[1].grad, uB2.grad, rtol=0, atol=0)
            expected = B1_before - lr * g1 / (g1.abs() + eps) - lr * g2 / (g2.abs() + eps)
        else:
            torch.testing.assert_close(B1.grad, g1 + g2)
            expected = B1_before - lr * (g1 + g2) / ((g1 + g2).abs() + eps)
        torch.optim.Adam(dec.parameters(), lr=lr).step()
        torch.testing.assert_close(dec.components.factors("linear1")[1].detach(), expected, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(dec.V("linear2"), dec.U("linear1").T, rtol=0, atol=0)  # still tied
        moved[mode] = (dec.components.factors("linear1")[1].detach() - B1_before).abs().max()
    assert moved["separate"] > 1.5 * lr  # two updates of about lr each where both uses push the same way


def test_recipes_carry_their_forms():
    for name, cfg in PRESETS.items():
        assert (cfg.lower_sigmoid, cfg.tied_updates) == ("leaky", "summed"), name  # the paper presets: 2025 forms
    cur = spd_config("tms-5-2", False, 0, "current")
    assert (cur.lower_sigmoid, cur.tied_updates) == ("clamped", "separate")
    with pytest.raises(ValueError, match="lower_sigmoid must be one of"):
        SPDConfig(lower_sigmoid="hard")
    with pytest.raises(ValueError, match="tied_updates must be one of"):
        SPDConfig(tied_updates="both")
    with pytest.raises(ValueError, match="tied_updates must be one of"):
        _dec(as_linears(_fresh_tms()), "twice")


def _fresh_tms():
    from mlpinterp.toys import TMS

    return TMS(5, 2)
