"""TopK SAE recipes side by side in one process: held-out FVU, dead latents and tokens per CPU-second.

Setting: MiniLM (``load_model("minilm")``) at ``encoder.layer.3.output`` (d_in 384); training tokens from the
bundled corpora except the held-out files (``split_files``: wikitext-2 test), 2,000 chunks of 128 tokens drawn
at random (special tokens dropped: 252,000 tokens); held out: the first 50,000 content tokens of wikitext-2
test. d_sae 3072, k 32, batch 4096, 80 steps; every implementation trains on the same batches
(:func:`mlpinterp.sae.cached.shuffled_batches`, seed 0).

Implementations:

* ``ours-old``: Adam at ``2e-4 / sqrt(d_sae / 2^14)``, constant, AuxK 1/32 (:class:`MfrConfig` with
  ``optimizer="adam"``);
* ``ours-new``: the default :class:`MfrConfig` recipe (schedule-free Signum at sparsify's lr with the average
  weighted linearly in the step, AuxK 1/32 on latents silent for 20,000 samples; see :mod:`mlpinterp.sae.optim`);
* ``sparsify``: EleutherAI sparsify 1.3.3's default ``TrainConfig`` recipe with its own ``SparseCoder``,
  ``SignSGD`` and ``schedulefree.ScheduleFreeWrapper(momentum=0.95)``, lr ``5e-3 / sqrt(d_sae / 2^14)``, no
  AuxK, ``b_dec`` = first batch mean, decoder renormalised before every step; its training loop
  (``Trainer.fit``'s hook) is reproduced step by step here because the library's ``Trainer`` reads a model and a
  token dataset, not activations; evaluated at the schedule-free average (``optimizer.eval()``, as its
  checkpoints are written);
* ``saelens``: SAELens 6 ``TopKTrainingSAE`` with its defaults, Adam at the same lr (``--saelens`` to include it).

Every SAE is evaluated by the one plain function :func:`plain_eval` (FVU = ``sum ||x - x_hat||^2 /
sum ||x - mean x||^2`` over the held-out tokens; dead latents = fraction of latents that never fire on them).
CPU time is ``time.process_time`` of the training steps only (the machine may be shared; wall time beside it).

Usage: ``python benchmarks/bench_sae_vs_sparsify.py [--cache FILE] [--steps 80] [--threads 1] [--seeds 0 1 2]
[--saelens] [--only NAME ...] [--variants JSON] [--out results.json]``. The first run writes ``--cache`` (an
``--activations`` file for ``mlpinterp sae train``); later runs read it. Beside the table it prints, for every
implementation, the per-seed ratios to sparsify run in the same process (FVU, tokens per CPU-second) and the
difference of dead-latent fractions, as mean ± s.e.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

D_SAE, K, BATCH, HOOK = 3072, 32, 4096, "encoder.layer.3.output"
N_TRAIN_CHUNKS, N_TEST_TOKENS, CTX = 2000, 50_000, 128


def build_activations(path: Path, text_dir: Path | None = None) -> None:
    """Read the setting's activations from MiniLM and write them to ``path`` (``train``, ``test``)."""
    from mlpinterp.lm.hooks import hook_activations
    from mlpinterp.lm.models import load_model
    from mlpinterp.lm.text import read_texts, split_files, token_chunks
    from mlpinterp.sae.cached import write_activations

    net, tok = load_model("minilm")
    train_files, held_files = split_files(text_dir)
    special = torch.tensor(sorted(set(tok.all_special_ids)))

    def acts(ids: torch.Tensor) -> torch.Tensor:
        out = []
        for s in range(0, ids.shape[0], 32):
            b = ids[s:s + 32]
            h = hook_activations(net, HOOK, b, torch.ones_like(b))
            out.append(h[~torch.isin(b, special)].float())
        return torch.cat(out)

    chunks = token_chunks(tok, read_texts(train_files), CTX)
    pick = torch.randperm(chunks.shape[0], generator=torch.Generator().manual_seed(0))[:N_TRAIN_CHUNKS]
    train = acts(chunks[pick])
    test_chunks = token_chunks(tok, read_texts(held_files), CTX, math.ceil(N_TEST_TOKENS / (CTX - 2)))
    test = acts(test_chunks)[:N_TEST_TOKENS]
    write_activations(path, train, test, model_name="sentence-transformers/all-MiniLM-L6-v2", hook_point=HOOK,
                      train_files=[f.name for f in train_files], test_files=[f.name for f in held_files],
                      train_chunks=N_TRAIN_CHUNKS, ctx_len=CTX)


