"""TopK SAE: exactness of TopK + ReLU, tied decoder, unit-norm constraint, AuxK, metrics, save/load, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from mlpinterp.sae.evaluate import identity_sae
from mlpinterp.sae.io import load_sae, save_sae
from mlpinterp.sae.metrics import dead_fraction, firing_counts, fvu, l0
from mlpinterp.sae.topk import SaeConfig, TopKSae


def _sae(d_in=6, d_sae=10, k=3, seed=0, **kw) -> TopKSae:
    return TopKSae(d_in, SaeConfig(d_sae=d_sae, k=k, **kw), generator=torch.Generator().manual_seed(seed),
                   dtype=torch.float64)


def _brute_force(sae: TopKSae, x: torch.Tensor) -> torch.Tensor:
    """Reference forward written out with a Python loop: pre-activations, keep the k largest, ReLU, decode."""
    xin = x - sae.b_dec if sae.cfg.pre_bias else x
    pre = xin @ sae.encoder.weight.T + sae.encoder.bias
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        order = sorted(range(sae.cfg.d_sae), key=lambda j: -float(pre[b, j].detach()))[: sae.cfg.k]
        for j in order:
            out[b] += max(float(pre[b, j].detach()), 0.0) * sae.W_dec[j]
    return out + sae.b_dec


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("pre_bias", [False, True])
def test_topk_then_relu_matches_brute_force(tied, pre_bias):
    sae = _sae(tied=tied, pre_bias=pre_bias)
    with torch.no_grad():
        sae.encoder.bias.normal_(-1.5, 0.3, generator=torch.Generator().manual_seed(1))  # some top-k < 0
        sae.b_dec.normal_(0, 0.3, generator=torch.Generator().manual_seed(2))
    x = torch.randn(20, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    out = sae(x)
    torch.testing.assert_close(out.sae_out, _brute_force(sae, x))
    assert out.latent_indices.shape == (20, 3)
    assert (out.latent_acts >= 0).all()  # ReLU after TopK: no negative activation survives
    assert (out.latent_acts == 0).any()  # the biases made some selected pre-activations negative
    dense = sae.dense_latents(x)
    assert ((dense != 0).sum(1) <= 3).all()
    # FVU with variance about the mean, written out independently
    e = (x - out.sae_out).pow(2).sum()
    var = ((x - x.mean(0, keepdim=True)) ** 2).sum()
    torch.testing.assert_close(out.fvu, e / var)
    torch.testing.assert_close(out.mse, e / x.numel())


def test_fvu_uses_variance_about_the_mean():
    # x has a large common offset; FVU about zero would be ~0 for the mean predictor, about the mean it is 1.
    x = torch.randn(50, 4, dtype=torch.float64) + 100.0
    assert float(fvu(x, x.mean(0).expand_as(x))) == pytest.approx(1.0)


def test_gradient_of_fused_encoder_matches_dense_autograd():
    sae = _sae(tied=False)
    x = torch.randn(16, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    sae(x).fvu.backward()
    got = {n: p.grad.clone() for n, p in sae.named_parameters()}
    ref = _sae(tied=False)
    ref.load_state_dict(sae.state_dict())
    xin = x - ref.b_dec
    pre = xin @ ref.encoder.weight.T + ref.encoder.bias
    v, i = pre.topk(3, dim=1)
    z = torch.zeros_like(pre).scatter(1, i, v.relu())
    x_hat = z @ ref.W_dec + ref.b_dec
    ((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum()).backward()
    for n, p in ref.named_parameters():
        torch.testing.assert_close(got[n], p.grad, msg=n)


def test_tied_decoder_is_the_encoder_weight():
    sae = _sae(tied=True)
    assert sae.W_dec is sae.encoder.weight
    assert len(list(sae.parameters())) == 3  # encoder weight, encoder bias, b_dec
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(10, dtype=torch.float64))


@pytest.mark.parametrize("tied", [False, True])
def test_unit_norm_constraint_and_parallel_gradient_removal(tied):
    sae = _sae(tied=tied)
    x = torch.randn(32, 6, dtype=torch.float64)
    sae(x).fvu.backward()
    sae.remove_gradient_parallel_to_decoder_directions()
    assert (sae.W_dec.grad * sae.W_dec).sum(1).abs().max() < 1e-12
    with torch.no_grad():
        sae.W_dec.add_(0.3 * torch.randn_like(sae.W_dec))
    sae.set_decoder_norm_to_unit_norm()
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(10, dtype=torch.float64))


def test_identity_sae_reconstructs_exactly():
    x = torch.randn(40, 7, dtype=torch.float64)
    out = identity_sae(7, dtype=torch.float64)(x)
    torch.testing.assert_close(out.sae_out, x)
    assert float(out.fvu.detach()) < 1e-24


def test_auxk_only_uses_dead_latents_and_is_zero_without_them():
    sae = _sae(d_sae=12, k=2)
    x = torch.randn(30, 6, dtype=torch.float64)
    assert float(sae(x).auxk_loss.detach()) == 0.0
    assert float(sae(x, dead_mask=torch.zeros(12, dtype=torch.bool)).auxk_loss.detach()) == 0.0
    dead = torch.zeros(12, dtype=torch.bool)
    dead[[0, 5, 7]] = True
    out = sae(x, dead_mask=dead)
    assert float(out.auxk_loss.detach()) > 0
    out.auxk_loss.backward()
    # Only the dead latents' encoder rows receive gradient from AuxK.
    g = sae.encoder.weight.grad.abs().sum(1)
    assert (g[~dead] == 0).all() and (g[dead] > 0).any()


def test_metrics_l0_firing_and_dead_fraction():
    acts = torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.5, 0.0]])
    idx = torch.tensor([[0, 1, 2], [2, 3, 0]])
    assert float(l0(acts)) == pytest.approx(2.0)  # (2 + 2) / 2
    counts = firing_counts(acts, idx, 5)
    # latent 0: fired in row 0 (1.0), selected but zero in row 1; latent 2: 2.0 and 0.5; latent 3: 0.5
    assert counts.tolist() == [1, 0, 2, 1, 0]
    assert dead_fraction(counts) == pytest.approx(2 / 5)


@pytest.mark.parametrize("layout", ["sparsify", "saelens"])
@pytest.mark.parametrize("tied", [False, True])
def test_save_load_round_trip(tmp_path, layout, tied):
    sae = _sae(tied=tied)
    with torch.no_grad():
        sae.encoder.bias.normal_()
        sae.b_dec.normal_()
    save_sae(sae, tmp_path / "sae", layout=layout)
    files = sorted(p.name for p in (tmp_path / "sae").iterdir())
    assert files == sorted(["cfg.json", "sae.safetensors" if layout == "sparsify" else "sae_weights.safetensors"])
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert cfg["d_in"] == 6 and cfg["k"] == 3 and cfg["num_latents"] == 10
    back = load_sae(tmp_path / "sae")
    assert back.cfg == sae.cfg and back.d_in == 6
    x = torch.randn(8, 6, dtype=torch.float64)
    torch.testing.assert_close(back(x).sae_out, sae(x).sae_out)


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="cfg.json"):
        load_sae(tmp_path)
    sae = _sae()
    save_sae(sae, tmp_path / "s")
    (tmp_path / "s" / "sae.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not a valid safetensors"):
        load_sae(tmp_path / "s")


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"k must be <= d_sae, got k=11 > d_sae=10"):
        SaeConfig(d_sae=10, k=11)
    with pytest.raises(ValueError, match="d_sae must be a positive int"):
        SaeConfig(d_sae=0)
    with pytest.raises(ValueError, match="d_in must be a positive int"):
        TopKSae(0, SaeConfig(d_sae=4, k=2))
    sae = _sae()
    with pytest.raises(ValueError, match=r"x must have shape \[batch, d_in=6\], got \[4, 5\]"):
        sae(torch.zeros(4, 5, dtype=torch.float64))
    with pytest.raises(TypeError, match="floating-point"):
        sae(torch.zeros(4, 6, dtype=torch.int64))
    bad = torch.zeros(4, 6, dtype=torch.float64)
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"x contains 1 non-finite value\(s\)"):
        sae(bad)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        sae([[0.0] * 6])
    with pytest.raises(ValueError, match="dead_mask must have shape"):
        sae(torch.zeros(4, 6, dtype=torch.float64), dead_mask=torch.zeros(3, dtype=torch.bool))
