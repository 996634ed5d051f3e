"""AuxK: the value against EleutherAI sparsify's own formula on the same weights and inputs, the gradients against a
dense autograd reference, and the sparse backward kept when latents are dead."""

from __future__ import annotations

import pytest
import torch

from mlpinterp.sae.topk import SaeConfig, TopKSae, _TopKEncode

D_IN, D_SAE, K = 8, 40, 3


def _pair(seed: int = 0):
    """Our SAE (float64) and a sparsify SparseCoder with the same weights."""
    sparsify = pytest.importorskip("sparsify")
    g = torch.Generator().manual_seed(seed)
    ours = TopKSae(D_IN, SaeConfig(d_sae=D_SAE, k=K), generator=g, dtype=torch.float64)
    with torch.no_grad():
        ours.encoder.bias.normal_(0, 0.3, generator=g)
        ours.b_dec.normal_(0, 0.3, generator=g)
    theirs = sparsify.SparseCoder(D_IN, sparsify.SparseCoderConfig(num_latents=D_SAE, k=K), dtype=torch.float64)
    with torch.no_grad():
        theirs.encoder.weight.copy_(ours.encoder.weight)
        theirs.encoder.bias.copy_(ours.encoder.bias)
        theirs.W_dec.copy_(ours.W_dec)
        theirs.b_dec.copy_(ours.b_dec)
    x = torch.randn(64, D_IN, dtype=torch.float64, generator=g) * 2 + 1
    return ours, theirs, x


def _dead(n_dead: int, seed: int = 0) -> torch.Tensor:
    m = torch.zeros(D_SAE, dtype=torch.bool)
    m[torch.randperm(D_SAE, generator=torch.Generator().manual_seed(seed))[:n_dead]] = True
    return m


@pytest.mark.parametrize("n_dead", [1, 2, D_IN // 2 - 1, D_IN // 2, D_IN // 2 + 3, D_SAE - K])
def test_auxk_value_and_decoder_gradient_equal_sparsify(n_dead):
    """k_aux = d_in // 2 = 4: one dead latent weighs 1/4 (the scale is taken before k_aux is clipped), and the
    loss is normalised by the input's total variance; equal to sparsify's value to float64 rounding."""
    ours, theirs, x = _pair()
    dead = _dead(n_dead)
    a = ours(x, dead_mask=dead)
    b = theirs(x, dead_mask=dead)
    assert float(a.auxk_loss.detach()) == pytest.approx(float(b.auxk_loss.detach()), rel=1e-12, abs=1e-15)
    assert float(a.auxk_loss.detach()) > 0
    a.auxk_loss.backward()
    b.auxk_loss.backward()
    # sparsify's fused encoder drops the gradient of its pre-activations, so only its decoder learns from AuxK;
    # the decoder gradients must agree
    torch.testing.assert_close(ours.W_dec.grad, theirs.W_dec.grad, rtol=1e-10, atol=1e-13)


def test_auxk_by_hand_one_dead_latent():
    """One dead latent j: e_hat = ReLU(pre_j) W_dec[j]; loss = (1 / 4) ||e_hat - e||^2 / sum ||x - mean x||^2."""
    ours, _, x = _pair(1)
    dead = _dead(1, seed=3)
    j = int(dead.nonzero())
    out = ours(x, dead_mask=dead)
    with torch.no_grad():
        pre = (x - ours.b_dec) @ ours.encoder.weight.T + ours.encoder.bias
        e = x - out.sae_out
        e_hat = pre[:, j:j + 1].clamp_min(0) * ours.W_dec[j]
        want = 0.25 * (e_hat - e).pow(2).sum() / (x - x.mean(0)).pow(2).sum()
    assert float(out.auxk_loss.detach()) == pytest.approx(float(want), rel=1e-12)


@pytest.mark.parametrize("n_dead", [1, 5, 30])
def test_auxk_encoder_gradient_equals_dense_autograd(n_dead):
    """The sparse backward (TopK and AuxK latents, k + k_aux entries per row) against plain dense autograd of
    the same loss: reconstruction FVU + AuxK."""
    ours, _, x = _pair(2)
    dead = _dead(n_dead, seed=4)
    out = ours(x, dead_mask=dead)
    (out.fvu + out.auxk_loss).backward()
    w, b = ours.encoder.weight.detach().clone().requires_grad_(), ours.encoder.bias.detach().clone().requires_grad_()
    wd, bd = ours.W_dec.detach().clone().requires_grad_(), ours.b_dec.detach().clone().requires_grad_()
    pre = (x - bd) @ w.T + b
    vals, idx = pre.topk(K, dim=-1)
    z = torch.zeros_like(pre).scatter(1, idx, vals.clamp_min(0))
    x_hat = z @ wd + bd
    e = x - x_hat
    tv = (x - x.mean(0)).pow(2).sum()
    k_aux = min(D_IN // 2, n_dead)
    avals, aidx = pre.masked_fill(~dead, -torch.inf).topk(k_aux, dim=-1)
    za = torch.zeros_like(pre).scatter(1, aidx, avals.clamp_min(0))
    aux = min(n_dead / (D_IN // 2), 1.0) * (za @ wd - e.detach()).pow(2).sum() / tv
    (e.pow(2).sum() / tv + aux).backward()
    for got, want in ((ours.encoder.weight.grad, w.grad), (ours.encoder.bias.grad, b.grad),
                      (ours.W_dec.grad, wd.grad), (ours.b_dec.grad, bd.grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


def test_dead_latents_keep_the_sparse_backward(monkeypatch):
    """With dead latents the encoder's backward must not take the dense path (a [batch, d_sae] gradient)."""
    ours, _, x = _pair()
    seen = []
    orig = _TopKEncode.backward

    def spy(ctx, g_acts, g_idx, g_pre, g_aux, g_aux_idx):  # noqa: PLR0913
        seen.append(g_pre)
        return orig(ctx, g_acts, g_idx, g_pre, g_aux, g_aux_idx)

    monkeypatch.setattr(_TopKEncode, "backward", staticmethod(spy))
    out = ours(x, dead_mask=_dead(7))
    (out.fvu + out.auxk_loss).backward()
    assert seen == [None]
