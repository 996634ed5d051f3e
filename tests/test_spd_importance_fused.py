"""The fused causal-importance MLPs (recomputing the hidden layer in the backward pass) against autograd of the plain
formula: values and every gradient, float64, to 1e-12."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mlpinterp.spd import importance, importance_fused
from mlpinterp.spd.importance import CausalImportance
from mlpinterp.spd.importance_fused import fused_scalar_mlps

torch.set_num_threads(1)


def _oracle(h, w1, b1, w2, b2):
    """The formula written out with an explicit hidden layer (autograd differentiates it)."""
    hidden = F.gelu(h[..., None] * w1 + b1)  # [..., C, d_gate]
    return (hidden * w2).sum(-1) + b2


def _inputs(shape, C, d_gate, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(*shape, C, generator=g, dtype=torch.float64) * 2).requires_grad_()
    params = [(torch.randn(C, d_gate, generator=g, dtype=torch.float64) * s).requires_grad_() for s in (1.4, 0.5, 0.3)]
    return h, [*params, torch.randn(C, generator=g, dtype=torch.float64).requires_grad_()]


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("shape", [(37,), (3, 11), (0,)])
def test_fused_equals_the_formula_in_value_and_gradient_float64(compile, shape, monkeypatch):
    monkeypatch.setattr(importance_fused, "BLOCK_BYTES", 7 * 5 * 8 * 4)  # 4 rows per block: several, the last short
    h, params = _inputs(shape, 7, 5)
    up = torch.randn(*shape, 7, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    got = fused_scalar_mlps(h, *params, compile=compile)
    want = _oracle(h, *params)
    assert got.shape == want.shape == (*shape, 7)
    _close(got, want)
    grads = torch.autograd.grad(got, [h, *params], up, allow_unused=True)
    ref = torch.autograd.grad(want, [h, *params], up)
    for name, a, b in zip(("h", "w1", "b1", "w2", "b2"), grads, ref, strict=True):
        assert a is not None, name
        _close(a, b)


@pytest.mark.parametrize("compile", [False, True])
def test_causal_importance_through_the_fused_path_with_zero_rows(compile, monkeypatch):
    """``importance.FUSED`` on: CausalImportance (zero-row path included: 3/4 of the rows are zero) gives the plain
    formula's values and gradients."""
    monkeypatch.setitem(importance.FUSED, compile, True)
    monkeypatch.setattr(importance, "FUSED_EAGER_MIN_WIDTH", 0)
    ci = CausalImportance(6, 4, torch.Generator().manual_seed(1)).double()
    h = torch.randn(1024, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    h[torch.arange(1024) % 4 != 0] = 0
    h.requires_grad_()
    got = ci(h, compile)
    want = _oracle(h, ci.w1, ci.b1, ci.w2, ci.b2)
    _close(got, want)
    params = [h, ci.w1, ci.b1, ci.w2, ci.b2]
    for a, b in zip(torch.autograd.grad(got.square().sum(), params), torch.autograd.grad(want.square().sum(), params),
                    strict=True):
        _close(a, b)


def test_fused_gradient_by_finite_differences():
    """An oracle independent of autograd: central differences of the float64 forward in one entry of each input."""
    h, params = _inputs((5,), 3, 4, seed=3)
    inputs = [h, *params]
    up = torch.randn(5, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    grads = torch.autograd.grad(fused_scalar_mlps(*inputs), inputs, up)
    eps = 1e-6
    for x, g in zip(inputs, grads, strict=True):
        with torch.no_grad():
            x.view(-1)[1] += eps
            hi = float((fused_scalar_mlps(*inputs) * up).sum())
            x.view(-1)[1] -= 2 * eps
            lo = float((fused_scalar_mlps(*inputs) * up).sum())
            x.view(-1)[1] += eps
        assert math.isclose(float(g.view(-1)[1]), (hi - lo) / (2 * eps), rel_tol=1e-7, abs_tol=1e-9)


def test_second_derivative_is_refused():
    h, params = _inputs((4,), 2, 3)
    (gh,) = torch.autograd.grad(fused_scalar_mlps(h, *params).sum(), h, create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad|once_differentiable"):
        gh.sum().backward()


def test_the_default_path_is_fused_for_wide_eager_sites_only(monkeypatch):
    """The measured choice (importance.FUSED): eager and C * d_gate >= FUSED_EAGER_MIN_WIDTH -> the fused Function;
    narrower eager sites and compiled ones -> autograd of the formula."""
    calls = []
    monkeypatch.setattr(importance, "fused_scalar_mlps", lambda *a, **k: calls.append(k) or fused_scalar_mlps(*a, **k))

    def fused(C, d_gate):
        calls.clear()
        CausalImportance(C, d_gate, torch.Generator().manual_seed(0))(torch.randn(3, C), False)
        return bool(calls)

    width = importance.FUSED_EAGER_MIN_WIDTH
    assert importance.FUSED == {False: True, True: False}
    assert fused(width // 16, 16) and not fused(width // 16 - 1, 16)
