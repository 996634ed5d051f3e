"""Integrity of saved SAEs: provenance, content hash, faithful SAELens/sparsify fields,
input normalisation in original units, bf16 autocast. Expected values come from hand computations."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mlpinterp.sae.io import check_provenance, load_sae, save_sae
from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
from mlpinterp.sae.topk import SaeConfig, TopKSae
from mlpinterp.utils.artifact import artifact_sha256

from .artifact_utils import rewrite


def _sae(d_in=6, d_sae=10, k=3, seed=0, **kw) -> TopKSae:
    sae = TopKSae(d_in, SaeConfig(d_sae=d_sae, k=k, **{k_: v for k_, v in kw.items() if k_ in ("tied", "pre_bias")}),
                  generator=torch.Generator().manual_seed(seed), dtype=torch.float64,
                  **{k_: v for k_, v in kw.items() if k_ not in ("tied", "pre_bias")})
    with torch.no_grad():
        sae.encoder.bias.normal_(-0.2, 0.3, generator=torch.Generator().manual_seed(seed + 1))
        sae.b_dec.normal_(0, 1.0, generator=torch.Generator().manual_seed(seed + 2))
    return sae


def _x(n=32, d=6, seed=3, scale=1.0):
    return scale * torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- provenance and hash
@pytest.mark.parametrize("layout", ["sparsify", "saelens"])
def test_cfg_json_records_provenance_dtype_scale_and_hash(tmp_path, layout):
    sae = _sae(hook_point="encoder.layer.3.output", model_name="sentence-transformers/all-MiniLM-L6-v2",
               input_scale=0.5)
    save_sae(sae, tmp_path / "s", layout=layout)
    cfg = json.loads((tmp_path / "s" / "cfg.json").read_text())
    assert cfg["hook_point"] == "encoder.layer.3.output"
    assert cfg["model_name"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert cfg["d_in"] == 6 and cfg["dtype"] == "float64" and cfg["input_scale"] == 0.5
    fname = "sae.safetensors" if layout == "sparsify" else "sae_weights.safetensors"
    header = safe_open(tmp_path / "s" / fname, "pt").metadata()  # the hash covers the weights and cfg.json
    assert header["sha256"] == artifact_sha256(load_file(tmp_path / "s" / fname), kind="sae", meta=cfg, provenance={})
    assert header["kind"] == "sae" and "weights_sha256" not in cfg and "mlpinterp_format" not in cfg
    back = load_sae(tmp_path / "s")
    assert (back.hook_point, back.model_name, back.input_scale) == (sae.hook_point, sae.model_name, 0.5)
    x = _x()
    torch.testing.assert_close(back(x).sae_out, sae(x).sae_out)
    torch.testing.assert_close(back.encoder.weight, sae.encoder.weight)  # the folded scale is unfolded again


def test_a_flipped_byte_in_the_weights_is_a_clear_error(tmp_path):
    sae = _sae()
    save_sae(sae, tmp_path)
    f = tmp_path / "sae.safetensors"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0x01  # one bit of b_dec's last value: still a valid safetensors file with finite numbers
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match its recorded SHA-256.*changed after saving"):
        load_sae(tmp_path)
    assert load_sae(tmp_path, verify_hash=False).d_in == 6  # explicit opt-out for deliberate edits


def test_tied_file_whose_decoder_differs_from_its_encoder_is_refused(tmp_path):
    sae = _sae(tied=True)
    save_sae(sae, tmp_path)
    t = load_file(tmp_path / "sae.safetensors")
    t["W_dec"] = t["W_dec"] * 1.5
    save_file(t, tmp_path / "sae.safetensors")
    with pytest.raises(ValueError, match="tied=true but W_dec differs from the encoder weight"):
        load_sae(tmp_path, verify_hash=False)


def test_sparsify_layout_refuses_pre_bias_false(tmp_path):
    with pytest.raises(ValueError, match="sparsify always subtracts b_dec"):
        save_sae(_sae(pre_bias=False), tmp_path)


def test_check_provenance_errors_and_override_warns():
    kw = dict(recorded_model="m", recorded_hook="encoder.layer.3.output")
    check_provenance("x", **kw, model_name="m", hook_point="encoder.layer.3.output")  # same: silent
    check_provenance("x", **kw, model_name=None, hook_point=None)  # unknown: nothing to compare
    with pytest.raises(ValueError, match=r"trained on hook point 'encoder.layer.3.output', not 'encoder.layer.0.output'"):
        check_provenance("x", **kw, model_name="m", hook_point="encoder.layer.0.output")
    with pytest.raises(ValueError, match="model 'm', not 'gpt2'"):
        check_provenance("x", **kw, model_name="gpt2", hook_point=None)
    with pytest.warns(UserWarning, match="used anyway because of --allow-hook-mismatch"):
        check_provenance("x", **kw, model_name="m", hook_point="other", allow_mismatch=True,
                         override="--allow-hook-mismatch")


def test_resuming_at_another_hook_point_is_an_error(tmp_path):
    """Regression: a run at layer 3 silently resumed at layer 0 (loss 0.749 -> 0.917)."""
    cfg = MfrConfig(sae=SaeConfig(d_sae=8, k=2), n_saes=1, penalty=False, reinit=False)
    a = MfrTrainer(6, cfg, hook_point="encoder.layer.3.output", model_name="minilm")
    a.train_step(_x().float())
    a.save_checkpoint(tmp_path)
    b = MfrTrainer(6, cfg, hook_point="encoder.layer.0.output", model_name="minilm")
    with pytest.raises(ValueError, match="trained on hook point 'encoder.layer.3.output', not 'encoder.layer.0.output'"):
        b.load_checkpoint(tmp_path)
    assert b.step == 0
    with pytest.warns(UserWarning, match="used anyway"):
        assert b.load_checkpoint(tmp_path, allow_mismatch=True) and b.step == 1
    # other settings: named, not a silent resume with the new k
    c = MfrTrainer(6, MfrConfig(sae=SaeConfig(d_sae=8, k=3), n_saes=1, penalty=False, reinit=False),
                   hook_point="encoder.layer.3.output", model_name="minilm")
    with pytest.raises(ValueError, match=r"other settings \(sae.k: 2 there, 3 here\)"):
        c.load_checkpoint(tmp_path)
    assert load_sae(tmp_path / "sae_0").hook_point == "encoder.layer.3.output"



@pytest.mark.parametrize("field, before, other", [("init_b_dec_to_mean", False, True),
                                                  ("normalize_activations", "none", "expected_average_only_in"),
                                                  ("norm_batches", 10, 3), ("average_power", 0.0, 1.0)])
def test_checkpoint_written_before_a_field_existed(tmp_path, field, before, other):
    """A checkpoint that lacks a later MfrConfig field (ADDED_FIELDS) resumes when the request keeps the behaviour of
    that time and is refused, naming the field, when it asks for another (before: any later field was ignored)."""
    from mlpinterp.sae.mfr import ADDED_FIELDS
    assert ADDED_FIELDS[field] == before
    base = dict(sae=SaeConfig(d_sae=8, k=2), n_saes=1, penalty=False, reinit=False)
    a = MfrTrainer(6, MfrConfig(**base, **{field: before}))
    a.train_step(_x().float())
    a.save_checkpoint(tmp_path)
    rewrite(tmp_path / "trainer_rank0.safetensors",  # as the earlier version wrote it
            lambda m: {**m, "cfg": {k: v for k, v in m["cfg"].items() if k != field}})
    same = MfrTrainer(6, MfrConfig(**base, **{field: before}))
    assert same.load_checkpoint(tmp_path) and same.step == 1
    changed = MfrTrainer(6, MfrConfig(**base, **{field: other}))
    with pytest.raises(ValueError, match=rf"{field}: absent \(written before the field existed: {before!r}\) "
                                         rf"there, {other!r} here"):
        changed.load_checkpoint(tmp_path)
    assert changed.step == 0


@pytest.mark.parametrize("edit, message", [(lambda m: m.update(cfg=[1, 2]), "'cfg' must be a JSON object"),
                                           (lambda m: m.update(cfg="x"), "'cfg' must be a JSON object"),
                                           (lambda m: m.pop("step"), r"metadata lacks \['step'\]")],
                         ids=["cfg-list", "cfg-str", "no-step"])
def test_checkpoint_with_malformed_metadata_is_refused(tmp_path, edit, message):
    """A hand-edited or truncated trainer metadata is a ValueError naming the file, before anything changes (before:
    AttributeError from the config comparison, or KeyError 'step' after the input scale had been replaced)."""
    base = dict(sae=SaeConfig(d_sae=8, k=2), n_saes=1, penalty=False, reinit=False)
    a = MfrTrainer(6, MfrConfig(**base))
    a.train_step(_x().float())
    a.save_checkpoint(tmp_path)
    rewrite(tmp_path / "trainer_rank0.safetensors", lambda m: (edit(m), m)[1])  # a faulty writer, a valid hash
    b = MfrTrainer(6, MfrConfig(**base))
    with pytest.raises(ValueError, match=rf"trainer_rank0.safetensors'.*{message}"):
        b.load_checkpoint(tmp_path)
    assert b.step == 0 and b.input_scale == 1.0



def _drop_tensor(name):
    def edit(tensors):
        del tensors[name]
    return edit


def _reshape_tensor(name):
    def edit(tensors):
        tensors[name] = tensors[name][:-1].clone()
    return edit


@pytest.mark.parametrize("meta_edit, tensor_edit, message", [
    (lambda m: m.update(assignments=[1]), None, "TypeError"),
    (lambda m: m.update(n_reinits=3), None, "TypeError"),
    (lambda m: m.update(n_reinits=[0, 0]), None, "n_reinits has 2 entries, not one per SAE"),
    (lambda m: m.update(history={}), None, "must be lists"),
    (lambda m: m.update(step="ten"), None, "ValueError"),
    (None, _drop_tensor("window_counts"), "KeyError: 'window_counts'"),
    (None, _reshape_tensor("since_fired"), r"tensor 'since_fired' has shape \[0, 8\], these SAEs need \[1, 8\]"),
    (None, _reshape_tensor("sae0.param.encoder.weight"), "tensor 'sae0.param.encoder.weight' has shape"),
    (None, _drop_tensor("sae0.param.b_dec"), "KeyError: 'sae0.param.b_dec'"),
], ids=["assignments-list", "n_reinits-int", "n_reinits-length", "history-dict", "step-str", "no-window_counts",
        "since_fired-shape", "encoder-weight-shape", "no-b_dec"])
def test_checkpoint_with_malformed_values_is_refused_whole(tmp_path, meta_edit, tensor_edit, message):
    """A checkpoint whose values do not fit (hand-edited, another trainer's tensors) is a ValueError naming the file,
    and nothing of the trainer changes (before: raw TypeError/KeyError/RuntimeError part-way through loading, with the
    step, history or some SAE weights already replaced)."""
    base = dict(sae=SaeConfig(d_sae=8, k=2), n_saes=1, penalty=False, reinit=False)
    a = MfrTrainer(6, MfrConfig(**base))
    a.train_step(_x().float())
    a.save_checkpoint(tmp_path)
    if meta_edit is not None:  # a faulty writer: wrong values with a valid hash
        rewrite(tmp_path / "trainer_rank0.safetensors", lambda m: (meta_edit(m), m)[1])
    if tensor_edit is not None:
        rewrite(tmp_path / "trainer_rank0.safetensors", tensors=lambda t: (tensor_edit(t), t)[1])
    b = MfrTrainer(6, MfrConfig(**base))
    before = {k: v.clone() for k, v in b.saes[0].state_dict().items()}
    with pytest.raises(ValueError, match=rf"trainer_rank0.safetensors'.*{message}"):
        b.load_checkpoint(tmp_path)
    assert b.step == 0 and b.history == [] and b.n_reinits == [0] and not b.opts[0].state
    assert all(torch.equal(v, before[k]) for k, v in b.saes[0].state_dict().items())


# ----------------------------------------------------------------------------- SAELens fields without SAELens
def _saelens_cfg(tmp_path, **edit):
    """Write a SAELens-6 style directory by hand (no sae_lens needed), then edit its cfg.json."""
    sae = _sae()
    save_sae(sae, tmp_path, layout="saelens")
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    for key in [k for k in cfg if k not in ("d_in", "d_sae", "k", "dtype", "device", "architecture", "metadata",
                                           "apply_b_dec_to_input", "normalize_activations",
                                           "rescale_acts_by_decoder_norm", "reshape_activations")]:
        del cfg[key]  # what SAELens itself writes: none of our keys, no hash
    cfg.update(edit)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    weights = tmp_path / "sae_weights.safetensors"
    save_file(load_file(weights), weights)  # nor our header
    return sae


def test_saelens_apply_b_dec_to_input_false_is_honoured(tmp_path):
    """Regression: without our pre_bias key, apply_b_dec_to_input=false was ignored (max diff 3.5)."""
    sae = _saelens_cfg(tmp_path, apply_b_dec_to_input=False)
    back = load_sae(tmp_path)
    x = _x()
    # hand computation of SAELens's forward: no b_dec subtraction before the encoder
    pre = x @ sae.encoder.weight.T + sae.encoder.bias
    v, i = pre.topk(3, dim=1)
    z = torch.zeros_like(pre).scatter(1, i, v.relu())
    torch.testing.assert_close(back(x).sae_out, z @ sae.W_dec + sae.b_dec)
    assert not back.cfg.pre_bias


def test_saelens_rescale_acts_by_decoder_norm_is_folded_exactly(tmp_path):
    _saelens_cfg(tmp_path, rescale_acts_by_decoder_norm=True)
    t = load_file(tmp_path / "sae_weights.safetensors")
    t["W_dec"] = t["W_dec"] * torch.linspace(0.5, 2.0, 10, dtype=torch.float64)[:, None]
    save_file(t, tmp_path / "sae_weights.safetensors")
    back = load_sae(tmp_path)
    x = _x()
    n = t["W_dec"].norm(dim=1)  # SAELens: pre * ||W_dec_j||, TopK, ReLU, then acts / ||W_dec_j|| times W_dec
    pre = ((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]) * n
    v, i = pre.topk(3, dim=1)
    z = torch.zeros_like(pre).scatter(1, i, v.relu()) / n
    torch.testing.assert_close(back(x).sae_out, z @ t["W_dec"] + t["b_dec"])


@pytest.mark.parametrize("edit,match", [
    (dict(normalize_activations="expected_average_only_in"), "normalize_activations='expected_average_only_in' is not "
                                                              "supported .*fold_activation_norm_scaling_factor"),
    (dict(normalize_activations="layer_norm"), "normalize_activations='layer_norm' is not supported"),
    (dict(architecture="jumprelu"), "architecture='jumprelu' is not supported"),
    (dict(reshape_activations="hook_z"), "reshape_activations='hook_z' is not supported"),
    (dict(metadata={"hook_name": "blocks.0.attn.hook_z", "hook_head_index": 3}), "hook_head_index=3"),
    (dict(apply_b_dec_to_input="no"), "'apply_b_dec_to_input' must be a bool"),
])
def test_saelens_fields_we_cannot_compute_are_refused_by_name(tmp_path, edit, match):
    _saelens_cfg(tmp_path, **edit)
    with pytest.raises(ValueError, match=match):
        load_sae(tmp_path)


def test_saelens_hook_name_is_recorded(tmp_path):
    _saelens_cfg(tmp_path, metadata={"hook_name": "transformer.h.0.mlp", "model_name": "gpt2",
                                     "sae_lens_version": "6.54.12"})
    back = load_sae(tmp_path)
    assert (back.hook_point, back.model_name) == ("transformer.h.0.mlp", "gpt2")


# ----------------------------------------------------------------------------- input normalisation
def test_input_scale_outputs_and_metrics_in_original_units():
    """An SAE with input_scale s computes on s x and returns x_hat / s: written out by hand."""
    sae = _sae(input_scale=0.25)
    x = _x(scale=40.0)
    out = sae(x)
    xs = 0.25 * x
    pre = (xs - sae.b_dec) @ sae.encoder.weight.T + sae.encoder.bias
    v, i = pre.topk(3, dim=1)
    z = torch.zeros_like(pre).scatter(1, i, v.relu())
    x_hat = (z @ sae.W_dec + sae.b_dec) / 0.25
    torch.testing.assert_close(out.sae_out, x_hat)
    torch.testing.assert_close(out.mse, (x - x_hat).pow(2).mean())  # original units (SAELens #518 class)
    torch.testing.assert_close(out.fvu, (x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
    torch.testing.assert_close(sae.decode(out.latent_acts, out.latent_indices), x_hat)


def test_trainer_estimates_the_scale_from_the_first_batches_and_saves_it(tmp_path):
    batches = [_x(n=16, seed=s, scale=7.0).float() for s in range(5)]
    cfg = MfrConfig(sae=SaeConfig(d_sae=8, k=2), n_saes=1, penalty=False, reinit=False,
                    normalize_activations="expected_average_only_in", norm_batches=3)
    tr = MfrTrainer(6, cfg)
    with pytest.raises(ValueError, match="needs the input scale before the first step"):
        tr.train_step(batches[0])
    tr.fit(iter(batches), 5, quiet=True, checkpoint_dir=tmp_path)
    rows = torch.cat(batches[:3]).double()
    want = math.sqrt(6) / float(rows.norm(dim=1).mean())  # E||s x|| = sqrt(d_in) over the first 3 batches
    assert tr.input_scale == pytest.approx(want, rel=1e-12)
    assert float((want * rows).norm(dim=1).mean()) == pytest.approx(math.sqrt(6))
    assert tr.step == 5  # the estimation batches were trained on, not skipped
    assert json.loads((tmp_path / "sae_0" / "cfg.json").read_text())["input_scale"] == pytest.approx(want)
    assert load_sae(tmp_path / "sae_0").input_scale == pytest.approx(want)
    again = MfrTrainer(6, cfg)
    assert again.load_checkpoint(tmp_path) and again.input_scale == tr.input_scale
    # b_dec starts at the mean of the first batch in the scaled space
    fresh = MfrTrainer(6, cfg)
    fresh.estimate_input_scale(batches[:3])
    fresh.train_step(batches[0])
    torch.testing.assert_close(fresh.history[0]["recon"][0], tr.history[0]["recon"][0])


# ----------------------------------------------------------------------------- bf16
def test_bf16_autocast_forward_backward_on_cpu():
    """Regression: autocast raised a dtype mismatch inside embedding_bag."""
    sae = TopKSae(6, SaeConfig(d_sae=10, k=3), generator=torch.Generator().manual_seed(0))
    x = _x().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sae(x, dead_mask=torch.tensor([True, False] * 5))
        (out.fvu + out.auxk_loss).backward()
    assert out.sae_out.dtype == torch.float32 and torch.isfinite(out.fvu)
    ref = TopKSae(6, SaeConfig(d_sae=10, k=3), generator=torch.Generator().manual_seed(0))
    ref_out = ref(x, dead_mask=torch.tensor([True, False] * 5))
    (ref_out.fvu + ref_out.auxk_loss).backward()
    for (name, p), q in zip(sae.named_parameters(), ref.parameters(), strict=True):
        assert p.grad.dtype == p.dtype == torch.float32, name
        torch.testing.assert_close(p.grad, q.grad, rtol=0.1, atol=2e-2, msg=name)  # bf16 matmul: ~3 digits


@pytest.mark.parametrize("penalty", [False, True])
def test_train_steps_under_bf16_autocast(penalty):
    torch.manual_seed(0)
    cfg = MfrConfig(sae=SaeConfig(d_sae=256, k=2), n_saes=2, penalty=penalty, reinit=False, warmup_steps=2,
                    dead_after_samples=64)
    tr = MfrTrainer(6, cfg)
    before = [p.detach().clone() for s in tr.saes for p in s.parameters()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        recs = [tr.train_step(_x(n=64, seed=s).float()) for s in range(12)]
    assert all(math.isfinite(r) for rec in recs for r in rec["recon"])
    assert any(a > 0 for rec in recs for a in rec["auxk"])  # AuxK (dense backward path) ran under autocast too
    after = [p.detach() for s in tr.saes for p in s.parameters()]
    assert all(not torch.equal(a, b) for a, b in zip(before, after, strict=True))  # no skipped update
    assert recs[-1]["recon"][0] < recs[0]["recon"][0]


def test_fp16_autocast_is_refused_up_front():
    tr = MfrTrainer(6, MfrConfig(sae=SaeConfig(d_sae=8, k=2), n_saes=1, penalty=False, reinit=False))
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(ValueError, match="float16 autocast is not supported"):
        tr.train_step(_x().float())
    assert tr.step == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_train_steps_under_bf16_autocast_cuda():
    tr = MfrTrainer(6, MfrConfig(sae=SaeConfig(d_sae=16, k=3), n_saes=2, reinit=False), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        recs = [tr.train_step(_x(n=64, seed=s).float().cuda()) for s in range(5)]
    assert all(math.isfinite(r) for rec in recs for r in rec["recon"])
