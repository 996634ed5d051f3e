"""MMCS / Hungarian vs brute force, MFR penalty gradient vs finite differences, re-initialisation rule,
warm-up and auto-alpha, baseline independence, checkpoint resume, analyses."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from mlpinterp.sae.analysis import cross_truth_correlation, feature_similarities, mmcs_to_truth, shared_false_cluster
from mlpinterp.sae.inactivity import cubed_relative_deviation, mean_relative_deviation, should_reinit
from mlpinterp.sae.metrics import cosine_matrix, mmcs
from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
from mlpinterp.sae.mfr_penalty import mfr_penalty
from mlpinterp.sae.synthetic import SyntheticConfig, SyntheticData
from mlpinterp.sae.topk import SaeConfig
from mlpinterp.utils.schedules import cosine_half_rise as cosine_warmup


def _brute_mmcs(a: torch.Tensor, b: torch.Tensor) -> float:
    """Best one-to-one matching by enumerating every injective map rows(a) -> rows(b) (n <= m)."""
    c = cosine_matrix(a, b).numpy()
    n, m = c.shape
    if n > m:
        return _brute_mmcs(b, a)
    return max(np.mean([c[i, p[i]] for i in range(n)]) for p in itertools.permutations(range(m), n))


@pytest.mark.parametrize("shape", [(5, 5), (4, 6), (6, 4), (1, 3)])
def test_hungarian_mmcs_matches_brute_force(shape):
    g = torch.Generator().manual_seed(sum(shape))
    a = torch.randn(shape[0], 3, dtype=torch.float64, generator=g)
    b = torch.randn(shape[1], 3, dtype=torch.float64, generator=g)
    assert float(mmcs(a, b)) == pytest.approx(_brute_mmcs(a, b), abs=1e-12)
    # plain max matching: mean over rows of a of the best cosine, written out
    c = [[float(torch.dot(x, y) / (x.norm() * y.norm())) for y in b] for x in a]
    assert float(mmcs(a, b, matching="max")) == pytest.approx(np.mean([max(r) for r in c]), abs=1e-12)


def test_mmcs_is_one_for_a_permuted_rescaled_copy():
    a = torch.randn(7, 4, dtype=torch.float64)
    b = a[torch.randperm(7)] * torch.rand(7, 1, dtype=torch.float64).add(0.5)
    assert float(mmcs(a, b)) == pytest.approx(1.0)


def test_penalty_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(0)
    decs = [torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3)]
    # gradcheck compares autograd with central finite differences; the Hungarian assignment is locally constant
    assert torch.autograd.gradcheck(lambda *d: mfr_penalty(list(d)), tuple(decs), eps=1e-6, atol=1e-7)
    # and the value is 1/C(3,2) * sum_{i<j} (1 - MMCS)
    want = np.mean([1 - _brute_mmcs(decs[i].detach(), decs[j].detach()) for i, j in [(0, 1), (0, 2), (1, 2)]])
    assert float(mfr_penalty([d.detach() for d in decs])) == pytest.approx(want, abs=1e-12)


def test_cubed_relative_deviation_by_hand_and_reinit_rule():
    # counts over 10 samples, k=1, d_sae=4: target rate 1/4; r/t - 1 = [-1, -0.2, 0.6, 1.4]
    # |.|^3 = [1, 0.008, 0.216, 2.744], mean = 3.968 / 4 = 0.992
    assert cubed_relative_deviation(torch.tensor([0, 2, 4, 6]), 10, 1) == pytest.approx(0.992)
    assert cubed_relative_deviation(torch.tensor([5, 5, 5, 5]), 20, 1) == pytest.approx(0.0)
    assert should_reinit(0.5000001, 0.5) and not should_reinit(0.5, 0.5) and not should_reinit(float("nan"), 0)


@pytest.mark.parametrize(("counts", "n", "k", "want"), [
    ([9] * 10, 45, 2, 0.0),  # every latent at the uniform rate k/N
    ([0, 0, 0] + [20] * 7, 70, 2, 0.6),  # 30 % dead, the rest uniform: 0.3 * 1 + 7 * |1/0.7 - 1| / 10 = 2 * 0.3
    ([90] + [10] * 9, 90, 2, 0.8),  # one latent on every sample: (|5 - 1| + 9 |5/9 - 1|) / 10 = 2 (N - k) / (k N)
    ([0] * 10, 50, 2, 1.0),  # all dead
])
def test_mean_relative_deviation_by_hand(counts, n, k, want):
    """The paper's measure (mean deviation of the activation frequency from the uniform k/N, relative to it) on
    planted frequency vectors; the cubed measure ranks the hyperactive vector far above the dead one."""
    assert mean_relative_deviation(torch.tensor(counts), n, k) == pytest.approx(want, abs=1e-12)
    if want == 0.6:
        assert cubed_relative_deviation(torch.tensor(counts), n, k) == pytest.approx(0.3 + 0.7 * (3 / 7) ** 3)


def test_paper_default_reinitialises_a_planted_inactive_cluster_and_not_a_healthy_sae():
    """Defaults (the paper's measure, threshold 1, no AuxK): 19 of SAE 0's 32 latents can never fire (measure about 2 * 19 / 32
    in its first window) and it is re-initialised at the first check, once; SAE 1, trained normally on the same
    batches, never is."""
    cfg = MfrConfig(sae=SaeConfig(d_sae=32, k=3, tied=True), n_saes=2, penalty=False, reinit=True, auxk_alpha=0.0,
                    inactivity_window=4, seed=0)
    assert (cfg.inactivity_measure, cfg.inactivity_threshold) == ("mean_relative_deviation", 1.0)
    tr = MfrTrainer(12, cfg)
    with torch.no_grad():
        tr.saes[0].encoder.bias[:19] = -1e3
    tr.fit(_data().stream(64), 40, quiet=True)
    assert tr.n_reinits == [1, 0]
    assert [(e["step"], e["sae"]) for e in tr.reinit_events] == [(4, 0)] and tr.reinit_events[0]["measure"] > 1.1
    healthy = [c["measure"] for c in tr.checks if c["sae"] == 1]
    assert len(healthy) == 10 and max(healthy) < 1.0


def _tiny_cfg(**kw) -> MfrConfig:
    base = dict(sae=SaeConfig(d_sae=32, k=3, tied=True), n_saes=2, optimizer="adam", lr=3e-3, warmup_steps=5, inactivity_window=4,
                dead_after_samples=64, seed=0)
    base.update(kw)
    return MfrConfig(**base)


def _data():
    return SyntheticData(SyntheticConfig(n_features=32, d=12, n_groups=4, k_active=3, seed=0))


def test_reinit_fires_exactly_when_measure_exceeds_threshold():
    data = _data()
    probe = MfrTrainer(12, _tiny_cfg(reinit=False, penalty=False))
    probe.fit(data.stream(64), 40, quiet=True)
    measures = sorted(c["measure"] for c in probe.checks)
    thr = float(np.median(measures))  # some checks above, some below
    tr = MfrTrainer(12, _tiny_cfg(reinit=True, penalty=False, inactivity_threshold=thr))
    tr.fit(data.stream(64), 40, quiet=True)
    above = {(c["step"], c["sae"]) for c in tr.checks if c["measure"] > thr}
    fired = {(e["step"], e["sae"]) for e in tr.reinit_events}
    assert fired == above and len(fired) > 0
    assert len(tr.checks) == 2 * 40 // 4


def test_reinit_resets_a_dead_sae_and_its_optimiser():
    data = _data()
    tr = MfrTrainer(12, _tiny_cfg(reinit=True, penalty=False, inactivity_threshold=0.9, auxk_alpha=0.0,
                                  inactivity_window=2))
    with torch.no_grad():
        tr.saes[1].encoder.bias.fill_(-1e3)  # SAE 1 never fires: measure = mean |0 - 1|^3 = 1 > 0.9
    tr.train_step(data.batch(0, 64).x)
    assert tr.opts[1].state  # Adam has state after a step
    tr.train_step(data.batch(1, 64).x)
    assert tr.reinit_events == [{"step": 2, "sae": 1, "measure": 1.0}]
    assert float(tr.saes[1].encoder.bias.detach().abs().max()) == 0.0 and not tr.opts[1].state
    torch.testing.assert_close(tr.saes[1].W_dec.norm(dim=1), torch.ones(32))


def test_b_dec_starts_at_the_first_batch_mean():
    x = _data().batch(0, 64).x
    tr = MfrTrainer(12, _tiny_cfg(lr=0.0, penalty=False))
    tr.train_step(x)
    for sae in tr.saes:
        torch.testing.assert_close(sae.b_dec.detach(), x.mean(0))


def test_auto_alpha_and_cosine_warmup():
    tr = MfrTrainer(12, _tiny_cfg(reinit=False))
    hist = tr.fit(_data().stream(64), 8, quiet=True)
    assert tr.alpha * hist[0]["penalty"] == pytest.approx(np.mean(hist[0]["recon"]), rel=1e-6)
    for h in hist:
        want = tr.alpha * 0.5 * (1 - math.cos(math.pi * min(h["step"], 5) / 5))
        assert h["alpha_t"] == pytest.approx(want)
    assert cosine_warmup(0, 100) == 0.0 and cosine_warmup(50, 100) == pytest.approx(0.5)
    assert cosine_warmup(100, 100) == 1.0 and cosine_warmup(500, 100) == 1.0


def test_baseline_saes_are_independent_of_each_other():
    data = _data()
    two = MfrTrainer(12, _tiny_cfg(penalty=False, reinit=False))
    two.fit(data.stream(64), 10, quiet=True)
    one = MfrTrainer(12, _tiny_cfg(n_saes=1, penalty=False, reinit=False))
    one.fit(data.stream(64), 10, quiet=True)
    for a, b in zip(two.saes[0].parameters(), one.saes[0].parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_penalty_makes_the_saes_agree():
    data = _data()
    sims = {}
    for pen in (False, True):
        tr = MfrTrainer(12, _tiny_cfg(penalty=pen, reinit=False, alpha=1.0, lr=1e-2))
        tr.fit(data.stream(64), 60, quiet=True)
        sims[pen] = float(mmcs(tr.saes[0].W_dec.detach(), tr.saes[1].W_dec.detach()))
    assert sims[True] > sims[False] + 0.05


def test_checkpoint_resume_is_exact(tmp_path):
    data = _data()
    full = MfrTrainer(12, _tiny_cfg())
    full.fit(data.stream(64), 10, quiet=True)
    part = MfrTrainer(12, _tiny_cfg())
    part.fit(data.stream(64), 5, quiet=True, checkpoint_dir=tmp_path)
    resumed = MfrTrainer(12, _tiny_cfg())
    assert resumed.load_checkpoint(tmp_path)
    assert resumed.step == 5
    resumed.fit(data.stream(64, start=5), 10, quiet=True)
    for s_full, s_res in zip(full.saes, resumed.saes, strict=True):
        for a, b in zip(s_full.parameters(), s_res.parameters(), strict=True):
            torch.testing.assert_close(a, b)
    np.testing.assert_allclose([h["recon"] for h in resumed.history], [h["recon"] for h in full.history])


def test_analyses_on_constructed_dictionaries():
    g = torch.Generator().manual_seed(0)
    truth = torch.nn.functional.normalize(torch.randn(8, 6, dtype=torch.float64, generator=g), dim=1)
    false = torch.nn.functional.normalize(torch.randn(2, 6, dtype=torch.float64, generator=g), dim=1)
    # both SAEs: 6 true features + the same 2 false ones
    a = torch.cat([truth[:6], false])
    b = torch.cat([truth[:6], false])[torch.randperm(8, generator=g)]
    assert mmcs_to_truth(truth, truth) == pytest.approx(1.0)
    sims = feature_similarities([a, b], truth)
    np.testing.assert_allclose(sims.cross, 1.0)
    np.testing.assert_allclose(sims.truth[0, :6], 1.0)
    rates = np.full((2, 8), 0.1)
    rates[0, 6:] = 0.5
    rates[1, [int(i) for i in torch.nonzero((b[:, None] == false[None]).all(-1))[:, 0]]] = 0.5
    cl = shared_false_cluster([a, b], truth, rates, shared_min=0.99, truth_max=float(sims.truth[0, 6:].max()) + 1e-9)
    assert cl["count"] == 4 and cl["rate_in_cluster"] == pytest.approx(0.5) and cl["rate_outside"] == pytest.approx(0.1)
    c = cross_truth_correlation([a, b], truth)
    assert np.isnan(c["r"])  # cross similarity is constant (all 1) -> undefined correlation, not a crash


def test_bad_config():
    with pytest.raises(ValueError, match="penalty=True needs n_saes >= 2"):
        MfrConfig(n_saes=1)
    with pytest.raises(ValueError, match="inactivity_measure must be one of"):
        MfrConfig(inactivity_measure="nope")
    with pytest.raises(ValueError, match="average_power must be a finite number >= 0, got -1"):
        MfrConfig(average_power=-1)
    with pytest.raises(ValueError, match="decoders must hold at least 2"):
        mfr_penalty([torch.zeros(3, 2)])
    tr = MfrTrainer(12, _tiny_cfg())
    with pytest.raises(ValueError, match=r"x must be a tensor of shape \[batch, d_in=12\], got \[4, 5\]"):
        tr.train_step(torch.zeros(4, 5))


def test_a_run_ending_worse_than_the_mean_warns_and_a_healthy_one_does_not():
    """The end-of-fit check evaluates the saved (averaged) weights: a sign optimiser with lr 5 per coordinate on
    12-dimensional data cannot beat the mean and is named in a RuntimeWarning with the fix; Adam at 3e-3 is not."""
    import warnings

    bad = MfrTrainer(12, _tiny_cfg(optimizer="signum_schedulefree", lr=5.0, n_saes=1, penalty=False))
    with pytest.warns(RuntimeWarning, match=r"worse than the mean.*optimizer signum_schedulefree.*optimizer='adam'"):
        bad.fit(_data().stream(64), 30, quiet=True)
    with pytest.warns(RuntimeWarning, match="SAE 0"):
        assert bad.warn_if_worse_than_mean(next(iter(_data().stream(64))))[0] >= 1.0
    adam = MfrTrainer(12, _tiny_cfg(optimizer="adam", lr=50.0, n_saes=1, penalty=False))
    with pytest.warns(RuntimeWarning, match=r"optimizer adam.*lower MfrConfig.lr, or train longer$") as rec:
        adam.fit(_data().stream(64), 30, quiet=True)
    assert all("optimizer='adam'" not in str(w.message) for w in rec)  # no advice to switch to what already runs
    good = MfrTrainer(12, _tiny_cfg(n_saes=1, penalty=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        good.fit(_data().stream(64), 60, quiet=True)
    assert good.warn_if_worse_than_mean(next(iter(_data().stream(64))))[0] < 1.0