@torch.no_grad()
def plain_eval(encode_decode, x: torch.Tensor, d_sae: int, batch: int = 8192) -> dict:
    """FVU and dead-latent fraction of ``encode_decode(x) -> (x_hat, indices [n, k], acts [n, k])`` on ``x``,
    accumulated in float64."""
    resid, fired = 0.0, torch.zeros(d_sae, dtype=torch.bool)
    mean = x.double().mean(0)
    total = float((x.double() - mean).pow(2).sum())
    for s in range(0, x.shape[0], batch):
        xb = x[s:s + batch]
        x_hat, idx, acts = encode_decode(xb)
        resid += float((xb.double() - x_hat.double()).pow(2).sum())
        fired[idx[acts > 0]] = True
    return {"fvu": resid / total, "dead": float((~fired).double().mean()), "n_eval": int(x.shape[0])}


def _timed(step, batches, steps: int) -> dict:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step(next(batches))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"cpu_s": cpu, "wall_s": wall, "tokens": steps * BATCH, "tokens_per_cpu_s": steps * BATCH / cpu}


def run_ours(data, steps: int, optimizer: str, seed: int, **config) -> dict:
    from mlpinterp.sae.cached import shuffled_batches
    from mlpinterp.sae.mfr import MfrConfig, MfrTrainer
    from mlpinterp.sae.topk import SaeConfig

    cfg = MfrConfig(sae=SaeConfig(d_sae=D_SAE, k=K), n_saes=1, penalty=False, reinit=False, seed=seed,
                    **{"optimizer": optimizer, **config})
    tr = MfrTrainer(data.d_in, cfg)
    res = _timed(tr.train_step, shuffled_batches(data.train, BATCH, seed=0), steps)

    def ed(x):
        out = sae(x)
        return out.sae_out, out.latent_indices, out.latent_acts

    with tr.averaged() as (sae,):
        return {**res, **plain_eval(ed, data.test, D_SAE), "lr": tr.lr}


def run_sparsify(data, steps: int, seed: int) -> dict:
    from schedulefree import ScheduleFreeWrapper
    from sparsify import SparseCoder, SparseCoderConfig
    from sparsify.sign_sgd import SignSGD

    torch.manual_seed(seed)
    sae = SparseCoder(data.d_in, SparseCoderConfig(num_latents=D_SAE, k=K), device="cpu")
    lr = 5e-3 / (sae.num_latents / 2**14) ** 0.5
    opt = ScheduleFreeWrapper(SignSGD([{"params": sae.parameters(), "lr": lr}]), momentum=0.95)
    opt.train()
    state = {"step": 0}

    def step(x):
        if state["step"] == 0:
            sae.b_dec.data = x.mean(0).to(sae.dtype)
        sae.set_decoder_norm_to_unit_norm()
        out = sae(x)
        out.fvu.backward()
        sae.remove_gradient_parallel_to_decoder_directions()
        opt.step()
        opt.zero_grad()
        state["step"] += 1

    from mlpinterp.sae.cached import shuffled_batches

    res = _timed(step, shuffled_batches(data.train, BATCH, seed=0), steps)
    opt.eval()

    def ed(x):
        out = sae(x)
        return out.sae_out, out.latent_indices, out.latent_acts

    return {**res, **plain_eval(ed, data.test, D_SAE), "lr": lr}


def run_saelens(data, steps: int, seed: int) -> dict:
    from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepInput

    from mlpinterp.sae.cached import shuffled_batches

    torch.manual_seed(seed)
    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=data.d_in, d_sae=D_SAE, k=K, device="cpu", dtype="float32"))
    lr = 2e-4 / (D_SAE / 2**14) ** 0.5
    opt = torch.optim.Adam(sae.parameters(), lr=lr)

    def step(x):
        out = sae.training_forward_pass(TrainStepInput(sae_in=x, coefficients={}, dead_neuron_mask=None,
                                                       n_training_steps=0, is_logging_step=False))
        out.loss.backward()
        opt.step()
        opt.zero_grad()

    res = _timed(step, shuffled_batches(data.train, BATCH, seed=0), steps)

    @torch.no_grad()
    def ed(x):
        feats = sae.encode(x)
        vals, idx = feats.topk(K, dim=-1)
        return sae.decode(feats), idx, vals

    return {**res, **plain_eval(ed, data.test, D_SAE), "lr": lr}


