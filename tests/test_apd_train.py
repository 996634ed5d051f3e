"""The APD loop: short runs lower every loss, resume is exact, bad configurations raise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlpinterp.apd import APDConfig, decompose, lr_at, with_overrides
from mlpinterp.paramspace import mmcs_ml2r
from mlpinterp.toys import (
    build_resid_mlp,
    sparse_features,
    step_generator,
)
from mlpinterp.toys.resid_mlp import ResidMLPConfig

from .artifact_utils import rewrite

torch.set_num_threads(1)
# torch's first forward-mode AD call scripts its jvp decompositions with the deprecated torch.jit.script
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


@pytest.fixture()
def tms52(tms52_target):
    return tms52_target


def _sample_tms(step):
    return sparse_features(512, 5, 0.05, generator=step_generator(3, step))


def _mean(hist, key, sl):
    return float(np.mean([h[key] for h in hist[sl]]))


def test_short_tms_run_lowers_every_loss(tms52):
    cfg = APDConfig(C=5, steps=300, batch_size=512, log_every=10, attribution_source="apd", lr=3e-2)
    res = decompose(tms52, _sample_tms, cfg, quiet=True)
    h = res.history
    for key in ("faithfulness", "minimality", "simplicity", "total"):
        assert _mean(h, key, slice(-5, None)) < _mean(h, key, slice(0, 3)), key
    mmcs, ml2r, _ = mmcs_ml2r(tms52.W, res.components.weights()["W"])
    assert mmcs > 0.9
    assert all(p.requires_grad for p in tms52.parameters())  # restored


def test_resid_run_with_act_recon_lowers_losses():
    model = build_resid_mlp(ResidMLPConfig(n_features=10, d_embed=32, d_mlp=6, n_layers=1))
    model.requires_grad_(False)
    cfg = APDConfig(targets=tuple(model.target_names()), C=12, m=1, steps=300, batch_size=128, lr=1e-2,
                    topk=1.28, minimality_coeff=1.0, simplicity_coeff=1.0, schatten_p=0.9,
                    act_recon_coeff=1.0, act_names=tuple(model.act_names()), log_every=10, unit_norm_B=True,
                    lr_schedule="cosine", warmup_frac=0.01)
    sample = lambda s: sparse_features(128, 10, 0.1, (-1, 1), generator=step_generator(4, s))
    res = decompose(model, sample, cfg, quiet=True)
    for key in ("faithfulness", "minimality", "act_recon", "total"):
        assert _mean(res.history, key, slice(-5, None)) < _mean(res.history, key, slice(0, 3)), key
    B = res.components.factors("layers.0.mlp_in")[1]
    torch.testing.assert_close(B.norm(dim=-1), torch.ones(12, 1))


def test_lp_variant_and_per_sample_topk_run(tms52):
    for kw in (dict(sparsity="lp", lp_p1=1.0, lp_p2=1.0, minimality_coeff=1e-2, simplicity_coeff=1e-2),
               dict(batch_topk=False, topk=1, schatten_mode="factor")):
        cfg = APDConfig(C=5, steps=80, batch_size=256, log_every=10, **kw)
        res = decompose(tms52, _sample_tms, cfg, quiet=True)
        assert res.history[-1]["faithfulness"] < res.history[0]["faithfulness"]
        assert np.isfinite(res.history[-1]["total"])


def test_resume_is_exact_and_deterministic(tms52, tmp_path):
    cfg = APDConfig(C=5, steps=60, batch_size=256, log_every=10, checkpoint_every=25)
    full = decompose(tms52, _sample_tms, cfg, quiet=True)

    class Stop(Exception):
        pass

    def interrupt(step, comps, logs):
        if step == 30:
            raise Stop

    with pytest.raises(Stop):
        decompose(tms52, _sample_tms, cfg, out_dir=tmp_path, quiet=True, callback=interrupt)
    resumed = decompose(tms52, _sample_tms, cfg, out_dir=tmp_path, quiet=True)
    for a, b in zip(full.components.parameters(), resumed.components.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert [h["step"] for h in resumed.history] == [h["step"] for h in full.history]
    flags = [p.requires_grad for p in tms52.parameters()]
    with pytest.raises(ValueError, match="different configuration"):
        decompose(tms52, _sample_tms, with_overrides(cfg, C=6), out_dir=tmp_path, quiet=True)
    assert [p.requires_grad for p in tms52.parameters()] == flags and all(flags)  # a refused resume freezes nothing
    # a checkpoint written before `init` / `init_instances` existed resumes with the behaviour of that time only

    rewrite(tmp_path / "checkpoint.safetensors", lambda m: {**m, "config": {
        k: v for k, v in m["config"].items() if k not in ("init", "init_instances")}})
    again = decompose(tms52, _sample_tms, cfg, out_dir=tmp_path, quiet=True)
    assert [h["step"] for h in again.history] == [h["step"] for h in full.history]
    with pytest.raises(ValueError, match=r"init: saved absent \(written before the field existed: 'scaled'\)"):
        decompose(tms52, _sample_tms, with_overrides(cfg, init="reference"), out_dir=tmp_path, quiet=True)


@pytest.mark.parametrize("kw,msg", [
    (dict(topk=6.0), r"topk \(batch top-k\)"),
    (dict(batch_topk=False, topk=7), r"per-sample"),
    (dict(targets=("encoder",)), "'encoder' must name"),
    (dict(lr_schedule="linear"), "lr_schedule"),
    (dict(act_recon_coeff=1.0), "act_names"),
    (dict(schatten_mode="svd"), "schatten_mode"),
    (dict(attribution_source="x"), "attribution_source"),
    (dict(C=0), "C must be positive"),
])
def test_bad_configurations(tms52, kw, msg):
    with pytest.raises(ValueError, match=msg):
        decompose(tms52, _sample_tms, with_overrides(APDConfig(steps=1), **kw), quiet=True)
    with pytest.raises(ValueError, match="unknown APDConfig"):
        with_overrides(APDConfig(), colour="red")


def test_act_recon_rejected_with_param_sites(tms52):
    with pytest.raises(ValueError, match="nn.Linear"):
        decompose(tms52, _sample_tms, APDConfig(steps=1, act_recon_coeff=1.0, act_names=("",)), quiet=True)


def test_lr_schedule():
    cfg = APDConfig(steps=100, lr=1.0, warmup_frac=0.1, lr_schedule="cosine")
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(55, cfg) == pytest.approx(0.5)  # halfway through the 90 cosine steps
    assert lr_at(50, with_overrides(cfg, lr_schedule="constant")) == 1.0


def test_device_argument(tms52):
    cfg = APDConfig(C=5, steps=3, batch_size=256, log_every=1)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            decompose(tms52, _sample_tms, cfg, quiet=True, device="cuda")
        cpu = decompose(tms52, _sample_tms, cfg, quiet=True, device="cpu")
        ref = decompose(tms52, _sample_tms, cfg, quiet=True)
        assert cpu.history == ref.history
        return
    gpu = decompose(tms52, _sample_tms, cfg, quiet=True, device="cuda")
    assert gpu.components.A["W"].device.type == "cpu" and tms52.W.device.type == "cpu"
    assert np.isfinite(gpu.history[-1]["total"])
