"""Benchmark: function space at the widths labs use (random-weight one-layer FFN blocks, MLP and GLU).

Widths (d_model, d_ff): GPT-2 small (768, 3072), GPT-2 medium (1024, 4096), Llama-7B (4096, 11008). Per width and
block type, each step's wall time, CPU time (all threads of the process) and peak resident memory (sampled every
5 ms during the step; the whole process, so it includes what earlier steps keep):

1. ``from_hf``: a Hugging Face block with random weights (``GPT2MLP``, ``gelu_new``, for the MLP; ``LlamaMLP``,
   SiLU, for the GLU) imported as a float64 network (checked against the block's own forward).
2. ``gaussian``: ``Gaussian.from_data`` on 8,192 inputs (a random low-rank-plus-diagonal law, so the covariance is
   full rank but not white).
3. ``fit1`` / ``fit2``: ``fit_polynomial`` of degree 1 and 2 under that Gaussian.
4. ``fvu1`` / ``fvu2``: ``fvu`` of each: exact for the MLP (the Hermite tails of the network's output covariance,
   blocked over neuron rows; the first call forms them for degrees 1 and 2 together, so ``fvu2`` reuses them),
   streamed Monte Carlo with its standard error for the GLU (``--mc-samples`` draws; no exact GLU route, see
   :mod:`mlpinterp.poly.fvu_exact`).

Each (width, block) runs in a fresh subprocess, so the peak RSS of one row is its own. Goal (issue 34): the
Llama-7B rows in <= 5 min and <= 8 GB peak on the 2-core CPU. Output: one JSON line per row on stdout and, with
``--markdown``, a table.

Run: ``python benchmarks/bench_ffn_scale.py --widths gpt2-small gpt2-medium`` (minutes);
``--widths llama-7b`` needs about 5 GB free memory and a few minutes per block type.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

WIDTHS = {"gpt2-small": (768, 3072), "gpt2-medium": (1024, 4096), "llama-7b": (4096, 11008)}
STEPS = ("from_hf", "gaussian", "fit1", "fit2", "fvu1", "fvu2")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Step:
    """Wall, CPU and peak RSS of a ``with`` block (RSS sampled by a thread every 5 ms)."""

    def __init__(self, record: dict, name: str):
        self.record, self.name = record, name

    def __enter__(self):
        self.peak, self.stop = _rss(), False

        def sample():
            while not self.stop:
                self.peak = max(self.peak, _rss())
                time.sleep(0.005)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        self.stop = True
        self.thread.join()
        self.record[self.name] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                                  "peak_rss_gb": round(max(self.peak, _rss()) / 1e9, 2)}
        print(json.dumps({"step": self.name, **self.record[self.name]}), file=sys.stderr, flush=True)  # progress


def _block(kind: str, d: int, h: int):
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "mlp":
        from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

        cfg = transformers.GPT2Config(n_embd=d, n_inner=h, activation_function="gelu_new")
        block = GPT2MLP(h, cfg)
    else:
        from transformers.models.llama.modeling_llama import LlamaMLP

        cfg = transformers.LlamaConfig(hidden_size=d, intermediate_size=h, hidden_act="silu")
        block = LlamaMLP(cfg)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 1.0 / np.sqrt(p.shape[-1]))
    return torch.nn.ModuleDict({"mlp": block}).eval()


def run_one(width: str, kind: str, mc_samples: int) -> dict:
    import torch

    import mlpinterp as mi

    torch.set_num_threads(os.cpu_count() or 1)
    d, h = WIDTHS[width]
    rec: dict = {"width": width, "block": kind, "d_model": d, "d_ff": h}
    model = _block(kind, d, h)
    with _Step(rec, "from_hf"):
        net = mi.from_hf(model, "mlp")
    del model
    rng = np.random.default_rng(1)
    k = min(64, d)
    X = rng.standard_normal((8192, k)) @ (rng.standard_normal((k, d)) / np.sqrt(k)) + 0.5 * rng.standard_normal((8192, d))
    with _Step(rec, "gaussian"):
        g = mi.Gaussian.from_data(X)
    del X
    for n in (1, 2):
        with _Step(rec, f"fit{n}"):
            p = mi.fit_polynomial(net, g, n)
        with _Step(rec, f"fvu{n}"):
            r = mi.fvu(net, p, g, n_samples=mc_samples, seed=0)
        rec[f"fvu{n}"].update(fvu=r.fvu, stderr=r.stderr, method=r.method, error_bound=r.error_bound,
                              n_samples=r.n_samples)
        del p
    rec["total_wall_s"] = round(sum(rec[s]["wall_s"] for s in STEPS), 1)
    rec["total_cpu_s"] = round(sum(rec[s]["cpu_s"] for s in STEPS), 1)
    rec["peak_rss_gb"] = max(rec[s]["peak_rss_gb"] for s in STEPS)
    return rec


def markdown(rows: list[dict]) -> str:
    head = "| width | block | " + " | ".join(STEPS) + " | total | peak RSS | FVU deg 1 | FVU deg 2 |"
    out = [head, "|" + "---|" * (len(STEPS) + 6)]
    for r in rows:
        cells = [f"{r[s]['wall_s']:.1f} s ({r[s]['cpu_s']:.1f}), {r[s]['peak_rss_gb']:.1f} GB" for s in STEPS]
        fv = []
        for n in (1, 2):
            e = r[f"fvu{n}"]
            tail = f" ± {e['stderr']:.2g} (MC, n={e['n_samples']})" if e["method"] == "monte-carlo" else \
                f" (exact, bound {e['error_bound']:.1g})"
            fv.append(f"{e['fvu']:.4g}{tail}")
        out.append(f"| {r['width']} ({r['d_model']}, {r['d_ff']}) | {r['block']} | " + " | ".join(cells)
                   + f" | {r['total_wall_s']:.0f} s ({r['total_cpu_s']:.0f}) | {r['peak_rss_gb']:.1f} GB | "
                   + " | ".join(fv) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", nargs="+", default=["gpt2-small", "gpt2-medium"], choices=list(WIDTHS))
    ap.add_argument("--blocks", nargs="+", default=["mlp", "glu"], choices=["mlp", "glu"])
    ap.add_argument("--mc-samples", type=int, default=4096, help="Monte Carlo draws of the GLU FVUs")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table at the end")
    ap.add_argument("--one", nargs=2, metavar=("WIDTH", "BLOCK"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one[0], a.one[1], a.mc_samples)), flush=True)
        return
    rows = []
    for width in a.widths:
        for kind in a.blocks:
            out = subprocess.run([sys.executable, __file__, "--one", width, kind, "--mc-samples", str(a.mc_samples)],
                                 stdout=subprocess.PIPE, text=True)  # per-step progress goes to stderr as it comes
            if out.returncode != 0:
                print(json.dumps({"width": width, "block": kind, "error": f"exit status {out.returncode}"}), flush=True)
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.markdown and rows:
        print(markdown(rows))


if __name__ == "__main__":
    main()
