"""Schedule-free Signum against the reference schedule-free wrapper (``schedulefree.ScheduleFreeWrapper``) around a
plain sign-SGD step, on the same gradients, with in-place parameter changes between steps (equal to float32
rounding: the reference accumulates its weights lr**2 in a sum, ours takes 1 / (t + 1))."""

from __future__ import annotations

import pytest
import torch

from mlpinterp.sae.optim import ScheduleFreeSignum


class _SignSgd(torch.optim.Optimizer):
    """The reference's inner step: p -= lr * sign(grad) (as sparsify's SignSGD)."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])


@pytest.mark.parametrize("r", [0.0, 1.0, 2.5])
def test_equals_schedulefree_wrapper_step_by_step(r):
    """``average_power`` is the wrapper's ``r`` (average weights proportional to ``t**r``)."""
    schedulefree = pytest.importorskip("schedulefree")
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(5, 4, generator=g), torch.randn(4, generator=g)]
    ours = [t.clone().requires_grad_() for t in init]
    ref = [t.clone().requires_grad_() for t in init]
    opt = ScheduleFreeSignum(ours, lr=0.05, momentum=0.95, average_power=r)
    wrap = schedulefree.ScheduleFreeWrapper(_SignSgd(ref, lr=0.05), momentum=0.95, r=r)
    wrap.train()
    target = torch.randn(5, 4, generator=g)
    for step in range(12):
        for ps in (ours, ref):
            loss = (ps[0] - target).pow(3).abs().sum() + ps[1].sin().sum()
            loss.backward()
        opt.step()
        wrap.step()
        for ps in (ours, ref):
            for p in ps:
                p.grad = None
            if step % 3 == 2:  # an in-place change between steps, as decoder renormalisation
                with torch.no_grad():
                    ps[0].div_(ps[0].norm(dim=1, keepdim=True))
        for a, b in zip(ours, ref, strict=True):  # t**r / sum i**r vs t**r lr^2 / (summed t**r lr^2): float rounding
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=f"training point differs at step {step}")
    y = [p.detach().clone() for p in ours]
    wrap.eval()
    with opt.averaged():
        for a, b in zip(ours, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            assert not torch.equal(a, y[0] if a.shape == y[0].shape else y[1])
    for a, b in zip(ours, y, strict=True):
        assert torch.equal(a, b), "averaged() must restore the training point bit for bit"


@pytest.mark.parametrize("r", [0.0, 1.0, 0.5])
def test_state_resumes_from_optimizer_state_alone(r):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(3, 3, generator=g)
    grads = [torch.randn(3, 3, generator=g) for _ in range(6)]
    a = w.clone().requires_grad_()
    opt = ScheduleFreeSignum([a], lr=0.1, average_power=r)
    for gr in grads:
        a.grad = gr.clone()
        opt.step()
    b = w.clone().requires_grad_()
    opt_b = ScheduleFreeSignum([b], lr=0.1, average_power=r)
    for gr in grads[:3]:
        b.grad = gr.clone()
        opt_b.step()
    c = b.detach().clone().requires_grad_()
    opt_c = ScheduleFreeSignum([c], lr=0.1, average_power=r)
    opt_c.state[c] = {k: v.clone() for k, v in opt_b.state[b].items()}
    for gr in grads[3:]:
        c.grad = gr.clone()
        opt_c.step()
    assert torch.equal(a, c)


def test_bad_arguments():
    p = torch.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="lr must be > 0"):
        ScheduleFreeSignum([p], lr=0.0)
    with pytest.raises(ValueError, match="momentum must be in"):
        ScheduleFreeSignum([p], lr=0.1, momentum=1.0)
    for bad in (-1.0, float("nan"), True):
        with pytest.raises(ValueError, match="average_power must be a finite number >= 0"):
            ScheduleFreeSignum([p], lr=0.1, average_power=bad)


def test_average_power_weights_by_hand():
    """With a gradient of constant sign the base sequence is z_t = z_0 - t lr, so the average of z_1 .. z_t with weights
    i**r is z_0 - lr sum i**(r+1) / sum i**r: for r = 1 after 4 steps, z_0 - lr (1 + 4 + 9 + 16) / 10 = z_0 - 3 lr
    (uniform weights would give z_0 - 2.5 lr); the training point is y = (1 - beta) z + beta x."""
    p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = ScheduleFreeSignum([p], lr=0.1, momentum=0.5, average_power=1.0)
    for _ in range(4):
        p.grad = torch.ones(1, dtype=torch.float64)
        opt.step()
    with opt.averaged():
        assert float(p) == pytest.approx(-3 * 0.1, rel=1e-12)
    z = float(opt.state[p]["z"])
    assert z == pytest.approx(-0.4, rel=1e-12) and float(p) == pytest.approx(0.5 * z + 0.5 * -0.3, rel=1e-12)
