"""Bad input to the public APIs of ``mlpinterp.apd``, ``mlpinterp.toys`` and ``mlpinterp.sae``.

Every case must raise a ``TypeError``/``ValueError`` that names the argument (never a wrong number, a silent NaN or a
bare error from deep inside torch). Cases already covered elsewhere (test_apd_core, test_apd_train, test_sae_topk,
test_sae_synthetic, test_toys) are not repeated here.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mlpinterp.apd import (
    APDConfig,
    act_recon_loss,
    activation_frequency,
    attributions,
    batch_topk_mask,
    decompose,
    lp_minimality_loss,
    lp_simplicity_loss,
    lr_at,
    per_feature_mse,
    responsible_components,
    schatten_pp,
    scrubbing,
    simplicity_loss,
    topk_mask,
    with_overrides,
)
from mlpinterp.paramspace import (
    Components,
    capture_outputs,
    faithfulness_loss,
    minimality_loss,
    mmcs_ml2r,
    resolve_sites,
    run_with_components,
)
from mlpinterp.sae import (
    SaeConfig,
    SyntheticConfig,
    SyntheticData,
    TopKSae,
    cosine_matrix,
    dead_fraction,
    feature_similarities,
    firing_counts,
    fvu,
    l0,
    load_sae,
    mmcs,
    mmcs_to_truth,
    mse,
    save_sae,
    shared_false_cluster,
)
from mlpinterp.toys import (
    TMS,
    ResidMLPConfig,
    ResidualMLP,
    TMSConfig,
    build_gated_trig,
    build_resid_mlp,
    gated_trig_inputs,
    load_toy,
    neuron_contributions,
    one_hot_inputs,
    save_toy,
    sparse_features,
    train_tms,
    trig_functions,
)

from .artifact_utils import rewrite

NAN = float("nan")


@pytest.fixture(scope="module")
def tms():
    torch.manual_seed(0)
    model = TMS(5, 2)
    comps = Components(resolve_sites(model, ["W"]), 5, m=1, generator=torch.Generator().manual_seed(0))
    return model, comps


# ============================================================================================ apd: components
@pytest.mark.parametrize("targets,match", [(None, "targets must be a sequence"),
                                           ((t for t in ["W"]), "targets must be a sequence")])
def test_resolve_sites_bad_targets(tms, targets, match):
    with pytest.raises(TypeError, match=match):
        resolve_sites(tms[0], targets)


def test_resolve_sites_bad_model():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got str"):
        resolve_sites("model", ["W"])


@pytest.mark.parametrize("kw,err,match", [
    (dict(C=True), ValueError, "C .* must be a positive int, got True"),
    (dict(m=True), ValueError, r"m \(inner rank\) for site 'W' must be a positive int or None, got True"),
    (dict(m={"X": 1}), ValueError, r"m names unknown sites \['X'\]"),  # was silently full rank
    (dict(init_scale=NAN), ValueError, "init_scale must be a finite real number, got nan"),  # was NaN factors
    (dict(sites=[]), ValueError, "sites must hold at least one Site"),
    (dict(sites=["W"]), TypeError, "sites must hold Site objects"),
])
def test_components_bad_args(tms, kw, err, match):
    args = dict(sites=resolve_sites(tms[0], ["W"]), C=5, m=1)
    args.update(kw)
    with pytest.raises(err, match=match):
        Components(**args)


def test_components_unknown_site(tms):
    with pytest.raises(ValueError, match=r"site 'nope' is not a site of these components; sites: \['W'\]"):
        tms[1].factors("nope")


@pytest.mark.parametrize("w,err,match", [
    (torch.full((5, 2, 5), NAN), ValueError, r"weights\['W'\] contains 50 non-finite"),
    (np.zeros((5, 2, 5)), TypeError, r"weights\['W'\] must be a real torch.Tensor, got ndarray"),
    (torch.zeros(0, 2, 5), ValueError, r"weights\['W'\] must have shape \[C >= 1, 2, 5\], got \[0, 2, 5\]"),
])
def test_from_weights_bad(tms, w, err, match):
    with pytest.raises(err, match=match):
        Components.from_weights(tms[1].sites, {"W": w})


# ============================================================================================ apd: masks
@pytest.mark.parametrize("fn", [topk_mask, batch_topk_mask])
@pytest.mark.parametrize("k,err,match", [(True, TypeError, "k must be a real number, got bool"),
                                         ("2", TypeError, "k must be a real number, got str"),
                                         (None, TypeError, "k must be a real number, got NoneType"),
                                         (NAN, ValueError, "k must be finite, got nan"),
                                         (math.inf, ValueError, "k must be finite, got inf")])
def test_mask_k_types(fn, k, err, match):
    with pytest.raises(err, match=match):
        fn(torch.rand(4, 5), k)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_mask_attr_dtype(dtype):
    with pytest.raises(TypeError, match=f"attributions must be a real .* got dtype {dtype}"):
        topk_mask(torch.ones(4, 5, dtype=dtype), 1)


# ============================================================================================ apd: losses
def test_schatten_bad(tms):
    A, B = tms[1].factors("W")
    with pytest.raises(ValueError, match=r"p \(Schatten exponent\) must be a finite number > 0, got inf"):
        schatten_pp(A, B, math.inf)  # was all zeros
    with pytest.raises(TypeError, match=r"p \(Schatten exponent\) must be a real number > 0, got str"):
        schatten_pp(A, B, "1")
    with pytest.raises(ValueError, match="A contains 10 non-finite"):
        schatten_pp(A.detach() * NAN, B.detach(), 1.0)  # was silently 0
    with pytest.raises(TypeError, match="A must be a floating-point torch.Tensor, got torch.int64"):
        schatten_pp(torch.ones(2, 3, 1, dtype=torch.int64), torch.ones(2, 1, 4), 1.0)


@pytest.mark.parametrize("out,err,match", [
    (torch.full((3, 2), NAN), ValueError, "out contains 6 non-finite"),
    (np.zeros((3, 2)), TypeError, "out must be a torch.Tensor"),
    (torch.zeros(3, 2, dtype=torch.int64), TypeError, "out must be a floating-point tensor"),
    (torch.zeros(0, 2), ValueError, "out must be non-empty"),
])
def test_minimality_bad(out, err, match):
    with pytest.raises(err, match=match):
        minimality_loss(out, torch.zeros(3, 2) if isinstance(out, torch.Tensor) and out.numel() else out)


@pytest.mark.parametrize("target,err,match", [
    ({}, ValueError, "target lacks site 'W'"),
    ({"W": torch.zeros(2, 1)}, ValueError, r"target\['W'\] must have shape \[2, 5\], got \[2, 1\]"),  # broadcast
    ({"W": torch.full((2, 5), NAN)}, ValueError, r"target\['W'\] contains 10 non-finite"),
    ([torch.zeros(2, 5)], TypeError, "target must be a mapping"),
])
def test_faithfulness_bad(tms, target, err, match):
    with pytest.raises(err, match=match):
        faithfulness_loss(tms[1], target)


@pytest.mark.parametrize("mask,match", [(torch.ones(4, 1), r"mask must have shape \[batch >= 1, C=5\], got \[4, 1\]"),
                                        (torch.ones(5), r"got \[5\]"),
                                        (torch.ones(0, 5), r"got \[0, 5\]"),
                                        (torch.full((4, 5), NAN), "mask contains NaN")])
def test_simplicity_bad_mask(tms, mask, match):
    with pytest.raises(ValueError, match=match):
        simplicity_loss(tms[1], mask, 1.0)


def test_act_recon_shape_mismatch_is_not_broadcast():
    with pytest.raises(ValueError, match=r"acts\['a'\] and target_acts\['a'\] must have the same shape"):
        act_recon_loss({"a": torch.zeros(3, 2)}, {"a": torch.zeros(3, 1)})
    with pytest.raises(TypeError, match="acts and target_acts must be mappings"):
        act_recon_loss([1], [1])


def test_lp_losses_bad(tms):
    with pytest.raises(ValueError, match="attr must be >= 0"):
        lp_minimality_loss(-torch.ones(3, 5), 1.0)  # was NaN
    with pytest.raises(ValueError, match="p1 must be a finite number > 0, got 0.0"):
        lp_minimality_loss(torch.ones(3, 5), 0.0)
    with pytest.raises(ValueError, match=r"attr must have shape \[batch, C\], got \[5\]"):
        lp_minimality_loss(torch.ones(5), 1.0)
    with pytest.raises(ValueError, match=r"attr must have shape \[batch, C=5\], got \[3, 1\]"):
        lp_simplicity_loss(tms[1], torch.ones(3, 1), 1.0, 1.0)


# ============================================================================================ apd: metrics
@pytest.mark.parametrize("W,P", [(np.ones((2, 3)), np.ones((0, 2, 3))), (np.ones((2, 0)), np.ones((3, 2, 0)))])
def test_mmcs_ml2r_empty(W, P):
    with pytest.raises(ValueError, match="must be non-empty"):
        mmcs_ml2r(W, P)


def test_activation_frequency_bad(tms):
    model, comps = tms
    k1 = lambda a: topk_mask(a, 1)  # noqa: E731
    with pytest.raises(ValueError, match="batches is empty"):
        activation_frequency(model, comps, [], k1)  # was zeros
    with pytest.raises(TypeError, match="got a single tensor; wrap it in a list"):
        activation_frequency(model, comps, torch.rand(4, 5), k1)
    with pytest.raises(ValueError, match=r"batches\[0\] of shape \[4, 6\] .* does not fit the model"):
        activation_frequency(model, comps, [torch.rand(4, 6)], k1)
    with pytest.raises(ValueError, match=r"batches\[0\] must have shape \[batch >= 1, ...\]"):
        activation_frequency(model, comps, [torch.rand(5)], k1)
    with pytest.raises(ValueError, match=r"mask_fn must return a \[batch=4, C=5\] mask, got \[4, 3\]"):
        activation_frequency(model, comps, [torch.rand(4, 5)], lambda a: torch.ones(4, 3, dtype=torch.bool))


@pytest.mark.parametrize("kw,err,match", [
    (dict(n_features=6), ValueError, "n_features=6 .* does not fit the model"),
    (dict(n_features=5.0), TypeError, "n_features must be a positive int, got float"),
    (dict(n_per_feature=0), ValueError, "n_per_feature must be a positive int"),  # was NaN
    (dict(value_range=(1.0, -1.0)), ValueError, "value_range must be finite with low < high"),
])
def test_per_feature_mse_bad(tms, kw, err, match):
    args = dict(n_features=5, n_per_feature=4)
    args.update(kw)
    with pytest.raises(err, match=match):
        per_feature_mse(*tms, **args)


def test_responsible_components_bad(tms):
    with pytest.raises(ValueError, match="value must be a finite non-zero real number, got nan"):
        responsible_components(*tms, 5, value=NAN)  # was all 0
    with pytest.raises(ValueError, match="n_features must be a positive int"):
        responsible_components(*tms, 0)


@pytest.mark.parametrize("x,resp,err,match", [
    (torch.rand(4, 5), np.arange(3), ValueError, r"responsible must be an integer array \[n_features=5\]"),
    (torch.rand(4, 5), np.array([0, 1, 2, 3, 99]), ValueError, r"component indices in \[0, C=5\)"),
    (torch.rand(4, 5), np.array([0, 1, 2, 3, -1]), ValueError, r"component indices in \[0, C=5\)"),  # was used
    (torch.rand(0, 5), np.arange(5), ValueError, r"x must have shape \[batch >= 1"),  # was NaN
    (np.random.rand(4, 5), np.arange(5), TypeError, "x must be a torch.Tensor"),
    (torch.rand(4, 6), np.arange(5), ValueError, r"x of shape \[4, 6\] .* does not fit the model"),
])
def test_scrubbing_bad(tms, x, resp, err, match):
    with pytest.raises(err, match=match):
        scrubbing(*tms, x, resp, lambda a: topk_mask(a, 1))


# ============================================================================================ apd: train
def _sample(step):
    return sparse_features(8, 5, 0.2, generator=torch.Generator().manual_seed(step))


@pytest.mark.parametrize("kw,err,match", [
    (dict(C=True), TypeError, "C must be an int, got bool"),
    (dict(steps=2.0), TypeError, "steps must be an int, got float"),
    (dict(batch_size=8.0), TypeError, "batch_size must be an int, got float"),
    (dict(lr="1"), TypeError, "lr must be a real number, got str"),
    (dict(lr=-1.0), ValueError, "lr must be > 0"),
    (dict(faithfulness_coeff=NAN), ValueError, "faithfulness_coeff must be finite"),
    (dict(minimality_coeff=-1.0), ValueError, "minimality_coeff must be >= 0"),
    (dict(schatten_p=math.inf), ValueError, "schatten_p must be finite"),
    (dict(log_every=0), ValueError, r"log_every must be positive \(an int >= 1\), got 0"),  # was ZeroDivisionError
    (dict(checkpoint_every=0), ValueError, "checkpoint_every must be positive"),
    (dict(chunk_size=0), ValueError, "chunk_size must be positive"),
    (dict(chunk_size=2.5), TypeError, "chunk_size must be an int"),
    (dict(seed=1.5), TypeError, "seed must be an int, got float"),
    (dict(m=True), TypeError, "m must be an int, got bool"),
    (dict(init_scale=NAN), ValueError, "init_scale must be finite"),
    (dict(act_recon_coeff=NAN), ValueError, "act_recon_coeff must be finite"),
    (dict(batch_topk="no"), TypeError, "batch_topk must be a bool, got str"),
    (dict(topk=True), TypeError, "topk must be a real number, got bool"),
    (dict(act_names="layers.0.act"), TypeError, "act_names must be a tuple"),
])
def test_apd_config_types(tms, kw, err, match):
    cfg = with_overrides(APDConfig(C=5, steps=1, batch_size=8, topk=1.0), **kw)
    with pytest.raises(err, match=match):
        decompose(tms[0], _sample, cfg, quiet=True)


@pytest.mark.parametrize("sample,err,match", [
    (lambda s: torch.full((8, 5), NAN), ValueError, r"sample\(0\) contains 40 non-finite"),
    (lambda s: torch.rand(8, 6), ValueError, r"sample\(0\) of shape \[8, 6\].*does not fit the model"),
    (lambda s: torch.rand(8, 5, dtype=torch.float64), ValueError, "dtype torch.float64 does not fit the model"),
    (lambda s: np.random.rand(8, 5), TypeError, r"sample\(0\) must be a torch.Tensor"),
    (torch.rand(8, 5), TypeError, "sample must be a callable"),
])
def test_decompose_bad_sample(tms, sample, err, match):
    with pytest.raises(err, match=match):
        decompose(tms[0], sample, APDConfig(C=5, steps=1, batch_size=8, topk=1.0), quiet=True)


def test_decompose_and_helpers_bad_types(tms):
    with pytest.raises(TypeError, match="cfg must be an APDConfig, got dict"):
        decompose(tms[0], _sample, {"C": 5}, quiet=True)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        decompose(lambda x: x, _sample, APDConfig(steps=1), quiet=True)
    with pytest.raises(TypeError, match="cfg must be an APDConfig"):
        with_overrides({"C": 5}, C=3)
    with pytest.raises(ValueError, match="step must be a non-negative int, got -5"):
        lr_at(-5, APDConfig())


# ============================================================================================ toys
@pytest.mark.parametrize("fn,err,match", [
    (lambda: TMS(5.5, 2), TypeError, "n_features must be an int, got float"),
    (lambda: TMS(True, 2), TypeError, "n_features must be an int, got bool"),
    (lambda: TMSConfig(steps=1.5), TypeError, "steps must be an int, got float"),
    (lambda: TMSConfig(lr=NAN), ValueError, "lr must be finite and > 0, got nan"),
    (lambda: TMSConfig(n_instances=True), TypeError, "n_instances must be an int, got bool"),
    (lambda: train_tms({"steps": 1}), TypeError, "cfg must be a TMSConfig"),
    (lambda: ResidMLPConfig(d_mlp=0), ValueError, "d_mlp must be >= 1, got 0"),  # was a 0-neuron model
    (lambda: ResidMLPConfig(seed=1.5), TypeError, "seed must be an int, got float"),  # was silently truncated
    (lambda: ResidMLPConfig(feature_probability=2.0), ValueError, r"feature_probability must be finite in \(0, 1\]"),
    (lambda: ResidualMLP(2, 3, 2, 1, torch.full((2, 3), NAN)), ValueError, "W_E contains 6 non-finite"),
    (lambda: ResidualMLP(2, 3, 2, 1, np.ones((2, 3))), TypeError, "W_E must be a floating-point torch.Tensor"),
    (lambda: build_gated_trig(n_functions=2.0), TypeError, "n_functions must be an int, got float"),
    (lambda: build_gated_trig(seed=-1), ValueError, "seed must be >= 0, got -1"),
    (lambda: gated_trig_inputs(4, 2, p=2.0), ValueError, r"p must be finite in \[0, 1\], got 2.0"),
    (lambda: gated_trig_inputs(-1, 2), ValueError, "n must be >= 1, got -1"),
    (lambda: trig_functions(np.ones(3), np.ones((2, 5))), ValueError, r"coeffs must have shape \[n_functions, 7\]"),
    (lambda: trig_functions(np.array([NAN]), np.ones((2, 7))), ValueError, "x and coeffs must be finite"),
    (lambda: sparse_features(2.5, 3, 0.5), TypeError, "n must be an int, got float"),
    (lambda: sparse_features(2, 3, 1.0, (0.0, math.inf)), ValueError, r"value_range\[1\] must be finite"),
    (lambda: sparse_features(2, 3, 1.0, (0.0, 1.0, 2.0)), ValueError, r"value_range must be a \(low, high\) pair"),
    (lambda: sparse_features(2, 3, 1.0, dtype=torch.int64), TypeError, "dtype must be a floating-point"),
    (lambda: one_hot_inputs(0), ValueError, "n_features must be >= 1, got 0"),
    (lambda: one_hot_inputs(2, NAN), ValueError, "value must be finite, got nan"),
])
def test_toy_builders_bad_args(fn, err, match):
    with pytest.raises(err, match=match):
        fn()


def test_toy_forward_width():
    with pytest.raises(ValueError, match=r"x must have shape \[..., n_features=5\], got \[3, 4\]"):
        TMS(5, 2)(torch.rand(3, 4))
    m = build_resid_mlp(ResidMLPConfig(n_features=4, d_embed=8, d_mlp=3))
    with pytest.raises(ValueError, match=r"x must have shape \[..., n_features=4\], got \[2, 5\]"):
        m(torch.rand(2, 5))
    g, _ = build_gated_trig(2, 4, 2)
    with pytest.raises(ValueError, match=r"inp must have shape \[..., 1 \+ n_functions=3\], got \[2, 4\]"):
        g(torch.rand(2, 4))
    with pytest.raises(ValueError, match=r"weights names unknown layers \['layers.9.mlp_in'\]"):
        neuron_contributions(m, {"layers.9.mlp_in": torch.zeros(3, 8)})  # was silently ignored
    with pytest.raises(ValueError, match=r"weights\['layers.0.mlp_in'\] must be a tensor of shape \[3, 8\]"):
        neuron_contributions(m, {"layers.0.mlp_in": torch.zeros(3, 7)})


def _saved_toy(tmp_path, model, **meta):
    save_toy(model, tmp_path / "t")
    rewrite(tmp_path / "t.safetensors", lambda m: {**m, **meta})  # written so (a valid hash): the content checks
    return tmp_path / "t"


@pytest.mark.parametrize("meta,match", [
    (dict(arch=[5, 2]), r"'arch' .* must be an object with keys \['d_hidden', 'n_features'\]"),
    (dict(arch={"n_features": 5, "d_hidden": 2, "foo": 1}), "must be an object with keys"),
    (dict(arch={"n_features": 5}), "must be an object with keys"),
    (dict(arch={"n_features": 5.0, "d_hidden": 2}), "must hold positive ints"),
    (dict(arch={"n_features": "5", "d_hidden": 2}), "must hold positive ints"),
])
def test_load_toy_bad_arch(tmp_path, meta, match):
    with pytest.raises(ValueError, match=match):
        load_toy(_saved_toy(tmp_path, TMS(5, 2), **meta))


def test_load_toy_bad_json_and_tensors(tmp_path):
    path = _saved_toy(tmp_path, TMS(5, 2))
    (tmp_path / "t.json").write_text("[1]")
    with pytest.raises(ValueError, match=r"t.safetensors. does not match its recorded SHA-256"):  # edited
        load_toy(path)
    rewrite(path, [1])  # written so
    with pytest.raises(ValueError, match=r"metadata of .* must be a JSON object, got list"):
        load_toy(path)
    m = TMS(5, 2)
    with torch.no_grad():
        m.W[0, 0] = NAN
    with pytest.raises(ValueError, match=r"tensors \['W'\] .* must be finite floating-point"):
        load_toy(_saved_toy(tmp_path, m))
    with pytest.raises(TypeError, match="info must be a dict or None, got list"):
        save_toy(TMS(5, 2), tmp_path / "x", info=[1])
    (tmp_path / "t.json").unlink()  # the metadata lost: said so, not "must contain 'kind' and 'arch', got keys []"
    with pytest.raises(ValueError, match=r"t.safetensors' has no metadata file 't.json' beside it"):
        load_toy(path)


# ============================================================================================ sae: config and model
@pytest.mark.parametrize("kw,err,match", [
    (dict(k_aux=True), ValueError, "k_aux must be a positive int or None, got True"),
    (dict(tied="yes"), TypeError, "tied must be a bool, got str"),
    (dict(pre_bias=1), TypeError, "pre_bias must be a bool, got int"),
    (dict(normalize_decoder=None), TypeError, "normalize_decoder must be a bool"),
])
def test_sae_config_types(kw, err, match):
    with pytest.raises(err, match=match):
        SaeConfig(d_sae=8, k=2, **kw)


def test_topk_sae_constructor_types():
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype, got torch.int64"):
        TopKSae(6, SaeConfig(d_sae=8, k=2), dtype=torch.int64)
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got int"):
        TopKSae(6, SaeConfig(d_sae=8, k=2), generator=0)


@pytest.fixture
def sae():
    return TopKSae(6, SaeConfig(d_sae=8, k=2), generator=torch.Generator().manual_seed(0))


def test_sae_forward_bad(sae):
    with pytest.raises(ValueError, match="x must have at least one row"):
        sae(torch.zeros(0, 6))  # was fvu 0
    for mask in (torch.ones(8, dtype=torch.int64), torch.ones(8), [True] * 8, np.ones(8, bool)):
        with pytest.raises(TypeError, match=r"dead_mask must be a bool torch.Tensor \[d_sae=8\]"):
            sae(torch.randn(4, 6), dead_mask=mask)


@pytest.mark.parametrize("acts,idx,err,match", [
    (torch.ones(4, 2), torch.full((4, 2), 99), ValueError, r"top_indices must lie in \[0, d_sae=8\)"),
    (torch.ones(4, 2), torch.full((4, 2), -1), ValueError, r"top_indices must lie in \[0, d_sae=8\)"),
    (torch.ones(4, 3), torch.zeros(4, 2, dtype=torch.long), ValueError, "must have the same shape"),
    (torch.ones(4, 2), torch.zeros(4, 2), TypeError, "top_indices must be an int64/int32"),
    (torch.full((4, 2), NAN), torch.zeros(4, 2, dtype=torch.long), ValueError, "top_acts contains 8 non-finite"),
])
def test_sae_decode_bad(sae, acts, idx, err, match):
    with pytest.raises(err, match=match):
        sae.decode(acts, idx)


def test_sae_save_bad_extra_cfg(sae, tmp_path):
    with pytest.raises(TypeError, match="extra_cfg must be a dict or None, got list"):
        save_sae(sae, tmp_path / "a", extra_cfg=[1])
    with pytest.raises(ValueError, match=r"extra_cfg must not override .* got \['d_in'\]"):
        save_sae(sae, tmp_path / "b", extra_cfg={"d_in": 7})  # wrote an unloadable artefact before


_DEL = object()


@pytest.mark.parametrize("layout", ["sparsify", "saelens"])
@pytest.mark.parametrize("edit,err,match", [
    (dict(d_in="6"), ValueError, "'d_in' must be an int, got str"),
    (dict(d_in=6.5), ValueError, "'d_in' must be an int, got float"),  # was silently truncated to 6
    (dict(d_in=None), ValueError, "'d_in' must be an int, got NoneType"),
    (dict(tied="false"), TypeError, "tied must be a bool, got str"),  # was truthy 'false'
    (dict(k=_DEL, activation_fn_kwargs=_DEL), ValueError, "gives no top-k 'k'"),  # was silently k=32
    (dict(k=_DEL, activation_fn_kwargs={"k": "x"}), ValueError, "'activation_fn_kwargs.k' must be an int"),
    (dict(k=2.5), ValueError, "cfg.json in .*: k must be a positive int"),
])
def test_sae_load_bad_cfg(sae, tmp_path, layout, edit, err, match):
    save_sae(sae, tmp_path, layout=layout)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    for key, v in edit.items():
        if v is _DEL:
            cfg.pop(key, None)
        else:
            cfg[key] = v
    weights = tmp_path / ("sae.safetensors" if layout == "sparsify" else "sae_weights.safetensors")
    rewrite(weights, cfg, meta_path=tmp_path / "cfg.json")  # written so (a valid hash): the content checks
    with pytest.raises(err, match=match):
        load_sae(tmp_path)


def test_sae_load_cfg_not_object_and_path_is_file(sae, tmp_path):
    save_sae(sae, tmp_path)
    with pytest.raises(ValueError, match="path must be the SAE's directory"):
        load_sae(tmp_path / "cfg.json")
    (tmp_path / "cfg.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="does not match its recorded SHA-256"):  # edited
        load_sae(tmp_path)
    rewrite(tmp_path / "sae.safetensors", [1, 2], meta_path=tmp_path / "cfg.json")  # written so
    with pytest.raises(ValueError, match="must hold a JSON object, got list"):
        load_sae(tmp_path)


@pytest.mark.parametrize("layout,key,value,match", [
    ("sparsify", "b_dec", torch.zeros(5), r"b_dec in .* must have shape \[6\], got \[5\]"),
    ("sparsify", "encoder.bias", torch.zeros(3), r"encoder bias in .* must have shape \[8\], got \[3\]"),
    ("saelens", "W_enc", torch.zeros(48), r"encoder weight in .* must be 2-D"),
    ("sparsify", "encoder.weight", torch.zeros(8, 6, dtype=torch.int32), "must be a floating-point tensor"),
    ("sparsify", "W_dec", torch.full((8, 6), NAN), "W_dec in .* contains 48 non-finite"),  # loaded before
])
def test_sae_load_bad_tensors(sae, tmp_path, layout, key, value, match):
    save_sae(sae, tmp_path, layout=layout)
    f = tmp_path / ("sae.safetensors" if layout == "sparsify" else "sae_weights.safetensors")
    rewrite(f, tensors=lambda t: {**t, key: value}, meta_path=tmp_path / "cfg.json")  # written so (a valid hash)
    with pytest.raises(ValueError, match=match):
        load_sae(tmp_path)


# ============================================================================================ sae: metrics
@pytest.mark.parametrize("x,x_hat,err,match", [
    (torch.ones(4, 3), torch.zeros(4, 3), ValueError, "zero variance about its mean"),  # was inf
    (torch.randn(1, 3), torch.zeros(1, 3), ValueError, "zero variance about its mean"),  # was inf
    (torch.randn(0, 3), torch.zeros(0, 3), ValueError, "must be non-empty"),  # was NaN
    (torch.full((4, 3), NAN), torch.zeros(4, 3), ValueError, "x contains 12 non-finite"),  # was NaN
    (np.ones((4, 3)), np.zeros((4, 3)), TypeError, "x must be a torch.Tensor"),
    (torch.ones(4, 3, dtype=torch.int64), torch.zeros(4, 3, dtype=torch.int64), TypeError, "floating-point"),
])
def test_fvu_bad(x, x_hat, err, match):
    with pytest.raises(err, match=match):
        fvu(x, x_hat)


def test_mse_l0_dead_fraction_bad():
    with pytest.raises(ValueError, match="must be non-empty"):
        mse(torch.randn(0, 3), torch.zeros(0, 3))
    with pytest.raises(ValueError, match="x_hat contains 12 non-finite"):
        mse(torch.zeros(4, 3), torch.full((4, 3), NAN))
    with pytest.raises(ValueError, match=r"latent_acts must have shape \[batch >= 1, k\]"):
        l0(torch.zeros(0, 3))
    with pytest.raises(TypeError, match="latent_acts must be a torch.Tensor"):
        l0(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"counts must have shape \[d_sae >= 1\], got \[0\]"):
        dead_fraction(torch.zeros(0))
    with pytest.raises(ValueError, match=r"counts must have shape \[d_sae >= 1\], got \[2, 3\]"):
        dead_fraction(torch.zeros(2, 3))


@pytest.mark.parametrize("acts,idx,d_sae,err,match", [
    (torch.ones(2, 2), torch.tensor([[0, 9], [1, 2]]), 4, ValueError, r"latent_indices must lie in \[0, d_sae=4\)"),
    (torch.ones(2, 2), torch.tensor([[0, -1], [1, 2]]), 4, ValueError, r"latent_indices must lie in \[0, d_sae=4\)"),
    (torch.ones(2, 3), torch.tensor([[0, 1], [1, 2]]), 4, ValueError, "must have the same shape"),
    (torch.ones(2, 2), torch.tensor([[0, 1], [1, 2]]), 0, ValueError, "d_sae must be a positive int, got 0"),
    (torch.ones(2, 2), torch.tensor([[0.0, 1], [1, 2]]), 4, TypeError, "latent_indices must be an int64/int32"),
])
def test_firing_counts_bad(acts, idx, d_sae, err, match):
    with pytest.raises(err, match=match):
        firing_counts(acts, idx, d_sae)


def test_mmcs_and_cosine_bad():
    with pytest.raises(ValueError, match="a contains 12 non-finite"):
        mmcs(torch.full((3, 4), NAN), torch.randn(3, 4), matching="max")  # was NaN
    with pytest.raises(ValueError, match="a contains 12 non-finite"):
        mmcs(torch.full((3, 4), math.inf), torch.randn(3, 4))
    with pytest.raises(TypeError, match="a and b must have the same dtype, got torch.float32 and torch.float64"):
        cosine_matrix(torch.randn(3, 4), torch.randn(3, 4, dtype=torch.float64))


# ============================================================================================ sae: synthetic
@pytest.mark.parametrize("kw,err,match", [
    (dict(decay="0.5"), TypeError, "decay must be a real number in"),
    (dict(decay=True), TypeError, "decay must be a real number in"),
    (dict(seed=1.5), TypeError, "seed must be an int, got float"),  # was silently truncated
    (dict(seed=True), TypeError, "seed must be an int, got bool"),
])
def test_synthetic_config_types(kw, err, match):
    with pytest.raises(err, match=match):
        SyntheticConfig(n_features=24, d=8, n_groups=3, k_active=2, **kw)


def test_synthetic_data_bad_args():
    sd = SyntheticData(SyntheticConfig(n_features=24, d=8, n_groups=3, k_active=2))
    for g in (99, -1, 1.5):  # -1 used to return the last group's probabilities
        with pytest.raises(ValueError, match=r"group must be an int in \[0, n_groups=3\)"):
            sd.within_group_probs(g)
    with pytest.raises(ValueError, match="n_batches must be a non-negative int or None, got -1"):
        list(sd.stream(2, n_batches=-1))  # was []
    with pytest.raises(ValueError, match="n_batches must be a non-negative int or None, got 1.5"):
        list(sd.stream(2, n_batches=1.5))
    with pytest.raises(ValueError, match="start must be a non-negative int"):
        next(sd.stream(2, start=-1))


# ============================================================================================ sae: analysis
def test_analysis_bad_inputs():
    f = torch.randn(5, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match="w_dec must be a torch.Tensor"):
        mmcs_to_truth(np.ones((3, 4)), f)
    with pytest.raises(ValueError, match="w_dec contains 12 non-finite"):
        mmcs_to_truth(torch.full((3, 4), NAN), f)
    with pytest.raises(ValueError, match=r"decoders must all have the same shape \[d_sae, d\]"):
        feature_similarities([torch.randn(3, 4), torch.randn(5, 4)], f)
    with pytest.raises(ValueError, match=r"features must have width d=4 like the decoders, got \[5, 3\]"):
        feature_similarities([torch.randn(3, 4), torch.randn(3, 4)], torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"decoders\[0\] contains 12 non-finite"):
        feature_similarities([torch.full((3, 4), NAN), torch.randn(3, 4)], f)  # was NaN similarities
    with pytest.raises(TypeError, match="decoders must be a list of"):
        feature_similarities(None, f)
    decs = [torch.randn(3, 4), torch.randn(3, 4)]
    with pytest.raises(ValueError, match=r"firing_rates must be finite fractions in \[0, 1\]"):
        shared_false_cluster(decs, torch.randn(5, 4), np.full((2, 3), NAN))
    with pytest.raises(ValueError, match=r"firing_rates must be finite fractions in \[0, 1\]"):
        shared_false_cluster(decs, torch.randn(5, 4), -np.ones((2, 3)))
    with pytest.raises(ValueError, match="shared_min must be a finite real number"):
        shared_false_cluster(decs, torch.randn(5, 4), np.ones((2, 3)), shared_min=NAN)


# ============================================================================================ apd: attributions, forward
@pytest.mark.parametrize("x,kw,err,match", [
    (np.zeros((4, 5), dtype=np.float32), {}, TypeError, "x must be a torch.Tensor"),
    (torch.zeros(4, 5, dtype=torch.int64), {}, TypeError, "x must be a floating-point"),
    (torch.zeros(5), {}, ValueError, r"x must have shape \[batch >= 1"),
    (torch.full((4, 5), NAN), {}, ValueError, "x contains 20 non-finite"),
    (torch.zeros(4, 5), {"chunk_size": 0}, ValueError, "chunk_size must be a positive int"),
    (torch.zeros(4, 5), {"chunk_size": True}, ValueError, "chunk_size must be a positive int"),
])
def test_attributions_bad_x(tms, x, kw, err, match):
    model, comps = tms
    with pytest.raises(err, match=match):
        attributions(model, comps, x, **kw)


def test_run_with_components_bad_coef_and_capture_names(tms):
    model, comps = tms
    x = torch.zeros(3, 5)
    with pytest.raises(TypeError, match="coef must be a real torch.Tensor"):
        run_with_components(model, comps, x, np.ones(5))
    with pytest.raises(ValueError, match="coef contains NaN or inf"):
        run_with_components(model, comps, x, torch.full((3, 5), NAN))
    with pytest.raises(TypeError, match="names must be a sequence of module names"):
        with capture_outputs(model, "W"):
            pass