def paired_vs_sparsify(results: list[dict]) -> dict:
    """For every implementation run beside ``sparsify`` on the same seeds: the per-seed ratios of held-out FVU and
    of tokens per CPU-second to sparsify's and the difference of dead-latent fractions, as mean ± s.e. strings."""
    from mlpinterp.studies.report.stats import mean_se

    ref = {r["seed"]: r for r in results if r["impl"] == "sparsify"}
    out = {}
    for name in dict.fromkeys(r["impl"] for r in results if r["impl"] != "sparsify"):
        rows = [(r, ref[r["seed"]]) for r in results if r["impl"] == name and r["seed"] in ref]
        if not rows:
            continue
        ratios = [r["fvu"] / s["fvu"] for r, s in rows]
        out[name] = {"n": len(rows), "fvu_ratio": mean_se(ratios, ".4f"),
                     "fvu_ratio_per_seed": ", ".join(f"{v:.4f}" for v in ratios),
                     "dead_diff": mean_se([r["dead"] - s["dead"] for r, s in rows], ".4f"),
                     "speed_ratio": mean_se([r["tokens_per_cpu_s"] / s["tokens_per_cpu_s"] for r, s in rows], ".2f")}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=Path("runs/bench_sae_vs_sparsify/minilm_l3_acts.safetensors"))
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--saelens", action="store_true")
    p.add_argument("--only", nargs="*", default=None, help="run only these of the base implementations (variants always run)")
    p.add_argument("--build-only", action="store_true")
    p.add_argument("--text-dir", type=Path, default=None, help="corpora (default: the bundled ../shared/data/text)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--variants", type=json.loads, default={},
                   help='extra runs of the default recipe with other MfrConfig fields: \'{"name": {"lr": 0.02}}\'')
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from mlpinterp.sae.cached import read_activations
    from mlpinterp.utils.artifact import tensors_path

    if not tensors_path(a.cache).exists():
        t0, c0 = time.perf_counter(), time.process_time()
        build_activations(a.cache, a.text_dir)
        print(f"cached activations -> {a.cache} ({time.perf_counter() - t0:.0f} s wall, "
              f"{time.process_time() - c0:.0f} s CPU)", flush=True)
    if a.build_only:
        return
    data = read_activations(tensors_path(a.cache))
    print(f"train {list(data.train.shape)}, test {list(data.test.shape)}", flush=True)
    runs = {"ours-old": lambda s: run_ours(data, a.steps, "adam", s),
            "ours-new": lambda s: run_ours(data, a.steps, "signum_schedulefree", s),
            "sparsify": lambda s: run_sparsify(data, a.steps, s)}
    for vname, fields in a.variants.items():
        runs[f"ours-new:{vname}"] = lambda s, f=fields: run_ours(data, a.steps, "signum_schedulefree", s, **f)
    if a.saelens:
        runs["saelens"] = lambda s: run_saelens(data, a.steps, s)
    results = []
    for seed in a.seeds:
        for name, fn in runs.items():
            if a.only is not None and name not in a.only and not name.startswith("ours-new:"):
                continue
            r = {"impl": name, "seed": seed, **fn(seed)}
            results.append(r)
            print(json.dumps(r), flush=True)
    print("| implementation | seed | held-out FVU | dead latents | tokens/CPU-s | CPU s | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['impl']} | {r['seed']} | {r['fvu']:.4f} | {r['dead']:.4f} | {r['tokens_per_cpu_s']:,.0f} | "
              f"{r['cpu_s']:.1f} | {r['wall_s']:.1f} |")
    paired = paired_vs_sparsify(results)
    for name, row in paired.items():
        print(f"{name} / sparsify, paired by seed (n = {row['n']}): FVU ratio {row['fvu_ratio']} "
              f"(per seed {row['fvu_ratio_per_seed']}), dead latents difference {row['dead_diff']}, "
              f"tokens per CPU-second {row['speed_ratio']}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
