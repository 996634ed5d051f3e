"""SAEBench core metrics, each against a hand computation written out here (loops over tokens / latents)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from mlpinterp.sae.core_metrics import average_max_cosine_sim, core_metrics
from mlpinterp.sae.evaluate import evaluate_sae, identity_sae
from mlpinterp.sae.topk import SaeConfig, TopKSae


def _sae(d_in=5, d_sae=12, k=3, input_scale=1.0):
    sae = TopKSae(d_in, SaeConfig(d_sae=d_sae, k=k), dtype=torch.float64, generator=torch.Generator().manual_seed(0),
                  input_scale=input_scale)
    with torch.no_grad():
        sae.encoder.bias.normal_(-0.3, 0.3, generator=torch.Generator().manual_seed(1))
        sae.b_dec.normal_(2.0, 1.0, generator=torch.Generator().manual_seed(2))
    return sae


def _hand(sae: TopKSae, x: torch.Tensor) -> dict:
    """Every metric from its definition, token by token, in numpy float64."""
    xs = x.numpy() * sae.input_scale
    W, b, Wd, bd = (t.detach().numpy() for t in (sae.encoder.weight, sae.encoder.bias, sae.W_dec, sae.b_dec))
    n, d = xs.shape
    z = np.zeros((n, W.shape[0]))
    for t in range(n):
        pre = W @ (xs[t] - bd) + b
        for j in np.argsort(-pre)[: sae.cfg.k]:
            z[t, j] = max(pre[j], 0.0)
    xh = (z @ Wd + bd) / sae.input_scale
    xo = x.numpy()
    mean = xo.mean(0)
    ev = 1 - sum(((xo[t] - xh[t]) ** 2).sum() for t in range(n)) / sum(((xo[t] - mean) ** 2).sum() for t in range(n))
    cos = np.mean([xo[t] @ xh[t] / np.linalg.norm(xo[t]) / np.linalg.norm(xh[t]) for t in range(n)])
    dens = (z != 0).mean(0)

    def avg_max_cos(rows):
        u = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        return np.mean([max(u[j] @ u[i] for i in range(len(u)) if i != j) for j in range(len(u))])

    # SAEBench 0.6.0's lines, one batch: E||x||^2 - (mean over tokens and dimensions of x^2)^2 as total variance
    literal = 1 - np.mean([((xo[t] - xh[t]) ** 2).sum() for t in range(n)]) / (
        np.mean([(xo[t] ** 2).sum() for t in range(n)]) - np.mean([[xo[t, i] ** 2 for i in range(d)]
                                                                     for t in range(n)]) ** 2)
    return {
        "explained_variance_saebench_literal": literal,
        "explained_variance": ev, "mse": np.mean([((xo[t] - xh[t]) ** 2).sum() for t in range(n)]), "cossim": cos,
        "l2_norm_in": np.mean(np.linalg.norm(xo, axis=1)), "l2_norm_out": np.mean(np.linalg.norm(xh, axis=1)),
        "l2_ratio": np.mean(np.linalg.norm(xh, axis=1) / np.linalg.norm(xo, axis=1)),
        "relative_reconstruction_bias": np.mean((xh ** 2).sum(1)) / np.mean((xo * xh).sum(1)),
        "l0": np.mean((z != 0).sum(1)), "l1": np.mean(np.abs(z).sum(1)),
        "frac_alive": np.mean(dens > 0), "freq_over_1_percent": np.mean(dens > 0.01),
        "freq_over_10_percent": np.mean(dens > 0.1),
        "normalized_freq_over_10_percent": dens[dens > 0.1].sum() / dens.sum(),
        "average_max_decoder_cosine_sim": avg_max_cos(Wd), "average_max_encoder_cosine_sim": avg_max_cos(W),
    }


@pytest.mark.parametrize("input_scale", [1.0, 0.2])
def test_core_metrics_match_a_hand_computation(input_scale):
    sae = _sae(input_scale=input_scale)
    x = 3 * torch.randn(200, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) + 1.5
    got = core_metrics(sae, x, batch_size=37)  # uneven batches: the result must not depend on them
    flat = {k: v for cat in got.values() for k, v in cat.items()}
    want = _hand(sae, x)
    for key, v in want.items():
        assert flat[key] == pytest.approx(v, rel=1e-9, abs=1e-12), key
    assert flat["total_tokens_eval_sparsity_variance"] == 200
    # explained variance is 1 - FVU (variance about the mean), in original units
    assert flat["explained_variance"] == pytest.approx(1 - float(sae(x).fvu.detach()), rel=1e-9)
    one_batch = core_metrics(sae, x, batch_size=4096)
    for cat in got:
        assert one_batch[cat] == pytest.approx(got[cat], rel=1e-9), cat


def test_saebench_literal_explained_variance_over_equal_batches():
    """SAEBench's batched code, transcribed: per batch ``mean_sum_of_squares`` and ``mean_act_per_dimension``
    (``x.pow(2).mean(0)``), concatenated and averaged, then ``1 - mean resid / (mss - mapd^2)``; on equal batches it
    equals the pooled value core_metrics reports, and differs from the conventional one when E[x] != 0."""
    sae = _sae()
    x = 3 * torch.randn(240, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) + 1.5
    mss, mapd, resid = [], [], []
    for s in range(0, 240, 60):
        xb = x[s:s + 60]
        xh = sae(xb).sae_out.detach()
        mss.append(xb.pow(2).sum(-1).mean(0).reshape(1))
        mapd.append(xb.pow(2).mean(0))
        resid.append((xb - xh).pow(2).sum(-1).mean(0).reshape(1))
    total = torch.cat(mss).mean() - torch.cat(mapd).mean() ** 2
    want = float(1 - torch.cat(resid).mean() / total)
    got = core_metrics(sae, x)["reconstruction_quality"]
    assert got["explained_variance_saebench_literal"] == pytest.approx(want, rel=1e-12)
    assert abs(got["explained_variance_saebench_literal"] - got["explained_variance"]) > 1e-3


def test_core_metrics_of_the_identity_sae():
    x = torch.randn(64, 4, dtype=torch.float64)
    m = core_metrics(identity_sae(4, torch.float64), x)
    assert m["reconstruction_quality"]["explained_variance"] == pytest.approx(1.0)
    assert m["reconstruction_quality"]["mse"] == pytest.approx(0.0, abs=1e-24)
    assert m["shrinkage"]["l2_ratio"] == pytest.approx(1.0)
    assert m["shrinkage"]["relative_reconstruction_bias"] == pytest.approx(1.0)
    assert m["sparsity"]["l1"] == pytest.approx(float(x.abs().sum(1).mean()))  # |x_i| on one of +-e_i each


def test_average_max_cosine_sim_by_hand():
    rows = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, -2.0]])
    # row 0: max(cos 45°, 0) ; row 1: cos 45° ; row 2: max(0, cos 135°) = 0
    assert average_max_cosine_sim(rows) == pytest.approx((math.sqrt(0.5) * 2 + 0.0) / 3)
    with pytest.raises(ValueError, match="n >= 2"):
        average_max_cosine_sim(rows[:1])


def test_explained_variance_matches_saelens_calculator():
    sae_lens_evals = pytest.importorskip("sae_lens.evals")
    sae = _sae()
    x = 3 * torch.randn(300, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) + 1.5
    calc = sae_lens_evals.ExplainedVarianceCalculator()
    for s in range(0, 300, 64):
        calc.add_batch(sae_output=sae(x[s:s + 64]).sae_out.detach(), hidden_acts=x[s:s + 64])
    assert core_metrics(sae, x)["reconstruction_quality"]["explained_variance"] == pytest.approx(calc.compute(),
                                                                                               rel=1e-9)


# ----------------------------------------------------------------------------- KL / CE scores and evaluate_sae
@pytest.fixture(scope="module")
def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=40, n_positions=32)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_kl_ce_scores_match_a_hand_computation(tiny_gpt2):
    from mlpinterp.lm.recovery import kl_ce_scores

    ids = torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(5))
    ids[:, 0] = 0  # a "BOS" to ignore
    fn = lambda h: 0.5 * h + 0.1  # noqa: E731
    tiny_gpt2 = copy.deepcopy(tiny_gpt2).double()  # float64 logits: the hand computation below is float64 too
    got = kl_ce_scores(tiny_gpt2, "transformer.h.0.mlp", fn, ids, ignore_ids=[0])

    def logits_with(f):
        handle = tiny_gpt2.get_submodule("transformer.h.0.mlp").register_forward_hook(
            lambda m, i, o: f(o) if f else None)
        try:
            with torch.no_grad():
                return tiny_gpt2(input_ids=ids).logits.double().numpy()
        finally:
            handle.remove()

    clean, sae, zero = logits_with(None), logits_with(fn), logits_with(torch.zeros_like)

    def logp(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lp = logp(clean)
    kl = {}
    ce = {"clean": [], "sae": [], "abl": []}
    for name, other in (("sae", sae), ("abl", zero)):
        lq = logp(other)
        kl[name] = np.mean([(np.exp(lp[b, t]) * (lp[b, t] - lq[b, t])).sum()
                            for b in range(3) for t in range(12) if ids[b, t] != 0])
    for name, z in (("clean", clean), ("sae", sae), ("abl", zero)):
        lq = logp(z)
        ce[name] = np.mean([-lq[b, t, ids[b, t + 1]] for b in range(3) for t in range(11) if ids[b, t] != 0])
    mb, mp = got["model_behavior_preservation"], got["model_performance_preservation"]
    assert mb["kl_div_with_sae"] == pytest.approx(kl["sae"], rel=1e-8)
    assert mb["kl_div_with_ablation"] == pytest.approx(kl["abl"], rel=1e-8)
    assert mb["kl_div_score"] == pytest.approx((kl["abl"] - kl["sae"]) / kl["abl"], rel=1e-8)
    assert mp["ce_loss_without_sae"] == pytest.approx(ce["clean"], rel=1e-10)
    assert mp["ce_loss_with_sae"] == pytest.approx(ce["sae"], rel=1e-10)
    assert mp["ce_loss_score"] == pytest.approx((ce["abl"] - ce["sae"]) / (ce["abl"] - ce["clean"]), rel=1e-8)
    assert got["token_stats"]["total_tokens_eval_reconstruction"] == int((ids != 0).sum())


def test_evaluate_sae_on_a_causal_lm_and_refuses_another_hook_point(tiny_gpt2):
    ids = torch.randint(1, 40, (4, 10), generator=torch.Generator().manual_seed(6))
    sae = identity_sae(16)
    sae.hook_point = "transformer.h.0.mlp"
    m = evaluate_sae(sae, tiny_gpt2, ids)
    assert m["model_behavior_preservation"]["kl_div_score"] == pytest.approx(1.0)
    assert m["model_behavior_preservation"]["kl_div_with_sae"] == pytest.approx(0.0, abs=1e-6)
    assert m["model_performance_preservation"]["ce_loss_score"] == pytest.approx(1.0, abs=1e-5)
    assert m["reconstruction_quality"]["explained_variance"] == pytest.approx(1.0)
    assert m["token_stats"] == {"total_tokens_eval_sparsity_variance": 40, "total_tokens_eval_reconstruction": 40}
    with pytest.raises(ValueError, match="trained on hook point 'transformer.h.0.mlp', not 'transformer.h.1.mlp'"):
        evaluate_sae(sae, tiny_gpt2, ids, hook_point="transformer.h.1.mlp")
    with pytest.warns(UserWarning, match="used anyway"):
        evaluate_sae(sae, tiny_gpt2, ids, hook_point="transformer.h.1.mlp", allow_mismatch=True)
    sae.hook_point = None
    with pytest.raises(ValueError, match="records no hook point"):
        evaluate_sae(sae, tiny_gpt2, ids)


def test_evaluate_sae_on_an_encoder_reports_embedding_cosine():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                                          intermediate_size=32, vocab_size=50)).eval()
    ids = torch.randint(3, 50, (4, 9), generator=torch.Generator().manual_seed(7))
    ids[:, 0] = 1
    sae = identity_sae(16)
    sae.hook_point = "encoder.layer.0.output"
    m = evaluate_sae(sae, bert, ids, special_ids=[1])
    e = m["embedding_preservation"]
    assert e["embedding_cossim_with_sae"] == pytest.approx(1.0, abs=1e-6) and e["embedding_cossim_score"] == pytest.approx(1.0, abs=1e-5)
    assert e["embedding_cossim_with_ablation"] < 0.999
    assert m["token_stats"]["total_tokens_eval_sparsity_variance"] == 32  # the 4 [CLS]-like positions left out
    assert "model_behavior_preservation" not in m
