"""Interop with the real sparsify and SAELens packages: our files in their loaders, their files in ours.

Each direction compares reconstructions of the same inputs (float64, to 1e-10). The packages come with the
``interop`` extra (``pip install -e '.[interop]'``, which ``make test`` and CI use); without them these tests
skip, and ``test_sae_io.py`` still checks the same fields against hand computations.

Matrix (our file -> their loader, their file -> our loader):

=================================  ==========================================  ============================
case                               sparsify                                    SAELens
=================================  ==========================================  ============================
ours, untied / tied                ``SparseCoder.load_from_disk``              ``SAE.load_from_disk``
ours, input_scale != 1 (folded)    same outputs in raw units                   same outputs in raw units
ours, pre_bias=False               refused at save (sparsify cannot hold it)   ``apply_b_dec_to_input``
theirs, default                    ``save_to_disk`` -> ``TopKSae.load``        ``save_model`` -> ``TopKSae.load``
theirs, computation-changing       skip_connection / transcode refused         apply_b_dec_to_input=False,
                                                                               rescale_acts_by_decoder_norm,
                                                                               hook_name honoured;
                                                                               normalize_activations refused
=================================  ==========================================  ============================
"""

from __future__ import annotations

import json

import pytest
import torch

from mlpinterp.sae.io import load_sae, save_sae
from mlpinterp.sae.topk import SaeConfig, TopKSae

D_IN, D_SAE, K = 12, 40, 5


