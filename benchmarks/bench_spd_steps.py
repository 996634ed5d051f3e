"""Benchmark: SPD step time per preset on the CPU, beside APD's on the same toy (same shapes, untrained targets).

    OMP_NUM_THREADS=1 nice python benchmarks/bench_spd_steps.py [--settings tms-5-2 resid-mlp-1] [--steps 20]
        [--presets paper quick] [--threads 1] [--device cuda] [--variants compiled fused-compiled ...]
        [--repeats 3] [--no-apd]

For each setting and preset it prints SPD's ms/step (wall and CPU seconds of this process) for each variant of the
causal-importance MLPs, the step's hot path, measured side by side in one process, the variants interleaved
``--repeats`` times (one line per variant with every repetition, then the median):

- ``compiled``: autograd of the formula through ``torch.compile`` (the presets' ``compile=True``);
- ``eager``: the same without compilation (``--no-compile``);
- ``fused-compiled`` / ``fused-eager``: the fused autograd Function that recomputes the hidden layer in the backward
  pass (``spd/importance_fused.py``), compiled or in cache-sized row blocks;
- ``every-row``: ``compiled`` with every row through the MLPs instead of the all-zero rows once
  (``importance.SKIP_ZERO_ROWS``).

Then APD's at its own preset of the same toy (where APD has one; ``--no-apd`` skips it), their ratio per step and per
sample, and the extrapolation of the first variant to the preset's full step count. Every variant's final losses
after the timed run are printed (equal results: the same to float32 rounding). The machine's load average is printed
with every row (a shared CPU inflates wall times; CPU time counts this process only). ``--device cuda``: the same on
a GPU (each timing ends with ``torch.cuda.synchronize``; the batches are drawn on the CPU and moved, as in a run), the
GPU's name in every row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from mlpinterp.apd import decompose as apd_decompose
from mlpinterp.apd import with_overrides as apd_overrides
from mlpinterp.spd import decompose, importance
from mlpinterp.studies.apd.settings import PRESETS as APD_PRESETS
from mlpinterp.studies.apd.settings import QUICK as APD_QUICK
from mlpinterp.studies.spd.settings import SETTINGS, spd_config
from mlpinterp.toys import RESID_PRESETS, TMS, TMS_PRESETS, as_linears, build_resid_mlp, step_generator, with_identity
from mlpinterp.toys.settings import setting_spec


def _toy(name: str):
    base = name.removesuffix("-id")
    if base in TMS_PRESETS:
        tms = TMS(TMS_PRESETS[base].n_features, TMS_PRESETS[base].d_hidden)
        return tms, as_linears(with_identity(tms) if name.endswith("-id") else tms)
    m = build_resid_mlp(RESID_PRESETS[base])
    return m, m


VARIANTS = {"compiled": (True, False, True), "eager": (False, False, True), "fused-compiled": (True, True, True),
            "fused-eager": (False, True, True), "every-row": (True, False, False)}
"""name -> (compile, fused, skip zero rows)."""


def _time(run, steps: int, device: str = "cpu") -> tuple[float, float, dict]:
    """``(wall, cpu, logs)``: seconds per step of ``run(n)`` (a whole decomposition of ``n`` steps, returning its
    last logs), ``(T(steps) - T(2)) / (steps - 2)`` so that the per-run setup (copies to the device, configuration
    checks), which a 3 ms GPU step would not amortise over 20 steps, cancels; CPU seconds of this process alike."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def timed(n: int) -> tuple[float, float, dict]:
        sync()
        t, c = time.perf_counter(), time.process_time()
        logs = run(n)
        sync()
        return time.perf_counter() - t, time.process_time() - c, logs

    w2, c2, _ = timed(2)
    wn, cn, logs = timed(steps)
    return (wn - w2) / (steps - 2), (cn - c2) / (steps - 2), logs


def _set_variant(name: str) -> bool:
    compile, fused, skip = VARIANTS[name]
    importance.FUSED[compile] = fused
    importance.FUSED_EAGER_MIN_WIDTH = 0  # the variant's choice on every site
    importance.SKIP_ZERO_ROWS = skip
    return compile


