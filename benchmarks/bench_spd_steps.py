"""Benchmark: SPD step time per preset on the CPU, beside APD's on the same toy (same shapes, untrained targets).

    OMP_NUM_THREADS=1 nice python benchmarks/bench_spd_steps.py [--settings tms-5-2 resid-mlp-1] [--steps 20]
        [--presets paper quick] [--threads 1] [--device cuda]

For each setting and preset it prints SPD's ms/step and µs/sample (with the causal-importance MLPs through
``torch.compile``, the presets' default, and in eager mode: their ratio, measured side by side; and with every row
through the importance MLPs instead of the all-zero rows once, ``importance.SKIP_ZERO_ROWS``), APD's at its own preset of the same toy (where
APD has one), their ratio per step and per sample, and the extrapolation of SPD to the preset's full step count.
The machine's load average is printed with every row (a shared CPU inflates every number). ``--device cuda``: the
same on a GPU (each timing ends with ``torch.cuda.synchronize``; the batches are drawn on the CPU and moved, as in a
run), the GPU's name in every row.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from mlpinterp.apd import decompose as apd_decompose
from mlpinterp.apd import with_overrides as apd_overrides
from mlpinterp.experiments.apd import PRESETS as APD_PRESETS
from mlpinterp.experiments.apd import QUICK as APD_QUICK
from mlpinterp.experiments.apd import setting_spec
from mlpinterp.experiments.spd import SETTINGS, spd_config
from mlpinterp.spd import decompose, importance
from mlpinterp.toys import RESID_PRESETS, TMS, TMS_PRESETS, as_linears, build_resid_mlp, step_generator, with_identity


def _toy(name: str):
    base = name.removesuffix("-id")
    if base in TMS_PRESETS:
        tms = TMS(TMS_PRESETS[base].n_features, TMS_PRESETS[base].d_hidden)
        return tms, as_linears(with_identity(tms) if name.endswith("-id") else tms)
    m = build_resid_mlp(RESID_PRESETS[base])
    return m, m


def _time(run, steps: int, device: str = "cpu") -> float:
    """Seconds per step of ``run(n)`` (a whole decomposition of ``n`` steps): ``(T(steps) - T(2)) / (steps - 2)``,
    so that the per-run setup (copies to the device, configuration checks), which a 3 ms GPU step would not
    amortise over 20 steps, cancels."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def timed(n: int) -> float:
        sync()
        t = time.perf_counter()
        run(n)
        sync()
        return time.perf_counter() - t

    run(2)  # warm-up (allocator, first-call dispatch, compilation)
    return (timed(steps) - timed(2)) / (steps - 2)


def measure(name: str, quick: bool, steps: int, device: str = "cpu") -> dict:
    """SPD (and, where APD has a preset for the setting, APD) seconds per step on an untrained toy of ``name``."""
    toy, model = _toy(name)
    toy.requires_grad_(False)
    model.requires_grad_(False)
    spec = setting_spec(name.removesuffix("-id"))
    full = spd_config(name, quick, 0)
    sample = lambda step: spec.sample(full.batch_size, step_generator(0, step))
    run = lambda n, c: decompose(model, sample, spd_config(name, quick, 0, steps=n, log_every=10**9, compile=c),
                                 quiet=True, device=device)
    spd = {c: _time(lambda n, c=c: run(n, c), steps, device) for c in (False, True)}
    importance.SKIP_ZERO_ROWS = False  # every row through the MLPs, as before the zero-row path
    every_row = _time(lambda n: run(n, True), steps, device)
    importance.SKIP_ZERO_ROWS = True
    sec = spd[True]
    row = {"setting": name, "batch_size": full.batch_size, "C": full.C, "spd_ms_per_step": 1e3 * sec,
           "spd_eager_ms_per_step": 1e3 * spd[False], "compile_speedup": spd[False] / sec,
           "spd_every_row_ms_per_step": 1e3 * every_row, "zero_row_speedup": every_row / sec,
           "spd_us_per_sample": 1e6 * sec / full.batch_size, "preset_steps": full.steps,
           "spd_preset_minutes": sec * full.steps / 60}
    if name in APD_PRESETS:
        acfg = apd_overrides(APD_PRESETS[name], **(APD_QUICK[name] if quick else {}))
        asample = lambda step: spec.sample(acfg.batch_size, step_generator(0, step))
        asec = _time(lambda n: apd_decompose(toy, asample, apd_overrides(acfg, steps=n, log_every=10**9), quiet=True,
                                             device=device), steps, device)
        row.update(apd_batch_size=acfg.batch_size, apd_ms_per_step=1e3 * asec,
                   apd_us_per_sample=1e6 * asec / acfg.batch_size, ratio_per_step=sec / asec,
                   ratio_per_sample=(sec / full.batch_size) / (asec / acfg.batch_size))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    ap.add_argument("--presets", nargs="+", default=["paper", "quick"], choices=["paper", "quick"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = ap.parse_args()
    if args.steps < 3:
        ap.error(f"--steps must be >= 3 (the time per step is a difference with a 2-step run), got {args.steps}")
    torch.set_num_threads(args.threads)
    gpu = torch.cuda.get_device_name(torch.device(args.device)) if torch.device(args.device).type == "cuda" else None
    rows = []
    for name in args.settings:
        for preset in args.presets:
            row = measure(name, preset == "quick", args.steps, args.device)
            row.update(preset=preset, threads=args.threads, load_average=[round(v, 2) for v in os.getloadavg()],
                       device=gpu or "cpu")
            rows.append(row)
            apd = (f" | APD {row['apd_ms_per_step']:.1f} ms/step at batch {row['apd_batch_size']}: SPD/APD "
                   f"{row['ratio_per_step']:.2f}x per step, {row['ratio_per_sample']:.2f}x per sample"
                   if "apd_ms_per_step" in row else " | APD: no preset")
            print(f"{name:13s} {preset:5s} SPD {row['spd_ms_per_step']:.1f} ms/step at batch {row['batch_size']} "
                  f"(eager {row['spd_eager_ms_per_step']:.1f}: compile {row['compile_speedup']:.2f}x; every row "
                  f"through the importance MLPs {row['spd_every_row_ms_per_step']:.1f}: zero-row path "
                  f"{row['zero_row_speedup']:.2f}x) "
                  f"(C = {row['C']}; {row['spd_preset_minutes']:.1f} min for {row['preset_steps']} steps){apd}; "
                  f"load {row['load_average']}{'; ' + gpu if gpu else ''}", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