def _x(n=64, seed=7):
    return torch.randn(n, D_IN, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _ours(tied=False, pre_bias=True, input_scale=1.0, seed=0) -> TopKSae:
    sae = TopKSae(D_IN, SaeConfig(d_sae=D_SAE, k=K, tied=tied, pre_bias=pre_bias), dtype=torch.float64,
                  generator=torch.Generator().manual_seed(seed), hook_point="encoder.layer.3.output",
                  model_name="sentence-transformers/all-MiniLM-L6-v2", input_scale=input_scale)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # biases that matter: some selected pre-activations negative, b_dec far from 0
        sae.encoder.bias.normal_(-0.2, 0.3, generator=g)
        sae.b_dec.normal_(0.0, 1.0, generator=g)
    return sae


@pytest.fixture(scope="module")
def sparsify():
    return pytest.importorskip("sparsify")


@pytest.fixture(scope="module")
def sae_lens():
    return pytest.importorskip("sae_lens")


# ----------------------------------------------------------------------------- our files -> their loaders
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("input_scale", [1.0, 0.37])
def test_our_sparsify_file_in_sparsify(tmp_path, sparsify, tied, input_scale):
    sae = _ours(tied=tied, input_scale=input_scale)
    save_sae(sae, tmp_path / "s")
    theirs = sparsify.SparseCoder.load_from_disk(tmp_path / "s")
    x = _x()
    torch.testing.assert_close(theirs(x).sae_out, sae(x).sae_out, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("pre_bias", [True, False])
@pytest.mark.parametrize("input_scale", [1.0, 2.5])
def test_our_saelens_file_in_saelens(tmp_path, sae_lens, tied, pre_bias, input_scale):
    sae = _ours(tied=tied, pre_bias=pre_bias, input_scale=input_scale)
    save_sae(sae, tmp_path / "l", layout="saelens")
    theirs = sae_lens.SAE.load_from_disk(tmp_path / "l")
    assert theirs.cfg.apply_b_dec_to_input is pre_bias
    assert theirs.cfg.metadata.hook_name == "encoder.layer.3.output"
    x = _x()
    torch.testing.assert_close(theirs(x), sae(x).sae_out, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- their files -> our loader
def test_sparsify_file_in_ours(tmp_path, sparsify):
    theirs = sparsify.SparseCoder(D_IN, sparsify.SparseCoderConfig(num_latents=D_SAE, k=K), dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        theirs.encoder.bias.normal_(-0.2, 0.3, generator=g)
        theirs.b_dec.normal_(0.0, 1.0, generator=g)
    theirs.save_to_disk(tmp_path / "s")
    ours = load_sae(tmp_path / "s")
    assert ours.cfg.pre_bias and ours.hook_point is None and ours.input_scale == 1.0
    x = _x()
    torch.testing.assert_close(ours(x).sae_out, theirs(x).sae_out, rtol=1e-10, atol=1e-10)
    # ... and back: our re-save loads in sparsify with the same outputs
    save_sae(ours, tmp_path / "again")
    torch.testing.assert_close(sparsify.SparseCoder.load_from_disk(tmp_path / "again")(x).sae_out,
                               theirs(x).sae_out, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cfg_kw,match", [
    (dict(skip_connection=True), "skip_connection=True is not supported"),
    (dict(transcode=True), "transcode=True is not supported"),
])
def test_sparsify_files_we_cannot_compute_are_refused(tmp_path, sparsify, cfg_kw, match):
    theirs = sparsify.SparseCoder(D_IN, sparsify.SparseCoderConfig(num_latents=D_SAE, k=K, **cfg_kw))
    theirs.save_to_disk(tmp_path / "s")
    with pytest.raises(ValueError, match=match):
        load_sae(tmp_path / "s")


def _saelens_topk(sae_lens, **kw):
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

    cfg = TopKSAEConfig(d_in=D_IN, d_sae=D_SAE, k=K, dtype="float64", device="cpu",
                        metadata=SAEMetadata(hook_name="transformer.h.0.mlp", model_name="gpt2"), **kw)
    sae = TopKSAE(cfg)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in (sae.W_enc, sae.W_dec):
            p.normal_(0.0, 0.4, generator=g)
        sae.b_enc.normal_(-0.2, 0.3, generator=g)
        sae.b_dec.normal_(0.0, 1.0, generator=g)
    return sae


@pytest.mark.parametrize("apply_b_dec", [True, False])
@pytest.mark.parametrize("rescale", [False, True])
def test_saelens_file_in_ours(tmp_path, sae_lens, apply_b_dec, rescale):
    """Regression: ``apply_b_dec_to_input: false`` was ignored (outputs off by up to 3.5, silently)."""
    theirs = _saelens_topk(sae_lens, apply_b_dec_to_input=apply_b_dec, rescale_acts_by_decoder_norm=rescale)
    theirs.save_model(tmp_path / "l")
    ours = load_sae(tmp_path / "l")
    assert ours.cfg.pre_bias is apply_b_dec
    assert ours.hook_point == "transformer.h.0.mlp" and ours.model_name == "gpt2"
    x = _x()
    with torch.no_grad():
        want = theirs(x)
    torch.testing.assert_close(ours(x).sae_out, want, rtol=1e-10, atol=1e-10)
    save_sae(ours, tmp_path / "again", layout="saelens")  # and back into SAELens
    with torch.no_grad():
        back = sae_lens.SAE.load_from_disk(tmp_path / "again")(x)
    torch.testing.assert_close(back, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("value", ["expected_average_only_in", "layer_norm", "constant_norm_rescale"])
def test_saelens_normalisation_is_refused_by_name(tmp_path, sae_lens, value):
    theirs = _saelens_topk(sae_lens, normalize_activations=value)
    theirs.save_model(tmp_path / "l")
    assert json.loads((tmp_path / "l" / "cfg.json").read_text())["normalize_activations"] == value
    with pytest.raises(ValueError, match=f"normalize_activations='{value}' is not supported"):
        load_sae(tmp_path / "l")


def test_saelens_non_topk_architecture_is_refused(tmp_path, sae_lens):
    from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig

    StandardSAE(StandardSAEConfig(d_in=D_IN, d_sae=D_SAE)).save_model(tmp_path / "std")
    with pytest.raises(ValueError, match="architecture='standard' is not supported"):
        load_sae(tmp_path / "std")
