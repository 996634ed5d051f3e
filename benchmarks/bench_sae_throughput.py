"""TopK SAE training throughput (activations / s): ours vs SAELens and EleutherAI sparsify.

Setting of issue 6: d_in 384, d_sae 3072, k 32, batch 4096, Adam, unit-norm decoder, one CPU thread by
default (``--threads``). Every implementation trains on the same random batches for the same number of
steps in the same run; ratios are ours / theirs.

SAELens and sparsify run in a subprocess of ``--other-python`` (default: this interpreter, which has them after
``make install-test``, i.e. the ``interop`` extra: sae-lens 6.54.12, eai-sparsify 1.3.3 on this project's CPU torch).
When that interpreter or a package is missing, the comparison is skipped and the reason printed.

Usage: ``python benchmarks/bench_sae_throughput.py [--steps 5] [--threads 1]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

D_IN, D_SAE, K, BATCH = 384, 3072, 32, 4096

_OTHER = r'''
import json, sys, time, torch
steps, threads, which = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(threads)
D_IN, D_SAE, K, BATCH = 384, 3072, 32, 4096
g = torch.Generator().manual_seed(0)
data = [torch.randn(BATCH, D_IN, generator=g) for _ in range(4)]
if which == "sparsify":
    from sparsify import Sae, SaeConfig
    sae = Sae(D_IN, SaeConfig(num_latents=D_SAE, k=K), device="cpu")
    opt = torch.optim.Adam(sae.parameters(), lr=1e-4)
    def step(x):
        out = sae(x)
        out.fvu.backward()
        sae.remove_gradient_parallel_to_decoder_directions()
        opt.step(); opt.zero_grad()
        sae.set_decoder_norm_to_unit_norm()
else:
    from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
    cfg = TopKTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, k=K, device="cpu", dtype="float32")
    sae = TopKTrainingSAE(cfg)
    opt = torch.optim.Adam(sae.parameters(), lr=1e-4)
    from sae_lens.saes.sae import TrainStepInput
    def step(x):
        out = sae.training_forward_pass(TrainStepInput(sae_in=x, coefficients={}, dead_neuron_mask=None,
                                                       n_training_steps=0, is_logging_step=False))
        out.loss.backward()
        opt.step(); opt.zero_grad()
for i in range(2):
    step(data[i % 4])
t = time.perf_counter()
for i in range(steps):
    step(data[i % 4])
dt = time.perf_counter() - t
print(json.dumps({"acts_per_s": steps * BATCH / dt, "s_per_step": dt / steps}))
'''


def bench_ours(steps: int, threads: int) -> dict:
    import torch

    from mlpinterp.sae.topk import SaeConfig, TopKSae

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    data = [torch.randn(BATCH, D_IN, generator=g) for _ in range(4)]
    sae = TopKSae(D_IN, SaeConfig(d_sae=D_SAE, k=K), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(sae.parameters(), lr=1e-4)

    def step(x):
        out = sae(x)
        out.fvu.backward()
        sae.remove_gradient_parallel_to_decoder_directions()
        opt.step()
        opt.zero_grad()
        sae.set_decoder_norm_to_unit_norm()

    for i in range(2):
        step(data[i % 4])
    t = time.perf_counter()
    for i in range(steps):
        step(data[i % 4])
    dt = time.perf_counter() - t
    return {"acts_per_s": steps * BATCH / dt, "s_per_step": dt / steps}


def bench_other(python: str, which: str, steps: int, threads: int) -> dict:
    if not os.path.exists(python):
        return {"skipped": f"{python} does not exist (see this file's docstring to create it)"}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    p = subprocess.run([python, "-c", _OTHER, str(steps), str(threads), which], capture_output=True, text=True,
                       env=env, timeout=900)
    if p.returncode != 0:
        return {"skipped": f"{which} failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


_LAYOUT_CHECK = r'''
import json, sys, torch
d = torch.load(sys.argv[1] + "/xy.pt")
res = {}
from sparsify import Sae
res["sparsify_max_abs_diff"] = float((Sae.load_from_disk(sys.argv[1] + "/sparsify")(d["x"]).sae_out - d["y"]).abs().max())
from sae_lens import SAE
res["saelens_max_abs_diff"] = float((SAE.load_from_disk(sys.argv[1] + "/saelens")(d["x"]) - d["y"]).abs().max())
print(json.dumps(res))
'''


def check_layouts(python: str) -> dict:
    """Save one of our SAEs in both layouts and let sparsify / SAELens load it and reproduce its output."""
    import tempfile

    import torch

    from mlpinterp.sae.io import save_sae
    from mlpinterp.sae.topk import SaeConfig, TopKSae

    if not os.path.exists(python):
        return {"skipped": f"{python} does not exist"}
    with tempfile.TemporaryDirectory() as tmp:
        sae = TopKSae(D_IN, SaeConfig(d_sae=D_SAE, k=K), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            sae.encoder.bias.normal_(generator=torch.Generator().manual_seed(2))
            sae.b_dec.normal_(generator=torch.Generator().manual_seed(3))
        save_sae(sae, f"{tmp}/sparsify")
        save_sae(sae, f"{tmp}/saelens", layout="saelens")
        x = torch.randn(256, D_IN, generator=torch.Generator().manual_seed(4))
        torch.save({"x": x, "y": sae(x).sae_out.detach()}, f"{tmp}/xy.pt")
        p = subprocess.run([python, "-c", _LAYOUT_CHECK, tmp], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return {"skipped": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else str(p.returncode)}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--other-python", default=sys.executable)
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    res = {"setting": {"d_in": D_IN, "d_sae": D_SAE, "k": K, "batch": BATCH, "threads": args.threads,
                       "steps": args.steps}}
    res["ours"] = bench_ours(args.steps, args.threads)
    for which in ("sparsify", "saelens"):
        res[which] = bench_other(args.other_python, which, args.steps, args.threads)
    print(f"TopK SAE training, d_in={D_IN} d_sae={D_SAE} k={K} batch={BATCH}, {args.threads} thread(s)")
    print(f"  ours      {res['ours']['acts_per_s']:10.0f} act/s  ({res['ours']['s_per_step'] * 1e3:.0f} ms/step)")
    best = 0.0
    for which in ("sparsify", "saelens"):
        r = res[which]
        if "skipped" in r:
            print(f"  {which:9s} skipped: {r['skipped']}")
            continue
        best = max(best, r["acts_per_s"])
        print(f"  {which:9s} {r['acts_per_s']:10.0f} act/s  ({r['s_per_step'] * 1e3:.0f} ms/step)  "
              f"ratio ours/{which} = {res['ours']['acts_per_s'] / r['acts_per_s']:.2f}x")
    if best:
        res["ratio_vs_fastest"] = res["ours"]["acts_per_s"] / best
        print(f"  ratio vs the faster of the two: {res['ratio_vs_fastest']:.2f}x")
    res["layouts"] = check_layouts(args.other_python)
    print(f"  artefacts loaded by the other libraries, output max |diff|: {res['layouts']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