def measure(name: str, quick: bool, steps: int, device: str = "cpu", variants=("compiled",), repeats: int = 1,
            apd: bool = True) -> dict:
    """SPD seconds per step of each variant (interleaved ``repeats`` times; wall and CPU) on an untrained toy of
    ``name``, and, where APD has a preset for the setting and ``apd``, APD's."""
    toy, model = _toy(name)
    toy.requires_grad_(False)
    model.requires_grad_(False)
    spec = setting_spec(name.removesuffix("-id"))
    full = spd_config(name, quick, 0)
    sample = lambda step: spec.sample(full.batch_size, step_generator(0, step))

    def run(n: int, variant: str) -> dict:
        c = _set_variant(variant)
        res = decompose(model, sample, spd_config(name, quick, 0, steps=n, log_every=10**9, compile=c), quiet=True,
                        device=device)
        return res.history[-1]

    defaults = dict(importance.FUSED), importance.SKIP_ZERO_ROWS, importance.FUSED_EAGER_MIN_WIDTH
    try:
        for v in variants:
            run(2, v)  # warm-up (allocator, first-call dispatch, compilation)
        times = {v: [] for v in variants}
        for _ in range(repeats):
            for v in variants:
                times[v].append(_time(lambda n, v=v: run(n, v), steps, device))
    finally:
        importance.FUSED.update(defaults[0])
        importance.SKIP_ZERO_ROWS, importance.FUSED_EAGER_MIN_WIDTH = defaults[1:]
    sec = statistics.median(t[0] for t in times[variants[0]])
    row = {"setting": name, "batch_size": full.batch_size, "C": full.C, "preset_steps": full.steps,
           "variants": {v: {"wall_ms": [1e3 * t[0] for t in ts], "cpu_ms": [1e3 * t[1] for t in ts],
                            "wall_ms_median": 1e3 * statistics.median(t[0] for t in ts),
                            "cpu_ms_median": 1e3 * statistics.median(t[1] for t in ts),
                            "final_total_loss": ts[-1][2]["total"]} for v, ts in times.items()},
           "spd_ms_per_step": 1e3 * sec, "spd_us_per_sample": 1e6 * sec / full.batch_size,
           "spd_preset_minutes": sec * full.steps / 60}
    if apd and name in APD_PRESETS:
        acfg = apd_overrides(APD_PRESETS[name], **(APD_QUICK[name] if quick else {}))
        asample = lambda step: spec.sample(acfg.batch_size, step_generator(0, step))
        apd_decompose(toy, asample, apd_overrides(acfg, steps=2, log_every=10**9), quiet=True, device=device)
        asec = _time(lambda n: apd_decompose(toy, asample, apd_overrides(acfg, steps=n, log_every=10**9), quiet=True,
                                             device=device).history[-1], steps, device)[0]
        row.update(apd_batch_size=acfg.batch_size, apd_ms_per_step=1e3 * asec,
                   apd_us_per_sample=1e6 * asec / acfg.batch_size, ratio_per_step=sec / asec,
                   ratio_per_sample=(sec / full.batch_size) / (asec / acfg.batch_size))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    ap.add_argument("--presets", nargs="+", default=["paper", "quick"], choices=["paper", "quick"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--variants", nargs="+", default=["compiled", "eager", "every-row"], choices=list(VARIANTS))
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repetitions of every variant (>= 1)")
    ap.add_argument("--no-apd", action="store_true", help="do not time APD")
    args = ap.parse_args()
    if args.steps < 3:
        ap.error(f"--steps must be >= 3 (the time per step is a difference with a 2-step run), got {args.steps}")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    torch.set_num_threads(args.threads)
    gpu = torch.cuda.get_device_name(torch.device(args.device)) if torch.device(args.device).type == "cuda" else None
    rows = []
    for name in args.settings:
        for preset in args.presets:
            row = measure(name, preset == "quick", args.steps, args.device, tuple(args.variants), args.repeats,
                          not args.no_apd)
            row.update(preset=preset, threads=args.threads, load_average=[round(v, 2) for v in os.getloadavg()],
                       device=gpu or "cpu")
            rows.append(row)
            print(f"{name} {preset} (batch {row['batch_size']}, C = {row['C']}; load {row['load_average']}"
                  f"{'; ' + gpu if gpu else ''}):", flush=True)
            first = row["variants"][args.variants[0]]
            for v, r in row["variants"].items():
                print(f"  {v:15s} wall {r['wall_ms_median']:8.1f} ms/step (" + ", ".join(f"{t:.1f}" for t in
                      r["wall_ms"]) + f"), CPU {r['cpu_ms_median']:8.1f} ms/step (" + ", ".join(
                      f"{t:.1f}" for t in r["cpu_ms"]) + f"); CPU ratio to {args.variants[0]} "
                      f"{r['cpu_ms_median'] / first['cpu_ms_median']:.2f}; final loss {r['final_total_loss']:.6g}",
                      flush=True)
            if "apd_ms_per_step" in row:
                print(f"  APD {row['apd_ms_per_step']:.1f} ms/step at batch {row['apd_batch_size']}: SPD/APD "
                      f"{row['ratio_per_step']:.2f}x per step, {row['ratio_per_sample']:.2f}x per sample", flush=True)
            print(f"  {args.variants[0]}: {row['spd_preset_minutes']:.1f} min for {row['preset_steps']} steps",
                  flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
