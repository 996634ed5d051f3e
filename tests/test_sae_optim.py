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


def test_equals_schedulefree_wrapper_step_by_step():
    schedulefree = pytest.importorskip("schedulefree")
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(5, 4, generator=g), torch.randn(4, generator=g)]
    ours = [t.clone().requires_grad_() for t in init]
    ref = [t.clone().requires_grad_() for t in init]
    opt = ScheduleFreeSignum(ours, lr=0.05, momentum=0.95)
    wrap = schedulefree.ScheduleFreeWrapper(_SignSgd(ref, lr=0.05), momentum=0.95)
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
        for a, b in zip(ours, ref, strict=True):  # uniform weights 1/(t+1) vs lr^2 / (summed lr^2): float rounding
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=f"training point differs at step {step}")
    y = [p.detach().clone() for p in ours]
    wrap.eval()
    with opt.averaged():
        for a, b in zip(ours, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            assert not torch.equal(a, y[0] if a.shape == y[0].shape else y[1])
    for a, b in zip(ours, y, strict=True):
        assert torch.equal(a, b), "averaged() must restore the training point bit for bit"


def test_state_resumes_from_optimizer_state_alone():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(3, 3, generator=g)
    grads = [torch.randn(3, 3, generator=g) for _ in range(6)]
    a = w.clone().requires_grad_()
    opt = ScheduleFreeSignum([a], lr=0.1)
    for gr in grads:
        a.grad = gr.clone()
        opt.step()
    b = w.clone().requires_grad_()
    opt_b = ScheduleFreeSignum([b], lr=0.1)
    for gr in grads[:3]:
        b.grad = gr.clone()
        opt_b.step()
    c = b.detach().clone().requires_grad_()
    opt_c = ScheduleFreeSignum([c], lr=0.1)
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
